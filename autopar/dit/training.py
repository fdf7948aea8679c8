"""DiT training on a layout: step time, tokens/s, MFU and memory per device, vectorized over layouts.

Layout: FSDP (ZeRO-3) data parallelism over ``dp`` ranks, or HSDP (shard inside groups of ``shard``
ranks, replicate across them), Ulysses x ring sequence/context parallelism, TP, full
recomputation. A step runs ``global_batch / dp`` samples per sequence-parallel group, one at a
time, each drawn from a bucket list of (height, width, frames, share) so mixed resolutions and frame
counts in one batch cost their mix. Per sample: forward + backward (2x the GEMMs, 2.5x the
FlashAttention forward, Dao 2023) + one more forward under recomputation, the exposed Ulysses/ring/TP
communication of each pass, and, unless latents are precomputed, the VAE encode and text encode of
the sample on every rank of its group (as Open-Sora's loaders do). FSDP all-gathers the bf16 weights
in forward and backward and reduce-scatters the gradients, overlapped with compute (exposed: what
exceeds it). Memory: bf16 weights + bf16 grads + fp32 master and Adam moments (16 B/param) / shard,
activations 34 x hidden bytes per token per block without recomputation (Korthikanti et al. 2022,
flash attention: no s^2 term) or the block inputs (2 x hidden) plus one block's with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar import collectives as C
from autopar.dit.costs import BF16, DiTCoefficients, engine_context, forward_time
from autopar.dit.spec import DiTSpec
from autopar.errors import AutoparError, InfeasibleError

TRAIN_KEYS = ("dp", "shard", "ulysses", "ring", "tp", "recompute")
BYTES_PER_PARAM_STATE = 16.0  # bf16 weight + bf16 grad + fp32 master + 2 fp32 Adam moments (ZeRO)
ACT_BYTES_PER_HIDDEN = 34.0  # Korthikanti et al. 2022 eq. 2 with flash attention (per token, per block)
ATTN_BWD_OVER_FWD = 2.5  # FlashAttention-2 backward ~2.5x the forward's time (Dao 2023 Fig. 4-5)


@dataclass(frozen=True)
class Bucket:
    height: int
    width: int
    frames: int
    share: float = 1.0


@dataclass(frozen=True)
class DiTTraining:
    """The training workload: buckets, global batch (samples) and options."""

    buckets: tuple[Bucket, ...]
    global_batch: int
    precomputed_latents: bool = False  # VAE/text features cached on disk (no online encode)
    compiled: bool = False


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(spec: DiTSpec, n: int, work: DiTTraining) -> dict[str, np.ndarray]:
    out = []
    toks = [spec.tokens(b.height, b.width, b.frames) for b in work.buckets]
    for tp in _divisors(n):
        if spec.heads % tp:
            continue
        for u in _divisors(n // tp):
            if (spec.heads // tp) % u:
                continue
            for r in _divisors(n // tp // u):
                dp = n // tp // u // r
                if any(t % (u * r) for t in toks) or work.global_batch % dp:
                    continue
                for shard in _divisors(dp):
                    for rec in (0, 1):
                        out.append((dp, shard, u, r, tp, rec))
    if not out:
        raise InfeasibleError(
            f"no legal training layout of {n} devices for {spec.id}",
            "the global batch must split over dp, heads over tp x ulysses and tokens over ulysses x ring",
        )
    a = np.array(out, dtype=np.int64)
    return {k: a[:, i] for i, k in enumerate(TRAIN_KEYS)}


def single_layout(lay: dict[str, int], n: int) -> dict[str, np.ndarray]:
    unknown = set(lay) - set(TRAIN_KEYS)
    if unknown:
        raise AutoparError(f"unknown layout key {sorted(unknown)[0]!r}", f"keys: {', '.join(TRAIN_KEYS)}")
    full = {k: int(lay.get(k, 1 if k != "recompute" else 0)) for k in TRAIN_KEYS}
    if "dp" not in lay:
        full["dp"] = n // (full["ulysses"] * full["ring"] * full["tp"])
    if "shard" not in lay:
        full["shard"] = full["dp"]
    prod = full["dp"] * full["ulysses"] * full["ring"] * full["tp"]
    if prod != n:
        raise AutoparError(
            f"dp {full['dp']} x ulysses {full['ulysses']} x ring {full['ring']} x tp {full['tp']} = {prod}, not {n} devices",
            "make the degrees multiply to the device count",
        )
    if full["dp"] % full["shard"]:
        raise AutoparError(
            f"FSDP shard group {full['shard']} does not divide dp {full['dp']}",
            "pick a shard group dividing dp (HSDP)",
        )
    return {k: np.array([v], dtype=np.int64) for k, v in full.items()}


def predict(
    spec: DiTSpec,
    device,
    num_devices: int,
    work: DiTTraining,
    layouts: dict[str, np.ndarray],
    *,
    devices_per_node: int | None = None,
    dc: DiTCoefficients | None = None,
    memory_headroom: float = 0.05,
) -> dict[str, np.ndarray]:
    co, links, dc = engine_context(device, num_devices, devices_per_node, dc)
    dp, shard, u, r = layouts["dp"], layouts["shard"], layouts["ulysses"], layouts["ring"]
    tp, rec = layouts["tp"], layouts["recompute"]
    shares = np.array([b.share for b in work.buckets], dtype=np.float64)
    shares = shares / shares.sum()
    peak = co.peak("bf16")
    geff = co.gemm_eff.get("bf16", 0.8)

    per_sample = np.zeros(dp.shape)
    fwd_compute = np.zeros(dp.shape)
    tokens = 0.0
    model_flops = 0.0
    act_peak = np.zeros(dp.shape)
    parts: dict[str, np.ndarray] = {}
    for bk, w in zip(work.buckets, shares, strict=True):
        f = forward_time(
            spec, co, dc, links, height=bk.height, width=bk.width, frames=bk.frames, batch=np.ones(dp.shape),
            tp=tp, ulysses=u, ring=r, layer_share=np.ones(dp.shape), patches=np.ones(dp.shape), compiled=work.compiled,
        )  # fmt: skip
        comm = f["ulysses_comm"] + f["ring_comm"] + f["tp_comm"]
        fwd = f["gemm"] + f["attention"] + f["elementwise"] + f["host_bound"]
        bwd = 2.0 * f["gemm"] + ATTN_BWD_OVER_FWD * f["attention"] + 2.0 * f["elementwise"] + f["host_bound"]
        t = fwd + bwd + rec * fwd + (2.0 + rec) * comm
        enc = 0.0
        if not work.precomputed_latents:
            enc = spec.vae.encode_flops(bk.frames, bk.height, bk.width) / (peak * dc.vae_conv_eff)
            enc += sum(e.flops() for e in spec.text_encoders) / (peak * geff)
        per_sample = per_sample + w * (t + enc)
        fwd_compute = fwd_compute + w * (3.0 + rec) * (f["gemm"] + f["attention"])
        n_tok = spec.tokens(bk.height, bk.width, bk.frames)
        tokens += w * n_tok
        fl = spec.forward_flops(bk.height, bk.width, bk.frames)
        model_flops += w * 3.0 * (fl["gemm"] + fl["attention"])
        for k, v in f.items():
            parts[k] = parts.get(k, 0.0) + w * v
        blocks = spec.blocks
        local = n_tok / (u * r)
        full = ACT_BYTES_PER_HIDDEN * spec.hidden / tp * local
        act = np.where(rec > 0, blocks * 2.0 * spec.hidden * local * BF16 + full, blocks * full)
        act_peak = np.maximum(act_peak, act)

    samples = work.global_batch / dp  # per sequence-parallel group, one after another
    compute = samples * per_sample
    # FSDP/HSDP: all-gather weights (fwd, bwd, + recompute fwd) and reduce-scatter grads within the
    # shard group; HSDP all-reduces the sharded grads across replicas. Per micro-sample steps
    # the gathers repeat (no_reshard_after_forward is not assumed).
    wbytes = spec.trainable_params * BF16 / tp  # a stored buffer (SD3's position table) is not sharded
    gathers = (2.0 + rec) * samples
    ag = C.all_gather(links, wbytes, shard, u * r * tp)
    rs = C.reduce_scatter(links, wbytes, shard, u * r * tp)
    rep = dp // shard
    ar = C.all_reduce(links, wbytes / shard, rep, shard * u * r * tp)
    fsdp = gathers * ag + rs + ar
    exposed = np.maximum(fsdp - compute, 0.0) + np.where(shard > 1, ag, 0.0)  # the first gather is exposed
    optimizer = spec.trainable_params * BYTES_PER_PARAM_STATE / (tp * shard) * 2.0 / co.hbm_bw
    step = compute + exposed + optimizer

    tokens_step = work.global_batch * tokens
    state = spec.trainable_params * BYTES_PER_PARAM_STATE / (tp * shard) + spec.buffer_params * BF16
    gathered = 2.0 * spec.trainable_params * BF16 / tp / np.maximum(spec.blocks, 1)  # two blocks in flight
    memory = state + gathered + act_peak + 1.0e9
    return {
        "step_time_s": step,
        "compute_s": compute,
        "fsdp_exposed_s": exposed,
        "optimizer_s": np.broadcast_to(optimizer, step.shape).astype(float),
        **{f"fwd_{k}_s": np.asarray(v) * 1.0 for k, v in parts.items()},
        "tokens_per_s_per_device": tokens_step / step / num_devices,
        "samples_per_s": work.global_batch / step,
        "mfu": work.global_batch * model_flops / (step * num_devices * peak),
        "memory_bytes": memory,
        "activation_bytes": act_peak,
        "fits": memory <= (1.0 - memory_headroom) * device.memory_bytes,
    }


def search(
    spec: DiTSpec, device, num_devices: int, work: DiTTraining, *, top: int = 5
) -> list[dict[str, Any]]:
    lays = enumerate_layouts(spec, num_devices, work)
    pred = predict(spec, device, num_devices, work, lays)
    ok = pred["fits"]
    if not ok.any():
        i = int(np.argmin(pred["memory_bytes"]))
        raise InfeasibleError(
            f"no training layout of {num_devices} x {device.id} fits {spec.id}: the smallest needs "
            f"{pred['memory_bytes'][i] / 1e9:.1f} GB per device",
            "add devices, sequence parallelism, or smaller buckets",
        )
    order = [int(i) for i in np.argsort(-pred["tokens_per_s_per_device"], kind="stable") if ok[i]][:top]
    return [row(lays, pred, i) for i in order]


def row(lays: dict[str, np.ndarray], pred: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    """One layout's figures as plain JSON-ready values."""
    d: dict[str, Any] = {"layout": {k: int(lays[k][i]) for k in TRAIN_KEYS}}
    for k, v in pred.items():
        x = np.asarray(v).reshape(-1)
        d[k] = bool(x[i]) if x.dtype == bool else float(x[i] if x.size > 1 else x[0])
    return d
