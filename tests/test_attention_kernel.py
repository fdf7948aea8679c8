"""A training job may name its attention core (``--attention-kernel``): the stack's default, a
FlashAttention-2-class kernel, or the unfused s x s core Megatron-LM ran before FlashAttention. It is
priced (time and memory), stated, exported where the launcher can name it (Megatron-LM
``--attention-backend``) and refused where it cannot."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autopar import predict
from autopar.export import ExportError, Job, export, parse
from autopar.frameworks import PROFILES, framework_profile
from autopar.layout import resolve_layout

JOB = dict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, seq_len=8192, global_batch=64)
LAYOUT = dict(tp=1, micro_batch=1, recompute="selective")


def test_the_override_is_the_profile_with_another_core_and_nothing_else() -> None:
    for name, p in PROFILES.items():
        assert framework_profile(name) is p and framework_profile(name, p.attention) is p
        for core in ("flash", "unfused"):
            q = framework_profile(name, core)
            assert q.attention == core
            assert q.model_dump(exclude={"attention"}) == p.model_dump(exclude={"attention"})


def test_unfused_core_costs_time_and_is_stated() -> None:
    base = predict(**JOB, **LAYOUT)
    flash = predict(**JOB, **LAYOUT, attention_kernel="flash")
    unfused = predict(**JOB, **LAYOUT, attention_kernel="unfused")
    # TE's fused attention (cuDNN on H100) > FlashAttention-2 > the unfused core, at 8k tokens
    assert base.tokens_per_s_per_device > flash.tokens_per_s_per_device > unfused.tokens_per_s_per_device
    assert unfused.tokens_per_s_per_device < 0.8 * base.tokens_per_s_per_device
    assert any("attention core unfused" in a for a in unfused.assumptions)
    assert not any("attention core" in a for a in base.assumptions)
    # naming the stack's own core is the default job
    same = predict(**JOB, **LAYOUT, framework="torchtitan", attention_kernel="flash")
    assert same.step_time_s == predict(**JOB, **LAYOUT, framework="torchtitan").step_time_s


def _export_job(**kw) -> Job:
    return Job(model="gpt3-175b", num_devices=64, seq_len=2048, global_batch=256, device="a100-80gb", **kw)


LAY = resolve_layout(num_devices=64, global_batch=256, tp=8, pp=8, micro_batch=1, zero=1)


def test_megatron_export_names_the_core_and_reads_it_back() -> None:
    text = export(LAY, "megatron", _export_job(attention_kernel="unfused"))
    assert "--attention-backend unfused" in text
    layout, job = parse(text, "megatron")
    assert job.attention_kernel == "unfused" and layout == LAY
    assert "--attention-backend" not in export(LAY, "megatron", _export_job())  # default: TE's choice (auto)
    # the value is one Megatron-Core's AttnBackend enum accepts (the parser's type)
    enums = pytest.importorskip("megatron.core.transformer.enums")
    for core in ("flash", "unfused"):
        t = export(LAY, "megatron", _export_job(attention_kernel=core))
        value = t.split("--attention-backend ", 1)[1].split()[0]
        assert value in enums.AttnBackend.__members__


def test_edited_core_is_refused() -> None:
    text = export(LAY, "megatron", _export_job(attention_kernel="unfused"))
    with pytest.raises(ExportError, match="header says"):
        parse(text.replace("--attention-backend unfused", "--attention-backend flash"), "megatron")
    with pytest.raises(ExportError, match="attention-backend"):
        parse(text.replace("--attention-backend unfused \\\n", ""), "megatron")
    with pytest.raises(ExportError, match="fused"):
        parse(text.replace("--attention-backend unfused", "--attention-backend fused"), "megatron")


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron_bridge", "deepspeed", "accelerate"])
def test_formats_that_cannot_name_the_core_refuse_it(fmt: str) -> None:
    lay = resolve_layout(num_devices=64, global_batch=256, tp=1, pp=1, micro_batch=1, zero=3)
    with pytest.raises(ExportError, match="attention core unfused"):
        export(lay, fmt, _export_job(attention_kernel="unfused"))


def test_a_core_that_is_the_stacks_own_exports_in_that_stacks_format() -> None:
    lay = resolve_layout(num_devices=64, global_batch=256, tp=1, pp=1, micro_batch=1, zero=3)
    text = export(lay, "deepspeed", _export_job(framework="deepspeed", attention_kernel="unfused"))
    assert parse(text, "deepspeed")[1].framework == "deepspeed"


def test_cli_flag_and_its_refusal() -> None:
    base = [sys.executable, "-m", "autopar.cli", "predict", "--model", "llama-3.1-8b", "--device",
            "h100-sxm-80gb", "--num-devices", "8", "--seq-len", "4096", "--global-batch", "64", "--tp", "1"]  # fmt: skip
    ok = subprocess.run([*base, "--attention-kernel", "unfused", "--json"], capture_output=True, text=True)
    assert ok.returncode == 0 and "attention core unfused" in ok.stdout
    bad = subprocess.run([*base, "--attention-kernel", "sdpa"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--attention-kernel" in bad.stderr
