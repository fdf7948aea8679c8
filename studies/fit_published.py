"""Fit the latency model's coefficients to the measured training runs of a published-runs CSV.

    python studies/fit_published.py [--csv A.csv --csv B.csv] \
        [--out cost_models/calibration/default.yaml] [--holdout-source SOURCE_ID]

By default the three shipped CSVs (``studies/data/published_runs_dev.csv``, ``..._dev2.csv`` and
``..._dev3.csv``) are read.

Rows with a measured throughput or step time are used, and (unless --measured-only) rows whose
target is a published TFLOP/s or MFU converted with the source's own FLOP formula. Sources are
balanced (weight 1/sqrt(rows of the source)). With --holdout-source the named source is left out of the fit and its error is printed, to
show how the coefficients carry over to a framework they were not fitted on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from published import DEV2_CSV, DEV3_CSV, DEV_CSV, load_cases, run_case

from autopar.calibration.fit import (
    DEFAULT_MAX_NFEV,
    FitResult,
    Sample,
    file_digest,
    fit,
    now_iso,
    residuals,
    write_calibration,
)
from autopar.coefficients import Calibration, default_calibration_path

# Devices built on the same compute die as a device in the data (NVIDIA: H200, H800 and H100 96GB
# are GH100; A100 40GB and 80GB are GA100): their compute efficiencies carry over unchanged.
SAME_SILICON = {
    "h200-sxm-141gb": "h100-sxm-80gb",
    "h800-sxm-80gb": "h100-sxm-80gb",
    "h100-sxm-96gb": "h100-sxm-80gb",
    "a100-40gb": "a100-80gb",
    "a100-80gb": "a100-40gb",
}


# The compute die of each device with published runs (one die, one coefficient: a fit gives every
# device of a die the same GEMM and attention efficiencies; their peaks, clocks, memory and links stay
# their own). GA100: A100 SXM 40/80 GB and A100 PCIe; GH100: H100/H200/H800 and GH200's GPU; B200 and GB200 NVL72 carry
# the same Blackwell GPU, B300 and GB300 NVL72 the Blackwell Ultra one (NVIDIA datasheets [S4][S5]).
DIES = {
    "a100-40gb": "ga100",
    "a100-80gb": "ga100",
    "a100-pcie-80gb": "ga100",
    "h100-sxm-80gb": "gh100",
    "h200-sxm-141gb": "gh100",
    "h800-sxm-80gb": "gh100",
    "h100-sxm-96gb": "gh100",
    "gh200": "gh100",
    "b200": "blackwell",
    "gb200-nvl72": "blackwell",
    "b300": "blackwell-ultra",
    "gb300-nvl72": "blackwell-ultra",
}


BASE = Calibration.model_validate({"transfer": {"same_silicon": SAME_SILICON, "dies": DIES}})


# The columns that make two rows one configuration: a recipe re-run in successive container releases
# (the Megatron-Bridge archive) is a repeated measurement, weighted as one (README-dev3).
CONFIG_KEYS = (
    "source_id",
    "model",
    "device",
    "num_devices",
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "etp",
    "precision",
    "seq_len",
    "micro_batch",
    "global_batch",
    "orig_zero_or_fsdp",
    "recompute",
)


def config_key(row: dict) -> tuple:
    return tuple((row.get(k) or "").strip() for k in CONFIG_KEYS)


def samples(cases) -> list[Sample]:
    from collections import Counter

    repeats = Counter(config_key(c.row) for c in cases)
    return [
        Sample(
            c.run_id,
            c.job,
            c.table,
            c.measured_tps,
            c.row.get("precision") or "bf16",
            c.row.get("source_id") or "",
            1.0 / repeats[config_key(c.row)],
        )
        for c in cases
    ]


def usable(cases, *, measured_only: bool = False) -> list:
    """Predicted training rows with a throughput target (derived ones unless ``measured_only``)."""
    return [
        c
        for c in cases
        if c.prediction is not None
        and c.measured_tps
        and c.target_kind in (("measured",) if measured_only else ("measured", "derived"))
    ]


def fit_cases(cases, *, max_nfev: int = DEFAULT_MAX_NFEV, provenance: dict | None = None) -> FitResult:
    """The coefficient fit on already-run cases (run them with :data:`BASE` as calibration)."""
    return fit(samples(cases), BASE, max_nfev=max_nfev, provenance=provenance)


def holdout_mape(cases, calibration: Calibration) -> float:
    return float(np.mean(np.abs(np.exp(residuals(samples(cases), calibration)) - 1)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--csv", type=Path, action="append", default=None, help="repeatable; default: the three shipped CSVs"
    )
    ap.add_argument("--out", type=Path, default=None, help="write the calibration here")
    ap.add_argument("--holdout-source", default=None)
    ap.add_argument("--max-nfev", type=int, default=DEFAULT_MAX_NFEV)
    ap.add_argument("--measured-only", action="store_true", help="ignore derived (TFLOP/s, MFU) targets")
    a = ap.parse_args(argv)
    paths = a.csv or [DEV_CSV, DEV2_CSV, DEV3_CSV]
    for p in paths:
        if not p.is_file():
            print(f"error: {p} does not exist (pass --csv PATH to a published-runs CSV)", file=sys.stderr)
            return 2
    cases = [c for p in paths for c in load_cases(p)]
    for c in cases:
        run_case(c, BASE)
    rows = usable(cases, measured_only=a.measured_only)
    train = [c for c in rows if c.row.get("source_id") != a.holdout_source]
    test = [c for c in rows if c.row.get("source_id") == a.holdout_source]

    t0 = time.perf_counter()
    prov = {
        "method": "scipy least_squares (soft_l1, source-balanced log-throughput residuals) on training rows",
        "derived_targets": not a.measured_only,
        "data": ", ".join(p.name for p in paths),
        "data_sha256_16": {p.name: file_digest(p) for p in paths},
        "rows": len(train),
        "holdout_source": a.holdout_source,
        "date": now_iso(),
    }
    res = fit_cases(train, max_nfev=a.max_nfev, provenance=prov)
    dt = time.perf_counter() - t0
    print(
        f"fitted {len(res.names)} coefficients on {len(train)} rows in {dt:.1f} s; train MAPE {res.mape:.1%}"
    )
    print(f"  {res.convergence()}")
    for n, v in zip(res.names, res.values, strict=True):
        print(f"  {n:<40} {v:10.4f}")
    if test:
        print(f"holdout {a.holdout_source}: n={len(test)} MAPE {holdout_mape(test, res.calibration):.1%}")
    if a.out:
        res.calibration.provenance["train_mape"] = round(res.mape, 4)
        write_calibration(res.calibration, a.out)
        print(f"wrote {a.out}")
    elif a.out is None and not a.holdout_source:
        print(f"(pass --out {default_calibration_path()} to ship it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
