"""serve(): search results, Pareto front, fewest devices, impossible targets, CLI contract, accuracy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.errors import AutoparError, DeviceError, InfeasibleError, ModelConfigError
from autopar.serving.search import ServingInfeasible, serve

ROOT = Path(__file__).resolve().parent.parent
DEV_CSV = ROOT / "studies" / "data" / "published_runs_dev.csv"  # shipped with the repo
BASE = dict(
    model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=8, isl=1000, osl=500, weight_precision="fp8"
)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autopar.cli", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_sweep_returns_ranked_results_and_a_pareto_front() -> None:
    r = serve(**BASE)
    assert r.layouts_enumerated >= r.layouts_feasible > 0
    assert r.layouts_enumerated == r.layouts_feasible + sum(r.infeasible_by_reason.values())
    tps = [x["output_tokens_per_s"] for x in r.results]  # what the 8 devices deliver
    assert tps == sorted(tps, reverse=True)
    for x in r.results:
        assert x["devices"] + x["idle_devices"] == 8 and x["ttft_ms"] > 0 and x["tpot_ms"] > 0
        assert x["output_tokens_per_joule"] == pytest.approx(1 / x["j_per_output_token"])
    front = r.pareto
    assert front
    for p in front:  # nothing on the front is beaten on both axes by another front point
        for q in front:
            assert not (
                q["output_tokens_per_s_per_device"] > p["output_tokens_per_s_per_device"] * (1 + 1e-9)
                and q["output_tokens_per_s_per_user"] > p["output_tokens_per_s_per_user"] * (1 + 1e-9)
            )
    json.dumps(r.to_dict())


def test_targets_filter_the_results() -> None:
    r = serve(**BASE, ttft_ms=400, tpot_ms=30)
    assert r.results
    for x in r.results + r.pareto:
        assert x["ttft_ms"] <= 400 * (1 + 1e-9) and x["tpot_ms"] <= 30 * (1 + 1e-9)
    assert r.infeasible_by_reason.get("tpot_target", 0) + r.infeasible_by_reason.get("ttft_target", 0) > 0


def test_disaggregated_pools_hand_off_the_kv_cache() -> None:
    r = serve(**BASE, top=50)
    dis = [x for x in r.results + r.pareto if x["mode"] == "disaggregated"]
    assert dis, "expected disaggregated candidates among the results"
    for x in dis:
        assert x["kv_transfer_ms"] > 0 and x["devices"] <= 8
        assert x["prefill"]["instances"] >= 1 and x["decode"]["instances"] >= 1
    plain = serve(**BASE, disaggregated=False)
    assert all(x["mode"] == "aggregated" for x in plain.results)


def test_fewest_devices_for_a_request_rate() -> None:
    kw = dict(BASE, num_devices=64, ttft_ms=2000, tpot_ms=60)
    lo = serve(**kw, request_rate=2.0)
    hi = serve(**kw, request_rate=40.0)
    assert lo.min_devices and hi.min_devices
    assert lo.min_devices["devices"] <= hi.min_devices["devices"] <= 64
    best = hi.min_devices["layout"]
    assert best["request_rate"] == pytest.approx(40.0, rel=1e-3) or best["mode"] == "disaggregated"


def test_concurrency_mode_splits_requests_over_replicas() -> None:
    r = serve(**BASE, concurrency=64)
    for x in r.results:
        assert x["concurrency"] == pytest.approx(64, rel=0.2)


def test_pinned_degrees_and_power_caps() -> None:
    r = serve(**BASE, tp=4, pp=1, power_caps_w=[450.0, 600.0], offline=True)
    assert {(x["tp"], x["pp"]) for x in r.results} == {(4, 1)}
    caps = {x["power_cap_w"] for x in r.results}
    assert caps <= {None, 450.0, 600.0} and len(caps) >= 2


def test_moe_searches_expert_and_attention_data_parallelism() -> None:
    r = serve(
        model="qwen3-30b-a3b",
        device="h100-sxm-80gb",
        num_devices=8,
        isl=1000,
        osl=500,
        offline=True,
        disaggregated=False,
        top=200,
    )
    assert any(x["ep"] > 1 for x in r.results) and any(x["adp"] > 1 for x in r.results)


def test_impossible_tpot_gives_the_closest_figures() -> None:
    with pytest.raises(ServingInfeasible) as exc:
        serve(**BASE, tpot_ms=0.5)
    e = exc.value
    assert isinstance(e, InfeasibleError)
    assert e.closest["min_tpot_ms"] > 0.5
    assert "best achievable" in str(e) and "\n" not in str(e)


def test_nothing_fits_is_infeasible() -> None:
    with pytest.raises(InfeasibleError) as exc:
        serve(model="llama-3.1-405b", device="h100-sxm-80gb", num_devices=2, isl=100, osl=100)
    assert "weights_do_not_fit" in str(exc.value)


@pytest.mark.parametrize(
    "kw,err",
    [
        (dict(model="no-such-model"), ModelConfigError),
        (dict(device="h900"), DeviceError),
        (dict(num_devices=0), AutoparError),
        (dict(isl=0), AutoparError),
        (dict(concurrency=4, offline=True), AutoparError),
        (dict(power_caps_w=[900.0]), AutoparError),
        (dict(price_per_device_hour=-1.0), AutoparError),
        (dict(tp=3), AutoparError),
    ],
)
def test_bad_input(kw: dict, err: type) -> None:
    with pytest.raises(err):
        serve(**{**BASE, **kw})


def test_whole_space_with_power_caps() -> None:
    """The largest space of the speed study answers (its timing is printed by studies/serve_speed.py)."""
    res = serve(
        model="deepseek-v3",
        device="h200-sxm-141gb",
        num_devices=64,
        isl=1000,
        osl=1000,
        weight_precision="fp8",
        power_caps_w=[400.0, 500.0, 600.0, 650.0],
    )
    assert res.layouts_enumerated > 1000 and res.results


# ============================================================================================== CLI
def test_cli_json_has_the_recommend_shape() -> None:
    r = run_cli(
        "serve",
        "--model",
        "llama-3.1-8b",
        "--device",
        "h100-sxm-80gb",
        "--num-devices",
        "2",
        "--isl",
        "512",
        "--osl",
        "128",
        "--tpot-ms",
        "50",
        "--price-per-device-hour",
        "2.5",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for k in ("layouts_enumerated", "layouts_feasible", "infeasible_by_reason", "results", "pareto"):
        assert k in d
    assert d["results"][0]["cost_per_mtok"] > 0


def test_cli_impossible_target_exits_2_with_one_line() -> None:
    r = run_cli(
        "serve",
        "--model",
        "llama-3.1-8b",
        "--device",
        "h100-sxm-80gb",
        "--num-devices",
        "1",
        "--isl",
        "512",
        "--osl",
        "128",
        "--tpot-ms",
        "0.1",
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "best achievable" in lines[0]
    r = run_cli(
        "serve",
        "--model",
        "llama-3.1-8b",
        "--device",
        "h100-sxm-80gb",
        "--num-devices",
        "1",
        "--isl",
        "512",
        "--osl",
        "128",
        "--tpot-ms",
        "0.1",
        "--json",
    )
    assert r.returncode == 2 and json.loads(r.stdout)["closest"]["min_tpot_ms"] > 0.1


@pytest.mark.parametrize(
    "args",
    [
        ["--isl", "0", "--osl", "10"],
        ["--isl", "10", "--osl", "10", "--concurrency", "4", "--offline"],
        ["--isl", "10", "--osl", "10", "--goodput", "1.5", "--tpot-ms", "10"],
        ["--isl", "10", "--osl", "10", "--goodput", "0.9"],
        ["--isl", "10", "--osl", "10", "--power-caps", "abc"],
    ],
)
def test_cli_bad_input_exits_2(args: list[str]) -> None:
    r = run_cli("serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "1", *args)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1


# ========================================================================================= accuracy
def test_published_serving_study_writes_one_record_per_row(tmp_path: Path) -> None:
    """The accuracy study runs end to end (its MAPE is a benchmark figure, printed, not asserted)."""
    out = tmp_path / "serving.json"
    r = subprocess.run(
        [sys.executable, "studies/published_serving.py", "--csv", str(DEV_CSV), "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["summary"]["rows"] == 43
    assert "MAPE" in r.stdout
    for rec in d["records"]:
        assert "skipped" in rec or {
            "run_id",
            "predicted_output_tokens_per_s",
            "measured_output_tokens_per_s",
        } <= set(rec)
