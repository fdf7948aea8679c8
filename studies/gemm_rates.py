"""Measured GEMM rates at training shapes, per device and precision, from AIConfigurator's kernel tables.

    pip install -e ".[aiconfigurator]"      # aiconfigurator-core (Apache-2.0) and pyarrow
    python studies/gemm_rates.py [--json OUT]

NVIDIA's AIConfigurator ships GEMM latencies it measured on each GPU (``aiconfigurator_core/systems/
data/<system>/gemm/trtllm/<version>/gemm_perf.parquet``: m, n, k, dtype, latency in ms; cuBLAS/CUTLASS
through TensorRT-LLM's torch flow, DeepGEMM for block-scaled FP8). For each device autopar profiles and
each precision a training stack runs, this prints the achieved fraction of the profile's dense peak,
as the geometric mean over the training-shaped GEMMs of the table (m in 4096, 8192, 16384 tokens; n and
k in 4096 ... 16384) and the fastest kernel per shape. Those figures are the device profiles'
``efficiency.gemm`` values (each cites this study), so a device's matmul rate is measured, not the
datasheet peak times a fit to another device; ``tests/test_gemm_rates.py`` re-derives them when the
extra is installed.

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
TOKENS = (4096, 8192, 16384)
DIMS = (4096, 5120, 6144, 8192, 10240, 12288, 16384)


def table_path(system: str, version: str) -> Path:
    return Path(str(resources.files("aiconfigurator_core") / "systems" / "data" / system / "gemm" / "trtllm" / version))


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
        flops = 2.0 * g.m.to_numpy(float) * g.n.to_numpy(float) * g.k.to_numpy(float)
        eff = flops / (g.latency.to_numpy(float) * 1e-3) / (dev.peak_tflops[peak_key] * 1e12)
        out[prec] = {"efficiency": round(float(np.exp(np.log(eff).mean())), 3), "shapes": int(len(g))}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write the table here")
    a = ap.parse_args(argv)
    try:
        import aiconfigurator_core  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        print("error: this study reads aiconfigurator-core's tables: pip install -e '.[aiconfigurator]'", file=sys.stderr)
        return 2
    table = {d: rates(d) for d in SYSTEMS}
    print(f"{'device':<16} " + " ".join(f"{p:>7}" for p in DTYPES) + "   (fraction of the profile's dense peak)")
    for d, r in table.items():
        print(f"{d:<16} " + " ".join(f"{r[p]['efficiency']:7.3f}" if p in r else f"{'-':>7}" for p in DTYPES))
    if a.json:
        a.json.write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
