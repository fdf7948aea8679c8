"""Optuna studies: persistence and resume, recorded sampler/seed, constraints, cache, seeds, repair, kill-safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from autopar.errors import AutoparError
from autopar.layout import Layout, LayoutTable
from autopar.legality import Context, legality_mask
from autopar.objectives import Objectives
from autopar.prediction import predict, training_job
from autopar.search.recommend import recommend
from autopar.search.space import load_space
from autopar.search.study import StudyConfig, TrialSpace, _repair_split, load_report, run_study

JOB = dict(model="llama-3.1-8b", device="a100-80gb", num_devices=16, seq_len=4096, global_batch=64)
CLI_JOB = [
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


def _cfg(
    tmp_path: Path,
    name: str = "s",
    *,
    space: str = "default",
    objective: str = "throughput",
    sampler: str | None = "tpe",
    seed: int | None = 3,
    job: dict | None = None,
    **kw,
) -> StudyConfig:
    j = training_job(devices_per_node=None, **(job or JOB))
    return StudyConfig(
        name=name,
        job=j,
        space=load_space(space),
        objectives=Objectives.parse(objective),
        sampler=sampler,
        seed=seed,
        storage=str(tmp_path / "studies.log"),
        **kw,
    )


def _load(tmp_path: Path, name: str = "s"):
    from autopar.search.study import resolve_storage

    return optuna.load_study(study_name=name, storage=resolve_storage(str(tmp_path / "studies.log")))


def test_create_records_sampler_seed_job_and_seeds_topk(tmp_path: Path) -> None:
    rep = run_study(_cfg(tmp_path, seed_top_k=5), n_trials=30)
    assert rep.n_complete == 30 and not rep.resumed and rep.new_trials == 30
    study = _load(tmp_path)
    ua = study.user_attrs
    assert ua["sampler"] == "tpe" and ua["seed"] == 3 and ua["optuna_version"] == optuna.__version__
    assert ua["job"]["model"] == "llama-3.1-8b" and ua["objectives"] == ["throughput"]
    assert ua["space_fingerprint"] == load_space("default").fingerprint()
    assert ua["objective_names"] == ["tokens_per_s_per_device"]
    assert ua["seeded_top_k"] == 5
    # the first trials are the exhaustive top-5, in order, with the same numbers as recommend/predict
    top = recommend(**JOB, top=5, progress=False).results
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    for t, p in zip(trials[:5], top, strict=True):
        assert t.user_attrs["layout"] == p.layout.short()
        assert t.values[0] == pytest.approx(p.tokens_per_s_per_device, rel=1e-12)
        assert t.user_attrs["seed_trial"] == "exhaustive top-k"
    assert rep.best[0]["layout"] == top[0].layout.short()
    # every trial carries a constraint; infeasible ones have it > 0
    for t in trials:
        c = (
            t.system_attrs["constraints"]
            if "constraints" in t.system_attrs
            else [v for k, v in t.system_attrs.items() if k.startswith("constraints")]
        )
        assert c, t.system_attrs
        val = c[0] if isinstance(c, list) else c
        assert (val <= 0) == t.user_attrs["fits"]


def test_resume_continues_and_checks_the_recorded_setup(tmp_path: Path) -> None:
    run_study(_cfg(tmp_path), n_trials=20)
    rep = run_study(_cfg(tmp_path, sampler=None, seed=None), n_trials=45)
    assert rep.resumed and rep.n_complete == 45 and rep.new_trials == 25
    study = _load(tmp_path)
    sessions = study.user_attrs["sessions"]
    assert len(sessions) == 2 and sessions[1]["seed"] != sessions[0]["seed"]
    assert sessions[1]["complete_before"] == 20
    # a finished study does nothing more
    assert run_study(_cfg(tmp_path), n_trials=45).new_trials == 0
    with pytest.raises(AutoparError, match="created with job="):
        run_study(_cfg(tmp_path, job=dict(JOB, global_batch=128)), n_trials=50)
    with pytest.raises(AutoparError, match="uses sampler 'tpe', not 'random'"):
        run_study(_cfg(tmp_path, sampler="random"), n_trials=50)
    with pytest.raises(AutoparError, match="uses seed 3, not 4"):
        run_study(_cfg(tmp_path, seed=4), n_trials=50)
    with pytest.raises(AutoparError, match="created with objectives="):
        run_study(_cfg(tmp_path, objective="memory"), n_trials=50)


def test_cache_answers_repeated_proposals(tmp_path: Path) -> None:
    # a tiny space: many proposals repeat
    cfg = _cfg(tmp_path, sampler="random", seed_top_k=0)
    cfg.space = load_space(
        "default",
        ["tp=2,4", "pp=1,2", "cp=1", "zero=1", "recompute=none,full", "offload=false", "micro_batch=1"],
    )
    rep = run_study(cfg, n_trials=40)
    assert rep.n_cached > 10
    study = _load(tmp_path)
    by_key: dict[str, list] = {}
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        by_key.setdefault(t.user_attrs["key"], []).append(t.values)
    assert all(all(v == vs[0] for v in vs) for vs in by_key.values())
    # resuming rebuilds the cache from the storage: no new key is scored twice
    rep2 = run_study(cfg, n_trials=60)
    assert rep2.n_cached > rep.n_cached


def test_multi_objective_pareto_and_sqlite(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, objective="throughput,memory", sampler="nsga2")
    cfg.storage = str(tmp_path / "s.db")
    rep = run_study(cfg, n_trials=40)
    assert rep.objectives == ("throughput", "memory")
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert study.metric_names == ["tokens_per_s_per_device", "memory_gib_per_device"]  # dashboard labels
    vals = [(b["values"]["tokens_per_s_per_device"], b["values"]["memory_gib_per_device"]) for b in rep.best]
    for a in vals:  # no reported point dominates another
        assert not any(b[0] >= a[0] and b[1] <= a[1] and b != a for b in vals)
    assert load_report("s", str(tmp_path / "s.db")).n_complete == 40


def test_every_proposal_is_repaired_to_a_legal_layout(tmp_path: Path) -> None:
    job = dict(model="qwen3-30b-a3b", device="h100-sxm-80gb", num_devices=32, seq_len=4096, global_batch=64)
    cfg = _cfg(tmp_path, sampler="random", seed_top_k=0, job=job, space="moe")
    run_study(cfg, n_trials=40)
    j = training_job(devices_per_node=None, **job)
    ctx = Context.for_job(j)
    study = _load(tmp_path)
    lays = [Layout(**json.loads(t.user_attrs["key"])) for t in study.get_trials()]
    legal, bad = legality_mask(j.model, LayoutTable.from_layouts(lays), ctx)
    assert legal.all(), {k: int(v.sum()) for k, v in bad.items()}
    assert any(t.user_attrs["repaired"] for t in study.get_trials())
    # the numbers of a uniform trial are predict's
    t = study.get_trials()[0]
    lay = json.loads(t.user_attrs["key"])
    p = predict(**job, **{k: v for k, v in lay.items() if k not in ("grad_accum",)})
    assert t.values[0] == pytest.approx(p.tokens_per_s_per_device, rel=1e-12)


def test_uneven_space_trials_and_seeds(tmp_path: Path) -> None:
    job = dict(model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=64, seq_len=8192, global_batch=128)
    cfg = _cfg(tmp_path, space="uneven_pipeline", job=job, seed_top_k=3)
    rep = run_study(cfg, n_trials=25)
    study = _load(tmp_path)
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    for t in trials:
        k = json.loads(t.user_attrs["key"])
        assert sum(k["stage_layers"]) == 80 and len(k["stage_layers"]) == k["pp"] >= 2
        assert len(k["stage_recompute"]) == k["pp"]
    first = json.loads(trials[0].user_attrs["key"])
    assert (
        len(set(first["stage_layers"])) == 1 and len(set(first["stage_recompute"])) == 1
    )  # even, uniform seed
    assert rep.best and rep.best[0]["tokens_per_s_per_device"] > 0
    with pytest.raises(AutoparError, match="energy objective is not modeled"):
        run_study(_cfg(tmp_path, name="e", space="uneven_pipeline", job=job, objective="energy"), n_trials=2)


def test_uneven_trial_space_is_too_large_to_enumerate() -> None:
    j = training_job(
        model="llama-3.1-405b",
        device="h100-sxm-80gb",
        num_devices=1024,
        devices_per_node=None,
        seq_len=8192,
        global_batch=512,
    )
    ts = TrialSpace(j, load_space("uneven_pipeline"))
    per_stage = 17**15 * 3**16  # pp=16: 15 free shifts in [-8, 8], 16 recompute modes
    assert ts.enum.size * per_stage > 10**20
    assert "pp" in ts.params


def test_repair_split() -> None:
    layers, fixed = _repair_split([8] * 4, [3, 3, 3], 4)
    assert sum(layers) == 32 and all(4 <= x <= 12 for x in layers) and fixed
    layers, fixed = _repair_split([8] * 4, [1, -1, 0], 4)
    assert layers == [9, 7, 8, 8] and not fixed
    rng = np.random.default_rng(0)
    for _ in range(200):
        base = [int(x) for x in rng.integers(1, 10, size=int(rng.integers(2, 9)))]
        k = int(rng.integers(1, 6))
        shifts = [int(x) for x in rng.integers(-k, k + 1, size=len(base) - 1)]
        layers, _ = _repair_split(base, shifts, k)
        assert sum(layers) == sum(base)
        assert all(max(1, b - k) <= v <= b + k for b, v in zip(base, layers, strict=True))


def _study_cmd(storage: Path, n: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "autopar.cli",
        "study",
        "run",
        "--name",
        "killme",
        *CLI_JOB,
        "--storage",
        str(storage),
        "--n-trials",
        str(n),
        "--batch",
        "2",
        "--verbose",
        "--sampler",
        "tpe",
        "--seed",
        "1",
    ]


@pytest.mark.slow
def test_killing_a_running_study_loses_no_finished_trial(tmp_path: Path) -> None:
    storage = tmp_path / "kill.log"
    proc = subprocess.Popen(
        _study_cmd(storage, 100_000), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    finished: list[int] = []
    deadline = time.time() + 90
    assert proc.stdout is not None
    while len(finished) < 40 and time.time() < deadline:
        line = proc.stdout.readline()
        if line.startswith("trial "):
            finished.append(int(line.split()[1]))
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()  # reads and closes both pipes
    assert len(finished) >= 40, err
    from autopar.search.study import resolve_storage

    study = optuna.load_study(study_name="killme", storage=resolve_storage(str(storage)))
    complete = {t.number for t in study.get_trials(states=(TrialState.COMPLETE,))}
    assert set(finished) <= complete  # every trial reported finished is in the storage
    # --n-trials is the study's total of finished (complete, pruned, failed) and running trials
    target = len(study.get_trials(states=COUNTED)) + 10
    r = subprocess.run(_study_cmd(storage, target), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "resumed" in r.stdout
    study = optuna.load_study(study_name="killme", storage=resolve_storage(str(storage)))
    trials = study.get_trials()
    complete2 = {t.number for t in trials if t.state == TrialState.COMPLETE}
    assert complete <= complete2 and len([t for t in trials if t.state in COUNTED]) == target
    assert len(complete2) >= len(complete) + 10 - 1  # the resume ran its 10 (one may still be RUNNING)
    # the killed worker's tagged in-flight trials were failed; at most the one it had not tagged yet
    # (killed between ask() and tagging) is left RUNNING until it is 30 s old
    running = [t for t in trials if t.state == TrialState.RUNNING]
    assert len(running) <= 1 and all("worker" not in t.user_attrs for t in running)


COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)


@pytest.mark.slow
def test_two_processes_starting_the_same_new_study_share_it_and_its_total(tmp_path: Path) -> None:
    """Both starters succeed (one creates, the other joins once the study's attributes are written;
    never a false "created with job=None"), and --n-trials is the total across both."""
    storage = tmp_path / "race.log"
    cmd = [
        sys.executable,
        "-m",
        "autopar.cli",
        "study",
        "run",
        "--name",
        "race",
        *CLI_JOB,
        "--space",
        "uneven_pipeline",
        "--storage",
        str(storage),
        "--n-trials",
        "40",
        "--batch",
        "4",
        "--json",
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "created with" not in err
    reports = [json.loads(out) for out, _ in outs]
    assert sorted(r["resumed"] for r in reports) in ([False, True], [True, True])
    from autopar.search.study import resolve_storage

    study = optuna.load_study(study_name="race", storage=resolve_storage(str(storage)))
    trials = study.get_trials()
    assert len(trials) == 40 and all(t.state == TrialState.COMPLETE for t in trials)
    assert sum(r["new_trials"] for r in reports) == 40
    assert study.user_attrs["autopar_ready"] is True and len(study.user_attrs["sessions"]) == 2


def test_constraints_and_parameter_names_as_optuna_dashboard_reads_them(tmp_path: Path) -> None:
    from optuna.study._constrained_optimization import _CONSTRAINTS_KEY, _get_feasible_trials

    run_study(_cfg(tmp_path, space="uneven_pipeline", job={**JOB, "num_devices": 32}), n_trials=24)
    study = _load(tmp_path)
    done = study.get_trials(states=(TrialState.COMPLETE,))
    for t in done:  # the list optuna-dashboard shows; > 0 is infeasible, as the study's "fits" says
        (c,) = t.system_attrs[_CONSTRAINTS_KEY]
        assert (c <= 0) == t.user_attrs["fits"]
    assert {t.number for t in _get_feasible_trials(done)} == {t.number for t in done if t.user_attrs["fits"]}
    names = set().union(*(t.params for t in done))
    assert "stage0_layer_shift" in names and not any(n.startswith(("shift_", "recompute_")) for n in names)


def test_cli_show_list_and_errors(tmp_path: Path) -> None:
    storage = tmp_path / "cli.log"
    base = [sys.executable, "-m", "autopar.cli", "study"]
    r = subprocess.run(
        base + ["run", "--name", "c", *CLI_JOB, "--storage", str(storage), "--n-trials", "12", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["n_complete"] == 12 and d["sampler"] == "tpe" and d["seed"] == 0
    r = subprocess.run(
        base + ["show", "--name", "c", "--storage", str(storage)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "best feasible trials" in r.stdout and "sampler tpe seed 0" in r.stdout
    r = subprocess.run(
        base + ["list", "--storage", str(storage), "--json"], capture_output=True, text=True, timeout=60
    )
    assert json.loads(r.stdout)[0]["name"] == "c"
    r = subprocess.run(
        base + ["show", "--name", "nope", "--storage", str(storage)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no study named 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        base + ["run", "--name", "c", *CLI_JOB[:-1], "128", "--storage", str(storage)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "created with job=" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        base + ["list", "--storage", str(tmp_path / "missing.log")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no study storage" in r.stderr and not (tmp_path / "missing.log").exists()


def test_fail_stale_trials() -> None:
    import socket

    from autopar.search.study import fail_stale_trials

    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(), sampler=optuna.samplers.RandomSampler(0)
    )
    untagged = study.ask()
    live = study.ask()
    live.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
    dead = study.ask()
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead.set_user_attr("worker", f"{socket.gethostname()}:{proc.stdout.strip()}")
    assert fail_stale_trials(study) == 1  # the dead worker's trial only
    assert fail_stale_trials(study, untagged_after_s=0.0) == 1  # then the untagged one
    states = {t.number: t.state for t in study.get_trials()}
    assert states[dead.number] == states[untagged.number] == TrialState.FAIL
    assert states[live.number] == TrialState.RUNNING
