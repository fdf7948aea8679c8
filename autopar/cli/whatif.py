"""``autopar whatif``: hardware fields as sweep axes, the best layout per point, sensitivity and targets.

See :mod:`autopar.whatif.sweep` for the model (the training engine's step time decomposed into
demands on each resource once per layout, then one matrix product per batch of hardware points).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from autopar.limits import markup_safe as ms


def register(sub: Any) -> dict[str, Any]:
    from autopar.cli.args import add_job_args, int_range
    from autopar.cli.serve import positive_float

    p = sub.add_parser(
        "whatif",
        help="hardware what-if: sweep device/cluster fields, best layout per point, sensitivity",
        description="Vary device and cluster fields (peak FLOP/s, memory capacity and bandwidth, "
        "scale-up domain, bandwidth and latency, scale-out bandwidth and latency, power) for a "
        "training job; every hardware point gets its best layout of the search space. Prints the "
        "points, the elasticity of the step time to each resource at the base hardware and, with a "
        "target, the smallest change of one resource that reaches it.",
    )
    add_job_args(p)
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="FIELD=LO:HI:N",
        help="a hardware axis: N evenly spaced values from LO to HI, or FIELD=V1,V2,...; repeatable "
        "(axes combine as a grid). Fields: peak_tflops.bf16, peak_tflops.fp8, memory_gb, "
        "memory_bw_gbps, scale_up.domain, scale_up.agg_gbps, scale_up.latency_us, "
        "scale_out.per_device_gbps, scale_out.latency_us, power.tdp_w, power.idle_w",
    )
    p.add_argument(
        "--space", default=None, help="search space: built-in name or YAML/TOML file (default: default)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="AXIS=V1,V2",
        help="override one axis of the search space (as in recommend); repeatable",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--target-step-time",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="what would it take: the smallest change of each resource that reaches this step time",
    )
    g.add_argument(
        "--target-tokens-per-s-per-device",
        type=positive_float,
        default=None,
        metavar="TPS",
        help="what would it take, as training tokens/s per device",
    )
    p.add_argument(
        "--top",
        type=int_range(1, 1000),
        default=10,
        help="hardware points shown, fastest first (default: 10)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output: every point")
    return {"whatif": cmd_whatif}


def cmd_whatif(a: argparse.Namespace) -> int:
    import numpy as np

    from autopar.cli.args import job_kwargs
    from autopar.coefficients import load_calibration
    from autopar.prediction import training_job
    from autopar.search.space import load_space
    from autopar.whatif.sweep import (
        RESOURCES,
        check_grid,
        parse_vary,
        sensitivity,
        sweep,
        what_would_it_take,
    )

    axes = [parse_vary(v) for v in a.vary]  # bad axes are refused before any work
    check_grid(axes)
    kw = job_kwargs(a)
    cal_path = kw.pop("calibration", None)
    job = training_job(**kw)
    cal = load_calibration(cal_path) if cal_path else load_calibration()
    space = load_space(a.space, tuple(a.overrides))
    res = sweep(job, axes, space=space, calibration=cal)
    base_dec = res["decompositions"].get(job.devices_per_node)
    if base_dec is None:
        from autopar.whatif.sweep import decompose

        base_dec = decompose(job, space=space, calibration=cal)
    sens = sensitivity(base_dec)
    target = a.target_step_time
    if a.target_tokens_per_s_per_device is not None:
        target = job.tokens_per_step / (a.target_tokens_per_s_per_device * job.num_devices)
    take = what_would_it_take(base_dec, target) if target is not None else None

    order = np.argsort(res["step_time_s"], kind="stable")
    fields = list(res["points"])
    if a.json:
        out = {
            "job": job.info(),
            "fields": fields,
            "n_points": res["n_points"],
            "n_layouts": res["n_layouts"],
            "evaluations": res["evaluations"],
            "points": [
                {
                    **{f: float(res["points"][f][i]) for f in fields},
                    "layout": res["layout"][i],
                    "step_time_s": _num(res["step_time_s"][i]),
                    "tokens_per_s_per_device": float(res["tokens_per_s_per_device"][i]),
                    "joules_per_step": _num(res["joules_per_step"][i]),
                    "bound": res["bound"][i],
                    "shares": {r: float(res["share"][i][k]) for k, r in enumerate(RESOURCES)},
                }
                for i in range(res["n_points"])
            ],
            "sensitivity": {k: _num(v) for k, v in sens.items()},
            "what_would_it_take": None if take is None else {k: _num(v) for k, v in take.items()},
        }
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
        return 0

    from rich.table import Table

    from autopar.cli.render import console

    con = console()
    con.print(
        f"{ms(job.model.name)} on {job.num_devices} x {ms(job.device.id)} (seq {job.seq_len}, global batch "
        f"{job.global_batch}): {res['n_points']:,} hardware points x {res['n_layouts']:,} layouts "
        f"= {res['evaluations']:,} evaluations"
    )
    t = Table(
        title=f"best layout per hardware point (fastest {min(a.top, res['n_points'])}; step times from the "
        "full engine over the demand model's best layouts at each point)"
    )
    for f in fields:
        t.add_column(f, justify="right")
    for c in ("layout", "step time", "tok/s/device", "kJ/step", "bound by"):
        t.add_column(c, justify="left" if c in ("layout", "bound by") else "right")
    for i in order[: a.top]:
        ok = math.isfinite(res["step_time_s"][i])
        layout, step = res["layout"][i], res["step_time_s"][i]
        t.add_row(
            *[f"{res['points'][f][i]:g}" for f in fields],
            layout or "nothing fits",
            f"{step:.3f} s" if ok else "-",
            f"{job.tokens_per_step / (step * job.num_devices):,.0f}" if ok else "-",
            f"{res['joules_per_step'][i] / 1e3:,.0f}" if ok else "-",
            res["bound"][i] or "-",
        )
    con.print(t)
    s = Table(title="sensitivity at the base hardware: elasticity d ln(step time) / d ln(resource)")
    s.add_column("resource")
    s.add_column(f"base ({job.device.id})", justify="right")
    s.add_column("elasticity", justify="right")
    for k, v in sorted(sens.items(), key=lambda kv: kv[1] if math.isfinite(kv[1]) else 0.0):
        s.add_row(k, f"{base_dec.base[k]:g}", f"{v:+.3f}")
    con.print(s)
    bound = min(sens, key=lambda k: sens[k] if math.isfinite(sens[k]) and k in _rates() else 0.0)
    con.print(f"bounded by: [bold]{bound}[/] (the resource whose increase shortens the step most)")
    if take is not None:
        w = Table(
            title=f"what would it take: best step time {take['base_step_time_s']:.3f} s -> "
            f"{take['target_step_time_s']:.3f} s, one resource at a time"
        )
        w.add_column("resource")
        w.add_column("needed", justify="right")
        w.add_column("factor", justify="right")
        for k in sens:
            f = take.get(k)
            if f is None:
                w.add_row(k, "unreachable", "(other terms bound)")
            else:
                w.add_row(k, f"{base_dec.base[k] * f:g}", f"x{f:.3f}")
        con.print(w)
    return 0


def cmd_landscape(a: argparse.Namespace) -> int:
    """``autopar compare --per ...``: the landscape table, winner per cell and where it changes."""
    from autopar.errors import AutoparError
    from autopar.whatif.landscape import NORMALIZATIONS, landscape

    if a.workload == "training":  # --per is the serving landscape: --workload serving or none
        raise AutoparError("--per compares serving only", "drop --workload training or --per")
    if a.batches is None or any(b is None for b in a.batches):
        raise AutoparError("--per needs explicit batch sizes", "e.g. --batch 1,8,64,256 (not 'max')")
    if a.out:
        raise AutoparError("--per writes no files", "use --json > FILE for the data")
    if a.utilization > 1:
        raise AutoparError(f"--utilization {a.utilization} exceeds 1", "give a share of time in (0, 1]")
    prices: dict[str, float] = {}
    if a.price_per_device_hour is not None:
        prices = {d.lower(): a.price_per_device_hour for d in a.devices}
    prices.update(a.prices or {})
    res = landscape(
        a.models,
        [d.lower() for d in a.devices],
        a.seq_lens,
        a.batches,
        osl=a.osl,
        per=a.per,
        prices=prices,
        max_chips=a.num_devices,
        weight_precision=a.weight_precision or "bf16",
        kv_precision=a.kv_precision,
        calibration=a.calibration,
        utilization=a.utilization,
    )
    if a.json:
        sys.stdout.write(json.dumps(res.to_dict(), indent=1) + "\n")
        return 0
    from rich.table import Table

    from autopar.cli.render import console

    con = console()
    cells = {(c["model"], c["seq_len"], c["batch"], c["device"]): c for c in res.cells}
    for p in res.per:
        t = Table(title=f"winner per cell: {NORMALIZATIONS[p]} (value; runner-up)")
        t.add_column("model")
        t.add_column("seq", justify="right")
        for b in res.batches:
            t.add_column(f"batch {b}", justify="left")
        for m in res.models:
            for s in res.seq_lens:
                row = []
                for b in res.batches:
                    here = [cells[(m, s, b, d)] for d in res.devices]
                    ranked = sorted((c for c in here if c.get(p) is not None), key=lambda c: -float(c[p]))  # noqa: B023
                    if not ranked:
                        row.append("none feasible")
                        continue
                    w = ranked[0]
                    second = f"; {ranked[1]['device']} {ranked[1][p]:,.3g}" if len(ranked) > 1 else ""
                    row.append(f"{w['device']} {w[p]:,.3g} (x{w[f'{p}_chips']}){second}")
                t.add_row(m, str(s), *row)
        con.print(t)
        ch = res.changes[p]
        con.print(f"winner changes ({NORMALIZATIONS[p]}): " + ("none" if not ch else f"{len(ch)}"))
        for line in ch:
            con.print(f"  {line}")
    return 0


def _rates() -> tuple[str, ...]:
    from autopar.whatif.sweep import RATES

    return RATES


def _num(x: Any) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None
