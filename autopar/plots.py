"""Plots of what the engine computed, as SVG text (matplotlib, imported only when a plot is drawn).

Every function takes figures already computed (Prediction/result dicts) and draws them; nothing
here recomputes a figure. The SVG is self-contained (glyphs as paths, no fonts, no external
references) and its element ids carry a per-figure prefix so several plots can share one HTML page.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

# Colour-blind-safe qualitative palette (Okabe & Ito 2008), then matplotlib's tab10.
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
    "#8c564b",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_ids = itertools.count(1)


def _import_matplotlib() -> Any:
    """matplotlib, imported without reading ``MPLBACKEND``: these plots draw on a bare Figure and
    never use a backend, and a value set for another program (Jupyter's
    ``module://matplotlib_inline.backend_inline`` where that module is absent, a typo) would make
    the import raise. The variable is put back at once for anything else this process starts."""
    if "matplotlib" in sys.modules:
        return sys.modules["matplotlib"]
    saved = os.environ.pop("MPLBACKEND", None)
    try:
        import matplotlib
    finally:
        if saved is not None:
            os.environ["MPLBACKEND"] = saved
    return matplotlib


def _figure(width: float, height: float) -> Any:
    _import_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig


def to_svg(fig: Any) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog, DOCTYPE, metadata or xmlns URLs)."""
    matplotlib = _import_matplotlib()

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "autopar", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
    prefix = f"ap{next(_ids)}-"
    text = re.sub(r'\bid="', f'id="{prefix}', text)
    text = text.replace('href="#', f'href="#{prefix}').replace("url(#", f"url(#{prefix}")
    return text


def _t(text: Any) -> str:
    """Text as matplotlib should print it: a "$" is a dollar sign, never the start of math."""
    return str(text).replace("$", r"\$")


def _style(ax: Any) -> None:
    ax.grid(True, color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)


def pareto(
    points: Sequence[Mapping[str, Any]],
    chosen: Mapping[str, Any],
    y: tuple[str, str],
    xs: Sequence[tuple[str, str]],
    *,
    label: str = "short",
    title: str = "",
    points_label: str = "Pareto front",
    connect: bool = True,
) -> str:
    """One panel per ``xs`` (key, axis label): ``y`` against it for every point, the chosen one starred.

    ``points`` are flat dicts holding the keys; a missing or None value leaves the point out.
    """
    fig = _figure(max(6.0, 4.0 * len(xs)), 3.9)
    axes = fig.subplots(1, len(xs), squeeze=False)[0]
    for ax, (xk, xl) in zip(axes, xs, strict=True):
        pts = [(p[xk], p[y[0]]) for p in points if p.get(xk) is not None and p.get(y[0]) is not None]
        if pts:
            px, py = zip(*sorted(pts), strict=True)
            if connect:
                ax.plot(px, py, "-", color="#9db7d5", linewidth=1, zorder=1)
            ax.scatter(px, py, s=22, color=PALETTE[0], zorder=2, label=_t(points_label))
        if chosen.get(xk) is not None:
            ax.scatter(
                [chosen[xk]],
                [chosen[y[0]]],
                s=180,
                marker="*",
                color=PALETTE[3],
                edgecolor="black",
                linewidth=0.6,
                zorder=3,
                label=_t(f"chosen: {chosen.get(label, '')}"),
            )
        ax.set_xlabel(_t(xl))
        ax.set_ylabel(_t(y[1]))
        _style(ax)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
        handles, labels, loc="outside lower center", ncol=2 if len(xs) > 1 else 1, fontsize=8, frameon=False
    )
    if title:
        fig.suptitle(_t(title), fontsize=10)
    return to_svg(fig)


