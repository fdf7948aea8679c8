"""The Pareto front of output tokens/s per user against per device (issue 23 item 3): in the JSON,
non-dominated, holding the chosen layout whenever it is not dominated, and drawn in the HTML report."""

from __future__ import annotations

import html
import json

import pytest

from autopar.cli.report import serving_report
from autopar.serving.search import serve

CASES = {
    "sweep": dict(model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=8, isl=1000, osl=500, weight_precision="fp8"),
    "rate-p95": dict(
        model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, isl=2000, osl=500, request_rate=10.0,
        ttft_ms=2000, tpot_ms=40, percentile=95,
    ),
    "vllm-offline": dict(
        model="llama-3.1-8b", device="h200-sxm-141gb", num_devices=4, isl=4000, osl=1000, offline=True, backend="vllm"
    ),
}  # fmt: skip


def beats(q: dict, p: dict) -> bool:
    """q dominates p: no worse on both axes, better on one."""
    qx, qy = q["output_tokens_per_s_per_user"], q["output_tokens_per_s_per_device"]
    px, py = p["output_tokens_per_s_per_user"], p["output_tokens_per_s_per_device"]
    tol = 1e-9
    return qx >= px * (1 - tol) and qy >= py * (1 - tol) and (qx > px * (1 + tol) or qy > py * (1 + tol))


@pytest.fixture(scope="module", params=sorted(CASES))
def result(request):
    return serve(**CASES[request.param], top=20)


def test_front_is_non_dominated_and_holds_the_chosen_layout(result) -> None:
    d = json.loads(json.dumps(result.to_dict(), default=float))
    front, info = d["pareto"], d["pareto_front"]
    assert (
        front
        and info["x"] == "output_tokens_per_s_per_user"
        and info["y"] == "output_tokens_per_s_per_device"
    )
    assert len(front) == info["listed"] <= info["front_size"] <= info["candidates"]
    for p in front:
        assert not any(beats(q, p) for q in front)
    best = d["results"][0]
    # nothing among the ranked results (all feasible candidates) beats a front point
    for p in front:
        assert not any(beats(r, p) for r in d["results"])
    dominated = any(beats(r, best) for r in d["results"] + front)
    marked = [p for p in front if p["chosen"]]
    if not dominated:
        assert info["chosen_on_front"]
        assert len(marked) == 1 and marked[0]["short"] == best["short"]
    else:
        assert not info["chosen_on_front"] and not marked


def test_report_draws_the_front_and_marks_the_chosen_layout(result) -> None:
    page = html.unescape(serving_report(result).html())
    assert "Throughput per device against speed per user" in page and "<svg" in page
    assert "tok/s/user" in page and "on the front" in page
    if result.pareto_info["chosen_on_front"]:
        assert "the chosen layout is on the front (marked)" in page and ">chosen<" in page


def test_a_long_front_is_thinned_but_keeps_the_chosen_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    from autopar.serving import search

    full = serve(**CASES["sweep"])
    monkeypatch.setattr(search, "MAX_PARETO", 3)
    thin = serve(**CASES["sweep"])
    assert thin.pareto_info["front_size"] == full.pareto_info["front_size"] > 3
    assert 3 <= len(thin.pareto) <= 4 and {p["short"] for p in thin.pareto} <= {
        p["short"] for p in full.pareto
    }
    assert [p["short"] for p in thin.pareto if p["chosen"]] == [thin.results[0]["short"]]


def test_report_quotes_the_widened_expected_error_of_another_stack() -> None:
    r = serve(**CASES["vllm-offline"])
    page = html.unescape(serving_report(r).html())
    ee = r.costing["expected_error"]
    assert ee and "backend" in ee["widened_by"] and ee["text"] in page
    assert "no serving run of vllm" in page  # the backend's assumptions are listed
