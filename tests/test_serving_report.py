"""The serving HTML report: no empty breakdown bars for disaggregated deployments, and a launch snippet."""

from __future__ import annotations

import html
from dataclasses import replace

import pytest

from autopar.cli.report import serving_report
from autopar.serving.search import serve

BASE = dict(
    model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=8, isl=1000, osl=500, weight_precision="fp8"
)


@pytest.fixture(scope="module")
def result():
    return serve(**BASE)


@pytest.fixture
def bars(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The labels of every stacked-bar chart the report draws (the real plots run underneath)."""
    from autopar import plots

    drawn: list[list[str]] = []
    real = plots.stacked_bars

    def spy(items, **kw):
        drawn.append([label for label, _ in items])
        assert all(parts for _, parts in items), "an empty bar was drawn"
        return real(items, **kw)

    monkeypatch.setattr(plots, "stacked_bars", spy)
    return drawn


def test_aggregated_winner_gets_its_vllm_command(result, bars: list[list[str]]) -> None:
    agg = [r for r in result.results if r["mode"] == "aggregated"]
    assert agg
    page = html.unescape(serving_report(replace(result, results=agg)).html())
    assert "Launch it (vLLM)" in page and "vllm serve" in page
    assert f"--tensor-parallel-size {agg[0]['tp']}" in page
    assert len(bars) == 2 and all(b[0] == f"#1 {agg[0]['short']}" for b in bars)  # time and memory
    assert "disaggregated prefill/decode deployments" not in page


def test_disaggregated_winner_draws_no_empty_bars(result, bars: list[list[str]]) -> None:
    dis = [r for r in result.results + result.pareto if r["mode"] == "disaggregated"]
    agg = [r for r in result.results if r["mode"] == "aggregated"]
    assert dis and agg, "expected both kinds among the results"
    ranked = replace(result, results=[dis[0], *agg[:3]])
    page = html.unescape(serving_report(ranked).html())
    assert len(bars) == 2 and all(b[0] == f"#2 {agg[0]['short']}" for b in bars)  # no bar for #1
    assert "#1: disaggregated prefill/decode deployments" in page
    assert "the best aggregated deployment is #2" in page and "vllm serve" in page
