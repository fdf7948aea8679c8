"""The measured-latency anchor: published TTFT/TPOT rows, and the study that predicts them."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autopar.coefficients import load_calibration
from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import ServingTable, make_workload
from autopar.serving.search import serve

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "studies" / "data" / "serving_latency_runs.csv"
sys.path.insert(0, str(ROOT / "studies"))
import serving_latency as SL  # noqa: E402


def rows() -> list[dict[str, str]]:
    with CSV.open(newline="") as f:
        return list(csv.DictReader(f))


def test_csv_parses_and_every_row_is_sourced() -> None:
    rs = rows()
    assert len(rs) >= 20
    assert len({r["run_id"] for r in rs}) == len(rs)
    assert len({r["source"] for r in rs}) >= 2
    for r in rs:
        assert r["source_url"].startswith("https://"), r["run_id"]
        assert r["source_location"].strip(), r["run_id"]
        assert float(r["ttft_ms"]) > 0 and float(r["tpot_ms"]) > 0, r["run_id"]
        assert int(r["concurrency"]) >= 1 and int(r["isl"]) >= 1 and int(r["osl"]) >= 1, r["run_id"]
        assert int(r["num_devices"]) == int(r["tp"]) * int(r["pp"]), r["run_id"]
        assert r["ttft_stat"] and r["tpot_stat"], r["run_id"]
        load_model(r["model_preset"])
        load_device(r["device"])


def test_study_prints_finite_errors_for_every_predicted_row(tmp_path: Path) -> None:
    out = tmp_path / "lat.json"
    p = subprocess.run(
        [sys.executable, "studies/serving_latency.py", "--no-rows", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    import json

    d = json.loads(out.read_text())
    recs, s = d["records"], d["summary"]
    assert len(recs) == len(rows())
    done = [r for r in recs if "skipped" not in r]
    assert len(done) == s["rows"] and s["rows"] + s["skipped"] == len(recs)
    assert len(done) >= 20
    for r in done:
        for k in ("ttft_pred_ms", "tpot_pred_ms", "ttft_err", "tpot_err"):
            assert math.isfinite(r[k]), (r["run_id"], k)
        assert r["ttft_pred_ms"] > 0 and r["tpot_pred_ms"] > 0
    # every skip carries its reason and is printed
    for r in recs:
        if "skipped" in r:
            assert r["skipped"] and f"skipped {r['run_id']}" in p.stdout
    for metric in ("TTFT", "TPOT"):
        assert f"MAPE {metric}:" in p.stdout
        assert f"{metric} by device:" in p.stdout and f"{metric} by source:" in p.stdout
    assert math.isfinite(s["ttft_mape"]) and math.isfinite(s["tpot_mape"])
    assert set(s["by_source"]) == {r["source"] for r in rows()}
    assert set(s["by_concurrency"]) <= {name for _, _, name in SL.BUCKETS} and "conc 1" in s["by_concurrency"]


@pytest.mark.parametrize(
    ("run_id", "preset", "device", "n", "isl", "osl", "conc", "prec"),
    [
        # NIM docs, Llama 3.3 70B (the 3.1 70B architecture), 2 x H100 fp8 TP2, 5000/500, concurrency 1
        ("nimdoc-01", "llama-3.1-70b", "h100-sxm-80gb", 2, 5000, 500, 1, "fp8"),
        # DLI NIM dataset line 372: Llama 3 8B, 1 x H100 fp8, 2000/200, concurrency 50
        ("dli-372", "llama-3.1-8b", "h100-sxm-80gb", 1, 2000, 200, 50, "fp8"),
    ],
)
def test_row_prediction_is_what_autopar_serve_gives(run_id, preset, device, n, isl, osl, conc, prec) -> None:
    row = next(r for r in rows() if r["run_id"] == run_id)
    assert (row["model_preset"], row["device"], int(row["tp"])) == (preset, device, n)
    assert (int(row["isl"]), int(row["osl"]), int(row["concurrency"]), row["precision"]) == (
        isl,
        osl,
        conc,
        prec,
    )
    rec = SL.prepare(row)
    assert "skipped" not in rec
    for arrival in ("lockstep", "staggered"):
        got = SL.predict(rec, load_calibration(), arrival=arrival)
        res = serve(
            model=preset, device=device, num_devices=n, isl=isl, osl=osl, concurrency=conc, tp=n,
            weight_precision=prec, top=1, arrival=arrival,
        )  # fmt: skip
        best = res.results[0]
        assert (best["tp"], best["pp"], best["replicas"], best["concurrency_per_instance"]) == (n, 1, 1, conc)
        assert got["ttft_pred_ms"] == pytest.approx(best["ttft_ms"], rel=1e-9)
        assert got["tpot_pred_ms"] == pytest.approx(best["tpot_ms"], rel=1e-9)


def test_rows_beyond_the_kv_cache_are_skipped_with_the_reason() -> None:
    """NIM docs, 5000/500 on 2 x H100 fp8 TP2: the model holds 97 sequences, so concurrency 100+ is
    skipped (the measured TTFT jumps from 0.83 s at 50 to 8.0 s at 100 there: the runtime queues)."""
    recs = {r["run_id"]: SL.prepare(r) for r in rows() if r["run_id"].startswith("nimdoc-0")}
    cal = load_calibration()
    assert "skipped" not in SL.predict(recs["nimdoc-04"], cal)  # concurrency 50
    out = SL.predict(recs["nimdoc-05"], cal)  # concurrency 100
    assert "KV cache" in out["skipped"]


def test_prepare_refuses_an_unmodeled_row() -> None:
    row = dict(rows()[0])
    assert "skipped" not in SL.prepare(row)
    assert "precision" in SL.prepare(row | {"precision": "fp6"})["skipped"]
    assert "concurrency" in SL.prepare(row | {"concurrency": ""})["skipped"]
    assert "no backend profile" in SL.prepare(row | {"stack": "llama.cpp"})["skipped"]


def test_mean_ceil_is_exact_for_small_waves_and_close_beyond() -> None:
    from autopar.serving.estimate import LOCKSTEP_EXACT, mean_ceil

    rng = np.random.default_rng(0)
    x = rng.uniform(0.05, 3.0, 200)
    B = rng.integers(1, 3 * LOCKSTEP_EXACT, 200)
    got = mean_ceil(x, B)
    for xi, bi, gi in zip(x, B, got, strict=True):
        exact = np.mean([math.ceil(k * xi - 1e-9) for k in range(1, bi + 1)])
        if bi <= LOCKSTEP_EXACT:
            assert gi == pytest.approx(exact, rel=1e-12)
        else:
            assert abs(gi - exact) < 0.5


def _lockstep(conc: int, isl: int, **kw):
    from autopar.serving.estimate import lockstep_ttft, make_context, steady_state

    w = make_workload(isl=isl, osl=200, concurrency=conc, arrival="lockstep", weight_precision="fp8", **kw)
    ctx = make_context(load_model("llama-3.1-8b"), load_device("h100-sxm-80gb"), w, devices_per_node=8)
    tab = ServingTable({"tp": 1, "pp": 1, "ep": 1, "conc": conc})
    budget = np.array([8192.0])
    return (
        ctx,
        tab,
        lockstep_ttft(ctx, tab, np.array([float(conc)]), budget=budget)[0],
        steady_state(ctx, tab, np.array([float(conc)]), budget=budget),
    )


def test_lockstep_ttft_queues_the_wave_behind_one_another() -> None:
    # one request: the prompt's own prefill, as in the steady state (no other request shares it)
    _, _, one, ss = _lockstep(1, 2000)
    assert one == pytest.approx(float(ss["ttft"][0]), rel=0.05)
    # 4 prompts of 2000 tokens fit one 8192-token iteration: all first tokens come with it
    _, _, four, _ = _lockstep(4, 2000)
    assert one < four < 4 * one
    # 40 prompts of 4096 tokens, two per iteration: the k-th waits ceil(k/2) iterations, mean 10.5
    _, _, forty, _ = _lockstep(40, 4096)
    _, _, two, _ = _lockstep(2, 4096)
    assert forty / two == pytest.approx(10.5, rel=0.15)  # the iterations slow a little as decodes join


def test_lockstep_is_refused_with_a_request_rate() -> None:
    with pytest.raises(AutoparError, match="lockstep"):
        make_workload(isl=100, osl=100, request_rate=2.0, arrival="lockstep")
