"""Softmax self-attention, MHA / GQA / MQA (and a gated output, sliding-window layers): one block
kind's costs in one place. :mod:`autopar.blocks.mla` reuses its core (:func:`core_time`).

Parameters: :attr:`ModelSpec.attn_params_per_layer` (the reader's count; the weight matrices are
:func:`gemm_shapes` at tp = 1). Forward GEMMs per token: the fused QKV projection h -> (a + 2g) d
(a gated output adds a d for the gate, Qwen3-Next) and the output projection a d -> h. The core
(Dao 2023, FlashAttention-2) does 4 s s_kv a d / 2 FLOPs per causal sequence forward and 2.5x that
backward; an unfused core (Megatron-DeepSpeed CoreAttention) materializes the s x s_kv scores.
Megatron splits heads over TP (column-parallel QKV, row-parallel output: 2 TP collectives per pass),
the sequence over CP (ring attention passing each rank's K and V: :func:`cp_chunk_elems`); EP does
not split it. Serving state: the KV cache, g (d + d_v) elements per token and layer
(:attr:`ModelSpec.kv_cache_elems_per_token_per_layer`).

Per-layer shapes (:meth:`ModelSpec.attn_views`: sliding layers with their own heads and head sizes,
full layers whose V is K's projection): every per-layer function below is the mean over the model's
attention layers of each shape's own figure (:func:`per_shape`), so a stage of ``n`` attention layers
costs ``n`` times it: each shape on its share of the stage's layers (exact at pp = 1, the model's mix
on each stage otherwise, as for the sliding-window share).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from autopar.blocks.context import NONCAUSAL_ATTENTION_SPEEDUP, SlotContext, gemm_time
from autopar.hardware import attention_fraction

KIND = "attention"
# FlashAttention backward: dQ, dK, dV and the recomputed QK^T, 2.5x the forward's matmul FLOPs.
FLASH_BWD_MULT = 2.5


def shares(model) -> list[tuple[float, Any]]:
    """(share of the attention layers, a spec of one shape) per attention shape of ``model``."""
    if not getattr(model, "per_layer_attention", False):
        return [(1.0, model)]
    views = model.attn_views()
    n = float(sum(k for k, _ in views))
    return [(k / n, v) for k, v in views]


def per_shape(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(model, ...)`` of a one-shape model; of a model with per-layer shapes, the share-weighted
    sum of ``fn`` on each shape's view (element-wise for a tuple result)."""

    @functools.wraps(fn)
    def mixed(model, *args: Any, **kw: Any) -> Any:
        if not getattr(model, "per_layer_attention", False):
            return fn(model, *args, **kw)
        parts = [(w, fn(v, *args, **kw)) for w, v in shares(model)]
        if isinstance(parts[0][1], tuple):
            return tuple(sum(w * p[i] for w, p in parts) for i in range(len(parts[0][1])))
        return sum(w * p for w, p in parts)

    return mixed


def present(model) -> bool:
    return bool(model.attn_layers) and not model.is_mla


@per_shape
def params(model) -> float:
    """Parameters of one attention mixer (the model reader's count, with biases and q/k norms)."""
    return float(model.attn_params_per_layer)


def gemm_shapes(model, tp) -> list[tuple[Any, Any]]:
    """(N, K) of each forward linear GEMM per rank, M = tokens: fused QKV (column-parallel) and the
    output projection (row-parallel), of a one-shape model (a view of :meth:`ModelSpec.attn_views`)."""
    if getattr(model, "per_layer_attention", False):
        raise ValueError("gemm_shapes is per attention shape: call it on each of model.attn_views()")
    h = float(model.hidden)
    a, g, d, dv = model.heads, model.kv_heads, model.head_dim, model.v_dim
    q_mult = 2 if model.attn_output_gate else 1  # gated attention: q_proj also emits the gate
    v = 0 if model.full_k_eq_v else g * dv  # K=V layers: no V projection
    gate = a if model.attn_head_gate else 0  # a per-head gate (Laguna g_proj), fused beside Q
    return [((q_mult * a * d + g * d + v + gate) / tp, h), (h, a * dv / tp)]


