"""The encoder layer kind: bidirectional self-attention + a plain MLP (BERT, the encoder stack of
Whisper and SeamlessM4T), and Whisper's convolutional audio front-end. One block kind's costs in one
place.

A layer is a softmax-attention mixer (:mod:`autopar.blocks.attention`: Q, K, V, O with biases, MHA)
and a non-gated MLP (:mod:`autopar.blocks.mlp`: fc1 h -> F, GELU/ReLU, fc2 F -> h, with biases),
each with a norm: after its residual add (BERT's post-norm, ``ModelSpec.post_norm``) or before its
sublayer (Whisper, SeamlessM4T); the two place the same LayerNorm, so parameters, FLOPs and
activations are the same. What differs from a decoder block is the core: no causal mask, every
query attends to all ``s`` keys, so the QK^T and PV FLOPs are the full ``4 s a d`` per token, not the
causal half (:func:`flops_per_token`), and the kernel runs unmasked (``NONCAUSAL_ATTENTION_SPEEDUP``
faster per FLOP: :func:`autopar.blocks.attention.attn_fwd`).

Parameters: :attr:`ModelSpec.attn_params_per_layer` + :attr:`ModelSpec.dense_mlp_params` +
:attr:`ModelSpec.norm_params_per_layer` (the reader's count). TP splits it as Megatron's BERT does:
heads over TP (column-parallel QKV, row-parallel output), F over TP (column-parallel fc1,
row-parallel fc2): 2 TP collectives per pass. CP: ring attention without a causal mask (every step
a full, unmasked block: balanced without reordering). EP: nothing to split. Activations kept for
backward per recompute mode: Korthikanti et al. 2022's layer (:func:`autopar.memory.activation_bytes_per_layer`
with the plain-MLP terms). Serving state: none. An encoder is not run autoregressively: it has no
KV cache, and ``autopar serve`` refuses an encoder-only model (:func:`autopar.model.check_served`).

Whisper's front-end (``frontend_mels`` > 0): conv1 (mels -> h, kernel 3, stride 1) on the 2 s_enc
log-mel frames, GELU, conv2 (h -> h, kernel 3, stride 2) down to the s_enc encoder positions. Per
encoder position: ``2 x 2 (3 mels) h`` FLOPs for conv1 (two frames) and ``2 (3 h) h`` for conv2;
parameters ``3 mels h + h + 3 h h + h`` (in :attr:`ModelSpec.extra_params`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autopar.blocks import attention, mlp

KIND = "encoder"
KERNEL = 3  # Whisper's front-end convolutions: kernel 3, padding 1; conv2 has stride 2


def present(model) -> bool:
    return model.arch in ("encoder", "encoder_decoder")


def params(model) -> float:
    """Parameters of one encoder layer of an encoder-only spec (or ``model.encoder_view()``)."""
    return float(model.attn_params_per_layer + model.dense_mlp_params + model.norm_params_per_layer)


def flops_per_token(model, s: float) -> float:
    """Forward FLOPs per token of one encoder layer, unsharded: the projections, the MLP and the
    core against all ``s`` keys (no causal halving)."""
    proj = sum(2.0 * N * K for N, K in attention.gemm_shapes(model, 1.0))
    return proj + attention.core_flops_per_token(model, s, causal=False) + mlp.flops_per_token(model)


def frontend_params(model) -> int:
    """Whisper's conv1 (mels -> h) and conv2 (h -> h), kernel 3, with biases."""
    if not model.frontend_mels:
        return 0
    h = model.hidden
    return KERNEL * model.frontend_mels * h + h + KERNEL * h * h + h


def frontend_gemm_shapes(model) -> list[tuple[float, float, float]]:
    """(rows per encoder position, N, K) of the two convolutions as im2col GEMMs."""
    if not model.frontend_mels:
        return []
    h = float(model.hidden)
    return [(2.0, h, KERNEL * float(model.frontend_mels)), (1.0, h, KERNEL * h)]


def frontend_flops_per_token(model) -> float:
    """Forward FLOPs of the front-end per encoder position (conv1 runs on two input frames)."""
    return sum(2.0 * r * N * K for r, N, K in frontend_gemm_shapes(model))


def frontend_time(model, ctx, T_enc) -> Any:
    """Forward seconds of the front-end per rank for ``T_enc`` encoder positions (not split by TP:
    each rank runs the convolutions of its sequence)."""
    return sum((ctx.gt(r * T_enc, N, K) for r, N, K in frontend_gemm_shapes(model)), np.zeros(ctx.n))


def frontend_activation_bytes(model, sb_enc) -> Any:
    """16-bit bytes the front-end keeps for backward per micro-batch for ``sb_enc`` encoder
    positions (not split by TP): conv1's output and its GELU on the two frames per position
    (``2 x 2 sb h``) and conv2's output before its GELU (``sb h``), 2 bytes each."""
    if not model.frontend_mels:
        return 0.0 * sb_enc
    return 2.0 * 5.0 * sb_enc * model.hidden
