"""Per-user decode speed of SRAM-only, wafer-scale and dataflow systems at batch 1, against vendor figures.

    python studies/sram_speed.py

For Groq (LPU), Cerebras (CS-3) and SambaNova (SN40L) the serving engine of
:mod:`autopar.serving.estimate` predicts one decode iteration of one sequence (the same function as
``autopar serve``): per layer, max(compute, reads of its weights and KV from the tier that holds them)
plus the layer's pipeline latency, tensor-parallel collectives (alpha-beta on the chip-to-chip links),
pipeline sends between chips or systems, and the vendor stack's host time (the profile's ``serving``
section). Per-user output tokens/s = 1 / (decode iteration).

Vendor-published per-user speeds (``VENDOR``) are **never fitted**. Each device has at most one
``derive`` row: the per-layer pipeline latency its profile ships (``serving.layer_latency_us``) is the
residual of that one published figure after the modelled terms, and this study prints the residual it
computes next to the profile's value. Every other row is an out-of-sample check, printed with the
ratio predicted / published; the tolerance is 2x.

Chip counts the vendors do not state are the fewest chips that hold the weights and one sequence's KV
in the home tier (said so); tensor x pipeline shape: the largest TP inside the scale-up domain that
divides the heads, pipeline stages for the rest (as ``studies/published_accel.py``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import ServingTable, iteration, make_context, make_workload, replace
from autopar.serving.tiers import placement
from autopar.whatif.landscape import SRAM_TOKEN_BUDGET

ISL, OSL = 1000, 256  # artificialanalysis.ai's ~1,000-token prompts; decode at the mean context

AA_TABLE = (
    "sambanova.ai/blog/sn40l-chip-best-inference-solution (2024-09-10), Table 1: user throughput in output "
    "tokens/s from artificialanalysis.ai"
)


@dataclass(frozen=True)
class Published:
    device: str
    model: str
    precision: str
    chips: int | None
    tok_s: float
    source: str
    role: str  # "derive" (the one figure a device's layer latency comes from) or "check"


VENDOR: tuple[Published, ...] = (
    Published("groq-lpu", "llama-3.1-8b", "fp8", None, 751.0, AA_TABLE + " (Groq, 8-bit)", "derive"),
    Published("groq-lpu", "llama-3.1-70b", "fp8", 576, 250.0, AA_TABLE + " (Groq, 8-bit)", "check"),
    Published(
        "groq-lpu",
        "llama-2-70b",
        "fp8",
        576,
        300.0,
        "techpowerup.com/news-tags/Processor?page=3 (press, 2024-02; 576 chips: Groq via news.ycombinator "
        "item 39435411)",
        "check",
    ),
    Published(
        "groq-lpu",
        "llama-2-7b",
        "fp8",
        None,
        750.0,
        "techpowerup.com/news-tags/Processor?page=3 (press)",
        "check",
    ),
    Published(
        "cerebras-cs3",
        "llama-3.1-8b",
        "bf16",
        None,
        1800.0,
        "cerebras.ai/blog/introducing-cerebras-inference-ai-at-instant-speed (vendor, 2024-08-27, 16-bit)",
        "derive",
    ),
    Published(
        "cerebras-cs3",
        "llama-3.1-70b",
        "bf16",
        None,
        450.0,
        "cerebras.ai/blog/introducing-cerebras-inference-ai-at-instant-speed (vendor, 2024-08-27, 16-bit)",
        "check",
    ),
    Published(
        "cerebras-cs3", "llama-3.1-70b", "bf16", None, 445.0, AA_TABLE + " (Cerebras, 16-bit)", "check"
    ),
    Published(
        "cerebras-cs3",
        "llama-3.1-405b",
        "bf16",
        None,
        969.0,
        "tomshardware.com (2024-11-20, vendor claim; a later software release than the 8B/70B launch figures)",
        "check",
    ),
    Published("sn40l", "llama-3.1-8b", "bf16", 16, 1042.0, AA_TABLE + " (SambaNova, 16-bit)", "check"),
    Published("sn40l", "llama-3.1-70b", "bf16", 16, 457.0, AA_TABLE + " (SambaNova, 16-bit)", "check"),
    Published("sn40l", "llama-3.1-405b", "bf16", 16, 129.0, AA_TABLE + " (SambaNova, 16-bit)", "check"),
)


def shape(n: int, model, device) -> tuple[int, int] | None:
    """tp x pp = n: the largest TP inside the scale-up domain dividing the heads, pipeline for the rest."""
    for tp in range(min(n, device.scale_up.domain), 0, -1):
        if n % tp == 0 and model.heads % tp == 0 and n // tp <= model.layers:
            return tp, n // tp
    return None


def fewest_chips(model, device, precision: str) -> int:
    """The fewest chips holding weights + one sequence's KV in the home tier that split into a shape."""
    n = int(
        placement(
            model, device, batch=1, seq_len=ISL + OSL, weight_precision=precision, kv_precision=precision
        )["chips_to_hold"]
    )
    return next(k for k in range(n, 4 * n + 8) if shape(k, model, device))


