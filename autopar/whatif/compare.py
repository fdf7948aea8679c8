"""Device comparison: the best layout per device for a serving or training workload, and where the
winner changes across batch size, sequence length and model size.

``compare(...)`` (also ``autopar compare``) runs the serving search (:func:`autopar.serving.search.serve`)
or the training search (:func:`autopar.search.recommend`, its default space) on each device profile for every cell of a
grid (models x sequence lengths x batch sizes) and ranks the devices by one metric: output (or
training) tokens/s per device, tokens per joule, or cost per million tokens. ``write_outputs``
writes the grid as CSV and a small dependency-free SVG plot (one panel per model and sequence
length; the metric against the batch, one line per device).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autopar.errors import AutoparError, InfeasibleError
from autopar.limits import MAX_COMPARE_CELLS
from autopar.objectives import SERVING, cost_per_mtok

__all__ = ["compare", "CompareResult", "METRICS", "write_outputs"]

# compare's metrics: the serving objectives of ``autopar.objectives`` (training cells report the
# same keys) -> (record key, larger is better).
_BY_METRIC = {"tokens_per_s_per_device": "throughput", "tokens_per_joule": "energy", "cost_per_mtok": "cost"}
METRICS: dict[str, tuple[str, bool]] = {
    m: (m, SERVING[o].direction == "maximize") for m, o in _BY_METRIC.items()
}


@dataclass
class CompareResult:
    """One row per (model, seq_len, batch, device) cell with that device's best layout."""

    workload: str
    metric: str
    devices: list[str]
    cells: list[dict[str, Any]]
    winners: list[dict[str, Any]]
    changes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # one line: the full record is to_dict()
        wins = sorted({w["winner"] for w in self.winners if w.get("winner")})
        return (
            f"CompareResult({self.workload}, {len(self.devices)} devices, {len(self.cells)} cells, "
            f"winner by {self.metric}: {', '.join(wins) or 'none'})"
        )

    def table(self) -> tuple[list[str], list[list[Any]]]:
        """Every cell (columns, formatted rows), as the HTML report and notebooks show it."""
        unit = "output tok" if self.workload == "serving" else "tok"
        cols = [
            "model",
            "seq",
            "batch",
            "device",
            "layout",
            f"{unit}/s/device",
            f"{unit}/J",
            "$/Mtok",
            "MFU",
            "",
        ]
        rows: list[list[Any]] = []
        for c in self.cells:
            head = [c["model"], c["seq_len"], c["batch"] or "max", c["device"]]
            if not c["feasible"]:
                rows.append(head + ["infeasible", "-", "-", "-", "-", ""])
                continue
            cost, mfu = c.get("cost_per_mtok"), c.get("mfu")
            rows.append(
                head
                + [
                    c["layout"],
                    f"{c['tokens_per_s_per_device']:,.0f}",
                    f"{c['tokens_per_joule']:.2f}",
                    "-" if cost is None else f"{cost:.3f}",
                    "-" if mfu is None else f"{mfu:.1%} ({c['mfu_basis'].split()[0]} peak)",
                    "winner" if c["winner"] else "",
                ]
            )
        return cols, rows

    def _repr_html_(self) -> str:
        from autopar.report import table_html

        cols, rows = self.table()
        return table_html(
            cols,
            rows,
            left=("model", "device", "layout"),
            caption=f"best layout per device ({self.workload})",
        )

    def to_frame(self) -> Any:
        """Every cell as a pandas DataFrame, one row per (model, seq, batch, device) (needs pandas)."""
        from autopar.report import frame

        return frame([{k: v for k, v in c.items() if not isinstance(v, dict | list)} for c in self.cells])

    def to_dict(self) -> dict[str, Any]:
        from autopar.job import SCHEMA_VERSION

        return {
            "schema_version": SCHEMA_VERSION,
            "workload": self.workload,
            "metric": self.metric,
            "devices": self.devices,
            "cells": self.cells,
            "winners": self.winners,
            "winner_changes": self.changes,
        }


