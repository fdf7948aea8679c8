"""Mamba mixers, Mamba2 (SSD) and Mamba1 (selective scan): one block kind's costs in one place.

Parameters: :attr:`ModelSpec.mamba_params_per_layer` (the reader's count). Forward GEMMs per token:
Mamba2 ``in_proj`` h -> 2 d_inner + 2 groups d_state + heads and ``out_proj`` d_inner -> h; Mamba1
``in_proj`` h -> 2 d_inner, ``x_proj`` d_inner -> dt_rank + 2 d_state, ``dt_proj`` dt_rank -> d_inner
and ``out_proj``. TP (Megatron-LM ``megatron/core/ssm/mamba_mixer.py``) shards the heads: in_proj
column-parallel, conv/scan/gated norm on the local channels, out_proj row-parallel; Mamba1 (Jamba,
vLLM ``MambaMixer``) adds the row-parallel ``x_proj`` and its all-reduce of dt_rank + 2 d_state
channels per token (:func:`xproj_elems`). CP and EP do not split it. The chunked SSD (Dao & Gu 2024,
arXiv 2405.21060, Sec. 6, chunk Q = 128) runs as small batched matmuls; Mamba1's scan (Gu & Dao
2023, arXiv 2312.00752, Sec. 3.3) runs from registers and is priced as its HBM traffic. Serving
state: the conv window and the d_inner x d_state SSM state (:func:`state_elems`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

KIND = "mamba"
# Megatron-LM MambaMixer ``chunk_size`` default 128 (also Nemotron-H's config ``chunk_size``).
CHUNK = 128
FP32 = 4.0


def present(model) -> bool:
    return bool(model.mamba_layers)


def layers(model) -> int:
    """Blocks of the model with this mixer."""
    return int(model.mamba_layers)


def params(model) -> float:
    """Parameters of one block's mixer (the model reader's count)."""
    return float(model.mamba_params_per_layer)


def gemm_shapes(model, tp) -> list[tuple[Any, Any]]:
    """(N, K) of each forward linear GEMM per rank, M = tokens; column N and row K divided by tp."""
    h = float(model.hidden)
    di, n = model.mamba_inner, model.mamba_state
    if model.mamba_version == 2:
        w = 2 * di + 2 * model.mamba_groups * n + model.mamba_heads
        return [(w / tp, h), (h, di / tp)]
    r = model.mamba_dt_rank
    return [(2 * di / tp, h), (float(r + 2 * n), di / tp), (di / tp, float(r)), (h, di / tp)]


def in_out_widths(model) -> tuple[float, float]:
    """(in_proj output width, out_proj input width): the inputs of the column- and row-parallel GEMMs."""
    di = model.mamba_inner
    if model.mamba_version == 2:
        return float(2 * di + 2 * model.mamba_groups * model.mamba_state + model.mamba_heads), float(di)
    return float(2 * di), float(di)


def scan_flops_per_token(model) -> float:
    """Forward GEMM-class FLOPs per token of the SSD scan (mamba_ssm ``_bmm_chunk_fwd``, ``chunk_state``,
    ``chunk_scan``): C B^T per chunk and group (2 Q N G), its masked product with X (2 Q d_inner), the
    chunk states B^T X and their read-out C h (2 N d_inner each). Mamba1: 0 (memory-bound scan)."""
    if model.mamba_version != 2:
        return 0.0
    di, n, Q = model.mamba_inner, model.mamba_state, CHUNK
    return float(2 * Q * n * model.mamba_groups + 2 * Q * di + 4 * n * di)


def flops_per_token(model) -> float:
    """Forward FLOPs per token of one block's mixer, unsharded: projections and the chunked scan."""
    return sum(2.0 * N * K for N, K in gemm_shapes(model, 1.0)) + scan_flops_per_token(model)


def scan_time(model, gemm_time_fn, T, tp) -> np.ndarray:
    """Forward seconds of one block's SSD scan per rank, each chunk-local matmul at its own shape."""
    if model.mamba_version != 2:
        return np.zeros(np.shape(tp))
    di, n, Q, G = model.mamba_inner, model.mamba_state, CHUNK, model.mamba_groups
    P = di / model.mamba_heads
    heads = model.mamba_heads / tp
    chunks = T / Q
    return (
        chunks * (G / tp) * gemm_time_fn(Q, Q, n)  # C B^T per group
        + chunks * heads * gemm_time_fn(Q, P, Q)  # (L o CB) X
        + chunks * heads * gemm_time_fn(n, P, Q)  # chunk states B^T X
        + chunks * heads * gemm_time_fn(Q, P, n)  # C h
    )


def elementwise_elems(model, tp) -> np.ndarray:
    """Forward memory-bound traffic per token per rank, 16-bit elements. Mamba2: conv1d over x, B, C
    (read + write; SiLU fused), dt softplus (heads), the gated RMSNorm (read y and z, write). Mamba1:
    conv1d over x, the selective scan reading u, delta, z and B, C and writing y, the dt/B/C norms
    (Jamba) and the x_proj split."""
    tp = np.asarray(tp, dtype=np.float64)
    di, n = model.mamba_inner, model.mamba_state
    if model.mamba_version == 2:
        return (2 * model.mamba_conv_dim + 2 * model.mamba_heads + 3 * di) / tp
    r = model.mamba_dt_rank
    return (2 * di + 4 * di) / tp + 2 * n + 2 * (r + 2 * n)


def state_pass_bytes(model) -> float:
    """Forward bytes per token (unsharded) of the fp32 chunk states: ``chunk_state`` writes each chunk's
    d_inner x d_state state, ``state_passing`` reads and rewrites it, ``chunk_scan`` reads it."""
    if model.mamba_version != 2:
        return 0.0
    return 4.0 * FP32 * model.mamba_inner * model.mamba_state / CHUNK


def xproj_elems(model) -> float:
    """Channels per token of Mamba1's row-parallel x_proj output all-reduced over TP (Mamba2: none)."""
    return float(model.mamba_dt_rank + 2 * model.mamba_state) if model.mamba_version == 1 else 0.0


def activation_elems(model, tp, gi) -> np.ndarray:
    """16-bit elements per token per rank kept for backward. Mamba2 (Megatron MambaMixer + mamba_ssm
    ``MambaChunkScanCombinedFn.save_for_backward``): the in_proj output z, xBC, dt, the conv output,
    the scan output y, the out_proj input (``gi``: relative bytes) and dt, dA_cumsum in fp32 (4 16-bit
    elements per head). Mamba1 (selective_scan ``save_for_backward``): in_proj output x, z, the conv
    output, x_proj output, delta, the scan output and the out_proj input."""
    tp = np.asarray(tp, dtype=np.float64)
    di, n = model.mamba_inner, model.mamba_state
    if model.mamba_version == 2:
        nh = model.mamba_heads
        inproj = 2 * di + 2 * model.mamba_groups * n + nh
        return (inproj + model.mamba_conv_dim + di + di * gi + 4 * nh) / tp
    r = model.mamba_dt_rank
    return (2 * di + di + di + di + di * gi) / tp + (r + 2 * n)


def state_elems(model) -> float:
    """Serving state of one sequence in one block: the conv window and the SSM state."""
    return float((model.mamba_conv - 1) * model.mamba_conv_dim + model.mamba_inner * model.mamba_state)


def decode_flops(model) -> float:
    """FLOPs per decoded token of the recurrent form (the reader's ``ssm_core_flops_per_token``)."""
    return float(model.ssm_core_flops_per_token)
