"""``autopar calibrate``: fit a local device profile and a calibration to microbenchmarks.

From :mod:`autopar.calibration.microbench` results (measured at the world size of the runs to be predicted,
with its processes sharing the host as the runs do) this fits, with scipy, the SAME latency model
terms the engine uses (:mod:`autopar.latency`, :mod:`autopar.collectives`):

* GEMM: the achieved fraction of the per-rank peak per precision and the half-efficiency
  dimension of the shape-dependent roofline (``latency.gemm_time`` itself is the model);
* attention: the achieved fraction of the precision's peak, with the same ``s/(s + half_dim)``
  shape factor the engine applies;
* elementwise: the memory bandwidth (the fastest measured stream) and the achieved fraction of
  it for ``add`` over sizes;
* collectives: one α–β link model (bus bandwidth, per-peer bandwidth, per-hop latency) fitted to
  all-reduce, all-gather, reduce-scatter, all-to-all and send/recv over group and message sizes
  through :mod:`autopar.collectives`' own cost functions;
* ``kernel_overhead_us``: forward + backward of one tiny reference layer, the per-layer
  per-micro-batch fixed cost (Python, dispatcher, autograd) that no FLOP or byte count explains;
* ``tp_collective_overhead_us``: the extra time of the same layer under the runner's TP + SP plan
  beyond its collectives on the fitted links, per TP collective (the engine counts 4 all-reduces per
  layer): DTensor's dispatch and launch cost, which a raw collective does not pay;
* ``overlap_contention``: how much a background all-reduce slows GEMMs on the same ranks, per
  second of the all-reduce (on a CPU host gloo's threads compete with compute for the cores).

It writes a device profile (``<name>.device.yaml``: every number with its source) and a calibration
(``<name>.yaml``, the schema of ``cost_models/calibration/default.yaml``) whose provenance records
the host, backend, library versions, date and the fit residuals. The peaks are per rank: on a CPU
host a "device" is one rank's share of the cores (``cores / world_size`` of them, at most one).

Memory runtime constants on CPU: the reference runner measures a rank's peak as live state plus the
allocator peak seen on the training thread (``autopar.runner.memory``), which contains no runtime
reserve and no gloo buffers (allocated on gloo's threads) and counts bytes, not cached blocks, so
the microbenchmark calibration sets ``framework_reserve_gib = comm_buffer_gb = fragmentation = 0``;
:func:`refit_memory` fits them to measured peaks (``autopar validate --refit``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from autopar import collectives as C
from autopar.coefficients import Calibration, DeviceCoefficients
from autopar.errors import AutoparError
from autopar.latency import Coefficients, gemm_time
from autopar.layout import ParallelDims

SCHEMA_PROFILE_COMMENT = "# autopar device profile written by `autopar calibrate` (local, measured)\n"
CPU_GLOBALS = {
    # Physical choices for an oversubscribed CPU host, used when not measured: gloo's communication
    # threads run on the same cores as compute, so communication that overlaps compute still costs
    # (at least) its full duration, and TP collectives are synchronous (no comm overlap).
    "overlap_contention": 1.0,
    "tp_overlap": 0.0,
    # What the CPU peak-memory measurement contains (module docstring): no reserve, no comm buffers.
    "framework_reserve_gib": 0.0,
    "comm_buffer_gb": 0.0,
    "fragmentation": 0.0,
}


# ------------------------------------------------------------------------------------- host peaks
def cpu_flops_per_cycle() -> tuple[int, str]:
    """fp32 FLOP per cycle per core from the CPU's vector ISA (2 FMA pipes assumed)."""
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    if "avx512f" in flags:
        return 64, "avx512f: 2 FMA pipes x 16 fp32 lanes x 2"
    if "avx2" in flags and "fma" in flags:
        return 32, "avx2+fma: 2 FMA pipes x 8 fp32 lanes x 2"
    if "avx" in flags:
        return 16, "avx: 8 fp32 lanes x (1 add + 1 mul)"
    if platform.machine() in ("arm64", "aarch64"):
        return 16, "arm64 NEON: 2 FMA pipes x 4 fp32 lanes x 2 (estimate)"
    return 8, "sse: 4 fp32 lanes x (1 add + 1 mul)"


def cpu_clock_ghz() -> tuple[float, str]:
    try:
        mhz = [
            float(line.split(":", 1)[1])
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.lower().startswith("cpu mhz")
        ]
        if mhz:
            return max(mhz) / 1e3, "/proc/cpuinfo cpu MHz"
    except (OSError, ValueError):
        pass
    return 2.5, "estimate: 2.5 GHz (no clock reported)"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def cpu_peak_per_rank_tflops(world_size: int) -> tuple[float, str]:
    """Theoretical fp32 peak of ONE rank when ``world_size`` single-threaded ranks share the cores."""
    fpc, why = cpu_flops_per_cycle()
    ghz, src = cpu_clock_ghz()
    cores = usable_cores()
    share = min(1.0, cores / world_size)
    peak = fpc * ghz * 1e9 * share / 1e12
    return peak, (
        f"theoretical: {fpc} FLOP/cycle ({why}) x {ghz:.2f} GHz ({src}) x min(1, {cores} cores / "
        f"{world_size} ranks)"
    )


def host_memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 16.0


