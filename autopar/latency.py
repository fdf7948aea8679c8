"""Step time of training layouts, vectorized over a :class:`LayoutTable`.

step = m slots of the slowest stage + the other stages' slots / v as fill and drain
     (:func:`pipeline_schedule`; uniform stages: Narayanan et al. 2021's bubble (p-1)/(v·m))
     + exposed PP send/recv + exposed data-parallel/ZeRO communication + optimizer step.
One micro-batch on one stage = GEMMs (roofline with shape-dependent efficiency), attention
(FlashAttention-class kernels at a calibrated fraction of peak, or the unfused s x s softmax core
of the stack's profile), memory-bound elementwise work, recomputation, and the exposed part of
TP/SP, CP and EP communication, never less than the host's kernel launches (the stack's host
floor). Communication that overlaps compute still slows it by ``overlap_contention`` of its
duration (collective kernels share SMs and HBM). Every term is a numpy array over layouts;
breakdowns sum to ``step_time``. Each layer kind's formulas live in its block module
(:mod:`autopar.blocks`); :func:`stage_slot` sums them over the stage's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autopar import blocks, hybrid, moe
from autopar import collectives as C
from autopar.blocks.attention import FLASH_BWD_MULT, attn_fwd  # noqa: F401  (re-exported)
from autopar.blocks.context import (  # noqa: F401  (re-exported)
    ACT_BYTES,
    FP32_BYTES,
    MAMF_REFERENCE_DIM,
    NONCAUSAL_ATTENTION_SPEEDUP,
    SlotContext,
    gemm_time,
    slot_context,
)
from autopar.blocks.moe_ffn import MOE_LAUNCHES_PER_EXPERT  # noqa: F401  (re-exported)
from autopar.frameworks import MEGATRON, FrameworkProfile
from autopar.layout import PRECISION_CODES, LayoutTable
from autopar.memory import stage_shape
from autopar.schedules import V_SHAPED, bubble_terms

TIME_COMPONENTS = (
    "gemm",
    "attention",
    "elementwise",
    "recompute",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_comm",
    "dp_comm",
    "pipeline_bubble",
    "optimizer",
)
# The collectives whose seconds per step are reported in full and exposed (``comm_total_<k>``,
# ``comm_exposed_<k>``): tensor, context, expert, pipeline and data parallel.
COMM_KINDS = ("tp", "cp", "ep", "pp", "dp")
# The components of one micro-batch on one stage (``stage_slot``); the step holds m of them.
SLOT_PARTS = ("gemm", "attention", "elementwise", "recompute", "tp_comm", "cp_comm", "ep_comm")


@dataclass(frozen=True)
class Coefficients:
    """The fitted coefficients of one device type; each has a physical meaning (docs/calibration.md)."""

    peak_flops: dict[str, float]  # FLOP/s dense per precision
    gemm_eff: dict[str, float]  # achieved fraction of peak for large GEMMs
    gemm_half_dim: float  # GEMM dimension at which efficiency halves (tile/wave effects)
    attention_eff: float  # FlashAttention-2-class achieved fraction of bf16 peak
    hbm_bw: float  # achieved HBM bytes/s for memory-bound kernels
    overlap_contention: float  # compute slowdown per second of overlapped communication
    tp_overlap: float  # fraction of TP/SP communication hidden behind GEMMs (comm overlap)
    kernel_overhead_s: float  # fixed per-layer per-micro-batch launch/sync cost (fwd+bwd)
    host_bw: float = 50e9  # host memory bandwidth share for an offloaded optimizer step
    pcie_bw: float = 25e9  # host<->device bytes/s for optimizer offload
    # Fixed software cost of each TP/SP collective on top of the link alpha (framework dispatch and
    # launch): ~0 for Megatron/NCCL, large for DTensor on gloo (measured by autopar calibrate).
    tp_collective_overhead_s: float = 0.0
    # cuDNN fused attention over FlashAttention-2 on this device (``Efficiency.fused_attention_speedup``):
    # what a stack whose attention kernel is Transformer Engine's (profile.attention "te") gains.
    fused_attention_speedup: float = 1.0
    # Half-dimension of precisions whose kernels need larger shapes than bf16 (measured per device:
    # studies/gemm_rates.py); absent: gemm_half_dim.
    gemm_half_dim_by: dict[str, float] = field(default_factory=dict)
    # Exponentials per second of the special-function units (autopar.hardware.sfu_exp_rate): the
    # softmax's exp, which the tensor cores cannot run. 0: not charged (a what-if without it).
    exp_rate: float = 0.0
    # Share of the MoE layers' per-expert kernel launches the device waits for (fitted; 0: not charged).
    moe_host_factor: float = 0.0
    # Measured causal forward attention per head dimension (Efficiency.attention_fwd: fused FMHA,
    # exponentials included); empty: attention_eff and the SFU bound. attention_scale (fitted, one for
    # every device) is the training stack's forward + backward kernels' rate relative to that kernel.
    attention_fwd: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    attention_scale: float = 1.0
    # The forward kernel's scalar rate (a fraction of bf16 peak) for the models that run attention
    # forward only or take one scalar (serving, DiT): the measured curve at head dim 128 and 8k keys
    # where the profile has one, else the training figure (attention_eff) over attention_scale, the
    # factor a training stack's forward+backward reaches of the forward kernel. None: attention_eff.
    attention_eff_fwd: float | None = None

    @property
    def forward_attention_eff(self) -> float:
        return self.attention_eff if self.attention_eff_fwd is None else self.attention_eff_fwd

    def peak(self, precision: str) -> float:
        v = self.peak_flops.get(precision)  # a float, or an array per layout row (hardware what-if)
        return self.peak_flops["bf16"] if v is None or np.all(np.asarray(v) == 0) else v


def stage_slot(
    model,
    lay: LayoutTable,
    *,
    seq_len: int,
    links: C.Links,
    co: Coefficients,
    n_dense: np.ndarray,
    n_moe: np.ndarray,
    head: np.ndarray,
    frozen_weights: bool = False,
    moe_options: moe.MoEOptions | None = None,
    profile: FrameworkProfile = MEGATRON,
    mixers: blocks.StageMixers | None = None,
) -> dict[str, np.ndarray]:
    """Seconds one micro-batch takes on one pipeline stage per row, by component (``SLOT_PARTS``).

    Each row of ``lay`` is one stage: ``n_dense`` dense and ``n_moe`` MoE layers with the row's own
    recompute mode, plus the LM head and loss where ``head``. The stage is costed as the sum over its
    blocks (:func:`autopar.blocks.stage_blocks`) of each block module's cost. Besides the parts it
    returns ``slot`` (their sum as the pipeline schedule sees it), ``head_slot`` (the LM head's share),
    ``fwd``, ``bwd`` and ``recompute`` (the overlap windows of the data-parallel tail), and the raw
    TP/CP/EP communication for the exposed-communication report. :func:`step_time_breakdown` calls it
    on the heaviest stage of a uniform pipeline, ``autopar.search.uneven`` on every stage of an uneven
    one. ``frozen_weights`` (LoRA-style fine-tuning): backward runs only the input-gradient GEMMs.
    ``moe_options``: the token dispatcher and the EP all-to-all overlap (:class:`autopar.moe.MoEOptions`).
    ``profile``: the training stack's attention kernel, host floor and TP overlap
    (:class:`autopar.frameworks.FrameworkProfile`). ``mixers``: a hybrid stage's own mixers in the
    model's block order (:func:`autopar.blocks.stage.window`); None: the model's mix in proportion.
    """
    if model.is_encoder_decoder:
        return _encdec_slot(
            model,
            lay,
            seq_len=seq_len,
            links=links,
            co=co,
            n_dense=n_dense,
            n_moe=n_moe,
            head=head,
            frozen_weights=frozen_weights,
            moe_options=moe_options,
            profile=profile,
        )
    ctx = slot_context(lay, seq_len=seq_len, co=co, links=links, profile=profile)
    sb = blocks.stage_blocks(model, n_dense, n_moe, head, mixers)
    wgrad = 0.0 if frozen_weights else 1.0  # weight-gradient GEMMs, as many FLOPs as the forward
    opts = moe_options or moe.MoEOptions()
    graphed = bool(opts.fused_graph and model.is_moe)
    c = _stage_compute(model, ctx, sb, fused_experts=graphed)
    fwd = c["gemm"] + c["attn_f"] + c["scan"] + c["elem"] + c["perm"] + c["quant_f"]
    bwd = (
        (1.0 + wgrad) * c["gemm"] + c["attn_b"] + 2.0 * c["scan"] + 2.0 * c["elem"] + c["perm"] + c["quant_b"]
    )
    recompute = _stage_recompute(model, ctx, sb, c, fwd)
    # A full-iteration CUDA graph replays every kernel back to back: no per-layer launch gaps.
    overhead = 0.0 if graphed else co.kernel_overhead_s * sb.layers
    tp = _stage_tp(model, ctx, sb)
    cp_raw, cp_comm, cp_contention = _stage_cp(model, ctx, sb, c)
    ep_raw, ep_hidden = _stage_ep(model, ctx, sb, opts, lay, fwd, bwd)
    ep_comm = ep_raw - ep_hidden + co.overlap_contention * ep_hidden

    slot = fwd + bwd + recompute + overhead + tp["comm"] + cp_comm + ep_comm  # one micro-batch, whole stage
    slot = slot + cp_contention
    # The host launches nothing inside a captured graph (and the paged stash that makes a dropless
    # MoE graphable keeps the token counts on the device): no host floor, no per-expert launches.
    host_wait = np.zeros(ctx.n) if graphed else _host_wait(model, ctx, sb, slot)
    slot = slot + host_wait
    parts = {
        "gemm": (2.0 + wgrad) * c["gemm"],
        # The mixer cores: attention, and the chunked scans of Mamba2 / Gated DeltaNet blocks.
        "attention": c["attn_f"] + c["attn_b"] + 3.0 * c["scan"],
        # Launch/sync costs (the calibrated per-layer overhead and the host floor's wait) with the
        # memory-bound work: neither is a FLOP.
        "elementwise": 3.0 * c["elem"]
        + 2.0 * c["perm"]
        + c["quant_f"]
        + c["quant_b"]
        + overhead
        + cp_contention
        + host_wait,
        "recompute": recompute,
        "tp_comm": tp["comm"],
        "cp_comm": cp_comm,
        "ep_comm": ep_comm,
    }
    parts.update(
        slot=slot,
        head_slot=(2.0 + wgrad) * c["head"],
        fwd=fwd,
        bwd=bwd,
        wgrad=wgrad * c["gemm"],  # the weight-gradient GEMMs (zero-bubble schedules defer them)
        # the recurrent mixers' share of "gemm" (projections) and of "attention" (chunked scans)
        mixer_gemm=(2.0 + wgrad) * c["mixer_gemm"],
        scan=3.0 * c["scan"],
        n_layers=sb.layers,
        tp_raw=tp["raw"],
        tp_exposed=tp["raw"] * (1.0 - tp["overlap"]),
        cp_raw=cp_raw,
        ep_raw=ep_raw,
        ep_exposed=ep_raw - ep_hidden,
    )
    return parts


def _encdec_slot(
    model, lay: LayoutTable, *, seq_len: int, n_dense, n_moe, head, **kw
) -> dict[str, np.ndarray]:
    """:func:`stage_slot` of an encoder-decoder model: the stage's decoder blocks (``n_dense``, with
    the LM head where ``head``) on ``seq_len`` decoder tokens, as many encoder blocks in proportion
    (``n_dense / layers`` of the encoder stack, all of it at pp = 1, the only split legality allows)
    on the model's ``encoder_tokens`` positions with the conv front-end, and each decoder block's
    cross-attention (:mod:`autopar.blocks.cross_attention`). Every part is a sum of its blocks."""
    enc, dec = model.encoder_view(), model.decoder_view()
    share = np.asarray(n_dense, dtype=np.float64) / model.layers
    s_enc = model.encoder_tokens(seq_len)
    none = np.zeros(np.shape(share), dtype=bool)
    e = stage_slot(enc, lay, seq_len=s_enc, n_dense=share * enc.layers, n_moe=0.0 * share, head=none, **kw)
    d = stage_slot(dec, lay, seq_len=seq_len, n_dense=n_dense, n_moe=n_moe, head=head, **kw)
    x = _cross_slot(model, lay, seq_len, s_enc, np.asarray(n_dense, dtype=np.float64), share, **kw)
    return {k: e[k] + d[k] + x.get(k, 0.0) for k in d}


def _cross_slot(model, lay, seq_len, s_enc, n_cross, share, *, links, co, frozen_weights, profile, **_):
    """Seconds per micro-batch of ``n_cross`` cross-attention sublayers and of the conv front-end of
    the stage's ``share`` of the encoder, by the parts :func:`stage_slot` returns."""
    from autopar.blocks import cross_attention as xa
    from autopar.blocks import encoder as enc_block

    ctx = slot_context(lay, seq_len=seq_len, co=co, links=links, profile=profile)
    h, tp = float(model.hidden), ctx.tp
    wgrad = 0.0 if frozen_weights else 1.0
    T_enc = ctx.mb * s_enc / ctx.cp
    gemm = n_cross * xa.gemms(model, ctx.gt, ctx.T, T_enc, tp) + share * enc_block.frontend_time(
        model, ctx, T_enc
    )
    core_f, core_b = xa.core_time(model, ctx, s_enc)
    attn_f, attn_b = n_cross * core_f, n_cross * core_b
    elem = n_cross * ctx.traffic_s(5.0 * h / ctx.sp_div)  # the sublayer's norm and residual add
    fwd, bwd = gemm + attn_f + elem, (1.0 + wgrad) * gemm + attn_b + 2.0 * elem
    recompute = np.where(ctx.full, fwd, np.where(ctx.drop_core, attn_f, 0.0))
    # Megatron: the row-parallel output's all-reduce forward and backward (+1 in a recomputed forward)
    one = C.all_reduce(links, ctx.T * h * ctx.elem, tp, np.ones(ctx.n)) + np.where(
        tp > 1, co.tp_collective_overhead_s, 0.0
    )
    tp_raw = n_cross * (2.0 + np.where(ctx.full, 1.0, 0.0)) * one
    tp_ov = co.tp_overlap if profile.tp_comm_overlap and links.peer_memory else 0.0
    tp_comm = tp_raw * (1.0 - tp_ov) + co.overlap_contention * tp_ov * tp_raw
    return {
        "gemm": (2.0 + wgrad) * gemm,
        "attention": attn_f + attn_b,
        "elementwise": 3.0 * elem,
        "recompute": recompute,
        "tp_comm": tp_comm,
        "slot": fwd + bwd + recompute + tp_comm,
        "fwd": fwd,
        "bwd": bwd,
        "wgrad": wgrad * gemm,
        "tp_raw": tp_raw,
        "tp_exposed": tp_raw * (1.0 - tp_ov),
    }


