"""Parse `vllm serve` command lines with vLLM's own parser and validation (run by
tests/test_serving_parsers.py in its vLLM environment, VLLM_TARGET_DEVICE=cpu).

Reads a JSON list of argument lists (what follows ``vllm serve``) on stdin and prints a JSON list:
per command, the resulting EngineArgs fields, or ``{"error": ...}`` with vLLM's own message. The
parser is built as ``vllm serve`` builds it (vllm.entrypoints.cli.serve.ServeSubcommand:
make_arg_parser, then validate_parsed_serve_args), and the engine arguments come from
``EngineArgs.from_cli_args`` as the server takes them. vLLM's config classes that need no model
checkpoint then check the values as ``create_engine_config`` would: ``CacheConfig`` (KV-cache dtype,
memory utilization), ``ParallelConfig`` (TP/PP/DP, expert parallelism, nodes) and
``SchedulerConfig`` (sequences, token budget against the model length, chunked prefill)."""

from __future__ import annotations

import contextlib
import io
import json
import sys

from vllm.config import CacheConfig, ParallelConfig, SchedulerConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

FIELDS = (
    "model",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "gpu_memory_utilization",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "nnodes",
    "node_rank",
    "master_addr",
    "prefill_context_parallel_size",
    "compilation_config",
    "all2all_backend",
    "enable_dbo",
)


def _given(e: EngineArgs, **names: str) -> dict:
    """The config keywords whose EngineArgs value was set (None: the config's own default)."""
    return {k: getattr(e, a) for k, a in names.items() if getattr(e, a, None) is not None}


def check_configs(e: EngineArgs) -> None:
    CacheConfig(**_given(e, cache_dtype="kv_cache_dtype", gpu_memory_utilization="gpu_memory_utilization"))
    ParallelConfig(
        **_given(
            e,
            tensor_parallel_size="tensor_parallel_size",
            pipeline_parallel_size="pipeline_parallel_size",
            data_parallel_size="data_parallel_size",
            enable_expert_parallel="enable_expert_parallel",
            nnodes="nnodes",
            node_rank="node_rank",
            master_addr="master_addr",
            all2all_backend="all2all_backend",
            enable_dbo="enable_dbo",
        )
    )
    SchedulerConfig(
        max_model_len=e.max_model_len or 8192,
        is_encoder_decoder=False,
        **_given(
            e,
            max_num_seqs="max_num_seqs",
            max_num_batched_tokens="max_num_batched_tokens",
            enable_chunked_prefill="enable_chunked_prefill",
        ),
    )


def parse(argv: list[str]) -> dict:
    top = FlexibleArgumentParser(prog="vllm")
    cmd = ServeSubcommand()
    cmd.subparser_init(top.add_subparsers(dest="subparser"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = top.parse_args(["serve", *argv])
        cmd.validate(args)
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        e = EngineArgs.from_cli_args(args)
        check_configs(e)
    except SystemExit:
        return {"error": err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "exit"}
    except Exception as exc:  # vLLM's own validation
        return {"error": f"{type(exc).__name__}: {exc}"}
    out = {}
    for k in FIELDS:
        v = getattr(e, k, None)
        if k == "compilation_config":
            v = getattr(v, "max_cudagraph_capture_size", None) if v is not None else None
        out[k] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
    return out


if __name__ == "__main__":
    json.dump([parse(a) for a in json.load(sys.stdin)], sys.stdout)