# ------------------------------------------------------------------------------------- fit pieces
def _log_res(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.log(np.asarray(pred, dtype=np.float64) / np.asarray(meas, dtype=np.float64))


def residual_summary(res: np.ndarray) -> dict[str, float]:
    """How far the fitted model is from the measurements: log-residual RMS and relative errors."""
    res = np.asarray(res, dtype=np.float64)
    if res.size == 0:
        return {"n": 0}
    rel = np.abs(np.exp(res) - 1.0)
    return {
        "n": int(res.size),
        "rms_log": round(float(np.sqrt(np.mean(res**2))), 4),
        "median_abs_pct": round(100 * float(np.median(rel)), 1),
        "max_abs_pct": round(100 * float(rel.max()), 1),
    }


def _coeffs(peak: float, eff: float, half_dim: float, hbm_bw: float) -> Coefficients:
    return Coefficients(
        peak_flops={"bf16": peak},
        gemm_eff={"bf16": eff},
        gemm_half_dim=half_dim,
        attention_eff=0.5,
        hbm_bw=hbm_bw,
        overlap_contention=0.0,
        tp_overlap=0.0,
        kernel_overhead_s=0.0,
    )


def model_gemm_time(
    rows: Sequence[dict[str, Any]], peak: float, eff: float, half_dim: float, hbm_bw: float, elem_bytes: float
) -> np.ndarray:
    M = np.array([r["M"] for r in rows], dtype=np.float64)
    N = np.array([r["N"] for r in rows], dtype=np.float64)
    K = np.array([r["K"] for r in rows], dtype=np.float64)
    co = _coeffs(peak, eff, half_dim, hbm_bw)
    return gemm_time(co, np.full(len(rows), peak), np.full(len(rows), eff), M, N, K, elem_bytes)


def fit_gemm(
    rows: Sequence[dict[str, Any]],
    peak: float,
    hbm_bw: float,
    elem_bytes: float,
    half_dim: float | None = None,
) -> tuple[float, float, np.ndarray]:
    """(efficiency, half_dim, log residuals) of ``latency.gemm_time`` fitted to measured GEMMs."""
    from scipy.optimize import least_squares

    meas = np.array([r["time_s"] for r in rows])
    if half_dim is None:

        def f(x: np.ndarray) -> np.ndarray:
            return _log_res(
                model_gemm_time(rows, peak, math.exp(x[0]), math.exp(x[1]), hbm_bw, elem_bytes), meas
            )

        sol = least_squares(
            f,
            [math.log(0.5), math.log(64.0)],
            bounds=([math.log(1e-4), 0.0], [math.log(5.0), 9.0]),
            loss="soft_l1",
            f_scale=0.1,
        )
        eff, hd = math.exp(sol.x[0]), math.exp(sol.x[1])
    else:

        def g(x: np.ndarray) -> np.ndarray:
            return _log_res(model_gemm_time(rows, peak, math.exp(x[0]), half_dim, hbm_bw, elem_bytes), meas)

        sol = least_squares(
            g, [math.log(0.5)], bounds=([math.log(1e-5)], [math.log(5.0)]), loss="soft_l1", f_scale=0.1
        )
        eff, hd = math.exp(sol.x[0]), half_dim
    return eff, hd, _log_res(model_gemm_time(rows, peak, eff, hd, hbm_bw, elem_bytes), meas)


def attention_flops(r: dict[str, Any]) -> float:
    """Forward FLOPs as the engine counts them (causal: half of 4·b·s²·a·d)."""
    return 2.0 * r["batch"] * r["seq"] * r["seq"] * r["heads"] * 2 * r["head_dim"] * 0.5


def fit_attention(rows: Sequence[dict[str, Any]], peak: float, half_dim: float) -> tuple[float, np.ndarray]:
    """Achieved fraction of ``peak`` (fwd + bwd = 3.5 x fwd, shape factor s/(s + half_dim))."""
    meas = np.array([r["time_s"] for r in rows])
    s = np.array([r["seq"] for r in rows], dtype=np.float64)
    fl = np.array([attention_flops(r) for r in rows])
    unit = 3.5 * fl / (peak * s / (s + half_dim))  # time at efficiency 1
    eff = float(np.exp(np.median(np.log(unit / meas))))
    return eff, _log_res(unit / eff, meas)


def fit_bandwidth(
    rows: Sequence[dict[str, Any]], *, launch_floor: bool = False
) -> tuple[float, float, np.ndarray]:
    """(peak bytes/s = fastest stream measured, achieved fraction for ``add``, log residuals).

    On a CPU the fraction is the geometric mean of the ``add`` rates over the fastest stream (the
    caches serve the small sizes faster than DRAM). ``launch_floor`` (an accelerator): ``add`` is
    fitted as ``t = max(t0, bytes / (peak x fraction))``: the stream, or the host's fixed cost per
    call ``t0`` (launch and dispatch, ~10 us, which a 64 KiB add never leaves) where that is longer
    (launches are asynchronous), so small sizes do not read as a slow memory system (one H200:
    0.36 of its fastest stream by the mean, 1.0 with ``t0``)."""
    bw = np.array([r["bytes"] / r["time_s"] for r in rows])
    peak = float(bw.max())
    adds = [i for i, r in enumerate(rows) if r["op"] == "add"] or list(range(len(rows)))
    meas = np.array([rows[i]["time_s"] for i in adds])
    nbytes = np.array([rows[i]["bytes"] for i in adds], dtype=np.float64)
    if not launch_floor:
        frac = float(np.exp(np.mean(np.log(bw[adds] / peak))))
        return peak, frac, _log_res(nbytes / (peak * frac), meas)
    from scipy.optimize import least_squares

    def model(x: np.ndarray) -> np.ndarray:
        return np.maximum(x[1] * meas.min(), nbytes / (peak * x[0]))

    sol = least_squares(
        lambda x: _log_res(model(x), meas),
        [0.5, 0.1],
        bounds=([1e-3, 0.0], [1.0, 1.0]),
        loss="soft_l1",
        f_scale=0.1,
    )
    return peak, float(sol.x[0]), _log_res(model(sol.x), meas)


def links_for(bus: float, peer: float, lat_s: float, world: int) -> C.Links:
    return C.Links(
        up_agg=bus,
        up_peer=peer,
        up_switched=True,
        out_nic=bus,
        lat_up=lat_s,
        lat_out=lat_s,
        devices_per_node=world,
    )


def model_collective_time(rows: Sequence[dict[str, Any]], links: C.Links) -> np.ndarray:
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        n, b = float(r["group_size"]), float(r["bytes"])
        op = r["op"]
        if op == "all_reduce":
            t = C.all_reduce(links, b, n, 1.0)
        elif op in ("all_gather", "reduce_scatter"):
            t = C.all_gather(links, b, n, 1.0)
        elif op == "all_to_all":
            t = C.all_to_all(links, b, n, 1.0)
        elif op == "send_recv":
            t = C.p2p(links, b, False)
        else:
            raise AutoparError(f"unknown collective {op!r} in microbenchmark results")
        out[i] = float(np.asarray(t))
    return out


def fit_collectives(rows: Sequence[dict[str, Any]], world: int) -> tuple[float, float, float, np.ndarray]:
    """(bus bytes/s, per-peer bytes/s <= bus, per-hop latency s, log residuals) of the α–β model."""
    from scipy.optimize import least_squares

    meas = np.array([r["time_s"] for r in rows])

    def unpack(x: np.ndarray) -> C.Links:
        bus = math.exp(x[0])
        return links_for(bus, bus / (1.0 + math.exp(-x[1])), math.exp(x[2]), world)

    def f(x: np.ndarray) -> np.ndarray:
        return _log_res(model_collective_time(rows, unpack(x)), meas)

    sol = least_squares(
        f,
        [math.log(1e9), 2.0, math.log(1e-4)],
        loss="soft_l1",
        f_scale=0.2,
        bounds=([math.log(1e6), -8.0, math.log(1e-7)], [math.log(1e13), 8.0, math.log(1.0)]),
    )
    lk = unpack(sol.x)
    return lk.up_agg, lk.up_peer, lk.lat_up, f(sol.x)


def fit_tp_overhead(
    rows: Sequence[dict[str, Any]], plain_s: float, links: C.Links
) -> tuple[float, np.ndarray]:
    """Software cost per TP collective: a TP layer's extra time over the plain layer is the engine's
    4 all-reduces per layer (fwd + bwd, ``tokens x hidden`` fp32 each) on the fitted links plus 4
    times this overhead (median over TP group sizes; log residuals of the resulting extra times)."""
    extra = np.array([r["time_s"] - plain_s for r in rows])
    wire = np.array(
        [
            4.0
            * float(
                np.asarray(C.all_reduce(links, 4.0 * r["seq"] * r["hidden"], float(r["group_size"]), 1.0))
            )
            for r in rows
        ]
    )
    ov = float(max(np.median((extra - wire) / 4.0), 0.0))
    return ov, _log_res(wire + 4.0 * ov, extra)


# ------------------------------------------------------------------------------------- the fit
@dataclass
class MicrobenchFit:
    """The fitted device profile (YAML-ready dict), the calibration, and the residuals per section."""

    device_id: str
    profile: dict[str, Any]
    calibration: Calibration
    residuals: dict[str, dict[str, float]]
    values: dict[str, float] = field(default_factory=dict)


def _v(value: float, src: str, digits: int = 6) -> dict[str, Any]:
    return {"value": float(f"{value:.{digits}g}"), "src": src}


def fit_microbenchmarks(raw: dict[str, Any], *, name: str) -> MicrobenchFit:
    """Fit the device profile ``name`` and its calibration to :func:`run_microbenchmarks` results."""
    for key in ("gemm", "elementwise", "collectives", "world_size"):
        if key not in raw:
            raise AutoparError(f"microbenchmark results lack {key!r}", "rerun `autopar calibrate`")
    W = int(raw["world_size"])
    is_cpu = raw.get("device", "cpu") == "cpu"
    where = f"autopar calibrate on {raw.get('host', '?')} ({raw.get('date', '?')}, {W} ranks, {raw.get('backend')})"
    residuals: dict[str, dict[str, float]] = {}

    # Memory bandwidth first: the GEMM roofline's traffic term uses it.
    el = raw["elementwise"]
    if not el:
        raise AutoparError(
            "microbenchmark results have no elementwise rows", "rerun without --skip elementwise"
        )
    mem_bw, hbm_frac, res = fit_bandwidth(el, launch_floor=not is_cpu)
    residuals["elementwise"] = residual_summary(res)

    gemm_rows = [r for r in raw["gemm"] if "time_s" in r]
    by_prec: dict[str, list[dict[str, Any]]] = {}
    for r in gemm_rows:
        by_prec.setdefault(r["precision"], []).append(r)
    if "fp32" not in by_prec and "bf16" not in by_prec:
        raise AutoparError(
            "microbenchmark results have no fp32 or bf16 GEMM rows", "rerun `autopar calibrate`"
        )
    if is_cpu:
        peak, peak_src = cpu_peak_per_rank_tflops(W)
        peak_flops = {p: peak * 1e12 for p in by_prec}
        peak_srcs = {
            p: peak_src + ("; no bf16 units: bf16 GEMMs convert to fp32" if p != "fp32" else "")
            for p in by_prec
        }
    else:  # an accelerator: the fastest measured rate per precision stands for the peak (efficiency 1)
        peak_flops, peak_srcs = {}, {}
        for p, rows in by_prec.items():
            rate = max(2.0 * r["M"] * r["N"] * r["K"] / r["time_s"] for r in rows)
            peak_flops[p] = rate
            peak_srcs[p] = f"measured: fastest {p} GEMM of the sweep ({where})"
    # The precision whose fit sets the shape law's half-dimension: fp32 on a CPU, bf16 on an
    # accelerator (its fp32 GEMMs run on other units, at a few shapes only).
    main = "bf16" if not is_cpu and "bf16" in by_prec else "fp32" if "fp32" in by_prec else "bf16"
    eff_main, half_dim, res = fit_gemm(
        by_prec[main], peak_flops[main], mem_bw * hbm_frac, 4.0 if main == "fp32" else 2.0
    )
    gemm_eff = {main: eff_main}
    residuals[f"gemm_{main}"] = residual_summary(res)
    for p, rows in by_prec.items():
        if p == main:
            continue
        e, _, res = fit_gemm(rows, peak_flops[p], mem_bw * hbm_frac, 4.0 if p == "fp32" else 2.0, half_dim)
        gemm_eff[p] = e
        residuals[f"gemm_{p}"] = residual_summary(res)
    # An efficiency above 0.95 means the peak was underestimated (e.g. turbo clocks): raise the peak.
    for p, e in list(gemm_eff.items()):
        if e > 0.95:
            peak_flops[p] *= e / 0.95
            peak_srcs[p] += f"; raised x{e / 0.95:.3f} so that the fitted efficiency is 0.95"
            gemm_eff[p] = 0.95
    if "bf16" not in peak_flops:  # the profile schema needs a bf16 entry
        peak_flops["bf16"], gemm_eff["bf16"] = peak_flops[main], gemm_eff[main]
        peak_srcs["bf16"] = f"not measured: set to the {main} value (the schema needs a bf16 entry)"

    att_rows = [r for r in raw.get("attention", []) if "time_s" in r]
    if att_rows:
        att_prec = att_rows[0].get("precision", "fp32")
        att_eff, res = fit_attention(att_rows, peak_flops.get(att_prec, peak_flops[main]), half_dim)
        residuals["attention"] = residual_summary(res)
        att_eff = min(att_eff, 1.0)
    else:
        att_eff = 0.5

    coll = [r for r in raw["collectives"] if "time_s" in r]
    if coll:
        bus, peer, wire_lat, res = fit_collectives(coll, W)
        residuals["collectives"] = residual_summary(res)
        for op in sorted({r["op"] for r in coll}):
            idx = [i for i, r in enumerate(coll) if r["op"] == op]
            residuals[f"collectives.{op}"] = residual_summary(res[idx])
    else:  # one rank: no communication measured; anything finite will do
        bus, peer, wire_lat = 1e10, 1e10, 1e-5

    dispatch = [r["time_s"] for r in raw.get("dispatch", []) if "time_s" in r]
    overhead_s = float(np.median(dispatch)) if dispatch else 0.0
    overhead_us = overhead_s * 1e6
    # TP collectives as the runner issues them (DTensor): what a TP layer costs beyond its collectives
    # on the wire is a fixed software cost per TP collective.
    lat = wire_lat
    tp_rows = [r for r in raw.get("tp_layer", []) if "time_s" in r]
    tp_overhead = 0.0
    if tp_rows:
        tp_overhead, res = fit_tp_overhead(tp_rows, overhead_s, links_for(bus, peer, lat, W))
        residuals["tp_layer"] = residual_summary(res)
    ov = [r for r in raw.get("overlap", []) if r.get("collective_s", 0) > 0]
    contention = None
    if ov:
        ratios = [(r["both_s"] - r["gemm_s"]) / r["collective_s"] for r in ov]
        contention = float(np.clip(np.median(ratios), 0.0, 10.0))

    profile = build_profile(
        device_id=name,
        world_size=W,
        is_cpu=is_cpu,
        where=where,
        peak_flops=peak_flops,
        peak_srcs=peak_srcs,
        gemm_eff=gemm_eff,
        half_dim=half_dim,
        att_eff=att_eff,
        mem_bw=mem_bw,
        hbm_frac=hbm_frac,
        bus=bus,
        peer=peer,
        lat=lat,
        host=raw.get("processor") or raw.get("gpu") or raw.get("host", "local host"),
    )
    provenance = {
        "method": "scipy least_squares fits of autopar.latency / autopar.collectives terms to microbenchmarks "
        "(autopar.calibration.microbench), measured with all ranks running at once",
        "host": raw.get("host"),
        "processor": raw.get("processor"),
        "platform": raw.get("platform"),
        "cpu_count": raw.get("cpu_count"),
        "gpu": raw.get("gpu"),
        "device": raw.get("device"),
        "backend": raw.get("backend"),
        "world_size": W,
        "threads_per_rank": raw.get("threads_per_rank"),
        "torch": raw.get("torch"),
        "python": raw.get("python"),
        "numpy": raw.get("numpy"),
        "scipy": _scipy_version(),
        "sweep": raw.get("sweep"),
        "date": raw.get("date"),
        "fitted": now_iso(),
        "device_profile": f"{name}.device.yaml",
        "fit_residuals": residuals,
        "tp_collective_overhead_from": (
            "TP+SP layer microbenchmark: (TP layer - plain layer - 4 all-reduces on the fitted links) / 4"
            if tp_rows
            else "not measured"
        ),
        "overlap_contention_from": (
            "overlap microbenchmark: (GEMMs with a background all-reduce - GEMMs alone) / all-reduce alone"
            if contention is not None
            else "not measured"
        ),
        "not_fitted": (
            "tp_overlap=0 (CPU: TP collectives are synchronous)"
            if is_cpu
            else "tp_overlap kept from the defaults"
        ),
        "memory_constants": (
            "0 reserve, 0 comm buffers, 0 fragmentation: what the CPU peak measurement "
            "contains (autopar.calibration.calibrate docstring); refit from runs with validate --refit"
            if is_cpu
            else "CUDA defaults; refit from runs with validate --refit"
        ),
    }
    prov = {k: v for k, v in provenance.items() if v is not None}
    glob = dict(CPU_GLOBALS) if is_cpu else {}
    glob["kernel_overhead_us"] = round(overhead_us, 3)
    glob["tp_collective_overhead_us"] = round(tp_overhead * 1e6, 3)
    if contention is not None:
        glob["overlap_contention"] = round(contention, 4)
    dc = DeviceCoefficients(
        gemm={k: float(v) for k, v in gemm_eff.items()},
        gemm_half_dim=float(half_dim),
        attention=float(att_eff),
        hbm=float(hbm_frac),
        scale_up_bus=1.0,
        scale_out_bus=1.0,
        scale_up_latency_us=lat * 1e6,
        scale_out_latency_us=lat * 1e6,
    )
    cal = Calibration.model_validate(
        {"schema": "autopar.calibration/v1", "provenance": prov, "global": glob, "devices": {name: dc}}
    )
    values = {"peak_tflops_" + k: v / 1e12 for k, v in peak_flops.items()}
    values.update({f"gemm_eff_{k}": v for k, v in gemm_eff.items()})
    values.update(
        gemm_half_dim=half_dim,
        attention_eff=att_eff,
        memory_bw_gbps=mem_bw / 1e9,
        hbm_eff=hbm_frac,
        bus_gbps=bus / 1e9,
        peer_gbps=peer / 1e9,
        latency_us=lat * 1e6,
        kernel_overhead_us=overhead_us,
        tp_collective_overhead_us=tp_overhead * 1e6,
    )
    if contention is not None:
        values["overlap_contention"] = contention
    return MicrobenchFit(name, profile, cal, residuals, values)


def _scipy_version() -> str:
    import scipy

    return scipy.__version__


def build_profile(
    *,
    device_id: str,
    world_size: int,
    is_cpu: bool,
    where: str,
    peak_flops: dict[str, float],
    peak_srcs: dict[str, str],
    gemm_eff: dict[str, float],
    half_dim: float,
    att_eff: float,
    mem_bw: float,
    hbm_frac: float,
    bus: float,
    peer: float,
    lat: float,
    host: str,
) -> dict[str, Any]:
    """A device-profile dict (inline ``{value, src}`` leaves) for :func:`autopar.hardware.load_device`."""
    W = world_size
    fit_src = f"fitted: {where}"
    mem_gb = host_memory_gb() / W if is_cpu else 0.0
    return {
        "id": device_id,
        "name": f"{host} ({W} ranks{', gloo' if is_cpu else ''})",
        "vendor": "local",
        "peak_tflops": {p: _v(v / 1e12, peak_srcs[p]) for p, v in sorted(peak_flops.items())},
        "memory_gb": _v(
            mem_gb if is_cpu else 80.0,
            f"host RAM / {W} ranks (os.sysconf)" if is_cpu else "estimate: not measured by autopar calibrate",
        ),
        "memory_bw_gbps": _v(mem_bw / 1e9, f"measured: fastest elementwise stream per rank ({where})"),
        "scale_up": {
            "fabric": "gloo-loopback" if is_cpu else "local",
            "domain": {"value": int(W), "src": "the ranks of this host (one process per rank)"},
            "agg_gbps": _v(bus / 1e9, f"{fit_src}: alpha-beta bus bandwidth of all collectives"),
            "per_peer_gbps": _v(peer / 1e9, f"{fit_src}: send/recv bandwidth (at most the bus bandwidth)"),
            "switched": True,
            "latency_us": _v(lat * 1e6, f"{fit_src}: per-hop latency (autopar.collectives ring/tree terms)"),
        },
        "scale_out": {
            "fabric": "none (one host)",
            "per_device_gbps": _v(bus / 1e9, "not used: one host; set to the scale-up bandwidth"),
            "latency_us": _v(lat * 1e6, "not used: one host; set to the scale-up latency"),
        },
        "power": {
            "tdp_w": _v(
                15.0 if is_cpu else 700.0, "estimate: not measured; energy figures are not meaningful"
            ),
            "idle_w": _v(
                5.0 if is_cpu else 75.0, "estimate: not measured; energy figures are not meaningful"
            ),
        },
        "efficiency": {
            "gemm": {
                p: _v(min(max(e, 1e-6), 1.0), f"{fit_src}: GEMM sweep, latency.gemm_time roofline")
                for p, e in sorted(gemm_eff.items())
            },
            "gemm_half_dim": _v(half_dim, f"{fit_src}: GEMM sweep, shape factor 1/(1+h/M+h/N+h/K)"),
            "hbm": _v(min(hbm_frac, 1.0), f"{fit_src}: elementwise add over sizes / fastest stream"),
            "scale_up_bus": _v(1.0, "the fitted bus bandwidth is already the achieved rate"),
            "scale_out_bus": _v(1.0, "not used: one host"),
            "attention": _v(min(att_eff, 1.0), f"{fit_src}: causal SDPA forward+backward sweep"),
        },
    }


def naive_cpu_profile(device_id: str, world_size: int) -> dict[str, Any]:
    """The profile one would write for this host WITHOUT measuring: datasheet-style guesses.

    The "before" of the CPU validation study: theoretical FLOP/s, a typical DRAM bandwidth, loopback
    TCP at memory-copy speed with 10 µs latency, and autopar's default efficiencies.
    """
    W = world_size
    peak, src = cpu_peak_per_rank_tflops(W)
    share = min(1.0, usable_cores() / W)
    guess = "estimate: not measured (naive profile)"
    return {
        "id": device_id,
        "name": f"naive CPU profile ({W} ranks)",
        "vendor": "local",
        "peak_tflops": {"fp32": _v(peak, src), "bf16": _v(peak, src + "; bf16 assumed at the fp32 rate")},
        "memory_gb": _v(host_memory_gb() / W, f"host RAM / {W} ranks"),
        "memory_bw_gbps": _v(20.0 * share, f"{guess}: 20 GB/s DRAM per core"),
        "scale_up": {
            "fabric": "loopback",
            "domain": {"value": int(W), "src": "ranks of the host"},
            "agg_gbps": _v(10.0, guess),
            "per_peer_gbps": _v(10.0, guess),
            "switched": True,
            "latency_us": _v(10.0, guess),
        },
        "scale_out": {"fabric": "none", "per_device_gbps": _v(10.0, guess), "latency_us": _v(10.0, guess)},
        "power": {"tdp_w": _v(15.0, guess), "idle_w": _v(5.0, guess)},
        "efficiency": {
            "gemm": {"fp32": _v(0.8, guess), "bf16": _v(0.8, guess)},
            "scale_up_bus": _v(0.8, guess),
            "scale_out_bus": _v(0.8, guess),
        },
    }


# ------------------------------------------------------------------------------------- writing
def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _atomic_write(
    path: Path,
    text: str,
    check: Callable[[Path], Any],
    *,
    what: str = "calibration output",
    flag: str = "--out-dir",
) -> None:
    """Write ``text`` to a temporary file next to ``path``, ``check`` it, then rename it over ``path``.

    A reader sees the old file or the new, complete and valid one; on any error nothing is left
    (:func:`autopar.files.write_text`: regular files only, no directory created, umask modes).
    """
    from autopar.files import write_text

    write_text(path, text, what, flag, check=check)


def calibration_yaml(cal: Calibration) -> str:
    """The YAML of a calibration, in :func:`autopar.calibration.fit.write_calibration`'s layout."""
    data = {
        "schema": "autopar.calibration/v1",
        "provenance": _plain(cal.provenance),
        "global": {k: round(float(v), 6) for k, v in cal.global_.items()},
        "transfer": cal.transfer.model_dump(),
        "devices": {
            k: {
                kk: (
                    {g: round(float(x), 6) for g, x in vv.items()}
                    if isinstance(vv, dict)
                    else float(f"{vv:.6g}")
                )
                for kk, vv in v.model_dump(exclude_none=True).items()
                if vv not in ({}, None)
            }
            for k, v in sorted(cal.devices.items())
        },
    }
    return yaml.safe_dump(data, sort_keys=False)


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _check_calibration(p: Path) -> None:
    from autopar.coefficients import parse_calibration

    parse_calibration(p.read_text(), str(p))


def write_calibration_atomic(cal: Calibration, path: str | Path, *, flag: str = "--refit") -> Path:
    """Write a calibration atomically and only if it reloads as a valid calibration."""
    path = Path(path)
    _atomic_write(path, calibration_yaml(cal), _check_calibration, what="calibration", flag=flag)
    from autopar import coefficients as _calmod

    _calmod._load.cache_clear()  # load_calibration caches by path: make it see the new file
    return path


def write_profile_atomic(profile: dict[str, Any], path: str | Path, *, flag: str = "--out-dir") -> Path:
    """Write a device profile atomically and only if :func:`autopar.hardware.load_device` accepts it."""
    from autopar.hardware import _parse

    path = Path(path)
    text = SCHEMA_PROFILE_COMMENT + yaml.safe_dump(_plain(profile), sort_keys=False)
    _atomic_write(
        path,
        text,
        lambda p: _parse(p.read_text(), str(path), builtin=False),
        what="device profile",
        flag=flag,
    )
    return path


MAX_NAME_BYTES = 200  # <name>.device.yaml's temporary file (+26 bytes) stays within NAME_MAX (255)


def check_name(name: str) -> str:
    """A calibration name is a plain file stem: no separators, spaces or control characters, and
    short enough that every file made from it (``<name>.device.yaml`` and its temporary) can exist."""
    if not name or any(c in name for c in "/\\ ") or name.startswith(".") or not name.isprintable():
        raise AutoparError(
            f"calibration name {name!r} is not a plain file name", "pass --name like local-cpu-w4"
        )
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise AutoparError(
            f"calibration name is {size} bytes long, over the {MAX_NAME_BYTES} a file name made from it allows",
            f"pass a --name of at most {MAX_NAME_BYTES} bytes",
        )
    return name


def check_calibration_outputs(name: str, out_dir: str | Path, *, create_out_dir: bool) -> tuple[Path, bool]:
    """Check ``<out_dir>/<name>.yaml`` and ``<name>.device.yaml`` before any measuring; creates nothing.

    Returns the directory and whether it is still to be made (``create_out_dir``, the default
    directory, and it does not exist yet: then its parent must be writable).
    """
    from autopar.files import check_output, check_output_dir

    check_name(name)
    make = create_out_dir and not os.path.lexists(out_dir)
    if make:  # nothing in the way, the parent writable
        check_output(out_dir, "calibration directory", "--out-dir")
        return Path(out_dir), True
    out = check_output_dir(out_dir, "--out-dir")
    check_output(out / f"{name}.device.yaml", "device profile", "--out-dir")
    check_output(out / f"{name}.yaml", "calibration", "--out-dir")
    return out, False


def calibrate(
    *,
    world_size: int,
    name: str,
    out_dir: str | Path,
    sweep: str = "full",
    device: str = "auto",
    timeout_s: float = 900,
    raw: dict[str, Any] | None = None,
    save_raw: str | Path | None = None,
    create_out_dir: bool = False,
    announce: Callable[[], None] | None = None,
) -> tuple[MicrobenchFit, Path, Path]:
    """Measure (unless ``raw`` is given), fit, and write ``<out_dir>/<name>.yaml`` and ``<name>.device.yaml``.

    ``out_dir`` must exist, unless ``create_out_dir`` (the CLI's default directory): then it is
    made, in an existing directory, once the fit has succeeded.
    """
    from autopar.calibration.microbench import run_microbenchmarks
    from autopar.files import check_output

    out, make = check_calibration_outputs(name, out_dir, create_out_dir=create_out_dir)
    if save_raw and raw is None:
        check_output(save_raw, "raw microbenchmark results", "--save-raw")
    if raw is None:
        if announce is not None:  # everything is checked: say what the long part is doing
            announce()
        raw = run_microbenchmarks(world_size, sweep=sweep, device=device, timeout_s=timeout_s)
        if save_raw:
            import json

            _atomic_write(
                Path(save_raw),
                json.dumps(raw, indent=1),
                lambda p: None,
                what="raw results",
                flag="--save-raw",
            )
    fitted = fit_microbenchmarks(raw, name=name)
    if make:
        out.mkdir()
    try:
        prof_path = write_profile_atomic(fitted.profile, out / f"{name}.device.yaml")
        cal_path = write_calibration_atomic(fitted.calibration, out / f"{name}.yaml", flag="--out-dir")
    except BaseException:
        if make:  # the directory made here is removed again if nothing was written into it
            with contextlib.suppress(OSError):
                out.rmdir()  # only if still empty
        raise
    return fitted, cal_path, prof_path


# ------------------------------------------------------------------------------------- refits
# In priority order: ``autopar validate --refit`` fits the first max(1, runs // 2) of them.
DEFAULT_TIME_PARAMS: tuple[str, ...] = (
    "global.kernel_overhead_us",
    "global.overlap_contention",
    "scale_up_latency_us",
    "global.tp_collective_overhead_us",
    "gemm",
    "attention",
)
_BOUNDS = {
    "gemm": (1e-3, 1.0),
    "attention": (1e-3, 1.0),
    "scale_up_latency_us": (0.1, 1e6),
    "scale_up_bus": (1e-3, 1.0),
    "gemm_half_dim": (1.0, 4096.0),
    "hbm": (1e-3, 1.0),
    "global.kernel_overhead_us": (0.0, 1e6),
    "global.overlap_contention": (0.0, 20.0),
    "global.tp_overlap": (0.0, 0.95),
    "global.tp_collective_overhead_us": (0.0, 1e6),
}


@dataclass
class RefitResult:
    calibration: Calibration
    names: list[str]
    before: np.ndarray  # log(pred/measured) per sample, base calibration
    after: np.ndarray  # the same after the refit
    memory: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "params": {n: float(v) for n, v in zip(self.names, self._values(), strict=True)},
            "time_before": residual_summary(self.before),
            "time_after": residual_summary(self.after),
            "memory": self.memory,
        }

    def _values(self) -> list[float]:
        out = []
        for n in self.names:
            scope, key = n.split(".", 1)
            if scope == "global":
                out.append(self.calibration.global_value(key))
            else:
                dc = self.calibration.devices[scope]
                if key.startswith("gemm_") and key != "gemm_half_dim":
                    out.append(dc.gemm[key[5:]])
                else:
                    out.append(getattr(dc, key))
        return out


