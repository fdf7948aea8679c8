"""Per-device memory of training layouts, vectorized over a :class:`LayoutTable`.

Model state follows the training stack's :class:`~autopar.frameworks.FrameworkProfile` (bytes per
parameter of weights, main gradients and optimizer state, and the ZeRO stage that shards each;
e.g. Megatron's fp32 main gradients, 6 + 12/d bytes with the distributed optimizer), sharded as in
ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054). Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, Table 2),
generalized to GQA, gated MLPs, MoE, MLA, FlashAttention, sequence and context parallelism and each
recompute mode. The reported device is the most loaded pipeline stage (first or last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar import blocks, hybrid
from autopar import precision as P
from autopar.blocks.context import REC_FULL, REC_NONE, recompute_drops  # noqa: F401  (re-exported)
from autopar.frameworks import MEGATRON, FrameworkProfile
from autopar.layout import PRECISION_CODES, LayoutTable
from autopar.schedules import V_SHAPED, inflight_chunks

GIB = float(1 << 30)
# Per process-group communication buffers (NCCL channels, ~0.35-0.4 GB per group: AIConfigurator,
# REFERENCE Part D), outside the caching allocator. The framework reserve (CUDA context, cuBLAS/TE
# workspaces) and the allocator's fragmentation are the training stack's (autopar.frameworks);
# these two are Megatron's, the defaults of a calibration that does not set them.
COMM_BUFFER_BYTES = 0.4e9
FRAMEWORK_RESERVE_BYTES = MEGATRON.framework_reserve_gib * GIB
FRAGMENTATION = MEGATRON.fragmentation
# Bytes per stored logit: bf16 logits plus the fp32 copy the cross-entropy keeps for backward.
LOGIT_BYTES = 6.0
# Pure fp32 training (no mixed precision; e.g. the CPU reference runs): 4-byte weights and
# gradients, AdamW's two fp32 moments (no separate master copy), 4-byte activations, and fp32
# logits plus the fp32 log-probabilities the cross-entropy keeps.
FP32_WEIGHT_BYTES, FP32_GRAD_BYTES, FP32_OPTIM_BYTES, FP32_LOGIT_BYTES = 4.0, 4.0, 8.0, 8.0

# A non-hybrid layer as a block mix: one attention mixer, a mixer and a feed-forward sublayer.
_LAYER_MIX = hybrid.Mix(attn=1.0, linear=0.0, mamba=0.0, mixer_sub=1.0, ffn_sub=1.0, ffn_to_blocks=1.0)
# Precision codes whose GEMMs run through TE's 8-/4-bit recipes (autopar.precision.LOW_PRECISION).
LOW_PRECISION_CODES = [PRECISION_CODES.index(p) for p in P.LOW_PRECISION]


# What the caching allocator hands out (torch.cuda.max_memory_allocated); ``fragmentation`` is the
# allocator's reserved memory above it; buffers and the reserve sit outside the allocator.
ALLOCATED_COMPONENTS = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "embeddings_logits",
    "zero3_buffers",
)
MEMORY_COMPONENTS = (*ALLOCATED_COMPONENTS, "fragmentation", "comm_buffers", "framework_reserve")


@dataclass(frozen=True)
class StageShape:
    """Dense and MoE layers of the first, a middle and the last pipeline stage (arrays).

    ``mid_*`` is the middle stage that decides time (the one with the most MoE layers: the last
    middle stage; with a stated block order, the middle stage with the most forward FLOPs per token:
    :func:`_heaviest_middle`); ``mem_mid_*`` the one that decides memory (stage 1, the most
    micro-batches in flight). Both are zero-layer rows where there is no middle stage (pp < 3;
    ``has_mid``). ``*_mixers``: a hybrid stack's mixers of each stage in its real order
    (``model.block_pattern``), None where the stage holds the model's mix in proportion.
    """

    first_dense: np.ndarray
    first_moe: np.ndarray
    last_dense: np.ndarray
    last_moe: np.ndarray
    layers_per_stage: np.ndarray
    mid_dense: np.ndarray
    mid_moe: np.ndarray
    mem_mid_dense: np.ndarray
    mem_mid_moe: np.ndarray
    has_mid: np.ndarray
    first_mixers: blocks.StageMixers | None = None
    last_mixers: blocks.StageMixers | None = None
    mid_mixers: blocks.StageMixers | None = None
    mem_mid_mixers: blocks.StageMixers | None = None


def dense_moe(model, start: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dense, MoE) layers among the contiguous layers [start, start + n).

    Hybrid models without a stated block order: the stage's blocks with a dense MLP and with MoE in
    the model's proportions (fractional; :mod:`autopar.hybrid`), the rest are blocks without a
    feed-forward part.
    """
    if model.is_hybrid:
        nf = np.asarray(n, dtype=np.float64)
        return nf * model.dense_layers / model.layers, nf * model.moe_layers / model.layers
    if model.moe_layers == 0:
        return n, n * 0
    if model.first_dense_layers or model.moe_layers == model.layers:
        dense = np.clip(model.layers - model.moe_layers - start, 0, n)
        return dense, n - dense
    # interleaved MoE layers (e.g. every other layer): spread evenly
    moe = np.rint(n * model.moe_layers / model.layers).astype(np.int64)
    return n - moe, moe