def _moe_act_width(model) -> float:
    """Activation-function width per token of a MoE layer's elementwise traffic. Kept as main costs
    it: a non-hybrid model with dense layers charges every layer the dense MLP's width."""
    if model.is_hybrid or not model.ffn_hidden:
        return blocks.moe_ffn.act_width(model)
    return float(model.ffn_hidden)


def _stage_compute(
    model, ctx: SlotContext, sb: blocks.StageBlocks, *, fused_experts: bool = False
) -> dict[str, np.ndarray]:
    """Forward seconds of the stage's blocks summed by kind of work: ``gemm`` (linear GEMMs + the LM
    head), ``attn_f``/``attn_b`` (attention cores), ``scan`` (chunked scans), ``elem`` (memory-bound
    elementwise), ``perm`` (MoE token shuffling), ``quant_f``/``quant_b`` (block-scaling traffic), and
    the per-block figures the recompute needs (``attn_up``, ``shared``, ``dense``).
    ``fused_experts``: the routed experts run as one fused grouped MLP (fc1, activation, the
    block-scaling cast of fc2's input and fc2 in one kernel): their activation traffic and their
    GEMM inputs' casts are not paid apart (the shared experts and the router stay unfused)."""
    co, T, tp, h = ctx.co, ctx.T, ctx.tp, float(model.hidden)
    zero = np.zeros(ctx.n)
    mixer = blocks.mixer(model)
    mlp, moe_ffn = blocks.mlp, blocks.moe_ffn
    fp8 = np.where(ctx.is_fp8, 1.5, 0.0)  # quantize the inputs of each GEMM (elements per input element)
    hbm = co.hbm_bw

    # Attention (or MLA) mixers: projections, core, RoPE and the casts of their two GEMM inputs.
    attn_g, attn_up = mixer.gemms(model, ctx.gt, T, tp)
    attn_qf, attn_qb = (
        mixer.gemms(model, ctx.scale_fwd, T, tp)[0],
        mixer.gemms(model, ctx.scale_bwd, T, tp)[0],
    )
    attn_f, attn_b = mixer.core_time(model, ctx)
    attn_el = ctx.traffic_s(mixer.rope_elems(model, tp) + fp8 * 2 * h / tp)
    # Dense MLPs.
    F = model.ffn_hidden
    dense_g = mlp.gemms(model, ctx.gt, F, T, tp) if F else zero
    dense_qf = mlp.gemms(model, ctx.scale_fwd, F, T, tp) if F else zero
    dense_qb = mlp.gemms(model, ctx.scale_bwd, F, T, tp) if F else zero
    dense_el = ctx.traffic_s(mlp.act_elems(model, F, tp) + fp8 * (h + F) / tp)
    # MoE layers: experts + shared experts + router, token shuffling.
    if model.is_moe:
        moe_g, shared_g = moe_ffn.gemms(model, ctx.gt, ctx)
        moe_g = moe_g + moe_ffn.router_time(model, ctx)
        # a fused grouped MLP casts its own inputs: only what stays outside it is cast apart
        moe_qf, moe_qb = (
            moe_ffn.gemms(model, ctx.scale_fwd, ctx, grouped=not fused_experts)[0],
            moe_ffn.gemms(model, ctx.scale_bwd, ctx, grouped=not fused_experts)[0],
        )
        perm = moe_ffn.shuffle_time(model, ctx)
    else:
        moe_g = shared_g = moe_qf = moe_qb = perm = zero
    # Fused experts: only the shared experts' activation stays outside the fused kernel.
    w_moe = model.shared_expert_ffn if fused_experts and model.is_moe else _moe_act_width(model)
    moe_el = ctx.traffic_s(mlp.act_elems(model, w_moe, tp) + fp8 * (h + w_moe) / tp) if w_moe else zero
    # Norm + residual add per sublayer: a norm (read + write) and a residual add (2 reads + 1 write).
    sub_el = ctx.traffic_s((2 * h + 3 * h) / ctx.sp_div)
    # A non-hybrid layer's casts as main costs them: 4h + F per layer, one h more than its GEMMs' inputs.
    layer_el = zero if model.is_hybrid else ctx.traffic_s(fp8 * h / tp)

    gemm = sb.attention * attn_g + sb.mlp * dense_g + sb.moe * moe_g
    quant_f = sb.attention * attn_qf + sb.mlp * dense_qf + sb.moe * moe_qf
    quant_b = sb.attention * attn_qb + sb.mlp * dense_qb + sb.moe * moe_qb
    elem = (
        sb.sublayers * sub_el
        + sb.attention * attn_el
        + sb.mlp * dense_el
        + sb.moe * moe_el
        + sb.layers * layer_el
    )
    scan = zero
    mixer_gemm = zero
    # Recurrent mixers (Mamba, Gated DeltaNet): projections, chunked scans (16-bit matmuls), their
    # memory-bound traffic with the casts of their GEMM inputs, and the fp32 chunk-state passes.
    for count, kind in sb.recurrent:
        g = sum((ctx.gt(T, N, K) for N, K in kind.gemm_shapes(model, tp)), zero)
        qf = sum((ctx.scale_fwd(T, N, K) for N, K in kind.gemm_shapes(model, tp)), zero)
        qb = sum((ctx.scale_bwd(T, N, K) for N, K in kind.gemm_shapes(model, tp)), zero)
        w_out = kind.in_out_widths(model)[1]
        el = ctx.traffic_s(kind.elementwise_elems(model, tp) + fp8 * (h + w_out) / tp)
        el = el + T * kind.state_pass_bytes(model) / tp / hbm
        mixer_gemm = mixer_gemm + count * g
        quant_f, quant_b = quant_f + count * qf, quant_b + count * qb
        elem = elem + count * el
        if kind.scan_flops_per_token(model):
            scan = scan + count * kind.scan_time(model, ctx.gt16, T, tp)
    head = np.where(sb.head & model.lm_head, blocks.embedding.head_time(model, ctx), 0.0)
    return {
        "gemm": gemm + mixer_gemm + head,
        "head": head,
        "mixer_gemm": mixer_gemm,
        "attn_f": sb.attention * attn_f,
        "attn_b": sb.attention * attn_b,
        "scan": scan,
        "elem": elem,
        "perm": sb.moe * perm,
        "quant_f": quant_f / hbm,
        "quant_b": quant_b / hbm,
        "attn_up": attn_up,
        "dense_gemm": dense_g,
        "shared_gemm": shared_g,
    }


