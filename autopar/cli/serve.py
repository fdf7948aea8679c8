"""``autopar serve``: search inference layouts under latency targets (see autopar.serving.search)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autopar.cli.args import MAX_TOP, add_field_args, int_range, positive_int
from autopar.job import ClusterSpec, Job, ServingWorkload
from autopar.limits import markup_safe as ms
from autopar.limits import terminal_safe


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{v} must be a positive finite number")
    return v


def fraction(text: str) -> float:
    v = positive_float(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"{v} must be in (0, 1]")
    return v


def float_list(text: str) -> list[float]:
    return [positive_float(x) for x in text.split(",") if x.strip()]


LOAD_FIELDS = ("concurrency", "request_rate", "offline")
WORKLOAD_FIELDS = tuple(k for k in ServingWorkload.model_fields if k != "kind")


def add_serving_workload_args(p: argparse.ArgumentParser, *, lengths_required: bool = True) -> None:
    """Request shape, load, precisions, targets and runtime limits, generated from
    :class:`autopar.job.ServingWorkload` (the load flags are mutually exclusive)."""
    add_field_args(
        p, ServingWorkload, ("isl", "osl"), defaults={} if lengths_required else {"isl": None, "osl": None}
    )
    add_field_args(p.add_mutually_exclusive_group(), ServingWorkload, LOAD_FIELDS)
    add_field_args(p, ServingWorkload, [k for k in WORKLOAD_FIELDS if k not in (*LOAD_FIELDS, "isl", "osl")])
    p.add_argument(
        "--price-per-device-hour",
        type=positive_float,
        default=None,
        help="$ per device-hour, for $/M output tokens (default: no cost column)",
    )
    add_field_args(p, Job, ("calibration", "allow_long_context"))


def workload_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(a, k) for k in WORKLOAD_FIELDS}


def register(sub) -> dict:
    p = sub.add_parser(
        "serve",
        help="search inference layouts under TTFT/TPOT targets",
        description="Search TP x PP x EP x replicas x concurrency (and disaggregated "
        "prefill/decode pools) for serving a model; exit 2 when no layout "
        "meets the targets, with the closest achievable figures.",
    )
    add_field_args(p, Job, ("model",))
    add_field_args(p, ClusterSpec, tuple(ClusterSpec.model_fields))
    add_serving_workload_args(p)
    p.add_argument(
        "--power-caps",
        type=float_list,
        default=None,
        help="device power caps to search, W, comma-separated, e.g. 400,500,600 (default: TDP only)",
    )
    p.add_argument(
        "--no-disaggregated",
        dest="disaggregated",
        action="store_false",
        help="skip disaggregated prefill/decode pools (default: they are searched)",
    )
    for d in ("tp", "pp", "ep", "adp"):
        p.add_argument(f"--{d}", type=positive_int, default=None, help=f"pin {d} (default: searched)")
    p.add_argument(
        "--objective",
        choices=("throughput", "fewest-devices"),  # autopar.serving.search.OBJECTIVES (not imported: startup)
        default="throughput",
        help="rank by what the --num-devices given deliver (output tokens/s; under --request-rate the "
        "highest rate sustained), or by the fewest devices that carry the --request-rate or "
        "--concurrency within the targets (default: throughput)",
    )
    p.add_argument("--top", type=int_range(1, MAX_TOP), default=10, help="how many layouts to list")
    p.add_argument("--json", action="store_true", help="machine-readable output (shape of recommend --json)")
    from autopar.cli.recommend import add_html_arg

    add_html_arg(p)
    return {"serve": cmd_serve}


def cmd_serve(a: argparse.Namespace) -> int:
    from autopar.report import check_html_path
    from autopar.serving.search import ServingInfeasible, serve

    check_html_path(a.html)
    from autopar.progress import Spinner

    spinner = Spinner("serve: searching layouts").start()
    try:
        res = serve(
            model=a.model,
            device=a.device,
            num_devices=a.num_devices,
            devices_per_node=a.devices_per_node,
            power_caps_w=a.power_caps,
            price_per_device_hour=a.price_per_device_hour,
            disaggregated=a.disaggregated,
            tp=a.tp,
            pp=a.pp,
            ep=a.ep,
            adp=a.adp,
            top=a.top,
            objective=a.objective,
            calibration=a.calibration,
            allow_long_context=a.allow_long_context,
            **workload_kwargs(a),
        )
    except ServingInfeasible as exc:
        if a.json and exc.result is not None:
            sys.stdout.write(json.dumps(exc.result.to_dict(), indent=2, default=float) + "\n")
        raise
    finally:
        spinner.stop()
    if a.json:
        sys.stdout.write(json.dumps(res.to_dict(), indent=2, default=float) + "\n")
    else:
        print_serving(res)
    if a.html:
        from autopar.cli.report import serving_report

        serving_report(res).write(a.html)
        if not a.json:
            print(f"wrote {terminal_safe(a.html)}")
    return 0


def _f(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def print_serving(res) -> None:
    from rich.table import Table

    from autopar.cli.render import console

    con = console()
    w, job, c, cost = res.workload, res.job, res.job["cluster"], res.costing
    load = (
        "offline max-throughput"
        if w["offline"]
        else f"concurrency {w['concurrency']} ({w.get('arrival', 'staggered')} arrivals)"
        if w["concurrency"]
        else f"{w['request_rate']:g} req/s"
        if w["request_rate"]
        else "concurrency sweep"
    )
    con.print(
        f"{ms(job['model'])} on {c['num_devices']} x {ms(c['device'])}: isl {w['isl']}, osl {w['osl']}, "
        f"{load}; weights {w['weight_precision']} (GEMMs {cost['compute_precision']}), "
        f"KV {cost['kv_precision']}"
    )
    con.print(f"coefficients: {ms(cost.get('coefficients', 'default'))}")
    ee = cost.get("expected_error")
    con.print(
        f"expected error of tokens/s: {ms(ee['text'])}"
        if ee
        else "expected error of tokens/s: not quoted (no held-out serving runs describe this calibration)"
    )
    con.print(
        f"{res.layouts_enumerated} candidates, {res.layouts_feasible} feasible; infeasible: "
        + (", ".join(f"{k} {v}" for k, v in res.infeasible_by_reason.items()) or "none")
    )
    con.print(f"ranked by {ms(res.ranking)}")
    t = Table(title="best serving layouts")
    cols, rows = res.table()
    for c in cols[1:]:
        t.add_column(c, justify="left" if c == "layout" else "right")
    for row in rows:
        t.add_row(*row[1:])
    from autopar.cli.render import add_legend

    add_legend(t, [row[1] for row in rows])
    con.print(t)
    if res.min_devices:
        con.print(
            f"fewest devices for {w['request_rate']:g} req/s: {res.min_devices['devices']} "
            f"({res.min_devices['layout']['short']})"
        )
    con.print(f"Pareto front (tok/s/device vs tok/s/user): {len(res.pareto)} points; `--json` lists them")
    for n in res.notes:
        con.print(f"note: {ms(n)}")