def _current(job, cal: Calibration, name: str) -> float:
    from autopar.coefficients import coefficients_for

    co, links = coefficients_for(job.device, cal)
    scope, key = name.split(".", 1)
    if scope == "global":
        return cal.global_value(key)
    if key.startswith("gemm_") and key != "gemm_half_dim":
        return co.gemm_eff.get(key[5:], co.gemm_eff["bf16"])
    return {
        "attention": co.attention_eff,
        "gemm_half_dim": co.gemm_half_dim,
        "hbm": co.hbm_bw / (job.device.memory_bw_gbps * 1e9),
        "scale_up_bus": links["scale_up_bus"],
        "scale_out_bus": links["scale_out_bus"],
        "scale_up_latency_us": links.get("scale_up_latency_us", job.device.scale_up.latency_us),
        "scale_out_latency_us": links.get("scale_out_latency_us", job.device.scale_out.latency_us),
    }[key]


def refit_time(
    groups: Sequence[tuple[Any, Any, np.ndarray]],
    base: Calibration,
    *,
    params: Sequence[str] = DEFAULT_TIME_PARAMS,
    precisions: Sequence[str] = ("fp32",),
    provenance: dict[str, Any] | None = None,
) -> RefitResult:
    """Least-squares refit of time coefficients to measured step times.

    ``groups``: ``(TrainingJob, LayoutTable, measured step seconds)`` per job. Residuals are
    log(predicted/measured) step time (the same as :mod:`autopar.calibration.fit`'s log throughput), soft-L1;
    the coefficients are written through :func:`autopar.calibration.fit.calibration_from_vector`.
    """
    from scipy.optimize import least_squares

    from autopar.calibration.fit import calibration_from_vector
    from autopar.engine import evaluate

    if not groups:
        raise AutoparError("no successful runs to refit to", "validate some layouts first")
    dev_ids = sorted({g[0].device.id for g in groups})
    names: list[str] = []
    for p in params:
        if p.startswith("global."):
            names.append(p)
            continue
        for d in dev_ids:
            if p == "gemm":
                names.extend(f"{d}.gemm_{q}" for q in precisions)
            else:
                names.append(f"{d}.{p}")
    job0 = groups[0][0]
    x0 = np.array(
        [
            _current(
                next(g[0] for g in groups if g[0].device.id == n.split(".")[0])
                if not n.startswith("global.")
                else job0,
                base,
                n,
            )
            for n in names
        ],
        dtype=np.float64,
    )
    lo = np.array(
        [
            _BOUNDS[
                "gemm"
                if ".gemm_" in n and not n.endswith("half_dim")
                else (n if n.startswith("global.") else n.split(".", 1)[1])
            ][0]
            for n in names
        ]
    )
    hi = np.array(
        [
            _BOUNDS[
                "gemm"
                if ".gemm_" in n and not n.endswith("half_dim")
                else (n if n.startswith("global.") else n.split(".", 1)[1])
            ][1]
            for n in names
        ]
    )
    x0 = np.clip(x0, lo, hi)

    def res(cal: Calibration) -> np.ndarray:
        out = []
        for job, table, meas in groups:
            r = evaluate(job, table, calibration=cal, check_legal=False)
            out.append(np.log(r["step_time_s"] / meas))
        return np.concatenate(out)

    before = res(base)

    def f(x: np.ndarray) -> np.ndarray:
        return res(calibration_from_vector(names, x, base))

    sol = least_squares(
        f,
        x0,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=0.1,
        x_scale=np.maximum(np.abs(x0), 1e-3),
        diff_step=1e-3,
        max_nfev=200,
    )
    prov = dict(base.provenance)
    prov.update(provenance or {})
    cal = calibration_from_vector(names, sol.x, base, prov)
    return RefitResult(cal, names, before, res(cal))