def stage_shape(model, lay: LayoutTable, seq_len: float | None = None) -> StageShape:
    """Layers of the first, middle and last stage (:meth:`ParallelDims.stage_layers`), dense and MoE;
    with a stated block order each stage's own blocks (``seq_len``: the sequence at which the
    heaviest middle stage is chosen, 4,096 when not given)."""
    first, mid, last = lay.dims.stage_layers(model)
    pp = np.asarray(lay["pp"], dtype=np.int64)
    has_mid = pp >= 3
    mid = np.where(has_mid, mid, 0)
    lps = np.maximum(np.maximum(first, last), mid)
    if model.block_pattern:
        return _ordered_stage_shape(model, first, mid, last, pp, has_mid, lps, seq_len or 4096.0)
    fd, fm = dense_moe(model, first * 0, first)
    ld, lm = dense_moe(model, model.layers - last, last)
    md, mm = dense_moe(model, model.layers - last - mid, mid)  # the last middle stage
    qd, qm = dense_moe(model, first, mid)  # stage 1
    return StageShape(fd, fm, ld, lm, lps, md, mm, qd, qm, has_mid)


def _ordered_stage_shape(model, first, mid, last, pp, has_mid, lps, seq_len: float) -> StageShape:
    """:func:`stage_shape` of a model with a stated block order: every stage its own window."""
    L = model.layers
    fd, fm, fx = blocks.stage.window(model, first * 0, first)
    ld, lm, lx = blocks.stage.window(model, L - last, last)
    qd, qm, qx = blocks.stage.window(model, first, mid)  # stage 1
    start = _heaviest_middle(model, first, mid, last, pp, seq_len)
    md, mm, mx = blocks.stage.window(model, start, np.minimum(mid, np.maximum(L - last - start, 0)))
    return StageShape(fd, fm, ld, lm, lps, md, mm, qd, qm, has_mid, fx, lx, mx, qx)


def _block_flops(model, seq_len: float) -> dict[str, float]:
    """Forward FLOPs per token of one block part of each kind (the heaviest-stage proxy)."""
    out = {
        "attention": float(blocks.mixer(model).flops_per_token(model, seq_len)) if model.attn_layers else 0.0,
        "dense": float(blocks.mlp.flops_per_token(model)) if model.ffn_hidden else 0.0,
        "moe": float(blocks.moe_ffn.flops_per_token(model)) if model.is_moe else 0.0,
    }
    out["linear"] = float(blocks.gated_deltanet.flops_per_token(model)) if model.linear_attn_layers else 0.0
    out["mamba"] = float(blocks.mamba.flops_per_token(model)) if model.mamba_layers else 0.0
    return out


def _heaviest_middle(model, first, mid, last, pp, seq_len: float) -> np.ndarray:
    """First block of the middle stage (1 .. pp-2) with the most forward FLOPs per token, per row
    (stage k starts at ``first + (k - 1) * mid``); ``first`` where there is no middle stage."""
    if int(pp.max(initial=0)) < 3:  # no middle stage in any row
        return first
    c = blocks.stage.prefix_counts(model.block_pattern)
    w = _block_flops(model, seq_len)
    L = model.layers
    k = np.arange(1, int(pp.max()) - 1)  # middle stage indices
    starts = np.clip(first[:, None] + (k[None, :] - 1) * mid[:, None], 0, L)
    ends = np.clip(np.minimum(starts + mid[:, None], L - last[:, None]), starts, L)
    flops = sum(wk * (c[part][ends] - c[part][starts]) for part, wk in w.items())
    flops = np.where(k[None, :] <= pp[:, None] - 2, flops, -np.inf)
    best = np.take_along_axis(starts, np.argmax(flops, axis=1)[:, None], axis=1)[:, 0]
    return np.where(pp >= 3, best, first)


