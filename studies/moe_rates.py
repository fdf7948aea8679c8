"""Measured MoE-layer kernel rates per device, serving backend and dtype, from AIConfigurator's tables.

    pip install -e ".[aiconfigurator]"      # aiconfigurator-core (Apache-2.0) and pyarrow
    python studies/moe_rates.py [--write] [--json OUT]

NVIDIA's AIConfigurator ships MoE-layer latencies measured on each GPU
(``aiconfigurator_core/systems/data/<system>/moe/<framework>/<version>/moe_perf.parquet``: dtype,
token count, hidden and expert width, top-k, experts, expert TP and EP, routing distribution, latency
in ms). For every device autopar profiles, each serving backend (TensorRT-LLM, vLLM, SGLang) and each
dtype, this study fits the four rates of autopar's MoE law (:mod:`autopar.moe_kernels`: grouped-GEMM
compute share, streaming bandwidth share, fixed and per-token time) to every balanced-routing shape
of the table (the fastest gated kernel per shape), in log space, and prints them with the fit's
error. It also prints how far the dense-GEMM pricing autopar used before (each expert's rows at the
device's dense GEMM rate, weights streamed at full HBM bandwidth) is from the same measurements.

``--write`` writes ``cost_models/backends/moe_kernels.yaml`` (what the serving model reads) with the
medians that devices without a table take; ``tests/test_moe_rates.py`` re-derives it when the extra
is installed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from importlib import resources
from pathlib import Path

import numpy as np
from gemm_rates import have_tables  # the same extra, the same one-line refusal

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "cost_models" / "backends" / "moe_kernels.yaml"
# autopar device id -> AIConfigurator system
SYSTEMS = {
    "a100-80gb": "a100_sxm",
    "h100-sxm-80gb": "h100_sxm",
    "h200-sxm-141gb": "h200_sxm",
    "b200": "b200_sxm",
    "gb200-nvl72": "gb200",
    "b300": "b300_sxm",
    "gb300-nvl72": "gb300",
    "l40s": "l40s",
}
# autopar backend -> (the table's framework folder, versions in order of preference: the GEMM study's
# TensorRT-LLM release first, else the newest the system has)
FRAMEWORKS = {
    "trtllm": ("trtllm", ("1.3.0rc20", "1.0.0")),
    "vllm": ("vllm", ("0.24.0", "0.19.0", "0.14.0")),
    "sglang": ("sglang", ("0.5.14", "0.5.10")),
}
# the table's dtype -> the device profile's peak key and autopar's GEMM-efficiency key
DTYPES = {
    "bfloat16": ("bf16", "bf16"),
    "fp8": ("fp8", "fp8"),
    "fp8_block": ("fp8", "mxfp8"),
    "nvfp4": ("fp4", "nvfp4"),
}
BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0 + 4.0 / 128.0, "nvfp4": 0.5 + 1.0 / 16.0}
MIN_SHAPES = 200  # fewer measured shapes than this: no rates (a partial table)


def table(system: str, framework: str) -> tuple[str, Path] | None:
    """(version, path) of the system's MoE table for ``framework``, or None."""
    folder, versions = FRAMEWORKS[framework]
    base = Path(str(resources.files("aiconfigurator_core") / "systems" / "data" / system / "moe" / folder))
    for v in versions:
        p = base / v / "moe_perf.parquet"
        if p.is_file():
            return v, p
    return None