# ============================================================================================ serving
def _serving_cell(
    model: str,
    device: str,
    num_devices: int,
    isl: int,
    osl: int,
    batch: int | None,
    price: float | None,
    metric: str,
    skw: dict[str, Any],
) -> dict[str, Any]:
    from autopar.serving.search import serve

    kw = dict(skw)
    if batch is not None:
        kw.update(concurrency=batch, offline=False, request_rate=None)
    elif kw.get("concurrency") is None and kw.get("request_rate") is None:
        kw["offline"] = True
    try:
        res = serve(
            model=model,
            device=device,
            num_devices=num_devices,
            isl=isl,
            osl=osl,
            price_per_device_hour=price,
            top=200,
            **kw,
        )
    except InfeasibleError as exc:
        return {"feasible": False, "reason": str(exc)}
    obj = SERVING[_BY_METRIC[metric]]
    key, hi = obj.metric, obj.direction == "maximize"
    rows = [r for r in res.results if r.get(key) is not None] or res.results
    best = (max if hi else min)(rows, key=lambda r: r.get(key) or 0.0)
    return {
        "feasible": True,
        "layout": best["short"],
        "devices_used": best["devices"],
        "tokens_per_s_per_device": best["output_tokens_per_s_per_device"],
        "tokens_per_s_per_user": best["output_tokens_per_s_per_user"],
        "ttft_ms": best["ttft_ms"],
        "tpot_ms": best["tpot_ms"],
        "tokens_per_joule": best["output_tokens_per_joule"],
        "cost_per_mtok": best.get("cost_per_mtok"),
        "time_ms_per_iteration": best.get("time_ms_per_iteration"),
        "memory_gib_per_device": best.get("memory_gib_per_device"),
        "record": {**best, "job": res.job},  # what `autopar export --from-json` reads
    }


# =========================================================================================== training
def _training_cell(
    model: str,
    device: str,
    num_devices: int,
    seq_len: int,
    global_batch: int,
    price: float | None,
    metric: str,
    precision: str,
    calibration: str | None,
    memory_headroom: float | None = None,
) -> dict[str, Any]:
    """Best training layout on ``device``: :func:`autopar.search.recommend` over its default space."""
    from autopar.hardware import load_device
    from autopar.search.recommend import DEFAULT_PRICE_PER_DEVICE_HOUR, recommend

    # fp8 on a device without fp8 GEMMs falls back to bf16 (the legality rule would reject it).
    prec = precision if precision != "fp8" or "fp8" in load_device(device).peak_tflops else "bf16"
    try:
        r = recommend(
            model=model,
            device=device,
            num_devices=num_devices,
            seq_len=seq_len,
            global_batch=global_batch,
            top=1,
            objective=_BY_METRIC[metric],
            overrides=(f"precision={prec}",),
            calibration=calibration,
            memory_headroom=memory_headroom,
            price_per_device_hour=DEFAULT_PRICE_PER_DEVICE_HOUR if price is None else price,
            progress=False,
        )
    except InfeasibleError as exc:
        return {"feasible": False, "reason": str(exc).splitlines()[0]}
    best = r.results[0]
    t = best.tokens_per_s_per_device
    tokens = seq_len * global_batch
    return {
        "feasible": True,
        "layout": best.layout.short(),
        "devices_used": num_devices,
        "tokens_per_s_per_device": t,
        "tokens_per_joule": tokens / best.energy_j_per_step,
        "step_time_s": best.step_time_s,
        "mfu": best.mfu,
        "mfu_basis": best.mfu_basis,
        "time_breakdown": best.time_breakdown,
        "memory_breakdown": best.memory_breakdown,
        "record": {**best.layout.model_dump(), "job": r.job},  # what `autopar export --from-json` reads
        "j_per_step": best.energy_j_per_step,
        "cost_per_mtok": None if price is None else float(cost_per_mtok(t, price)),
    }


