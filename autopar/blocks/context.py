"""What every block module needs to cost one micro-batch on one pipeline stage, per layout row.

:func:`slot_context` reads a :class:`LayoutTable` once: the degrees, tokens per rank, the GEMM
precision's peak, efficiency, half-dimension and block-scaling bytes, the activation element size,
the attention kernel's rate and the recompute mode. The block modules take a :class:`SlotContext`
and return numpy arrays over the rows (the exhaustive search scores arrays of layouts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar import precision as P
from autopar.layout import PRECISION_CODES, RECOMPUTE_CODES, RECOMPUTE_MODULES, LayoutTable

ACT_BYTES = 2.0
FP32_BYTES = 4.0  # fp32 training (e.g. the CPU reference runs): activations, gradients and wire bytes
# Attention kernel speed without a causal mask over with one (the off-diagonal steps of ring CP):
# Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608) Fig. 5, H100 head dim 128, forward at 16k:
# cuDNN 595 vs 539 TFLOP/s, FlashAttention-2 370 vs 335 (1.10 both).
NONCAUSAL_ATTENTION_SPEEDUP = 1.10
REC_NONE, REC_FULL = RECOMPUTE_CODES.index("none"), RECOMPUTE_CODES.index("full")
# Codes of the selective modes whose Megatron module set recomputes each group of tensors
# (autopar.layout.RECOMPUTE_MODULES): "layernorm" comes with moe_act and mla_up_proj, "mlp" with
# shared_experts; core_attn is in every one of them.
_NORM_CODES = [RECOMPUTE_CODES.index(m) for m, mods in RECOMPUTE_MODULES.items() if "layernorm" in mods]
_MLP_CODES = [RECOMPUTE_CODES.index(m) for m, mods in RECOMPUTE_MODULES.items() if "mlp" in mods]


def recompute_drops(recompute: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(attention core, norm/activation/up-projection outputs, MLP intermediates) recomputed by
    each row's selective mode (all False for none; full recompute is handled on its own)."""
    rec = np.asarray(recompute)
    return rec != REC_NONE, np.isin(rec, _NORM_CODES), np.isin(rec, _MLP_CODES)


# The max-achievable-matmul (MAMF) efficiencies are measured on large square GEMMs of this size.
MAMF_REFERENCE_DIM = 16384.0


