"""Costs of hybrid blocks: Gated DeltaNet linear attention, Mamba2 (SSD), Mamba1, and blocks without a
mixer or without a feed-forward part. Used by :mod:`autopar.latency`, :mod:`autopar.memory` and the
serving estimate; every function is vectorized over layouts (numpy arrays of ``tp`` etc.).

Placement. The engine splits layers evenly over pipeline stages and does not know where each block
kind sits in the stack, so a stage of ``n`` blocks is assumed to hold the model's mix of block kinds
in proportion (:class:`Mix`): ``n * attn_layers / layers`` attention mixers, ``n * mamba_layers /
layers`` Mamba mixers, and so on (fractional counts). Exact for the whole model (pp = 1), an average
per stage otherwise.

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

from dataclasses import dataclass
from typing import Any

import numpy as np

# Chunk lengths of the kernels: Megatron-LM MambaMixer ``chunk_size`` default 128 (also
# Nemotron-H's config ``chunk_size``); flash-linear-attention ``chunk_gated_delta_rule`` BT = 64.
SSD_CHUNK = 128
GDN_CHUNK = 64
FP32 = 4.0


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


def gdn_widths(model) -> tuple[int, int, int]:
    """Gated DeltaNet widths: total key width, total value width and value heads."""
    return (
        model.linear_k_heads * model.linear_k_head_dim,
        model.linear_v_heads * model.linear_v_head_dim,
        model.linear_v_heads,
    )


def mix(model) -> Mix:
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


def blocks(model, n_dense, n_moe) -> np.ndarray:
    """Blocks of a stage holding ``n_dense`` dense-MLP and ``n_moe`` MoE blocks (proportional mix)."""
    n = np.asarray(n_dense, dtype=np.float64) + np.asarray(n_moe, dtype=np.float64)
    if not model.is_hybrid:
        return n
    return n * mix(model).ffn_to_blocks


# --------------------------------------------------------------------------------------- GEMMs
def mixer_gemm_shapes(model, tp) -> list[tuple[float, Any, Any]]:
    """(blocks share, N, K) of each forward linear GEMM of the recurrent mixers, per rank, M = tokens.

    Gated DeltaNet: in_proj_qkvz h -> 2 key_dim + 2 value_dim, in_proj_ba h -> 2 v_heads,
    out_proj value_dim -> h. Mamba2: in_proj h -> 2 d_inner + 2 groups d_state + heads, out_proj.
    Mamba1: in_proj h -> 2 d_inner, x_proj d_inner -> dt_rank + 2 d_state, dt_proj dt_rank ->
    d_inner, out_proj. Column-parallel N and row-parallel K are divided by tp.
    """
    mx = mix(model)
    h = float(model.hidden)
    out: list[tuple[float, Any, Any]] = []
    if model.linear_attn_layers:
        kd = model.linear_k_heads * model.linear_k_head_dim
        vd = model.linear_v_heads * model.linear_v_head_dim
        out += [
            (mx.linear, (2 * kd + 2 * vd) / tp, h),
            (mx.linear, 2 * model.linear_v_heads / tp, h),
            (mx.linear, h, vd / tp),
        ]
    if model.mamba_layers:
        di, n = model.mamba_inner, model.mamba_state
        if model.mamba_version == 2:
            w = 2 * di + 2 * model.mamba_groups * n + model.mamba_heads
            out += [(mx.mamba, w / tp, h), (mx.mamba, h, di / tp)]
        else:
            r = model.mamba_dt_rank
            out += [
                (mx.mamba, 2 * di / tp, h),
                (mx.mamba, float(r + 2 * n), di / tp),
                (mx.mamba, di / tp, float(r)),
                (mx.mamba, h, di / tp),
            ]
    return out


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
    mx = mix(model)
    tp = np.asarray(tp, dtype=np.float64)
    lin, mamba = recurrent_state_elems_per_layer(model)
    flops = 0.0
    if model.linear_attn_layers:
        flops += mx.linear * model.linear_attn_core_flops_per_token
    if model.mamba_layers:
        flops += mx.mamba * model.ssm_core_flops_per_token
    return flops / tp, 2.0 * (mx.linear * lin + mx.mamba * mamba) / tp


def scan_flops_per_token(model, tp=1.0):
    """Forward FLOPs per token per rank of the chunked scans as GEMM-class work, averaged per block.

    Mamba2 SSD with chunk Q (arXiv 2405.21060 Sec. 6; mamba_ssm ``_bmm_chunk_fwd``, ``chunk_state``,
    ``chunk_scan``): C B^T per chunk and group (2 Q N G per token), its masked product with X
    (2 Q d_inner), the chunk states B^T X (2 N d_inner) and their read-out C h (2 N d_inner); the
    diagonal blocks are computed whole, the causal mask applied to them.
    Gated DeltaNet with chunk C per value head (arXiv 2412.06464 Sec. 3.3; fla
    ``chunk_gated_delta_rule``): K K^T and Q K^T (2 C d_k each), W = A K (2 C d_k), U = A V and the
    intra-chunk output (2 C d_v each), W S, Q S and the state update K^T U (2 d_k d_v each).
    Mamba1: 0 (its scan is memory-bound, :func:`mixer_elementwise_bytes`).
    """
    mx = mix(model)
    fl = 0.0
    if model.linear_attn_layers:
        dk, dv, C = model.linear_k_head_dim, model.linear_v_head_dim, GDN_CHUNK
        fl += mx.linear * model.linear_v_heads * (6 * C * dk + 4 * C * dv + 6 * dk * dv)
    if model.mamba_layers and model.mamba_version == 2:
        di, n, Q = model.mamba_inner, model.mamba_state, SSD_CHUNK
        fl += mx.mamba * (2 * Q * n * model.mamba_groups + 2 * Q * di + 4 * n * di)
    return fl / np.asarray(tp, dtype=np.float64)


def scan_time(model, gemm_time_fn, T, tp) -> np.ndarray:
    """Forward seconds of the chunked scans of one block (averaged over the mix) per rank.

    ``gemm_time_fn(M, N, K)`` times one GEMM at the bf16 rate; each chunk-local matmul is timed at
    its own small shape and multiplied by how many the T tokens need (chunks x heads or groups per
    rank), the FLOPs of :func:`scan_flops_per_token`.
    """
    mx = mix(model)
    t = np.zeros(np.shape(tp))
    if model.linear_attn_layers:
        dk, dv, C = model.linear_k_head_dim, model.linear_v_head_dim, GDN_CHUNK
        cnt = T / C * model.linear_v_heads / tp
        per_chunk = (
            2.0 * gemm_time_fn(C, C, dk)  # K K^T, Q K^T
            + gemm_time_fn(C, dk, C)  # W = A K
            + 2.0 * gemm_time_fn(C, dv, C)  # U = A V, intra-chunk output
            + 2.0 * gemm_time_fn(C, dv, dk)  # W S, Q S
            + gemm_time_fn(dk, dv, C)  # state update K^T U
        )
        t = t + mx.linear * cnt * per_chunk
    if model.mamba_layers and model.mamba_version == 2:
        di, n, Q, G = model.mamba_inner, model.mamba_state, SSD_CHUNK, model.mamba_groups
        P = di / model.mamba_heads
        heads = model.mamba_heads / tp
        chunks = T / Q
        per = (
            chunks * (G / tp) * gemm_time_fn(Q, Q, n)  # C B^T per group
            + chunks * heads * gemm_time_fn(Q, P, Q)  # (L o CB) X
            + chunks * heads * gemm_time_fn(n, P, Q)  # chunk states B^T X
            + chunks * heads * gemm_time_fn(Q, P, n)  # C h
        )
        t = t + mx.mamba * per
    return t


def mixer_elementwise_elems(model, tp) -> np.ndarray:
    """Forward memory-bound traffic per token of one block's recurrent mixers, in activation elements
    (16-bit) per rank, averaged over the mix; the fp32 chunk states are in :func:`state_pass_bytes`.

    Gated DeltaNet: conv1d over q, k, v (read + write), the L2 norms of q and k (read + write), the
    gates g and beta (read + write, v_heads each), the gated RMSNorm (read o and z, write).
    Mamba2: conv1d over x, B, C (read + write; SiLU fused), dt softplus (heads, read + write), the
    gated RMSNorm (read y and z, write). Mamba1: conv1d over x, the selective scan reading u, delta,
    z and B, C and writing y (Gu & Dao 2023, the fused kernel keeps the state on chip), the dt/B/C
    norms (Jamba) and the x_proj split.
    """
    mx = mix(model)
    tp = np.asarray(tp, dtype=np.float64)
    e = np.zeros(np.shape(tp))
    if model.linear_attn_layers:
        kd, vd, vh = gdn_widths(model)
        e = e + mx.linear * (2 * (2 * kd + vd) + 2 * 2 * kd + 2 * 2 * vh + 3 * vd) / tp
    if model.mamba_layers:
        di, n = model.mamba_inner, model.mamba_state
        if model.mamba_version == 2:
            cd = model.mamba_conv_dim
            e = e + mx.mamba * (2 * cd + 2 * model.mamba_heads + 3 * di) / tp
        else:
            r = model.mamba_dt_rank
            e = e + mx.mamba * ((2 * di + 4 * di) / tp + 2 * n + 2 * (r + 2 * n))
    return e


def state_pass_bytes(model, tp) -> np.ndarray:
    """Forward bytes per token per rank of the fp32 inter-chunk states, averaged over the mix.

    Mamba2 (mamba_ssm ``chunk_state`` writes each chunk's d_inner x d_state state, ``state_passing``
    reads and rewrites it, ``chunk_scan`` reads it: 4 passes per chunk of Q tokens); Gated DeltaNet
    (fla ``chunk_gated_delta_rule_fwd_h`` writes the d_k x d_v state of each chunk per head,
    ``chunk_fwd_o`` reads it: 2 passes per chunk of C tokens).
    """
    mx = mix(model)
    b = 0.0
    if model.linear_attn_layers:
        st = model.linear_v_heads * model.linear_k_head_dim * model.linear_v_head_dim
        b += mx.linear * 2.0 * FP32 * st / GDN_CHUNK
    if model.mamba_layers and model.mamba_version == 2:
        b += mx.mamba * 4.0 * FP32 * model.mamba_inner * model.mamba_state / SSD_CHUNK
    return b / np.asarray(tp, dtype=np.float64)


def mamba1_xproj_elems(model) -> float:
    """Channels per token of Mamba1's row-parallel x_proj output all-reduced over TP, per block."""
    if model.mamba_layers and model.mamba_version == 1:
        return mix(model).mamba * (model.mamba_dt_rank + 2 * model.mamba_state)
    return 0.0


