"""``autopar sweep FILE``: recommend over a grid of jobs, one table out (CSV, or Parquet with pyarrow)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from autopar.limits import markup_safe as ms
from autopar.limits import terminal_safe


def register(sub: Any) -> dict[str, Any]:
    p = sub.add_parser(
        "sweep",
        help="recommend over models x devices x device counts x sequence lengths x batches",
        description="Run `recommend` for every combination in a sweep file (see "
        "studies/sweeps/example.yaml) and write one table.",
    )
    p.add_argument("file", help="sweep YAML file")
    p.add_argument(
        "--out",
        default=None,
        help="output table: .csv or .parquet (default: sweep-<name>.parquet if pyarrow is installed, "
        "else sweep-<name>.csv)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="run each point as a Ray task: embedded local Ray (no value) or a cluster ADDRESS",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output: every point's row")
    from autopar.cli.recommend import add_html_arg

    add_html_arg(p)
    return {"sweep": cmd_sweep}


def cmd_sweep(a: argparse.Namespace) -> int:
    from autopar.search.sweep import check_table_path, default_output, load_sweep, run_sweep, write_table

    sw = load_sweep(a.file)
    out = a.out or default_output(sw)
    check_table_path(out)  # before the sweep runs
    from autopar.report import check_html_path

    check_html_path(a.html)
    started = False
    if a.ray is not None:
        from autopar.search.ray_backend import connect

        started = connect(a.ray)
    t0 = time.perf_counter()
    from autopar.progress import Bar

    bar = Bar(len(sw.points()), "sweep points")

    def on_point(i: int, row: Any) -> None:
        bar.advance(1, f"{row['model']} {row['num_devices']} x {row['device']}: {row['status']}")

    try:
        rows = run_sweep(sw, ray=a.ray, on_point=on_point)
    finally:
        bar.close()
        if started:
            from autopar.search.ray_backend import shutdown

            shutdown()
    path = write_table(rows, out)
    if a.html:
        from autopar.cli.report import sweep_report

        sweep_report(sw, rows).write(a.html)
    if a.json:
        import json
        import sys

        from autopar.job import SCHEMA_VERSION

        doc = {"schema_version": SCHEMA_VERSION, "sweep": sw.name, "table": str(path), "rows": rows}
        sys.stdout.write(json.dumps(doc, indent=2, default=float) + "\n")
        return 0
    print_summary(sw, rows, path, time.perf_counter() - t0, "ray" if a.ray is not None else "in-process")
    if a.html:
        print(f"wrote {terminal_safe(a.html)}")
    return 0


def print_summary(sw: Any, rows: list[dict[str, Any]], path: Any, elapsed: float, backend: str) -> None:
    from rich.table import Table

    from autopar.cli.render import console

    con = console()
    ok = [r for r in rows if r["status"] == "ok"]
    infeasible = [r for r in rows if r["status"] == "infeasible"]
    errors = [r for r in rows if r["status"] == "error"]
    scored = sum(r["layouts_enumerated"] or 0 for r in ok)
    con.print(
        f"[bold]sweep {ms(sw.name)}[/]: {len(rows)} points ({len(ok)} ok, {len(infeasible)} nothing fits, "
        f"{len(errors)} errors), {scored:,} layouts scored in {elapsed:.1f} s ({backend}); wrote {ms(path)}"
    )
    t = Table(title=f"best layout per point (objective {sw.objective})")
    for c in ("model", "device", "devices", "seq", "batch", "layout", "tokens/s/device", "MFU", "memory"):
        t.add_column(
            c,
            justify="right" if c not in ("model", "device", "layout") else "left",
            no_wrap=c == "layout",
            overflow="ellipsis",
        )
    for r in rows:
        if r["status"] == "ok":
            t.add_row(
                ms(r["model"]),
                ms(r["device"]),
                str(r["num_devices"]),
                str(r["seq_len"]),
                str(r["global_batch"]),
                r["layout"],
                f"{r['tokens_per_s_per_device']:,.0f}",
                f"{r['mfu']:.1%} ({r['mfu_basis'].split()[0]} peak)",
                f"{r['memory_gib_per_device']:.1f} GiB",
            )
        else:
            t.add_row(
                ms(r["model"]),
                ms(r["device"]),
                str(r["num_devices"]),
                str(r["seq_len"]),
                str(r["global_batch"]),
                f"[red]{r['status']}[/]: {ms((r['message'] or '')[:60])}",
                "-",
                "-",
                "-",
            )
    from autopar.cli.render import add_legend

    add_legend(t, [str(r["layout"]) for r in rows if r["status"] == "ok"])
    con.print(t)
    best: dict[str, dict[str, Any]] = {}
    for r in ok:
        if r["model"] not in best or r["mfu"] > best[r["model"]]["mfu"]:
            best[r["model"]] = r
    for m, r in best.items():
        con.print(
            f"highest MFU for {ms(m)}: {r['mfu']:.1%} ({r['mfu_basis']}) on {r['num_devices']} x {ms(r['device'])} "
            f"(seq {r['seq_len']}, batch {r['global_batch']}): {r['layout']}"
        )
