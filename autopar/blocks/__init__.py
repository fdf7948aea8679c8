"""Block kinds: each layer kind's costs in one module.

A block module declares, for one layer of its kind, its parameters (``params``), forward FLOPs per
token (``flops_per_token``, unsharded: the golden tests check it against the papers' formulas), its
forward GEMM shapes per rank (``gemm_shapes``/``gemms``, from which the GEMM time, the block-scaling
traffic and the recomputed GEMMs follow), its memory-bound traffic, the activations it keeps for
backward under each recompute mode, its serving state (KV cache or recurrent state) and how TP, CP and
EP split it (in each module's docstring and its communication functions):

- :mod:`~autopar.blocks.attention`: softmax attention, MHA/GQA/MQA, gated output, sliding window;
- :mod:`~autopar.blocks.mla`: multi-head latent attention;
- :mod:`~autopar.blocks.mlp`: the gated or plain MLP;
- :mod:`~autopar.blocks.moe_ffn`: the MoE layer (router, routed and shared experts, EP/ETP);
- :mod:`~autopar.blocks.mamba`: Mamba2 (SSD) and Mamba1 mixers;
- :mod:`~autopar.blocks.gated_deltanet`: Gated DeltaNet linear attention;
- :mod:`~autopar.blocks.embedding`: the embedding and the LM head with its loss.

A pipeline stage is :class:`StageBlocks`: how many blocks of each kind it holds (per layout row).
:func:`autopar.latency.stage_slot` and :func:`autopar.memory.stage_memory` cost a stage as the sum
over its blocks of each block's cost. Placement: dense and MoE layers sit where the model puts them
(``autopar.memory.stage_shape``; interleaved MoE layers spread evenly over the stages); a hybrid
model's mixers are its mix in proportion on every stage (:mod:`autopar.hybrid`). Adding a layer kind
is one module here (and its golden test in ``tests/test_blocks.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

from autopar.blocks import attention, embedding, gated_deltanet, mamba, mla, mlp, moe_ffn

KINDS: tuple[ModuleType, ...] = (attention, mla, mlp, moe_ffn, mamba, gated_deltanet, embedding)


def mixer(model) -> ModuleType:
    """The softmax-attention block module of ``model``: MLA or MHA/GQA/MQA."""
    return mla if model.is_mla else attention


@dataclass(frozen=True)
class StageBlocks:
    """Blocks of one pipeline stage per layout row, by kind (fractional where a hybrid model's mix is
    averaged over the stages)."""

    layers: np.ndarray  # blocks (each costs the per-layer launch overhead and host launches)
    attention: np.ndarray  # softmax-attention mixers (attention or MLA: :func:`mixer`)
    recurrent: tuple[tuple[np.ndarray, ModuleType], ...]  # (count, module) of each recurrent mixer kind
    sublayers: np.ndarray  # pre-norm + residual sublayers (a mixer's and a feed-forward's)
    mlp: np.ndarray  # dense MLPs
    moe: np.ndarray  # MoE layers
    head: np.ndarray  # the LM head and loss (bool)


def stage_blocks(model, n_dense, n_moe, head) -> StageBlocks:
    """The blocks of a stage that holds ``n_dense`` dense-MLP and ``n_moe`` MoE layers (and their
    share of a hybrid model's mixer-only blocks), plus the LM head where ``head``."""
    from autopar import hybrid

    n_dense = np.asarray(n_dense, dtype=np.float64)
    n_moe = np.asarray(n_moe, dtype=np.float64)
    n_layers = hybrid.blocks(model, n_dense, n_moe)
    if model.is_hybrid:
        mx = hybrid.mix(model)
        attn, subs = mx.attn, mx.mixer_sub + mx.ffn_sub
        recurrent = tuple((n_layers * w, kind) for w, kind in hybrid.recurrent_kinds(model))
    else:
        attn, subs, recurrent = 1.0, 2.0, ()
    return StageBlocks(
        layers=n_layers,
        attention=n_layers * attn,
        recurrent=recurrent,
        sublayers=n_layers * subs,
        mlp=n_dense,
        moe=n_moe,
        head=np.asarray(head, dtype=bool),
    )
