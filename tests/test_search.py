"""recommend(): exact agreement with predict, never beaten by brute force, objectives, Pareto, infeasibility, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from autopar.coefficients import load_calibration
from autopar.engine import evaluate
from autopar.errors import InfeasibleError
from autopar.objectives import Objectives, pareto_mask
from autopar.prediction import predict, training_job
from autopar.search.enumerate import enumerate_space
from autopar.search.recommend import explain_choice, recommend
from autopar.search.space import load_space

DENSE = dict(model="llama-3.1-8b", device="a100-80gb", num_devices=16, seq_len=4096, global_batch=64)
MOE = dict(model="qwen3-30b-a3b", device="h100-sxm-80gb", num_devices=32, seq_len=4096, global_batch=64)
SMALL = [
    (DENSE, []),
    (dict(model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=32, seq_len=8192, global_batch=64), []),
    (MOE, ["precision=bf16,fp8"]),
    (
        dict(model="mixtral-8x7b", device="a100-80gb", num_devices=16, seq_len=4096, global_batch=32),
        ["shard_group=0,2,4", "sp=both"],
    ),
]
LAYOUT_KEYS = (
    "tp",
    "pp",
    "vpp",
    "dp",
    "cp",
    "ep",
    "etp",
    "zero",
    "shard_group",
    "sp",
    "micro_batch",
    "recompute",
    "offload",
    "precision",
)


def _predict_again(job: dict, pred) -> dict:
    lay = pred.layout.model_dump()
    return predict(**job, **{k: lay[k] for k in LAYOUT_KEYS}).to_dict()


@pytest.mark.parametrize(("job", "sets"), SMALL)
def test_predict_reproduces_recommended_layouts_exactly(job, sets) -> None:
    res = recommend(**job, top=5, overrides=sets, progress=False)
    assert len(res.results) == 5
    for p in res.results:
        assert p.fits
        assert _predict_again(job, p) == p.to_dict()  # every number, bit for bit


def _all_scores(job: dict, sets: list[str]):
    j = training_job(devices_per_node=None, **job)
    en = enumerate_space(j, load_space("default", sets))
    cal = load_calibration()
    res = evaluate(
        j, en.table(en.legal_ids()), calibration=cal
    )  # flat, with the legality check: predict's path
    return en, res


@pytest.mark.parametrize(("job", "sets"), SMALL)
def test_top1_is_never_beaten_by_any_legal_layout(job, sets) -> None:
    """Brute force: score every legal layout of the space as a flat table (what predict does per layout)."""
    en, res = _all_scores(job, sets)
    assert res["legal"].all()
    fits = res["fits"]
    for objective, key in (
        ("throughput", "step_time_s"),
        ("memory", "memory_bytes"),
        ("energy", "energy_j_per_step"),
    ):
        r = recommend(**job, top=3, objective=objective, overrides=sets, progress=False)
        assert r.layouts_enumerated == en.size == len(fits)
        assert r.layouts_feasible == int(fits.sum())
        assert r.infeasible_by_reason["out_of_memory"] == int((~fits).sum())
        best = res[key][fits].min()
        top1 = {
            "step_time_s": r.results[0].step_time_s,
            "memory_bytes": r.results[0].memory_gib_per_device * 2**30,
            "energy_j_per_step": r.results[0].energy_j_per_step,
        }[key]
        assert top1 <= best * (1 + 1e-12)
        values = [
            getattr(
                p,
                {
                    "step_time_s": "step_time_s",
                    "memory_bytes": "memory_gib_per_device",
                    "energy_j_per_step": "energy_j_per_step",
                }[key],
            )
            for p in r.results
        ]
        assert values == sorted(values)
    # and a sample of layouts through predict() itself never beats top-1
    r = recommend(**job, top=1, overrides=sets, progress=False)
    rng = np.random.default_rng(1)
    table = en.table(en.legal_ids())
    for i in rng.choice(len(table), size=15, replace=False):
        lay = table.row(int(i)).model_dump()
        p = predict(**job, **{k: lay[k] for k in LAYOUT_KEYS})
        assert not p.fits or p.step_time_s >= r.results[0].step_time_s


def test_cost_objective_and_prices() -> None:
    r = recommend(**DENSE, top=2, objective="cost", price_per_device_hour=3.0, progress=False)
    t = recommend(**DENSE, top=2, objective="throughput", progress=False)
    # on a fixed cluster device-hours are proportional to step time: the same winner
    assert r.results[0].layout == t.results[0].layout
    c = r.objective_report(r.results[0])["cost_usd_per_million_tokens"]
    tokens = DENSE["seq_len"] * DENSE["global_batch"]
    assert c == pytest.approx(r.results[0].step_time_s * 16 * 3.0 / 3600 / tokens * 1e6)
    d = r.to_dict()
    assert (
        d["price_per_device_hour"] == 3.0
        and d["results"][0]["objectives"]["cost_usd_per_million_tokens"] == c
    )


def test_pareto_front_is_exact() -> None:
    job, sets = SMALL[1]
    en, res = _all_scores(job, sets)
    r = recommend(**job, objective="throughput,memory", overrides=sets, progress=False)
    assert r.pareto and r.pareto_size == len(r.pareto)
    fits = res["fits"]
    pts = np.stack([res["step_time_s"][fits], res["memory_bytes"][fits]], axis=1)
    front = np.array([[p.step_time_s, p.memory_gib_per_device * 2**30] for p in r.pareto])
    # no front member is dominated by any fitting layout ...
    for f in front:
        dominated = np.all(pts <= f * (1 + 1e-12), axis=1) & np.any(pts < f * (1 - 1e-12), axis=1)
        assert not dominated.any()
    # ... and every fitting layout is weakly dominated by some front member
    covered = np.zeros(len(pts), dtype=bool)
    for f in front:
        covered |= np.all(f <= pts * (1 + 1e-12), axis=1)
    assert covered.all()
    assert [p.step_time_s for p in r.pareto] == sorted(p.step_time_s for p in r.pareto)
    assert "pareto" in r.to_dict() and r.to_dict()["pareto_size"] == r.pareto_size


def test_pareto_mask_three_objectives() -> None:
    rng = np.random.default_rng(0)
    v = rng.random((400, 3))
    v[10] = v[11]  # identical rows: keep one
    keep = pareto_mask(v, np.arange(400))
    for i in range(400):
        dom = np.all(v <= v[i], axis=1) & np.any(v < v[i], axis=1)
        assert keep[i] == (not dom.any() and not (i == 11 and keep[10]))


def test_workers_give_identical_results() -> None:
    a = recommend(**MOE, top=5, overrides=["precision=bf16,fp8"], progress=False, workers=1)
    b = recommend(**MOE, top=5, overrides=["precision=bf16,fp8"], progress=False, workers=2)
    assert b.backend == "processes"
    assert [p.to_dict() for p in a.results] == [p.to_dict() for p in b.results]
    assert a.infeasible_by_reason == b.infeasible_by_reason


def test_nothing_fits_names_closest_and_a_fix() -> None:
    with pytest.raises(InfeasibleError) as e:
        recommend(
            model="llama-3.1-70b",
            device="h100-sxm-80gb",
            num_devices=8,
            seq_len=8192,
            global_batch=16,
            overrides=["recompute=none", "zero=0", "offload=false"],
            progress=False,
        )
    msg = str(e.value)
    assert "none of the" in msg and "Closest:" in msg and "needs" in msg
    assert "What would fit:" in msg
    with pytest.raises(InfeasibleError) as e:
        recommend(
            model="llama-3.1-405b",
            device="a100-40gb",
            num_devices=8,
            seq_len=8192,
            global_batch=8,
            progress=False,
        )
    assert "devices" in str(e.value)


def test_no_legal_layout_names_the_rule() -> None:
    with pytest.raises(InfeasibleError, match="no legal layout.*batch"):
        recommend(
            model="llama-3.1-8b",
            device="a100-80gb",
            num_devices=7,
            seq_len=4096,
            global_batch=8,
            progress=False,
        )


def test_bad_arguments() -> None:
    from autopar.errors import AutoparError

    with pytest.raises(AutoparError, match="unknown objective 'speed'"):
        recommend(**DENSE, objective="speed", progress=False)
    with pytest.raises(AutoparError, match="top must be a positive integer"):
        recommend(**DENSE, top=0, progress=False)
    with pytest.raises(AutoparError, match="uneven pipeline"):
        recommend(**DENSE, space="uneven_pipeline", progress=False)


def test_explanation_names_the_component() -> None:
    r = recommend(**SMALL[1][0], top=2, progress=False)
    s = r.why()
    assert r.results[0].layout.short() in s and r.results[1].layout.short() in s
    assert "runner-up" in s
    s2 = explain_choice(r.results[1], r.results[0], "memory")
    assert "memory per device" in s2


def test_a_lead_within_the_expected_error_is_a_tie() -> None:
    from dataclasses import replace

    r = recommend(**SMALL[1][0], top=2, progress=False)
    a, b = r.results[0], r.results[1]
    assert a.expected_error is not None
    r.results[0] = replace(a, expected_error=replace(a.expected_error, p90=0.5))
    s = r.why()
    assert s.startswith("a tie:") and "+-50% expected error" in s and "memory headroom" in s
    assert a.layout.short() in s and b.layout.short() in s
    r.results[0] = replace(a, expected_error=replace(a.expected_error, p90=0.0))
    assert "tie" not in r.why() and "beats the runner-up" in r.why()


def test_objectives_parse() -> None:
    o = Objectives.parse("throughput, memory")
    assert o.names == ("throughput", "memory") and o.primary == "throughput"
    assert Objectives.parse(["cost"], price_per_device_hour=1.5).price_per_device_hour == 1.5


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autopar.cli", *args], capture_output=True, text=True, timeout=120
    )


JOB_ARGS = [
    "--model",
    "llama-3.1-8b",
    "--device",
    "a100-80gb",
    "--num-devices",
    "16",
    "--seq-len",
    "4096",
    "--global-batch",
    "64",
]


def test_cli_json_contract() -> None:
    r = _cli("recommend", *JOB_ARGS, "--top", "3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) >= {"layouts_enumerated", "layouts_feasible", "infeasible_by_reason", "results"}
    assert len(d["results"]) == 3 and d["infeasible_by_reason"]["out_of_memory"] >= 0
    rec = d["results"][0]
    for k in LAYOUT_KEYS + (
        "step_time_s",
        "tokens_per_s_per_device",
        "mfu",
        "memory_gib_per_device",
        "time_breakdown",
        "memory_breakdown",
        "exposed_comm_fraction",
        "fits",
        "reasons",
    ):
        assert k in rec
    same = predict(**DENSE, **{k: rec[k] for k in LAYOUT_KEYS}).to_dict()
    assert json.loads(json.dumps(same, default=float)) == {
        k: v for k, v in rec.items() if k not in ("rank", "objectives")
    }


def test_cli_human_output_and_impossible_request() -> None:
    r = _cli("recommend", *JOB_ARGS, "--top", "2", "--set", "tp=1,2", "--objective", "throughput,memory")
    assert r.returncode == 0, r.stderr
    assert "top 2 by throughput" in r.stdout and "Pareto front" in r.stdout and "why:" in r.stdout
    assert "legal layouts" in r.stdout
    r = _cli(
        "recommend",
        "--model",
        "llama-3.1-405b",
        "--device",
        "a100-40gb",
        "--num-devices",
        "8",
        "--seq-len",
        "8192",
        "--global-batch",
        "8",
    )
    assert r.returncode == 2
    assert r.stderr.startswith("error: none of the") and "Traceback" not in r.stderr
    r = _cli("recommend", *JOB_ARGS, "--objective", "speed")
    assert r.returncode == 2 and "unknown objective" in r.stderr


@pytest.mark.parametrize(
    ("job", "sets", "objective"),
    [
        (MOE, ["precision=bf16,fp8"], "throughput,memory,energy"),
        (
            dict(model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=8, seq_len=8192, global_batch=16),
            ["recompute=none", "zero=0", "offload=false"],
            "throughput",
        ),  # nothing fits: closest misses
    ],
)
def test_grid_summary_equals_flat_summary(job, sets, objective) -> None:
    from autopar.search.recommend import ScoringState, merge, run_scoring, score_ids

    j = training_job(devices_per_node=None, **job)
    en = enumerate_space(j, load_space("default", sets))
    obj = Objectives.parse(objective)
    st = ScoringState(en, load_calibration(), obj, 5)
    grid, _, _ = run_scoring(st, workers=1)
    ids = en.legal_ids()
    flat = merge(
        [score_ids(st, ids[i : i + 50_000]) for i in range(0, len(ids), 50_000)],
        k=5,
        pareto=len(obj.names) > 1,
    )
    assert (grid.n_legal, grid.n_fit) == (flat.n_legal, flat.n_fit)
    for f in ("top_ids", "top_keys", "front_ids", "front_vals", "close_ids", "close_ratio"):
        assert np.array_equal(getattr(grid, f), getattr(flat, f)), f
