"""Hardware what-if: device and cluster fields as sweep axes, each hardware point with its best layout.

The training engine (:func:`autopar.engine.step_breakdown`) is run once per layout at the base
hardware and once more with each resource doubled (rates: peak FLOP/s, memory bandwidth, scale-up
and scale-out bandwidth) or each latency doubled. That gives every layout a *demand* decomposition of
its step time,

    T(s) = F + sum_r A_r / s_r + sum_l B_l * s_l,

with ``s`` the hardware point's value over the base value of each field: ``A_r`` the seconds that
scale with the inverse of rate r, ``B_l`` those that scale with latency l, ``F`` the rest (fixed
overheads). It is exact at the base point and at every single doubling, and linear in between (the
engine's overlap and pipeline terms bend it: a ZeRO-3 gradient exchange hidden behind compute is a
max(), not a sum). The model only *screens*: one matrix product, (hardware points x resources) @
(resources x layouts), plus the memory fit of each layout against each point's memory capacity
(layout memory does not depend on the other fields), gives every point its ``REFINE_K`` best layouts,
and the full engine re-scores those in one vectorized call whose coefficients and links carry one
value per row; the engine's best of them is the point's answer. ``studies/whatif_speed.py``
measures how often that misses the engine's best over the whole space.

Discrete fields (``scale_up.domain``: which collectives cross nodes) re-enumerate and re-decompose
the space once per distinct value. Power fields change the energy, not the layout: J per step of the
best layout is its step time times ``idle + (TDP - idle) * phi`` with ``phi`` the layout's share of
the idle..TDP span at the base point (:func:`autopar.engine.evaluate`), plus the node overhead.

Also: :func:`sensitivity` (elasticity d ln T* / d ln x of the best step time to each resource: the
most negative one bounds the job) and :func:`what_would_it_take` (the smallest scale of one resource
that reaches a target step time, by bisection over the vectorized model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autopar.errors import AutoparError
from autopar.limits import MAX_WHATIF_POINTS, echo

__all__ = [
    "FIELDS",
    "RATES",
    "RESOURCES",
    "LATENCIES",
    "Axis",
    "parse_vary",
    "Decomposition",
    "decompose",
    "sweep",
    "sensitivity",
    "what_would_it_take",
    "engine_times",
]

# field -> how it enters: rate (time ~ 1/x), latency (time ~ x), capacity, domain, power
RATES = (
    "peak_tflops.bf16",
    "peak_tflops.fp8",
    "memory_bw_gbps",
    "scale_up.agg_gbps",
    "scale_out.per_device_gbps",
)
LATENCIES = ("scale_up.latency_us", "scale_out.latency_us")
FIELDS: dict[str, str] = {
    **{f: "rate" for f in RATES},
    **{f: "latency" for f in LATENCIES},
    "memory_gb": "capacity",
    "scale_up.domain": "domain",
    "power.tdp_w": "power",
    "power.idle_w": "power",
}
RESOURCES = RATES + LATENCIES
MAX_POINTS = MAX_WHATIF_POINTS  # autopar.limits: ~0.5 ms a point, so seconds, not hours


@dataclass(frozen=True)
class Axis:
    field: str
    values: np.ndarray


def _num(text: str, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise AutoparError(
            f"{what}: {text!r} is not a number", "write FIELD=LO:HI:N or FIELD=V1,V2"
        ) from None
    if not (math.isfinite(x) and x > 0):
        raise AutoparError(
            f"{what}: {text!r} must be a positive number", "write FIELD=LO:HI:N or FIELD=V1,V2"
        )
    return x


def parse_vary(text: str) -> Axis:
    """``FIELD=LO:HI:N`` (N values, evenly spaced) or ``FIELD=V1,V2,...``."""
    if "=" not in text:
        raise AutoparError(f"--vary {text!r} is not FIELD=LO:HI:N", f"fields: {', '.join(FIELDS)}")
    name, spec = (s.strip() for s in text.split("=", 1))
    if name not in FIELDS:
        raise AutoparError(f"--vary: unknown hardware field {name!r}", f"use one of {', '.join(FIELDS)}")
    what = f"--vary {name}"
    if ":" in spec:
        parts = spec.split(":")
        if len(parts) != 3:
            raise AutoparError(f"{what}: {spec!r} is not LO:HI:N", "e.g. memory_bw_gbps=2000:8000:7")
        lo, hi = _num(parts[0], what), _num(parts[1], what)
        n = int(parts[2]) if parts[2].strip().isdigit() and len(parts[2].strip()) <= 9 else 0
        if n < 1 or n > MAX_POINTS or hi < lo:
            raise AutoparError(
                f"{what}: {echo(spec)} needs LO <= HI and 1 <= N <= {MAX_POINTS:,}", "e.g. 2000:8000:7"
            )
        vals = np.linspace(lo, hi, n)
    else:
        vals = np.array([_num(v, what) for v in spec.split(",") if v.strip()])
        if not len(vals):
            raise AutoparError(f"{what}: no values", "e.g. memory_bw_gbps=3350,4800")
    if FIELDS[name] == "domain":
        if np.any(vals != np.round(vals)):
            raise AutoparError(f"{what}: the scale-up domain is a device count", "give whole numbers")
    return Axis(name, vals)


def base_value(device, name: str) -> float:
    obj: Any = device
    for key in name.split("."):
        obj = obj[key] if isinstance(obj, dict) else getattr(obj, key, None)
        if obj is None:
            raise AutoparError(
                f"{device.id} has no {name}", "vary a field the device has (e.g. peak_tflops.bf16)"
            )
    return float(obj)


def _scaled(co, links, res: str, f: float | np.ndarray):
    """Coefficients/Links with one resource scaled by ``f`` (achieved = profile value x efficiency)."""
    if res == "peak_tflops.bf16":
        pk = dict(co.peak_flops)
        for k in ("bf16", "fp16"):
            if k in pk:
                pk[k] *= f
        return replace(co, peak_flops=pk), links
    if res == "peak_tflops.fp8":
        pk = dict(co.peak_flops)
        if "fp8" in pk:
            pk["fp8"] *= f
        return replace(co, peak_flops=pk), links
    if res == "memory_bw_gbps":
        return replace(co, hbm_bw=co.hbm_bw * f), links
    if res == "scale_up.agg_gbps":  # the link rate: aggregate, per-peer and the measured busbw curve
        scale = links.busbw_scale * f
        return co, replace(links, up_agg=links.up_agg * f, up_peer=links.up_peer * f, busbw_scale=scale)
    if res == "scale_out.per_device_gbps":
        return co, replace(links, out_nic=links.out_nic * f)
    if res == "scale_up.latency_us":
        return co, replace(links, lat_up=links.lat_up * f)
    if res == "scale_out.latency_us":
        return co, replace(links, lat_out=links.lat_out * f)
    raise AssertionError(res)


@dataclass
class Decomposition:
    """Per legal layout of one job: step-time demands, memory, power share; from the full engine."""

    job: Any
    enum: Any
    ids: np.ndarray  # grid ids of the layouts
    t_base: np.ndarray  # (L,) engine step time at the base hardware
    fixed: np.ndarray  # (L,) F
    demand: np.ndarray  # (R, L): A_r for rates, B_l for latencies (seconds at the base point)
    memory: np.ndarray  # (L,) device footprint, bytes
    phi: np.ndarray  # (L,) share of the idle..TDP span drawn on average at the base point
    base: dict[str, float] = field(default_factory=dict)  # base value of every field
    calibration: Any = None


def decompose(job, *, space=None, calibration=None) -> Decomposition:
    """Run the engine at the base hardware and with each resource doubled, over the whole space."""
    from autopar.coefficients import load_calibration
    from autopar.engine import evaluate, step_breakdown, time_model
    from autopar.search.enumerate import enumerate_space
    from autopar.search.space import load_space

    cal = calibration or load_calibration()
    en = enumerate_space(job, space if space is not None else load_space("default"))
    ids = en.legal_ids()
    if not len(ids):
        raise AutoparError(
            f"no legal layout of the space for {job.model.name} on {job.num_devices} {job.device.id}",
            "try `autopar recommend` for the reasons",
        )
    tab = en.table(ids)
    co, links = time_model(job, cal)
    res = evaluate(job, tab, calibration=cal, check_legal=False)
    t0 = res["step_time_s"]
    dem = np.empty((len(RESOURCES), len(ids)))
    for i, r in enumerate(RESOURCES):
        c2, l2 = _scaled(co, links, r, 2.0)
        t2 = step_breakdown(job, tab, co=c2, links=l2)["step_time"]
        dem[i] = 2.0 * (t0 - t2) if r in RATES else (t2 - t0)
    p = job.device.power
    from autopar.energy import NODE_OVERHEAD_LOAD

    chip_w = res["avg_power_w"] - p.node_overhead_w * NODE_OVERHEAD_LOAD
    phi = (chip_w - p.idle_w) / max(p.tdp_w - p.idle_w, 1e-9)
    base = {f: base_value(job.device, f) for f in FIELDS if _has(job.device, f)}
    base["scale_up.domain"] = float(job.devices_per_node)
    return Decomposition(
        job=job,
        enum=en,
        ids=ids,
        t_base=t0,
        fixed=t0 - dem.sum(axis=0),
        demand=dem,
        memory=res["memory_bytes"],
        phi=np.clip(phi, 0.0, 1.0),
        base=base,
        calibration=cal,
    )


def _has(device, name: str) -> bool:
    try:
        base_value(device, name)
    except AutoparError:
        return False
    return True


def _factors(dec: Decomposition, pts: dict[str, np.ndarray], n: int) -> np.ndarray:
    """(H, R): 1/s for rates, s for latencies (1 where a field is not varied)."""
    out = np.ones((n, len(RESOURCES)))
    for i, r in enumerate(RESOURCES):
        if r in pts:
            s = pts[r] / dec.base[r]
            out[:, i] = 1.0 / s if r in RATES else s
    return out


def step_times(dec: Decomposition, factors: np.ndarray) -> np.ndarray:
    """(H, L) step time of every layout at every hardware point (the demand model)."""
    return dec.fixed[None, :] + factors @ dec.demand


# Layouts per hardware point that the full engine re-scores after the demand model's screening.
REFINE_K = 64


def _scales(factors: np.ndarray) -> np.ndarray:
    """(H, R) value / base of every resource from the demand-model factors (1/s rates, s latencies)."""
    is_rate = np.array([r in RATES for r in RESOURCES])
    return np.where(is_rate[None, :], 1.0 / factors, factors)


def engine_times(dec: Decomposition, layout_idx: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The full engine's step time of layout ``layout_idx[i]`` at hardware scales ``scales[i]`` (R,),
    all rows in one vectorized call (the coefficients and links carry one value per row)."""
    from autopar.engine import step_breakdown, time_model

    co, links = time_model(dec.job, dec.calibration)
    for i, r in enumerate(RESOURCES):
        if np.any(scales[:, i] != 1.0):
            co, links = _scaled(co, links, r, scales[:, i])
    tab = dec.enum.table(dec.ids[layout_idx])
    return step_breakdown(dec.job, tab, co=co, links=links)["step_time"]