# ============================================================================================== driver
def compare(
    *,
    model: str | Sequence[str],
    devices: str | Sequence[str],
    num_devices: int,
    workload: str | None = None,
    seq_len: int | Sequence[int] | None = None,
    isl: int | Sequence[int] | None = None,
    global_batch: int | Sequence[int] | None = None,
    concurrency: int | str | Sequence[int | str | None] | None = None,
    batch: int | str | Sequence[int | str | None] | None = None,
    osl: int = 256,
    weight_precision: str | None = None,
    kv_precision: str | None = None,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    precision: str = "bf16",
    metric: str = "tokens_per_s_per_device",
    prices: dict[str, float] | None = None,
    price_per_device_hour: float | None = None,
    calibration: str | None = None,
    memory_headroom: float | None = None,
    on_cell: Callable[[str], None] | None = None,
) -> CompareResult:
    """Best layout per device on every (model, seq_len, batch) cell and the winner of each cell.

    The keywords are ``autopar compare``'s flags. ``workload`` must be named: "training"
    (``seq_len`` training sequence lengths, ``global_batch`` sequences per step) or "serving"
    (``isl`` prompt lengths, ``concurrency`` in-flight requests, "max" or None for offline maximum
    throughput, ``osl`` output length). As on the command line, ``seq_len``/``isl`` and
    ``global_batch``/``concurrency``/``batch`` are one value under several names. ``model``,
    ``devices`` and the lengths and batches take one value or a list (comma-separated text
    too). ``memory_headroom`` (training): the fraction of device memory a layout must leave free
    (None: the Job default). ``prices``: USD per device-hour by device; ``price_per_device_hour``:
    the same price for every device (``prices`` wins where both name one).
    """
    if workload is None:  # never guessed: a global batch read as a serving concurrency is wrong silently
        raise AutoparError("compare needs workload='training' or workload='serving'", "name the workload")
    models, device_list = _names(model, "model"), [d.lower() for d in _names(devices, "devices")]
    seq_lens = [int(v) for v in _one_of("seq_len", seq_len, isl=isl)]
    given = _one_of("global_batch", global_batch, concurrency=concurrency, batch=batch)
    batches: list[int | None] = [None if str(v).lower() in ("max", "none") else int(v) for v in given]
    if not seq_lens:
        raise AutoparError("compare needs seq_len (training) or isl (serving)", "e.g. seq_len=8192")
    if not batches:
        batches = [None]
    all_prices = {d: price_per_device_hour for d in device_list} if price_per_device_hour is not None else {}
    all_prices.update({k.lower(): v for k, v in (prices or {}).items()})
    serving = dict(
        weight_precision=weight_precision, kv_precision=kv_precision, ttft_ms=ttft_ms, tpot_ms=tpot_ms
    )
    return _compare(
        models=models,
        devices=device_list,
        num_devices=num_devices,
        workload=workload,
        seq_lens=seq_lens,
        batches=batches,
        osl=osl,
        metric=metric,
        prices=all_prices,
        precision=precision,
        calibration=calibration,
        memory_headroom=memory_headroom,
        serving_kwargs={k: v for k, v in serving.items() if v is not None},
        on_cell=on_cell,
    )


def _names(value: str | Sequence[str], what: str) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    out = [str(x).strip() for x in items if str(x).strip()]
    if not out:
        raise AutoparError(f"compare needs at least one {what}")
    return out


def _one_of(name: str, value: Any, **aliases: Any) -> list[Any]:
    """One list from a keyword and its aliases (the CLI's flags that share one destination)."""
    given = {k: v for k, v in {name: value, **aliases}.items() if v is not None}
    if len(given) > 1:
        raise AutoparError(f"compare: {' and '.join(given)} are the same setting", "pass one of them")
    if not given:
        return []
    v = next(iter(given.values()))
    items = v.split(",") if isinstance(v, str) else list(v) if isinstance(v, list | tuple) else [v]
    return [x.strip() if isinstance(x, str) else x for x in items]


