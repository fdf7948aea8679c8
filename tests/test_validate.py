"""autopar validate: layout sources, failed runs recorded without stopping the others, the figures,
study attachment, the refit, and a small real run at world size 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from autopar.calibration.calibrate import fit_microbenchmarks, write_calibration_atomic, write_profile_atomic
from autopar.calibration.validate import (
    Item,
    attach_predictions,
    attach_to_study,
    load_layouts_file,
    load_study_layouts,
    refit_calibration,
    run_items,
    study_measurements,
    summarize,
)
from autopar.cli import main
from autopar.coefficients import load_calibration
from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.job import Job
from autopar.layout import Layout, resolve_layout
from autopar.model import load_model
from autopar.runner import RunnerModelConfig

TINY = {"name": "tiny", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 128}
SEQ, BATCH = 16, 4


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A local device profile + calibration at world size 2 (fitted to synthetic microbenchmarks)."""
    from test_calibrate import synthetic_raw

    d = tmp_path_factory.mktemp("cal")
    fit = fit_microbenchmarks(synthetic_raw(world=2), name="test-cpu-w2")
    prof = write_profile_atomic(fit.profile, d / "test-cpu-w2.device.yaml")
    cal = write_calibration_atomic(fit.calibration, d / "test-cpu-w2.yaml")
    model = d / "tiny.json"
    model.write_text(json.dumps(TINY))
    return {"dir": d, "device": prof, "calibration": cal, "model": model}


def lay(**kw) -> Layout:
    return resolve_layout(num_devices=2, global_batch=BATCH, precision="fp32", **kw)


