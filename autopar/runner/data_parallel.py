"""Data parallelism with FSDP2 (torchtitan's ``apply_fsdp``/``apply_ddp``), mapped from ZeRO stages.

| layout              | applied                                                                  |
| ------------------- | ------------------------------------------------------------------------ |
| zero 0              | ``replicate`` (FSDP2-based DDP, ``torch.distributed._composable.replicate_with_fsdp``) over all dp ranks: params and optimizer replicated, grads all-reduced once per step |
| zero 1              | ``fully_shard(reshard_after_forward=False)`` and gradient sync only on the last micro-batch: params gathered for the whole step, grads accumulated unsharded and reduce-scattered once, optimizer state sharded. PyTorch has no native ZeRO-1; this has ZeRO-1's communication (one reduce-scatter + one all-gather per step) but keeps params sharded between steps. |
| zero 2              | ``fully_shard(reshard_after_forward=False)``: grads reduce-scattered every micro-batch (sharded grads), params kept gathered between forward and backward |
| zero 3              | ``fully_shard(reshard_after_forward=True)`` (FSDP): params re-gathered for backward |
| shard_group < dp    | HSDP: the same on the 2-D mesh (dp_replicate, dp_shard)                    |

Units: each transformer block, the embeddings, (final norm + LM head) together, then the root, as
torchtitan does. Mixed precision (bf16) is FSDP's ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)``; the fp32 master weights and the optimizer state stay fp32. Under pipeline
parallelism the schedule itself defers gradient reduction to the last micro-batch for every stage.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from autopar.runner.model import Transformer


def apply_data_parallel(
    model: Transformer,
    dp_mesh: DeviceMesh,
    *,
    zero: int,
    param_dtype: torch.dtype | None,
    offload: bool,
) -> None:
    """Wrap ``model`` (a whole model or one pipeline stage) for data parallelism over ``dp_mesh``."""
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    offload_policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    units: list[Any] = []
    if model.tok_embeddings is not None:
        units.append(model.tok_embeddings)
    units.extend(model.layers.values())
    tail = [m for m in (model.norm, model.output) if m is not None]
    if tail:
        units.append(tail)
    if zero == 0:
        for unit in units:
            replicate(unit, mesh=dp_mesh, mp_policy=mp, offload_policy=offload_policy)
        replicate(model, mesh=dp_mesh, mp_policy=mp, offload_policy=offload_policy)
        return
    reshard = zero >= 3
    for unit in units:
        fully_shard(
            unit, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload_policy
        )
    fully_shard(
        model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload_policy
    )


def sync_every_microbatch(zero: int) -> bool:
    """ZeRO 2/3 reduce(-scatter) gradients after every micro-batch; ZeRO 0/1 only after the last."""
    return zero >= 2


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