def _stage_recompute(model, ctx: SlotContext, sb: blocks.StageBlocks, c: dict, fwd: np.ndarray) -> np.ndarray:
    """Seconds of the backward's recomputed forward work. Full recompute: the whole forward but the
    head. Selective modes recompute what they dropped (memory.activation_bytes_per_layer): the
    attention core; + norm_act: the norms, the routed experts' activation and MLA's up-projection
    GEMMs (+ RoPE); + norm_act_mlp: the dense MLP's and shared experts' forward."""
    h, tp = float(model.hidden), ctx.tp
    mlp = blocks.mlp
    norm = ctx.traffic_s(2 * h / ctx.sp_div)  # one norm's output, per sublayer
    # MLA up-projections and the RoPE on q and k that follows them
    up = c["attn_up"] + (ctx.traffic_s(blocks.mla.rope_elems(model, tp)) if model.is_mla else 0.0)
    moe_act = (
        ctx.traffic_s(mlp.act_elems(model, blocks.moe_ffn.act_width(model), tp)) if model.is_moe else 0.0
    )
    dense = c["dense_gemm"] + (
        ctx.traffic_s(mlp.act_elems(model, model.ffn_hidden, tp)) if model.ffn_hidden else 0.0
    )
    shared = c["shared_gemm"] + (
        ctx.traffic_s(mlp.act_elems(model, model.shared_expert_ffn, tp)) if model.is_moe else 0.0
    )
    na_rec = sb.sublayers * norm + sb.attention * up + sb.moe * moe_act
    mlp_rec = sb.mlp * dense + sb.moe * shared
    return np.where(
        ctx.full,
        fwd - c["head"],
        np.where(ctx.drop_core, c["attn_f"], 0.0)
        + np.where(ctx.drop_norm, na_rec, 0.0)
        + np.where(ctx.drop_mlp, mlp_rec, 0.0),
    )


