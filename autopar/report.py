"""Self-contained HTML reports (``--html PATH``) and the HTML tables notebooks show (``_repr_html_``).

A report is one file: inline CSS and inline SVG plots, no script, no font, no image or style fetched
from anywhere. Every string that reaches the page is escaped here (model names come from user
files); plots arrive as SVG that ``autopar.plots`` generated. Written through ``autopar.files``.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;
background:#f6f7f9;color:#1d2430;font-size:14px;line-height:1.45}
main{max-width:1320px;margin:0 auto;padding:20px 28px 40px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #d5dae1;
padding-bottom:4px}
.sub{color:#4a5566;margin:0 0 12px}
.card{background:#fff;border:1px solid #d5dae1;border-radius:6px;padding:12px 16px;margin:10px 0}
.winner{border-left:5px solid #D55E00}
.kpis{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}
.kpi{background:#fff;border:1px solid #d5dae1;border-radius:6px;padding:8px 14px;min-width:150px}
.kpi .v{font-size:20px;font-weight:600}.kpi .k{color:#4a5566;font-size:12px}
.tw{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0}
th,td{border:1px solid #d5dae1;padding:4px 8px;text-align:right;white-space:nowrap}
th{background:#eef1f5}td.l,th.l{text-align:left}
tr.top td{background:#fff4ec;font-weight:600}
.plot{background:#fff;border:1px solid #d5dae1;border-radius:6px;padding:8px;margin:10px 0;overflow-x:auto}
.plot svg{max-width:100%;height:auto}
pre{background:#1d2430;color:#f1f3f6;padding:10px 14px;border-radius:6px;overflow-x:auto;font-size:12px}
ul{margin:4px 0 4px 20px;padding:0}
.note{color:#4a5566;font-size:12px}
footer{color:#6b7686;font-size:12px;margin-top:30px}
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


# Every abbreviation a layout name uses (Layout.short(), the serving deployments' names), as the
# legend under a table explains it: (pattern of the whole token, its meaning). Order = legend order.
ABBREVIATIONS: tuple[tuple[str, str], ...] = (
    (r"tp\d+", "tpN tensor parallel size"),
    (r"pp\d+", "ppN pipeline stages"),
    (r"vpp\d+", "vppN virtual stages per pipeline rank (interleaved)"),
    (r"ends[\d-]+/[\d-]+", "endsA/B layers on the first/last pipeline stage (uneven split)"),
    (r"dp\d+", "dpN data-parallel replicas"),
    (r"cp\d+", "cpN context parallel size"),
    (r"ep\d+", "epN expert parallel size"),
    (r"etp\d+", "etpN expert tensor parallel size"),
    (r"adp\d+", "adpN attention data-parallel ranks"),
    (r"z\d", "zN ZeRO stage (z0 none, z1 optimizer states sharded, z2 and gradients, z3 and weights)"),
    (r"sg\d+", "sgN ZeRO shard group (hybrid sharding)"),
    (r"sp", "sp sequence parallel"),
    (r"mb\d+x\d+", "mbAxB micro-batch of A sequences x B gradient-accumulation steps"),
    (r"norc", "norc no activation recompute"),
    (r"sel", "sel selective activation recompute"),
    (r"full", "full full-layer activation recompute"),
    (r"na", "na recompute of norms and activations"),
    (r"namlp", "namlp recompute of norms, activations and the MLP"),
    (r"offload", "offload optimizer states in host memory"),
    (r"bf16|fp8", "bf16/fp8 GEMM precision"),
    (r"x\d+", "xN replicas (engine instances)"),
    (r"b\d+", "bN concurrent requests per instance"),
    (r"\d+[PD]", "NP(...) + MD(...) disaggregated: N prefill and M decode instances"),
    (r"k\d+", "kN prompts per prefill batch"),
    (r"cap\d+W", "capNW power cap per device"),
)


def legend(texts: Sequence[Any]) -> str:
    """ "Legend: ..." for the abbreviations that occur in ``texts`` (layout names), in a fixed
    order; "" when none does."""
    found: list[str] = []
    for text in texts:
        s = str(text)
        for token in s.replace("(", " ").replace(")", " ").replace("+", " ").split():
            for pattern, meaning in ABBREVIATIONS:
                if re.fullmatch(pattern, token) and meaning not in found:
                    found.append(meaning)
    order = [m for _, m in ABBREVIATIONS]
    found.sort(key=order.index)
    return "Legend: " + "; ".join(found) + "." if found else ""


def table_html(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    left: Sequence[str] = ("layout",),
    highlight_first: bool = False,
    caption: str = "",
) -> str:
    """An HTML table of already-formatted cells (escaped here); ``left`` columns are left-aligned.
    A column with a header but no value in any row (e.g. "also" when nothing was collapsed) is
    left out."""
    keep = [i for i, c in enumerate(columns) if not rows or any(str(r[i]) != "" for r in rows) or not c]
    columns = [columns[i] for i in keep]
    rows = [[r[i] for i in keep] for r in rows]
    lefts = {i for i, c in enumerate(columns) if c in left}
    named = [i for i, c in enumerate(columns) if "layout" in c or c.startswith("also")]
    names = [r[i] for r in rows for i in named]
    caption = " ".join(x for x in (caption, legend(names)) if x)  # every abbreviation explained
    out = ["<div class=tw><table>"]
    if caption:
        out.append(f"<caption class='note'>{esc(caption)}</caption>")
    out.append(
        "<thead><tr>"
        + "".join(f"<th{' class=l' if i in lefts else ''}>{esc(c)}</th>" for i, c in enumerate(columns))
        + "</tr></thead><tbody>"
    )
    for j, r in enumerate(rows):
        cls = " class=top" if highlight_first and j == 0 else ""
        out.append(
            f"<tr{cls}>"
            + "".join(f"<td{' class=l' if i in lefts else ''}>{esc(v)}</td>" for i, v in enumerate(r))
            + "</tr>"
        )
    out.append("</tbody></table></div>")
    return "".join(out)


def frame(rows: Sequence[Mapping[str, Any]]) -> Any:
    """A pandas DataFrame of ``rows`` (pandas is the optional extra ``frame``)."""
    try:
        import pandas as pd
    except ImportError:
        from autopar.errors import AutoparError

        raise AutoparError(
            "to_frame() needs pandas, which is not installed", "pip install 'autopar[frame]'"
        ) from None
    return pd.DataFrame(list(rows))


class Report:
    """Sections appended in reading order, rendered by :meth:`html` into one page."""

    def __init__(self, title: str, subtitle: str = "") -> None:
        self.title, self.subtitle = title, subtitle
        self.parts: list[str] = []

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{esc(text)}</h2>")

    def text(self, text: str, cls: str = "") -> None:
        self.parts.append(f"<p{f' class={cls}' if cls else ''}>{esc(text)}</p>")

    def winner(self, name: str, kpis: Mapping[str, str], why: str) -> None:
        cards = "".join(
            f"<div class=kpi><div class=v>{esc(v)}</div><div class=k>{esc(k)}</div></div>"
            for k, v in kpis.items()
        )
        self.parts.append(
            f"<div class='card winner'><div><b>winner:</b> <code>{esc(name)}</code></div>"
            f"<div class=kpis>{cards}</div><div><b>why:</b> {esc(why)}</div></div>"
        )

    def bullets(self, items: Sequence[str], title: str = "") -> None:
        if title:
            self.heading(title)
        self.parts.append("<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>")

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]], **kw: Any) -> None:
        self.parts.append(table_html(columns, rows, **kw))

    def plot(self, svg: str, caption: str = "") -> None:
        """An SVG from ``autopar.plots`` (trusted: generated, its text escaped by matplotlib)."""
        cap = f"<div class=note>{esc(caption)}</div>" if caption else ""
        self.parts.append(f"<div class=plot>{svg}{cap}</div>")

    def code(self, text: str, title: str = "") -> None:
        if title:
            self.heading(title)
        self.parts.append(f"<pre>{esc(text)}</pre>")

    def html(self) -> str:
        from autopar import __version__

        return (
            "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content='width=device-width,initial-scale=1'>"
            f"<title>{esc(self.title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{esc(self.title)}</h1><p class=sub>{esc(self.subtitle)}</p>"
            + "\n".join(self.parts)
            + f"<footer>autopar {esc(__version__)}: predictions from the memory and time models; "
            "every figure above was computed by the engine and only drawn here.</footer>"
            "</main></body></html>\n"
        )

    def write(self, path: str | os.PathLike[str], flag: str = "--html") -> None:
        from autopar.files import write_text

        write_text(path, self.html(), "HTML report", flag)


def check_html_path(path: str | os.PathLike[str] | None, flag: str = "--html") -> None:
    """Refuse a bad ``--html`` destination before any long work (see ``autopar.files``)."""
    if path is not None:
        from autopar.files import check_output

        check_output(path, "HTML report", flag)