def layer_params_per_rank(model, lay: LayoutTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense layer, MoE layer non-expert part, MoE layer routed-expert part) parameters per rank.

    Hybrid models: per block with a dense MLP / with MoE, carrying the mixer and norm parameters
    of the mixer-only blocks that come with it in the model's mix (:func:`autopar.hybrid.blocks`),
    so ``n_dense * dense + n_moe * moe`` is the stage's whole.
    """
    tp = lay["tp"].astype(np.float64)
    if model.is_encoder_decoder:
        return _encdec_layer_params(model, lay, tp)
    # The mixers' parameters (split over tp) with the block's norms; a hybrid model's blocks carry
    # their mix's mixers.
    if model.is_hybrid:
        mx = hybrid.mix(model)
        mixers = mx.attn * blocks.mixer(model).params(model)
        for w, kind in hybrid.recurrent_kinds(model):
            mixers = mixers + w * kind.params(model)
        attn = mx.ffn_to_blocks * (mixers / tp + model.norm_params_per_layer)
    else:
        attn = blocks.mixer(model).params(model) / tp + model.norm_params_per_layer
    dense = attn + blocks.mlp.params(model) / tp
    if model.is_moe:
        # shared experts split over tp; the router and a latent MoE's projections are replicated
        nonexp = model.shared_expert_params / tp + model.router_params + model.latent_proj_params
        experts = blocks.moe_ffn.params(model)[1] / (lay["ep"] * lay["etp"])
    else:
        nonexp, experts = 0.0, 0.0 * tp
    return dense, attn + nonexp, np.broadcast_to(experts, tp.shape).astype(np.float64)


def _encdec_layer_params(model, lay: LayoutTable, tp) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An encoder-decoder model's parameters per decoder block per rank: the decoder block with its
    cross-attention (projections split over tp, norms not) and its share of the encoder stack."""
    enc = model.encoder_view()
    dec_p = layer_params_per_rank(model.decoder_view(), lay)[0]
    enc_p = layer_params_per_rank(enc, lay)[0]
    cross = model.attn_params_per_layer / tp + model._norm(model.hidden)
    per = dec_p + cross + enc_p * enc.layers / model.layers
    return per, per, 0.0 * tp


def head_stage(lay: LayoutTable, schedule: str = "1f1b") -> np.ndarray:
    """The pipeline rank that holds the LM head: the last, or rank 0 under a V-shaped schedule."""
    return lay["pp"] * 0 if schedule in V_SHAPED else lay["pp"] - 1