def _stage_tp(model, ctx: SlotContext, sb: blocks.StageBlocks) -> dict[str, np.ndarray]:
    """TP/SP (and expert-TP) communication of the stage per micro-batch: ``raw`` seconds, ``comm`` as
    the slot pays it, and the hidden ``overlap`` share."""
    co, links, profile, T, tp, h = ctx.co, ctx.links, ctx.profile, ctx.T, ctx.tp, float(model.hidden)
    n = ctx.n
    tp_bytes = T * h * ctx.elem
    coll_ovh = np.where(tp > 1, co.tp_collective_overhead_s, 0.0)
    tp_one = C.all_reduce(links, tp_bytes, tp, np.ones(n)) + coll_ovh
    # Megatron: per sublayer one all-reduce forward and one backward (RS + AG under SP: same bytes),
    # +1 when full recompute reruns the forward, +1 for the dense MLP and shared experts that
    # norm_act_mlp recomputes. Every mixer of a block counts (attention and Falcon-H1's parallel Mamba
    # each have their own row-parallel output: an upper bound where a stack fuses them). A MoE layer
    # has no TP collective around its routed experts (the dispatcher routes the sequence-parallel
    # share): its shared experts add two; the expert-TP group gathers the copies instead.
    full_ = np.where(ctx.full, 1.0, 0.0)
    ffn_c = 2.0 + np.where(ctx.full, 1.0, np.where(ctx.drop_mlp, 1.0, 0.0))
    if model.shared_expert_ffn:
        moe_c = ffn_c
    elif model.is_hybrid:
        moe_c = 0.0 * ffn_c
    else:  # kept as main costs it: half of norm_act_mlp's recomputed MLP collective
        moe_c = np.where(ctx.full, 0.0, np.where(ctx.drop_mlp, 0.5, 0.0))
    mixers = sb.attention + sum((cnt for cnt, _ in sb.recurrent), 0.0 * sb.layers)
    tp_raw = (mixers * (2.0 + full_) + sb.mlp * ffn_c + sb.moe * moe_c) * tp_one
    xproj = hybrid.mamba1_xproj_elems(model)
    if xproj:  # Mamba1's row-parallel x_proj: an all-reduce forward (and in a recomputed forward)
        tp_raw = tp_raw + sb.layers * (1.0 + full_) * (
            C.all_reduce(links, T * xproj * ctx.elem, tp, np.ones(n)) + coll_ovh
        )
    if model.is_moe:
        tp_raw = tp_raw + sb.moe * blocks.moe_ffn.etp_seconds(model, ctx)
    # Stacks that pipeline TP collectives with the neighbouring GEMMs (userbuffers/TE comm overlap,
    # async TP) hide a fraction; the hidden part still contends for SMs and HBM. Stacks that
    # all-reduce synchronously after the GEMM (profile.tp_comm_overlap False) hide none. TE's
    # userbuffers need the devices to map each other's memory: "Userbuffers relies on CUDA
    # Multicast handles that are only supported over NVLink" (NVIDIA/TransformerEngine #1071;
    # its IPC fallback needs GPU peer-to-peer), so a PCIe node (links.peer_memory False) has none.
    tp_ov = co.tp_overlap if profile.tp_comm_overlap and links.peer_memory else 0.0
    tp_comm = tp_raw * (1.0 - tp_ov) + co.overlap_contention * tp_ov * tp_raw
    if profile.tp_comm_overlap and not links.peer_memory:
        # Without userbuffers, TE's column-parallel modules (LayerNormLinear QKV, LayerNormMLP fc1)
        # keep their sequence-parallel input sharded and all-gather it again in backward for the
        # weight gradient, asynchronously behind the data-gradient GEMM (TE linear/layernorm_linear
        # backward: gather_along_first_dim(..., async_op=True) before the dgrad GEMM); the part the
        # dgrad GEMM does not cover is exposed. With userbuffers this gather is the bulk-dgrad
        # overlap, inside the calibrated tp_overlap.
        ag_one = C.all_gather(links, tp_bytes, tp, np.ones(n))
        dgrad_qkv = ctx.gt(T, h, blocks.mixer(model).qkv_dgrad_k(model, tp))
        F = model.ffn_hidden
        dgrad_fc1 = ctx.gt(T, h, blocks.mlp.up_mult(model) * F / tp) if F else np.zeros(n)
        regather = sb.attention * np.maximum(ag_one - dgrad_qkv, 0.0) + sb.mlp * np.maximum(
            ag_one - dgrad_fc1, 0.0
        )
        rec_count = sum((cnt for cnt, _ in sb.recurrent), 0.0 * sb.layers)
        if sb.recurrent:  # the recurrent mixers' in_proj at their mix-averaged width
            rec_mix = sum(w for w, _ in hybrid.recurrent_kinds(model))
            w_in = hybrid.mixer_in_out_widths(model)[0]
            dgrad_mix = ctx.gt(T, h, w_in / max(rec_mix, 1e-12) / tp) if rec_mix else np.zeros(n)
            regather = regather + rec_count * np.maximum(ag_one - dgrad_mix, 0.0)
        regather = np.where(ctx.sp_div > 1, regather, 0.0)
        tp_raw = tp_raw + regather
        tp_comm = tp_comm + regather
    return {"raw": tp_raw, "comm": tp_comm, "overlap": np.asarray(tp_ov)}


