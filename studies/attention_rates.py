"""Measured attention-kernel rates per device, head dimension and sequence, from AIConfigurator's tables.

    pip install -e ".[aiconfigurator]"      # aiconfigurator-core (Apache-2.0) and pyarrow
    python studies/attention_rates.py [--json OUT]

NVIDIA's AIConfigurator ships the latencies of TensorRT-LLM's fused context-attention kernel (causal
FlashAttention-style FMHA: QK^T, softmax exponentials and PV in one kernel) measured on each GPU
(``aiconfigurator_core/systems/data/<system>/attention/trtllm/<version>/context_attention_perf.parquet``:
batch, sequence, query and KV heads, head dimension, window, dtypes, latency in ms). For each device
autopar profiles, each head dimension (64, 128, 256) and each sequence (1k ... 16k tokens) this prints
the achieved forward rate as a fraction of the device's dense bf16 peak: causal FLOPs
``2 * b * s^2 * heads * d`` over the fastest measured latency among the rows with bf16 queries and KV, no
window, at least 32 query heads and at least 16k tokens per call (the shapes of a training micro-batch).

Those fractions are the device profiles' ``efficiency.attention_fwd`` curves (each cites this study):
the forward rate of the kernel, exponentials included, as measured on the device, so Blackwell's
attention runs at what its tensor cores AND its special-function units deliver (FlashAttention-4's
point), not at a peak ratio times an H100 fit. ``autopar.latency`` interpolates the curve in log head
dimension and log sequence; what the training fit adjusts is one global factor (the training stack's
forward + backward kernels relative to this inference forward kernel), not one per device.
``tests/test_attention_rates.py`` re-derives every profile figure when the extra is installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from gemm_rates import have_tables

# autopar device id -> (AIConfigurator system, TensorRT-LLM version of its attention table)
SYSTEMS = {
    "a100-80gb": ("a100_sxm", "1.0.0"),
    "h100-sxm-80gb": ("h100_sxm", "1.3.0rc20"),
    "h200-sxm-141gb": ("h200_sxm", "1.3.0rc20"),
    "b200": ("b200_sxm", "1.3.0rc20"),
    "gb200-nvl72": ("gb200", "1.3.0rc20"),
    "b300": ("b300_sxm", "1.3.0rc20"),
    "gb300-nvl72": ("gb300", "1.3.0rc20"),
}
HEAD_DIMS = (64, 128, 256)
SEQS = (1024, 2048, 4096, 8192, 16384)
MIN_HEADS = 32
MIN_TOKENS = 16384


def table_path(system: str, version: str) -> Path:
    return Path(
        str(
            resources.files("aiconfigurator_core")
            / "systems"
            / "data"
            / system
            / "attention"
            / "trtllm"
            / version
            / "context_attention_perf.parquet"
        )
    )


def rates(device_id: str) -> dict[int, list[tuple[int, float]]]:
    """{head_dim: [(sequence, achieved fraction of dense bf16 peak), ...]} of ``device_id``."""
    import pandas as pd

    from autopar.hardware import load_device

    system, version = SYSTEMS[device_id]
    peak = load_device(device_id).peak_tflops["bf16"] * 1e12
    df = pd.read_parquet(table_path(system, version))
    df = df[
        (df.window_size == 0)
        & (df.attn_dtype == "bfloat16")
        & (df.kv_cache_dtype == "bfloat16")
        & (df.num_heads >= MIN_HEADS)
        & (df.batch_size * df.isl >= MIN_TOKENS)
    ]
    out: dict[int, list[tuple[int, float]]] = {}
    for d in HEAD_DIMS:
        pts = []
        for s in SEQS:
            g = df[(df.head_dim == d) & (df.isl == s)]
            if g.empty:
                continue
            flops = (
                2.0 * g.batch_size * g.isl.astype(float) ** 2 * g.num_heads * d
            )  # causal: half of 4 b s^2 h d
            frac = float((flops / (g.latency * 1e-3)).max() / peak)
            pts.append((s, round(frac, 3)))
        if len(pts) >= 2:
            out[d] = pts
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write the table here")
    a = ap.parse_args(argv)
    if not have_tables():
        return 2
    table = {d: rates(d) for d in SYSTEMS}
    print("causal forward attention, bf16: achieved fraction of the profile's dense bf16 peak")
    print(f"{'device':<16} {'head dim':>8} " + " ".join(f"{s:>6}" for s in SEQS))
    for dev, r in table.items():
        for d, pts in r.items():
            got = dict(pts)
            print(f"{dev:<16} {d:>8} " + " ".join(f"{got[s]:6.3f}" if s in got else "     -" for s in SEQS))
    if a.json:
        a.json.write_text(
            json.dumps({k: {str(d): v for d, v in r.items()} for k, r in table.items()}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