def shapes(path: Path, dtype: str):
    """Balanced-routing rows of ``dtype``: the fastest gated kernel per shape and token count."""
    import pandas as pd

    d = pd.read_parquet(path)
    d = d[(d.moe_dtype == dtype) & (d.distribution == "balanced")]
    d = d[~d.kernel_source.str.contains("nongated|min_latency|situ_as_silu")]
    keys = ["hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "num_tokens"]
    return d.groupby(keys).latency.min().reset_index()


def law_inputs(d, wbytes: float) -> dict[str, np.ndarray]:
    """:func:`autopar.moe_kernels.layer_time`'s arrays for the table's rows (gated experts: fc1 2F x h,
    fc2 h x F, F split over the expert TP)."""
    T = d.num_tokens.to_numpy(float)
    h = d.hidden_size.to_numpy(float)
    F = d.inter_size.to_numpy(float) / d.moe_tp_size.to_numpy(float)
    k = d.topk.to_numpy(float)
    E = d.num_experts.to_numpy(float)
    ep = d.moe_ep_size.to_numpy(float)
    return {
        "tokens": T,
        "rows": T * k / ep,
        "local_experts": E / ep,
        "activated": 1.0 - np.power(1.0 - k / E, T),
        "flops_per_row": 2.0 * 3.0 * F * h,
        "weight_bytes_per_expert": 3.0 * F * h * wbytes,
        "row_width": h,
    }


def fit_rates(d, wbytes: float, peak: float, hbm_bw: float) -> dict[str, float]:
    """The four rates fitted to the rows (soft-L1 on log latency), with the fit's errors."""
    from scipy.optimize import least_squares

    from autopar.moe_kernels import MoeRate, layer_time

    x = law_inputs(d, wbytes)
    y = d.latency.to_numpy(float) * 1e-3

    def model(p):
        c, b, f, t = np.exp(p)
        return layer_time(MoeRate(c, b, f, t, "fit", True), peak=peak, hbm_bw=hbm_bw, **x)[0]

    def res(p):
        return np.log(model(p)) - np.log(y)

    sol = least_squares(
        res,
        np.log([0.5, 0.8, 25.0, 5.0]),
        bounds=(np.log([0.02, 0.05, 0.1, 1e-3]), np.log([1.0, 1.0, 500.0, 500.0])),
        loss="soft_l1",
        f_scale=0.1,
    )
    r = res(sol.x)
    ape = np.abs(np.expm1(r))
    c, b, f, t = np.exp(sol.x)
    return {
        "compute": round(float(c), 3),
        "bandwidth": round(float(b), 3),
        "fixed_us": round(float(f), 1),
        "per_token_ns": round(float(t), 2),
        "shapes": int(len(y)),
        "rms_log_error": round(float(np.sqrt(np.mean(r**2))), 3),
        "median_ape": round(float(np.median(ape)), 3),
        "p90_ape": round(float(np.percentile(ape, 90)), 3),
    }


def dense_pricing_ratio(d, wbytes: float, co, peak: float, eff: float) -> float:
    """Median measured / priced of the pricing before these rates: the serving model's dense GEMM
    (:func:`autopar.serving.estimate._gemm`: each expert's rows, at least a 64-row tile, at the dense
    per-row rate; the touched weights at full HBM bandwidth) over the expert MLP's two GEMMs."""
    from dataclasses import replace

    from autopar.serving.estimate import _gemm

    x = law_inputs(d, wbytes)
    co_inf = replace(co, hbm_bw=math.inf)
    F = d.inter_size.to_numpy(float) / d.moe_tp_size.to_numpy(float)
    h = x["row_width"]
    tpe = x["rows"] / x["local_experts"]
    t = sum(
        _gemm(co_inf, co, peak, eff, tpe, N, K, wbytes, weight_frac=x["activated"], count=x["local_experts"])[
            0
        ]
        for N, K in ((2.0 * F, h), (h, F))
    )
    return float(np.median(d.latency.to_numpy(float) * 1e-3 / t))


def rates(device_id: str) -> dict[str, dict[str, dict]]:
    """{backend: {dtype: rates}} of ``device_id``."""
    from autopar.coefficients import coefficients_for, load_calibration
    from autopar.hardware import load_device

    dev = load_device(device_id)
    co, _ = coefficients_for(dev, load_calibration(None))
    out: dict[str, dict[str, dict]] = {}
    for backend in FRAMEWORKS:
        found = table(SYSTEMS[device_id], backend)
        if found is None:
            continue
        version, path = found
        for dtype, (peak_key, eff_key) in DTYPES.items():
            if peak_key not in dev.peak_tflops:
                continue
            d = shapes(path, dtype)
            if len(d) < MIN_SHAPES:
                continue
            peak = dev.peak_tflops[peak_key] * 1e12
            eff = co.gemm_eff.get(eff_key, co.gemm_eff.get(peak_key, co.gemm_eff["bf16"]))
            row = fit_rates(d, BYTES[dtype], peak, co.hbm_bw)
            row["dense_eff"] = round(float(eff), 3)
            row["dense_pricing_ratio"] = round(dense_pricing_ratio(d, BYTES[dtype], co, peak, eff), 2)
            row["table"] = f"aiconfigurator-core {SYSTEMS[device_id]}/moe/{backend}/{version}"
            out.setdefault(backend, {})[dtype] = row
    return out


def transfer(all_rates: dict[str, dict]) -> dict[str, float]:
    """Medians over every measured (device, backend, dtype): what a device without a table takes."""
    rows = [r for dev in all_rates.values() for per in dev.values() for r in per.values()]
    return {
        "compute_over_dense": round(float(np.median([r["compute"] / r["dense_eff"] for r in rows])), 3),
        "bandwidth": round(float(np.median([r["bandwidth"] for r in rows])), 3),
        "fixed_us": round(float(np.median([r["fixed_us"] for r in rows])), 1),
        "per_token_ns": round(float(np.median([r["per_token_ns"] for r in rows])), 2),
        "entries": len(rows),
    }


def document(all_rates: dict[str, dict]) -> dict:
    import importlib.metadata as md

    return {
        "schema": "autopar.moe_kernels/v1",
        "source": f"aiconfigurator-core {md.version('aiconfigurator-core')} measured MoE tables "
        "(balanced routing, the fastest gated kernel per shape); fitted by studies/moe_rates.py --write",
        "law": "t = max(F / (peak * compute), W / (hbm * bandwidth)) + moved / (hbm * bandwidth) "
        "+ fixed_us + per_token_ns * T  (autopar.moe_kernels.layer_time)",
        "devices": {
            d: {b: {dt: {k: v for k, v in r.items()} for dt, r in per.items()} for b, per in bk.items()}
            for d, bk in all_rates.items()
            if bk
        },
        "transfer": transfer(all_rates),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write the table here")
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    a = ap.parse_args(argv)
    if not have_tables():
        return 2
    all_rates = {d: rates(d) for d in SYSTEMS}
    print(
        "compute share of the dense peak / bandwidth share / fixed us / per-token ns; fit median and p90 "
        "|error|; measured over the dense-GEMM pricing (median)"
    )
    for d, bk in all_rates.items():
        for b, per in bk.items():
            for dt, r in per.items():
                print(
                    f"{d:<15} {b:<7} {dt:<10} {r['compute']:6.3f} {r['bandwidth']:6.3f} {r['fixed_us']:6.1f} "
                    f"{r['per_token_ns']:7.2f}   fit {r['median_ape'] * 100:5.1f}% p90 {r['p90_ape'] * 100:5.1f}% "
                    f"({r['shapes']} shapes)   measured/dense pricing x{r['dense_pricing_ratio']:.2f}"
                )
    doc = document(all_rates)
    print("transfer (devices without a table):", doc["transfer"])
    if a.json:
        a.json.write_text(json.dumps(doc, indent=2))
    if a.write:
        import yaml

        head = (
            "# Measured MoE-layer kernel rates (autopar.moe_kernels): generated by\n"
            "#   python studies/moe_rates.py --write\n# Do not edit by hand; re-run the study.\n"
        )
        tmp = OUT.with_suffix(".yaml.tmp")  # whole or not at all
        tmp.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=110))
        tmp.replace(OUT)
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
