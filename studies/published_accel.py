"""Accuracy of autopar's serving and power model on measured cross-accelerator inference runs.

    python studies/published_accel.py [--csv studies/data/accel_runs_dev.csv] [--json OUT]

Each row of the CSV (columns in ``studies/data/README-accel.md``) is a fixed-batch benchmark run:
``batch_size`` prompts of ``input_len`` tokens each generate ``output_len`` tokens on ``chip_count``
chips (tensor parallel) with one serving framework. It is predicted with the serving engine of
:mod:`autopar.serving.estimate` (the device's shipped calibration and profile; the same iteration
model as ``autopar serve``):

* the KV cache the memory leaves after weights and the runtime reserve bounds the concurrency;
  a batch larger than that runs as B/concurrency waves (continuous batching refills the slots);
* a wave = one prefill iteration of all its prompts + ``output_len - 1`` decode iterations at the
  mean context; throughput counts what the row's ``throughput_definition`` counts (input + output
  tokens x batch / latency in these files); TTFT rows (output length 1) are the prefill;
* board power: the time-weighted phase power of :mod:`autopar.energy` (prefill vs decode, the stall
  share while the host runs), without the host's share (NVML reads the board only).

Fitted, per **serving framework** (never per row): ``host_step_ms``, the host time per iteration the
GPU waits for (Python scheduler, kernel launches), ``host_per_seq_us``, the host time per sequence
per iteration (sampling, stop checks, detokenization), and ``decode_bw``, the achieved fraction
of the device's calibrated memory bandwidth its decode kernels reach. Fitted per **device**: the
power floor ``power_base`` (the share of the idle..TDP span drawn whatever the load). Least squares on
log errors (scipy) over the **dev rows** (``studies/data/accel_runs_dev.csv``) only; on the dev CSV
the same fit with each source left out (and each framework left out, which then takes the median of
the others' coefficients) predicts the rows it did not see. Any other ``--csv`` is predicted with the
dev fit, out of sample: a platform or framework outside it (another vendor's chip, another runtime)
from its datasheet profile, the median framework coefficients and the median power floor (a device
whose profile has a ``serving`` section, SRAM / wafer / dataflow machines, runs its own stack's host,
collective and per-layer latency terms and its profile's bandwidth fraction instead). A
chip count that does not divide the heads is split into tensor x pipeline parallel (largest TP
within the scale-up domain), as SRAM systems spread a model over many chips.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from autopar.coefficients import load_calibration
from autopar.energy import F_BASE, F_COMPUTE, F_MEMORY, STALL_POWER_FRACTION
from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import (
    ServingCoefficients,
    ServingTable,
    instance_memory,
    iteration,
    make_context,
    make_workload,
)
from autopar.whatif.landscape import SRAM_TOKEN_BUDGET

DEV_CSV = Path(__file__).resolve().parent / "data" / "accel_runs_dev.csv"

# Platform names (lower case, as in the CSV's `platform` column) -> device profile id. First match.
PLATFORMS: tuple[tuple[str, str], ...] = (
    (r"a100.*(pcie)", "a100-pcie-80gb"),
    (r"a100.*80", "a100-80gb"),
    (r"a100", "a100-40gb"),  # LLM-Inference-Bench ran on ALCF Polaris: 4x A100 40 GB SXM4 per node
    (r"h100.*96", "h100-sxm-96gb"),
    (r"h100", "h100-sxm-80gb"),
    (r"h800", "h800-sxm-80gb"),
    (r"gh200|grace.?hopper", "gh200"),
    (r"h200", "h200-sxm-141gb"),
    (r"gb200", "gb200-nvl72"),
    (r"gb300", "gb300-nvl72"),
    (r"b300", "b300"),
    (r"b200", "b200"),
    (r"l40s", "l40s"),
    (r"mi250", "mi250-gcd"),  # frameworks see one GCD of the two on an MI250 OAM as a GPU
    (r"mi355", "mi355x"),
    (r"mi325", "mi325x"),
    (r"mi300", "mi300x"),
    (r"gaudi.?3", "gaudi3"),
    (r"gaudi.?2", "gaudi2"),
    (r"v5e", "tpu-v5e"),
    (r"v5p", "tpu-v5p"),
    (r"tpu.?v4", "tpu-v4"),
    (r"sn40|sambanova", "sn40l"),
    (r"groq|lpu", "groq-lpu"),
    (r"cerebras|cs-3|wse", "cerebras-cs3"),
)

# Hugging Face model names -> preset id, or architecture dims for models without a preset.
MODELS: tuple[tuple[str, str | dict[str, Any]], ...] = (
    (r"llama-2-7b", "llama-2-7b"),
    (r"huggyllama/llama-7b", "llama-2-7b"),  # LLaMA-1 7B: Llama-2-7B's dimensions (2k context)
    (r"llama-2-13b", "llama-2-13b"),
    (r"llama-2-70b", "llama-2-70b"),
    (r"llama-3(\.[01])?-8b", "llama-3.1-8b"),
    (r"llama-3(\.[0-3])?-70b", "llama-3.1-70b"),
    (r"llama-3\.1-405b", "llama-3.1-405b"),
    (r"mixtral-8x7b", "mixtral-8x7b"),
    (r"qwen2\.5-7b", "qwen2.5-7b"),
    (r"qwen2\.5-72b", "qwen2.5-72b"),
    # mistralai/Mistral-7B-v0.1 config.json
    (
        r"mistral-7b",
        {
            "name": "mistral-7b",
            "layers": 32,
            "hidden": 4096,
            "heads": 32,
            "kv_heads": 8,
            "ffn_hidden": 14336,
            "vocab": 32000,
        },
    ),
)

# precision text (start of the column) -> (weight precision, KV precision)
PRECISIONS = {
    "fp16": ("fp16", "fp16"),
    "bf16": ("bf16", "bf16"),
    "float16": ("fp16", "fp16"),
    "bfloat16": ("bf16", "bf16"),
    "fp8": ("fp8", "fp8"),
    "int4": ("int4", "fp16"),
    "w4a16": ("int4", "fp16"),
    "awq": ("int4", "fp16"),
    "gptq": ("int4", "fp16"),
}
DEFAULT_FRAMEWORK = {"host_step_ms": 1.0, "host_per_seq_us": 5.33, "decode_bw": 1.0}
DEFAULT_POWER_BASE = F_BASE


def _num(row: dict[str, str], key: str) -> float | None:
    v = (row.get(key) or "").strip()
    try:
        x = float(v) if v else None
    except ValueError:
        return None
    return x if x is not None and math.isfinite(x) else None


def _framework(name: str, vendor: str = "") -> str:
    n = name.strip().lower().replace("_", "-").replace(" ", "-")
    if "tensorrt" in n or "trt" in n:
        return "tensorrt-llm"
    if "vllm" in n:
        return "vllm"
    if ("deepspeed" in n or "mii" in n) and vendor == "intel":
        # On Gaudi "DeepSpeed" is Habana's DeepSpeed fork run through optimum-habana with HPU graphs,
        # a different host path from DeepSpeed-MII's CUDA server (which does not run on Gaudi): an
        # unfitted framework (the median coefficients), not DeepSpeed-MII's fitted host costs.
        return "deepspeed-habana"
    if "deepspeed" in n or "mii" in n:
        return "deepspeed-mii"
    return n or "unknown"


def _match(table, text: str):
    t = text.strip().lower()
    for pat, val in table:
        if re.search(pat, t):
            return val
    return None


def load_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise AutoparError(f"cannot read {path}: {exc}", "give a CSV with the accel_runs columns") from None
    need = {"row_id", "platform", "chip_count", "framework", "model", "input_len", "output_len", "batch_size"}
    missing = sorted(need - set(rows[0] if rows else {}))
    if missing:
        raise AutoparError(
            f"{path}: missing column(s) {', '.join(missing)}", "see studies/data/README-accel.md"
        )
    return rows


def prepare(row: dict[str, str]) -> dict[str, Any]:
    rec: dict[str, Any] = {"row_id": row.get("row_id", ""), "source": row.get("source", "")}
    isl, osl, B = _num(row, "input_len"), _num(row, "output_len"), _num(row, "batch_size")
    n = _num(row, "chip_count")
    if not isl or not osl or not B:
        return rec | {"skipped": "input_len, output_len or batch_size not stated"}
    thr, ttft, pw = _num(row, "throughput_tok_s"), _num(row, "ttft_s"), _num(row, "avg_power_w")
    if thr is None and ttft is None and pw is None:
        return rec | {"skipped": "nothing measured (no throughput, TTFT or power)"}
    dev_id = _match(PLATFORMS, row.get("platform", ""))
    if dev_id is None:
        return rec | {"skipped": f"no device profile for platform {row.get('platform')!r}"}
    spec = _match(MODELS, row.get("model", "")) or _preset_of(row.get("model", ""))
    if spec is None:
        return rec | {"skipped": f"no preset or dimensions for model {row.get('model')!r}"}
    prec_txt = (row.get("precision") or "").strip().lower()
    prec = next((v for k, v in PRECISIONS.items() if prec_txt.startswith(k)), None)
    if prec_txt and prec is None:
        return rec | {"skipped": f"precision {prec_txt[:20]!r} is not modelled"}
    wprec, kvprec = prec or ("bf16", "bf16")
    definition = (row.get("throughput_definition") or "").lower()
    counts_input = thr is None or "input" in definition or not definition
    per_user = "per user" in definition or "per request" in definition or "per sequence" in definition
    try:
        device = load_device(dev_id)
        model = load_model(spec)
    except AutoparError as exc:
        return rec | {"skipped": str(exc)}
    from autopar.serving.tiers import placement

    if n is None:  # not stated: the fewest chips whose home memory tier holds weights + KV of the batch
        n = float(
            placement(model, device, batch=B, seq_len=isl + osl, weight_precision=wprec, kv_precision=kvprec)[
                "chips_to_hold"
            ]
        )
        n = float(next(k for k in range(int(n), 4 * int(n) + 8) if _instance_shape(k, model, device)))
        rec.setdefault("assumptions", []).append(f"chip_count not stated: {int(n)} chips hold the model")
    shape = _instance_shape(int(n), model, device)
    if shape is None:
        return rec | {"skipped": f"{int(n)} chips split into no tp x pp the model allows"}
    fit = placement(
        model, device, batch=1, seq_len=isl + osl, chips=n, weight_precision=wprec, kv_precision=kvprec
    )
    if str(fit["weight_tier"]) != device.memory_kind and device.memory_kind == "sram" and wprec != "fp8":
        # SRAM-only systems serve in 8-bit formats where 16-bit weights would not fit (Groq's
        # published deployments run mixed 8/16-bit numerics): assumed, and said so.
        f8 = placement(
            model, device, batch=1, seq_len=isl + osl, chips=n, weight_precision="fp8", kv_precision="fp8"
        )
        if str(f8["weight_tier"]) == device.memory_kind:
            wprec, kvprec, fit = "fp8", "fp8", f8
            rec.setdefault("assumptions", []).append(
                "8-bit weights and KV: 16-bit weights do not fit the SRAM"
            )
    if str(fit["weight_tier"]) != device.memory_kind:
        return rec | {
            "skipped": f"the weights and one sequence do not fit in the {device.memory_kind} of {int(n)} "
            f"{device.id} chips (streaming from a slower tier is not modelled)"
        }
    tp, pp = shape
    return rec | {
        "device": device,
        "model": model,
        "framework": _framework(row.get("framework", ""), device.vendor),
        "precision": wprec,
        "kv_precision": kvprec,
        "isl": int(isl),
        "osl": int(osl),
        "batch": int(B),
        "tp": tp,
        "pp": pp,
        "counts_input": counts_input,
        "per_user": per_user,
        "measured_throughput": thr,
        "measured_ttft": ttft,
        "measured_power": pw,
    }


def _preset_of(name: str) -> str | None:
    """A shipped preset named like the model's last path component (suffixes -hf/-instruct/-chat off)."""
    from autopar.model import list_presets

    base = name.strip().split("/")[-1].lower()
    for suffix in ("-hf", "-instruct", "-chat", "-it"):
        base = base.removesuffix(suffix)
    return base if base in set(list_presets()) else None


