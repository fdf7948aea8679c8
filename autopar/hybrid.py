"""Placement of hybrid blocks and their mix-averaged costs: Gated DeltaNet linear attention, Mamba2
(SSD), Mamba1, and blocks without a mixer or without a feed-forward part. Each recurrent mixer's own
formulas live in its block module (:mod:`autopar.blocks.gated_deltanet`, :mod:`autopar.blocks.mamba`);
the functions here weight them by the model's mix. Used by :mod:`autopar.latency`,
:mod:`autopar.memory` and the serving estimate; every function is vectorized over layouts (numpy
arrays of ``tp`` etc.).

Placement. Where the model states its block order (``ModelSpec.block_pattern``, recorded by the
config readers for hybrid stacks), a pipeline stage holds the mixers of its own window of the stack
(:func:`autopar.blocks.stage.window` gives a :class:`~autopar.blocks.stage.StageMixers` per stage).
Without an order (a hand-written spec), a stage of ``n`` blocks is assumed to hold the model's mix
of block kinds in proportion (:class:`Mix`): ``n * attn_layers / layers`` attention mixers,
``n * mamba_layers / layers`` Mamba mixers, and so on (fractional counts); exact for the whole model
(pp = 1), an average per stage otherwise. Serving pipelines use the mix in proportion.

Tensor parallelism. Megatron-LM ``megatron/core/ssm/mamba_mixer.py`` (MambaMixer) shards a Mamba2
mixer over its heads: ``in_proj`` is column-parallel (z, x, B, C, dt of the rank's heads and groups),
the conv, the scan and the gated norm run on the local channels, ``out_proj`` is row-parallel, so the
mixer has the same two TP collectives per pass as an attention block (one all-reduce, or RS + AG
under SP, forward and one backward). Qwen3-Next's GatedDeltaNet is sharded the same way in vLLM
(column-parallel ``in_proj_qkvz``/``in_proj_ba``, row-parallel ``out_proj``). Mamba1 (Jamba,
vLLM ``MambaMixer``) adds the row-parallel ``x_proj`` and its all-reduce of ``dt_rank + 2 d_state``
channels per token.

Scan. The chunked SSD (Dao & Gu 2024, arXiv 2405.21060, Sec. 6) and chunked gated delta rule
(Yang et al. 2024, arXiv 2412.06464, Sec. 3.3, the WY/UT form of Yang et al. 2024, arXiv
2406.06484) do their chunk-local work as small batched matmuls, priced as GEMMs (``gemm_time``, the
device's bf16 GEMM efficiency at those shapes); the inter-chunk state passing, the causal conv1d, the
gating and the gated RMSNorm are memory-bound traffic at HBM bandwidth. Mamba1's selective scan
(Gu & Dao 2023, arXiv 2312.00752, Sec. 3.3) runs on CUDA cores from registers and is priced as its
HBM traffic. Backward is twice the forward, as for the engine's other memory-bound work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autopar.blocks import gated_deltanet as gdn
from autopar.blocks import mamba
from autopar.blocks.stage import Mix, mix, recurrent_kinds  # noqa: F401  (re-exported)
from autopar.blocks.stage import n_blocks as blocks  # noqa: F401  (re-exported)

SSD_CHUNK = mamba.CHUNK
GDN_CHUNK = gdn.CHUNK
FP32 = 4.0


def gdn_widths(model) -> tuple[int, int, int]:
    """Gated DeltaNet widths: total key width, total value width and value heads."""
    return gdn.widths(model)


# --------------------------------------------------------------------------------------- GEMMs
def mixer_gemm_shapes(model, tp) -> list[tuple[float, Any, Any]]:
    """(blocks share, N, K) of each forward linear GEMM of the recurrent mixers, per rank, M = tokens
    (each kind's :func:`gemm_shapes`)."""
    return [(w, N, K) for w, kind in recurrent_kinds(model) for N, K in kind.gemm_shapes(model, tp)]


def mixer_gemms(model, f, T, tp) -> np.ndarray:
    """Forward linear GEMMs of one block's recurrent mixers (averaged over the mix): the sum of
    ``f(T, N, K)`` over :func:`mixer_gemm_shapes`."""
    out = np.zeros(np.shape(tp))
    for w, N, K in mixer_gemm_shapes(model, tp):
        out = out + w * f(T, N, K)
    return out


def decode_state_step(model, tp) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, 16-bit state elements read + written) per decoded token per rank of one block's
    recurrent mixers, mix-averaged: the recurrent form reads and rewrites the whole state (conv
    window and SSM / delta-rule state) once per token (:attr:`ModelSpec.ssm_core_flops_per_token`,
    :attr:`ModelSpec.linear_attn_core_flops_per_token`)."""
    tp = np.asarray(tp, dtype=np.float64)
    flops = sum((w * kind.decode_flops(model) for w, kind in recurrent_kinds(model)), 0.0)
    state = sum((w * kind.state_elems(model) for w, kind in recurrent_kinds(model)), 0.0)
    return flops / tp, 2.0 * state / tp


def scan_flops_per_token(model, tp=1.0):
    """Forward FLOPs per token per rank of the chunked scans as GEMM-class work, averaged per block
    (each kind's :func:`scan_flops_per_token`; Mamba1's memory-bound scan has none)."""
    fl = sum((w * kind.scan_flops_per_token(model) for w, kind in recurrent_kinds(model)), 0.0)
    return fl / np.asarray(tp, dtype=np.float64)


def scan_time(model, gemm_time_fn, T, tp) -> np.ndarray:
    """Forward seconds of the chunked scans of one block (averaged over the mix) per rank.

    ``gemm_time_fn(M, N, K)`` times one GEMM at the bf16 rate; each chunk-local matmul is timed at
    its own small shape and multiplied by how many the T tokens need (chunks x heads or groups per
    rank), the FLOPs of :func:`scan_flops_per_token`.
    """
    t = np.zeros(np.shape(tp))
    for w, kind in recurrent_kinds(model):
        if kind.scan_flops_per_token(model):
            t = t + w * kind.scan_time(model, gemm_time_fn, T, tp)
    return t


def mixer_elementwise_elems(model, tp) -> np.ndarray:
    """Forward memory-bound traffic per token of one block's recurrent mixers, in activation elements
    (16-bit) per rank, averaged over the mix; the fp32 chunk states are in :func:`state_pass_bytes`."""
    e = np.zeros(np.shape(tp))
    for w, kind in recurrent_kinds(model):
        e = e + w * kind.elementwise_elems(model, tp)
    return e


def state_pass_bytes(model, tp) -> np.ndarray:
    """Forward bytes per token per rank of the fp32 inter-chunk states, averaged over the mix."""
    b = sum((w * kind.state_pass_bytes(model) for w, kind in recurrent_kinds(model)), 0.0)
    return b / np.asarray(tp, dtype=np.float64)


def mamba1_xproj_elems(model) -> float:
    """Channels per token of Mamba1's row-parallel x_proj output all-reduced over TP, per block."""
    if mamba.present(model) and model.mamba_version == 1:
        return mix(model).mamba * mamba.xproj_elems(model)
    return 0.0


