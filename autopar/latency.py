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
breakdowns sum to ``step_time``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autopar import collectives as C
from autopar import hybrid, moe
from autopar import precision as P
from autopar.frameworks import MEGATRON, FrameworkProfile
from autopar.layout import PRECISION_CODES, LayoutTable
from autopar.memory import LOW_PRECISION_CODES, REC_FULL, recompute_drops, stage_shape
from autopar.schedules import V_SHAPED, bubble_terms

ACT_BYTES = 2.0
# Attention kernel speed without a causal mask over with one (the off-diagonal steps of ring CP):
# Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608) Fig. 5, H100 head dim 128, forward at 16k:
# cuDNN 595 vs 539 TFLOP/s, FlashAttention-2 370 vs 335 (1.10 both).
NONCAUSAL_ATTENTION_SPEEDUP = 1.10
FP32_BYTES = 4.0  # fp32 training (e.g. the CPU reference runs): activations, gradients and wire bytes

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
    """The fitted coefficients of one device type; each has a physical meaning (README)."""

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

    def peak(self, precision: str) -> float:
        v = self.peak_flops.get(precision)  # a float, or an array per layout row (hardware what-if)
        return self.peak_flops["bf16"] if v is None or np.all(np.asarray(v) == 0) else v


# Kernels a grouped expert MLP launches per local expert per micro-batch: fc1 and fc2 forward, and the
# data- and weight-gradient GEMMs of each backward (TE GroupedLinear runs one cuBLAS GEMM per expert).
MOE_LAUNCHES_PER_EXPERT = 6.0

# FlashAttention backward: dQ, dK, dV and the recomputed QK^T, 2.5x the forward's matmul FLOPs.
FLASH_BWD_MULT = 2.5

# The max-achievable-matmul (MAMF) efficiencies are measured on large square GEMMs of this size.
MAMF_REFERENCE_DIM = 16384.0


