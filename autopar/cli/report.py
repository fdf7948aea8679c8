"""The ``--html`` report of each command: which results, plots and notes go on the page.

The page itself (escaping, CSS, atomic write) is :mod:`autopar.report`; the plots are
:mod:`autopar.plots`, drawn from the figures the engine computed (nothing is recomputed here).
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

from autopar.report import Report

TOP_PLOTTED = 5  # layouts drawn in the breakdown plots


def _command_line() -> str:
    return "autopar " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _export_snippet(record: dict[str, Any], fmt: str) -> str:
    from autopar.cli.export import render_record
    from autopar.errors import AutoparError

    try:
        return render_record(record, fmt)
    except AutoparError as exc:
        return f"# {fmt} cannot run this layout: {exc}"


def _assumptions_and_error(rep: Report, assumptions: list[str], expected: Any) -> None:
    rep.heading("Assumptions and expected error")
    items = list(assumptions)
    if expected is not None:
        items.insert(0, f"expected error of tokens/s: {expected.describe()}")
    else:
        items.insert(0, "expected error: no out-of-sample error figure covers this device and stack")
    rep.bullets(items)


def _expected_errors(jobs: list[dict[str, Any]]) -> list[str]:
    """The expected error of tokens/s that each distinct (device, calibration, stack, model) quotes."""
    from autopar.coefficients import expected_error, load_calibration
    from autopar.errors import AutoparError
    from autopar.model import load_model

    out: dict[tuple[Any, ...], str] = {}
    for job in jobs:
        dev = (job.get("cluster") or {}).get("device")
        key = (dev, job.get("calibration"), job.get("framework"), str(job.get("model")))
        if dev is None or key in out:
            continue
        try:  # the model's class (dense / MoE) picks the base figure; a job on record always loads
            model = load_model(job["model"]) if job.get("model") is not None else None
        except AutoparError:
            model = None
        e = expected_error(dev, load_calibration(job.get("calibration")), job.get("framework"), model=model)
        out[key] = f"expected error of tokens/s on {dev}: " + (
            e.describe() if e else "no out-of-sample error figure covers this device and stack"
        )
    return list(out.values())


# ------------------------------------------------------------------------------------ training
def search_report(res: Any, *, export_format: str | None = None, title: str = "recommend") -> Report:
    """recommend (and study show): the winner and why, the top-k, the front, both breakdowns."""
    from autopar import plots
    from autopar.job import FRAMEWORK_EXPORT_FORMAT, Job

    job, c, w = res.job, res.job["cluster"], res.job["workload"]
    win = res.results[0]
    rep = Report(
        f"autopar {title}: {job['model']} on {c['num_devices']:,} x {c['device']}",
        f"seq {w['seq_len']:,}, global batch {w['global_batch']:,} = {w['seq_len'] * w['global_batch']:,} "
        f"tokens/step, framework {job['framework']}"
        + (", LoRA (base weights frozen)" if w.get("lora") else "")
        + f"; {res.layouts_enumerated:,} legal layouts scored, {res.layouts_feasible:,} fit",
    )
    ob = res.objective_report(win)
    rep.winner(
        win.layout.short(),
        {
            "tokens/s per device": f"{win.tokens_per_s_per_device:,.0f}",
            "MFU": win.mfu_text(),
            "memory per device": f"{win.memory_gib_per_device:.1f} / {win.memory_capacity_gib:.0f} GiB",
            "step time": _fmt_s(win.step_time_s),
            "energy per token": f"{ob['energy_j_per_token']:.3f} J",
            "cost": f"${ob['cost_usd_per_million_tokens']:.3f} / M tokens",
        },
        res.why(),
    )
    names = list(res.objectives.names)
    rep.heading(f"Top {len(res.results)} by {names[0]}")
    cols, rows = res.table()
    rep.table(cols, rows, left=("layout", "also (same figures)"), highlight_first=True)
    rep.text(
        "A layout whose difference from a listed one changes no figure (time, memory and energy equal "
        "within 1e-9) is not repeated: its values are under 'also'.",
        "note",
    )
    excl = sorted(res.infeasible_by_reason.items(), key=lambda kv: -kv[1])
    if excl:
        rep.text("excluded: " + ", ".join(f"{k} {v:,}" for k, v in excl), "note")
    if getattr(res, "launch_note", ""):
        rep.text(res.launch_note, "note")

    def point(p: Any) -> dict[str, Any]:
        o = res.objective_report(p)
        return {
            "short": p.layout.short(),
            "tokens_per_s_per_device": p.tokens_per_s_per_device,
            "memory_gib_per_device": p.memory_gib_per_device,
            "energy_j_per_token": o["energy_j_per_token"],
            "cost_usd_per_million_tokens": o["cost_usd_per_million_tokens"],
        }

    front = res.pareto if res.pareto else res.results
    what = (
        f"Pareto front of {', '.join(names)} ({len(front)} of {res.pareto_size} layouts)"
        if res.pareto
        else f"top {len(front)} layouts"
    )
    rep.heading("Throughput against memory, energy and cost")
    rep.plot(
        plots.pareto(
            [point(p) for p in front],
            point(win),
            ("tokens_per_s_per_device", "tokens/s per device"),
            [
                ("memory_gib_per_device", "memory per device (GiB)"),
                ("energy_j_per_token", "energy per token (J)"),
                (
                    "cost_usd_per_million_tokens",
                    f"$ per M tokens (${res.objectives.price_per_device_hour:g}/h)",
                ),
            ],
            points_label=what,
        ),
        "the star is the chosen layout; energy and cost are those of the same layouts.",
    )
    top = res.results[:TOP_PLOTTED]
    labels = [f"#{i} {p.layout.short()}" for i, p in enumerate(top, 1)]
    rep.heading("Where the step time goes")
    rep.plot(
        plots.stacked_bars(
            list(zip(labels, [p.time_breakdown for p in top], strict=True)),
            xlabel="seconds per step",
            title="time per step (communication terms: exposed part + slowdown of the compute it overlaps)",
        )
    )
    rep.plot(
        plots.stacked_bars(
            [
                (
                    lab,
                    {
                        f"{k} {part}": max(0.0, v[part])
                        for part in ("exposed", "hidden")
                        for k, v in p.comm_breakdown.items()
                    },
                )
                for lab, p in zip(labels, top, strict=True)
            ],
            xlabel="seconds per step",
            title="each collective per step: exposed (solid), and hidden behind compute (light)",
            colors={
                f"{k} {part}": plots.PALETTE[j] + ("" if part == "exposed" else "59")
                for j, k in enumerate(("tp", "cp", "ep", "pp", "dp"))
                for part in ("exposed", "hidden")
            },
        ),
        "tp/cp/ep/pp/dp: tensor, context, expert, pipeline and data parallel communication.",
    )
    rep.heading("What fills memory")
    rep.plot(
        plots.stacked_bars(
            list(zip(labels, [p.memory_breakdown for p in top], strict=True)),
            xlabel="GiB per device (loaded pipeline stage)",
            title=f"memory per device (capacity {win.memory_capacity_gib:.0f} GiB, limit {win.memory_limit_gib:.1f} GiB)",
        )
    )
    _assumptions_and_error(rep, Job.model_validate(job).assumptions, win.expected_error)
    fmt = export_format or FRAMEWORK_EXPORT_FORMAT.get(job["framework"], "megatron")
    rep.code(_export_snippet(win.to_dict(), fmt), f"Launch it ({fmt})")
    rep.code(_command_line(), "Reproduce")
    return rep


# ------------------------------------------------------------------------------------- serving
def _serving_parts(r: dict[str, Any], key: str) -> dict[str, float]:
    d = r.get(key) or {}
    if not isinstance(d, dict):
        return {}
    skip = {"capacity", "kv_cache_available"}
    return {k: float(v) for k, v in d.items() if k not in skip and isinstance(v, int | float)}


def _serving_launch(res: Any) -> str:
    """The vLLM command of the best aggregated deployment, saying so when the winner is disaggregated."""
    from autopar.cli.export import records_of, serving_export_record
    from autopar.errors import AutoparError

    recs = records_of(res.to_dict(), "serve")
    i = next((k for k, r in enumerate(recs) if r.get("mode") == "aggregated"), None)
    if i is None:
        return "# every listed deployment is disaggregated (prefill and decode pools): no single launcher command runs one"
    head = (
        ""
        if i == 0
        else f"# the winner is disaggregated (two pools); the best aggregated deployment is #{i + 1}:\n"
    )
    try:
        return head + _export_snippet(serving_export_record(recs[i]), "vllm")
    except AutoparError as exc:  # a refusal is shown in the report, not raised
        return f"{head}# vllm cannot run this deployment: {exc}"


def serving_report(res: Any) -> Report:
    from autopar import plots

    w, job, c = res.workload, res.job, res.job["cluster"]
    best = res.best
    rep = Report(
        f"autopar serve: {job['model']} on {c['num_devices']} x {c['device']}",
        f"isl {w['isl']}, osl {w['osl']}; weights {w['weight_precision']}, KV {res.costing.get('kv_precision')}; "
        f"{res.layouts_enumerated} candidates, {res.layouts_feasible} feasible",
    )
    targets = [
        f"TTFT <= {w['ttft_ms']:g} ms" if w.get("ttft_ms") else "",
        f"TPOT <= {w['tpot_ms']:g} ms" if w.get("tpot_ms") else "",
    ]
    tgt = " and ".join(t for t in targets if t) or "no latency target"
    rep.winner(
        best["short"],
        {
            "output tok/s": f"{best['output_tokens_per_s']:,.0f} ({best['idle_devices']} devices idle)",
            "output tok/s per device": f"{best['output_tokens_per_s_per_device']:,.0f}",
            "output tok/s per user": f"{best['output_tokens_per_s_per_user']:,.1f}",
            "TTFT": f"{best['ttft_ms']:,.1f} ms",
            "TPOT": f"{best['tpot_ms']:,.2f} ms",
            "output tokens per joule": f"{best['output_tokens_per_joule']:.2f}",
        },
        f"first by {res.ranking} of the {res.layouts_feasible} layouts that meet {tgt}"
        + (
            f"; runner-up {res.results[1]['short']} at {res.results[1]['output_tokens_per_s']:,.0f} output tok/s"
            if len(res.results) > 1
            else ""
        )
        + ".",
    )
    rep.heading(f"Top {len(res.results)} serving layouts")
    cols, rows = res.table()
    rep.table(cols, rows, highlight_first=True)
    rep.heading("Throughput per device against speed per user")
    rep.plot(
        plots.pareto(
            res.pareto or res.results,
            best,
            ("output_tokens_per_s_per_device", "output tokens/s per device"),
            [
                ("output_tokens_per_s_per_user", "output tokens/s per user"),
                ("output_tokens_per_joule", "output tokens per joule"),
            ],
        ),
        f"Pareto front of tokens/s per device and per user ({len(res.pareto)} points); the star is the chosen layout.",
    )
    info = getattr(res, "pareto_info", None) or {}
    if res.pareto:
        p = res.workload.get("percentile")
        cols = ["", "layout", "tok/s/user", "tok/s/device", "TTFT ms", "TPOT ms"]
        cols += [f"TTFT p{p} ms", f"TPOT p{p} ms"] if p else []
        rows = [
            [
                "chosen" if r.get("chosen") else "",
                r["short"],
                f"{r['output_tokens_per_s_per_user']:,.1f}",
                f"{r['output_tokens_per_s_per_device']:,.0f}",
                f"{r['ttft_ms']:,.1f}",
                f"{r['tpot_ms']:,.2f}",
                *([f"{r.get(f'ttft_ms_p{p}', 0):,.1f}", f"{r.get(f'tpot_ms_p{p}', 0):,.2f}"] if p else []),
            ]
            for r in sorted(res.pareto, key=lambda r: r["output_tokens_per_s_per_user"])
        ]
        where = (
            "the chosen layout is on the front (marked)"
            if info.get("chosen_on_front")
            else "the chosen layout is not on the front: it delivers the most on the whole cluster, "
            "while a layout on fewer devices beats it per device and per user"
        )
        rep.text(
            f"The front: output tokens/s per user (1/TPOT) against output tokens/s per device over the "
            f"{info.get('candidates', len(res.pareto))} candidates that meet the targets "
            f"({info.get('front_size', len(res.pareto))} on the front, {len(res.pareto)} listed); {where}.",
            "note",
        )
        rep.table(cols, rows)
    # only deployments with a breakdown get a bar (a disaggregated one has two pools and none)
    ranked = list(enumerate(res.results[:TOP_PLOTTED], 1))
    for key, xlabel, title in (
        ("time_ms_per_iteration", "ms per decode iteration", "time per iteration"),
        ("memory_gib_per_device", "GiB per device", "memory per device"),
    ):
        bars = [(f"#{i} {r['short']}", _serving_parts(r, key)) for i, r in ranked]
        if any(parts for _, parts in bars):
            if title == "time per iteration":
                rep.heading("Where an iteration's time goes and what fills memory")
            rep.plot(plots.stacked_bars([b for b in bars if b[1]], xlabel=xlabel, title=title))
    without = [f"#{i}" for i, r in ranked if not _serving_parts(r, "time_ms_per_iteration")]
    if without:
        rep.text(
            f"{', '.join(without)}: disaggregated prefill/decode deployments (two pools), drawn without a "
            "per-iteration breakdown; their TTFT, TPOT and memory are in the table above.",
            "note",
        )
    rep.code(_serving_launch(res), "Launch it (vLLM)")
    rep.bullets(
        [f"coefficients: {res.costing.get('coefficients', 'default')}", *res.notes],
        "Assumptions and expected error",
    )
    ee = res.costing.get("expected_error")
    rep.text(
        f"expected error of output tokens/s: {ee['text']}"
        if ee
        else "expected error of output tokens/s: not quoted (no held-out serving runs describe this calibration).",
        "note",
    )
    rep.code(_command_line(), "Reproduce")
    return rep


# ------------------------------------------------------------------------------------- compare
def compare_report(res: Any) -> Report:
    from autopar import plots

    unit = "output tok" if res.workload == "serving" else "tok"
    rep = Report(
        f"autopar compare ({res.workload}): {', '.join(res.devices)}",
        f"winner of each cell by {res.metric}",
    )
    ok = [c for c in res.cells if c["feasible"]]
    wins = [c for c in res.cells if c.get("winner")]
    if wins:
        w0 = wins[0]
        kpis = {
            f"{unit}/s per device": f"{w0['tokens_per_s_per_device']:,.0f}",
            f"{unit} per joule": f"{w0['tokens_per_joule']:.2f}",
        }
        if w0.get("mfu") is not None:
            kpis["MFU"] = f"{w0['mfu']:.1%} ({w0['mfu_basis']})"
        if w0.get("cost_per_mtok") is not None:
            kpis["$/M tokens"] = f"{w0['cost_per_mtok']:.3f}"
        rep.winner(
            f"{w0['device']}: {w0['layout']}",
            kpis,
            "; ".join(res.changes) if res.changes else f"{w0['device']} wins every cell by {res.metric}.",
        )
    rep.heading("Best layout per device")
    cols, rows = res.table()
    rep.table(cols, rows, left=("model", "device", "layout"))
    cats = list(dict.fromkeys(f"{c['model']} s{c['seq_len']} b{c['batch'] or 'max'}" for c in res.cells))

    def series(key: str) -> dict[str, list[float | None]]:
        out: dict[str, list[float | None]] = {}
        for d in res.devices:
            vals: list[float | None] = []
            for cat in cats:
                hit = [
                    c
                    for c in ok
                    if c["device"] == d and f"{c['model']} s{c['seq_len']} b{c['batch'] or 'max'}" == cat
                ]
                vals.append(hit[0].get(key) if hit else None)
            out[d] = vals
        return out

    rep.heading("Per device")
    rep.plot(
        plots.pareto(
            [dict(c, short=f"{c['device']} {c['layout']}") for c in ok],
            dict(wins[0], short=f"{wins[0]['device']} {wins[0]['layout']}") if wins else {},
            ("tokens_per_s_per_device", f"{unit}/s per device"),
            [("tokens_per_joule", f"{unit} per joule")]
            + (
                [("cost_per_mtok", "$ per M tokens")]
                if any(c.get("cost_per_mtok") is not None for c in ok)
                else []
            ),
            points_label="best layout of each device and cell",
            connect=False,
        ),
        "the star is the first cell's winner",
    )
    rep.plot(
        plots.grouped_bars(
            cats,
            series("tokens_per_s_per_device"),
            ylabel=f"{unit}/s per device",
            title="throughput per device",
        ),
        "a missing bar: nothing fits on that device",
    )
    rep.plot(
        plots.grouped_bars(
            cats, series("tokens_per_joule"), ylabel=f"{unit} per joule", title="energy efficiency"
        )
    )
    if any(c.get("cost_per_mtok") is not None for c in ok):
        rep.plot(plots.grouped_bars(cats, series("cost_per_mtok"), ylabel="$ per M tokens", title="cost"))
    win_cells = [c for c in ok if c.get("winner")][:TOP_PLOTTED] or ok[:TOP_PLOTTED]
    best = {c["device"]: c for c in reversed(ok)}  # each device's first cell
    shown = list(best.values())[:TOP_PLOTTED] if len(win_cells) < 2 else win_cells
    labels = [f"{c['device']} {c['layout']}" for c in shown]
    rep.heading("Where the time goes and what fills memory (each device's best layout)")
    if res.workload == "training":
        tparts = [c.get("time_breakdown") or {} for c in shown]
        mparts = [c.get("memory_breakdown") or {} for c in shown]
        tx = "seconds per step"
    else:
        tparts = [_serving_parts(c, "time_ms_per_iteration") for c in shown]
        mparts = [_serving_parts(c, "memory_gib_per_device") for c in shown]
        tx = "ms per decode iteration"
    rep.plot(plots.stacked_bars(list(zip(labels, tparts, strict=True)), xlabel=tx, title="time"))
    rep.plot(
        plots.stacked_bars(
            list(zip(labels, mparts, strict=True)), xlabel="GiB per device", title="memory per device"
        )
    )
    recs = [c["record"] for c in ok if isinstance(c.get("record"), dict)]
    if res.workload == "training":
        rep.bullets(_expected_errors([r["job"] for r in recs]), "Expected error")
    else:
        rep.bullets(
            ["serving predictions carry no out-of-sample error figure yet (none was measured)."],
            "Expected error",
        )
    if wins and isinstance(wins[0].get("record"), dict):
        from autopar.cli.export import records_of, serving_export_record
        from autopar.errors import AutoparError

        rec = records_of({"cells": [wins[0]]}, "compare")[0]
        fmt = "vllm" if res.workload == "serving" else "megatron"
        try:
            rec = serving_export_record(rec) if res.workload == "serving" else rec
            snippet = _export_snippet(rec, fmt)
        except AutoparError as exc:  # a refusal is shown in the report, not raised
            snippet = f"# {fmt} cannot run this layout: {exc}"
        rep.code(snippet, f"Launch the first winner ({fmt})")
    rep.code(_command_line(), "Reproduce")
    return rep


# --------------------------------------------------------------------------------------- sweep
def sweep_report(sw: Any, rows: list[dict[str, Any]]) -> Report:
    """The winner of every point, and how throughput scales with the device count."""
    from autopar import plots
    from autopar.job import FRAMEWORK_EXPORT_FORMAT

    ok = [r for r in rows if r["status"] == "ok"]
    rep = Report(
        f"autopar sweep {sw.name}: {len(rows)} points",
        f"{len(ok)} ok, {len(rows) - len(ok)} without a fitting layout or in error; objective {sw.objective}"
        + (f"; {sw.description}" if sw.description else ""),
    )
    if ok:
        b = max(ok, key=lambda r: r["mfu"])
        rep.winner(
            f"{b['model']} on {b['num_devices']} x {b['device']}: {b['layout']}",
            {
                "tokens/s per device": f"{b['tokens_per_s_per_device']:,.0f}",
                "MFU": f"{b['mfu']:.1%} ({b['mfu_basis']})",
                "memory per device": f"{b['memory_gib_per_device']:.1f} GiB",
            },
            f"the highest MFU of the sweep (seq {b['seq_len']:,}, global batch {b['global_batch']:,}).",
        )
    rep.heading("Best layout per point")
    cols = ["model", "device", "devices", "seq", "batch", "layout", "tokens/s/device", "MFU", "memory"]
    table = []
    for r in rows:
        head = [r["model"], r["device"], r["num_devices"], r["seq_len"], r["global_batch"]]
        if r["status"] == "ok":
            table.append(
                head
                + [
                    r["layout"],
                    f"{r['tokens_per_s_per_device']:,.0f}",
                    f"{r['mfu']:.1%} ({r['mfu_basis'].split()[0]} peak)",
                    f"{r['memory_gib_per_device']:.1f} GiB",
                ]
            )
        else:
            table.append(head + [f"{r['status']}: {r['message'] or ''}", "-", "-", "-"])
    rep.table(cols, table, left=("model", "device", "layout"))
    series: dict[str, list[tuple[float, float]]] = {}
    mfu: dict[str, list[tuple[float, float]]] = {}
    for r in ok:
        name = f"{r['model']} {r['device']} s{r['seq_len']} b{r['global_batch']}"
        series.setdefault(name, []).append((r["num_devices"], r["tokens_per_s_per_device"]))
        mfu.setdefault(name, []).append((r["num_devices"], 100 * r["mfu"]))
    rep.heading("Scaling with the number of devices")
    for data, ylabel in ((series, "tokens/s per device"), (mfu, "MFU (%)")):
        rep.plot(
            plots.lines(
                {k: sorted(v) for k, v in data.items()},
                xlabel="devices",
                ylabel=ylabel,
                title=f"{ylabel} of each point's best layout",
                logx=True,
            )
        )
    rep.bullets(_expected_errors([r["job"] for r in ok if isinstance(r.get("job"), dict)]), "Expected error")
    if ok and isinstance(ok[0].get("job"), dict):
        b = max(ok, key=lambda r: r["mfu"])
        fmt = FRAMEWORK_EXPORT_FORMAT.get(b["job"].get("framework", "megatron"), "megatron")
        rep.code(_export_snippet(b, fmt), f"Launch the highest-MFU point ({fmt})")
    rep.code(_command_line(), "Reproduce")
    return rep


# ------------------------------------------------------------------------------------ validate
def validate_report(out: dict[str, Any]) -> Report:
    """Measured against predicted step time and peak memory (``validate --json``'s content)."""
    from autopar import plots

    job = out.get("job") or {}
    c = job.get("cluster") or {}
    s = out.get("summary") or {}
    recs = out.get("records") or []
    ok = [r for r in recs if r.get("status") == "ok" and r.get("measured_step_time_s")]
    rep = Report(
        f"autopar validate: {job.get('model')} on {c.get('num_devices')} x {c.get('device')}",
        f"{len(recs)} layouts run, {len(ok)} measured; calibration {out.get('calibration', 'default')}",
    )
    if ok:
        rep.winner(
            str(s.get("measured_best")),
            {
                "step-time MAPE": f"{s['step_time_mape']:.1%}",
                "Spearman (rank)": f"{s['spearman']:.3f}",
                "top-1 regret": f"{s['top1_regret']:.3f}",
                **({"memory MAPE": f"{s['memory_mape']:.1%}"} if "memory_mape" in s else {}),
            },
            f"the fastest measured layout; the prediction ranked {s.get('predicted_best')} first "
            f"(top-1 regret {s['top1_regret']:.3f}: its measured time over the fastest).",
        )
        rep.heading("Measured against predicted")
        rep.plot(
            plots.parity(
                [r["measured_step_time_s"] for r in ok],
                [r["predicted_step_time_s"] for r in ok],
                unit="s per step",
                title="step time",
                band=0.2,
            )
        )
        mem = [r for r in ok if r.get("measured_peak_memory_gib") and r.get("predicted_peak_memory_gib")]
        if mem:
            rep.plot(
                plots.parity(
                    [r["measured_peak_memory_gib"] for r in mem],
                    [r["predicted_peak_memory_gib"] for r in mem],
                    unit="GiB peak per rank",
                    title="peak memory",
                    band=0.2,
                )
            )
    rep.heading("Runs")
    cols = ["layout", "status", "predicted step", "measured step", "error", "predicted GiB", "measured GiB"]

    def g(x: Any, f: str) -> str:
        return "-" if x is None else format(x, f)

    rows = []
    for r in recs:
        p, m = r.get("predicted_step_time_s"), r.get("measured_step_time_s")
        rows.append(
            [
                r.get("layout_short"),
                r.get("status")
                if r.get("status") == "ok"
                else f"{r.get('status')}: {r.get('error') or ''}"[:80],
                g(p, ".4f"),
                g(m, ".4f"),
                "-" if not (p and m) else f"{p / m - 1:+.1%}",
                g(r.get("predicted_peak_memory_gib"), ".3f"),
                g(r.get("measured_peak_memory_gib"), ".3f"),
            ]
        )
    rep.table(cols, rows, left=("layout", "status"))
    rep.text(
        "These errors are in-sample for the calibration the runs were predicted with if it was fitted to "
        "them (--refit); on a fresh calibration they are out-of-sample.",
        "note",
    )
    rep.code(_command_line(), "Reproduce")
    return rep


# --------------------------------------------------------------------------------------- study
def study_report(rep_: Any) -> Report:
    """The best trials of a study and how the search progressed, trial by trial."""
    from autopar import plots
    from autopar.job import FRAMEWORK_EXPORT_FORMAT, Job

    job = rep_.attrs.get("job") or {}
    c = job.get("cluster") or {}
    rep = Report(
        f"autopar study {rep_.name}: {job.get('model')} on {c.get('num_devices')} x {c.get('device')}",
        f"space {rep_.attrs.get('space')}, objectives {', '.join(rep_.objectives)}; sampler {rep_.sampler} "
        f"seed {rep_.seed}; {rep_.n_complete} complete trials, {rep_.n_failed} failed",
    )
    if rep_.best:
        b = rep_.best[0]
        rep.winner(
            str(b["layout"]),
            {
                "tokens/s per device": f"{b.get('tokens_per_s_per_device') or 0:,.0f}",
                "memory per device": f"{b.get('memory_gib_per_device') or 0:.1f} GiB",
                "step time": _fmt_s(b.get("step_time_s") or 0.0),
            },
            f"the best feasible trial (#{b['trial']}) of {rep_.n_complete} by {rep_.objectives[0]}.",
        )
    rep.heading("Best feasible trials")
    rep.table(
        ["#", "trial", "layout", "tokens/s/device", "memory", "step time"],
        [
            [
                i,
                b["trial"],
                b["layout"],
                f"{b.get('tokens_per_s_per_device') or 0:,.0f}",
                f"{b.get('memory_gib_per_device') or 0:.1f} GiB",
                _fmt_s(b.get("step_time_s") or 0.0),
            ]
            for i, b in enumerate(rep_.best, 1)
        ],
        highlight_first=True,
    )
    hist = [h for h in rep_.history if h.get("tokens_per_s_per_device") is not None]
    if hist:
        fits = [(h["trial"], h["tokens_per_s_per_device"]) for h in hist if h["fits"]]
        over = [(h["trial"], h["tokens_per_s_per_device"]) for h in hist if not h["fits"]]
        best_so_far: list[tuple[float, float]] = []
        top = 0.0
        for t, v in fits:
            top = max(top, v)
            best_so_far.append((t, top))
        rep.heading("History")
        rep.plot(
            plots.lines(
                {"trial (fits)": fits, "trial (out of memory)": over, "best feasible so far": best_so_far},
                xlabel="trial number",
                ylabel="tokens/s per device",
                title="study history",
                style={"trial (fits)": ".", "trial (out of memory)": "x", "best feasible so far": "-"},
            )
        )
        feas = [dict(h, short="") for h in hist if h["fits"]]
        if rep_.best:
            rep.plot(
                plots.pareto(
                    feas,
                    {
                        "short": rep_.best[0]["layout"],
                        "tokens_per_s_per_device": rep_.best[0].get("tokens_per_s_per_device"),
                        "memory_gib_per_device": rep_.best[0].get("memory_gib_per_device"),
                    },
                    ("tokens_per_s_per_device", "tokens/s per device"),
                    [("memory_gib_per_device", "memory per device (GiB)")],
                    points_label="feasible trials",
                    connect=False,
                ),
                "every feasible trial; the star is the best.",
            )
    if job:
        try:
            assumptions = Job.model_validate(job).assumptions
        except ValueError:  # a study written by another version: its job may not validate here
            assumptions = []
        rep.bullets(assumptions or ["none beyond the job above"], "Assumptions")
    if rep_.best and job:
        fmt = FRAMEWORK_EXPORT_FORMAT.get(job.get("framework", "megatron"), "megatron")
        rep.code(_export_snippet({**rep_.best[0], "job": job}, fmt), f"Launch it ({fmt})")
    rep.code(_command_line(), "Reproduce")
    return rep