def _instance_shape(n: int, model, device) -> tuple[int, int] | None:
    """tp x pp = n chips: the largest tensor-parallel degree that divides the heads and fits the
    scale-up domain; pipeline stages for the rest (how SRAM systems spread a model over many chips)."""
    for tp in range(min(n, device.scale_up.domain), 0, -1):
        if n % tp == 0 and model.heads % tp == 0 and n // tp <= model.layers:
            return tp, n // tp
    return None


_CAL = None


def _cal():
    global _CAL
    if _CAL is None:
        _CAL = load_calibration()
    return _CAL


def _groups(recs: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    g: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        if "skipped" not in r:
            key = (
                r["model"].name,
                r["device"].id,
                r["framework"],
                r["tp"],
                r["isl"],
                r["osl"],
                r["precision"],
            )
            g[key].append(r)
    return g


def simulate(group: list[dict[str, Any]], fw: dict[str, float], power_base: float) -> dict[str, np.ndarray]:
    """Throughput, TTFT and board power of the rows of one (model, device, framework, tp, isl, osl)."""
    r0 = group[0]
    dev, isl, osl, tp, pp = r0["device"], r0["isl"], r0["osl"], r0["tp"], r0["pp"]
    if dev.serving is not None:
        # The vendor's own stack (SambaFlow, GroqWare, Cerebras): its profile's host, collective and
        # layer terms (make_context) and the profile's achieved bandwidth, not a GPU framework's fit.
        fw = dict(fw, decode_bw=1.0)
    extra = {"max_num_tokens": SRAM_TOKEN_BUDGET} if dev.memory_kind == "sram" else {}
    w = make_workload(
        isl=isl,
        osl=osl,
        offline=True,
        weight_precision=r0["precision"],
        kv_precision=r0["kv_precision"],
        **extra,
    )
    sc = replace(
        ServingCoefficients.from_calibration(_cal()),
        host_step_s=fw["host_step_ms"] * 1e-3,
        host_per_seq_s=fw["host_per_seq_us"] * 1e-6,
    )
    ctx = make_context(
        r0["model"],
        dev,
        w,
        devices_per_node=min(tp * pp, dev.scale_up.domain),
        calibration=_cal(),
        serving_coefficients=sc,
    )
    ctx = replace(ctx, co=replace(ctx.co, hbm_bw=ctx.co.hbm_bw * fw["decode_bw"]))
    B = np.array([float(r["batch"]) for r in group])
    tab = ServingTable({"tp": np.full(len(B), float(tp)), "pp": np.full(len(B), float(pp))})
    mem = instance_memory(ctx, tab, batch_cap=B)
    conc = np.clip(np.minimum(B, mem["max_conc"]), 1.0, None)
    waves = B / conc  # continuous batching refills freed KV slots: B/conc waves of conc sequences
    pre = iteration(
        ctx,
        tab,
        n_dec=0.0,
        n_pre=conc * isl,
        dec_ctx=0.0,
        pre_ctx=isl / 2.0,
        pre_len=isl,
        logit_rows=conc,
        pre_seqs=conc,
    )
    dec = iteration(
        ctx, tab, n_dec=conc, n_pre=0.0, dec_ctx=isl + osl / 2.0, pre_ctx=0.0, pre_len=isl, logit_rows=conc
    )
    t_pre, t_dec = pre["t_iter"], dec["t_iter"]
    e2e = waves * (t_pre + (osl - 1) * t_dec)
    tokens = np.array([(isl + osl) if r["counts_input"] else osl for r in group], dtype=np.float64) * B
    tokens = np.where([r["per_user"] for r in group], tokens / B, tokens)

    def board_w(it):
        p = dev.power
        busy = np.maximum(it["compute"], 1e-15)
        u_c = np.clip(it["busy_compute"] / busy, 0.0, 1.0)
        u_m = np.clip(it["busy_memory"] / busy, 0.0, 1.0)
        span = p.tdp_w - p.idle_w
        active = p.idle_w + span * np.minimum(1.0, power_base + F_COMPUTE * u_c + F_MEMORY * u_m)
        stall = p.idle_w + span * STALL_POWER_FRACTION
        return (it["compute"] * active + (it["t_iter"] - it["compute"]) * stall) / it["t_iter"]

    power = (t_pre * board_w(pre) + (osl - 1) * t_dec * board_w(dec)) / (t_pre + (osl - 1) * t_dec)
    return {
        "throughput": tokens / e2e,
        "ttft": t_pre,
        "power": power,
        "fits": mem["weights_fit"] & (mem["max_conc"] >= 1),
    }


def predict_all(recs, fws: dict[str, dict[str, float]], pbase: dict[str, float]) -> None:
    """Predict every row; a framework or device outside the fit takes the median fitted coefficients."""
    med = _median_fw(fws)
    pmed = float(np.median(list(pbase.values()))) if pbase else DEFAULT_POWER_BASE
    for key, group in _groups(recs).items():
        fw = fws.get(key[2], med)
        out = simulate(group, fw, pbase.get(key[1], pmed))
        for i, r in enumerate(group):
            if not out["fits"][i]:
                r["skipped"] = (
                    f"weights, workspace and one sequence's KV do not fit {r['tp'] * r['pp']} {r['device'].id} chips"
                )
                continue
            r["predicted_throughput"] = float(out["throughput"][i])
            r["predicted_ttft"] = float(out["ttft"][i])
            r["predicted_power"] = float(out["power"][i])


def _median_fw(fws: dict[str, dict[str, float]]) -> dict[str, float]:
    if not fws:
        return dict(DEFAULT_FRAMEWORK)
    return {k: float(np.median([f[k] for f in fws.values()])) for k in DEFAULT_FRAMEWORK}


def fit(recs) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Per-framework (host_step_ms, decode_bw) on log throughput and TTFT; per-device power_base on power."""
    from scipy.optimize import least_squares

    ok = [r for r in recs if "skipped" not in r]
    fws = sorted({r["framework"] for r in ok if r["measured_throughput"] or r["measured_ttft"]})
    out: dict[str, dict[str, float]] = {}
    for fw in fws:
        mine = [r for r in ok if r["framework"] == fw]

        def resid(x, mine=mine, fw=fw):
            predict_all(mine, {fw: dict(zip(DEFAULT_FRAMEWORK, x, strict=True))}, {})
            e = [
                math.log(r["predicted_throughput"] / r["measured_throughput"])
                for r in mine
                if r["measured_throughput"]
            ]
            e += [math.log(r["predicted_ttft"] / r["measured_ttft"]) for r in mine if r["measured_ttft"]]
            return np.nan_to_num(np.array(e), nan=5.0)

        x0 = list(DEFAULT_FRAMEWORK.values())
        sol = least_squares(
            resid, x0, bounds=([0.0, 0.0, 0.3], [50.0, 2000.0, 1.25]), loss="soft_l1", f_scale=0.1
        )
        out[fw] = {k: float(v) for k, v in zip(DEFAULT_FRAMEWORK, sol.x, strict=True)}
    predict_all(ok, out, {})
    pb: dict[str, float] = {}
    for dev in sorted({r["device"].id for r in ok if r["measured_power"]}):
        mine = [r for r in ok if r["device"].id == dev and r["measured_power"]]

        def presid(x, mine=mine, dev=dev):
            predict_all(mine, out, {dev: x[0]})
            return np.array([math.log(r["predicted_power"] / r["measured_power"]) for r in mine])

        sol = least_squares(presid, [DEFAULT_POWER_BASE], bounds=([0.0], [0.6]), loss="soft_l1", f_scale=0.1)
        pb[dev] = float(sol.x[0])
    return out, pb


def mape(recs, what: str) -> tuple[float | None, int]:
    e = [
        abs(r[f"predicted_{what}"] / r[f"measured_{what}"] - 1.0)
        for r in recs
        if "skipped" not in r and r.get(f"measured_{what}") and f"predicted_{what}" in r
    ]
    return (100.0 * float(np.mean(e)) if e else None), len(e)


def _fmt(x: float | None) -> str:
    return "   n/a" if x is None else f"{x:6.1f}"


def held_out(recs, key: str) -> None:
    """Refit without each value of ``key`` (source or framework) and predict its rows."""
    for val in sorted({r[key] for r in recs if "skipped" not in r}):
        train = [r for r in recs if "skipped" not in r and r[key] != val]
        test = [r for r in recs if "skipped" not in r and r[key] == val]
        fws, pb = fit(train)
        if key == "framework":
            fws.pop(val, None)
        predict_all(test, fws, pb)
        for r in test:
            for w in ("throughput", "ttft", "power"):
                r[f"{key}_out_{w}"] = r[f"predicted_{w}"]


def _shown(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", type=Path, default=DEV_CSV, help="accel runs CSV (default: %(default)s)")
    ap.add_argument("--json", type=Path, help="write per-row predictions as JSON here")
    args = ap.parse_args(argv)
    try:
        if not args.csv.is_file():
            raise AutoparError(f"{args.csv} is not a file", "give --csv PATH to an accel runs CSV")
        rows = load_rows(args.csv)
        recs = [prepare(r) for r in rows]
        used = [r for r in recs if "skipped" not in r]
        if not used:
            raise AutoparError(f"{args.csv}: no row can be predicted", "see the skipped reasons with --json")
        # The coefficients come from the dev rows only: any other CSV is predicted out of sample.
        dev = args.csv.resolve() == DEV_CSV.resolve()
        dev_recs = recs if dev else [prepare(r) for r in load_rows(DEV_CSV)]
        if dev:
            for k in ("source", "framework"):
                held_out(recs, k)
        fws, pb = fit(dev_recs)
        predict_all(recs, fws, pb)
        used = [r for r in recs if "skipped" not in r]  # the engine may refuse rows placement let through
    except AutoparError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    print(
        f"{_shown(args.csv)}: {len(rows)} rows, {len(used)} predicted, coverage {100.0 * len(used) / len(rows):.1f}%"
    )
    if not dev:
        print(f"coefficients fitted on {_shown(DEV_CSV)}; every row here is predicted out of sample")
    print(
        "fitted per framework: "
        + "; ".join(
            f"{k} host_step {v['host_step_ms']:.2f} ms, host_per_seq {v['host_per_seq_us']:.0f} us, "
            f"decode_bw x{v['decode_bw']:.2f}"
            for k, v in fws.items()
        )
    )
    print(
        f"fitted per device (power_base; unfitted devices take the median, none fitted {DEFAULT_POWER_BASE:.2f}): "
        + "; ".join(f"{k} {v:.3f}" for k, v in pb.items())
    )
    first = "in-sample" if dev else "dev fit"
    print(f"{'MAPE %':<12}{'rows':>6}{first:>11}{'leave-source-out':>18}{'leave-framework-out':>21}")
    for w in ("throughput", "ttft", "power"):
        ins, n = mape(recs, w)
        lso = mape(
            [r | {f"predicted_{w}": r.get(f"source_out_{w}")} for r in used if r.get(f"source_out_{w}")], w
        )[0]
        lfo = mape(
            [
                r | {f"predicted_{w}": r.get(f"framework_out_{w}")}
                for r in used
                if r.get(f"framework_out_{w}")
            ],
            w,
        )[0]
        print(f"{w:<12}{n:>6}{_fmt(ins):>11}{_fmt(lso):>18}{_fmt(lfo):>21}")
    by = defaultdict(list)
    for r in used:
        if r["measured_throughput"]:
            by[(r["device"].id, r["framework"])].append(
                abs(r["predicted_throughput"] / r["measured_throughput"] - 1)
            )
    print(
        f"throughput MAPE by device x framework ({first}): "
        + "; ".join(f"{d}/{f} {100 * np.mean(v):.1f}% (n={len(v)})" for (d, f), v in sorted(by.items()))
    )
    by_t = defaultdict(list)
    for r in used:
        if r["measured_ttft"]:
            by_t[(r["device"].id, r["framework"])].append(abs(r["predicted_ttft"] / r["measured_ttft"] - 1))
    if by_t:
        print(
            f"ttft MAPE by device x framework ({first}): "
            + "; ".join(f"{d}/{f} {100 * np.mean(v):.1f}% (n={len(v)})" for (d, f), v in sorted(by_t.items()))
        )
    for r in recs:
        if "skipped" in r:
            print(f"skipped {r['row_id']}: {r['skipped']}")
    if args.json:
        out = []
        for r in recs:
            if "skipped" in r:
                out.append({"row_id": r["row_id"], "skipped": r["skipped"]})
                continue
            out.append(
                {
                    "row_id": r["row_id"],
                    "predicted_throughput_tok_s": r["predicted_throughput"]
                    if r["measured_throughput"] or r["measured_power"]
                    else None,
                    "measured_throughput_tok_s": r["measured_throughput"],
                    "predicted_power_w": r["predicted_power"],
                    "measured_power_w": r["measured_power"],
                    "predicted_ttft_s": r["predicted_ttft"],
                    "measured_ttft_s": r["measured_ttft"],
                }
            )
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps({"records": out}, indent=1))
        tmp.replace(args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
