"""Denoising inference of a DiT on a layout: latency per image/video, throughput, memory, energy.

latency = text encoding (prompt, and the negative prompt under CFG)
        + steps x (1 - cached share) x one step of the transformer on the layout
        + VAE decode (split over the ranks with xDiT's parallel VAE)
One step is one transformer forward of the per-device batch (a CFG pair is batch 2 unless split by
CFG parallelism) on ``(S + text) / (ulysses x ring)`` tokens, ``1 / tp`` of the weights and
``1 / pipefusion`` of the blocks (:func:`autopar.dit.costs.forward_time`). PipeFusion (Fang et al.
2024, arXiv 2405.14430) splits the image into patches that flow through the stages while attention
reads the previous step's (stale) keys/values of the other patches: the first ``warmup_steps`` run
synchronously (all stages in sequence), the pipeline fills once, then every step costs one stage's
pass over all patches. Layout legality is xDiT's (``xfuser/config/config.py`` ParallelConfig):
world = dp x cfg x pipefusion x ulysses x ring x tp, cfg in {1, 2} and only with CFG; plus the
kernels' rules: (heads / tp) % ulysses == 0 (yunchang's all-to-all splits heads), tokens % (ulysses x
ring) == 0, latent rows % patches == 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar import collectives as C
from autopar.dit.costs import BF16, DiTCoefficients, engine_context, forward_time
from autopar.dit.spec import DiTSpec
from autopar.errors import AutoparError, InfeasibleError

LAYOUT_KEYS = ("dp", "cfg", "pipefusion", "ulysses", "ring", "tp")
CUDA_CONTEXT_BYTES = 1.0e9  # CUDA context + NCCL buffers per process (estimate, as the LLM path's floor)
VAE_TILE = 256  # pixels: diffusers' default tile edge for video VAE tiling


@dataclass(frozen=True)
class Generation:
    """One generation request (the ``generation`` workload of :mod:`autopar.job`)."""

    height: int
    width: int
    frames: int
    steps: int
    batch: int = 1  # samples per prompt batch
    cfg: bool | None = None  # None: what the model needs (guidance-distilled models run without)
    cache_skip: float = 0.0  # share of steps whose transformer forward a TeaCache/FBCache reuses
    compiled: bool = False  # torch.compile
    parallel_vae: bool = False  # xDiT --use_parallel_vae: decode split over the DiT ranks
    warmup_steps: int = 1  # PipeFusion synchronous steps (xDiT RuntimeConfig.warmup_steps)
    offload_text_encoder: bool = False  # text encoders leave the GPU after encoding

    def guidance(self, spec: DiTSpec) -> bool:
        return spec.cfg if self.cfg is None else self.cfg


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(
    spec: DiTSpec, n: int, req: Generation, *, max_dp: int | None = None
) -> dict[str, np.ndarray]:
    """Every legal xDiT layout of exactly ``n`` devices, columnar."""
    tokens = spec.tokens(req.height, req.width, req.frames)
    _, rows, _ = spec.token_grid(req.height, req.width, req.frames)
    joint = tokens + (spec.text_tokens if spec.joint_stream else 0)
    cfgs = (1, 2) if req.guidance(spec) else (1,)
    blocks = spec.blocks
    out: list[tuple[int, ...]] = []
    for dp in _divisors(n):
        if max_dp is not None and dp > max_dp:
            continue
        for cfg in cfgs:
            if (n // dp) % cfg:
                continue
            rest = n // dp // cfg
            for pf in _divisors(rest):
                if pf > blocks or (pf > 1 and rows % pf):
                    continue
                for tp in _divisors(rest // pf):
                    if spec.heads % tp:
                        continue
                    for u in _divisors(rest // pf // tp):
                        r = rest // pf // tp // u
                        if (spec.heads // tp) % u or joint % (u * r) or tokens % (u * r):
                            continue
                        out.append((dp, cfg, pf, u, r, tp))
    if not out:
        raise InfeasibleError(
            f"no legal xDiT layout of {n} devices for {spec.id} at {req.width}x{req.height}x{req.frames}",
            f"heads {spec.heads} must split over tp x ulysses and {tokens} tokens over ulysses x ring; try another device count",
        )
    a = np.array(out, dtype=np.int64)
    return {k: a[:, i] for i, k in enumerate(LAYOUT_KEYS)}


def check_layout(spec: DiTSpec, n: int, req: Generation, lay: dict[str, int]) -> None:
    """Refuse an illegal layout with one line naming the rule it breaks."""
    unknown = set(lay) - set(LAYOUT_KEYS)
    if unknown:
        raise AutoparError(f"unknown layout key {sorted(unknown)[0]!r}", f"keys: {', '.join(LAYOUT_KEYS)}")
    full = {k: int(lay.get(k, 1)) for k in LAYOUT_KEYS}
    prod = int(np.prod(list(full.values())))
    if prod != n:
        terms = " x ".join(f"{k} {v}" for k, v in full.items())
        raise AutoparError(
            f"layout {terms} = {prod} devices, not {n}",
            "xDiT needs dp x cfg x pipefusion x ulysses x ring x tp = devices",
        )
    if full["cfg"] not in (1, 2) or (full["cfg"] == 2 and not req.guidance(spec)):
        raise AutoparError(
            f"cfg parallel degree {full['cfg']} needs classifier-free guidance and is 1 or 2",
            "use cfg 1 (this model runs without CFG)" if not req.guidance(spec) else "use cfg 1 or 2",
        )
    if spec.heads % full["tp"] or (spec.heads // full["tp"]) % full["ulysses"]:
        raise AutoparError(
            f"{spec.heads} heads do not split over tp {full['tp']} x ulysses {full['ulysses']}",
            "pick tp and ulysses with (heads / tp) % ulysses == 0",
        )
    tokens = spec.tokens(req.height, req.width, req.frames)
    if tokens % (full["ulysses"] * full["ring"]):
        raise AutoparError(
            f"{tokens} tokens do not split over ulysses x ring = {full['ulysses'] * full['ring']}",
            "pick degrees dividing the token count",
        )
    blocks = spec.blocks
    if full["pipefusion"] > blocks:
        raise AutoparError(
            f"pipefusion degree {full['pipefusion']} exceeds the {blocks} transformer blocks of {spec.id}",
            f"pick a pipefusion degree of at most {blocks}",
        )
    _, rows, _ = spec.token_grid(req.height, req.width, req.frames)
    if full["pipefusion"] > 1 and rows % full["pipefusion"]:
        raise AutoparError(
            f"{rows} latent token rows do not split into {full['pipefusion']} PipeFusion patches",
            "pick a pipefusion degree dividing the rows",
        )


def single_layout(lay: dict[str, int]) -> dict[str, np.ndarray]:
    return {k: np.array([int(lay.get(k, 1))], dtype=np.int64) for k in LAYOUT_KEYS}


def predict(
    spec: DiTSpec,
    device,
    num_devices: int,
    req: Generation,
    layouts: dict[str, np.ndarray],
    *,
    devices_per_node: int | None = None,
    dc: DiTCoefficients | None = None,
    memory_headroom: float = 0.05,
) -> dict[str, np.ndarray]:
    """Latency, its breakdown, memory per device, throughput and energy for every layout."""
    co, links, dc = engine_context(device, num_devices, devices_per_node, dc)
    cfg_on = req.guidance(spec)
    dp, cfg, pf = layouts["dp"], layouts["cfg"], layouts["pipefusion"]
    u, r, tp = layouts["ulysses"], layouts["ring"], layouts["tp"]
    passes = 2.0 if cfg_on else 1.0
    b = req.batch * passes / cfg
    common = dict(
        height=req.height, width=req.width, frames=req.frames, tp=tp, ulysses=u, ring=r, compiled=req.compiled
    )

    def step(share, patches):
        return forward_time(spec, co, dc, links, batch=b, layer_share=share, patches=patches, **common)

    one = step(1.0 / pf, np.ones_like(pf, dtype=np.float64))  # one stage, whole image (warm-up)
    steady = step(1.0 / pf, pf.astype(np.float64))  # one stage, pf patches (xDiT default patches = degree)
    stage1 = sum(one.values())
    stageM = sum(steady.values())
    run_steps = req.steps * (1.0 - req.cache_skip)
    warm = np.where(pf > 1, np.minimum(req.warmup_steps, run_steps), 0.0)
    # PipeFusion hand-off between stages: one patch's activations; async sends hide all but latency.
    t, h, w = spec.token_grid(req.height, req.width, req.frames)
    patch_bytes = b * t * h * w / (u * r * pf) * spec.hidden * BF16
    hop = C.p2p(links, patch_bytes, inter=np.zeros(pf.shape, bool))
    pipe_fill = np.where(pf > 1, (pf - 1.0) / pf * stageM, 0.0)
    denoise = np.where(
        pf > 1,
        warm * (pf * stage1 + (pf - 1) * hop) + (run_steps - warm) * (stageM + pf * links.lat_up) + pipe_fill,
        run_steps * stage1,
    )
    # CFG parallel: the two halves exchange their noise predictions every step.
    latent_bytes = (
        req.batch * spec.vae.channels * np.prod(spec.latent_shape(req.height, req.width, req.frames)) * BF16
    )
    cfg_comm = np.where(
        cfg > 1, run_steps * C.all_gather(links, 2.0 * latent_bytes, cfg, np.ones_like(cfg)), 0.0
    )

    peak = co.peak("bf16")
    geff = co.gemm_eff.get("bf16", 0.8)
    text = passes * sum(e.flops() for e in spec.text_encoders) / (peak * geff) * req.batch
    vae_ranks = np.where(req.parallel_vae, num_devices // dp, 1)
    vae = (
        req.batch
        * spec.vae.decode_flops(req.frames, req.height, req.width)
        / (peak * dc.vae_conv_eff)
        / vae_ranks
    )

    latency = text + denoise + cfg_comm + vae
    parts = {k: run_steps * np.where(pf > 1, steady[k], one[k]) for k in one}
    compute_busy = parts["gemm"] + parts["attention"] + parts["elementwise"] + text + vae

    # memory per device
    weights = spec.params * BF16 / (tp * pf)
    text_w = 0.0 if req.offload_text_encoder else sum(e.params for e in spec.text_encoders) * BF16
    tok = t * h * w / (u * r)
    joint_tok = tok + spec.text_tokens / (u * r)
    act = b * joint_tok / pf * (3 * spec.inner / tp + spec.ffn / tp + 4 * spec.hidden) * BF16 * 2.0
    blocks = spec.blocks / pf
    kv_buf = np.where(pf > 1, 2.0 * b * joint_tok * spec.inner / tp * blocks * BF16, 0.0)
    vae_untiled = req.batch * spec.vae.decode_activation_bytes(req.frames, req.height, req.width)
    cap = device.memory_bytes
    tiled = vae_untiled > 0.3 * cap
    vae_one = req.batch * spec.vae.decode_activation_bytes(
        req.frames, req.height, req.width, tile=VAE_TILE if tiled else 0
    )
    vae_act = vae_one / np.where(req.parallel_vae, num_devices // dp, 1)
    memory = weights + text_w + np.maximum(act + kv_buf, vae_act) + CUDA_CONTEXT_BYTES
    fits = memory <= (1.0 - memory_headroom) * cap

    from autopar.energy import energy_per_step

    fl = spec.forward_flops(req.height, req.width, req.frames)
    model_flops = run_steps * b * cfg * (fl["gemm"] + fl["attention"]) / num_devices * dp
    energy = energy_per_step(
        device,
        {"step_time": latency, "compute_busy": compute_busy},
        num_devices=num_devices,
        peak_flops=peak,
        model_flops_per_device=model_flops,
    )
    return {
        "latency_s": latency,
        "text_encode_s": np.broadcast_to(text, latency.shape).astype(float),
        "denoise_s": denoise,
        "cfg_comm_s": cfg_comm,
        "vae_decode_s": np.broadcast_to(vae, latency.shape).astype(float),
        **{f"step_{k}_s": v for k, v in parts.items()},
        "memory_bytes": memory,
        "weights_bytes": np.broadcast_to(weights, latency.shape).astype(float),
        "activation_bytes": act + kv_buf,
        "vae_activation_bytes": np.broadcast_to(vae_act, latency.shape).astype(float),
        "fits": fits,
        "throughput_per_s": dp * req.batch / latency,
        "energy_j": energy["energy_j"],
        "energy_per_sample_j": energy["energy_j"] / (dp * req.batch),
    }


def search(
    spec: DiTSpec,
    device,
    num_devices: int,
    req: Generation,
    *,
    latency_target_s: float | None = None,
    top: int = 5,
    max_dp: int | None = None,
    devices_per_node: int | None = None,
) -> list[dict[str, Any]]:
    """Legal layouts that fit, fastest first; with a target, those meeting it ranked by throughput."""
    lays = enumerate_layouts(spec, num_devices, req, max_dp=max_dp)
    pred = predict(spec, device, num_devices, req, lays, devices_per_node=devices_per_node)
    ok = pred["fits"].copy()
    if not ok.any():
        i = int(np.argmin(pred["memory_bytes"]))
        raise InfeasibleError(
            f"no layout of {num_devices} x {device.id} fits {spec.id}: the smallest needs "
            f"{pred['memory_bytes'][i] / 1e9:.1f} GB per device of {device.memory_bytes / 1e9:.0f}",
            "use more devices, tp or pipefusion, or --offload-text-encoder",
        )
    if latency_target_s is not None:
        meet = ok & (pred["latency_s"] <= latency_target_s)
        if not meet.any():
            best = float(pred["latency_s"][ok].min())
            raise InfeasibleError(
                f"no layout meets the latency target {latency_target_s:g} s: the fastest is {best:.2f} s",
                "relax --latency-target, add devices, or set --cache-skip",
            )
        ok = meet
        order = np.lexsort((pred["latency_s"], -pred["throughput_per_s"]))
    else:
        order = np.argsort(pred["latency_s"], kind="stable")
    keep = [int(i) for i in order if ok[i]][:top]
    return [row(lays, pred, i) for i in keep]


def row(lays: dict[str, np.ndarray], pred: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    out: dict[str, Any] = {"layout": {k: int(lays[k][i]) for k in LAYOUT_KEYS}}
    for k, v in pred.items():
        x = np.asarray(v)
        out[k] = (
            bool(x[i]) if x.dtype == bool else float(x.reshape(-1)[i] if x.size > 1 else x.reshape(-1)[0])
        )
    return out