def stacked_bars(
    rows: Sequence[tuple[str, Mapping[str, float]]],
    *,
    xlabel: str,
    title: str,
    scale: float = 1.0,
    colors: Mapping[str, str] | None = None,
) -> str:
    """Horizontal stacked bars, one per (label, parts) row; parts <= 0 are left out of the legend.
    ``colors`` maps a part to its colour (default: the palette in order)."""
    keys: list[str] = []
    for _, parts in rows:
        keys += [k for k, v in parts.items() if v > 0 and k not in keys]
    fig = _figure(10.0, 1.3 + 0.42 * len(rows) + 0.2 * ((len(keys) + 3) // 4))
    ax = fig.subplots()
    labels = [_t(r[0]) for r in rows][::-1]
    left = [0.0] * len(rows)
    for j, k in enumerate(keys):
        vals = [max(0.0, float(parts.get(k, 0.0))) * scale for _, parts in rows][::-1]
        ax.barh(
            labels,
            vals,
            left=left,
            color=(colors or {}).get(k, PALETTE[j % len(PALETTE)]),
            label=_t(k.replace("_", " ")),
            height=0.6,
        )
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel(_t(xlabel))
    ax.set_title(_t(title), fontsize=10)
    _style(ax)
    ax.grid(False, axis="y")
    fig.legend(loc="outside lower center", ncol=min(6, max(1, len(keys))), fontsize=8, frameon=False)
    return to_svg(fig)


def lines(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool = False,
    style: Mapping[str, str] | None = None,
) -> str:
    """One line per series of (x, y) points; ``style`` maps a series to a marker/line format
    ("-", ".", "x"; default: line with dots)."""
    fig = _figure(7.0, 3.8)
    ax = fig.subplots()
    for j, (name, pts) in enumerate(series.items()):
        if not pts:
            continue
        x, y = zip(*pts, strict=True)
        fmt = (style or {}).get(name, "-o")
        ax.plot(x, y, fmt, ms=4, color=PALETTE[j % len(PALETTE)], label=_t(name))
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(_t(xlabel))
    ax.set_ylabel(_t(ylabel))
    ax.set_title(_t(title), fontsize=10)
    _style(ax)
    if len(series) > 1:
        fig.legend(loc="outside right center", fontsize=8, frameon=False)
    return to_svg(fig)


def grouped_bars(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    ylabel: str,
    title: str,
) -> str:
    """Bars grouped by category, one colour per series; None draws nothing (infeasible)."""
    fig = _figure(max(5.0, 1.2 + 0.9 * len(categories) * max(1, len(series)) ** 0.5), 3.8)
    ax = fig.subplots()
    n = max(1, len(series))
    width = 0.8 / n
    for j, (name, vals) in enumerate(series.items()):
        xs = [i + (j - (n - 1) / 2) * width for i in range(len(categories))]
        ax.bar(
            [x for x, v in zip(xs, vals, strict=True) if v is not None],
            [v for v in vals if v is not None],
            width=width,
            color=PALETTE[j % len(PALETTE)],
            label=_t(name),
        )
    tilt = len(categories) > 3
    ax.set_xticks(
        range(len(categories)),
        [_t(c) for c in categories],
        rotation=20 if tilt else 0,
        ha="right" if tilt else "center",
        fontsize=8,
    )
    ax.set_ylabel(_t(ylabel))
    ax.set_title(_t(title), fontsize=10)
    _style(ax)
    ax.grid(False, axis="x")
    if len(series) > 1:
        fig.legend(loc="outside right center", fontsize=8, frameon=False)
    return to_svg(fig)


def parity(
    measured: Sequence[float],
    predicted: Sequence[float],
    *,
    groups: Sequence[str] | None = None,
    unit: str,
    title: str,
    band: float | None = None,
) -> str:
    """Predicted against measured, log-log, with the y = x line (and a +-band fraction if given)."""
    fig = _figure(5.2, 4.6)
    ax = fig.subplots()
    groups = list(groups) if groups is not None else [""] * len(measured)
    order = list(dict.fromkeys(groups))
    for j, g in enumerate(order):
        idx = [i for i, x in enumerate(groups) if x == g]
        ax.scatter(
            [measured[i] for i in idx],
            [predicted[i] for i in idx],
            s=16,
            alpha=0.8,
            color=PALETTE[j % len(PALETTE)],
            label=_t(g) if g else None,
        )
    vals = [v for v in (*measured, *predicted) if v > 0]
    if vals:
        lo, hi = min(vals) / 1.3, max(vals) * 1.3
        ax.plot([lo, hi], [lo, hi], "-", color="#555555", linewidth=0.8, label="predicted = measured")
        if band:
            ax.fill_between(
                [lo, hi],
                [lo * (1 - band), hi * (1 - band)],
                [lo * (1 + band), hi * (1 + band)],
                color="#cccccc",
                alpha=0.4,
                linewidth=0,
                label=f"±{band:.0%}",
            )
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_xscale("log")
        ax.set_yscale("log")
        import math

        subs = (1.0, 2.0, 5.0) if math.log10(hi / lo) <= 2.5 else (1.0,)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=subs))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
    import textwrap

    ax.set_xlabel(_t(f"measured ({unit})"))
    ax.set_ylabel(_t(f"predicted ({unit})"))
    ax.set_title(_t(textwrap.fill(title, 60)), fontsize=9)
    _style(ax)
    ax.legend(loc="upper left", fontsize=7, frameon=False, ncol=1 if len(order) < 6 else 2)
    return to_svg(fig)


def write_svg(svg: str, path: Any, what: str, flag: str) -> None:
    """Write one plot as a standalone SVG file (namespace restored) through ``autopar.files``."""
    from autopar.files import write_text

    text = svg.replace(
        "<svg", '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"', 1
    )
    write_text(path, '<?xml version="1.0" encoding="utf-8" standalone="no"?>\n' + text, what, flag)