def _stage_cp(model, ctx: SlotContext, sb: blocks.StageBlocks, c: dict) -> tuple[np.ndarray, ...]:
    """(raw, exposed, contention) seconds of CP ring attention per micro-batch: (c-1) KV chunks per
    attention layer forward, 2x backward, hidden behind the attention core.

    Megatron-Core/TE ring attention (cp_comm_type "p2p", AttnFuncWithCPAndKVP2P): each of the c-1
    steps sends the rank's KV to the next rank while the attention of the chunk in hand runs; the
    backward passes KV and dKV. Causal load balancing (rank i holds chunks i and 2c-1-i) gives every
    rank s_loc·s/2 of the causal work, the FLOPs of attn_fwd. What the hidden ring costs the
    attention it overlaps: the exchange is an NCCL send/recv pair ("Point-to-point communications of
    KV and dKV", flash_attn_p2p_communicate, TE dot_product_attention/context_parallel.py): a copy
    with no reduction, on a couple of channels (CTAs) of the GPU's SMs. Its interference is the HBM
    traffic of reading every chunk it sends and writing every chunk it receives, not the calibrated
    overlap_contention, which prices the reducing, many-channel TP/DP/EP collectives (no CP row
    informed that fit). Bytes of the hidden part: its seconds at the ring's bus rate.
    """
    cp = ctx.cp
    cp_chunk = ctx.mb * ctx.s_loc * ctx.elem * blocks.mixer(model).cp_chunk_elems(model, ctx.tp)
    bw_cp, _ = C.bus_bandwidth(ctx.links, cp, ctx.tp)
    cp_bytes = np.where(cp > 1, 3.0 * (cp - 1.0) * cp_chunk, 0.0) * sb.attention
    cp_raw = cp_bytes / bw_cp
    cp_comm = np.maximum(cp_raw - (c["attn_f"] + c["attn_b"]), 0.0)
    return cp_raw, cp_comm, 2.0 * (cp_raw - cp_comm) * bw_cp / ctx.co.hbm_bw


