"""A pipeline stage as blocks: how many of each kind it holds, and where hybrid kinds sit.

Placement. The engine splits the stack into contiguous pipeline stages (``autopar.memory.stage_shape``).
Where the model states its block order (``ModelSpec.block_pattern``: hybrid stacks such as
Nemotron-H, Qwen3-Next, Jamba, Granite 4, and interleaved MoE), a stage holds exactly the blocks
of its window of the stack (:func:`window`): its attention, Gated DeltaNet and Mamba mixers, its
dense and MoE feed-forward parts, each counted in the model's real order. Without a stated order
(presets built from counts, the module-shape reader), dense and MoE layers sit where the model puts
them (a dense prefix exactly; interleaved MoE layers spread evenly) and a hybrid stage of ``n``
blocks holds the model's mix of block kinds in proportion (:class:`Mix`): ``n * attn_layers /
layers`` attention mixers and so on (fractional counts; exact for the whole model, pp = 1).
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
class StageMixers:
    """The mixers of a window of a hybrid stack, counted in its real order (arrays per layout row)."""

    blocks: np.ndarray  # blocks in the window
    attention: np.ndarray  # softmax-attention mixers
    recurrent: tuple[tuple[np.ndarray, ModuleType], ...]  # (count, module) of each recurrent kind
    mixer_sub: np.ndarray  # blocks with a mixer sublayer


_PATTERN_CACHE: dict[str, dict[str, np.ndarray]] = {}


def prefix_counts(pattern: str) -> dict[str, np.ndarray]:
    """Cumulative counts of each part over the first i blocks of ``pattern`` (i = 0..layers)."""
    got = _PATTERN_CACHE.get(pattern)
    if got is None:
        mixers, ffns = np.array(list(pattern[0::2])), np.array(list(pattern[1::2]))
        parts = {
            "attention": mixers == "a",
            "linear": mixers == "l",
            "mamba": mixers == "m",
            "mixer_sub": mixers != "-",
            "dense": ffns == "d",
            "moe": ffns == "e",
        }
        got = {k: np.concatenate([[0], np.cumsum(v)]).astype(np.float64) for k, v in parts.items()}
        _PATTERN_CACHE[pattern] = got
    return got


def window(model, start, n) -> tuple[np.ndarray, np.ndarray, StageMixers | None]:
    """(dense, MoE, mixers) of the contiguous blocks [start, start + n) of a model with a stated
    block order (``model.block_pattern``); mixers is None for a non-hybrid model (one attention
    mixer per block)."""
    c = prefix_counts(model.block_pattern)
    L = model.layers
    lo = np.clip(np.asarray(start, dtype=np.int64), 0, L)
    hi = np.clip(lo + np.asarray(n, dtype=np.int64), 0, L)

    def count(k):
        return c[k][hi] - c[k][lo]

    if not model.is_hybrid:
        return count("dense"), count("moe"), None
    kinds = {gated_deltanet: "linear", mamba: "mamba"}
    mixers = StageMixers(
        blocks=(hi - lo).astype(np.float64),
        attention=count("attention"),
        recurrent=tuple((count(kinds[kind]), kind) for kind in RECURRENT if kind.present(model)),
        mixer_sub=count("mixer_sub"),
    )
    return count("dense"), count("moe"), mixers


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


def stage_blocks(model, n_dense, n_moe, head, mixers: StageMixers | None = None) -> StageBlocks:
    """The blocks of a stage that holds ``n_dense`` dense-MLP and ``n_moe`` MoE layers, plus the LM
    head where ``head``; a hybrid stage's mixers are ``mixers`` (its window, :func:`window`) or, without
    them, the model's mix in proportion to its feed-forward blocks."""
    n_dense = np.asarray(n_dense, dtype=np.float64)
    n_moe = np.asarray(n_moe, dtype=np.float64)
    if mixers is not None:
        return StageBlocks(
            layers=mixers.blocks,
            attention=mixers.attention,
            recurrent=mixers.recurrent,
            sublayers=mixers.mixer_sub + n_dense + n_moe,
            mlp=n_dense,
            moe=n_moe,
            head=np.asarray(head, dtype=bool),
        )
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
