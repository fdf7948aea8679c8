"""``autopar study run|show|list``: persistent, resumable Optuna studies over a search space."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autopar.limits import terminal_safe

STORAGE_HELP = "journal file, *.db (SQLite) or Optuna storage URL (default: autopar-studies.log)"


def register(sub: Any) -> dict[str, Any]:
    from autopar.cli.args import (
        MAX_SEED,
        MAX_TOP,
        Parser,
        add_job_args,
        int_range,
        positive_float,
        positive_int,
    )
    from autopar.cli.recommend import add_search_args

    p = sub.add_parser(
        "study",
        help="persistent Optuna studies: run (create or resume), show, list",
        description="Named, persistent, resumable Optuna studies over a search space "
        "(default storage: ./autopar-studies.log, a journal file optuna-dashboard opens).",
    )
    ss = p.add_subparsers(dest="study_command", required=True, parser_class=Parser)

    r = ss.add_parser("run", help="create the study or resume it until it has --n-trials trials in total")
    r.add_argument("--name", required=True, help="study name (re-running the same command resumes it)")
    add_job_args(r)
    add_search_args(r)
    r.add_argument(
        "--objective",
        default="throughput",
        help="throughput (default), memory, energy, cost; several separated by commas = multi-objective",
    )
    r.add_argument(
        "--sampler",
        default=None,
        choices=["tpe", "nsga2", "random", "gp", "bruteforce"],
        help="Optuna sampler for a new study (default: tpe); a resumed study keeps its recorded one",
    )
    r.add_argument(
        "--seed",
        type=int_range(0, MAX_SEED),
        default=None,
        help=f"sampler seed for a new study, 0..{MAX_SEED} (default: 0; recorded)",
    )
    r.add_argument(
        "--n-trials",
        type=positive_int,
        default=200,
        help="finished trials (complete, pruned or failed) the study should have in total, across every "
        "process running it",
    )
    r.add_argument(
        "--timeout", type=positive_float, default=None, help="stop this session after this many seconds (> 0)"
    )
    r.add_argument(
        "--batch", type=int_range(1, MAX_TOP), default=8, help="trials asked and scored together (default: 8)"
    )
    r.add_argument(
        "--seed-top-k",
        type=int_range(0, 1000),
        default=10,
        help="enqueue the exhaustive top-k of the enumerable sub-space as first trials (0: off)",
    )
    r.add_argument(
        "--no-structured-seeds",
        action="store_true",
        help="uneven spaces: do not also enqueue the balanced split of each seed's base layout",
    )
    r.add_argument(
        "--storage",
        default=None,
        help="journal file path (default: autopar-studies.log), *.db for SQLite, or an Optuna storage URL",
    )
    r.add_argument(
        "--heartbeat-interval",
        type=int_range(0, 3600),
        default=10,
        metavar="S",
        help="database-server storages: each worker records that its running trials are alive every S "
        "seconds (default: 10; 0: off); a trial whose worker stopped is failed and retried",
    )
    r.add_argument(
        "--grace-period",
        type=int_range(1, 86400),
        default=None,
        metavar="S",
        help="database-server storages: seconds without a heartbeat after which a running trial is "
        "failed and retried (default: twice --heartbeat-interval)",
    )
    r.add_argument("--top", type=int_range(1, MAX_TOP), default=5, help="how many best trials to report")
    r.add_argument("--verbose", action="store_true", help="print every finished trial")
    r.add_argument(
        "--json", action="store_true", help="machine-readable output (schema_version, job, trials)"
    )

    s = ss.add_parser("show", help="the best feasible trials of a study")
    s.add_argument("--name", required=True, help="study name")
    s.add_argument("--storage", default=None, help=STORAGE_HELP)
    s.add_argument("--top", type=int_range(1, MAX_TOP), default=5, help="how many best trials to show")
    s.add_argument(
        "--json", action="store_true", help="machine-readable output (schema_version, job, trials)"
    )
    from autopar.cli.recommend import add_html_arg

    add_html_arg(s)

    li = ss.add_parser("list", help="studies in a storage")
    li.add_argument("--storage", default=None, help=STORAGE_HELP)
    li.add_argument("--json", action="store_true", help="machine-readable output")
    return {"study": cmd_study}


def cmd_study(a: argparse.Namespace) -> int:
    if a.study_command == "run":
        return _run(a)
    if a.study_command == "show":
        from autopar.report import check_html_path
        from autopar.search.study import load_report

        check_html_path(a.html)
        rep = load_report(a.name, a.storage, top=a.top)
        _emit(rep, a.json)
        if a.html:
            from autopar.cli.report import study_report

            study_report(rep).write(a.html)
            if not a.json:
                print(f"wrote {terminal_safe(a.html)}")
        return 0
    from autopar.search.study import list_studies

    rows = list_studies(a.storage)
    if a.json:
        sys.stdout.write(json.dumps(rows, indent=2, default=str) + "\n")
    else:
        if not rows:
            print("no studies")
        for r in rows:
            line = (
                f"{r['name']}: {r['trials']} trials, {r.get('sampler')} seed {r.get('seed')}, "
                f"objectives {','.join(r.get('objectives') or [])}, space {r.get('space')}, "
                f"{job_line(r.get('job'))}"
            )
            print(terminal_safe(line))  # names read from a storage file: no raw control characters
    return 0


def job_line(job: Any) -> str:
    """The words "MODEL on N x DEVICE" for a study's recorded job (a Job dump: ``cluster`` holds the devices;
    an older flat record has them at the top level); what is not recorded reads "?"."""
    j: dict[str, Any] = job if isinstance(job, dict) else {}
    cluster = j.get("cluster")
    c: dict[str, Any] = cluster if isinstance(cluster, dict) else j
    model = j.get("model")
    if isinstance(model, dict):  # raw dimensions: their name, if any
        model = model.get("name")
    n, dev = c.get("num_devices"), c.get("device")
    return f"{model or '?'} on {n if n is not None else '?'} x {dev or '?'}"


def _run(a: argparse.Namespace) -> int:
    from autopar.cli.args import job_from_args
    from autopar.cli.recommend import price
    from autopar.files import check_study_name
    from autopar.search.recommend import Objectives
    from autopar.search.space import load_space
    from autopar.search.study import Heartbeat, StudyConfig, check_storage, run_study

    check_study_name(a.name)
    check_storage(a.storage)  # a bad storage is refused before the job and space are built
    heartbeat = Heartbeat(interval=a.heartbeat_interval, grace_period=a.grace_period)
    objectives = Objectives.parse(a.objective, price_per_device_hour=price(a), price_per_kwh=a.price_per_kwh)
    space = load_space(a.space, tuple(a.overrides))
    job = job_from_args(a).resolve()
    # The study searches only what the job's framework can launch, as recommend does
    # (autopar.search.recommend.launch_check): its trials export as they were scored.
    from autopar.search.recommend import launch_check
    from autopar.search.space import restrict_axes

    fmt = job.job.export_format
    limits, _ = launch_check(job, fmt)
    space, cut = restrict_axes(space, limits, f"--framework {job.job.framework} ({fmt} export)")
    if cut:
        print(terminal_safe(cut), file=sys.stderr)
    cfg = StudyConfig(
        name=a.name,
        job=job,
        space=space,
        objectives=objectives,
        sampler=a.sampler,
        seed=a.seed,
        storage=a.storage,
        calibration=a.calibration,
        seed_top_k=a.seed_top_k,
        batch=a.batch,
        structured_seeds=not a.no_structured_seeds,
        heartbeat=heartbeat,
        ray=a.ray,
    )
    started = False
    if a.ray is not None:
        from autopar.search.ray_backend import connect

        started = connect(a.ray)  # an unreachable address is refused before the study is opened

    from autopar.progress import Bar

    bar = Bar(a.n_trials, f"study {a.name}: trials", enabled=not a.verbose)
    best = [0.0]

    def on_trial(number: int, cand: Any, r: dict[str, Any], cached: bool) -> None:
        if r["fits"]:
            best[0] = max(best[0], r["tokens_per_s_per_device"])
        bar.advance(1, f"best {best[0]:,.0f} tokens/s/device" if best[0] else "nothing fits yet")
        if a.verbose:
            fits = "fits" if r["fits"] else "does not fit"
            print(
                f"trial {number} done: {cand.short()} -> {r['tokens_per_s_per_device']:,.1f} tokens/s/device, "
                f"{r['memory_gib_per_device']:.1f} GiB ({fits})",
                flush=True,
            )

    try:
        rep = run_study(cfg, n_trials=a.n_trials, timeout=a.timeout, on_trial=on_trial)
    finally:
        bar.close()
        if started:
            from autopar.search.ray_backend import shutdown

            shutdown()
    _emit(rep, a.json)
    return 0


def _emit(rep: Any, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(rep.to_dict(), indent=2, default=str) + "\n")
        return
    from rich.table import Table

    from autopar.cli.render import console
    from autopar.limits import markup_safe as ms

    con = console()
    con.print(
        f"[bold]study {ms(rep.name)}[/]: {ms(job_line(rep.attrs.get('job')))}, "
        f"space {ms(rep.attrs.get('space'))}, objectives {', '.join(rep.objectives)}; sampler {rep.sampler} "
        f"seed {rep.seed} (optuna {rep.attrs.get('optuna_version')})"
    )
    con.print(
        f"{rep.n_complete} complete trials ({rep.new_trials} new this session{', resumed' if rep.resumed else ''}; "
        f"{rep.n_cached} answered from the cache, {rep.n_repaired} repaired to the nearest legal layout), "
        f"{rep.n_failed} failed, {rep.n_running} running"
    )
    if not rep.best:
        con.print("[red]no feasible trial yet[/]")
        return
    t = Table(title="best feasible trials" if len(rep.objectives) == 1 else "Pareto front (feasible trials)")
    t.add_column("#", justify="right")
    t.add_column("trial", justify="right")
    t.add_column("tokens/s/device", justify="right", no_wrap=True)
    t.add_column("memory", justify="right", no_wrap=True)
    t.add_column("step time", justify="right", no_wrap=True)
    t.add_column("layout | per-stage layers+recompute", overflow="fold", ratio=1)
    for i, b in enumerate(rep.best, 1):
        st = b.get("step_time_s") or 0.0
        t.add_row(
            str(i),
            str(b["trial"]),
            f"{b.get('tokens_per_s_per_device') or 0:,.1f}",
            f"{b.get('memory_gib_per_device') or 0:.1f} GiB",
            f"{st:.3f} s",
            ms(b["layout"]),
        )
    from autopar.cli.render import add_legend

    add_legend(t, [str(b["layout"]) for b in rep.best])
    con.print(t)
