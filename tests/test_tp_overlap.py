"""A training job may say whether its TP collectives overlap the GEMMs (``--tp-comm-overlap``): the
stack's default (megatron: Transformer Engine userbuffers), off (Megatron without the flag, as many
Megatron-Bridge recipes run) or on (megatron only). It is priced, stated, exported where the launcher
can say it (Megatron-LM ``--tp-comm-overlap``, the env format) and refused where it cannot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autopar import predict
from autopar.errors import AutoparError
from autopar.export import ExportError, Job, export, parse
from autopar.frameworks import PROFILES, framework_profile, tp_overlap_override
from autopar.layout import resolve_layout

JOB = dict(model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=64, seq_len=8192, global_batch=128)


def test_the_override_is_the_profile_with_another_overlap_and_nothing_else() -> None:
    for name, p in PROFILES.items():
        assert framework_profile(name, tp_overlap="default") is p
        own = "on" if p.tp_comm_overlap else "off"
        assert tp_overlap_override(name, own) is None and framework_profile(name, tp_overlap=own) is p
    q = framework_profile("megatron", tp_overlap="off")
    assert q.tp_comm_overlap is False
    assert q.model_dump(exclude={"tp_comm_overlap"}) == PROFILES["megatron"].model_dump(
        exclude={"tp_comm_overlap"}
    )


def test_synchronous_tp_collectives_cost_time_and_are_stated() -> None:
    base = predict(**JOB, tp=8, pp=2, micro_batch=1)
    off = predict(**JOB, tp=8, pp=2, micro_batch=1, tp_comm_overlap="off")
    assert off.tokens_per_s_per_device < 0.97 * base.tokens_per_s_per_device
    assert any("TP communication overlap off" in a for a in off.assumptions)
    assert not any("TP communication overlap off" in a for a in base.assumptions)
    assert any("TP communication overlap priced" in a for a in base.assumptions)
    assert not any("TP communication overlap priced" in a for a in off.assumptions)
    # without TP there is nothing to overlap
    small = dict(JOB, model="llama-3.1-8b", num_devices=8, global_batch=64)
    a = predict(**small, tp=1, micro_batch=1, recompute="selective")
    b = predict(**small, tp=1, micro_batch=1, recompute="selective", tp_comm_overlap="off")
    assert a.step_time_s == b.step_time_s


def test_on_is_refused_where_no_export_can_launch_it() -> None:
    with pytest.raises(AutoparError, match="no TP communication overlap"):
        predict(**JOB, tp=8, framework="torchtitan", tp_comm_overlap="on")
    # the stack's own choice is the default job
    same = predict(**JOB, tp=8, pp=2, micro_batch=1, tp_comm_overlap="on")
    assert same.step_time_s == predict(**JOB, tp=8, pp=2, micro_batch=1).step_time_s


def _export_job(**kw) -> Job:
    return Job(model="gpt3-175b", num_devices=64, seq_len=2048, global_batch=256, device="a100-80gb", **kw)


LAY = resolve_layout(num_devices=64, global_batch=256, tp=8, pp=8, micro_batch=1, zero=1)


def test_megatron_writes_the_flag_exactly_where_it_was_priced_and_reads_it_back() -> None:
    on = export(LAY, "megatron", _export_job())
    off = export(LAY, "megatron", _export_job(tp_comm_overlap="off"))
    assert "--tp-comm-overlap" in on and "--tp-comm-overlap" not in off
    layout, job = parse(off, "megatron")
    assert job.tp_comm_overlap == "off" and layout == LAY
    # a file edited to launch what was not priced is refused
    with pytest.raises(ExportError, match="tp-comm-overlap"):
        parse(off.replace("--sequence-parallel", "--sequence-parallel --tp-comm-overlap"), "megatron")
    with pytest.raises(ExportError, match="tp-comm-overlap"):
        parse(on.replace(" --tp-comm-overlap", "").replace("--tp-comm-overlap \\\n", ""), "megatron")


def test_env_carries_it() -> None:
    text = export(LAY, "env", _export_job(tp_comm_overlap="off"))
    assert "export AUTOPAR_TP_COMM_OVERLAP=off" in text
    assert parse(text, "env")[1].tp_comm_overlap == "off"


@pytest.mark.parametrize("fmt", ["megatron_bridge", "torchtitan", "accelerate"])
def test_formats_that_cannot_say_it_refuse_a_job_priced_without_it(fmt: str) -> None:
    lay = resolve_layout(num_devices=64, global_batch=256, tp=8, pp=1, micro_batch=1, zero=3)
    with pytest.raises(ExportError, match="TP communication overlap off"):
        export(lay, fmt, _export_job(tp_comm_overlap="off"))


def test_the_study_reads_the_bridge_recipes() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "studies"))
    from published import Case, tp_overlap_of

    def case(**row) -> Case:
        base = {"orig_framework": "Megatron-Bridge / NeMo 26.04", "tp": "4", "device": "gb200-nvl72"}
        return Case(row=base | row, run_id="t")

    assert tp_overlap_of(case(model="LLAMA3.1_405B", precision="nvfp4")) == "default"  # see the study
    assert tp_overlap_of(case(model="LLAMA3.1_405B", precision="fp8")) == "default"
    assert tp_overlap_of(case(model="Qwen3_235B_a22B", precision="fp8", device="h100-sxm-80gb")) == "off"
    assert tp_overlap_of(case(model="Nemotron_3_Super", precision="mxfp8")) == "off"
    assert tp_overlap_of(case(model="Nemotron_3_Super", precision="mxfp8", tp="1")) == "default"
    assert (
        tp_overlap_of(case(model="Nemotron_3_Super", precision="mxfp8", orig_framework="NeMo 24.07"))
        == "default"
    )


PREDICT = ["--model", "llama-3.1-70b", "--device", "h100-sxm-80gb", "--num-devices", "64", "--seq-len", "8192",
           "--global-batch", "128", "--tp", "8"]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "rc", "says"),
    [
        (["--tp-comm-overlap", "off", "--json"], 0, "TP communication overlap off"),
        (["--tp-comm-overlap", "maybe"], 2, "--tp-comm-overlap"),
        (["--framework", "fsdp", "--tp-comm-overlap", "on"], 2, "no TP communication overlap"),
    ],
)
def test_cli_flag_and_its_refusals(extra: list[str], rc: int, says: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "predict", *PREDICT, *extra], capture_output=True, text=True
    )
    assert r.returncode == rc and says in (r.stdout if rc == 0 else r.stderr)
    if rc:
        assert len(r.stderr.strip().splitlines()) == 1  # one line naming the problem