def _stage_ep(
    model, ctx: SlotContext, sb, opts: moe.MoEOptions, lay, fwd, bwd
) -> tuple[np.ndarray, np.ndarray]:
    """(raw, hidden) seconds of the stage's EP all-to-alls per micro-batch. With the EP-overlap
    schedule the all-to-all of one micro-batch hides behind the other direction's compute of its
    partner micro-batch; only micro-batches of the 1F1B steady state have a partner (Megatron refuses
    it with full recompute)."""
    if not model.is_moe:
        return np.zeros(ctx.n), np.zeros(ctx.n)
    per_layer, fwd_one = blocks.moe_ffn.a2a_seconds(model, ctx, opts.dispatcher)
    ep_raw = sb.moe * per_layer
    if not opts.a2a_overlap:
        return ep_raw, np.zeros(ctx.n)
    fwd_a2a = sb.moe * fwd_one
    bwd_a2a = ep_raw - fwd_a2a
    can = (~ctx.full) * moe.paired_fraction(lay["pp"], lay["grad_accum"])
    return ep_raw, can * (np.minimum(fwd_a2a, bwd) + np.minimum(bwd_a2a, fwd))


def _host_wait(model, ctx: SlotContext, sb: blocks.StageBlocks, slot: np.ndarray) -> np.ndarray:
    """Seconds the device waits for the host. Host floor: the host enqueues every kernel
    (asynchronously, so its time hides while the GPU is busier); a stage cannot run a micro-batch
    faster than its layers' launches. Full recompute relaunches the forward, a third of the forward +
    backward kernels. MoE layers add the per-expert launches the device waits for
    (:func:`autopar.blocks.moe_ffn.host_launch_seconds`), scaled by the fitted ``moe_host_factor``."""
    profile = ctx.profile
    relaunch = np.where(ctx.full, 4.0 / 3.0, 1.0)
    launches = profile.kernels_per_layer * sb.layers * relaunch
    host_wait = np.maximum(launches * profile.launch_latency_us * 1e-6 - slot, 0.0)
    if model.is_moe:
        moe_host = sb.moe * blocks.moe_ffn.host_launch_seconds(model, ctx, relaunch) * ctx.co.moe_host_factor
        host_wait = host_wait + moe_host
    return host_wait


