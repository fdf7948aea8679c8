"""Activation checkpointing per transformer block (torchtitan's ``apply_ac``).

``full``: each block keeps only its input and recomputes everything in backward.
``selective``: op-level selective checkpointing (torch.utils.checkpoint SAC): the outputs of
matmuls, of the attention kernel and of reduce-scatters are saved, all cheap element-wise work
(norms, RoPE, SiLU, residual adds) is recomputed. This is torchtitan's "op" SAC, not Megatron's
attention-core recompute: with fused SDPA kernels the attention scores are never stored anyway.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from autopar.runner.model import Transformer

CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."


def _save_list() -> set:
    names = [
        ("aten", "mm"),
        ("aten", "addmm"),
        ("aten", "bmm"),
        ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
        ("aten", "_scaled_dot_product_flash_attention"),
        ("aten", "_scaled_dot_product_efficient_attention"),
        ("aten", "_scaled_dot_product_cudnn_attention"),
        ("aten", "_scaled_dot_product_attention_math"),
        ("_c10d_functional", "reduce_scatter_tensor"),
    ]
    ops = set()
    for ns, name in names:
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is not None:
            ops.add(packet.default)
    return ops


def _policy(save: set, ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(model: Transformer, mode: str) -> None:
    """Wrap every block of ``model`` in place; ``mode`` is ``"full"`` or ``"selective"``."""
    if mode == "none":
        return
    kwargs: dict[str, Any] = {"preserve_rng_state": False}
    if mode == "selective":
        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, partial(_policy, _save_list()))
    elif mode != "full":
        raise ValueError(f"unknown recompute mode {mode!r}")
    for name, block in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(block, **kwargs)


def clean_fqn(name: str) -> str:
    """Parameter name without the checkpoint wrapper's prefix (as in the unwrapped model)."""
    return name.replace(CHECKPOINT_PREFIX, "")
