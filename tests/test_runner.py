"""The reference runner's contract: argument checks, device refusals, model config, and what the
launcher returns for a good, a crashing and a hanging run."""

from __future__ import annotations

import json
import statistics
import sys
from types import SimpleNamespace

import pytest

from autopar.errors import RunError
from autopar.layout import Layout
from autopar.runner import RunnerModelConfig, check_device_support, check_layout, run_layout
from autopar.runner.checks import mesh_shape

TINY = RunnerModelConfig(hidden=64, layers=4, heads=4, kv_heads=2, ffn_hidden=128, vocab=128)


# ---------------------------------------------------------------- config


def test_model_config_from_model_spec_is_duck_typed():
    spec = SimpleNamespace(
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=4,
        ffn_hidden=96,
        vocab=100,
        num_experts=None,
        moe_topk=None,
        moe_ffn_hidden=None,
        extra="ignored",
    )
    cfg = RunnerModelConfig.from_model_spec(spec)
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn_hidden, cfg.vocab) == (
        64,
        2,
        4,
        4,
        96,
        100,
    )
    assert cfg.num_experts == 0 and not cfg.is_moe
    moe = RunnerModelConfig.from_model_spec(
        {**vars(spec), "num_experts": 8, "moe_topk": 2, "moe_ffn_hidden": 32}
    )
    assert moe.is_moe and moe.expert_ffn_hidden == 32
    assert RunnerModelConfig.from_json(moe.to_json()) == moe


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"heads": 5}, "not divisible by heads=5"),
        ({"kv_heads": 3}, "not divisible by kv_heads"),
        ({"num_experts": 4, "moe_topk": 0}, "moe_topk"),
        ({"layers": 0}, "positive integer"),
    ],
)
def test_model_config_rejects_bad_shapes(kwargs, match):
    base = dict(hidden=48, layers=2, heads=4, kv_heads=2, ffn_hidden=96, vocab=64)
    with pytest.raises(RunError, match=match):
        RunnerModelConfig(**{**base, **kwargs})


def test_model_spec_missing_fields_is_a_clear_error():
    with pytest.raises(RunError, match="lacks ffn_hidden, vocab"):
        RunnerModelConfig.from_model_spec(SimpleNamespace(hidden=64, layers=2, heads=4, kv_heads=4))


# ---------------------------------------------------------------- checks


def test_cp_on_cpu_is_a_clear_error():
    with pytest.raises(RunError) as err:
        check_device_support(Layout(cp=2, precision="fp32"), "cpu")
    msg = str(err.value)
    assert "context parallel" in msg and "CUDA SDPA" in msg and "GPU" in msg


@pytest.mark.parametrize("precision", ["fp8", "fp16"])
def test_unsupported_precision_is_a_clear_error(precision):
    with pytest.raises(RunError, match=f"precision={precision}"):
        check_device_support(Layout(precision=precision), "cpu")
    check_device_support(Layout(precision="bf16"), "cpu")
    check_device_support(Layout(precision="fp32"), "cpu")


@pytest.mark.parametrize(
    "layout, match",
    [
        (Layout(tp=8, micro_batch=4), "tp=8 does not divide heads=4"),
        (Layout(dp=2, micro_batch=1), r"global_batch=4 != micro_batch\*grad_accum\*dp"),
        (Layout(ep=2, micro_batch=4), "expert parallelism"),
        (Layout(pp=3, micro_batch=1, grad_accum=4), "do not split evenly"),
        (Layout(pp=2, micro_batch=4, grad_accum=1), "1F1B needs at least pp=2 micro-batches"),
        (Layout(dp=4, zero=0, shard_group=2, micro_batch=1), "needs ZeRO >= 1"),
        (Layout(dp=4, zero=3, shard_group=3, micro_batch=1), "does not divide dp"),
        (Layout(tp=2, sp=True, micro_batch=4), "divide seq_len=33"),
    ],
)
def test_check_layout_names_the_problem(layout, match):
    seq = 33 if "seq_len" in match else 32
    with pytest.raises(RunError, match=match):
        check_layout(layout, TINY, seq_len=seq, global_batch=4)


def test_mesh_shape_maps_zero_stages_to_replicate_and_shard_dims():
    assert mesh_shape(Layout(dp=4, zero=0)) == {"pp": 1, "dp_replicate": 4, "dp_shard": 1, "cp": 1, "tp": 1}
    assert mesh_shape(Layout(dp=4, zero=3)) == {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 1}
    assert mesh_shape(Layout(dp=4, zero=2, shard_group=2, tp=2, pp=2))["dp_replicate"] == 2


