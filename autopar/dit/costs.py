"""The per-device pieces every DiT layout is costed with: one forward of the transformer on a slice.

Shared by inference (``autopar.dit.inference``) and training (``autopar.dit.training``). Every function
takes numpy arrays over candidate layouts. Times come from the LLM path's engine: GEMMs by
:func:`autopar.latency.gemm_time` (device MAMF efficiency, tile falloff, HBM roofline), collectives
by :mod:`autopar.collectives` on the links the group spans; the DiT-specific coefficients
(:class:`DiTCoefficients`) are few, physical and shared by every device: the DiT attention kernels'
tensor-phase efficiency as a multiple of the LLM path's attention efficiency of the device, elementwise
passes per block (eager vs ``torch.compile``), host time per block and per SP operation, VAE conv
efficiency.

Attention time has two terms: the QK^T and PV matmuls on the tensor cores, and the softmax
exponentials on the special-function units (SFU), which FlashAttention-2 does not overlap with the
matmuls (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608 sec. 3.1: H100 SXM5 has 989 TFLOP/s of
matmul but 3.9 TFLOP/s of exponential; at head dim 128 the exponentials take ~50% of the matmul
cycles). One exponential per score element per head. This is why parts whose tensor rate is capped
for export (L20, H20) run attention at a far higher fraction of their datasheet peak than the H100:
their SFU rate is not capped, so the exponential term is small next to their slow matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from autopar import collectives as C
from autopar.dit.spec import DiTSpec, attention_flops
from autopar.errors import AutoparError
from autopar.hardware import sfu_exp_rate as sfu_rate  # exponentials per second (the softmax's term)
from autopar.latency import Coefficients, gemm_time

BF16 = 2.0
# FlashAttention tiles queries and keys in blocks of 128 (FA2/FA3 forward): a chunk of n tokens
# wastes up to one block; efficiency ~ n / (n + 128) per side (Dao 2023, arXiv 2307.08691 sec. 3).
ATTN_BLOCK = 128.0
# Ring attention merges each step's partial output into the running one with its log-sum-exp
# (yunchang ``update_out_and_lse``: sub, sigmoid, mul, sub, logsigmoid on fp32 out and lse): about
# 8 fp32 passes over the rank's output chunk per ring step (estimate from the op count).
RING_MERGE_PASSES = 8.0
# Ulysses (yunchang ``all_to_all_4D``): reshape + transpose + contiguous before every
# ``all_to_all_single`` and after it: two copies, each a read and a write of the rank's tensor.
ULYSSES_COPY_PASSES = 4.0
FP32 = 4.0
EXP_PER_SCORE = 1.0  # one exp per score element per head (online softmax, FA2 Algorithm 1)
ATT_TENSOR_MAX = 0.95


@dataclass(frozen=True)
class DiTCoefficients:
    """The DiT-specific coefficients of one device (fitted by ``studies/published_dit.py --fit``)."""

    attention_eff: float  # attention matmuls (QK^T, PV) at DiT shapes, fraction of bf16 dense peak
    sfu_flops: float  # exponentials per second (special-function units) for the softmax term
    elementwise_passes_eager: float  # d-wide bf16 activation reads+writes per token per block, eager
    elementwise_passes_compiled: float  # the same under torch.compile (fused norms/modulation/RoPE)
    host_per_block_eager_s: float  # host (Python + launch) time per block per forward, eager
    host_per_block_compiled_s: float  # the same under torch.compile
    host_per_ring_step_s: float  # host time of one ring-attention step (chunk kernel + LSE merge ops)
    host_per_a2a_s: float  # host time of one Ulysses all-to-all (reshape copies + NCCL launch)
    vae_conv_eff: float  # VAE convolutions, fraction of bf16 dense peak
    source: str


@lru_cache(maxsize=4)
def _dit_yaml(path: str | None) -> dict[str, Any]:
    from autopar.files import parse_yaml, read_text

    if path is None:
        text = (resources.files("autopar.cost_models") / "calibration" / "dit.yaml").read_text(
            encoding="utf-8"
        )
        where = "cost_models/calibration/dit.yaml"
    else:
        text = read_text(path, "DiT calibration file", "pass an existing DiT calibration YAML")
        where = path
    data = parse_yaml(text, where)
    if not isinstance(data, dict) or not isinstance(data.get("global"), dict):
        raise AutoparError(f"{where}: needs a 'global' block", "see cost_models/calibration/dit.yaml")
    need = {"attention_llm_ratio", "elementwise_passes_eager", "vae_conv_eff"} - set(data["global"])
    if need:
        raise AutoparError(
            f"{where}: 'global' lacks {sorted(need)[0]!r}", "see cost_models/calibration/dit.yaml"
        )
    return data


def dit_coefficients(device, path: str | None = None, co: Coefficients | None = None) -> DiTCoefficients:
    """The shipped DiT coefficients for ``device``: one set for every device. The attention matmuls run
    at ``attention_llm_ratio`` x the LLM path's attention efficiency of the device (its profile's,
    scaled by the LLM calibration's transfer ratio where never fitted: ``coefficients_for``), capped
    at 0.95; a ``devices`` entry in the YAML (a user's own calibration) overrides it. ``co``: the
    device's LLM-path coefficients when the caller already has them."""
    from autopar.coefficients import coefficients_for

    data = _dit_yaml(path)
    g = data["global"]
    dev = (data.get("devices") or {}).get(device.id)
    ratio = float(g["attention_llm_ratio"])
    if dev is not None and "attention_eff" in dev:
        att, src = float(dev["attention_eff"]), f"device override ({data.get('fitted_on', 'dit.yaml')})"
    else:
        co = co or coefficients_for(device)[0]
        att = co.forward_attention_eff * ratio
        src = f"LLM-path forward attention {co.forward_attention_eff:.3f} x DiT ratio {ratio:.3f}"
    return DiTCoefficients(
        attention_eff=min(att, ATT_TENSOR_MAX),
        sfu_flops=sfu_rate(device),
        elementwise_passes_eager=float(g["elementwise_passes_eager"]),
        elementwise_passes_compiled=float(g["elementwise_passes_compiled"]),
        host_per_block_eager_s=float(g["host_per_block_eager_us"]) * 1e-6,
        host_per_block_compiled_s=float(g["host_per_block_compiled_us"]) * 1e-6,
        host_per_ring_step_s=float(g["host_per_ring_step_us"]) * 1e-6,
        host_per_a2a_s=float(g["host_per_a2a_us"]) * 1e-6,
        vae_conv_eff=float(g["vae_conv_eff"]),
        source=src,
    )


def _arr(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def forward_time(
    spec: DiTSpec,
    co: Coefficients,
    dc: DiTCoefficients,
    links: C.Links,
    *,
    height: int,
    width: int,
    frames: int,
    batch: np.ndarray,
    tp: np.ndarray,
    ulysses: np.ndarray,
    ring: np.ndarray,
    layer_share: np.ndarray,
    patches: np.ndarray,
    compiled: bool,
    stride_base: np.ndarray | float = 1.0,
) -> dict[str, np.ndarray]:
    """One transformer forward on one device, by component (seconds).

    ``batch`` samples (a CFG pair counts 2); the sequence is split over ``ulysses x ring`` ranks, the
    weights over ``tp`` (Megatron column/row split, two all-reduces per block and stream) and
    ``layer_share`` of the blocks (PipeFusion stage); ``patches`` PipeFusion patches go through the
    stage one after another (smaller GEMMs and attention queries). Rank order: tp innermost, then
    Ulysses, then ring (xDiT's mesh), each group ``stride_base`` x the inner degrees apart.
    """
    b, tp, u, r = _arr(batch), _arr(tp), _arr(ulysses), _arr(ring)
    share, M = _arr(layer_share), _arr(patches)
    t, h, w = spec.token_grid(height, width, frames)
    s_img, s_txt = float(t * h * w), float(spec.text_tokens)
    sp = u * r
    s_ictx = float(spec.image_tokens)
    n_tok = {"img": s_img / sp, "txt": s_txt / sp, "joint": (s_img + s_txt) / sp, "ictx": s_ictx / sp}
    peak = co.peak("bf16")
    peak_a = np.asarray(peak)
    eff = np.asarray(co.gemm_eff.get("bf16", 0.8))

    gemm = np.zeros(np.broadcast(b, tp, sp, share, M).shape)
    for lin in spec.block_linears():
        rows = b * n_tok[lin.stream] / M
        # column-parallel layers split their output, row-parallel ones their input: same FLOPs
        one = gemm_time(co, peak_a, eff, rows, lin.n_out / tp, lin.k_in)
        gemm = gemm + one * M * lin.count * share

    attn = np.zeros_like(gemm)
    for a in spec.attentions():
        flops = b * a.count * share * attention_flops(a, s_img, s_txt, t, h * w, s_ictx) / (sp * tp)
        q_by = {
            "joint": s_img + s_txt,
            "self": s_img,
            "txt_self": s_txt,
            "cross": s_img,
            "cross_image": s_img,
            "linear": s_img,
        }
        kv_by = {
            "joint": s_img + s_txt,
            "self": s_img,
            "txt_self": s_txt,
            "cross": s_txt,
            "cross_image": s_ictx,
            "linear": s_img,
        }
        q_len, kv_len = q_by.get(a.kind, 0.0), kv_by.get(a.kind, 0.0)
        if a.kind == "spatial":
            q_len = kv_len = float(h * w)
        elif a.kind == "temporal":
            q_len = kv_len = float(t)
        # Ring splits both q and kv into r chunks; Ulysses keeps full length per head group;
        # PipeFusion queries one patch against the full (stale) key/value buffer.
        spread = a.kind in ("joint", "self", "txt_self", "linear")
        q = q_len / (r * M) if spread else q_len / M
        kv = kv_len / r if spread else kv_len
        if a.kind == "linear":  # ReLU linear attention: plain matmuls, no softmax
            attn = attn + flops / (peak * dc.attention_eff)
            continue
        fill = (q / (q + ATTN_BLOCK)) * (kv / (kv + ATTN_BLOCK))
        # matmuls on the tensor cores, then the exponentials (4 x head_dim matmul FLOPs per score)
        exps = EXP_PER_SCORE * flops / (4.0 * a.head_dim)
        attn = attn + flops / (peak * dc.attention_eff * fill) + exps / dc.sfu_flops

    # elementwise (norms, modulation, gates, RoPE, activations): replicated across TP ranks
    passes = dc.elementwise_passes_compiled if compiled else dc.elementwise_passes_eager
    blocks = spec.blocks * share
    tok_all = b * (n_tok["img"] + (n_tok["txt"] if spec.joint_stream else 0.0))
    # Z-Image's refiners run on the image tokens or on the caption tokens alone
    tok_blocks = (spec.layers + spec.single_layers) * tok_all
    tok_blocks = tok_blocks + b * (
        spec.img_refiner_layers * n_tok["img"] + spec.txt_refiner_layers * n_tok["txt"]
    )
    elem = share * passes * tok_blocks * spec.hidden * BF16 / co.hbm_bw

    # communication, exposed (xDiT runs it on the compute stream)
    width_ = float(spec.inner)
    attn_ops = sum(
        a.count
        for a in spec.attentions()
        if a.kind in ("joint", "self", "txt_self", "linear", "spatial", "temporal")
    )
    tok_att = b * n_tok["joint" if spec.joint_stream else "img"]
    stride_u = _arr(stride_base) * tp
    a2a_bytes = tok_att * width_ / tp * BF16
    copies = np.where(u > 1, ULYSSES_COPY_PASSES * a2a_bytes / co.hbm_bw, 0.0)
    # four all-to-alls per attention: q, k, v in, the output back
    ulysses_t = 4.0 * (C.all_to_all(links, a2a_bytes, u, stride_u) + copies) * attn_ops * share
    # Ring: r-1 key/value hand-offs per attention, each overlapping one chunk of the attention.
    stride_r = stride_u * u
    # K and V of S/r tokens x width/(u tp), i.e. of tok_att tokens x width/tp
    kv_bytes = 2.0 * tok_att * width_ / tp * BF16
    hop = C.p2p(links, kv_bytes, inter=stride_r * r > links.devices_per_node, stride=stride_r, span=r)
    hidden_hop = np.maximum(0.0, hop - attn / (r * np.maximum(attn_ops * share, 1e-9)))
    merge = RING_MERGE_PASSES * tok_att * width_ / tp * FP32 / co.hbm_bw
    ring_t = np.where(r > 1, (r - 1.0) * (hidden_hop + merge) * attn_ops * share, 0.0)
    # TP: an all-reduce after attention and after the MLP of every stream (Megatron).
    streams = {"mmdit": 2.0, "asym": 2.0}.get(spec.arch, 1.0)
    ar_bytes = b * n_tok["img"] * spec.hidden * BF16
    n_ar = 2.0 * (spec.layers * streams + spec.single_layers + spec.refiner_blocks) * share
    tp_t = C.all_reduce(links, ar_bytes, tp, _arr(stride_base)) * n_ar

    # The host issues every kernel; the GPU never runs ahead of it: a forward takes at least the
    # host's time (eager PyTorch's per-op overhead is what caps FLUX's eager scaling in xDiT's table).
    per_block = dc.host_per_block_compiled_s if compiled else dc.host_per_block_eager_s
    sp_ops = (r - 1.0) * dc.host_per_ring_step_s + np.where(u > 1, 4.0 * dc.host_per_a2a_s, 0.0)
    host = blocks * M * per_block + M * sp_ops * attn_ops * share
    gpu = gemm + attn + elem + ulysses_t + ring_t + tp_t
    floor = np.maximum(host - gpu, 0.0)
    return {
        "gemm": gemm,
        "attention": attn,
        "elementwise": elem,
        "host_bound": floor,
        "ulysses_comm": ulysses_t,
        "ring_comm": ring_t,
        "tp_comm": tp_t,
    }


def engine_context(
    device, num_devices: int, devices_per_node: int | None, dc: DiTCoefficients | None
) -> tuple[Coefficients, C.Links, DiTCoefficients]:
    """What one DiT prediction runs on: the device's LLM-path coefficients, its links over the
    devices one scale-up domain holds, and the DiT coefficients (``dc``, else the shipped ones)."""
    from autopar.coefficients import coefficients_for

    co, link_eff = coefficients_for(device)
    links = C.Links.from_cluster(
        device, devices_per_node or min(num_devices, device.scale_up.domain), link_eff
    )
    return co, links, dc or dit_coefficients(device, co=co)