# ------------------------------------------------------------------------------------- sources
def test_sources_recommend_json_list_and_job_file(tmp_path):
    rec = {
        "results": [
            {
                **lay(tp=2).model_dump(),
                "model": "tiny.json",
                "device": "x.yaml",
                "num_devices": 2,
                "devices_per_node": 2,
                "seq_len": 16,
                "global_batch": 4,
                "step_time_s": 0.5,
                "memory_gib_per_device": 0.1,
                "rank": 1,
            }
        ]
    }
    p = tmp_path / "rec.json"
    p.write_text(json.dumps(rec))
    src = load_layouts_file(p)
    assert src.kind == "recommend" and src.job["seq_len"] == 16 and src.items[0].layout == lay(tp=2)
    assert src.items[0].source_prediction["step_time_s"] == 0.5
    p2 = tmp_path / "lays.yaml"
    p2.write_text(yaml.safe_dump({"job": {"model": "m"}, "layouts": [{"layout": lay(dp=2).model_dump()}]}))
    src2 = load_layouts_file(p2)
    assert src2.job == {"model": "m"} and src2.items[0].layout.dp == 2
    p3 = tmp_path / "list.json"
    p3.write_text(json.dumps([lay(dp=2, zero=3).model_dump()]))
    assert load_layouts_file(p3).items[0].layout.zero == 3
    for text, match in (
        ("{oops", "not valid JSON"),
        ("[]", "no layouts"),
        ('[{"color": 1}]', r"unknown key 'color' \(allowed keys: tp, pp"),
        ('[{"rank": 1}]', "no layout fields"),
        ('[{"tp": 0}]', "entry 0: tp: Input should be greater than or equal to 1"),
        ('"x"', "expected a list"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(AutoparError, match=match):
            load_layouts_file(bad)
    with pytest.raises(AutoparError, match="does not exist"):
        load_layouts_file(tmp_path / "missing.json")


# ------------------------------------------------------------------------------------- failures
def _ok(layout: Layout, t: float = 0.1) -> dict:
    return {
        "status": "ok",
        "median_step_time_s": t,
        "step_times_s": [t] * 3,
        "peak_memory_bytes": [2**20, 2**21],
        "losses": [5.0, 4.0],
        "layout": layout.model_dump(),
    }


def test_a_crashed_or_hung_launch_is_retried_one_layout_at_a_time():
    cfg = RunnerModelConfig.from_model_spec(load_model(TINY))
    layouts = [lay(dp=2), lay(tp=2), lay(dp=2, zero=3), lay(pp=2, micro_batch=4)]  # the last: 1F1B needs 2 mb
    calls = {"batch": 0, "single": []}

    def run_batch(lays, model, **kw):
        calls["batch"] += 1
        assert kw["timeout_s"] == pytest.approx(10 * len(lays) + 10)
        return [
            {"status": "failed", "error": "timed out after 30 s", "returncode": -9, "timed_out": True}
        ] * len(lays)

    def run_single(layout, model, **kw):
        calls["single"].append(layout.short())
        if layout.tp == 2:
            return {"status": "failed", "error": "timed out after 10 s", "returncode": -9, "timed_out": True}
        return _ok(layout)

    recs = run_items(
        [Item(x) for x in layouts],
        cfg,
        seq_len=SEQ,
        global_batch=BATCH,
        timeout_s=10,
        batch_size=8,
        run_batch=run_batch,
        run_single=run_single,
    )
    assert [r["status"] for r in recs] == ["ok", "failed", "ok", "failed"]
    assert recs[1]["error"].startswith("timed out") and recs[1]["timed_out"]
    assert "refused by the runner" in recs[3]["error"] and "1F1B" in recs[3]["error"]
    assert calls["batch"] == 1 and len(calls["single"]) == 3  # the refused layout never launched
    assert recs[0]["measured_peak_memory_gib"] == pytest.approx(2**21 / 2**30)


def test_a_layout_that_fails_inside_a_launch_does_not_stop_the_others():
    cfg = RunnerModelConfig.from_model_spec(load_model(TINY))

    def run_batch(lays, model, **kw):
        return [_ok(x) if x.tp == 1 else {"status": "failed", "error": "RuntimeError: boom"} for x in lays]

    def run_single(layout, model, **kw):  # pragma: no cover - must not be needed
        raise AssertionError("no retry: the launch itself succeeded")

    recs = run_items(
        [Item(lay(dp=2)), Item(lay(tp=2)), Item(lay(dp=2, zero=2))],
        cfg,
        seq_len=SEQ,
        global_batch=BATCH,
        run_batch=run_batch,
        run_single=run_single,
    )
    assert [r["status"] for r in recs] == ["ok", "failed", "ok"] and recs[1]["error"] == "RuntimeError: boom"


# ------------------------------------------------------------------------------------- figures
def test_summary_figures():
    recs = []
    for i, (p, m) in enumerate([(1.0, 1.1), (2.0, 1.8), (3.0, 3.3), (0.9, 1.2)]):
        recs.append(
            {
                "status": "ok",
                "layout_short": f"L{i}",
                "predicted_step_time_s": p,
                "measured_step_time_s": m,
                "predicted_peak_memory_gib": 1.0,
                "measured_peak_memory_gib": 1.0 + 0.1 * i,
            }
        )
    recs.append({"status": "failed", "layout_short": "bad", "error": "x"})
    s = summarize(recs)
    assert s["n_ok"] == 4 and s["n_failed"] == 1
    want = np.mean([abs(1 / 1.1 - 1), abs(2 / 1.8 - 1), abs(3 / 3.3 - 1), abs(0.9 / 1.2 - 1)])
    assert s["step_time_mape"] == pytest.approx(want)
    assert s["spearman"] == pytest.approx(0.8)
    assert s["predicted_best"] == "L3" and s["measured_best"] == "L0"
    assert s["top1_regret"] == pytest.approx(1.2 / 1.1)
    assert s["memory_max_abs_error"] == pytest.approx(1 - 1 / 1.3)


# ------------------------------------------------------------------------------------- studies
def _study_with_trials():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.set_user_attr(
        "job",
        {
            "model": "tiny.json",
            "device": "x.yaml",
            "num_devices": 2,
            "devices_per_node": 2,
            "seq_len": SEQ,
            "global_batch": BATCH,
        },
    )
    for i, (layout, t) in enumerate([(lay(dp=2), 0.2), (lay(tp=2), 0.1), (lay(dp=2, zero=3), 0.3)]):
        tr = study.ask()
        tr.set_user_attr("key", json.dumps(layout.model_dump(), sort_keys=True))
        tr.set_user_attr("result", {"step_time_s": t, "memory_gib_per_device": 0.01})
        tr.set_user_attr("fits", True)
        study.tell(tr, 1.0 / t)
        del i
    running = study.ask()
    running.set_user_attr("key", json.dumps(lay(dp=2, zero=1).model_dump(), sort_keys=True))
    return study, storage, running


def test_study_layouts_and_attachment():
    study, storage, running = _study_with_trials()
    src = load_study_layouts("s", storage, top=2)
    assert [it.layout for it in src.items] == [lay(tp=2), lay(dp=2)]  # best predicted first
    assert [it.trial for it in src.items] == [1, 0] and src.job["seq_len"] == SEQ
    recs = [
        {
            "trial": 1,
            "status": "ok",
            "layout_short": "a",
            "measured_step_time_s": 0.15,
            "measured_peak_memory_gib": 0.02,
            "predicted_step_time_s": 0.1,
        },
        {"trial": 0, "status": "failed", "layout_short": "b", "error": "timed out"},
        {"trial": running.number, "status": "ok", "layout_short": "c", "measured_step_time_s": 0.3},
    ]
    n = attach_to_study(study, recs, summarize(recs))
    assert n == 3
    got = study_measurements(study)
    assert (
        got[1]["measured_step_time_s"] == 0.15
        and got[0]["status"] == "failed"
        and got[0]["error"] == "timed out"
    )
    assert "validation.summary" in study.user_attrs
    t = study._storage.get_trial(running._trial_id)
    assert t.user_attrs["measured_step_time_s"] == 0.3 and t.user_attrs["validation_status"] == "ok"
    with pytest.raises(AutoparError, match="no study named"):
        load_study_layouts("nope", storage)


# ------------------------------------------------------------------------------------- refit
def test_refit_recovers_the_overhead_and_writes_a_valid_file(local, tmp_path):
    job = Job.from_flat(
        model=str(TINY),
        device=str(local["device"]),
        num_devices=2,
        devices_per_node=2,
        seq_len=SEQ,
        global_batch=BATCH,
    ).resolve(model=load_model(TINY), device=load_device(local["device"]))
    base = load_calibration(local["calibration"])
    truth = base.model_copy(
        update={"global_": {**base.global_, "kernel_overhead_us": 9000.0, "fragmentation": 0.3}}
    )
    layouts = [
        lay(dp=2),
        lay(tp=2),
        lay(dp=2, zero=3),
        lay(pp=2, micro_batch=1),
        lay(dp=2, recompute="full"),
        lay(tp=2, micro_batch=1),
        lay(dp=2, zero=1, micro_batch=1),
    ]
    recs = [{"layout": x.model_dump(), "layout_short": x.short(), "status": "ok"} for x in layouts]
    attach_predictions(recs, job, truth, prefix="truth")
    for r in recs:
        r["measured_step_time_s"] = r["truth_step_time_s"]
        r["measured_peak_memory_gib"] = r["truth_peak_memory_gib"]
    cal, info = refit_calibration(recs, job, base, params=("global.kernel_overhead_us",))
    assert cal.global_value("kernel_overhead_us") == pytest.approx(9000.0, rel=1e-3)
    assert cal.global_value("fragmentation") == pytest.approx(0.3, abs=1e-3)
    assert info["time_after"]["max_abs_pct"] < 0.5 and info["memory"]["after"]["max_abs_pct"] < 0.5
    out = write_calibration_atomic(cal, tmp_path / "refit.yaml")
    again = load_calibration(out)
    assert again.global_value("kernel_overhead_us") == pytest.approx(9000.0, rel=1e-3)
    assert again.provenance["refit"]["runs"] == len(layouts)
    with pytest.raises(AutoparError, match="no successful runs"):
        refit_calibration([{"status": "failed", "layout": lay(dp=2).model_dump()}], job, base)


# ------------------------------------------------------------------------------------- real runs
@pytest.mark.slow
def test_validate_cli_runs_layouts_for_real(local, tmp_path, capsys):
    """Three layouts at world size 2 in one launch (one fails in the worker: fp16 on CPU), then a
    refit written next to the inputs; the JSON has one record per layout."""
    layouts = [
        lay(tp=2, micro_batch=1),
        lay(dp=2, zero=3),
        lay(dp=2).model_copy(update={"precision": "fp16"}),
    ]
    f = tmp_path / "layouts.json"
    f.write_text(
        json.dumps(
            {
                "job": {
                    "model": str(local["model"]),
                    "device": str(local["device"]),
                    "seq_len": SEQ,
                    "global_batch": BATCH,
                },
                "layouts": [x.model_dump() for x in layouts],
            }
        )
    )
    out, refit = tmp_path / "out.json", tmp_path / "refit.yaml"
    rc = main(
        [
            "validate",
            "--layouts",
            str(f),
            "--calibration",
            str(local["calibration"]),
            "--steps",
            "3",
            "--warmup",
            "1",
            "--run-device",
            "cpu",
            "--timeout",
            "120",
            "--json",
            str(out),
            "--refit",
            str(refit),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "MAPE" in captured.out and "refit" in captured.out
    assert "[  3/3]" in captured.err  # the progress display
    data = json.loads(out.read_text())
    recs = data["records"]
    assert [r["status"] for r in recs] == ["ok", "ok", "failed"]
    assert "precision=fp16" in recs[2]["error"]
    for r in recs[:2]:
        assert r["measured_step_time_s"] > 0 and r["predicted_step_time_s"] > 0
        assert len(r["measured_peak_memory_gib_per_rank"]) == 2 and r["measured_peak_memory_gib"] > 0
        assert r["final_loss"] == pytest.approx(r["losses"][-1]) and len(r["losses"]) == 3
    assert data["summary"]["n_ok"] == 2 and data["summary"]["n_failed"] == 1
    cal = load_calibration(refit)
    assert cal.provenance["refit"]["runs"] == 2 and Path(refit).read_text().startswith("schema:")


@pytest.mark.slow
def test_a_real_timeout_is_recorded_as_failed(local):
    cfg = RunnerModelConfig.from_model_spec(load_model(TINY))
    recs = run_items(
        [Item(lay(dp=2))],
        cfg,
        seq_len=SEQ,
        global_batch=BATCH,
        steps=3,
        warmup=1,
        timeout_s=0.5,
        device="cpu",
    )
    assert recs[0]["status"] == "failed" and recs[0]["timed_out"] and "timed out" in recs[0]["error"]


def test_validate_refuses_layouts_scored_for_another_pipeline_schedule(tmp_path, capsys):
    """The reference runner runs 1F1B: layouts scored for a zero-bubble schedule are refused before
    any run, with one line, instead of being validated against a schedule they did not assume."""
    src = tmp_path / "layouts.json"
    job = dict(
        model="llama-3.1-8b",
        device="a100-80gb",
        num_devices=4,
        seq_len=128,
        global_batch=8,
        framework="torchtitan",
        pipeline_schedule="zb",
    )
    src.write_text(
        json.dumps({"job": job, "layouts": [dict(tp=1, pp=2, vpp=2, dp=2, zero=2, micro_batch=1)]})
    )
    assert main(["validate", "--layouts", str(src)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pipeline schedule zb" in err[0] and "1F1B" in err[0]