def _best(
    dec: Decomposition, factors: np.ndarray, cap: np.ndarray, chunk: int = 512, k: int = REFINE_K
) -> tuple[np.ndarray, np.ndarray]:
    """Index of the best fitting layout and its step time per hardware point (inf: none fits).

    The demand model screens every layout; its ``k`` best per point are re-scored by the full engine
    (one vectorized call per chunk), and the engine's best of them is returned.
    """
    H = len(factors)
    idx = np.zeros(H, dtype=np.int64)
    best = np.full(H, np.inf)
    limit = cap * (1.0 - dec.job.memory_headroom)
    k = min(k, len(dec.ids))
    for a in range(0, H, chunk):
        b = min(H, a + chunk)
        t = step_times(dec, factors[a:b])
        t[dec.memory[None, :] > limit[a:b, None]] = np.inf
        cand = (
            np.argpartition(t, k - 1, axis=1)[:, :k] if k < t.shape[1] else np.tile(np.arange(k), (b - a, 1))
        )
        ok = np.isfinite(np.take_along_axis(t, cand, axis=1))
        ex = engine_times(dec, cand.reshape(-1), np.repeat(_scales(factors[a:b]), k, axis=0)).reshape(
            b - a, k
        )
        ex = np.where(ok, ex, np.inf)
        j = np.argmin(ex, axis=1)
        idx[a:b] = cand[np.arange(b - a), j]
        best[a:b] = ex[np.arange(b - a), j]
    return idx, best