def mixer_in_out_widths(model) -> tuple[float, float]:
    """(in_proj output width, out_proj input width) of one block's recurrent mixers, mix-averaged:
    the inputs of their column- and row-parallel GEMMs (fp8 casts, dgrad re-gathers)."""
    mx = mix(model)
    w_in = w_out = 0.0
    if model.linear_attn_layers:
        kd = model.linear_k_heads * model.linear_k_head_dim
        vd = model.linear_v_heads * model.linear_v_head_dim
        w_in += mx.linear * (2 * kd + 2 * vd + 2 * model.linear_v_heads)
        w_out += mx.linear * vd
    if model.mamba_layers:
        di = model.mamba_inner
        if model.mamba_version == 2:
            w_in += mx.mamba * (2 * di + 2 * model.mamba_groups * model.mamba_state + model.mamba_heads)
        else:
            w_in += mx.mamba * 2 * di
        w_out += mx.mamba * di
    return w_in, w_out


# --------------------------------------------------------------------------------------- memory
def mixer_activation_elems(model, tp, gi) -> np.ndarray:
    """16-bit elements per token per rank one block's recurrent mixers keep for backward (mix-averaged),
    excluding the block's norm input and the mixer's input (the norm output, counted by the caller).

    Mamba2 (Megatron MambaMixer + mamba_ssm ``MambaChunkScanCombinedFn.save_for_backward``): the
    in_proj output z, xBC, dt (the conv's input), the conv output x, B, C (the scan's inputs), the
    scan output y (the gated norm's input), the out_proj input, and dt and dA_cumsum in fp32 (2
    heads-sized fp32 tensors = 4 16-bit elements per head); chunk states are recomputed in backward.
    Gated DeltaNet (fla ``ChunkGatedDeltaRuleFunction``): the in_proj outputs (q, k, v, z, b, a), the
    conv output q, k, v, the chunk-local C x C matrix A per value head, g and beta, the core output o
    and the out_proj input. Mamba1 (selective_scan ``save_for_backward``): the in_proj output x, z,
    the conv output, x_proj output, delta, the scan output and the out_proj input.
    ``gi``: bytes of a saved GEMM input relative to 16-bit (8-bit low-precision GEMM inputs).
    """
    mx = mix(model)
    tp = np.asarray(tp, dtype=np.float64)
    e = np.zeros(np.shape(tp))
    if model.linear_attn_layers:
        kd, vd, vh = gdn_widths(model)
        inproj = 2 * kd + 2 * vd + 2 * vh
        e = e + mx.linear * (inproj + (2 * kd + vd) + vh * GDN_CHUNK + 2 * vh + vd + vd * gi) / tp
    if model.mamba_layers:
        di, n = model.mamba_inner, model.mamba_state
        if model.mamba_version == 2:
            nh = model.mamba_heads
            inproj = 2 * di + 2 * model.mamba_groups * n + nh
            e = e + mx.mamba * (inproj + model.mamba_conv_dim + di + di * gi + 4 * nh) / tp
        else:
            r = model.mamba_dt_rank
            e = e + mx.mamba * ((2 * di + di + di + di + di * gi) / tp + (r + 2 * n))
    return e


def recurrent_state_elems_per_layer(model) -> tuple[float, float]:
    """(Gated DeltaNet, Mamba) state elements of one sequence in one layer of that kind (serving)."""
    lin = mamba = 0.0
    if model.linear_attn_layers:
        kd = model.linear_k_heads * model.linear_k_head_dim
        vd = model.linear_v_heads * model.linear_v_head_dim
        lin = (model.linear_conv - 1) * (2 * kd + vd) + model.linear_v_heads * (
            model.linear_k_head_dim * model.linear_v_head_dim
        )
    if model.mamba_layers:
        mamba = (model.mamba_conv - 1) * model.mamba_conv_dim + model.mamba_inner * model.mamba_state
    return float(lin), float(mamba)