def mixer_in_out_widths(model) -> tuple[float, float]:
    """(in_proj output width, out_proj input width) of one block's recurrent mixers, mix-averaged:
    the inputs of their column- and row-parallel GEMMs (fp8 casts, dgrad re-gathers)."""
    w_in = w_out = 0.0
    for w, kind in recurrent_kinds(model):
        i, o = kind.in_out_widths(model)
        w_in += w * i
        w_out += w * o
    return w_in, w_out


# --------------------------------------------------------------------------------------- memory
def mixer_activation_elems(model, tp, gi) -> np.ndarray:
    """16-bit elements per token per rank one block's recurrent mixers keep for backward (mix-averaged),
    excluding the block's norm input and the mixer's input (the norm output, counted by the caller);
    each kind's :func:`activation_elems`. ``gi``: bytes of a saved GEMM input relative to 16-bit."""
    e = np.zeros(np.shape(tp))
    for w, kind in recurrent_kinds(model):
        e = e + w * kind.activation_elems(model, tp, gi)
    return e


def recurrent_state_elems_per_layer(model) -> tuple[float, float]:
    """(Gated DeltaNet, Mamba) state elements of one sequence in one layer of that kind (serving)."""
    lin = gdn.state_elems(model) if gdn.present(model) else 0.0
    mam = mamba.state_elems(model) if mamba.present(model) else 0.0
    return lin, mam
