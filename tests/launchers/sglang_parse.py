"""Parse `python -m sglang.launch_server` command lines with SGLang's own parser and checks (run by
tests/test_serving_parsers.py in its SGLang environment).

Reads a JSON list of argument lists (what follows ``python -m sglang.launch_server``) on stdin and
prints a JSON list: per command, the ServerArgs fields, or ``{"error": ...}`` with SGLang's own
message. ``sglang.srt.server_args.prepare_server_args`` parses as the server does (argparse: unknown
or ambiguous flags, choices, types). ``ServerArgs.check_server_args`` then runs SGLang's
consistency checks (parallel sizes over nodes, pipeline and data parallelism, ...) up to the first
check that needs the model's resolved configuration (a checkpoint this test does not download):
there it stops with a TypeError on an unresolved field, which is reported as ``checked_until``."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback

from sglang.srt.server_args import prepare_server_args

FIELDS = (
    "model_path",
    "tp_size",
    "pp_size",
    "dp_size",
    "attn_dp_size",
    "ep_size",
    "context_length",
    "max_running_requests",
    "chunked_prefill_size",
    "mem_fraction_static",
    "kv_cache_dtype",
    "dtype",
    "quantization",
    "nnodes",
    "node_rank",
    "moe_a2a_backend",
    "enable_two_batch_overlap",
)


def parse(argv: list[str]) -> dict:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            a = prepare_server_args(argv)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return {"error": lines[-1] if lines else "exit"}
    out = {k: getattr(a, k, None) for k in FIELDS}
    if a.served_model_name is None:  # what resolution sets first: the model path
        a.served_model_name = a.model_path
    try:
        a.check_server_args()
        out["checked_until"] = "end"
    except (AssertionError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    except TypeError:
        frame = traceback.extract_tb(sys.exc_info()[2])[-1]
        out["checked_until"] = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for k, v in out.items()}


if __name__ == "__main__":
    json.dump([parse(a) for a in json.load(sys.stdin)], sys.stdout)