def decode(p: Published, *, layer_latency: bool = True) -> dict[str, float]:
    """One batch-1 decode iteration on the published deployment (or the fewest chips that hold it)."""
    device, model = load_device(p.device), load_model(p.model)
    chips = p.chips or fewest_chips(model, device, p.precision)
    sh = shape(chips, model, device)
    if sh is None:
        raise AutoparError(
            f"{chips} {p.device} chips split into no tp x pp for {p.model}", "give another count"
        )
    tp, pp = sh
    extra = {"max_num_tokens": SRAM_TOKEN_BUDGET} if device.memory_kind == "sram" else {}
    w = make_workload(
        isl=ISL, osl=OSL, offline=True, weight_precision=p.precision, kv_precision=p.precision, **extra
    )
    ctx = make_context(model, device, w, devices_per_node=min(chips, device.scale_up.domain))
    if not layer_latency:
        ctx = replace(ctx, sc=replace(ctx.sc, layer_latency_s=0.0))
    tab = ServingTable({"tp": [tp], "pp": [pp]})
    it = iteration(
        ctx, tab, n_dec=1.0, n_pre=0.0, dec_ctx=ISL + OSL / 2.0, pre_ctx=0.0, pre_len=ISL, logit_rows=1.0
    )
    return {
        "chips": chips,
        "stated": p.chips is not None,
        "tp": tp,
        "pp": pp,
        "layers": model.layers,
        # the engine paces a pipeline by its heaviest stage: pp x ceil(layers / pp) layer passes
        "charged_layers": pp * -(-model.layers // pp),
        "t": float(it["t_iter"][0]),
        **{k: float(it[k][0]) for k in ("compute", "comm", "host", "pipeline_latency")},
    }


def derived_layer_latency_us(p: Published) -> float:
    """The per-layer latency that closes the gap between the modelled terms and one published figure."""
    r = decode(p, layer_latency=False)
    return (1.0 / p.tok_s - r["t"]) / r["charged_layers"] * 1e6


def rows() -> list[dict[str, object]]:
    out = []
    for p in VENDOR:
        r = decode(p)
        out.append({"pub": p, **r, "pred": 1.0 / r["t"], "ratio": (1.0 / r["t"]) / p.tok_s})
    return out


def main() -> int:
    try:
        derived = {p.device: (p, derived_layer_latency_us(p)) for p in VENDOR if p.role == "derive"}
        res = rows()
    except AutoparError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"batch 1, prompt {ISL} tokens, decode at context {ISL + OSL // 2}; per-user output tokens/s")
    for dev, (p, us) in derived.items():
        prof = load_device(dev).serving
        shipped = prof.layer_latency_us if prof else float("nan")
        print(
            f"{dev}: layer latency derived from {p.model} at {p.tok_s:,.0f} tok/s = {us:.1f} us/layer "
            f"(profile ships {shipped:.1f})"
        )
    hdr = (
        f"{'device':<13}{'model':<16}{'prec':<5}{'chips':>6}{'tp x pp':>9}{'compute us':>11}{'comm us':>9}"
        f"{'latency us':>11}{'host us':>8}{'predicted':>10}{'published':>10}{'ratio':>7}  role"
    )
    print(hdr)
    checks = []
    for r in res:
        p = r["pub"]
        assert isinstance(p, Published)
        chips = f"{r['chips']}" + ("" if r["stated"] else "*")
        tpp = f"{r['tp']}x{r['pp']}"
        print(
            f"{p.device:<13}{p.model:<16}{p.precision:<5}{chips:>6}{tpp:>9}"
            f"{r['compute'] * 1e6:>11.0f}{r['comm'] * 1e6:>9.0f}{r['pipeline_latency'] * 1e6:>11.0f}"
            f"{r['host'] * 1e6:>8.0f}{r['pred']:>10.0f}{p.tok_s:>10.0f}{r['ratio']:>7.2f}  {p.role}"
        )
        if p.role == "check":
            checks.append(float(r["ratio"]))  # type: ignore[arg-type]
    within = sum(0.5 <= c <= 2.0 for c in checks)
    gm = float(np.exp(np.mean(np.abs(np.log(checks)))))
    print("* chips not stated by the vendor: the fewest that hold the model")
    print(f"out-of-sample checks within 2x: {within}/{len(checks)}; geometric mean |ratio| {gm:.2f}x")
    for r in res:
        p = r["pub"]
        assert isinstance(p, Published)
        print(f"  {p.device} {p.model}: {p.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