@per_shape
def gemms(model, f, T, tp) -> tuple[Any, Any]:
    """(all linear GEMMs, the up-projection share MLA's ``mla_up_proj`` recompute repeats: none here):
    ``f(M, N, K)`` summed over :func:`gemm_shapes`."""
    (n1, k1), (n2, k2) = gemm_shapes(model, tp)
    return f(T, n1, k1) + f(T, n2, k2), np.zeros(np.shape(tp))


@per_shape
def core_flops_per_token(model, s_kv: float, causal: bool = True) -> float:
    """Forward FLOPs per query token of the core against ``s_kv`` keys: QK^T and PV, 2 s_kv a (d_qk +
    d_v), halved under a causal mask."""
    fl = 2.0 * s_kv * model.heads * (model.qk_head_dim + model.v_dim)
    return fl * 0.5 if causal else fl


@per_shape
def flops_per_token(model, s_kv: float = 0.0) -> float:
    """Forward FLOPs per token of one block's mixer, unsharded: projections, and the core against
    ``s_kv`` keys (causal in a decoder, unmasked in an encoder: ``model.causal``)."""
    proj = sum(2.0 * N * K for N, K in gemm_shapes(model, 1.0))
    return proj + core_flops_per_token(model, s_kv, causal=model.causal)


@per_shape
def rope_elems(model, tp) -> Any:
    """Forward memory-bound traffic per token per rank of RoPE on q and k (read + write)."""
    return 2 * (model.heads + model.kv_heads) * model.qk_head_dim / tp


@per_shape
def cp_chunk_elems(model, tp) -> Any:
    """Elements per token one ring-CP step sends: K and V of the rank's heads."""
    return model.kv_heads * (model.head_dim + model.v_dim) / tp


@per_shape
def qkv_dgrad_k(model, tp) -> Any:
    """K of the QKV projection's data-gradient GEMM (what the SP re-gather of its input hides behind)."""
    # MLA (mla.qkv_dgrad_k) keeps the uniform q/k/v width; a K=V layer has no V projection
    v = model.qk_head_dim if model.is_mla else (0 if model.full_k_eq_v else model.v_dim)
    return (model.heads * model.qk_head_dim + model.kv_heads * (model.qk_head_dim + v)) / tp


