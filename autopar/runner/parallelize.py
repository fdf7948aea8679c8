"""Apply a :class:`~autopar.layout.Layout` to the reference model, torchtitan's order:
pipeline split -> tensor/sequence parallel -> activation checkpointing -> FSDP2 / replicate."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autopar.layout import Layout
from autopar.runner.activation_checkpoint import apply_ac
from autopar.runner.data_parallel import apply_data_parallel, sync_every_microbatch
from autopar.runner.model import Transformer, lm_loss
from autopar.runner.parallel_dims import ParallelDims
from autopar.runner.pipeline_parallel import build_schedule, split_stage, stage_ids
from autopar.runner.tensor_parallel import apply_tp

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class ParallelModel:
    """The model parts this rank holds (one, or ``vpp`` pipeline stages) and how to step them."""

    parts: list[nn.Module]
    dims: ParallelDims
    layout: Layout
    device: torch.device
    schedule: Any = None
    has_first_stage: bool = True
    has_last_stage: bool = True
    autocast_dtype: torch.dtype | None = None
    sync_each_microbatch: bool = True

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]

    def autocast(self) -> AbstractContextManager:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def parallelize(full: Transformer, layout: Layout, dims: ParallelDims, device: torch.device) -> ParallelModel:
    """Shard ``full`` (identical on every rank) for this rank. ``dims.mesh`` must be built."""
    dtype = DTYPES[layout.precision]
    dp_mesh = dims.get("dp_replicate", "dp_shard")
    tp_mesh = dims.get("tp")
    pp_mesh = dims.get("pp")
    # bf16: FSDP's MixedPrecisionPolicy when data parallel wraps the model, autocast otherwise
    # (torchtitan's maybe_enable_amp does the same).
    mp_dtype = dtype if dtype != torch.float32 and dp_mesh is not None else None
    autocast_dtype = dtype if dtype != torch.float32 and dp_mesh is None else None

    if pp_mesh is not None:
        num_stages = layout.pp * layout.vpp
        ids = stage_ids(dims.coord("pp"), layout.pp, layout.vpp)
        parts = [split_stage(full, sid, num_stages) for sid in ids]
    else:
        num_stages, ids, parts = 1, [0], [full]
    modules: list[nn.Module] = list(parts)

    for part in parts:
        part.to(device)
        if tp_mesh is not None:
            apply_tp(part, tp_mesh, sequence_parallel=layout.sp, expert_tp=layout.etp > 1)
        apply_ac(part, layout.recompute)
        if dp_mesh is not None:
            apply_data_parallel(
                part,
                dp_mesh,
                zero=layout.zero,
                param_dtype=mp_dtype,
                offload=layout.offload and device.type == "cuda",
            )

    pm = ParallelModel(
        parts=modules,
        dims=dims,
        layout=layout,
        device=device,
        autocast_dtype=autocast_dtype,
        sync_each_microbatch=sync_every_microbatch(layout.zero),
    )
    if pp_mesh is not None:
        pm.schedule = build_schedule(
            parts, ids, num_stages, pp_mesh, device, n_microbatches=layout.grad_accum, loss_fn=lm_loss
        )
        pm.has_first_stage = 0 in ids
        pm.has_last_stage = num_stages - 1 in ids
    return pm