def check_grid(axes: list[Axis]) -> int:
    """The number of hardware points of ``axes``; over :data:`MAX_POINTS` refused (call it before any work)."""
    n = math.prod(len(a.values) for a in axes) if axes else 1
    if n > MAX_POINTS:
        raise AutoparError(
            f"the --vary grid has {n:,} hardware points, over the limit of {MAX_POINTS:,}",
            "use fewer values per axis, or split the grid into several runs",
        )
    return n


def grid(device, axes: list[Axis]) -> dict[str, np.ndarray]:
    """The cartesian product of the axes: one array per varied field, one entry per point."""
    names = [a.field for a in axes]
    if len(set(names)) != len(names):
        raise AutoparError("a field is varied twice", "give each --vary field once")
    check_grid(axes)
    for a in axes:
        base_value(device, a.field) if a.field != "scale_up.domain" else None
    mesh = np.meshgrid(*[a.values for a in axes], indexing="ij") if axes else []
    return {a.field: m.reshape(-1) for a, m in zip(axes, mesh, strict=True)}


def sweep(job, axes: list[Axis], *, space=None, calibration=None) -> dict[str, Any]:
    """Best layout and its step time, tokens/s/device, energy and bounding resource per hardware point."""
    pts = grid(job.device, axes)
    n = len(next(iter(pts.values()))) if pts else 1
    domains = pts.get("scale_up.domain", np.full(n, float(job.devices_per_node)))
    out_t = np.full(n, np.inf)
    out_layout = np.empty(n, dtype=object)
    out_share = np.zeros((n, len(RESOURCES)))
    out_phi = np.zeros(n)
    for d in np.unique(domains):  # every domain is checked before any work
        if job.num_devices % int(d):
            raise AutoparError(
                f"scale_up.domain={int(d)} does not divide {job.num_devices} devices",
                "pick domains that divide it",
            )
    p = job.device.power
    if np.any(pts.get("power.idle_w", p.idle_w) > pts.get("power.tdp_w", p.tdp_w)):
        raise AutoparError("a hardware point has power.idle_w above power.tdp_w", "narrow the power axes")
    decs = {}
    for d in np.unique(domains):
        sel = np.flatnonzero(domains == d)
        dec = decompose(_with_domain(job, int(d)), space=space, calibration=calibration)
        decs[int(d)] = dec
        sub = {k: v[sel] for k, v in pts.items()}
        f = _factors(dec, sub, len(sel))
        cap = sub.get("memory_gb", np.full(len(sel), dec.base["memory_gb"])) * 1e9
        idx, best = _best(dec, f, cap)
        out_t[sel] = best
        ok = np.isfinite(best)
        out_share[sel] = np.where(
            ok[:, None], f * dec.demand[:, idx].T / np.where(ok, best, 1.0)[:, None], 0.0
        )
        out_phi[sel] = dec.phi[idx]
        uniq, inv = np.unique(idx, return_inverse=True)
        lays = dec.enum.table(dec.ids[uniq])
        names = np.array([lays.row(j).short() for j in range(len(uniq))], dtype=object)
        out_layout[sel] = [names[inv[j]] if ok[j] else None for j in range(len(sel))]
    p = job.device.power
    tdp = pts.get("power.tdp_w", np.full(n, p.tdp_w))
    idle = pts.get("power.idle_w", np.full(n, p.idle_w))
    if np.any(idle > tdp):
        raise AutoparError("a hardware point has power.idle_w above power.tdp_w", "narrow the power axes")
    from autopar.energy import NODE_OVERHEAD_LOAD

    watts = idle + (tdp - idle) * out_phi + p.node_overhead_w * NODE_OVERHEAD_LOAD
    tokens = float(job.tokens_per_step)
    ok = np.isfinite(out_t)
    tps = np.where(ok, tokens / (np.where(ok, out_t, 1.0) * job.num_devices), 0.0)
    bound = np.array([RESOURCES[i] for i in np.argmax(out_share, axis=1)], dtype=object)
    bound[~ok] = None
    return {
        "points": pts,
        "n_points": n,
        "n_layouts": sum(len(d.ids) for d in decs.values()),
        "evaluations": sum(len(d.ids) * int(np.sum(domains == k)) for k, d in decs.items()),
        "step_time_s": out_t,
        "tokens_per_s_per_device": tps,
        "layout": out_layout,
        "share": out_share,
        "bound": bound,
        "joules_per_step": np.where(ok, out_t * watts * job.num_devices, np.inf),
        "decompositions": decs,
    }