def attn_fwd(
    model, ctx: SlotContext, s_kv, cp_ring: bool = True, *, causal: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(matmul seconds, softmax-exponential seconds) of one layer's forward attention core per rank.

    ``causal=False`` (an encoder's self-attention, a decoder's cross-attention): every query
    attends to all ``s_kv`` keys, twice the causal FLOPs, on an unmasked kernel
    ``NONCAUSAL_ATTENTION_SPEEDUP`` faster per FLOP; under ring CP every step is unmasked (no
    ring factor).

    FLOPs ``2 mb s_loc s_kv (a/tp) (d_qk + d_v) / 2`` at the attention efficiency (falling for short
    ``s_kv``), scaled by the ring-CP factor where ``cp_ring``. The softmax's exponentials run on the
    special-function units, one per score element forward and one more backward (FlashAttention
    recomputes P = exp(S - lse)), in series with the matmuls that produce and consume them (BMM1 ->
    softmax -> BMM2: NVIDIA, "Making Softmax More Efficient with NVIDIA Blackwell Ultra"). At both
    units' peak rates and head dim 128 they add 26% to the matmul time on H100 and 54% on B200, whose
    tensor cores doubled and SFUs did not (the FlashAttention-4 paper's point): this is why attention
    does not speed up with the tensor-core peak. fp32 attention has no SFU bound beyond its slow
    matmuls; an unfused core's exponentials are in its memory-bound passes.
    """
    co, a = ctx.co, model.heads
    fl = 2.0 * ctx.mb * ctx.s_loc * s_kv * (a / ctx.tp) * (model.qk_head_dim + model.v_dim) * 0.5
    eff = co.attention_eff * ctx.attn_speed * s_kv / (s_kv + co.gemm_half_dim)
    scale = ctx.ring if cp_ring else 1.0
    if not causal:  # twice the FLOPs, at the unmasked kernel's rate, every ring step unmasked
        fl = 2.0 * fl
        scale = 1.0 / NONCAUSAL_ATTENTION_SPEEDUP
    ex_scale = scale if causal else 1.0  # the exponentials run on the SFUs, mask or not
    mm = fl / (ctx.attn_peak * eff) * scale
    exps = fl / (2.0 * (model.qk_head_dim + model.v_dim))
    ex = np.where(ctx.is_fp32 | (co.exp_rate <= 0), 0.0, exps / max(co.exp_rate, 1.0)) * np.ones(ctx.n)
    if not co.attention_fwd:
        return mm, ex * ex_scale
    # A measured kernel (Efficiency.attention_fwd: exponentials included, so no SFU term) at the
    # causal length a query tile sees: the full sequence, or the query chunk for a window shorter
    # than it; times the fitted attention_scale. A stack on FlashAttention-2 where the device has a
    # faster fused kernel runs 1 / fused_attention_speedup of it. fp32 attention: the matmul rate.
    frac = attention_fraction(
        co.attention_fwd, 0.5 * (model.qk_head_dim + model.v_dim), np.maximum(s_kv, ctx.s_loc)
    )
    rate = ctx.bf16_peak * frac * co.attention_scale * ctx.attn_speed / co.fused_attention_speedup
    return np.where(ctx.is_fp32, mm, fl / rate * scale), np.where(ctx.is_fp32, ex * ex_scale, 0.0)


def window_fwd(model, ctx: SlotContext, window: float, s_kv_full: float) -> tuple[np.ndarray, np.ndarray]:
    """attn_fwd of a causal window of ``window`` keys: query i attends to min(i, w) keys, s·w − w²/2
    in all, which attn_fwd's causal half of s·s_kv is for s_kv = 2w − w²/s (the full causal s when
    w >= s)."""
    w = min(float(window), s_kv_full)
    return attn_fwd(model, ctx, 2.0 * w - w * w / s_kv_full, False)


def _sparse_core_time(model, ctx: SlotContext, s_kv_full: float) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek Sparse Attention: the core attends to the index_topk keys the indexer picks, as many
    keys per query as a causal window of that width (priced at the dense kernel's rate for that
    count: sparse MLA kernels are not measured), plus the indexer's scores of every earlier key per
    index head, an MQA-shaped GEMM (M = tokens x index heads per rank, N = keys, K = index_dim; half
    of it under the causal mask) at the bf16 GEMM rate; the indexer trains on its own loss, so its
    backward is a GEMM's 2x."""
    mm, ex = window_fwd(model, ctx, model.index_topk, s_kv_full)
    co = ctx.co
    rows = ctx.mb * ctx.s_loc * model.index_heads / ctx.tp
    score = 0.5 * gemm_time(
        co, ctx.bf16_peak, co.gemm_eff["bf16"], rows, s_kv_full, model.index_head_dim, ctx.elem
    )
    return mm + ex + score, FLASH_BWD_MULT * mm + ex + 2.0 * score


@per_shape
def core_time(model, ctx: SlotContext) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one layer's attention core per rank (the model's sliding-window
    share averaged over its attention layers)."""
    co = ctx.co
    window = model.sliding_window or 0
    s_kv_full = float(ctx.seq_len)
    if not ctx.profile.flash_attention:
        # Unfused core (Megatron-DeepSpeed CoreAttention): per (micro-batch, head) the full s x s_kv
        # score matrix, causal mask and any sliding window applied by masking, not skipped:
        # QK^T and PV as batched GEMMs (bf16/fp32 rate; their operand traffic includes writing and
        # reading the scores), then memory-bound passes over the s·s_kv scores: masked fill and
        # softmax read + write one score each, dropout reads one and writes one plus a 1-byte mask.
        # Backward: dgrad of both operands of each GEMM and one backward pass per elementwise op
        # reading its saved tensor and the incoming gradient: 2x the forward.
        bh = ctx.mb * model.heads / ctx.tp
        geff = np.where(ctx.is_fp32, co.gemm_eff.get("fp32", co.gemm_eff["bf16"]), co.gemm_eff["bf16"])
        scores = gemm_time(co, ctx.attn_peak, geff, ctx.s_loc, s_kv_full, model.qk_head_dim, ctx.elem)
        context = gemm_time(co, ctx.attn_peak, geff, ctx.s_loc, model.v_dim, s_kv_full, ctx.elem)
        passes = bh * ctx.s_loc * s_kv_full * (6.0 * ctx.elem + 1.0) / co.hbm_bw
        attn_f = bh * (scores + context) + passes
        return attn_f, 2.0 * attn_f
    if model.index_topk:
        return _sparse_core_time(model, ctx, s_kv_full)
    if window and model.sliding_window_layers:
        # FlashAttention: fwd 4·s·s_kv·a·d/2 (causal), bwd 2.5× fwd; window layers by window_fwd.
        frac_sw = model.sliding_window_layers / max(model.attn_layers, 1)
        mm_full, ex_full = attn_fwd(model, ctx, s_kv_full)
        mm_win, ex_win = window_fwd(model, ctx, window, s_kv_full)
        mm_f = (1 - frac_sw) * mm_full + frac_sw * mm_win
        ex_f = (1 - frac_sw) * ex_full + frac_sw * ex_win
    else:
        mm_f, ex_f = attn_fwd(model, ctx, s_kv_full, causal=model.causal)
    return mm_f + ex_f, FLASH_BWD_MULT * mm_f + ex_f


@per_shape
def activation_elems(model, ctx_sb, t, gi, drop_norm, sp_div) -> tuple[Any, Any]:
    """(Q, K, V elements kept for backward, attention output elements) per rank for ``ctx_sb`` tokens,
    16-bit (Korthikanti et al. 2022, Table 2 generalized to GQA): 2 sb (a d + 2 g d)/t and 2 sb a d_v/t,
    the output also as the out-projection's 8-bit copy under low-precision GEMMs (``gi`` < 1)."""
    qkv = 2.0 * ctx_sb * (model.heads * model.head_dim + model.kv_heads * (model.head_dim + model.v_dim)) / t
    return qkv, _attn_out(model, ctx_sb, t, gi)


@per_shape
def _attn_out(model, sb, t, gi) -> Any:
    return 2.0 * sb * model.heads * model.v_dim / t * (1.0 + np.where(gi < 1.0, 0.5, 0.0))


@per_shape
def output_gate_elems(model, sb, t) -> Any:
    """The gated output's gate, kept for backward (Qwen3-Next: ``attn_output_gate``)."""
    return 2.0 * sb * model.heads * model.head_dim / t


@per_shape
def core_activation_elems(model, s, sb, t, flash_attention: bool) -> Any:
    """What the core keeps: FlashAttention's fp32 log-sum-exp per row, or the unfused 5 a s^2 b
    softmax/dropout term (Korthikanti et al. 2022)."""
    if flash_attention:
        return 4.0 * sb * model.heads / t
    return 5.0 * model.heads * s * sb / t


@per_shape
def kv_cache_elems(model) -> float:
    """Serving state: KV-cache elements per token of one layer (K and V of the g KV heads)."""
    return float(model.kv_heads * (model.head_dim + model.v_dim))
