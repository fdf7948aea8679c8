"""Fit the latency model's physical coefficients to measured step times (scipy least squares).

Per device type: achieved GEMM efficiency per precision, FlashAttention efficiency and the GEMM
half-efficiency dimension; globally: the overlap contention and the per-layer kernel overhead; per
training stack with enough rows (other than Megatron, whose rows set the global values): its own
overlap contention.
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

from autopar.coefficients import GLOBAL_DEFAULTS, REFERENCE_STACK, Calibration, DeviceCoefficients
from autopar.engine import stage_param_counts, step_breakdown, time_model
from autopar.job import TrainingJob
from autopar.layout import LayoutTable

# (name, lower, upper) per device; gemm_<precision> entries only where that precision was measured.
DEVICE_PARAMS = (("attention", 0.08, 0.9), ("gemm_half_dim", 8.0, 2048.0))
GEMM_BOUNDS = (0.2, 0.95)
# Hidden communication is never free: an in-flight NCCL collective holds its channels' CTAs (NCCL
# runs up to 32 channels on H100: 32 of 132 SMs, ~24%) and shares HBM bandwidth with the compute it
# hides behind, so the compute slows by at least ~0.2 s per second of overlap. The published runs do
# not pin the value for Megatron (their MAPE is flat from 0 to 0.2), so the bound decides it there.
MIN_OVERLAP_CONTENTION = 0.2
GLOBAL_PARAMS = (
    ("overlap_contention", MIN_OVERLAP_CONTENTION, 1.0),
    ("kernel_overhead_us", 0.0, 300.0),
    ("tp_overlap", 0.0, 0.9),
)
# Per training stack (autopar.job.Framework) with at least MIN_STACK_ROWS rows, other than the
# reference stack whose rows fit the global values: its own overlap contention (how its overlap
# mechanism shares the device: DeepSpeed's host-synchronized ZeRO-3 fetches are not FSDP's
# prefetching streams). A stack with fewer rows, or none, takes the most conservative fitted
# contention (coefficients.Calibration.stack_value).
STACK_PARAMS = (("overlap_contention", MIN_OVERLAP_CONTENTION, 1.0),)
MIN_STACK_ROWS = 6
# A fitted GEMM efficiency may not exceed the device's measured max-achievable matmul rate (MAMF,
# its profile value) by more than this factor: end-to-end training cannot beat the microbenchmark.
MAMF_SLACK = 1.05
# Relative forward-difference step of the Jacobian (what the fit has always used as diff_step).
DIFF_STEP = 1e-3
DEFAULT_MAX_NFEV = 60
# Stop when a step improves the soft-L1 cost by less than this fraction (scipy's ftol). On the
# published runs the cost flattens within ~12 steps (the fit on all 319 rows of dev + dev2: 6.16 ->
# 2.8642 at step 11, then 2.8634 after 25 more steps, <= 0.01% each, while parameters drift
# along flat directions); scipy's default 1e-8 would run those to max_nfev.
FTOL = 1e-4


@dataclass
class Sample:
    """One measured run: its job, its layout (a table of one) and its measured throughput."""

    key: str
    job: TrainingJob
    table: LayoutTable
    measured_tokens_per_s_per_device: float
    precision: str
    group: str = ""  # e.g. the source: groups are balanced in the loss
    # Share of the loss within its group: 1/k for each of k repeated measurements of one configuration
    # (the same recipe re-run in successive container releases counts once, not k times).
    weight: float = 1.0


@dataclass
class FitResult:
    calibration: Calibration
    residuals: np.ndarray
    names: list[str]
    values: np.ndarray
    status: int = 0  # scipy least_squares: 0 = stopped at max_nfev, > 0 converged (see ``message``)
    message: str = ""
    nfev: int = 0
    njev: int = 0

    @property
    def converged(self) -> bool:
        return self.status > 0

    def convergence(self) -> str:
        """One line: converged or stopped at the evaluation limit, and after how many evaluations."""
        how = "converged" if self.converged else "NOT converged (stopped at max_nfev)"
        return f"{how} after {self.nfev} residual / {self.njev} Jacobian evaluations: {self.message}"

    @property
    def mape(self) -> float:
        return float(np.mean(np.abs(np.exp(self.residuals) - 1.0)))


def _parameter_space(samples: Sequence[Sample], base: Calibration):
    names: list[str] = []
    lo: list[float] = []
    hi: list[float] = []
    x0: list[float] = []
    if base.transfer.dies:
        return _die_parameter_space(samples, base)
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
    return _with_shared(names, lo, hi, x0, samples, base, GLOBAL_PARAMS)


def _with_shared(names, lo, hi, x0, samples, base: Calibration, global_params):
    """The parameter space completed with the global and the per-stack coefficients."""
    for name, a, b in global_params:
        names.append(f"global.{name}")
        lo.append(a)
        hi.append(b)
        x0.append(min(max(base.global_value(name), a), b))
    for st in fitted_stacks(samples):
        for name, a, b in STACK_PARAMS:
            names.append(f"stack:{st}.{name}")
            lo.append(a)
            hi.append(b)
            x0.append(min(max(base.stack_value(st, name), a), b))
    return names, np.array(x0), np.array(lo), np.array(hi)


# Die mode (``base.transfer.dies`` given): few physical coefficients. Per die, one factor on its
# members' measured matmul rates (each device's GEMM efficiency per precision from its profile,
# measured on the device: what end-to-end training reaches of the kernels) and one on its members'
# FlashAttention-class rate (the softmax exponentials are charged apart, at the SFU rate): each die
# runs its own attention kernels (FA2 on GA100, cuDNN/FA3 on GH100, cuDNN/FA4 on Blackwell). Bounds:
# a stack cannot beat its kernels (MAMF_SLACK); the attention kernels reach at most ATTENTION_MAX of
# the tensor-core peak (FA3 75% forward on H100, FA4 ~71% on B200).
GEMM_SCALE_BOUNDS = (0.3, MAMF_SLACK)
ATTENTION_MAX = 0.75
# Die mode's global coefficients: the classic ones and the half-dimension factor on every device's
# measured GEMM shape law (what a training stack's small GEMMs lose beyond the kernels').
DIE_GLOBAL_PARAMS = (
    *GLOBAL_PARAMS,
    ("half_dim_scale", 0.25, 16.0),
    ("moe_host_factor", 0.0, 4.0),
    # the training stack's attention kernels over the measured forward FMHA (efficiency.attention_fwd)
    ("attention_scale", 0.2, 1.5),
)


def _die_parameter_space(samples: Sequence[Sample], base: Calibration):
    names: list[str] = []
    lo: list[float] = []
    hi: list[float] = []
    x0: list[float] = []
    for d in sorted({fit_scope(s.job.device.id, base) for s in samples}):
        names.append(f"{d}.gemm_scale")
        lo.append(GEMM_SCALE_BOUNDS[0])
        hi.append(GEMM_SCALE_BOUNDS[1])
        x0.append(0.9)
        members = [s.job.device for s in samples if fit_scope(s.job.device.id, base) == d]
        if all(m.efficiency.attention_fwd for m in members):
            continue  # measured attention: the global attention_scale, not a factor of the die's own
        top = min(
            ATTENTION_MAX / (m.efficiency.attention * m.efficiency.fused_attention_speedup) for m in members
        )
        names.append(f"{d}.attention_ratio")
        lo.append(0.1)
        hi.append(top)
        x0.append(min(0.5, top))
    return _with_shared(names, lo, hi, x0, samples, base, DIE_GLOBAL_PARAMS)


def _profile(device_id: str):
    from autopar.hardware import load_device

    return load_device(device_id)


def fit_scope(device_id: str, base: Calibration) -> str:
    """What a device's compute coefficients are fitted as: its die (``die:NAME``, shared by every device of
    that die in ``base.transfer.dies``) or, where no die is given, the device itself."""
    die = base.transfer.dies.get(device_id)
    return f"die:{die}" if die else device_id


def fitted_stacks(samples: Sequence[Sample]) -> list[str]:
    """Stacks that get coefficients of their own: MIN_STACK_ROWS rows or more, not the reference."""
    from collections import Counter

    n = Counter(s.job.framework.name for s in samples)
    return sorted(st for st, k in n.items() if k >= MIN_STACK_ROWS and st != REFERENCE_STACK)


def calibration_from_vector(
    names: Sequence[str], x: np.ndarray, base: Calibration, provenance: dict[str, Any] | None = None
) -> Calibration:
    devices: dict[str, dict[str, Any]] = {}
    glob = dict(base.global_)
    stacks = {k: v.model_dump(exclude_none=True) for k, v in base.stacks.items()}
    for n, v in zip(names, x, strict=True):
        scope, key = n.split(".", 1)
        if scope == "global":
            glob[key] = float(v)
            continue
        if scope.startswith("stack:"):
            stacks.setdefault(scope[len("stack:") :], {})[key] = float(v)
            continue
        members = (
            sorted(k for k, x in base.transfer.dies.items() if x == scope[len("die:") :])
            if scope.startswith("die:")
            else [scope]
        )
        for m in members:
            d = devices.setdefault(m, {"gemm": {}})
            if key == "gemm_scale":  # die mode: each member's measured matmul rates times the factor
                prof = _profile(m).efficiency
                d["gemm"].update({p: min(float(e * v), 0.95) for p, e in prof.gemm.items()})
            elif key == "attention_ratio":  # die mode: each member's attention rate times the factor
                d["attention"] = float(_profile(m).efficiency.attention * v)
            elif key.startswith("gemm_") and key != "gemm_half_dim":
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
            "stacks": stacks,
        }
    )


def vector_from_calibration(names: Sequence[str], cal: Calibration, default: np.ndarray) -> np.ndarray:
    """The values ``cal`` sets for the coefficients ``names`` (``default`` where it sets none): the
    inverse of :func:`calibration_from_vector` for the coefficients it wrote."""
    x = np.array(default, dtype=float)
    for i, n in enumerate(names):
        scope, key = n.split(".", 1)
        v: Any = None
        if scope == "global":
            v = cal.global_.get(key)
        elif scope.startswith("stack:"):
            sc = cal.stacks.get(scope[len("stack:") :])
            v = getattr(sc, key, None) if sc is not None else None
        elif scope.startswith("die:") and key in ("gemm_scale", "attention_ratio"):
            # die mode: the factor a member of the die carries over its own profile's rate
            mate = next(
                (d for d, x in sorted(cal.transfer.dies.items()) if f"die:{x}" == scope and d in cal.devices),
                None,
            )
            if mate is not None:
                dc, prof = cal.devices[mate], _profile(mate).efficiency
                if key == "gemm_scale" and "bf16" in dc.gemm:
                    v = dc.gemm["bf16"] / prof.gemm["bf16"]
                elif key == "attention_ratio" and dc.attention is not None:
                    v = dc.attention / prof.attention
        elif scope in cal.devices:
            dc = cal.devices[scope]
            v = (
                dc.gemm.get(key[5:])
                if key.startswith("gemm_") and key != "gemm_half_dim"
                else getattr(dc, key)
            )
        if v is not None:
            x[i] = float(v)
    return x


def group_weights(samples: Sequence[Sample]) -> np.ndarray:
    """Weight 1/sqrt(group size): a large group counts more than a small one, but not linearly."""
    n: dict[str, float] = {}
    for s in samples:
        n[s.group] = n.get(s.group, 0.0) + s.weight
    w = np.array([s.weight / np.sqrt(n[s.group]) for s in samples])
    return w / w.mean()


# The attention shape at which a measured device's achieved training attention rate is compared with
# its profile's estimate (head dimension, keys per query): Llama-style heads at an 8k context.
TRANSFER_ATTENTION_SHAPE = (128.0, 8192.0)


def measured_attention_ratio(dev, cal: Calibration) -> float | None:
    """Achieved / estimated attention rate of a device with a measured forward kernel: the rate its
    training attention is charged at (the measured curve at :data:`TRANSFER_ATTENTION_SHAPE` times the
    fitted ``attention_scale``) over the rate the estimate path would charge it (the profile's
    ``efficiency.attention`` at that length, in series with the softmax exponentials on its SFUs), both
    as fractions of the bf16 peak. A device without a measured kernel is charged its estimate times
    the geometric mean of these ratios (``transfer.attention_ratio``), as fitted rates transferred
    before the curves. None where the profile has no curve."""
    from autopar.coefficients import coefficients_for
    from autopar.hardware import attention_fraction

    eff = dev.efficiency
    if not eff.attention_fwd or not eff.attention:
        return None
    co, _ = coefficients_for(dev, cal)
    hd, s = TRANSFER_ATTENTION_SHAPE
    achieved = float(attention_fraction(eff.attention_fwd, hd, s)) * co.attention_scale
    peak = dev.peak_tflops["bf16"] * 1e12
    sfu = peak / (2.0 * (2.0 * hd) * co.exp_rate) if co.exp_rate > 0 else 0.0  # seconds per flop x peak
    estimate = 1.0 / (1.0 / (eff.attention * s / (s + co.gemm_half_dim)) + sfu)
    return achieved / estimate


def transfer_ratios(cal: Calibration, samples: Sequence[Sample]) -> dict[str, float]:
    """Geometric-mean fitted/published ratios of GEMM (bf16) and attention efficiency: the attention
    ratio of a die is its fitted attention factor over the profile's, or, for a device charged at a
    measured kernel, :func:`measured_attention_ratio`."""
    per: dict[str, tuple[list[float], list[float]]] = {}  # one ratio per die (or undied device)
    for dev in {s.job.device.id: s.job.device for s in samples}.values():
        dc = cal.devices.get(dev.id)
        if dc is None:
            continue
        gg, aa = per.setdefault(fit_scope(dev.id, cal), ([], []))
        if "bf16" in dc.gemm:
            gg.append(dc.gemm["bf16"] / dev.efficiency.gemm["bf16"])
        if dc.attention is not None:
            aa.append(dc.attention / dev.efficiency.attention)
        elif (r := measured_attention_ratio(dev, cal)) is not None:
            aa.append(r)
    g = [float(np.exp(np.mean(np.log(x)))) for x, _ in per.values() if x]
    a = [float(np.exp(np.mean(np.log(y)))) for _, y in per.values() if y]
    return {
        "gemm_ratio": float(np.exp(np.mean(np.log(g)))) if g else 1.0,
        "attention_ratio": float(np.exp(np.mean(np.log(a)))) if a else 1.0,
    }


class FitRows:
    """The samples of a fit, prepared once for many residual evaluations.

    A residual needs only the step time (memory, energy and legality do not depend on the fitted
    coefficients), so this calls :func:`autopar.latency.step_time_breakdown` directly, with the
    engine's own pieces (:func:`autopar.engine.time_model`, :func:`autopar.engine.step_breakdown`;
    ``tests/test_fit.py`` checks it against ``evaluate`` row by row). Rows
    whose step-time inputs are equal (model, device, node size, sequence, LoRA, MoE options, stack:
    the device count and global batch enter only through the layout's dp and grad_accum columns)
    are stacked into one :class:`LayoutTable` and scored in one call; their parameter counts, which
    no coefficient changes, are computed once.
    """

    def __init__(self, samples: Sequence[Sample]):
        self.samples = list(samples)
        keyed: dict[tuple, list[int]] = {}
        for i, s in enumerate(self.samples):
            j = s.job
            key = (
                j.model.model_dump_json(),
                j.device.model_dump_json(),
                j.devices_per_node,
                j.seq_len,
                j.frozen_weights,
                repr(j.moe_options),
                repr(j.framework),
            )
            keyed.setdefault(key, []).append(i)
        self.groups: list[_Group] = []
        for idx in keyed.values():
            job = self.samples[idx[0]].job
            table = LayoutTable.concat([self.samples[i].table for i in idx])
            ss = [self.samples[i] for i in idx]
            self.groups.append(
                _Group(
                    job=job,
                    table=table,
                    rows=np.array(idx),
                    params=stage_param_counts(job.model, table, job.pipeline_schedule),
                    tokens=np.array([float(s.job.tokens_per_step) for s in ss]),
                    num_devices=np.array([s.job.num_devices for s in ss]),
                    measured=np.array([s.measured_tokens_per_s_per_device for s in ss]),
                )
            )
        self.device_of_group = [g.job.device.id for g in self.groups]
        self.stack_of_group = [g.job.framework.name for g in self.groups]

    def groups_of_device(self, device_id: str) -> list[int]:
        return [k for k, d in enumerate(self.device_of_group) if d == device_id]

    def groups_of(self, scope: str, base: Calibration | None = None) -> list[int]:
        """The groups a coefficient of ``scope`` (a device id, ``die:NAME`` or ``stack:NAME``) moves."""
        if scope.startswith("stack:"):
            st = scope[len("stack:") :]
            return [k for k, s in enumerate(self.stack_of_group) if s == st]
        if scope.startswith("die:") and base is not None:
            die = scope[len("die:") :]
            return [k for k, d in enumerate(self.device_of_group) if base.transfer.dies.get(d) == die]
        return self.groups_of_device(scope)

    def __call__(self, cal: Calibration, groups: Sequence[int] | None = None) -> np.ndarray:
        """log(predicted / measured) tokens/s per device of every sample (NaN outside ``groups``)."""
        out = np.full(len(self.samples), np.nan)
        coeffs: dict[tuple[str, int, str], tuple] = {}
        for k in range(len(self.groups)) if groups is None else groups:
            g = self.groups[k]
            job = g.job
            key = (job.device.id, job.devices_per_node, job.framework.name)
            if key not in coeffs:
                coeffs[key] = time_model(job, cal)
            co, links = coeffs[key]
            step = step_breakdown(job, g.table, co=co, links=links, params=g.params)["step_time"]
            tps = g.tokens / (step * g.num_devices)  # as engine.evaluate's tokens_per_s_per_device
            out[g.rows] = np.log(tps / g.measured)
        return out


@dataclass
class _Group:
    job: TrainingJob
    table: LayoutTable
    rows: np.ndarray
    params: dict[str, np.ndarray]
    tokens: np.ndarray
    num_devices: np.ndarray
    measured: np.ndarray


def residuals(samples: Sequence[Sample] | FitRows, cal: Calibration) -> np.ndarray:
    """log(predicted / measured) tokens/s per device of every sample under ``cal``."""
    rows = samples if isinstance(samples, FitRows) else FitRows(samples)
    return rows(cal)


def fd_steps(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, rel_step: float) -> np.ndarray:
    """Forward-difference steps, chosen as scipy's ``approx_derivative('2-point', rel_step=...)``
    chooses them (relative to x, sqrt(eps)·max(1, |x|) where that is zero, flipped or shortened
    to stay inside the bounds), so the sparse Jacobian below is the one ``least_squares`` would form.
    """
    sign = (x >= 0).astype(float) * 2 - 1
    h = rel_step * sign * np.abs(x)
    h = np.where((x + h) - x == 0, np.finfo(float).eps ** 0.5 * sign * np.maximum(1.0, np.abs(x)), h)
    lower, upper = x - lo, hi - x
    violated = (x + h < lo) | (x + h > hi)
    fitting = np.abs(h) <= np.maximum(lower, upper)
    h = np.where(violated & fitting, -h, h)
    h = np.where(~fitting & (upper >= lower), upper, h)
    return np.where(~fitting & (upper < lower), -lower, h)


# One die, one coefficient; one stack, one GEMM efficiency. How close a training stack runs to a die's
# measured matmul rates (its MAMF table) is a property of the stack's software (its GEMM shapes,
# fusions, host work), not of the silicon, so in die mode the dies' GEMM scales share one value
# unless the rows insist: DIE_SHRINKAGE_ROWS pseudo-rows pull each die's log scale to the mean of
# the dies' (a hierarchical prior; 0 fits every die freely). Without it the scales trade off against
# the global small-GEMM factor along a flat direction (the fit without H100's rows moved
# half_dim_scale 0.29 -> 1.65 and every die's scale up ~12%), and a held-out die's transferred scale
# (transfer.gemm_ratio, their geometric mean) followed. Chosen on held-out rows (docs/calibration.md):
# 50 and 200 give the same held-out figures; leave-one-source-out of the Bridge archive 24.4% -> 15.0%.
DIE_SHRINKAGE_ROWS = 50.0


class _Shrinkage:
    """Pseudo-row residuals ``sqrt(rows) * (log s_d - mean_d log s_d)`` over the die GEMM scales."""

    def __init__(self, names: Sequence[str], rows: float):
        self.idx = [i for i, n in enumerate(names) if n.endswith(".gemm_scale")]
        self.w = float(np.sqrt(rows)) if rows > 0 and len(self.idx) > 1 else 0.0
        self.n = len(self.idx) if self.w else 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if not self.n:
            return np.zeros(0)
        lg = np.log(x[self.idx])
        return self.w * (lg - lg.mean())

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        j = np.zeros((self.n, len(x)))
        if self.n:
            k = len(self.idx)
            j[:, self.idx] = self.w * (np.eye(k) - 1.0 / k) / x[self.idx]
        return j


def fit(
    samples: Sequence[Sample],
    base: Calibration | None = None,
    *,
    max_nfev: int = DEFAULT_MAX_NFEV,
    ftol: float = FTOL,
    provenance: dict[str, Any] | None = None,
    start: Calibration | None = None,
    shrinkage_rows: float = DIE_SHRINKAGE_ROWS,
) -> FitResult:
    """Least-squares fit of the coefficients to ``samples``; returns a new Calibration.

    ``shrinkage_rows``: weight, in rows, of the prior that the dies share one GEMM scale
    (:data:`DIE_SHRINKAGE_ROWS`; die mode only).

    ``start``: a calibration whose values of the same coefficients the fit starts from (a warm
    start, e.g. a refit on a subset starting from the fit on every row); default: the device
    profiles' published efficiencies and ``base``'s global values.

    The Jacobian is a forward difference like scipy's default, but a device's coefficient moves
    only the rows of that device, so its column is evaluated on those rows alone (the other
    entries are exactly zero); the global coefficients move every row. ``max_nfev`` counts the
    evaluations of the residual vector, not of the Jacobian (scipy's convention).
    """
    base = base or Calibration()
    names, x0, lo, hi = _parameter_space(samples, base)
    if start is not None:
        x0 = np.clip(vector_from_calibration(names, start, x0), lo, hi)
    rows = FitRows(samples)
    w = group_weights(samples)
    every = list(range(len(rows.groups)))
    # the groups of rows each coefficient moves
    moved = [every if n.startswith("global.") else rows.groups_of(n.split(".", 1)[0], base) for n in names]
    member = [
        np.isin(np.arange(len(samples)), np.concatenate([rows.groups[k].rows for k in g])) for g in moved
    ]
    last: dict[str, np.ndarray] = {}
    prior = _Shrinkage(names, shrinkage_rows)

    def f(x: np.ndarray) -> np.ndarray:
        r = w * rows(calibration_from_vector(names, x, base))
        last["x"], last["f"] = x.copy(), r
        return np.concatenate([r, prior(x)]) if prior.n else r

    def jac(x: np.ndarray) -> np.ndarray:
        f0 = last["f"] if "x" in last and np.array_equal(last["x"], x) else f(x)[: len(samples)]
        h = fd_steps(x, lo, hi, DIFF_STEP)
        # built transposed and returned as its (Fortran-ordered) view, as scipy does: the trust
        # region's linear algebra then sums in the same order and the fit takes the same path.
        jt = np.zeros((len(x), len(samples)))
        for j in range(len(x)):
            x1 = x.copy()
            x1[j] = x[j] + h[j]
            dx = x1[j] - x[j]
            r1 = w * rows(calibration_from_vector(names, x1, base), moved[j])
            jt[j, member[j]] = (r1[member[j]] - f0[member[j]]) / dx
        return np.vstack([jt.T, prior.jacobian(x)]) if prior.n else jt.T

    sol = least_squares(
        f,
        x0,
        jac=jac,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=0.1,
        max_nfev=max_nfev,
        ftol=ftol,
        x_scale=np.maximum(np.abs(x0), 1e-3),
    )
    cal = calibration_from_vector(names, sol.x, base, provenance)
    cal = cal.model_copy(update={"transfer": cal.transfer.model_copy(update=transfer_ratios(cal, samples))})
    r = rows(cal)
    cal.provenance["residuals"] = residual_summary(samples, r)
    return FitResult(cal, r, names, sol.x, int(sol.status), str(sol.message), int(sol.nfev), int(sol.njev))


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
    stacks = {
        k: {kk: round(vv, 6) for kk, vv in v.model_dump(exclude_none=True).items()}
        for k, v in sorted(cal.stacks.items())
    }
    if stacks:
        data["stacks"] = stacks
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "Sample",
    "FitResult",
    "fit",
    "FitRows",
    "fd_steps",
    "residuals",
    "calibration_from_vector",
    "write_calibration",
    "GLOBAL_DEFAULTS",
    "file_digest",
    "now_iso",
]