def gemm_time(
    co: Coefficients,
    flops_peak: np.ndarray,
    eff_max: np.ndarray,
    M,
    N,
    K,
    elem_bytes=ACT_BYTES,
    half_dim=None,
) -> np.ndarray:
    """Roofline time of one GEMM (M×K by K×N) with efficiency falling for small M, N, K (tiles, waves).

    Efficiency is ``eff_max`` at the MAMF reference size and falls as 1/(1 + d/M + d/N + d/K) with
    d = ``gemm_half_dim``; the memory side moves the three operands once. Serving and calibration use
    the same function.
    """
    M = np.maximum(np.asarray(M, dtype=np.float64), 1.0)
    N = np.maximum(np.asarray(N, dtype=np.float64), 1.0)
    K = np.maximum(np.asarray(K, dtype=np.float64), 1.0)
    hd = co.gemm_half_dim if half_dim is None else half_dim
    shape = (1.0 + 3.0 * hd / MAMF_REFERENCE_DIM) / (1.0 + hd / M + hd / N + hd / K)
    compute = 2.0 * M * N * K / (flops_peak * eff_max * shape)
    traffic = elem_bytes * (M * K + K * N + M * N) / co.hbm_bw
    return np.maximum(compute, traffic)


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
) -> dict[str, np.ndarray]:
    """Seconds one micro-batch takes on one pipeline stage per row, by component (``SLOT_PARTS``).

    Each row of ``lay`` is one stage: ``n_dense`` dense and ``n_moe`` MoE layers with the row's own
    recompute mode, plus the LM head and loss where ``head``. Besides the parts it returns ``slot``
    (their sum as the pipeline schedule sees it), ``head_slot`` (the LM head's share), ``fwd``,
    ``bwd`` and ``recompute`` (the overlap windows of the data-parallel tail), and the raw TP/CP/EP
    communication for the exposed-communication report. :func:`step_time_breakdown` calls it on the
    heaviest stage of a uniform pipeline, ``autopar.search.uneven`` on every stage of an uneven one.
    ``frozen_weights`` (LoRA-style fine-tuning): backward runs only the input-gradient GEMMs.
    ``moe_options``: the token dispatcher and the EP all-to-all overlap (:class:`autopar.moe.MoEOptions`).
    ``profile``: the training stack's attention kernel, host floor and TP overlap
    (:class:`autopar.frameworks.FrameworkProfile`).
    """
    n = len(lay)
    opts = moe_options or moe.MoEOptions()
    tp = lay["tp"].astype(np.float64)
    cp = lay["cp"].astype(np.float64)
    ep = lay["ep"].astype(np.float64)
    etp = lay["etp"].astype(np.float64)
    mb = lay["micro_batch"].astype(np.float64)
    rec = lay["recompute"]
    prec_code = lay["precision"]
    h = float(model.hidden)

    # Per-precision GEMM peak and efficiency (attention and elementwise stay bf16: FP8 recipes
    # only run GEMMs in FP8, data README caveat 2; the block-scaled keys: autopar.precision).
    peak = np.empty(n)
    geff = np.empty(n)
    quant_bpe = np.zeros(n)  # block-scaling bytes per quantized GEMM-input element
    ghd = np.full(n, co.gemm_half_dim)  # the precision's GEMM half-dimension
    for code, name in enumerate(PRECISION_CODES):
        sel = prec_code == code
        if sel.any():
            ghd[sel] = co.gemm_half_dim_by.get(
                name, co.gemm_half_dim_by.get(P.EFFICIENCY_KEY[name], co.gemm_half_dim)
            )
            peak[sel] = np.broadcast_to(co.peak(P.PEAK_KEY[name]), (n,))[sel]
            # the format's own measured rate (block-scaled formats), else its peak precision's
            geff[sel] = co.gemm_eff.get(name, co.gemm_eff.get(P.EFFICIENCY_KEY[name], co.gemm_eff["bf16"]))
            quant_bpe[sel] = P.QUANT_BYTES_PER_ELEMENT.get(name, 0.0)
    bf16_peak = co.peak("bf16")
    is_fp8 = prec_code == PRECISION_CODES.index("fp8")
    is_low = np.isin(prec_code, LOW_PRECISION_CODES)
    # Bytes per activation/gradient element: 16-bit, except fp32 training, whose activations,
    # gradients and communication are fp32 and whose attention runs at the fp32 rate.
    is_fp32 = prec_code == PRECISION_CODES.index("fp32")
    elem = np.where(is_fp32, FP32_BYTES, ACT_BYTES)
    attn_peak = np.where(is_fp32, co.peak("fp32"), bf16_peak)

    s_loc = seq_len / cp
    T = mb * s_loc  # tokens per rank per micro-batch (before SP sharding)

    # ---- GEMMs of one layer, forward, per rank --------------------------------------------
    a, g = model.heads, model.kv_heads

    def gt(M, N, K):  # noqa: E306
        return gemm_time(co, peak, geff, M, N, K, elem, ghd)

    n_mb = lay["grad_accum"].astype(np.float64)

    def scale_fwd(M, N, K):  # noqa: E306
        return P.scaling_bytes(quant_bpe, M, N, K, n_mb)[0]

    def scale_bwd(M, N, K):  # noqa: E306
        return P.scaling_bytes(quant_bpe, M, N, K, n_mb)[1]

    up_mult = 2.0 if model.gated_mlp else 1.0
    sp_div = lay.dims.sp_divisor.astype(np.float64)
    if model.is_moe:
        T_r = moe.routed_tokens(T, sp_div)
        tok_e = moe.tokens_per_expert(model, T, sp_div, ep, etp)

    def layer_gemms(f):  # noqa: E306
        """One layer's linear GEMMs, ``f(M, N, K)`` summed per part: ``attn`` (all of attention),
        ``attn_up`` (its share that MLA's ``mla_up_proj`` recompute repeats: the Q and KV
        up-projections), ``dense`` (the dense MLP), ``moe`` (routed + shared experts) and
        ``shared`` (the shared experts alone)."""
        zero = np.zeros(n)
        if model.is_mla:
            qd = model.heads * model.qk_head_dim
            q_up = f(T, qd / tp, model.q_lora_rank) if model.q_lora_rank else f(T, qd / tp, h)
            up = q_up + f(T, a * (model.qk_nope_head_dim + model.v_dim) / tp, model.kv_lora_rank)
            down = f(T, model.kv_lora_rank + model.qk_rope_head_dim, h) + f(T, h, a * model.v_dim / tp)
            if model.q_lora_rank:
                down = down + f(T, model.q_lora_rank, h)
            attn = up + down
        else:
            up = zero
            q_mult = 2 if model.attn_output_gate else 1  # gated attention: q_proj also emits the gate
            attn = f(T, (q_mult * a * model.head_dim + 2 * g * model.head_dim) / tp, h) + f(
                T, h, a * model.head_dim / tp
            )

        def mlp(F, M, width_div):
            return f(M, up_mult * F / width_div, h) + f(M, h, F / width_div)

        dense = mlp(model.ffn_hidden, T, tp) if model.ffn_hidden else zero
        if not model.is_moe:
            return {"attn": attn, "attn_up": up, "dense": dense, "moe": zero, "shared": zero}
        # Grouped GEMM = one GEMM per local expert with M = its tokens (autopar.moe): small per-expert
        # M pays the same tile/wave quantization as any small GEMM. Shared experts run on the rank's
        # sequence-parallel share of the tokens.
        expert = (model.num_experts / ep) * mlp(model.moe_ffn_hidden, tok_e, etp)
        shared = mlp(model.shared_expert_ffn, T, tp) if model.shared_expert_ffn else zero
        return {"attn": attn, "attn_up": up, "dense": dense, "moe": expert + shared, "shared": shared}

    gemms = layer_gemms(gt)
    attn_gemm, dense_mlp, moe_mlp = gemms["attn"], gemms["dense"], gemms["moe"]
    if model.is_moe:
        # The router GEMM (not a TE module: never block-scaled) on the sequence-parallel share.
        moe_mlp = moe_mlp + gt(T_r, model.num_experts, h)
        # Memory-bound token shuffling (permutations/unpermutations, router top-k), fwd; the
        # backward moves the same bytes once (not the 2x of the elementwise ops' recomputed reads).
        moe_elem = (
            moe.permutation_bytes(model, T, sp_div, ep, etp, elem) + moe.router_bytes(model, T, sp_div)
        ) / co.hbm_bw
    else:
        moe_elem = np.zeros(n)
    # Block scaling (mxfp8/nvfp4): quantize/dequantize + amax/scale passes over every linear GEMM's
    # inputs, memory-bound; forward X and W, backward dY (autopar.precision.scaling_bytes).
    sf, sb_ = layer_gemms(scale_fwd), layer_gemms(scale_bwd)
    sa_f, sd_f, sm_f = sf["attn"], sf["dense"], sf["moe"]
    sa_b, sd_b, sm_b = sb_["attn"], sb_["dense"], sb_["moe"]

    # ---- attention core ---------------------------------------------------------------------------
    window = model.sliding_window or 0
    s_kv_full = float(seq_len)

    # Transformer Engine's attention runs cuDNN's fused kernel where the device has one faster than
    # FlashAttention-2 (sm90+; autopar.frameworks, "Attention kernel"); attention_eff is FA2's.
    attn_speed = co.fused_attention_speedup if profile.attention == "te" else 1.0

    # Under load-balanced ring CP only the first of the c steps (the rank's own KV) is a causal
    # kernel; the c-1 others attend one half-chunk to the other without a mask (TE
    # AttnFuncWithCPAndKVP2P: step i <= rank all of Q on the first half of KV, else the second half
    # of Q on all of KV), each s_loc·s_loc/2 of the rank's s_loc·s/2 work. An unmasked kernel has no
    # diagonal tiles to mask and no uneven work per CTA: Shah et al. 2024 (arXiv 2407.08608) Fig. 5,
    # H100 head dim 128 at 16k, forward non-causal / causal = 595/539 (cuDNN) and 370/335 (FA2), 1.10.
    ring = np.where(cp > 1, 1.0 / cp + (1.0 - 1.0 / cp) / NONCAUSAL_ATTENTION_SPEEDUP, 1.0)

    # The softmax's exponentials run on the special-function units, one per score element forward
    # and one more backward (FlashAttention recomputes P = exp(S - lse)), in series with the matmuls
    # that produce and consume them (BMM1 -> softmax -> BMM2: NVIDIA, "Making Softmax More Efficient
    # with NVIDIA Blackwell Ultra"). At both units' peak rates and head dim 128 they add 26% to the
    # matmul time on H100 and 54% on B200, whose tensor cores doubled and SFUs did not (the
    # FlashAttention-4 paper's point): this is
    # why attention does not speed up with the tensor-core peak. fp32 attention has no SFU bound
    # beyond its slow matmuls; an unfused core's exponentials are in its memory-bound passes.
    def attn_fwd(s_kv, cp_ring=True):  # noqa: E306
        fl = 2.0 * mb * s_loc * s_kv * (a / tp) * (model.qk_head_dim + model.v_dim) * 0.5
        eff = co.attention_eff * attn_speed * s_kv / (s_kv + co.gemm_half_dim)
        scale = ring if cp_ring else 1.0
        mm = fl / (attn_peak * eff) * scale
        exps = fl / (2.0 * (model.qk_head_dim + model.v_dim))
        ex = np.where(is_fp32 | (co.exp_rate <= 0), 0.0, exps / max(co.exp_rate, 1.0)) * np.ones(n)
        return mm, ex * scale

    if not profile.flash_attention:
        # Unfused core (Megatron-DeepSpeed CoreAttention): per (micro-batch, head) the full s x s_kv
        # score matrix, causal mask and any sliding window applied by masking, not skipped:
        # QK^T and PV as batched GEMMs (bf16/fp32 rate; their operand traffic includes writing and
        # reading the scores), then memory-bound passes over the s·s_kv scores: masked fill and
        # softmax read + write one score each, dropout reads one and writes one plus a 1-byte mask.
        # Backward: dgrad of both operands of each GEMM and one backward pass per elementwise op
        # reading its saved tensor and the incoming gradient: 2x the forward.
        bh = mb * a / tp
        geff_attn = np.where(is_fp32, co.gemm_eff.get("fp32", co.gemm_eff["bf16"]), co.gemm_eff["bf16"])
        scores = gemm_time(co, attn_peak, geff_attn, s_loc, s_kv_full, model.qk_head_dim, elem)
        context = gemm_time(co, attn_peak, geff_attn, s_loc, model.v_dim, s_kv_full, elem)
        passes = bh * s_loc * s_kv_full * (6.0 * elem + 1.0) / co.hbm_bw
        attn_f = bh * (scores + context) + passes
        attn_b = 2.0 * attn_f
    elif window and model.sliding_window_layers:
        # FlashAttention: fwd 4·s·s_kv·a·d/2 (causal), bwd 2.5× fwd.
        frac_sw = model.sliding_window_layers / max(model.attn_layers, 1)
        mm_full, ex_full = attn_fwd(s_kv_full)
        mm_win, ex_win = attn_fwd(min(window, s_kv_full), False)
        mm_f = (1 - frac_sw) * mm_full + frac_sw * mm_win
        ex_f = (1 - frac_sw) * ex_full + frac_sw * ex_win
        attn_f = mm_f + ex_f
        attn_b = FLASH_BWD_MULT * mm_f + ex_f
    else:
        mm_f, ex_f = attn_fwd(s_kv_full)
        attn_f = mm_f + ex_f
        attn_b = FLASH_BWD_MULT * mm_f + ex_f

    # ---- memory-bound elementwise work per layer (bytes moved, fwd) ------------------------------
    act_mult = 3.0 if model.gated_mlp else 2.0  # activation reads (gate +) up, writes its output
    act_f = model.ffn_hidden if model.ffn_hidden else model.moe_ffn_hidden * model.moe_topk
    per_tok = (
        2 * 2 * h / sp_div  # two norms: read + write
        + 2 * 3 * h / sp_div  # two residual adds: 2 reads + 1 write
        + act_mult * act_f / tp  # activation function
        + 2 * (a + g) * model.qk_head_dim / tp  # RoPE on q and k
    )
    fp8_casts = np.where(is_fp8, 1.5 * (4 * h + act_f) / tp, 0.0)  # quantize inputs of each GEMM
    elem_f = T * elem * (per_tok + fp8_casts) / co.hbm_bw

    n_dense = np.asarray(n_dense, dtype=np.float64)
    n_moe = np.asarray(n_moe, dtype=np.float64)
    # Blocks of the stage: n_dense + n_moe, or for a hybrid model every block of the stage with its
    # mixer-only blocks (autopar.hybrid: each stage holds the model's mix of block kinds).
    n_layers = hybrid.blocks(model, n_dense, n_moe)

    if model.is_hybrid:
        # Per block of the mix: attention on a share mx.attn of the blocks, recurrent mixers on theirs,
        # norms and residual adds per sublayer; the MLPs ride on n_dense / n_moe as for any model.
        mx = hybrid.mix(model)
        geff_scan = np.where(is_fp32, co.gemm_eff.get("fp32", co.gemm_eff["bf16"]), co.gemm_eff["bf16"])

        def gt_scan(M, N, K):  # noqa: E306  (chunk-local matmuls: 16-bit, never FP8)
            return gemm_time(co, attn_peak, geff_scan, M, N, K, elem)

        scan_f = hybrid.scan_time(model, gt_scan, T, tp)
        w_in, w_out = hybrid.mixer_in_out_widths(model)
        sub = mx.mixer_sub + mx.ffn_sub
        f_d, f_m = model.dense_layers / model.layers, model.moe_layers / model.layers
        per_tok_h = (
            sub * (2 * h + 3 * h) / sp_div  # a norm (read + write) and a residual add per sublayer
            + mx.attn * 2 * (a + g) * model.qk_head_dim / tp  # RoPE on q and k
            + hybrid.mixer_elementwise_elems(model, tp)
            + (act_mult / tp) * (f_d * model.ffn_hidden + f_m * model.moe_ffn_hidden * model.moe_topk)
        )
        casts_h = np.where(
            is_fp8,
            1.5
            * (
                2 * mx.attn * h
                + (mx.linear + mx.mamba) * h
                + w_out
                + f_d * (h + model.ffn_hidden)
                + f_m * (h + model.moe_ffn_hidden * model.moe_topk)
            )
            / tp,
            0.0,
        )
        elem_f = (T * elem * (per_tok_h + casts_h) + T * hybrid.state_pass_bytes(model, tp)) / co.hbm_bw
        mixer_g = hybrid.mixer_gemms(model, gt, T, tp)
        gemm_f = n_layers * (mx.attn * attn_gemm + mixer_g) + n_dense * dense_mlp + n_moe * moe_mlp
        attn_tot_f = n_layers * mx.attn * attn_f
        attn_tot_b = n_layers * mx.attn * attn_b
        q_mix_f = hybrid.mixer_gemms(model, scale_fwd, T, tp)
        q_mix_b = hybrid.mixer_gemms(model, scale_bwd, T, tp)
        quant_f = (n_layers * (mx.attn * sa_f + q_mix_f) + n_dense * sd_f + n_moe * sm_f) / co.hbm_bw
        quant_b = (n_layers * (mx.attn * sa_b + q_mix_b) + n_dense * sd_b + n_moe * sm_b) / co.hbm_bw
    else:
        scan_f = np.zeros(n)
        mixer_g = np.zeros(n)
        gemm_f = n_dense * (attn_gemm + dense_mlp) + n_moe * (attn_gemm + moe_mlp)
        attn_tot_f = n_layers * attn_f
        attn_tot_b = n_layers * attn_b
        quant_f = (n_dense * (sa_f + sd_f) + n_moe * (sa_f + sm_f)) / co.hbm_bw
        quant_b = (n_dense * (sa_b + sd_b) + n_moe * (sa_b + sm_b)) / co.hbm_bw
    elem_tot_f = n_layers * elem_f
    # Chunked scans of the recurrent mixers (GEMM-class, 16-bit); backward 2x forward.
    scan_tot_f = n_layers * scan_f
    perm_f = n_moe * moe_elem
    # LM head + loss on the last stage (vocab-parallel over tp). Megatron's output layer is a
    # tensor_parallel.ColumnParallelLinear, not a TE module, so it runs in bf16 under every FP8/FP4
    # recipe (the NVFP4 paper keeps the output head in bf16 too).
    head_peak = np.where(is_low, bf16_peak, peak)
    head_eff = np.where(is_low, co.gemm_eff["bf16"], geff)
    head_f = gemm_time(
        co, head_peak, head_eff, T, model.vocab / tp, h, elem, np.where(is_low, co.gemm_half_dim, ghd)
    )
    head_f = head_f + T * model.vocab / tp * 4.0 * 2 / co.hbm_bw
    head_f = np.where(head, head_f, 0.0)
    gemm_f = gemm_f + head_f

    fwd = gemm_f + attn_tot_f + scan_tot_f + elem_tot_f + perm_f + quant_f
    wgrad = 0.0 if frozen_weights else 1.0  # weight-gradient GEMMs, as many FLOPs as the forward
    bwd = (1.0 + wgrad) * gemm_f + attn_tot_b + 2.0 * scan_tot_f + 2.0 * elem_tot_f + perm_f + quant_b
    # Selective modes recompute in backward what they dropped (memory.activation_bytes_per_layer):
    # the attention core; + norm_act: the two norms, the routed experts' activation and MLA's
    # up-projection GEMMs (+ RoPE); + norm_act_mlp: the dense MLP's and shared experts' forward.
    drop_core, drop_norm, drop_mlp = recompute_drops(rec)
    n_norms = (hybrid.mix(model).mixer_sub + hybrid.mix(model).ffn_sub) if model.is_hybrid else 2.0
    norm_rec = T * elem * (n_norms * 2 * h / sp_div) / co.hbm_bw
    # MLA up-projections and the RoPE on q and k that follows them
    up_rec = gemms["attn_up"] + (
        T * elem * 2 * (a + g) * model.qk_head_dim / tp / co.hbm_bw if model.is_mla else 0.0
    )

    def act_time(F):  # noqa: E306
        return T * elem * act_mult * F / tp / co.hbm_bw

    moe_act_rec = act_time(model.moe_ffn_hidden * model.moe_topk) if model.is_moe else np.zeros(n)
    dense_act = act_time(model.ffn_hidden) if model.ffn_hidden else 0.0
    shared_f = gemms["shared"] + (act_time(model.shared_expert_ffn) if model.is_moe else 0.0)
    na_layer = norm_rec + up_rec
    na_rec = n_layers * na_layer + n_moe * moe_act_rec
    mlp_rec = n_dense * (dense_mlp + dense_act) + n_moe * shared_f
    recompute = np.where(
        rec == REC_FULL,
        fwd - head_f,
        np.where(drop_core, attn_tot_f, 0.0)
        + np.where(drop_norm, na_rec, 0.0)
        + np.where(drop_mlp, mlp_rec, 0.0),
    )
    overhead = co.kernel_overhead_s * n_layers

    # ---- TP / SP (Megatron: 2 all-reduces fwd + 2 bwd per layer; RS+AG with SP: same bytes) -------
    tp_bytes = T * h * elem
    tp_one = C.all_reduce(links, tp_bytes, tp, np.ones(n)) + np.where(
        tp > 1, co.tp_collective_overhead_s, 0.0
    )
    # Recomputed forwards repeat their TP collectives: the whole layer's two (full) or the dense
    # MLP's one all-reduce (AG + RS under SP) when norm_act_mlp recomputes the MLP.
    per_layer = 4.0 + np.where(rec == REC_FULL, 2.0, np.where(drop_mlp, 1.0, 0.0))
    # A MoE layer has no TP all-gather/reduce-scatter around its routed experts (the dispatcher
    # routes the sequence-parallel share): attention keeps its two, shared experts add two. The
    # expert-TP group instead all-gathers the received copies before the expert GEMMs and
    # reduce-scatters after (fwd AG+RS, bwd RS+AG; recomputed forward adds one more AG+RS).
    moe_tp_coll = per_layer * (0.5 + (0.5 if model.shared_expert_ffn else 0.0))
    tp_raw = (n_dense * per_layer + n_moe * moe_tp_coll) * tp_one
    if model.is_hybrid:
        # Per sublayer one collective forward and one backward (+1 when full recompute reruns the
        # forward; +1 for the dense MLP and shared experts that norm_act_mlp recomputes). Every mixer
        # of the block counts (attention and Falcon-H1's parallel Mamba each have their own
        # row-parallel output: an upper bound where a stack fuses them).
        full_ = np.where(rec == REC_FULL, 1.0, 0.0)
        ffn_c = 2.0 + np.where(rec == REC_FULL, 1.0, np.where(drop_mlp, 1.0, 0.0))
        mixers = mx.attn + mx.linear + mx.mamba
        tp_raw = (
            n_layers * mixers * (2.0 + full_)
            + n_dense * ffn_c
            + n_moe * (ffn_c if model.shared_expert_ffn else 0.0)
        ) * tp_one
        xproj = hybrid.mamba1_xproj_elems(model)
        if xproj:  # Mamba1's row-parallel x_proj: an all-reduce forward (and in a recomputed forward)
            tp_raw = tp_raw + n_layers * (1.0 + full_) * (
                C.all_reduce(links, T * xproj * elem, tp, np.ones(n))
                + np.where(tp > 1, co.tp_collective_overhead_s, 0.0)
            )
    if model.is_moe:
        etp_bytes = moe.expert_rows_per_rank(model, T, sp_div, etp) * h * elem
        etp_one = C.all_gather(links, etp_bytes, etp, np.ones(n))
        routed_colls = 4.0 + np.where(rec == REC_FULL, 2.0, 0.0)  # routed experts: never partly recomputed
        tp_raw = tp_raw + n_moe * routed_colls * etp_one
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
        sp_on = lay.dims.sp_divisor > 1
        dgrad_qkv = gt(T, h, (a * model.qk_head_dim + 2 * g * model.qk_head_dim) / tp)
        dgrad_fc1 = gt(T, h, up_mult * model.ffn_hidden / tp) if model.ffn_hidden else np.zeros(n)
        regather = n_dense * (
            np.maximum(ag_one - dgrad_qkv, 0.0) + np.maximum(ag_one - dgrad_fc1, 0.0)
        ) + n_moe * np.maximum(ag_one - dgrad_qkv, 0.0)
        if model.is_hybrid:
            rec_mix = mx.linear + mx.mamba
            dgrad_mix = gt(T, h, w_in / max(rec_mix, 1e-12) / tp) if rec_mix else np.zeros(n)
            regather = (
                n_layers * (mx.attn * np.maximum(ag_one - dgrad_qkv, 0.0))
                + n_layers * rec_mix * np.maximum(ag_one - dgrad_mix, 0.0)
                + n_dense * np.maximum(ag_one - dgrad_fc1, 0.0)
            )
        regather = np.where(sp_on, regather, 0.0)
        tp_raw = tp_raw + regather
        tp_comm = tp_comm + regather
    # ---- CP ring attention: (c-1) KV chunks per layer fwd, 2x bwd; hidden behind attention -------
    # Megatron-Core/TE ring attention (cp_comm_type "p2p", AttnFuncWithCPAndKVP2P): each of the c-1
    # steps sends the rank's KV to the next rank while the attention of the chunk in hand runs; the
    # backward passes KV and dKV. Causal load balancing (rank i holds chunks i and 2c-1-i) gives every
    # rank s_loc·s/2 of the causal work, the FLOPs of attn_fwd.
    kv_elems = (model.kv_lora_rank + model.qk_rope_head_dim) if model.is_mla else 2 * g * model.head_dim
    cp_chunk = mb * s_loc * kv_elems * elem / np.where(model.is_mla, 1.0, tp)
    bw_cp, _ = C.bus_bandwidth(links, cp, tp)
    attn_blocks = n_layers * (hybrid.mix(model).attn if model.is_hybrid else 1.0)
    cp_bytes = np.where(cp > 1, 3.0 * (cp - 1.0) * cp_chunk, 0.0) * attn_blocks
    cp_raw = cp_bytes / bw_cp
    cp_comm = np.maximum(cp_raw - (attn_tot_f + attn_tot_b), 0.0)
    # What the hidden ring costs the attention it overlaps: the exchange is an NCCL send/recv pair
    # ("Point-to-point communications of KV and dKV", flash_attn_p2p_communicate, TE
    # dot_product_attention/context_parallel.py): a copy with no reduction, on a couple of channels
    # (CTAs) of the GPU's SMs. Its interference is the HBM traffic of reading every chunk it sends and
    # writing every chunk it receives, not the calibrated overlap_contention, which prices the
    # reducing, many-channel TP/DP/EP collectives (no CP row informed that fit).
    # Bytes of the hidden part: its seconds at the ring's bus rate.
    cp_contention = 2.0 * (cp_raw - cp_comm) * bw_cp / co.hbm_bw
    # ---- EP all-to-all: dispatch + combine, fwd and bwd, per MoE layer ----------------------------
    # Over the EP group (ep ranks placed etp apart, Megatron's expert order etp, ep, edp), each
    # rank sends its T/sp * k copies of h (16-bit; fp32 when training in fp32). DeepEP / HybridEP
    # send a token once per destination rank in the node and once per destination node across. With the EP-overlap schedule the all-to-all of one
    # micro-batch hides behind the other direction's compute of its partner micro-batch.
    if model.is_moe:
        a2a_bytes = moe.dispatch_bytes(model, T, sp_div, elem)
        deepep = opts.dispatcher == "deepep"
        share = moe.deepep_internode_share(model, ep, etp, links.devices_per_node) if deepep else 1.0
        share_in = moe.deepep_intranode_share(model, ep) if deepep else 1.0
        a2a_one = C.all_to_all(links, a2a_bytes, ep, etp, inter_share=share, intra_share=share_in)
        n_a2a = 4.0 + np.where(rec == REC_FULL, 2.0, 0.0)  # recomputed forward dispatches again
        ep_raw = n_moe * n_a2a * a2a_one
        if opts.a2a_overlap:
            # fwd all-to-all behind the partner's backward compute and vice versa; only micro-batches
            # of the 1F1B steady state have a partner (Megatron refuses it with full recompute).
            fwd_a2a = n_moe * 2.0 * a2a_one
            bwd_a2a = ep_raw - fwd_a2a
            can = (rec != REC_FULL) * moe.paired_fraction(lay["pp"], lay["grad_accum"])
            ep_hidden = can * (np.minimum(fwd_a2a, bwd) + np.minimum(bwd_a2a, fwd))
        else:
            ep_hidden = np.zeros(n)
    else:
        ep_raw = np.zeros(n)
        ep_hidden = np.zeros(n)
    ep_comm = ep_raw - ep_hidden + co.overlap_contention * ep_hidden

    slot = fwd + bwd + recompute + overhead + tp_comm + cp_comm + ep_comm  # one micro-batch, whole stage
    contention_mb = cp_contention
    slot = slot + contention_mb
    # Host floor: the host enqueues every kernel (asynchronously, so its time hides while the GPU
    # is busier); a stage cannot run a micro-batch faster than its layers' launches. Full
    # recompute relaunches the forward, a third of the forward + backward kernels.
    relaunch = np.where(rec == REC_FULL, 4.0 / 3.0, 1.0)
    launches = profile.kernels_per_layer * n_layers * relaunch
    host_wait = np.maximum(launches * profile.launch_latency_us * 1e-6 - slot, 0.0)
    # A dropless MoE layer is host-bound where it has many local experts: the grouped expert GEMMs
    # launch one GEMM per local expert (TE GroupedLinear: fc1 and fc2 forward, their data and weight
    # gradients backward: 6 per expert), and the host learns the tokens per expert only through a
    # device-to-host copy in the layer (the dispatcher's tokens_per_expert), so it cannot run ahead
    # and the GPU waits for those launches (NVIDIA, DeepSeek-V3 training on GB200 NVL72: MoE layers
    # CPU-bound). co.moe_host_factor (fitted) scales the stack's launch cost for them. (A fused grouped
    # MLP under a full-iteration CUDA graph, e.g. Megatron-Bridge's cutedsl_fused_grouped_mlp, has none:
    # not modelled.)
    if model.is_moe:
        local_experts = model.num_experts / ep
        expert_launches = MOE_LAUNCHES_PER_EXPERT * local_experts * relaunch
        moe_host = n_moe * expert_launches * profile.launch_latency_us * 1e-6 * co.moe_host_factor
    else:
        moe_host = np.zeros(n)
    host_wait = host_wait + moe_host
    slot = slot + host_wait
    head_slot = (2.0 + wgrad) * head_f
    parts = {
        "gemm": (2.0 + wgrad) * gemm_f,
        # The mixer cores: attention, and the chunked scans of Mamba2 / Gated DeltaNet blocks.
        "attention": attn_tot_f + attn_tot_b + 3.0 * scan_tot_f,
        # Launch/sync costs (the calibrated per-layer overhead and the host floor's wait) with the
        # memory-bound work: neither is a FLOP.
        "elementwise": 3.0 * elem_tot_f
        + 2.0 * perm_f
        + quant_f
        + quant_b
        + overhead
        + contention_mb
        + host_wait,
        "recompute": recompute,
        "tp_comm": tp_comm,
        "cp_comm": cp_comm,
        "ep_comm": ep_comm,
    }
    parts.update(
        slot=slot,
        head_slot=head_slot,
        fwd=fwd,
        bwd=bwd,
        wgrad=wgrad * gemm_f,  # the weight-gradient GEMMs (zero-bubble schedules defer them)
        # the recurrent mixers' share of "gemm" (projections) and of "attention" (chunked scans)
        mixer_gemm=(2.0 + wgrad) * n_layers * mixer_g,
        scan=3.0 * scan_tot_f,
        n_layers=n_layers,
        tp_raw=tp_raw,
        tp_exposed=tp_raw * (1.0 - tp_ov),
        cp_raw=cp_raw,
        ep_raw=ep_raw,
        ep_exposed=ep_raw - ep_hidden,
    )
    return parts


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
    st = stage_shape(model, lay)
    n = len(lay)

    def slot(n_dense, n_moe, head):
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
        )

    # The first, one middle (all middle stages hold the same layers) and the last stage; with
    # pp = 1 the first stage is the last and runs the LM head.
    # V-shaped schedules (ZB-V, DualPipeV) place the first and the last model chunk on rank 0,
    # so the LM head runs there.
    v_shape = schedule in V_SHAPED
    first = slot(st.first_dense, st.first_moe, (pp == 1) | v_shape)
    last = slot(st.last_dense, st.last_moe, np.full(n, not v_shape))
    mid = slot(st.mid_dense, st.mid_moe, np.zeros(n, dtype=bool))
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