def pipeline_schedule(
    m: np.ndarray,
    v: np.ndarray,
    slot_max: np.ndarray,
    slot_sum: np.ndarray,
    bubble_pace: np.ndarray | None = None,
    bubble_sum: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(steady state, bubble) seconds of a synchronous pipelined step from per-stage slots.

    ``slot_max``/``slot_sum``: the slowest stage's and the sum of all stages' time for one
    micro-batch (all v chunks). The slowest stage paces the m micro-batches; fill and drain pass
    once through every other stage, one 1/v chunk at a time: bubble = (sum - max) / v. For p equal
    stages of time t this is (p-1)·t/v, Narayanan et al. 2021's (p-1)/(v·m) of the m·t steady state;
    for v = 1 the step (m-1)·max + sum is DAPPLE's (Fan et al. 2021, PPoPP). Other schedules pass
    their :func:`bubble_terms` (``bubble_pace`` of the pacing stage, ``bubble_sum`` over stages)
    in place of the slots in the bubble. The one schedule of the uniform engine
    (:func:`step_time_breakdown`) and of the uneven-split scorer (``autopar.search.uneven``).
    """
    m = np.asarray(m, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if bubble_pace is None or bubble_sum is None:
        bubble_pace, bubble_sum = slot_max, slot_sum
    return m * slot_max, np.maximum(bubble_sum - bubble_pace, 0.0) / v


def pipeline_p2p(model, lay: LayoutTable, *, seq_len: int, links: C.Links) -> np.ndarray:
    """Seconds of pipeline send/recv per step on the critical path (activations fwd, gradients bwd)."""
    tp = lay["tp"].astype(np.float64)
    pp = lay["pp"].astype(np.float64)
    vpp = lay["vpp"].astype(np.float64)
    cp = lay["cp"].astype(np.float64)
    dp = lay["dp"].astype(np.float64)
    mb = lay["micro_batch"].astype(np.float64)
    m = lay["grad_accum"].astype(np.float64)
    h = float(model.hidden)
    elem = np.where(lay["precision"] == PRECISION_CODES.index("fp32"), FP32_BYTES, ACT_BYTES)
    T = mb * (seq_len / cp)
    sp_div = lay.dims.sp_divisor.astype(np.float64)
    pp_bytes = T * h * elem / sp_div
    pp_inter = (tp * cp * dp) >= links.devices_per_node
    pp_one = C.p2p(links, pp_bytes, pp_inter, stride=tp * cp * dp, span=pp)
    pp_comm = np.where(pp > 1, 2.0 * pp_one * (m * vpp + pp - 1.0), 0.0)

    return pp_comm


def data_parallel_tail(
    model,
    lay: LayoutTable,
    *,
    links: C.Links,
    co: Coefficients,
    nonexpert_params: np.ndarray,
    expert_params: np.ndarray,
    fwd: np.ndarray,
    bwd: np.ndarray,
    recompute: np.ndarray,
    frozen_weights: bool = False,
    profile: FrameworkProfile = MEGATRON,
) -> dict[str, np.ndarray]:
    """Data-parallel/ZeRO communication and the optimizer step of one step, per row.

    ``*_params`` are the parameters per rank of the stage that decides (the heaviest one), and
    ``fwd``/``bwd``/``recompute`` that stage's micro-batch times, the windows the communication
    hides behind. Returns ``dp_comm`` and ``optimizer`` (step-time components) and the per-micro-batch
    and per-step communication for the exposed-communication report.
    """
    tp = lay["tp"].astype(np.float64)
    cp = lay["cp"].astype(np.float64)
    dp = lay["dp"].astype(np.float64)
    ep = lay["ep"].astype(np.float64)
    etp = lay["etp"].astype(np.float64)
    m = lay["grad_accum"].astype(np.float64)
    pp = lay["pp"]
    elem = np.where(lay["precision"] == PRECISION_CODES.index("fp32"), FP32_BYTES, ACT_BYTES)
    wgrad = 0.0 if frozen_weights else 1.0
    dense_params = nonexpert_params
    exp_params = expert_params
    zero = lay["zero"]
    dpcp = dp * cp
    shard = lay.dims.shard_size.astype(np.float64)
    replicas = dpcp / shard
    edp = lay.dims.expert_dp
    # Gradients on the wire: the stack's reduce dtype (fp32 where it reduces 16-bit training's
    # gradients in fp32: Megatron with bf16, torchtitan), else the model's 16-bit dtype; fp16
    # training keeps fp16 gradients in Megatron (its fp32 reduction is bf16-only).
    fp16 = lay["precision"] == PRECISION_CODES.index("fp16")
    gbytes = np.where(profile.grad_reduce_fp32 & ~fp16, FP32_BYTES, elem)
    stride_dp = tp

    def grad_sync(params, group, stride):
        ar = C.all_reduce(links, params * gbytes, group, stride)
        rs = C.reduce_scatter(links, params * gbytes, group, stride)
        return ar, rs

    def dp_costs(params, group_size, rep, stride_dp):
        ar_full, rs = grad_sync(params, group_size, stride_dp)
        ag = C.all_gather(links, params * elem, group_size, stride_dp)
        ar_rep = C.all_reduce(links, params / group_size * gbytes, rep, stride_dp * group_size)
        # per step: (per-micro-batch part, once-per-step part)
        # A stack whose ZeRO-3 fetch path is software-bound (profile.zero3_fetch_gbps) pays the
        # parameter bytes at that rate on top of the wire, for each gather and the reduce-scatter.
        fetch = 0.0
        if profile.zero3_fetch_gbps is not None:
            fetch = np.where(group_size > 1, params * elem / (profile.zero3_fetch_gbps * 1e9), 0.0)
        z3_ag, z3_rs = ag + fetch, rs + fetch
        per_mb = np.select([zero >= 3, zero == 2], [2.0 * z3_ag + z3_rs + ar_rep, rs + ar_rep], default=0.0)
        z3_step = 0.0
        if profile.fsdp_pp_defer:  # under PP: the gradient reduction once per step, not per micro-batch
            deferred = (zero >= 3) & (pp > 1)
            per_mb = np.where(deferred, 2.0 * z3_ag, per_mb)
            z3_step = np.where(deferred, z3_rs + ar_rep, 0.0)
        reduce_step = z3_step + np.select(
            [zero >= 3, zero == 2, zero == 1],
            [0.0, 0.0, rs + ar_rep],
            default=C.all_reduce(links, params * gbytes, group_size * rep, stride_dp),
        )
        # The updated parameters' all-gather of ZeRO-1/2 (the distributed optimizer's param gather).
        gather_step = np.where((zero == 1) | (zero == 2), ag, 0.0)
        if frozen_weights:  # only ZeRO-3's parameter gathers remain
            per_mb = np.where(zero >= 3, 2.0 * z3_ag, 0.0)
            reduce_step = np.zeros_like(reduce_step)
            gather_step = np.zeros_like(gather_step)
        return per_mb, reduce_step, gather_step

    d_mb, d_red, d_gat = dp_costs(dense_params, shard, replicas, stride_dp)
    e_shard = lay.dims.expert_shard
    # Expert-data-parallel groups (Megatron expert order etp, ep, edp) are spaced ep*etp apart.
    e_mb, e_red, e_gat = (
        dp_costs(exp_params, e_shard, edp / e_shard, ep * etp) if model.is_moe else (0.0, 0.0, 0.0)
    )
    dp_per_mb = d_mb + e_mb
    reduce_step = d_red + e_red
    gather_step = d_gat + e_gat
    dp_per_step = reduce_step + gather_step
    # Overlap windows: ZeRO-3 gathers/reductions hide behind each micro-batch's compute; the
    # once-per-step gradient reduction hides behind the last micro-batch's backward. A stack that
    # overlaps the distributed optimizer's parameter all-gather with the next step's forward
    # (Megatron --overlap-param-gather) hides it behind the first micro-batch's forward; otherwise
    # it shares the backward's window (issued bucket by bucket as the reduction finishes).
    mb_compute = fwd + bwd + recompute
    exposed_mb = np.maximum(dp_per_mb - mb_compute, 0.0)
    if profile.param_gather_overlap:
        exposed_step = np.maximum(reduce_step - bwd, 0.0) + np.maximum(gather_step - fwd, 0.0)
    else:
        exposed_step = np.maximum(dp_per_step - bwd, 0.0)
    dp_exposed = m * exposed_mb + exposed_step
    dp_hidden = (m * dp_per_mb + dp_per_step) - dp_exposed
    dp_comm = dp_exposed + co.overlap_contention * dp_hidden

    # ---- optimizer step (memory bound: ~28 bytes per locally optimized parameter) ------------------
    local_opt = np.where(zero >= 1, dense_params / shard, dense_params) + np.where(
        zero >= 1, exp_params / e_shard, exp_params
    )
    opt_gpu = local_opt * 28.0 / co.hbm_bw
    opt_cpu = local_opt * 16.0 / co.host_bw + local_opt * 4.0 * 2 / co.pcie_bw
    optimizer = np.where(lay["offload"] > 0, opt_cpu, opt_gpu) * wgrad

    return {
        "dp_comm": dp_comm,
        "optimizer": optimizer,
        "dp_per_mb": dp_per_mb,
        "dp_per_step": dp_per_step,
        "dp_exposed": dp_exposed,
    }


def step_time_breakdown(
    model,
    lay: LayoutTable,
    *,
    seq_len: int,
    links: C.Links,
    co: Coefficients,
    param_counts: dict[str, np.ndarray],
    frozen_weights: bool = False,
    moe_options: moe.MoEOptions | None = None,
    profile: FrameworkProfile = MEGATRON,
    schedule: str = "1f1b",
) -> dict[str, np.ndarray]:
    """Seconds per optimizer step by component, plus ``step_time`` and communication totals.

    :func:`stage_slot` scores the first, one middle and the last stage (the LM head on the last);
    :func:`pipeline_schedule` turns their slots into the steady state (paced by the slowest stage)
    and the bubble. ``frozen_weights``
    (LoRA-style fine-tuning): the base weights get no gradients, so backward runs only the
    input-gradient GEMMs (1x forward instead of 2x), and no gradient reduction or optimizer step
    happens for them (adapters are a fraction of a percent and are neglected).
    """
    pp = lay["pp"].astype(np.float64)
    vpp = lay["vpp"].astype(np.float64)
    m = lay["grad_accum"].astype(np.float64)
    st = stage_shape(model, lay, seq_len)
    n = len(lay)

    def slot(n_dense, n_moe, head, mixers):
        return stage_slot(
            model,
            lay,
            seq_len=seq_len,
            links=links,
            co=co,
            n_dense=n_dense,
            n_moe=n_moe,
            head=np.broadcast_to(head, np.shape(n_dense)),
            frozen_weights=frozen_weights,
            moe_options=moe_options,
            profile=profile,
            mixers=mixers,
        )

    # The first, one middle (all middle stages hold the same layers) and the last stage; with
    # pp = 1 the first stage is the last and runs the LM head.
    # V-shaped schedules (ZB-V, DualPipeV) place the first and the last model chunk on rank 0,
    # so the LM head runs there.
    v_shape = schedule in V_SHAPED
    first = slot(st.first_dense, st.first_moe, (pp == 1) | v_shape, st.first_mixers)
    last = slot(st.last_dense, st.last_moe, np.full(n, not v_shape), st.last_mixers)
    mid = slot(st.mid_dense, st.mid_moe, np.zeros(n, dtype=bool), st.mid_mixers)
    s_first = np.where(pp == 1, 0.0, first["slot"])
    s_mid = np.where(st.has_mid, mid["slot"], 0.0)
    s_last = last["slot"]
    slot_max = np.maximum(np.maximum(s_first, s_last), s_mid)
    slot_sum = s_first + s_last + np.maximum(pp - 2.0, 0.0) * s_mid
    # The pacing stage's parts (the last stage on ties: it runs the LM head).
    pace_first = (s_first > s_last) & (s_first >= s_mid)
    pace_mid = ~pace_first & (s_mid > s_last)

    def q(stage):  # the stage's share of the fill-and-drain under the schedule
        return bubble_terms(schedule, stage["slot"], stage["fwd"], stage["wgrad"])

    q_first = np.where(pp == 1, 0.0, q(first))
    q_mid = np.where(st.has_mid, q(mid), 0.0)
    q_last = q(last)
    q_sum = q_first + q_last + np.maximum(pp - 2.0, 0.0) * q_mid
    q_pace = np.where(pace_first, q_first, np.where(pace_mid, q_mid, q_last))
    steady, bubble = pipeline_schedule(m, vpp, slot_max, slot_sum, q_pace, q_sum)
    sl = {
        k: np.where(pace_first, first[k], np.where(pace_mid, mid[k], last[k]))
        for k in (
            *SLOT_PARTS,
            "fwd",
            "bwd",
            "recompute",
            "tp_raw",
            "tp_exposed",
            "cp_raw",
            "ep_raw",
            "ep_exposed",
        )
    }
    pp_comm = pipeline_p2p(model, lay, seq_len=seq_len, links=links)
    tail = data_parallel_tail(
        model,
        lay,
        links=links,
        co=co,
        nonexpert_params=param_counts["nonexpert"],
        expert_params=param_counts["expert"],
        fwd=sl["fwd"],
        bwd=sl["bwd"],
        recompute=sl["recompute"],
        frozen_weights=frozen_weights,
        profile=profile,
    )

    out = {k: m * sl[k] for k in SLOT_PARTS}
    out["pp_comm"] = pp_comm
    out["dp_comm"] = tail["dp_comm"]
    out["pipeline_bubble"] = bubble
    out["optimizer"] = tail["optimizer"]
    out["step_time"] = sum(out[k] for k in TIME_COMPONENTS)
    total_comm = (
        m * (sl["tp_raw"] + sl["cp_raw"] + sl["ep_raw"])
        + pp_comm
        + m * tail["dp_per_mb"]
        + tail["dp_per_step"]
    )
    exposed_comm = m * (sl["tp_exposed"] + sl["cp_comm"] + sl["ep_exposed"]) + pp_comm + tail["dp_exposed"]
    out["comm_total"] = total_comm
    out["comm_exposed"] = exposed_comm
    # The same two sums per collective (their terms, so they add up to comm_total / comm_exposed).
    per_total = {
        "tp": m * sl["tp_raw"],
        "cp": m * sl["cp_raw"],
        "ep": m * sl["ep_raw"],
        "pp": pp_comm,
        "dp": m * tail["dp_per_mb"] + tail["dp_per_step"],
    }
    per_exposed = {
        "tp": m * sl["tp_exposed"],
        "cp": m * sl["cp_comm"],
        "ep": m * sl["ep_exposed"],
        "pp": pp_comm,
        "dp": tail["dp_exposed"],
    }
    for k in COMM_KINDS:
        out[f"comm_total_{k}"] = per_total[k]
        out[f"comm_exposed_{k}"] = per_exposed[k]
    out["compute_busy"] = m * (sl["fwd"] + sl["bwd"] + sl["recompute"])
    return out
