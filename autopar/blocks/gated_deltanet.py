"""Gated DeltaNet linear attention (Qwen3-Next): one block kind's costs in one place.

Parameters: :attr:`ModelSpec.linear_attn_params_per_layer` (the reader's count). Forward GEMMs per
token: ``in_proj_qkvz`` h -> 2 key_dim + 2 value_dim, ``in_proj_ba`` h -> 2 v_heads, ``out_proj``
value_dim -> h. The chunked gated delta rule (Yang et al. 2024, arXiv 2412.06464, Sec. 3.3; fla
``chunk_gated_delta_rule``, chunk C = 64) does its chunk-local work as small batched matmuls. TP
splits the value heads (column-parallel in_proj, row-parallel out_proj: vLLM's sharding), so every
per-rank figure below is divided by tp; CP and EP do not split it. Serving state: the conv window and
the d_k x d_v delta-rule state per value head (:func:`state_elems`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

KIND = "gated_deltanet"
# flash-linear-attention ``chunk_gated_delta_rule`` BT = 64.
CHUNK = 64
FP32 = 4.0


def present(model) -> bool:
    return bool(model.linear_attn_layers)


def layers(model) -> int:
    """Blocks of the model with this mixer."""
    return int(model.linear_attn_layers)


def params(model) -> float:
    """Parameters of one block's mixer (the model reader's count)."""
    return float(model.linear_attn_params_per_layer)


def widths(model) -> tuple[int, int, int]:
    """Total key width, total value width and value heads."""
    return (
        model.linear_k_heads * model.linear_k_head_dim,
        model.linear_v_heads * model.linear_v_head_dim,
        model.linear_v_heads,
    )


def gemm_shapes(model, tp) -> list[tuple[Any, Any]]:
    """(N, K) of each forward linear GEMM per rank, M = tokens; column N and row K divided by tp."""
    h = float(model.hidden)
    kd, vd, vh = widths(model)
    return [((2 * kd + 2 * vd) / tp, h), (2 * vh / tp, h), (h, vd / tp)]


def in_out_widths(model) -> tuple[float, float]:
    """(in_proj output width, out_proj input width): the inputs of the column- and row-parallel GEMMs."""
    kd, vd, vh = widths(model)
    return float(2 * kd + 2 * vd + 2 * vh), float(vd)


def scan_flops_per_token(model) -> float:
    """Forward FLOPs per token of the chunked scan, C per value head: K K^T and Q K^T (2 C d_k each),
    W = A K (2 C d_k), U = A V and the intra-chunk output (2 C d_v each), W S, Q S and the state
    update K^T U (2 d_k d_v each)."""
    dk, dv, C = model.linear_k_head_dim, model.linear_v_head_dim, CHUNK
    return float(model.linear_v_heads * (6 * C * dk + 4 * C * dv + 6 * dk * dv))


def flops_per_token(model) -> float:
    """Forward FLOPs per token of one block's mixer, unsharded: projections and the chunked scan."""
    return sum(2.0 * N * K for N, K in gemm_shapes(model, 1.0)) + scan_flops_per_token(model)


def scan_time(model, gemm_time_fn, T, tp) -> np.ndarray:
    """Forward seconds of one block's chunked scan per rank: each chunk-local matmul timed at its own
    shape (``gemm_time_fn(M, N, K)``, bf16) times the chunks x value heads per rank."""
    dk, dv, C = model.linear_k_head_dim, model.linear_v_head_dim, CHUNK
    cnt = T / C * model.linear_v_heads / tp
    per_chunk = (
        2.0 * gemm_time_fn(C, C, dk)  # K K^T, Q K^T
        + gemm_time_fn(C, dk, C)  # W = A K
        + 2.0 * gemm_time_fn(C, dv, C)  # U = A V, intra-chunk output
        + 2.0 * gemm_time_fn(C, dv, dk)  # W S, Q S
        + gemm_time_fn(dk, dv, C)  # state update K^T U
    )
    return cnt * per_chunk


def elementwise_elems(model, tp) -> np.ndarray:
    """Forward memory-bound traffic per token per rank, 16-bit elements: conv1d over q, k, v (read +
    write), the L2 norms of q and k (read + write), the gates g and beta (read + write, v_heads each),
    the gated RMSNorm (read o and z, write)."""
    kd, vd, vh = widths(model)
    return (2 * (2 * kd + vd) + 2 * 2 * kd + 2 * 2 * vh + 3 * vd) / np.asarray(tp, dtype=np.float64)


def state_pass_bytes(model) -> float:
    """Forward bytes per token (unsharded) of the fp32 chunk states: fla ``chunk_gated_delta_rule_fwd_h``
    writes the d_k x d_v state of each chunk per head, ``chunk_fwd_o`` reads it (2 passes per chunk)."""
    st = model.linear_v_heads * model.linear_k_head_dim * model.linear_v_head_dim
    return 2.0 * FP32 * st / CHUNK


def activation_elems(model, tp, gi) -> np.ndarray:
    """16-bit elements per token per rank kept for backward (fla ``ChunkGatedDeltaRuleFunction``): the
    in_proj outputs (q, k, v, z, b, a), the conv output q, k, v, the chunk-local C x C matrix A per
    value head, g and beta, the core output o and the out_proj input (``gi``: its bytes relative to
    16-bit)."""
    kd, vd, vh = widths(model)
    inproj = 2 * kd + 2 * vd + 2 * vh
    return (inproj + (2 * kd + vd) + vh * CHUNK + 2 * vh + vd + vd * gi) / np.asarray(tp, dtype=np.float64)


def state_elems(model) -> float:
    """Serving state of one sequence in one block: the conv window over q, k, v and the delta-rule state."""
    kd, vd, _ = widths(model)
    return float(
        (model.linear_conv - 1) * (2 * kd + vd)
        + model.linear_v_heads * (model.linear_k_head_dim * model.linear_v_head_dim)
    )


def decode_flops(model) -> float:
    """FLOPs per decoded token of the recurrent form (the reader's ``linear_attn_core_flops_per_token``)."""
    return float(model.linear_attn_core_flops_per_token)
