"""Hardware what-if (autopar.whatif.sweep, ``autopar whatif``): the demand model against the engine."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from autopar.engine import step_breakdown, time_model
from autopar.errors import AutoparError
from autopar.prediction import training_job
from autopar.whatif.sweep import (
    RATES,
    RESOURCES,
    _best_at,
    _factors,
    _scaled,
    decompose,
    engine_times,
    parse_vary,
    sensitivity,
    step_times,
    sweep,
    what_would_it_take,
)

JOB = dict(device="h100-sxm-80gb", model="llama-3.1-8b", num_devices=64, seq_len=4096, global_batch=256)


@pytest.fixture(scope="module")
def dec():
    return decompose(training_job(**JOB))


def _engine(dec, scales: dict[str, float]) -> np.ndarray:
    co, links = time_model(dec.job, dec.calibration)
    for r, f in scales.items():
        co, links = _scaled(co, links, r, f)
    return step_breakdown(dec.job, dec.enum.table(dec.ids), co=co, links=links)["step_time"]


def _model(dec, scales: dict[str, float]) -> np.ndarray:
    pts = {r: np.array([dec.base[r] * f]) for r, f in scales.items()}
    return step_times(dec, _factors(dec, pts, 1))[0]


def test_parse_vary():
    a = parse_vary("memory_bw_gbps=2000:8000:7")
    assert a.field == "memory_bw_gbps" and len(a.values) == 7 and a.values[-1] == 8000
    assert list(parse_vary("scale_up.domain=8,72").values) == [8, 72]
    for bad in (
        "bogus=1:2:3",
        "memory_bw_gbps",
        "memory_bw_gbps=3:1:2",
        "memory_bw_gbps=1:2",
        "memory_gb=-1",
        "scale_up.domain=7.5",
        "memory_bw_gbps=a,b",
    ):
        with pytest.raises(AutoparError):
            parse_vary(bad)


@pytest.mark.parametrize(
    "res", ["memory_bw_gbps", "peak_tflops.bf16", "scale_up.agg_gbps", "scale_out.latency_us"]
)
def test_model_is_exact_at_base_and_each_doubling(dec, res):
    assert np.allclose(_model(dec, {}), dec.t_base)
    assert np.allclose(_model(dec, {res: 2.0}), _engine(dec, {res: 2.0}), rtol=1e-9)


def test_model_close_to_engine_between_the_points(dec):
    rng = np.random.default_rng(1)
    fit = dec.memory <= dec.base["memory_gb"] * 1e9 * (1 - dec.job.memory_headroom)
    for _ in range(5):
        sc = {r: float(rng.uniform(0.6, 1.8)) for r in RESOURCES if r in dec.base}
        ex, mo = _engine(dec, sc), _model(dec, sc)
        i = int(np.argmin(np.where(fit, mo, np.inf)))
        assert mo[i] == pytest.approx(ex[i], rel=0.1)  # the chosen layout's step time
        assert ex[i] <= 1.05 * np.min(np.where(fit, ex, np.inf))  # and it is near the engine's best


def test_sweep_grid_and_memory_axis():
    job = training_job(**JOB)
    r = sweep(job, [parse_vary("memory_bw_gbps=1000,3350,8000"), parse_vary("memory_gb=20,80")])
    assert r["n_points"] == 6 and r["evaluations"] == 6 * r["n_layouts"]
    t = r["step_time_s"].reshape(3, 2)
    assert np.all(np.diff(t, axis=0) <= 1e-12)  # more bandwidth never slower
    assert np.all(t[:, 1] <= t[:, 0])  # more memory never slower (more layouts fit)
    assert set(r["bound"]) <= set(RESOURCES)


def test_sensitivity_and_what_would_it_take(dec):
    s = sensitivity(dec)
    assert -1.0 <= s["peak_tflops.bf16"] < 0
    assert min((k for k in s if k in RATES), key=s.__getitem__) == "peak_tflops.bf16"
    now = _best_at(dec, {})
    take = what_would_it_take(dec, 0.9 * now)
    f = take["peak_tflops.bf16"]
    assert f is not None and f > 1
    assert _best_at(dec, {"peak_tflops.bf16": f}) <= 0.9 * now
    assert _best_at(dec, {"peak_tflops.bf16": f / 1.01}) > 0.9 * now
    assert what_would_it_take(dec, 1e-6)["memory_bw_gbps"] is None  # unreachable by one resource


def test_engine_times_rows_carry_their_own_hardware(dec):
    rng = np.random.default_rng(2)
    rows = rng.integers(0, len(dec.ids), 6)
    sc = rng.uniform(0.5, 2.0, (6, len(RESOURCES)))
    vec = engine_times(dec, rows, sc)
    for i in range(6):
        one = _engine(dec, dict(zip(RESOURCES, sc[i], strict=True)))[rows[i]]
        assert vec[i] == pytest.approx(one, rel=1e-12)


def test_sweep_answer_is_the_engines_best(dec):
    job = training_job(**JOB)
    r = sweep(job, [parse_vary("memory_bw_gbps=1500,6000"), parse_vary("scale_out.per_device_gbps=10,100")])
    fit = dec.memory <= dec.base["memory_gb"] * 1e9 * (1 - job.memory_headroom)
    for i in range(r["n_points"]):
        sc = {f: r["points"][f][i] / dec.base[f] for f in r["points"]}
        ex = _engine(dec, sc)
        best = float(np.min(np.where(fit, ex, np.inf)))
        assert best <= r["step_time_s"][i] <= best * 1.02  # screened, then the engine's figure


def _cli(*args: str) -> subprocess.CompletedProcess:
    base = [
        "--model",
        "llama-3.1-8b",
        "--device",
        "h100-sxm-80gb",
        "--num-devices",
        "64",
        "--seq-len",
        "4096",
        "--global-batch",
        "256",
    ]
    return subprocess.run(
        [sys.executable, "-m", "autopar", "whatif", *base, *args], capture_output=True, text=True, timeout=300
    )


def test_cli_json_and_bad_input():
    r = _cli("--vary", "memory_bw_gbps=2000:4000:3", "--target-step-time", "0.1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["n_points"] == 3 and len(d["points"]) == 3
    assert set(d["sensitivity"]) == set(RESOURCES)
    r = _cli("--vary", "hbm=1:2:3")
    assert (
        r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "unknown hardware field" in r.stderr
    )
    r = _cli("--vary", "scale_up.domain=7")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_domain_axis_reenumerates():
    job = training_job(**JOB)
    r = sweep(job, [parse_vary("scale_up.domain=4,8")])
    assert set(r["decompositions"]) == {4, 8}
    assert r["evaluations"] == sum(len(d.ids) for d in r["decompositions"].values())
    assert np.all(np.isfinite(r["step_time_s"]))
    assert r["decompositions"][4].job.devices_per_node == 4
