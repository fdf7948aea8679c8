"""What the reference runner can run: argument checks (torch-free, done before launching) and
device checks (done by the workers, which know their device). Every refusal is a RunError."""

from __future__ import annotations

from autopar.errors import RunError
from autopar.layout import Layout
from autopar.runner.config import RunnerModelConfig

SUPPORTED_PRECISIONS = ("fp32", "bf16")


def mesh_shape(layout: Layout) -> dict[str, int]:
    """The torchtitan mesh ``(pp, dp_replicate, dp_shard, cp, tp)`` of a layout.

    ZeRO 0 (plain data parallel) replicates over all ``dp`` ranks; ZeRO >= 1 shards over
    ``shard_group`` ranks (all ``dp`` when 0) and replicates over the rest (HSDP).
    """
    if layout.zero == 0:
        dpr, dps = layout.dp, 1
    else:
        dps = layout.shard_group or layout.dp
        dpr = layout.dp // dps
    return {"pp": layout.pp, "dp_replicate": dpr, "dp_shard": dps, "cp": layout.cp, "tp": layout.tp}


def check_layout(layout: Layout, cfg: RunnerModelConfig, *, seq_len: int, global_batch: int) -> None:
    """Raise :class:`RunError` if the runner cannot apply ``layout`` to ``cfg`` (any device)."""
    if seq_len < 1 or global_batch < 1:
        raise RunError(
            f"seq_len={seq_len} and global_batch={global_batch} must be positive", "pass values >= 1"
        )
    if layout.global_batch != global_batch:
        raise RunError(
            f"global_batch={global_batch} != micro_batch*grad_accum*dp = {layout.micro_batch}*"
            f"{layout.grad_accum}*{layout.dp} = {layout.global_batch}",
            "resolve the layout against this global batch (autopar.layout.resolve_layout)",
        )
    tp = layout.tp
    for name, v in (
        ("heads", cfg.heads),
        ("kv_heads", cfg.kv_heads),
        ("ffn_hidden", cfg.ffn_hidden),
        ("vocab", cfg.vocab),
    ):
        if v % tp:
            raise RunError(f"tp={tp} does not divide {name}={v}", f"choose tp among the divisors of {v}")
    if layout.sp and tp > 1 and seq_len % tp:
        raise RunError(f"sequence parallel needs tp={tp} to divide seq_len={seq_len}", "change seq_len or tp")
    if layout.ep > 1:
        raise RunError(
            f"expert parallelism ep={layout.ep} is not implemented by the reference runner",
            "use ep=1 (experts replicated or tensor-parallel with etp=tp)",
        )
    if layout.etp not in (1, tp):
        raise RunError(f"etp={layout.etp} must be 1 or tp={tp} when ep=1", "set etp to 1 or tp")
    if cfg.is_moe and layout.etp > 1 and cfg.expert_ffn_hidden % layout.etp:
        raise RunError(
            f"etp={layout.etp} does not divide the expert width {cfg.expert_ffn_hidden}",
            "choose etp=1 or a divisor of moe_ffn_hidden",
        )
    stages = layout.pp * layout.vpp
    if layout.vpp > 1 and layout.pp == 1:
        raise RunError(f"vpp={layout.vpp} needs pp > 1", "set vpp=1 without pipeline parallelism")
    if cfg.layers % stages:
        raise RunError(
            f"layers={cfg.layers} do not split evenly into pp*vpp = {layout.pp}*{layout.vpp} stages",
            f"choose pp*vpp among the divisors of {cfg.layers}",
        )
    if layout.pp > 1 and layout.vpp == 1 and layout.grad_accum < layout.pp:
        raise RunError(
            f"1F1B needs at least pp={layout.pp} micro-batches per step, got grad_accum={layout.grad_accum}",
            "raise grad_accum (lower micro_batch) or use vpp > 1",
        )
    if layout.zero == 0 and layout.shard_group not in (0, layout.dp * layout.cp):
        raise RunError(
            f"shard_group={layout.shard_group} needs ZeRO >= 1 (zero=0 shards nothing)",
            "set zero >= 1 for HSDP, or shard_group=0",
        )
    if layout.shard_group and (layout.dp * layout.cp) % layout.shard_group:
        raise RunError(
            f"shard_group={layout.shard_group} does not divide dp*cp={layout.dp * layout.cp}",
            "choose a divisor of dp*cp",
        )
    if layout.cp > 1 and layout.shard_group:
        raise RunError("HSDP together with context parallelism is not implemented", "use shard_group=0")
    if layout.recompute not in ("none", "selective", "full"):
        raise RunError(
            f"recompute={layout.recompute} (Megatron-Core recompute modules) is not implemented by the "
            "reference runner",
            "validate with recompute none, selective or full",
        )


def check_device_support(layout: Layout, device_type: str) -> None:
    """Raise :class:`RunError` for what ``device_type`` ("cpu" or "cuda") cannot run."""
    if layout.cp > 1:
        if device_type == "cpu":
            raise RunError(
                f"context parallel (cp={layout.cp}) needs CUDA SDPA kernels (GPU-only): torch's "
                "context_parallel has no sharding strategy for the CPU operator "
                "aten._scaled_dot_product_flash_attention_for_cpu",
                "validate cp > 1 layouts on a GPU host, or set cp=1 on CPU",
            )
        raise RunError(
            f"context parallel (cp={layout.cp}) is not implemented by the reference runner yet",
            "validate with cp=1",
        )
    if layout.precision not in SUPPORTED_PRECISIONS:
        why = (
            "fp8 needs float8 matmuls (Hopper or newer GPUs) and torchao Float8Linear, which the "
            "reference runner does not apply"
            if layout.precision == "fp8"
            else "fp16 needs dynamic loss scaling, which the reference runner does not implement"
        )
        where = " and CPUs have no fp8 matmul" if layout.precision == "fp8" and device_type == "cpu" else ""
        raise RunError(
            f"precision={layout.precision} is not supported on {device_type}: {why}{where}",
            f"use one of {', '.join(SUPPORTED_PRECISIONS)}",
        )
