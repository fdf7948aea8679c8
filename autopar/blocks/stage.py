"""A pipeline stage as blocks: how many of each kind it holds, and where hybrid kinds sit.

Placement. The engine splits layers over pipeline stages (``autopar.memory.stage_shape``): dense and
MoE layers sit where the model puts them (interleaved MoE layers spread evenly over the stages). A
hybrid model's mixers are not placed block by block: a stage of ``n`` blocks is assumed to hold the
model's mix of block kinds in proportion (:class:`Mix`): ``n * attn_layers / layers`` attention
mixers, ``n * mamba_layers / layers`` Mamba mixers, and so on (fractional counts). Exact for the whole
model (pp = 1), an average per stage otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from autopar.blocks import gated_deltanet, mamba


@dataclass(frozen=True)
class Mix:
    """Share of a model's blocks with each part (per block; sums of kinds may exceed 1 with a
    parallel Mamba beside attention)."""

    attn: float  # self-attention mixers
    linear: float  # Gated DeltaNet mixers
    mamba: float  # Mamba mixers
    mixer_sub: float  # blocks with a mixer sublayer (norm + residual); a parallel block counts once
    ffn_sub: float  # blocks with a feed-forward sublayer
    ffn_to_blocks: float  # blocks per block with a feed-forward part (n_dense + n_moe -> blocks)


def mix(model) -> Mix:
    """The model's mix of block kinds."""
    L = float(model.layers)
    with_ffn = model.layers - model.no_ffn_layers
    return Mix(
        attn=model.attn_layers / L,
        linear=model.linear_attn_layers / L,
        mamba=model.mamba_layers / L,
        mixer_sub=(model.layers - model.no_mixer_layers) / L,
        ffn_sub=with_ffn / L,
        ffn_to_blocks=L / with_ffn if with_ffn else float("nan"),
    )


def n_blocks(model, n_dense, n_moe) -> np.ndarray:
    """Blocks of a stage holding ``n_dense`` dense-MLP and ``n_moe`` MoE blocks (proportional mix)."""
    n = np.asarray(n_dense, dtype=np.float64) + np.asarray(n_moe, dtype=np.float64)
    if not model.is_hybrid:
        return n
    return n * mix(model).ffn_to_blocks


# The recurrent mixer kinds a hybrid stage can hold (a new one is added here and in ``KINDS``).
RECURRENT: tuple[ModuleType, ...] = (gated_deltanet, mamba)


def recurrent_kinds(model) -> list[tuple[float, Any]]:
    """(share of the blocks, block module) of each recurrent mixer kind the model has."""
    L = float(model.layers)
    return [(kind.layers(model) / L, kind) for kind in RECURRENT if kind.present(model)]


@dataclass(frozen=True)
class StageBlocks:
    """Blocks of one pipeline stage per layout row, by kind (fractional where a hybrid model's mix is
    averaged over the stages)."""

    layers: np.ndarray  # blocks (each costs the per-layer launch overhead and host launches)
    attention: np.ndarray  # softmax-attention mixers (attention or MLA: ``autopar.blocks.mixer``)
    recurrent: tuple[tuple[np.ndarray, ModuleType], ...]  # (count, module) of each recurrent mixer kind
    sublayers: np.ndarray  # pre-norm + residual sublayers (a mixer's and a feed-forward's)
    mlp: np.ndarray  # dense-MLP layers
    moe: np.ndarray  # MoE layers
    head: np.ndarray  # the LM head and loss (bool)


def stage_blocks(model, n_dense, n_moe, head) -> StageBlocks:
    """The blocks of a stage that holds ``n_dense`` dense-MLP and ``n_moe`` MoE layers (and their
    share of a hybrid model's mixer-only blocks), plus the LM head where ``head``."""
    n_dense = np.asarray(n_dense, dtype=np.float64)
    n_moe = np.asarray(n_moe, dtype=np.float64)
    n_layers = n_blocks(model, n_dense, n_moe)
    if model.is_hybrid:
        mx = mix(model)
        attn, subs = mx.attn, mx.mixer_sub + mx.ffn_sub
        recurrent = tuple((n_layers * w, kind) for w, kind in recurrent_kinds(model))
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