def _with_domain(job, d: int):
    if d == job.devices_per_node:
        return job
    if d < 1 or job.num_devices % d:
        raise AutoparError(
            f"scale_up.domain={d} does not divide {job.num_devices} devices", "pick domains that divide it"
        )
    dev = job.device.model_copy(update={"scale_up": job.device.scale_up.model_copy(update={"domain": d})})
    return replace(job, device=dev, devices_per_node=d)


def _best_at(dec: Decomposition, scales: dict[str, float]) -> float:
    f = _factors(dec, {k: np.array([v * dec.base[k]]) for k, v in scales.items()}, 1)
    cap = np.array([dec.base["memory_gb"] * scales.get("memory_gb", 1.0) * 1e9])
    return float(_best(dec, f, cap)[1][0])


def sensitivity(dec: Decomposition, step: float = 1.1) -> dict[str, float]:
    """Elasticity d ln T* / d ln x of the best step time to each resource (re-optimizing the layout)."""
    out = {}
    for r in RESOURCES:
        if r not in dec.base:
            continue
        up, dn = _best_at(dec, {r: step}), _best_at(dec, {r: 1.0 / step})
        out[r] = (
            (math.log(up) - math.log(dn)) / (2.0 * math.log(step)) if math.isfinite(up * dn) else math.nan
        )
    return out


def what_would_it_take(
    dec: Decomposition, target_step_s: float, max_factor: float = 1000.0
) -> dict[str, Any]:
    """Per resource: the smallest change (factor on its base value) whose best step time meets the target.

    Rates are searched upward (x1 .. x``max_factor``), latencies downward; bisection in log space on
    the vectorized model. ``None`` where even the extreme does not reach the target (other terms bound).
    """
    now = _best_at(dec, {})
    out: dict[str, Any] = {"base_step_time_s": now, "target_step_time_s": target_step_s}
    for r in RESOURCES:
        if r not in dec.base:
            continue
        if now <= target_step_s:
            out[r] = 1.0
            continue
        sign = 1.0 if r in RATES else -1.0
        lo, hi = 0.0, math.log(max_factor)
        if _best_at(dec, {r: math.exp(sign * hi)}) > target_step_s:
            out[r] = None
            continue
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if _best_at(dec, {r: math.exp(sign * mid)}) <= target_step_s:
                hi = mid
            else:
                lo = mid
        out[r] = math.exp(sign * hi)
    return out
