"""Emitted launcher configs checked by the launchers' own validators (CPU-only; skipped when absent).

* DeepSpeed: ``DeepSpeedConfig`` (batch identity, ZeRO, offload, AutoTP, AutoEP parsing).
* Megatron-Core: ``TransformerConfig``/``DistributedDataParallelConfig``/``OptimizerConfig`` built
  from the emitted flags (each flag names a dataclass field, as Megatron-LM's argparse does).
* Accelerate: ``accelerate launch``'s own config loading and validation, the environment it hands
  the training process, and the plugins/ParallelismConfig built from that environment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import warnings
from pathlib import Path
from typing import Any

import pytest
from test_export import CASES, EXPRESSIBLE

from autopar.export import Job, export
from autopar.layout import Layout


def _cases(fmt: str) -> list[tuple[Layout, Job]]:
    return [CASES[c] for c in sorted(EXPRESSIBLE[fmt])]


# ---------------------------------------------------------------------------------------------
# DeepSpeed


@pytest.mark.parametrize("case", _cases("deepspeed"), ids=sorted(EXPRESSIBLE["deepspeed"]))
def test_deepspeed_config_validates(case: tuple[Layout, Job], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as dsc

    layout, job = case

    class MPU:  # DeepSpeed takes the DP world size from the mpu when one is passed
        def get_data_parallel_world_size(self) -> int:
            return layout.dp

    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    cfg = json.loads(export(layout, "deepspeed", job))
    c = dsc.DeepSpeedConfig(cfg, mpu=MPU())  # the 'autopar' key is tolerated
    assert c.train_batch_size == job.global_batch
    assert c.train_micro_batch_size_per_gpu == layout.micro_batch
    assert c.gradient_accumulation_steps == layout.grad_accum
    assert c.zero_optimization_stage == layout.zero
    assert (c.zero_config.offload_optimizer is not None) == layout.offload
    assert c.bfloat16_config.enabled == (layout.precision == "bf16")
    assert c.float16_config.enabled == (layout.precision == "fp16")
    assert c.tensor_parallel_config.autotp_size == (layout.tp if layout.tp > 1 else 0)
    assert c.expert_parallel_config.enabled == (layout.ep > 1)
    if layout.ep > 1:
        assert c.expert_parallel_config.autoep_size == layout.ep


def test_deepspeed_rejects_a_broken_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as dsc

    layout, job = CASES["ddp"]

    class MPU:
        def get_data_parallel_world_size(self) -> int:
            return layout.dp

    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    cfg = json.loads(export(layout, "deepspeed", job))
    cfg["train_batch_size"] += 1
    with pytest.raises(AssertionError):
        dsc.DeepSpeedConfig(cfg, mpu=MPU())


# ---------------------------------------------------------------------------------------------
# Megatron-Core

# Megatron-LM training arguments that are not fields of the Megatron-Core config dataclasses.
TRAINING_ONLY = {
    "micro_batch_size",
    "global_batch_size",
    "seq_length",
    "num_virtual_stages_per_pipeline_rank",
    "ckpt_format",
}
RENAMED = {
    "fp8_format": "fp8",
    "fp4_format": "fp4",
    "no_gradient_accumulation_fusion": "gradient_accumulation_fusion",
}


def _megatron_flags(text: str) -> dict[str, Any]:
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#")).replace("\\\n", " ")
    toks, out, i = shlex.split(body), {}, 0
    while i < len(toks):
        name = toks[i][2:].replace("-", "_")
        if i + 1 < len(toks) and not toks[i + 1].startswith("--"):
            out[name], i = toks[i + 1], i + 2
        else:
            out[name], i = True, i + 1
    return out


@pytest.mark.parametrize("case", _cases("megatron"), ids=sorted(EXPRESSIBLE["megatron"]))
def test_megatron_flags_build_megatron_core_configs(
    case: tuple[Layout, Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    layout, job = case
    flags = _megatron_flags(export(layout, "megatron", job))
    known = {
        f.name
        for cls in (TransformerConfig, DistributedDataParallelConfig, OptimizerConfig)
        for f in dataclasses.fields(cls)
    }
    for name in flags:
        assert RENAMED.get(name, name) in known | TRAINING_ONLY, f"--{name} is not a Megatron-Core field"

    def pick(cls: type) -> dict[str, Any]:
        names = {f.name for f in dataclasses.fields(cls)}
        out: dict[str, Any] = {}
        for k, v in flags.items():
            k = RENAMED.get(k, k)
            if k in names:
                out[k] = int(v) if isinstance(v, str) and v.isdigit() else v
        if "gradient_accumulation_fusion" in out:
            out["gradient_accumulation_fusion"] = False
        return out

    dtype = torch.bfloat16 if flags.get("bf16") else torch.float16 if flags.get("fp16") else torch.float32
    tc = pick(TransformerConfig)
    vpp = int(flags.get("num_virtual_stages_per_pipeline_rank", 1))
    TransformerConfig(
        num_layers=job.num_layers or 8 * layout.pp * layout.vpp,
        hidden_size=256,
        num_attention_heads=8,
        add_bias_linear=False,
        num_moe_experts=16 if layout.ep > 1 else None,
        moe_router_topk=2 if layout.ep > 1 else 2,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        params_dtype=dtype,
        pipeline_dtype=dtype if layout.pp > 1 else None,
        **tc,
    )
    ddp = DistributedDataParallelConfig(**pick(DistributedDataParallelConfig))
    assert ddp.use_distributed_optimizer == (layout.zero >= 1)
    oc = pick(OptimizerConfig)
    if "optimizer_offload_fraction" in oc:
        oc["optimizer_offload_fraction"] = float(oc["optimizer_offload_fraction"])
        # the precision-aware optimizer checks the Transformer Engine version, absent on CPU
        import megatron.core.optimizer.optimizer_config as occ

        monkeypatch.setattr(occ, "is_te_min_version", lambda *a, **k: True)
    with warnings.catch_warnings():
        # mcore advises --fp8-param-gather with mxfp8 because the bf16 weights then carry TE's MXFP8
        # copy next to them; autopar exports the plain recipe and costs that copy
        # (autopar.precision.WEIGHT_COPY_BYTES), so the advice is expected here.
        if layout.precision == "mxfp8":
            warnings.filterwarnings(
                "ignore", message="mxfp8 without using reuse_grad_buf", category=UserWarning
            )
        OptimizerConfig(**oc)


# ---------------------------------------------------------------------------------------------
# Accelerate


def _accelerate_env(text: str, tmp_path: Path) -> tuple[Any, dict[str, str]]:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return args, env


@pytest.mark.parametrize("case", _cases("accelerate"), ids=sorted(EXPRESSIBLE["accelerate"]))
def test_accelerate_launch_accepts_the_config(
    case: tuple[Layout, Job], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("accelerate")
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedPlugin, MegatronLMPlugin

    layout, job = case
    args, env = _accelerate_env(export(layout, "accelerate", job), tmp_path)
    assert args.num_processes == job.num_devices and args.num_machines == job.nnodes
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if args.use_parallelism_config:
        sizes = [int(env[f"PARALLELISM_CONFIG_{k}_SIZE"]) for k in ("DP_REPLICATE", "DP_SHARD", "TP", "CP")]
        assert (sizes[0] * sizes[1], sizes[2], sizes[3]) == (layout.dp, layout.tp, layout.cp)
        if layout.tp == 1:  # a TP handler needs transformers installed
            assert ParallelismConfig().total_size == job.num_devices
        assert env["FSDP_RESHARD_AFTER_FORWARD"] == ("true" if layout.zero == 3 else "false")
    if args.use_deepspeed:
        ds = DeepSpeedPlugin().deepspeed_config
        assert ds["zero_optimization"]["stage"] == layout.zero
        assert ds["gradient_accumulation_steps"] == layout.grad_accum
        assert ds["zero_optimization"]["offload_optimizer"]["device"] == ("cpu" if layout.offload else "none")
    if args.use_megatron_lm:
        m = MegatronLMPlugin().megatron_lm_default_args
        assert (
            m["tensor_model_parallel_size"],
            m["pipeline_model_parallel_size"],
            m["context_parallel_size"],
            m["num_micro_batches"],
            m["sequence_parallel"],
            m["use_distributed_optimizer"],
        ) == (layout.tp, layout.pp, layout.cp, layout.grad_accum, layout.sp, layout.zero == 1)
    assert os.environ.get("ACCELERATE_MIXED_PRECISION", env.get("ACCELERATE_MIXED_PRECISION")) is not None