def refit_memory(
    groups: Sequence[tuple[Any, Any, np.ndarray]],
    base: Calibration,
    *,
    fit: Sequence[str] = ("fragmentation", "framework_reserve_gib"),
) -> tuple[Calibration, dict[str, Any]]:
    """Fit the memory runtime constants (linear in them) to measured peak bytes per device.

    Predicted = state + activations x (1 + fragmentation) + logits + ZeRO-3 buffers
    + comm_buffer x groups + reserve, compared with the measured peak of the most loaded rank;
    relative residuals, least squares with fragmentation >= -0.5 and the others >= 0.
    """
    from scipy.optimize import lsq_linear

    from autopar.engine import evaluate

    cols, meas_all, rows_base = [], [], []
    zero = base.model_copy(
        update={
            "global_": {
                **base.global_,
                "fragmentation": 0.0,
                "framework_reserve_gib": 0.0,
                "comm_buffer_gb": 0.0,
            }
        }
    )
    for job, table, meas in groups:
        r = evaluate(job, table, calibration=zero, check_legal=False)
        act = r["mem_activations"]
        groups_n = _comm_groups(table)
        base_bytes = r["memory_bytes"].copy()
        const = {
            "fragmentation": act,
            "framework_reserve_gib": np.full(len(table), float(2**30)),
            "comm_buffer_gb": groups_n * 1e9,
        }
        for k in ("fragmentation", "framework_reserve_gib", "comm_buffer_gb"):
            if k not in fit:
                base_bytes = base_bytes + base.global_value(k) * const[k]
        cols.append(np.stack([const[k] for k in fit], axis=1))
        rows_base.append(base_bytes)
        meas_all.append(np.asarray(meas, dtype=np.float64))
    A = np.concatenate(cols)
    b0 = np.concatenate(rows_base)
    m = np.concatenate(meas_all)
    lo = np.array([-0.5 if k == "fragmentation" else 0.0 for k in fit])
    hi = np.array([5.0 if k == "fragmentation" else np.inf for k in fit])
    sol = lsq_linear(A / m[:, None], (m - b0) / m, bounds=(lo, hi))
    new = dict(base.global_)
    new.update({k: float(v) for k, v in zip(fit, sol.x, strict=True)})
    cal = base.model_copy(update={"global_": new})
    before_pred = b0 + A @ np.array([base.global_value(k) for k in fit])
    after_pred = b0 + A @ sol.x
    info = {
        "fitted": {k: float(v) for k, v in zip(fit, sol.x, strict=True)},
        "before": residual_summary(np.log(before_pred / m)),
        "after": residual_summary(np.log(after_pred / m)),
    }
    return cal, info


def _comm_groups(lay) -> np.ndarray:
    return ParallelDims(lay).process_groups.astype(np.float64)


__all__ = [
    "MicrobenchFit",
    "fit_microbenchmarks",
    "calibrate",
    "naive_cpu_profile",
    "write_calibration_atomic",
    "write_profile_atomic",
    "refit_time",
    "refit_memory",
    "RefitResult",
    "cpu_peak_per_rank_tflops",
    "residual_summary",
]
