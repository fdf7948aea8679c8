"""Cross-attention of an encoder-decoder model's decoder blocks (Whisper, SeamlessM4T text): one
block kind's costs in one place.

Every decoder block adds, after its causal self-attention, a sublayer whose queries come from the
decoder and whose keys and values are projections of the encoder output (HF ``encoder_attn`` /
``cross_attention``: q_proj, k_proj, v_proj, out_proj as the self-attention's, with its own
LayerNorm). Parameters: :attr:`ModelSpec.cross_attn_params_per_layer`. Forward FLOPs, unsharded:

* per decoder token: Q and O projections, ``2 h a d`` each, and the core against all ``s_enc``
  encoder positions without a mask, ``2 s_enc a d`` for QK^T and as much for PV
  (:func:`flops_per_token`);
* per encoder position: the K and V projections, ``2 h a d`` each (:func:`kv_flops_per_token`).

TP splits it as the self-attention (Megatron: heads over TP, column-parallel Q/K/V, row-parallel
output): one all-reduce of the decoder tokens' h forward and one backward per layer. The K/V
projections read the encoder output, which each TP rank holds whole. CP and PP are refused for
encoder-decoder layouts (:mod:`autopar.legality`): a sequence split would have to ship the encoder
output to every CP rank and a pipeline split would carry it between stages, which this model does
not cost. Activations kept for backward: Q and the output over the decoder tokens, K and V over the
encoder positions, the FlashAttention log-sum-exp, and the sublayer's norm input and output
(:func:`activation_elems`). Serving state: none here (encoder-decoder models are not served by
``autopar serve``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autopar.blocks import attention

KIND = "cross_attention"


def present(model) -> bool:
    return model.arch == "encoder_decoder"


def params(model) -> float:
    """One decoder block's cross-attention with its norm (the reader's count)."""
    return float(model.cross_attn_params_per_layer)


def _qd(model) -> float:
    return float(model.heads * model.head_dim)


def q_o_shapes(model, tp) -> list[tuple[Any, Any]]:
    """(N, K) per rank of the decoder-side GEMMs, M = decoder tokens: Q (column-parallel) and the
    output projection (row-parallel)."""
    h = float(model.hidden)
    return [(_qd(model) / tp, h), (h, _qd(model) / tp)]


def kv_shapes(model, tp) -> list[tuple[Any, Any]]:
    """(N, K) per rank of the encoder-side GEMM, M = encoder positions: the fused K and V projection."""
    return [(2.0 * _qd(model) / tp, float(model.hidden))]


def flops_per_token(model, s_enc: float = 0.0) -> float:
    """Forward FLOPs per decoder token: Q and O projections and the unmasked core against ``s_enc``."""
    proj = sum(2.0 * N * K for N, K in q_o_shapes(model, 1.0))
    return proj + attention.core_flops_per_token(model, s_enc, causal=False)


def kv_flops_per_token(model) -> float:
    """Forward FLOPs per encoder position: its K and V projections (one per decoder block)."""
    return sum(2.0 * N * K for N, K in kv_shapes(model, 1.0))


def gemms(model, f, T_dec, T_enc, tp) -> Any:
    """``f(M, N, K)`` summed over the Q/O GEMMs on ``T_dec`` rows and the K/V GEMM on ``T_enc``."""
    out = sum((f(T_dec, N, K) for N, K in q_o_shapes(model, tp)), 0.0)
    return out + sum((f(T_enc, N, K) for N, K in kv_shapes(model, tp)), 0.0)


def core_time(model, ctx, s_enc: float) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per rank of one layer's core: ``ctx`` is the decoder's (its
    ``s_loc`` queries), ``s_enc`` unmasked keys; FlashAttention's backward multiple."""
    mm, ex = attention.attn_fwd(model, ctx, s_enc, False, causal=False)
    return mm + ex, attention.FLASH_BWD_MULT * mm + ex


def activation_elems(model, sb_dec, sb_enc, t, gi) -> Any:
    """16-bit elements one layer keeps for backward per rank (Korthikanti et al. 2022's attention
    terms with K and V over the encoder positions): Q and the output over ``sb_dec`` decoder tokens,
    K and V over ``sb_enc`` encoder positions, the out-projection's input copy under low-precision
    GEMMs (``gi`` < 1) and the log-sum-exp."""
    a_d = _qd(model)
    q = 2.0 * sb_dec * a_d / t
    kv = 2.0 * 2.0 * sb_enc * a_d / t
    out = 2.0 * sb_dec * a_d / t * (1.0 + np.where(gi < 1.0, 0.5, 0.0))
    lse = 4.0 * sb_dec * model.heads / t
    return q + kv + out + lse
