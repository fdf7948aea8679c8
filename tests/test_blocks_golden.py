"""The block-module restructure is behaviour-preserving: every training figure of ~40 diverse jobs x
layouts (dense GQA/MHA, sliding window, MLA, MoE with shared experts and interleaving, Mamba2, Mamba1,
Gated DeltaNet, a parallel hybrid; every recompute mode, precisions, CP, uneven pipelines, five
frameworks and four schedules) equals the table main's code computed before the restructure
(``tests/golden/cost_table.json``, provenance inside) at rel 1e-9."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
TABLE = json.loads((GOLDEN / "cost_table.json").read_text())
_spec = importlib.util.spec_from_file_location("make_cost_table", GOLDEN / "make_cost_table.py")
assert _spec and _spec.loader
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


def test_table_covers_the_generator_cases():
    assert [c["name"] for c in TABLE["cases"]] == [n for n, _, _ in gen.CASES]
    assert "before the autopar/blocks restructure" in TABLE["provenance"]


@pytest.mark.parametrize("case", TABLE["cases"], ids=lambda c: c["name"])
def test_figures_match_the_pre_restructure_table(case):
    now = gen.compute(case["name"], case["job"], case["layout"])
    want = case["figures"]
    assert sorted(now) == sorted(want)
    bad = [
        (k, a, b)
        for k in want
        for a, b in zip(now[k], want[k], strict=True)
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)
    ]
    assert not bad, bad[:5]


SERVING = json.loads((GOLDEN / "serving_table.json").read_text())
_sspec = importlib.util.spec_from_file_location("make_serving_table", GOLDEN / "make_serving_table.py")
assert _sspec and _sspec.loader
sgen = importlib.util.module_from_spec(_sspec)
_sspec.loader.exec_module(sgen)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)


def test_serving_table_covers_the_generator_cases():
    assert [c["name"] for c in SERVING["cases"]] == [n for n, _, _, _ in sgen.CASES]
    assert "before its per-block split" in SERVING["provenance"]


@pytest.mark.parametrize("case", SERVING["cases"], ids=lambda c: c["name"])
def test_serving_figures_match_the_pre_split_table(case):
    now = sgen.compute(case["model"], case["workload"], case["instances"])
    want = case["figures"]
    assert sorted(now) == sorted(want)
    bad = [(k, a, b) for k in want for a, b in zip(now[k], want[k], strict=True) if not _same(a, b)]
    assert not bad, bad[:5]
