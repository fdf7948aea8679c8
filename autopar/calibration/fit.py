"""Fit the latency model's physical coefficients to measured step times (scipy least squares).

Per device type: achieved GEMM efficiency per precision, FlashAttention efficiency and the GEMM
half-efficiency dimension; globally: the overlap contention and the per-layer kernel overhead.
Residuals are log(predicted / measured) throughput with a soft-L1 loss, so no single row or source
dominates, and every coefficient is bounded to its physically plausible range.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import least_squares

from autopar.coefficients import GLOBAL_DEFAULTS, Calibration, DeviceCoefficients
from autopar.engine import evaluate
from autopar.job import TrainingJob
from autopar.layout import LayoutTable

# (name, lower, upper) per device; gemm_<precision> entries only where that precision was measured.
DEVICE_PARAMS = (("attention", 0.08, 0.9), ("gemm_half_dim", 8.0, 2048.0))
GEMM_BOUNDS = (0.2, 0.95)
GLOBAL_PARAMS = (
    ("overlap_contention", 0.0, 1.0),
    ("kernel_overhead_us", 0.0, 300.0),
    ("tp_overlap", 0.0, 0.9),
)
# A fitted GEMM efficiency may not exceed the device's measured max-achievable matmul rate (MAMF,
# its profile value) by more than this factor: end-to-end training cannot beat the microbenchmark.
MAMF_SLACK = 1.05


@dataclass
class Sample:
    """One measured run: its job, its layout (a table of one) and its measured throughput."""

    key: str
    job: TrainingJob
    table: LayoutTable
    measured_tokens_per_s_per_device: float
    precision: str
    group: str = ""  # e.g. the source: groups are balanced in the loss


@dataclass
class FitResult:
    calibration: Calibration
    residuals: np.ndarray
    names: list[str]
    values: np.ndarray

    @property
    def mape(self) -> float:
        return float(np.mean(np.abs(np.exp(self.residuals) - 1.0)))


def _parameter_space(samples: Sequence[Sample], base: Calibration):
    names: list[str] = []
    lo: list[float] = []
    hi: list[float] = []
    x0: list[float] = []
    devices = sorted({s.job.device.id for s in samples})
    for d in devices:
        dev = next(s.job.device for s in samples if s.job.device.id == d)
        precs = sorted(
            {
                ("bf16" if s.precision in ("bf16", "fp16") else s.precision)
                for s in samples
                if s.job.device.id == d
            }
        )
        for p in precs:
            names.append(f"{d}.gemm_{p}")
            mamf = dev.efficiency.gemm.get(p, dev.efficiency.gemm["bf16"])
            top = min(GEMM_BOUNDS[1], mamf * MAMF_SLACK)
            lo.append(GEMM_BOUNDS[0])
            hi.append(top)
            x0.append(min(max(mamf * 0.9, GEMM_BOUNDS[0]), top))
        for name, a, b in DEVICE_PARAMS:
            names.append(f"{d}.{name}")
            lo.append(a)
            hi.append(b)
            v = getattr(dev.efficiency, name)
            x0.append(min(max(v, a), b))
    for name, a, b in GLOBAL_PARAMS:
        names.append(f"global.{name}")
        lo.append(a)
        hi.append(b)
        x0.append(min(max(base.global_value(name), a), b))
    return names, np.array(x0), np.array(lo), np.array(hi)


def calibration_from_vector(
    names: Sequence[str], x: np.ndarray, base: Calibration, provenance: dict[str, Any] | None = None
) -> Calibration:
    devices: dict[str, dict[str, Any]] = {}
    glob = dict(base.global_)
    for n, v in zip(names, x, strict=True):
        scope, key = n.split(".", 1)
        if scope == "global":
            glob[key] = float(v)
            continue
        d = devices.setdefault(scope, {"gemm": {}})
        if key.startswith("gemm_") and key != "gemm_half_dim":
            prec = key[5:]
            d["gemm"][prec] = float(v)
            if prec == "bf16":
                d["gemm"]["fp16"] = float(v)  # same tensor-core rate and kernels
        else:
            d[key] = float(v)
    merged = {k: v.model_dump(exclude_none=True) for k, v in base.devices.items()}
    for k, v in devices.items():
        merged.setdefault(k, {}).update({kk: vv for kk, vv in v.items() if kk != "gemm"})
        merged[k]["gemm"] = {**merged[k].get("gemm", {}), **v["gemm"]}
    return Calibration.model_validate(
        {
            "schema": "autopar.calibration/v1",
            "provenance": provenance or dict(base.provenance),
            "global": glob,
            "transfer": base.transfer.model_dump(),
            "devices": {k: DeviceCoefficients(**v) for k, v in merged.items()},
        }
    )


def group_weights(samples: Sequence[Sample]) -> np.ndarray:
    """Weight 1/sqrt(group size): a large group counts more than a small one, but not linearly."""
    from collections import Counter

    n = Counter(s.group for s in samples)
    w = np.array([1.0 / np.sqrt(n[s.group]) for s in samples])
    return w / w.mean()


def transfer_ratios(cal: Calibration, samples: Sequence[Sample]) -> dict[str, float]:
    """Geometric-mean fitted/published ratios of GEMM (bf16) and attention efficiency."""
    g, a = [], []
    for dev in {s.job.device.id: s.job.device for s in samples}.values():
        dc = cal.devices.get(dev.id)
        if dc is None:
            continue
        if "bf16" in dc.gemm:
            g.append(dc.gemm["bf16"] / dev.efficiency.gemm["bf16"])
        if dc.attention is not None:
            a.append(dc.attention / dev.efficiency.attention)
    return {
        "gemm_ratio": float(np.exp(np.mean(np.log(g)))) if g else 1.0,
        "attention_ratio": float(np.exp(np.mean(np.log(a)))) if a else 1.0,
    }


def residuals(samples: Sequence[Sample], cal: Calibration) -> np.ndarray:
    out = np.empty(len(samples))
    for i, s in enumerate(samples):
        res = evaluate(s.job, s.table, calibration=cal, check_legal=False)
        out[i] = np.log(res["tokens_per_s_per_device"][0] / s.measured_tokens_per_s_per_device)
    return out


def fit(
    samples: Sequence[Sample],
    base: Calibration | None = None,
    *,
    max_nfev: int = 60,
    provenance: dict[str, Any] | None = None,
) -> FitResult:
    """Least-squares fit of the coefficients to ``samples``; returns a new Calibration."""
    base = base or Calibration()
    names, x0, lo, hi = _parameter_space(samples, base)

    w = group_weights(samples)

    def f(x: np.ndarray) -> np.ndarray:
        return w * residuals(samples, calibration_from_vector(names, x, base))

    sol = least_squares(
        f,
        x0,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=0.1,
        max_nfev=max_nfev,
        x_scale=np.maximum(np.abs(x0), 1e-3),
        diff_step=1e-3,
    )
    cal = calibration_from_vector(names, sol.x, base, provenance)
    cal = cal.model_copy(update={"transfer": cal.transfer.model_copy(update=transfer_ratios(cal, samples))})
    r = residuals(samples, cal)
    cal.provenance["residuals"] = residual_summary(samples, r)
    return FitResult(cal, r, names, sol.x)


def residual_summary(samples: Sequence[Sample], r: np.ndarray) -> dict[str, dict[str, float]]:
    """Per device: rows and the median / 90th-percentile absolute relative error of the fit.

    Predictions quote these as their expected error (an in-sample figure: a lower bound).
    """
    out: dict[str, dict[str, float]] = {}
    for d in sorted({s.job.device.id for s in samples}):
        e = np.array([abs(np.exp(x) - 1.0) for s, x in zip(samples, r, strict=True) if s.job.device.id == d])
        out[d] = {
            "rows": int(len(e)),
            "median_ape": round(float(np.median(e)), 4),
            "p90_ape": round(float(np.percentile(e, 90)), 4),
        }
    return out


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def write_calibration(cal: Calibration, path: Path) -> None:
    """Write atomically: a reader never sees a half-written calibration."""
    data = {
        "schema": "autopar.calibration/v1",
        "provenance": cal.provenance,
        "global": {k: round(v, 6) for k, v in cal.global_.items()},
        "transfer": {
            **cal.transfer.model_dump(),
            "gemm_ratio": round(cal.transfer.gemm_ratio, 4),
            "attention_ratio": round(cal.transfer.attention_ratio, 4),
        },
        "devices": {
            k: {
                kk: (({g: round(x, 4) for g, x in vv.items()}) if isinstance(vv, dict) else round(vv, 4))
                for kk, vv in v.model_dump(exclude_none=True).items()
                if vv not in ({}, None)
            }
            for k, v in sorted(cal.devices.items())
        },
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "Sample",
    "FitResult",
    "fit",
    "residuals",
    "calibration_from_vector",
    "write_calibration",
    "GLOBAL_DEFAULTS",
    "file_digest",
    "now_iso",
]
