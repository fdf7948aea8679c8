"""``autopar recommend``: the best layouts of a search space for one training job."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autopar.limits import terminal_safe


def add_search_args(p: argparse.ArgumentParser) -> None:
    """Search-space and scoring flags shared by recommend, study and sweep."""
    p.add_argument(
        "--space",
        default=None,
        help="search space: a built-in name (default, moe, long_context, uneven_pipeline) or a "
        "YAML/TOML file (default: default)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="AXIS=V1,V2",
        help="override one axis of the space: --set tp=1,2,4,8 (candidate list; one value pins it), "
        "--set cp.max=16 (a field), --set sp=both; repeatable",
    )
    from autopar.cli.args import nonneg_float, positive_float

    p.add_argument(
        "--price-per-device-hour",
        type=positive_float,
        default=None,
        help="USD per device-hour for the cost objective (default: 2.0)",
    )
    p.add_argument(
        "--price-per-kwh",
        type=nonneg_float,
        default=0.0,
        help="USD per kWh added to the cost objective (default: 0: included in the device price)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="score on Ray: an embedded local instance (no value) or a cluster ADDRESS",
    )


def register(sub: Any) -> dict[str, Any]:
    from autopar.cli.args import MAX_TOP, MAX_WORKERS, add_job_args, int_range

    p = sub.add_parser(
        "recommend",
        help="the best parallel layouts of a search space for a training job",
        description="Enumerate every legal layout of a search space, score them with the "
        "memory and time models, and rank those that fit.",
    )
    add_job_args(p)
    p.add_argument(
        "--top",
        type=int_range(1, MAX_TOP),
        default=5,
        help=f"how many layouts to return, 1..{MAX_TOP} (default: 5)",
    )
    p.add_argument(
        "--objective",
        default="throughput",
        help="throughput (default), memory, energy or cost; several separated by commas give their "
        "Pareto front",
    )
    add_search_args(p)
    p.add_argument(
        "--workers",
        type=int_range(1, MAX_WORKERS),
        default=None,
        help="processes that score chunks (default: 1 below 1.5M layouts, else one per core)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (no progress bar)")
    p.add_argument(
        "--export",
        nargs="?",
        const="",
        default=None,
        metavar="FMT",
        help="also render the winner for a launcher (see `autopar export --list-formats`); without a "
        "value, the format of --framework (megatron->megatron, torchtitan->torchtitan, "
        "deepspeed->deepspeed, fsdp->accelerate)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="with --export: write the launcher file here (default: stdout after the report)",
    )
    add_html_arg(p)
    return {"recommend": cmd_recommend}


def add_html_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--html",
        default=None,
        metavar="PATH",
        help="also write a self-contained HTML report (plots, tables, assumptions; opens offline)",
    )


def price(a: argparse.Namespace) -> float:
    from autopar.search.recommend import DEFAULT_PRICE_PER_DEVICE_HOUR

    return DEFAULT_PRICE_PER_DEVICE_HOUR if a.price_per_device_hour is None else a.price_per_device_hour


def cmd_recommend(a: argparse.Namespace) -> int:
    from autopar.cli.args import job_kwargs
    from autopar.errors import AutoparError
    from autopar.search.recommend import recommend

    if a.export == "":  # --export without a value: the training stack's own launcher
        from autopar.job import FRAMEWORK_EXPORT_FORMAT

        a.export = FRAMEWORK_EXPORT_FORMAT[a.framework or "megatron"]
    if a.export is not None:  # a bad format is refused before the search runs
        from autopar.export import EXPORTERS

        if a.export not in EXPORTERS:
            raise AutoparError(
                f"unknown export format {a.export!r}", f"use one of: {', '.join(sorted(EXPORTERS))}"
            )
    if a.export and a.json and a.out is None:
        raise AutoparError("--export with --json needs --out PATH", "stdout carries the JSON")
    if a.out is not None and a.export is None:
        raise AutoparError("--out is for the launcher file of --export", "add --export FMT")
    from autopar.cli.export import check_out

    check_out(a.out)  # a bad destination is refused before the search runs
    if a.html is not None:  # the report module loads only for a report
        from autopar.report import check_html_path

        check_html_path(a.html)
    objective = a.objective
    if a.html and "," not in objective:
        # the report's Pareto plot needs a front: keep the one against memory (the ranking is unchanged)
        objective += ",memory" if objective.strip() != "memory" else ",throughput"

    started = _maybe_start_ray(a.ray)
    try:
        res = recommend(
            **job_kwargs(a),
            top=a.top,
            objective=objective,
            space=a.space,
            overrides=tuple(a.overrides),
            price_per_device_hour=price(a),
            price_per_kwh=a.price_per_kwh,
            ray=a.ray,
            workers=a.workers,
            progress=not a.json,
            launcher=a.export or None,
        )
    finally:
        if started:
            from autopar.search.ray_backend import shutdown

            shutdown()
    rendered = None
    if a.export:  # render before printing anything: an unexpressible layout is exit 2 with no output
        from autopar.cli.export import render_record
        from autopar.export import ExportError

        try:
            rendered = render_record(res.results[0].to_dict(), a.export)
        except ExportError as exc:
            raise ExportError(
                f"the winner {res.results[0].layout.short()}: {exc.message}", exc.hint
            ) from None
    if a.json:
        sys.stdout.write(json.dumps(res.to_dict(), indent=2, default=float) + "\n")
    else:
        print_search_result(res)
    if rendered is not None:
        from autopar.cli.export import write_output

        write_output(rendered, a.out)
    if a.html:
        from autopar.cli.report import search_report

        search_report(res, export_format=a.export).write(a.html)
        if not a.json:
            print(f"wrote {terminal_safe(a.html)}")
    return 0


def _maybe_start_ray(address: str | None) -> bool:
    if address is None:
        return False
    from autopar.search.ray_backend import connect

    return connect(address)


# ------------------------------------------------------------------------------------------ report
def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _ranked_table(title: str, preds: list, res, extra_cols: list[str]):
    from rich.table import Table

    t = Table(title=title)
    t.add_column("#", justify="right")
    t.add_column("layout", no_wrap=True)
    t.add_column("step time", justify="right")
    t.add_column("tokens/s/device", justify="right")
    t.add_column("MFU", justify="right")
    t.add_column("memory/device", justify="right")
    t.add_column("exposed comm", justify="right")
    for c in extra_cols:
        t.add_column(c, justify="right")
    also = any(p.extra.get("also") for p in preds)
    if also:  # layouts that differ from the row in a setting that changes no figure
        t.add_column("also (same figures)")
    for i, p in enumerate(preds, 1):
        ob = res.objective_report(p)
        row = [
            str(i),
            p.layout.short(),
            _fmt_s(p.step_time_s),
            f"{p.tokens_per_s_per_device:,.0f}",
            p.mfu_text(),
            f"{p.memory_gib_per_device:.1f} / {p.memory_capacity_gib:.0f} GiB",
            f"{p.exposed_comm_fraction:.1%}",
        ]
        if "energy J/token" in extra_cols:
            row.append(f"{ob['energy_j_per_token']:.3f}")
        if "$/M tokens" in extra_cols:
            row.append(f"{ob['cost_usd_per_million_tokens']:.3f}")
        if also:
            from autopar.prediction import also_text

            row.append(also_text(p.extra.get("also")))
        t.add_row(*row)
    from autopar.cli.render import add_legend

    add_legend(t, [p.layout.short() for p in preds])
    return t


def print_search_result(res) -> None:
    from autopar.cli.render import breakdown_table, console
    from autopar.limits import markup_safe as ms

    con = console()
    from autopar.cli.render import print_assumptions
    from autopar.job import Job

    job, c, w = res.job, res.job["cluster"], res.job["workload"]
    tj = res.training_job
    tokens = w["seq_len"] * w["global_batch"]
    con.print(
        f"[bold]{ms(job['model'])}[/] on {c['num_devices']:,} x {ms(c['device'])} ({c['devices_per_node']} per node), "
        f"seq {w['seq_len']:,}, global batch {w['global_batch']:,} = {tokens:,} tokens/step"
        + (", LoRA (base weights frozen)" if w.get("lora") else "")
        + f", framework {job['framework']}"
    )
    print_assumptions(Job.model_validate(job).assumptions)
    if tj is not None:
        m = tj.model
        con.print(
            f"model: {m.total_params / 1e9:.1f} B parameters ({m.active_params / 1e9:.1f} B active), "
            f"{m.layers} layers; search space {ms(res.space)} ({res.space_fingerprint})"
        )
    con.print(
        f"{res.layouts_enumerated:,} legal layouts of {res.candidates_total:,} candidates scored in "
        f"{res.scoring_s:.2f} s ({res.layouts_per_s:,.0f} layouts/s, {res.backend}); "
        f"[bold]{res.layouts_feasible:,} fit[/]"
    )
    excl = sorted(res.infeasible_by_reason.items(), key=lambda kv: -kv[1])
    if excl:
        con.print("excluded: " + ", ".join(f"{k} {v:,}" for k, v in excl))
    if res.launch_note:
        con.print(res.launch_note, highlight=False)
    if res.not_launchable:
        con.print(
            f"{res.not_launchable:,} of the best fitting layouts left out: {res.launcher} refuses them",
            highlight=False,
        )
    names = res.objectives.names
    extra = (["energy J/token"] if "energy" in names else []) + (["$/M tokens"] if "cost" in names else [])
    title = f"top {len(res.results)} by {names[0]}"
    if "cost" in names:
        title += f" (at ${res.objectives.price_per_device_hour:g}/device-hour)"
    con.print(_ranked_table(title, res.results, res, extra))
    if len(names) > 1:
        shown = res.pareto[:20]
        more = f", first {len(shown)} shown" if res.pareto_size > len(shown) else ""
        con.print(
            _ranked_table(
                f"Pareto front of {', '.join(names)} ({res.pareto_size} layouts{more})", shown, res, extra
            )
        )
    win = res.results[0]
    con.print(
        f"\n[bold]winner:[/] {win.layout.short()}  (energy {win.energy_j_per_step / 1e3:,.1f} kJ/step, "
        f"avg {win.avg_power_w:.0f} W/device)"
    )
    con.print(breakdown_table("time per step", win.time_breakdown, win.step_time_s, _fmt_s))
    con.print(
        breakdown_table(
            "memory per device (GiB)", win.memory_breakdown, win.memory_gib_per_device, lambda x: f"{x:.2f}"
        )
    )
    con.print(f"[bold]why:[/] {ms(res.why())}")