def test_run_layout_refuses_bad_arguments_without_launching():
    lay = Layout(dp=2, zero=3, micro_batch=2, precision="fp32")
    with pytest.raises(RunError, match="nproc=4"):
        run_layout(lay, TINY, seq_len=32, global_batch=4, nproc=4)
    with pytest.raises(RunError, match="global_batch=8"):
        run_layout(lay, TINY, seq_len=32, global_batch=8)
    with pytest.raises(RunError, match="steps=2 must exceed warmup=2"):
        run_layout(lay, TINY, seq_len=32, global_batch=4, steps=2, warmup=2)
    with pytest.raises(RunError, match="not a valid Layout"):
        run_layout({"tp": 0}, TINY, seq_len=32, global_batch=4)


def test_importing_the_launcher_does_not_import_torch():
    import subprocess

    code = "import sys, autopar.runner; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- real launches


@pytest.mark.slow
def test_run_layout_returns_the_measured_result(tmp_path):
    """One launch, single-layout mode, on one rank (the cheapest launch; multi-rank layouts are
    covered by test_runner_correctness.py)."""
    torch = pytest.importorskip("torch")
    from autopar.runner.train import reference_run

    lay = Layout(micro_batch=2, grad_accum=2, precision="fp32")
    res = run_layout(
        lay, TINY, seq_len=32, global_batch=4, steps=3, warmup=1, timeout_s=240, dump_grads=tmp_path / "g.pt"
    )
    assert res["status"] == "ok", res.get("log_tail", "")[-3000:]
    assert res["world_size"] == 1 and res["backend"] == "gloo" and res["layout"] == lay.model_dump()
    assert len(res["step_times_s"]) == 3 and len(res["losses"]) == 3
    assert res["median_step_time_s"] == pytest.approx(statistics.median(res["step_times_s"][1:]))
    assert len(res["peak_memory_bytes"]) == 1 and res["peak_memory_bytes"][0] > 0
    assert "step 1" in res["peak_memory_method"]
    json.dumps(res)
    ref = reference_run(TINY, seq_len=32, global_batch=4, steps=3)
    assert res["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    grads = torch.load(tmp_path / "g.pt")
    assert set(grads) == set(ref["grads"])


@pytest.mark.slow
def test_a_crashing_run_returns_status_failed():
    pytest.importorskip("torch")
    res = run_layout(
        Layout(precision="fp8", micro_batch=4),
        TINY,
        seq_len=32,
        global_batch=4,
        steps=2,
        warmup=1,
        timeout_s=240,
    )
    assert res["status"] == "failed" and res["returncode"] != 0 and not res["timed_out"]
    assert "precision=fp8 is not supported on cpu" in res["error"]
    assert res["log_tail"]


@pytest.mark.slow
def test_a_hanging_run_is_killed_at_the_timeout():
    pytest.importorskip("torch")
    res = run_layout(
        Layout(dp=2, zero=3, micro_batch=2, precision="fp32"),
        TINY,
        seq_len=32,
        global_batch=4,
        steps=3,
        warmup=1,
        timeout_s=1.5,
    )
    assert res["status"] == "failed" and res["timed_out"]
    assert "timed out after 1.5 s" in res["error"]
    assert res["wall_s"] < 30


@pytest.mark.slow
@pytest.mark.stress
def test_zero3_dp4_launched_alone_passes_ten_of_ten():
    """Issue 12: a ZeRO-3 (FSDP2) dp4 layout launched alone on CPU/gloo aborted at exit
    ("terminate called without an active exception", SIGABRT) in some launches. The runner now
    collects the run's objects, waits for every rank and destroys the process group before exiting
    (train._teardown). Ten single-layout launches, two at a time (the contention of a shared host
    makes the teardown race likelier, not less), must all succeed with a clean exit status."""
    from concurrent.futures import ThreadPoolExecutor

    lay = Layout(dp=4, zero=3, micro_batch=1, grad_accum=1, precision="fp32")

    def once(_: int) -> dict:
        return run_layout(
            lay, TINY, seq_len=16, global_batch=4, steps=3, warmup=1, device="cpu", timeout_s=240
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(once, range(10)))
    bad = [
        (r.get("error"), r.get("returncode"), (r.get("log_tail") or "")[-400:])
        for r in results
        if r["status"] != "ok"
    ]
    assert not bad, f"{len(bad)} of 10 launches failed: {bad[:2]}"
    assert all(len(r["losses"]) == 3 for r in results)