def stage_params_at(
    model,
    lay: LayoutTable,
    stage: np.ndarray,
    n_dense: np.ndarray,
    n_moe: np.ndarray,
    schedule: str = "1f1b",
    mixers: blocks.StageMixers | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(non-expert, routed-expert) parameters per rank of pipeline stage ``stage`` (one row per stage).

    The stage holds ``n_dense`` dense and ``n_moe`` MoE layers; stage 0 adds the input embedding,
    stage pp-1 the final norm and the LM head (its own copy of a tied matrix when pp > 1; rank 0
    under a V-shaped ``schedule``); with pp = 1 both are the same stage and hold both. The
    model's ``extra_params`` (learned position tables, pooler, MLM transform, conv front-end:
    under 2 % of the encoders read) sit on stage 0, not split by tp. ``mixers``: a hybrid stage's
    own mixers (:func:`autopar.blocks.stage.window`) instead of the model's mix.
    """
    dense_p, moe_p, expert_p = layer_params_per_rank(model, lay)
    tp = lay["tp"].astype(np.float64)
    pp = lay["pp"]
    embed = model.embedding_params / tp
    head = (model.head_params / tp) + model.final_norm_params
    if model.tie_embeddings:
        head = head + np.where(pp > 1, embed, 0.0)
    if mixers is None:
        layers = n_dense * dense_p + n_moe * moe_p
    else:  # the stage's own mixers with their blocks' norms, then its feed-forward parts
        mix_p = mixers.attention * blocks.mixer(model).params(model)
        for count, kind in mixers.recurrent:
            mix_p = mix_p + count * kind.params(model)
        attn = mix_p / tp + mixers.blocks * model.norm_params_per_layer
        mlp_p = blocks.mlp.params(model) / tp
        moe_own = moe_p - (dense_p - mlp_p)  # a MoE layer's own non-expert part (router, shared experts)
        layers = attn + n_dense * mlp_p + n_moe * moe_own
    nonexp = (
        layers
        + np.where(stage == 0, embed, 0.0)
        + np.where(stage == head_stage(lay, schedule), head, 0.0)
        + np.where(stage == 0, float(model.extra_params), 0.0)
    )
    return nonexp, n_moe * expert_p


def stage_params(model, lay: LayoutTable, schedule: str = "1f1b") -> dict[str, np.ndarray]:
    """Parameters per rank on the first, a middle (the most loaded) and the last pipeline stage,
    non-expert and routed-expert (the middle ones are 0 where pp < 3)."""
    st = stage_shape(model, lay)
    at = {"schedule": schedule}
    first_nonexp, first_exp = stage_params_at(
        model, lay, lay["pp"] * 0, st.first_dense, st.first_moe, mixers=st.first_mixers, **at
    )
    last_nonexp, last_exp = stage_params_at(
        model, lay, lay["pp"] - 1, st.last_dense, st.last_moe, mixers=st.last_mixers, **at
    )
    mid_nonexp, mid_exp = stage_params_at(
        model, lay, lay["pp"] * 0 + 1, st.mid_dense, st.mid_moe, mixers=st.mid_mixers, **at
    )
    return {
        "first_nonexp": first_nonexp,
        "last_nonexp": last_nonexp,
        "mid_nonexp": np.where(st.has_mid, mid_nonexp, 0.0),
        "first_exp": first_exp,
        "last_exp": last_exp,
        "mid_exp": np.where(st.has_mid, mid_exp, 0.0),
    }


def activation_bytes_per_layer(
    model,
    *,
    seq_len: float | np.ndarray,
    micro_batch: np.ndarray,
    tp: np.ndarray,
    cp: np.ndarray,
    sp: np.ndarray,
    recompute: np.ndarray,
    moe: bool,
    flash_attention: bool = True,
    dropout: bool = False,
    ep: np.ndarray | None = None,
    etp: np.ndarray | None = None,
    low_precision: np.ndarray | None = None,
) -> np.ndarray:
    """Activation bytes one transformer layer keeps for backward, per rank, for one micro-batch.

    Korthikanti et al. 2022, Table 2, term by term (16-bit activations, s = local sequence s/cp):
    replicated across TP unless SP: two norm inputs 4sbh, QKV-GEMM input 2sbh, MLP input 2sbh,
    dropout masks 2sbh (when dropout is used); sharded by TP: Q, K, V (2sb per element of
    a*dq + 2*g*dk), attention output 2sb*a*dv, the MLP's intermediate tensors (GELU: 4sbF;
    gated: 6sbF), and without FlashAttention the 5*a*s^2*b softmax/dropout term.
    With F = 4h, MHA, dropout and no flash this is exactly s*b*h*(10 + 24/t + 5as/(ht)).

    ``low_precision`` rows (fp8/mxfp8/nvfp4 GEMMs through Transformer Engine) keep the inputs of
    their linear GEMMs in the quantized 8-bit form the weight-gradient GEMM reads (TE's Linear,
    LayerNormLinear and GroupedLinear save the cast input, not the 16-bit one; DeepSeek-V3 report
    Sec. 3.3.3 caches them in FP8 likewise): QKV/MLP/expert inputs and the fc2 input at 1 byte. The
    attention output stays 16-bit for the attention backward, plus the output projection's 8-bit
    copy. Norm inputs (the residual stream) and the fc1 outputs the activation's backward reads stay
    16-bit. The recompute modes drop (Megatron-Core ``recompute_modules``): ``selective`` the
    attention core; ``norm_act`` also the two norm outputs (the QKV and MLP inputs), MLA's
    up-projected Q/K/V (the compressed latents stay) and the routed experts' activation output;
    ``norm_act_mlp`` also the dense MLP's and the shared experts' intermediates; ``full`` keeps the
    layer input only.

    ``model.is_hybrid``: bytes per block with a feed-forward part of the given kind, carrying its
    share of the mix's mixers and mixer-only blocks (:mod:`autopar.hybrid`): a sublayer keeps its
    norm input and the norm output its GEMMs read; attention blocks their Q, K, V, output and core
    terms; Mamba / Gated DeltaNet mixers what their kernels save
    (:func:`autopar.hybrid.mixer_activation_elems`; selective modes recompute no scan); full
    recompute keeps each block's input.
    """
    p = _activation_parts(
        model,
        seq_len=seq_len,
        micro_batch=micro_batch,
        tp=tp,
        cp=cp,
        sp=sp,
        recompute=recompute,
        moe=moe,
        flash_attention=flash_attention,
        dropout=dropout,
        ep=ep,
        etp=etp,
        low_precision=low_precision,
    )
    rec = np.asarray(recompute)
    mx = hybrid.mix(model) if model.is_hybrid else _LAYER_MIX
    recurrent = sum(
        (w * elems for w, (_, elems) in zip(_mix_weights(model), p["recurrent"], strict=True)), 0.0
    )
    mixer_block = mx.mixer_sub * p["mixer_sub"] + mx.attn * p["attention"] + recurrent
    full = mx.ffn_to_blocks * mixer_block + p["ffn"]
    checkpoint_only = mx.ffn_to_blocks * p["checkpoint"]  # full recompute keeps the block input only
    return np.where(rec == REC_FULL, checkpoint_only, full)


def _mix_weights(model) -> list[float]:
    """Share of the blocks of each recurrent mixer kind (:func:`autopar.hybrid.recurrent_kinds`)."""
    return [w for w, _ in hybrid.recurrent_kinds(model)]


def _activation_parts(
    model,
    *,
    seq_len,
    micro_batch,
    tp,
    cp,
    sp,
    recompute,
    moe: bool,
    flash_attention: bool = True,
    dropout: bool = False,
    ep=None,
    etp=None,
    low_precision=None,
) -> dict[str, Any]:
    """Activation elements one micro-batch keeps, per part of a block (:func:`activation_bytes_per_layer`):
    ``mixer_sub`` per mixer sublayer (norm input and output), ``attention`` per attention mixer,
    ``recurrent`` (kind, elements) per recurrent mixer, ``ffn`` per feed-forward sublayer (MoE where
    ``moe``), ``checkpoint`` per block under full recompute."""
    s = np.asarray(seq_len, dtype=np.float64) / cp
    t = tp.astype(np.float64)
    sb = s * micro_batch.astype(np.float64)
    h = float(model.hidden)
    sp_div = np.where(sp > 0, t, 1.0)
    # Bytes per element of a saved GEMM input, relative to 16-bit (1 byte = 0.5).
    gi = np.where(low_precision, 0.5, 1.0) if low_precision is not None else np.ones_like(t)
    drop_core, drop_norm, drop_mlp = recompute_drops(np.asarray(recompute))
    # A block as the sum of its sublayers (a non-hybrid layer: one attention and one feed-forward
    # sublayer). A sublayer keeps its norm input (and dropout mask) and the norm output its GEMMs read
    # (MoE layers: the pre-MLP norm output also feeds the 16-bit router GEMM).
    norm_one = sb * h * (2.0 + (1.0 if dropout else 0.0)) / sp_div
    mixer_in = 2.0 * sb * h / sp_div * gi
    ffn_in = 2.0 * sb * h / sp_div * (1.0 if moe else gi)
    # Attention (or MLA) mixers: Q, K, V, the output and what the core keeps.
    qkv, attn_out = blocks.mixer(model).activation_elems(model, sb, t, gi, drop_norm, sp_div)
    if model.is_hybrid and model.attn_output_gate:  # the gate (kept as main costs it: hybrid only)
        attn_out = attn_out + blocks.attention.output_gate_elems(model, sb, t)
    core = blocks.attention.core_activation_elems(model, s, sb, t, flash_attention)
    # Recurrent mixers: what their kernels save (selective modes recompute no scan).
    recurrent = [
        (kind, 2.0 * sb * kind.activation_elems(model, t, gi)) for _, kind in hybrid.recurrent_kinds(model)
    ]
    # The feed-forward sublayer: a dense MLP, or the routed experts (balanced: T/sp * k * etp rows per
    # rank after the ETP all-gather) with the shared experts.
    if moe:
        e_tp = t if etp is None else np.asarray(etp, dtype=np.float64)
        routed = blocks.moe_ffn.routed_activation_elems(model, sb, sp_div, e_tp, gi, drop_norm)
        shared = np.where(
            drop_mlp, 0.0, blocks.mlp.activation_elems(model, model.shared_expert_ffn, sb, t, gi)
        )
        mlp = routed + shared
    else:
        mlp = np.where(drop_mlp, 0.0, blocks.mlp.activation_elems(model, model.ffn_hidden, sb, t, gi))
    return {
        "mixer_sub": norm_one + np.where(drop_norm, 0.0, mixer_in),
        "attention": qkv + attn_out + np.where(drop_core, 0.0, core),
        "recurrent": recurrent,
        "ffn": norm_one + np.where(drop_norm, 0.0, ffn_in) + mlp,
        "checkpoint": 2.0 * sb * h / sp_div,
    }


def stage_activation_bytes(model, mixers: blocks.StageMixers, n_dense, n_moe, **kw) -> np.ndarray:
    """Activation elements one micro-batch keeps on a hybrid stage with its own ``mixers``
    (:func:`autopar.blocks.stage.window`), ``n_dense`` dense and ``n_moe`` MoE feed-forward parts;
    the keyword arguments of :func:`activation_bytes_per_layer`."""
    parts = {m: _activation_parts(model, moe=m, **kw) for m in ((False, True) if model.is_moe else (False,))}
    p = parts[False]
    rec = np.asarray(kw["recompute"])
    mixer_total = mixers.mixer_sub * p["mixer_sub"] + mixers.attention * p["attention"]
    for (count, _), (_, elems) in zip(mixers.recurrent, p["recurrent"], strict=True):
        mixer_total = mixer_total + count * elems  # both in blocks.stage.RECURRENT's order
    ffn = n_dense * p["ffn"] + (n_moe * parts[True]["ffn"] if model.is_moe else 0.0)
    return np.where(rec == REC_FULL, mixers.blocks * p["checkpoint"], mixer_total + ffn)


def _encdec_activation_bytes(model, *, seq_len, **common) -> np.ndarray:
    """Activation bytes per decoder block of an encoder-decoder model, per rank and micro-batch: the
    decoder block on ``seq_len`` tokens, its share of the encoder stack's layers on the encoder
    positions, and its cross-attention (:func:`autopar.blocks.cross_attention.activation_elems`:
    Q and output over the decoder tokens, K and V over the encoder positions; the sublayer's norm
    input and output), plus this block's share of the encoder output every cross-attention reads.
    Full recompute keeps each block's input (the encoder output stays: the decoder's checkpoints
    read it)."""
    enc, dec = model.encoder_view(), model.decoder_view()
    s_enc = model.encoder_tokens(seq_len)
    per_dec = activation_bytes_per_layer(dec, moe=False, seq_len=seq_len, **common)
    per_enc = activation_bytes_per_layer(enc, moe=False, seq_len=s_enc, **common)
    cp = np.asarray(common["cp"], dtype=np.float64)
    t = np.asarray(common["tp"], dtype=np.float64)
    b = np.asarray(common["micro_batch"], dtype=np.float64)
    sb_dec, sb_enc = seq_len / cp * b, s_enc / cp * b
    sp_div = np.where(np.asarray(common["sp"]) > 0, t, 1.0)
    lp = common.get("low_precision")
    gi = np.where(lp, 0.5, 1.0) if lp is not None else np.ones_like(t)
    h = float(model.hidden)
    rec = np.asarray(common["recompute"])
    _, drop_norm, _ = recompute_drops(rec)
    # the sublayer's norm input (kept) and output (the Q GEMM's input: dropped by norm_act)
    norm = 2.0 * sb_dec * h / sp_div * np.where(drop_norm, 1.0, 2.0)
    cross = blocks.cross_attention.activation_elems(model, sb_dec, sb_enc, t, gi) + norm
    cross = np.where(rec == REC_FULL, 0.0, cross)
    # the encoder output every cross-attention reads, and the conv front-end's (Whisper) activations
    shared = 2.0 * sb_enc * h + blocks.encoder.frontend_activation_bytes(model, sb_enc)
    return per_dec + per_enc * enc.layers / model.layers + cross + shared / model.layers


def _inflight(lay: LayoutTable, stage: np.ndarray, m_: np.ndarray, schedule: str = "1f1b") -> np.ndarray:
    p = lay["pp"].astype(np.float64)
    v = lay["vpp"].astype(np.float64)
    m = np.asarray(m_, dtype=np.float64)
    i = np.asarray(stage, dtype=np.float64)
    if schedule != "1f1b":  # zero-bubble / DualPipeV: torch's schedules (autopar.schedules)
        return np.where(p > 1, inflight_chunks(schedule, p, v, m) / v, np.minimum(1.0, m))
    one_f_one_b = np.minimum(p - i, m)
    # Interleaved 1F1B (Megatron-Core pipeline_parallel/schedules.py, get_pp_rank_microbatches,
    # mcore 0.16, microbatch_group_size_per_vp_stage = p): rank i runs 2(p-i-1) + (v-1)p warm-up
    # forwards of 1/v-size model chunks, then one more forward before each backward, so it holds
    # p*v + p - 2i - 1 chunks (capped at all m*v chunks of the step). In stage units that is
    # p + (p - 2i - 1)/v: stage 0 holds p + (p-1)/v = p(1 + (p-1)/(p*v)) (Narayanan et al. 2021,
    # Sec. 2.2.2), and the last stage p - (p-1)/v, not 1: its chunk-0 forwards all run before the
    # first backward (which starts from the last chunk).
    interleaved = np.minimum(p * v + p - 2.0 * i - 1.0, m * v) / v
    return np.where(v > 1, interleaved, one_f_one_b)


def stage_inflight(lay: LayoutTable, stage: np.ndarray, schedule: str = "1f1b") -> np.ndarray:
    """Micro-batches (in whole-stage units) whose activations stage ``stage`` holds at its peak.

    1F1B: stage i has min(p - i, m) forwards in flight before its first backward (Narayanan et al.
    2021, PipeDream-Flush); interleaved 1F1B: min(p*v + p - 2i - 1, m*v) chunks of 1/v of the
    stage (Megatron-Core's warm-up count plus the steady state's extra forward).
    """
    return _inflight(lay, stage, lay["grad_accum"], schedule)


def _stage_activations(
    model, lay: LayoutTable, seq_len, n_dense, n_moe, mixers, flash_attention: bool, dropout: bool, act_scale
) -> tuple[np.ndarray, np.ndarray]:
    """(activation bytes one micro-batch keeps on the stage, one layer's full set: what full recompute
    re-materializes at a time) of :func:`stage_memory`."""
    common: dict[str, Any] = dict(
        seq_len=seq_len,
        micro_batch=lay["micro_batch"],
        tp=lay["tp"],
        cp=lay["cp"],
        sp=lay["sp"],
        recompute=lay["recompute"],
        flash_attention=flash_attention,
        dropout=dropout,
        etp=lay["etp"],
        low_precision=np.isin(lay["precision"], LOW_PRECISION_CODES),
    )
    no_recompute = {**common, "recompute": lay["recompute"] * 0}
    if model.is_encoder_decoder:
        full_layer = _encdec_activation_bytes(model, **no_recompute) * act_scale
        per_mb = n_dense * _encdec_activation_bytes(model, **common)
    else:
        full_layer = activation_bytes_per_layer(model, moe=model.is_moe, **no_recompute) * act_scale
        if mixers is not None:  # a hybrid stage's own blocks (its window of the stack)
            return stage_activation_bytes(model, mixers, n_dense, n_moe, **common) * act_scale, full_layer
        per_mb = n_dense * activation_bytes_per_layer(model, moe=False, **common)
    if model.is_moe:
        per_mb = per_mb + n_moe * activation_bytes_per_layer(model, moe=True, **common)
    return per_mb * act_scale, full_layer


def stage_memory(
    model,
    lay: LayoutTable,
    *,
    seq_len: int,
    stage: np.ndarray,
    n_dense: np.ndarray,
    n_moe: np.ndarray,
    dropout: bool = False,
    framework_reserve_bytes: float = FRAMEWORK_RESERVE_BYTES,
    comm_buffer_bytes: float = COMM_BUFFER_BYTES,
    fragmentation: float = FRAGMENTATION,
    frozen_weights: bool = False,
    profile: FrameworkProfile = MEGATRON,
    schedule: str = "1f1b",
    mixers: blocks.StageMixers | None = None,
) -> dict[str, np.ndarray]:
    """Bytes per device of one pipeline stage per row, by component (sums to ``total``).

    Each row of ``lay`` is one stage of a layout: stage index ``stage``, ``n_dense`` dense and
    ``n_moe`` MoE layers, and the row's own recompute mode. Stage 0 adds the embedding output of its
    in-flight micro-batches, the last stage the logits. :func:`memory_breakdown` is this function on
    the first and the last stage of a uniform pipeline; ``autopar.search.uneven`` calls it on every
    stage of an uneven one. The reserve, buffer and fragmentation defaults are CUDA/NCCL figures; a
    calibration for another runtime (e.g. CPU/gloo validation runs) overrides them. ``profile``
    gives the bytes per parameter of mixed-precision training and the ZeRO stage that shards each
    part (pure fp32 rows keep FP32_*) and its attention kernel (an unfused core keeps Korthikanti's
    5as^2b score tensors: :func:`activation_bytes_per_layer`). Also returns ``allocated`` (the caching allocator's peak:
    the :data:`ALLOCATED_COMPONENTS`) and ``reserved`` (allocated + fragmentation). ``mixers``: a
    hybrid stage's own mixers (:func:`autopar.blocks.stage.window`) instead of the model's mix.
    """
    dense_p, moe_p, expert_p = layer_params_per_rank(model, lay)
    tp = lay["tp"].astype(np.float64)
    first, last = stage == 0, stage == head_stage(lay, schedule)
    nonexp, exp = stage_params_at(model, lay, stage, n_dense, n_moe, schedule, mixers=mixers)

    dims = lay.dims
    shard = dims.shard_size.astype(np.float64)
    # Expert parameters are replicated over expert-data-parallel ranks only.
    eshard = dims.expert_shard
    zero = lay["zero"]
    offload = lay["offload"] > 0
    fp32 = lay["precision"] == PRECISION_CODES.index("fp32")
    w_bytes = np.where(fp32, FP32_WEIGHT_BYTES, profile.weight_bytes)
    g_bytes = np.where(fp32, FP32_GRAD_BYTES, profile.grad_bytes)
    o_bytes = np.where(fp32, FP32_OPTIM_BYTES, profile.optimizer_bytes)
    act_scale = np.where(fp32, 2.0, 1.0)  # activation_bytes_per_layer counts 16-bit elements

    def sharded(from_stage: int) -> np.ndarray:
        """Parameters per rank of a state sharded from ZeRO stage ``from_stage`` on."""
        on = zero >= from_stage
        return np.where(on, nonexp / shard, nonexp) + np.where(on, exp / eshard, exp)

    # TE's low-precision weight copy (mxfp8/nvfp4, autopar.precision.WEIGHT_COPY_BYTES) lives as
    # long as the weights it is made from: sharded where they are (ZeRO-3 gathers per layer).
    copy_bytes = np.zeros(len(lay))
    for name, b in P.WEIGHT_COPY_BYTES.items():
        copy_bytes[lay["precision"] == PRECISION_CODES.index(name)] = b
    w = (w_bytes + copy_bytes) * sharded(profile.weight_shard_stage)
    g = g_bytes * sharded(profile.grad_shard_stage)
    o = o_bytes * sharded(profile.optimizer_shard_stage)
    o = np.where(offload, 0.0, o)
    if frozen_weights:  # LoRA-style: no gradients or optimizer state for the frozen base weights
        g, o = g * 0.0, o * 0.0

    per_mb, full_layer = _stage_activations(
        model, lay, seq_len, n_dense, n_moe, mixers, profile.flash_attention, dropout, act_scale
    )
    inflight = stage_inflight(lay, stage, schedule)
    # Full recompute re-materializes one layer at a time during backward: add one layer's full set.
    working = np.where(lay["recompute"] == REC_FULL, full_layer, 0.0)
    act = per_mb * inflight + working

    s_local = seq_len / lay["cp"]
    sb = s_local * lay["micro_batch"]
    sp_div = dims.sp_divisor.astype(np.float64)
    embed_out = act_scale * blocks.embedding.embed_output_elems(model, sb, sp_div) * inflight
    if model.is_encoder_decoder:  # the encoder's input embedding too
        sb_enc = model.encoder_tokens(seq_len) / lay["cp"] * lay["micro_batch"]
        embed_out = (
            embed_out + act_scale * blocks.embedding.embed_output_elems(model, sb_enc, sp_div) * inflight
        )
    logits = np.where(fp32, FP32_LOGIT_BYTES, LOGIT_BYTES) * blocks.embedding.logits_elems(model, sb, tp)
    logits = logits if model.lm_head else 0.0 * logits
    emb = np.where(first, embed_out, 0.0) + np.where(last, logits, 0.0)

    max_layer = np.maximum(dense_p, moe_p + expert_p * (1 if model.is_moe else 0))
    # ZeRO-3/FSDP gathers each layer (current + prefetched) in the 16-bit compute dtype and
    # reduce-scatters its unsharded 16-bit gradient (2 bytes each; 4 in pure fp32).
    unit = np.where(fp32, 4.0, 2.0)
    z3 = np.where(zero >= 3, 2.0 * max_layer * unit + max_layer * unit * 2, 0.0)
    if profile.weight_shard_stage == 2:
        # FSDP's ZeRO-2 (reshard_after_forward=False): the 16-bit parameters gathered in the
        # forward stay unsharded until their backward, so at the peak (the last forward, the first
        # backward) every layer of the stage is unsharded beside its sharded fp32 copy.
        z3 = z3 + np.where(zero == 2, unit * (nonexp + exp), 0.0)
    if profile.fsdp_pp_defer:
        # Under pipeline parallelism torch.distributed.pipelining turns FSDP's gradient sync off until
        # the step's last backward (latency.data_parallel_tail): the stage accumulates its unsharded
        # gradients (the reduce dtype's bytes, fp32 in torchtitan) for the whole step.
        grad_unit = np.where(fp32 | profile.grad_reduce_fp32, 4.0, unit)
        z3 = z3 + np.where((zero >= 3) & (lay["pp"] > 1), grad_unit * (nonexp + exp), 0.0)

    groups = dims.process_groups.astype(np.float64)
    out: dict[str, Any] = {
        "weights": w,
        "gradients": g,
        "optimizer": o,
        "activations": act,
        "embeddings_logits": emb,
        "zero3_buffers": z3,
        # The caching allocator's reserved segments above allocated: activations are freed and
        # re-allocated in varying sizes every micro-batch; model state sits in buffers allocated once.
        "fragmentation": act * fragmentation,
        "comm_buffers": comm_buffer_bytes * groups,
        "framework_reserve": np.full(len(lay), float(framework_reserve_bytes)),
    }
    out["total"] = sum(out[k] for k in MEMORY_COMPONENTS)
    out["allocated"] = sum(out[k] for k in ALLOCATED_COMPONENTS)
    out["reserved"] = out["allocated"] + out["fragmentation"]
    # What differs between stages (the buffers and the reserve do not): decides the loaded stage.
    out["stage_bytes"] = out["reserved"]
    out["state"] = w + g + o
    return out


def memory_breakdown(
    model,
    lay: LayoutTable,
    *,
    seq_len: int,
    dropout: bool = False,
    framework_reserve_bytes: float = FRAMEWORK_RESERVE_BYTES,
    comm_buffer_bytes: float = COMM_BUFFER_BYTES,
    fragmentation: float = FRAGMENTATION,
    frozen_weights: bool = False,
    profile: FrameworkProfile = MEGATRON,
    schedule: str = "1f1b",
) -> dict[str, np.ndarray]:
    """Bytes per device for the most loaded pipeline stage, by component.

    :func:`stage_memory` on the first stage, on stage 1 (the middle stage with the most
    micro-batches in flight, where pp >= 3) and on the last stage of the split of
    :func:`stage_shape`; the heaviest is reported (``stage``).
    """
    st = stage_shape(model, lay, seq_len)
    kw: dict[str, Any] = dict(
        seq_len=seq_len,
        dropout=dropout,
        framework_reserve_bytes=framework_reserve_bytes,
        comm_buffer_bytes=comm_buffer_bytes,
        fragmentation=fragmentation,
        frozen_weights=frozen_weights,
        profile=profile,
        schedule=schedule,
    )
    first = stage_memory(
        model,
        lay,
        stage=lay["pp"] * 0,
        n_dense=st.first_dense,
        n_moe=st.first_moe,
        mixers=st.first_mixers,
        **kw,
    )
    last = stage_memory(
        model, lay, stage=lay["pp"] - 1, n_dense=st.last_dense, n_moe=st.last_moe, mixers=st.last_mixers, **kw
    )
    mid = stage_memory(
        model,
        lay,
        stage=lay["pp"] * 0 + 1,
        n_dense=st.mem_mid_dense,
        n_moe=st.mem_mid_moe,
        mixers=st.mem_mid_mixers,
        **kw,
    )
    mid_bytes = np.where(st.has_mid, mid["stage_bytes"], -np.inf)
    use_first = first["stage_bytes"] >= np.maximum(last["stage_bytes"], mid_bytes)
    use_mid = ~use_first & (mid_bytes > last["stage_bytes"])
    out = {k: np.where(use_first, first[k], np.where(use_mid, mid[k], last[k])) for k in MEMORY_COMPONENTS}
    out["total"] = sum((out[k] for k in MEMORY_COMPONENTS), np.zeros(len(lay)))
    out["allocated"] = sum((out[k] for k in ALLOCATED_COMPONENTS), np.zeros(len(lay)))
    out["reserved"] = out["allocated"] + out["fragmentation"]
    out["stage"] = np.where(use_first, 0, np.where(use_mid, 1, lay["pp"] - 1))
    # Model state (weights + gradients + optimizer) of each end stage, for invariants and reports.
    out["state_first"] = first["state"]
    out["state_last"] = last["state"]
    return out