def _compare(
    *,
    models: list[str],
    devices: list[str],
    num_devices: int,
    workload: str,
    seq_lens: list[int],
    batches: list[int | None],
    osl: int,
    metric: str,
    prices: dict[str, float],
    precision: str,
    calibration: str | None,
    memory_headroom: float | None,
    serving_kwargs: dict[str, Any],
    on_cell: Callable[[str], None] | None,
) -> CompareResult:
    if workload not in ("serving", "training"):
        raise AutoparError(f"workload must be serving or training, got {workload!r}")
    if metric not in METRICS:
        raise AutoparError(f"unknown metric {metric!r}", f"use one of {', '.join(METRICS)}")
    if len(devices) < 1 or len(set(devices)) != len(devices):
        raise AutoparError("give one or more distinct devices", "e.g. --devices h100-sxm-80gb,h200-sxm-141gb")
    n_cells = len(models) * len(devices) * len(seq_lens) * len(batches)
    if n_cells > MAX_COMPARE_CELLS:  # each is a search of its own (~0.3 s training, more serving)
        raise AutoparError(
            f"the comparison has {n_cells:,} cells (models x devices x sequence lengths x batches), "
            f"over the limit of {MAX_COMPARE_CELLS:,}",
            "compare fewer values per list, or split the comparison into several runs",
        )
    prices = prices or {}
    if metric == "cost_per_mtok":
        missing = [d for d in devices if d not in prices]
        if missing:
            raise AutoparError(
                f"metric cost_per_mtok needs a price per device-hour for {', '.join(missing)}",
                "pass --prices DEVICE=USD,... or --price-per-device-hour",
            )
    if workload == "training" and any(b is None for b in batches):
        raise AutoparError("a training comparison needs global_batch", "e.g. global_batch=[256, 1024]")
    from autopar.hardware import load_device
    from autopar.model import load_model

    for d in devices:
        load_device(d)  # fail fast on a typo
    for m in models:
        load_model(m)
    key, hi = METRICS[metric]
    cells, winners = [], []
    skw = dict(serving_kwargs or {})
    if calibration is not None:
        skw["calibration"] = calibration
    for m in models:
        for s in seq_lens:
            for b in batches:
                row_cells = []
                for d in devices:
                    if on_cell is not None:
                        on_cell(f"{m} seq {s} batch {b or 'max'} on {d}")
                    if workload == "serving":
                        c = _serving_cell(m, d, num_devices, s, osl, b, prices.get(d), metric, skw)
                    else:
                        assert b is not None
                        c = _training_cell(
                            m,
                            d,
                            num_devices,
                            s,
                            b,
                            prices.get(d),
                            metric,
                            precision,
                            calibration,
                            memory_headroom,
                        )
                    c.update(model=m, seq_len=s, batch=b, device=d)
                    cells.append(c)
                    row_cells.append(c)
                ok = [c for c in row_cells if c["feasible"] and c.get(key) is not None]
                win = (max if hi else min)(ok, key=lambda c: c[key]) if ok else None
                for c in row_cells:
                    c["winner"] = win is not None and c is win
                winners.append(
                    {
                        "model": m,
                        "seq_len": s,
                        "batch": b,
                        "winner": win["device"] if win else None,
                        "value": win[key] if win else None,
                        "runner_up_ratio": _runner_up(ok, key, hi),
                    }
                )
    return CompareResult(workload, metric, list(devices), cells, winners, _changes(winners))


def _runner_up(ok: list[dict[str, Any]], key: str, hi: bool) -> float | None:
    vals = sorted((c[key] for c in ok), reverse=hi)
    if len(vals) < 2 or not vals[1]:
        return None
    return vals[0] / vals[1] if hi else vals[1] / vals[0]


def _changes(winners: list[dict[str, Any]]) -> list[str]:
    """Sentences naming each place the winner changes along batch, sequence length and model."""
    out = []
    by = {(w["model"], w["seq_len"], w["batch"]): w["winner"] for w in winners}
    models = list(dict.fromkeys(w["model"] for w in winners))
    seqs = list(dict.fromkeys(w["seq_len"] for w in winners))
    batches = list(dict.fromkeys(w["batch"] for w in winners))
    for m in models:
        for s in seqs:
            for b0, b1 in zip(batches, batches[1:], strict=False):
                if by[(m, s, b0)] != by[(m, s, b1)]:
                    out.append(
                        f"{m}, seq {s}: batch {b0 or 'max'} -> {b1 or 'max'}: "
                        f"{by[(m, s, b0)]} -> {by[(m, s, b1)]}"
                    )
        for b in batches:
            for s0, s1 in zip(seqs, seqs[1:], strict=False):
                if by[(m, s0, b)] != by[(m, s1, b)]:
                    out.append(
                        f"{m}, batch {b or 'max'}: seq {s0} -> {s1}: {by[(m, s0, b)]} -> {by[(m, s1, b)]}"
                    )
    for s in seqs:
        for b in batches:
            for m0, m1 in zip(models, models[1:], strict=False):
                if by[(m0, s, b)] != by[(m1, s, b)]:
                    out.append(
                        f"seq {s}, batch {b or 'max'}: model {m0} -> {m1}: {by[(m0, s, b)]} -> "
                        f"{by[(m1, s, b)]}"
                    )
    return out


