"""Every abbreviation in a layout's name is explained by the legend under the tables (terminal and HTML)."""

from __future__ import annotations

import itertools
import re

from autopar.layout import Layout
from autopar.report import ABBREVIATIONS, legend, table_html


def _tokens(name: str) -> list[str]:
    return name.replace("(", " ").replace(")", " ").replace("+", " ").split()


def _explained(token: str) -> bool:
    return any(re.fullmatch(p, token) for p, _ in ABBREVIATIONS)


def test_every_training_layout_token_is_explained() -> None:
    seen: set[str] = set()
    for recompute, zero, offload, precision in itertools.product(
        ("none", "selective", "full", "norm_act", "norm_act_mlp"),
        (0, 1, 2, 3),
        (False, True),
        ("bf16", "fp8"),
    ):
        lay = Layout(
            tp=2, pp=4, vpp=2, first_stage_layers=3, last_stage_layers=5, dp=2, cp=2, ep=4, etp=2,
            zero=zero, shard_group=8 if zero == 3 else 0, sp=True, micro_batch=2, grad_accum=4,
            recompute=recompute, offload=offload and zero >= 1, precision=precision,
        )  # fmt: skip
        name = lay.short()
        for token in _tokens(name):
            assert _explained(token), f"{token!r} of {name!r} has no legend entry"
            seen.add(token)
        text = legend([name])
        assert text.startswith("Legend: ") and "tensor parallel" in text and "micro-batch" in text
    assert {"norc", "sel", "full", "na", "namlp", "offload", "z3", "sg8", "etp2"} <= seen


def test_serving_names_are_explained() -> None:
    for name in ("tp2 pp1 ep8 adp4 x2 b64 cap500W", "3P(tp1 pp1 k4) + 1D(tp2 pp1 adp2 b64)"):
        assert all(_explained(t) for t in _tokens(name)), name
    text = legend(["3P(tp1 pp1 k4) + 1D(tp2 pp1 adp2 b64)"])
    assert "disaggregated" in text and "prompts per prefill batch" in text
    assert legend(["h100-sxm-80gb", "llama-3.1-8b"]) == ""  # device and model names are not layouts


def test_html_tables_carry_the_legend() -> None:
    html = table_html(["#", "layout", "step time"], [["1", "tp4 pp2 dp8 z1 mb1x8 norc bf16", "1.0 s"]])
    assert "<caption class='note'>Legend: tpN tensor parallel size" in html and "norc no activation" in html
    assert "<caption" not in table_html(["device", "x"], [["h100-sxm-80gb", "1"]])
