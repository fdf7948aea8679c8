"""Pipeline parallelism with ``torch.distributed.pipelining`` (torchtitan's ``pipeline_llama``).

Layers split evenly into ``pp * vpp`` stages; rank ``r`` of the pipeline holds stages
``r, r + pp, ...`` (looped placement, as ScheduleInterleaved1F1B expects). The first stage keeps the
embeddings, the last the final norm and LM head. ``vpp == 1`` runs Schedule1F1B (Narayanan et al.
2021, PipeDream-flush), ``vpp > 1`` ScheduleInterleaved1F1B; the ``grad_accum`` micro-batches of a
step are the schedule's micro-batches, and the schedule divides gradients by their number.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
from torch.distributed.pipelining.stage import _PipelineStageBase

from autopar.runner.model import Transformer


def stage_ids(pp_rank: int, pp: int, vpp: int) -> list[int]:
    return [pp_rank + k * pp for k in range(vpp)]


def split_stage(full: Transformer, stage: int, num_stages: int) -> Transformer:
    """A copy of ``full`` holding only the layers (and ends) of one stage; names are unchanged."""
    part = copy.deepcopy(full)
    per = full.cfg.layers // num_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    for name in list(part.layers.keys()):
        if name not in keep:
            del part.layers[name]
    if stage != 0:
        part.tok_embeddings = None
    if stage != num_stages - 1:
        part.norm = None
        part.output = None
    return part


def build_schedule(
    parts: list[Transformer],
    ids: list[int],
    num_stages: int,
    pp_mesh: DeviceMesh,
    device: torch.device,
    *,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
):
    group = pp_mesh.get_group()
    stages: list[_PipelineStageBase] = [
        PipelineStage(part, sid, num_stages, device, group=group)
        for part, sid in zip(parts, ids, strict=True)
    ]
    if len(stages) == 1:
        return Schedule1F1B(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
    return ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