def gemm_time(
    co: Any,
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


@dataclass(frozen=True)
class SlotContext:
    """Per-row arrays of one stage's micro-batch (``n`` rows) and the functions that time GEMMs."""

    n: int
    co: Any  # autopar.latency.Coefficients
    links: Any  # autopar.collectives.Links
    profile: Any  # autopar.frameworks.FrameworkProfile
    seq_len: float
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    mb: np.ndarray
    n_mb: np.ndarray  # micro-batches per step (block-scaling amortizes weight casts over them)
    rec: np.ndarray  # recompute code
    full: np.ndarray  # full recompute
    drop_core: np.ndarray  # selective recompute groups (autopar.memory.recompute_drops)
    drop_norm: np.ndarray
    drop_mlp: np.ndarray
    s_loc: np.ndarray  # sequence per CP rank
    T: np.ndarray  # tokens per rank per micro-batch (before SP sharding)
    sp_div: np.ndarray  # sequence-parallel divisor (tp with SP, else 1)
    peak: np.ndarray  # GEMM peak of the row's precision
    geff: np.ndarray  # its large-GEMM efficiency
    ghd: np.ndarray  # its GEMM half-dimension
    quant_bpe: np.ndarray  # block-scaling bytes per quantized GEMM-input element
    bf16_peak: Any
    is_fp8: np.ndarray
    is_low: np.ndarray  # 8-/4-bit GEMM recipes
    is_fp32: np.ndarray
    elem: np.ndarray  # bytes per activation element
    attn_peak: np.ndarray  # attention's matmul peak (bf16, or fp32 for fp32 training)
    attn_speed: float  # fused-attention speed-up of the stack's kernel
    ring: np.ndarray  # ring-CP attention time factor (off-diagonal steps run unmasked)

    def gt(self, M, N, K) -> np.ndarray:
        """One linear GEMM at the row's precision (``autopar.latency.gemm_time``)."""
        return gemm_time(self.co, self.peak, self.geff, M, N, K, self.elem, self.ghd)

    def gt16(self, M, N, K) -> np.ndarray:
        """One 16-bit matmul inside a mixer core (chunked scans: never FP8)."""
        co = self.co
        geff = np.where(self.is_fp32, co.gemm_eff.get("fp32", co.gemm_eff["bf16"]), co.gemm_eff["bf16"])
        return gemm_time(co, self.attn_peak, geff, M, N, K, self.elem)

    def scale_fwd(self, M, N, K) -> np.ndarray:
        """Block-scaling bytes of one GEMM's forward inputs (``autopar.precision.scaling_bytes``)."""
        return P.scaling_bytes(self.quant_bpe, M, N, K, self.n_mb)[0]

    def scale_bwd(self, M, N, K) -> np.ndarray:
        """Block-scaling bytes of one GEMM's backward input (dY)."""
        return P.scaling_bytes(self.quant_bpe, M, N, K, self.n_mb)[1]

    def traffic_s(self, elems_per_token) -> np.ndarray:
        """Seconds of memory-bound traffic of ``elems_per_token`` activation elements per token."""
        return self.T * self.elem * elems_per_token / self.co.hbm_bw


def slot_context(lay: LayoutTable, *, seq_len: float, co, links, profile) -> SlotContext:
    """The :class:`SlotContext` of every row of ``lay``."""
    n = len(lay)
    prec_code = lay["precision"]
    # Per-precision GEMM peak and efficiency (attention and elementwise stay bf16: FP8 recipes
    # only run GEMMs in FP8, data README caveat 2; the block-scaled keys: autopar.precision).
    peak = np.empty(n)
    geff = np.empty(n)
    quant_bpe = np.zeros(n)
    ghd = np.full(n, co.gemm_half_dim)
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
    # Bytes per activation/gradient element: 16-bit, except fp32 training, whose activations,
    # gradients and communication are fp32 and whose attention runs at the fp32 rate.
    is_fp32 = prec_code == PRECISION_CODES.index("fp32")
    cp = lay["cp"].astype(np.float64)
    mb = lay["micro_batch"].astype(np.float64)
    s_loc = seq_len / cp
    rec = lay["recompute"]
    drop_core, drop_norm, drop_mlp = recompute_drops(rec)
    return SlotContext(
        n=n,
        co=co,
        links=links,
        profile=profile,
        seq_len=float(seq_len),
        tp=lay["tp"].astype(np.float64),
        cp=cp,
        ep=lay["ep"].astype(np.float64),
        etp=lay["etp"].astype(np.float64),
        mb=mb,
        n_mb=lay["grad_accum"].astype(np.float64),
        rec=rec,
        full=rec == REC_FULL,
        drop_core=drop_core,
        drop_norm=drop_norm,
        drop_mlp=drop_mlp,
        s_loc=s_loc,
        T=mb * s_loc,
        sp_div=lay.dims.sp_divisor.astype(np.float64),
        peak=peak,
        geff=geff,
        ghd=ghd,
        quant_bpe=quant_bpe,
        bf16_peak=bf16_peak,
        is_fp8=prec_code == PRECISION_CODES.index("fp8"),
        is_low=np.isin(prec_code, [PRECISION_CODES.index(p) for p in P.LOW_PRECISION]),
        is_fp32=is_fp32,
        elem=np.where(is_fp32, FP32_BYTES, ACT_BYTES),
        attn_peak=np.where(is_fp32, co.peak("fp32"), bf16_peak),
        # Transformer Engine's attention runs cuDNN's fused kernel where the device has one faster
        # than FlashAttention-2 (sm90+; autopar.frameworks, "Attention kernel"); attention_eff is FA2's.
        attn_speed=co.fused_attention_speedup if profile.attention == "te" else 1.0,
        # Under load-balanced ring CP only the first of the c steps (the rank's own KV) is a causal
        # kernel; the c-1 others attend one half-chunk to the other without a mask (TE
        # AttnFuncWithCPAndKVP2P: step i <= rank all of Q on the first half of KV, else the second
        # half of Q on all of KV), each s_loc·s_loc/2 of the rank's s_loc·s/2 work. An unmasked
        # kernel has no diagonal tiles to mask and no uneven work per CTA: Shah et al. 2024 (arXiv
        # 2407.08608) Fig. 5, H100 head dim 128 at 16k, forward non-causal / causal = 595/539
        # (cuDNN) and 370/335 (FA2), 1.10.
        ring=np.where(cp > 1, 1.0 / cp + (1.0 - 1.0 / cp) / NONCAUSAL_ATTENTION_SPEEDUP, 1.0),
    )