# ============================================================================================= outputs
CSV_FIELDS = (
    "model",
    "seq_len",
    "batch",
    "device",
    "feasible",
    "winner",
    "layout",
    "devices_used",
    "tokens_per_s_per_device",
    "tokens_per_s_per_user",
    "tokens_per_joule",
    "cost_per_mtok",
    "ttft_ms",
    "tpot_ms",
    "step_time_s",
    "mfu",
    "mfu_basis",
    "j_per_step",
    "reason",
)

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def write_outputs(res: CompareResult, prefix: str | Path) -> list[Path]:
    """Write ``PREFIX.csv`` (every cell) and ``PREFIX.svg`` (the plot); returns the paths."""
    import io

    from autopar.files import write_text

    csv_path, svg_path = output_paths(prefix)
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    wr.writeheader()
    for c in res.cells:
        wr.writerow({k: ("" if c.get(k) is None else c.get(k)) for k in CSV_FIELDS})
    write_text(csv_path, buf.getvalue(), "comparison table", "--out")
    write_text(svg_path, _svg(res), "comparison plot", "--out")
    return [csv_path, svg_path]


def output_paths(prefix: str | Path) -> tuple[Path, Path]:
    """``PREFIX.csv`` and ``PREFIX.svg``, checked (autopar.files.check_output) before any work."""
    from autopar.files import check_output

    prefix = Path(prefix)
    if not prefix.name:
        raise AutoparError(f"--out {prefix} has no file name", "pass a prefix like results/compare")
    csv_path = prefix.with_name(prefix.name + ".csv")
    svg_path = prefix.with_name(prefix.name + ".svg")
    check_output(csv_path, "comparison table", "--out")
    check_output(svg_path, "comparison plot", "--out")
    return csv_path, svg_path


def _svg(res: CompareResult) -> str:
    key, _ = METRICS[res.metric]
    panels = list(dict.fromkeys((c["model"], c["seq_len"]) for c in res.cells))
    batches = list(dict.fromkeys(c["batch"] for c in res.cells))
    W, H, pad = 360, 240, 48
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    legend_h = 24
    total_w, total_h = cols * W, rows * H + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
        f'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for k, d in enumerate(res.devices):
        lx = 10 + k * 150
        out.append(
            f'<rect x="{lx}" y="6" width="12" height="12" fill="{_COLORS[k % len(_COLORS)]}"/>'
            f'<text x="{lx + 16}" y="16">{_esc(d)}</text>'
        )
    for p, (m, s) in enumerate(panels):
        ox, oy = (p % cols) * W, legend_h + (p // cols) * H
        cells = [c for c in res.cells if c["model"] == m and c["seq_len"] == s]
        vals = [c[key] for c in cells if c.get("feasible") and c.get(key)]
        vmax = max(vals) if vals else 1.0
        x0, y0, x1, y1 = ox + pad, oy + 20, ox + W - 12, oy + H - 30
        out.append(
            f'<text x="{ox + W / 2}" y="{oy + 14}" text-anchor="middle">{_esc(str(m))}, seq {s}</text>'
        )
        out.append(
            f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="black"/>'
            f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>'
        )
        out.append(
            f'<text x="{x0 - 4}" y="{y0 + 4}" text-anchor="end">{vmax:.3g}</text>'
            f'<text x="{x0 - 4}" y="{y1}" text-anchor="end">0</text>'
        )
        nb = len(batches)
        xs = {b: x0 + (x1 - x0) * (i + 0.5) / nb for i, b in enumerate(batches)}
        for b in batches:
            out.append(
                f'<text x="{xs[b]}" y="{y1 + 14}" text-anchor="middle">{"max" if b is None else b}</text>'
            )
        out.append(f'<text x="{(x0 + x1) / 2}" y="{y1 + 26}" text-anchor="middle">batch</text>')
        for k, d in enumerate(res.devices):
            pts = [
                (xs[c["batch"]], y1 - (y1 - y0) * c[key] / vmax, c)
                for c in cells
                if c["device"] == d and c.get("feasible") and c.get(key)
            ]
            color = _COLORS[k % len(_COLORS)]
            if len(pts) > 1:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in pts)
                out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
            for x, y, c in pts:
                rad = 5 if c.get("winner") else 3
                out.append(
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{rad}" fill="{color}"'
                    + (' stroke="black"' if c.get("winner") else "")
                    + "/>"
                )
    out.append(f'<text x="{total_w - 8}" y="16" text-anchor="end">{_esc(res.metric)} (winner circled)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
