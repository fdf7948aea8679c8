"""Measured GEMM rates at training shapes, per device and precision, from AIConfigurator's kernel tables.

    pip install -e ".[aiconfigurator]"      # aiconfigurator-core (Apache-2.0) and pyarrow
    python studies/gemm_rates.py [--json OUT]

NVIDIA's AIConfigurator ships GEMM latencies it measured on each GPU (``aiconfigurator_core/systems/
data/<system>/gemm/trtllm/<version>/gemm_perf.parquet``: m, n, k, dtype, latency in ms; cuBLAS/CUTLASS
through TensorRT-LLM's torch flow, DeepGEMM for block-scaled FP8). For each device autopar profiles and
each precision a training stack runs, it fits autopar's GEMM shape law (``autopar.latency.gemm_time``:
an efficiency at the 16384^3 reference and a half-dimension) to the fastest kernel's measured rate
on every training-sized shape of the table (m 1024 ... 16384 tokens; n, k 1024 ... 16384) and prints
both with the fit's rms log error. Those figures are the device profiles' ``efficiency.gemm`` and
``efficiency.gemm_half_dim`` / ``gemm_half_dim_by_precision`` values (each cites this study), so a
device's matmul rate is measured, not the datasheet peak times a fit to another device;
``tests/test_gemm_rates.py`` re-derives them when the extra is installed.

Precision mapping (autopar -> the table's dtype): bf16 -> bfloat16; fp8 (per-tensor scaling) -> fp8;
mxfp8 (block-scaled FP8) -> fp8_block (DeepGEMM 128-blockwise: the closest block-scaled FP8 the table
measures; MXFP8's 32-element blocks are finer); nvfp4 -> nvfp4.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np

# autopar device id -> (AIConfigurator system, TensorRT-LLM version of its GEMM table)
SYSTEMS = {
    "a100-80gb": ("a100_sxm", "1.0.0"),
    "h100-sxm-80gb": ("h100_sxm", "1.3.0rc20"),
    "h200-sxm-141gb": ("h200_sxm", "1.3.0rc20"),
    "b200": ("b200_sxm", "1.3.0rc20"),
    "gb200-nvl72": ("gb200", "1.3.0rc20"),
    "b300": ("b300_sxm", "1.3.0rc20"),
    "gb300-nvl72": ("gb300", "1.3.0rc20"),
}
# autopar precision -> (the table's dtype, the profile's peak key)
DTYPES = {
    "bf16": ("bfloat16", "bf16"),
    "fp8": ("fp8", "fp8"),
    "mxfp8": ("fp8_block", "fp8"),
    "nvfp4": ("nvfp4", "fp4"),
}
TOKENS = (1024, 2048, 4096, 8192, 16384)
DIMS = (1024, 2048, 3072, 4096, 5120, 6144, 8192, 10240, 12288, 16384)


def table_path(system: str, version: str) -> Path:
    return Path(
        str(
            resources.files("aiconfigurator_core") / "systems" / "data" / system / "gemm" / "trtllm" / version
        )
    )


def rates(device_id: str) -> dict[str, dict[str, float]]:
    """{precision: {efficiency, shapes}} of ``device_id`` from its AIConfigurator GEMM table."""
    import pandas as pd

    from autopar.hardware import load_device

    system, version = SYSTEMS[device_id]
    dev = load_device(device_id)
    df = pd.read_parquet(table_path(system, version) / "gemm_perf.parquet")
    df = df[df.m.isin(TOKENS) & df.n.isin(DIMS) & df.k.isin(DIMS)]
    out: dict[str, dict[str, float]] = {}
    for prec, (dtype, peak_key) in DTYPES.items():
        g = df[df.gemm_dtype == dtype]
        if g.empty or peak_key not in dev.peak_tflops:
            continue
        g = g.groupby(["m", "n", "k"]).latency.min().reset_index()  # the fastest kernel per shape
        M, N, K = (g[c].to_numpy(float) for c in ("m", "n", "k"))
        eff = 2.0 * M * N * K / (g.latency.to_numpy(float) * 1e-3) / (dev.peak_tflops[peak_key] * 1e12)
        e16k, hd, rms = fit_shape(M, N, K, eff)
        out[prec] = {
            "efficiency": round(e16k, 3),
            "half_dim": round(hd, 0),
            "rms_log_error": round(rms, 3),
            "shapes": int(len(g)),
        }
    return out


def fit_shape(M, N, K, eff) -> tuple[float, float, float]:
    """(efficiency at the reference size, half-dimension, rms log error) of autopar's GEMM shape law
    (:func:`autopar.latency.gemm_time`: eff x (1 + 3d/R) / (1 + d/M + d/N + d/K), R = 16384) fitted to
    the measured efficiencies in log space."""
    from scipy.optimize import least_squares

    from autopar.latency import MAMF_REFERENCE_DIM as R

    def res(x):
        e, d = x
        return np.log(e * (1 + 3 * d / R) / (1 + d / M + d / N + d / K) / eff)

    sol = least_squares(res, [0.7, 300.0], bounds=([0.05, 1.0], [1.0, 8192.0]))
    r = res(sol.x)
    return float(sol.x[0]), float(sol.x[1]), float(np.sqrt(np.mean(r**2)))


def have_tables() -> bool:
    """Whether aiconfigurator-core's tables (and pyarrow to read them) are installed; says what to
    install on stderr when not."""
    try:
        import aiconfigurator_core  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        print(
            "error: this study reads aiconfigurator-core's tables: pip install -e '.[aiconfigurator]'",
            file=sys.stderr,
        )
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write the table here")
    a = ap.parse_args(argv)
    if not have_tables():
        return 2
    table = {d: rates(d) for d in SYSTEMS}
    print(
        "efficiency at the 16384^3 reference (fraction of the profile's dense peak) / half-dimension / rms log error"
    )
    print(f"{'device':<16} " + " ".join(f"{p:>22}" for p in DTYPES))
    for d, r in table.items():
        cells = [
            f"{r[p]['efficiency']:6.3f} {r[p]['half_dim']:6.0f} {r[p]['rms_log_error']:5.2f}"
            if p in r
            else "-"
            for p in DTYPES
        ]
        print(f"{d:<16} " + " ".join(f"{c:>22}" for c in cells))
    if a.json:
        a.json.write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
