"""Property (issue 21 item 3): for random records of every kind, what is exported is what was scored.

Records as the commands write them: a predict/recommend record (layout fields + the core job, with
framework, device, MoE dispatcher and all-to-all overlap, pipeline schedule), a ``study show``
record of an uneven pipeline (per-stage layers and recompute codes) and a ``serve`` record. Each is
exported to every format; an export either is refused (one line, an AutoparError) or parses back,
with autopar's parser and with the launcher's own config classes where installed (Megatron-Core's
TransformerConfig, DeepSpeed's DeepSpeedConfig, torchtitan 0.3's ConfigManager), to the record: the same
layout, the same per-stage split (by Megatron's own layer-assignment rule), the same job.
"""

from __future__ import annotations

import json
import re
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# At import, not inside a test: importing it from within a running @given test imports
# test_export.py, whose own @given at module level is then a nested given to Hypothesis (its health
# check fails the test when this file runs alone, without the other test modules collected first).
from test_profile_launch import megatron_flags

from autopar.cli.export import render_record, serving_export_record
from autopar.errors import AutoparError
from autopar.export import EXPORTERS, parse
from autopar.layout import RECOMPUTE_CODES, Layout
from autopar.model import load_model

FORMATS = sorted(EXPORTERS)
MODELS = {"llama-3.1-8b": 32, "mixtral-8x7b": 32}


@st.composite
def training_records(draw: st.DrawFn) -> dict[str, Any]:
    model = draw(st.sampled_from(sorted(MODELS)))
    moe = model == "mixtral-8x7b"
    tp, pp, cp = (
        draw(st.sampled_from([1, 2, 4])),
        draw(st.sampled_from([1, 2, 4])),
        draw(st.sampled_from([1, 2])),
    )
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (tp * cp * dp) % e == 0])) if moe else 1
    etp = draw(st.sampled_from([e for e in {1, tp} if (tp * cp * dp) % (ep * e) == 0]))
    zero = draw(st.integers(0, 3))
    mb, ga = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4]))
    layout = Layout(
        tp=tp,
        pp=pp,
        vpp=vpp,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=etp,
        zero=zero,
        sp=tp > 1 and draw(st.booleans()),
        micro_batch=mb,
        grad_accum=ga,
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        offload=zero > 0 and draw(st.booleans()),
        precision=draw(st.sampled_from(["bf16", "fp16", "fp8", "fp32"])),
    )
    n = layout.num_devices
    workload = {
        "kind": "training",
        "seq_len": 4096,
        "global_batch": layout.global_batch,
        "moe_dispatcher": draw(st.sampled_from(["alltoall", "deepep"])) if moe else "alltoall",
        "moe_a2a_overlap": draw(st.booleans()) if moe else False,
    }
    framework = draw(st.sampled_from(["megatron", "torchtitan", "fsdp", "deepspeed"]))
    if framework == "torchtitan":
        workload["pipeline_schedule"] = draw(st.sampled_from(["1f1b", "zb"]))
    job = {
        "model": model,
        "cluster": {
            "device": draw(st.sampled_from(["h100-sxm-80gb", "l40s"])),
            "num_devices": n,
            "devices_per_node": 8 if n >= 8 else n,
        },
        "workload": workload,
        "framework": framework,
    }
    return {**layout.model_dump(), "job": job}


@st.composite
def study_records(draw: st.DrawFn) -> dict[str, Any]:
    rec = draw(training_records())
    pp = draw(st.sampled_from([2, 4]))
    layers = MODELS[rec["job"]["model"]]
    kind = draw(st.sampled_from(["even", "ends", "any"]))
    if kind == "even":
        split = [layers // pp] * pp
    elif kind == "ends":
        f, last = draw(st.integers(1, 12)), draw(st.integers(1, 12))
        rest = layers - f - last
        split = [f, *([rest // (pp - 2)] * (pp - 2)), last] if pp > 2 else [f, layers - f]
        if sum(split) != layers or min(split) < 1:
            split = [layers // pp] * pp
    else:
        cuts = sorted(
            draw(st.lists(st.integers(1, layers - 1), min_size=pp - 1, max_size=pp - 1, unique=True))
        )
        split = [b - a for a, b in zip([0, *cuts], [*cuts, layers], strict=True)]
    uniform = draw(st.booleans())
    codes = (
        [draw(st.sampled_from([0, 1, 2]))] * pp
        if uniform
        else draw(st.lists(st.sampled_from([0, 1, 2]), min_size=pp, max_size=pp))
    )
    # the same devices and batch with pp stages (dp absorbs the change)
    n, gb = rec["tp"] * rec["pp"] * rec["cp"] * rec["dp"], rec["micro_batch"] * rec["grad_accum"] * rec["dp"]
    if n % (rec["tp"] * pp * rec["cp"]):
        pp = rec["pp"] if rec["pp"] > 1 else 2
    dp = max(1, n // (rec["tp"] * pp * rec["cp"]))
    rec.update(
        pp=pp,
        vpp=1,
        dp=dp,
        stage_layers=split[:pp] if len(split) == pp else [layers // pp] * pp,
        stage_recompute=codes,
        trial=0,
        layout="...",
    )
    rec["grad_accum"] = max(1, gb // (rec["micro_batch"] * dp))
    rec["job"]["cluster"]["num_devices"] = rec["tp"] * pp * rec["cp"] * dp
    rec["job"]["cluster"]["devices_per_node"] = min(8, rec["job"]["cluster"]["num_devices"])
    rec["job"]["workload"]["global_batch"] = rec["micro_batch"] * rec["grad_accum"] * dp
    rec["ep"] = rec["ep"] if (rec["tp"] * rec["cp"] * dp) % (rec["ep"] * rec["etp"]) == 0 else 1
    if (rec["tp"] * rec["cp"] * dp) % (rec["ep"] * rec["etp"]):
        rec["etp"] = 1
    return rec


@st.composite
def serve_records(draw: st.DrawFn) -> dict[str, Any]:
    tp, pp, dp = (
        draw(st.sampled_from([1, 2, 4, 8])),
        draw(st.sampled_from([1, 2])),
        draw(st.sampled_from([1, 2])),
    )
    return serving_export_record(
        {
            "mode": "aggregated",
            "tp": tp,
            "pp": pp,
            "devices": tp * pp * dp,
            "concurrency_per_instance": draw(st.integers(1, 256)),
            "job": {
                "model": "llama-3.1-8b",
                "cluster": {"device": "h100-sxm-80gb", "num_devices": tp * pp * dp},
                "workload": {"kind": "serving", "isl": 1024, "osl": 256},
            },
        }
    )


def check_launcher(fmt: str, text: str, layout: Layout) -> None:
    """The launcher's own reading of the text agrees with the layout (where the launcher is installed)."""
    if fmt == "megatron":
        tc = pytest.importorskip("megatron.core.transformer.transformer_config")
        f = megatron_flags(text)
        kw: dict[str, Any] = dict(
            tensor_model_parallel_size=int(f["tensor_model_parallel_size"]),
            pipeline_model_parallel_size=int(f["pipeline_model_parallel_size"]),
            context_parallel_size=int(f["context_parallel_size"]),
            expert_model_parallel_size=int(f["expert_model_parallel_size"]),
            sequence_parallel=bool(f.get("sequence_parallel")),
            tp_comm_overlap=bool(f.get("tp_comm_overlap")),
        )
        assert (kw["tensor_model_parallel_size"], kw["pipeline_model_parallel_size"]) == (
            layout.tp,
            layout.pp,
        )
        assert (kw["context_parallel_size"], kw["expert_model_parallel_size"]) == (layout.cp, layout.ep)
        assert kw["sequence_parallel"] == layout.sp
        for k in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
            if k in f:
                kw[
                    k.replace("decoder_", "num_layers_in_").replace("_pipeline_num_layers", "_pipeline_stage")
                ] = int(f[k])
        import torch

        vpp = int(f.get("num_virtual_stages_per_pipeline_rank", 1))
        if layout.pp > 1:
            kw["pipeline_dtype"] = torch.float32
        if vpp > 1:
            kw["virtual_pipeline_model_parallel_size"] = vpp
        if layout.ep > 1:
            kw.update(num_moe_experts=8, moe_router_topk=2, expert_tensor_parallel_size=layout.etp)
            kw["moe_token_dispatcher_type"] = f["moe_token_dispatcher_type"]
            if "moe_flex_dispatcher_backend" in f:
                kw["moe_flex_dispatcher_backend"] = f["moe_flex_dispatcher_backend"]
            kw["overlap_moe_expert_parallel_comm"] = bool(f.get("overlap_moe_expert_parallel_comm"))
        for k in ("recompute_granularity", "recompute_method"):
            if k in f:
                kw[k] = f[k]
        if "recompute_num_layers" in f:
            kw["recompute_num_layers"] = int(f["recompute_num_layers"])
        kw["bf16"], kw["fp16"] = bool(f.get("bf16")), bool(f.get("fp16"))
        if "account_for_embedding_in_pipeline_split" in f or "account_for_loss_in_pipeline_split" in f:
            kw["account_for_embedding_in_pipeline_split"] = "account_for_embedding_in_pipeline_split" in f
            kw["account_for_loss_in_pipeline_split"] = "account_for_loss_in_pipeline_split" in f
        with mock.patch("warnings.warn"):
            tc.TransformerConfig(
                num_layers=32, hidden_size=256, num_attention_heads=8, add_bias_linear=False, **kw
            )
    elif fmt == "deepspeed":
        dsc = pytest.importorskip("deepspeed.runtime.config")

        class MPU:
            def get_data_parallel_world_size(self) -> int:
                return layout.dp

        with mock.patch.object(dsc.dist, "get_rank", lambda *a, **k: 0):
            c = dsc.DeepSpeedConfig(json.loads(text), mpu=MPU())
        assert (c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (
            layout.micro_batch,
            layout.grad_accum,
        )
        assert c.zero_optimization_stage == layout.zero
    elif fmt == "torchtitan":  # torchtitan 0.3.0's ConfigManager and Trainer.Config validation
        from test_export_launchers import torchtitan_config

        torchtitan_config(text, layout, moe=layout.ep > 1)


def check_record(record: dict[str, Any]) -> None:
    for fmt in FORMATS:
        try:
            text = render_record(record, fmt)
        except AutoparError as exc:  # refused: one line naming the problem
            assert "\n" not in str(exc)
            continue
        layout, job = parse(text, fmt)
        want = {k: record[k] for k in Layout.model_fields if k in record}
        # a serving layout whose replicas the launcher cannot run as data parallelism is exported as
        # one replica's command (render_record), which says so: one of R replicas
        per = re.search(r"^# one of (\d+) identical replicas", text, re.M)
        replicas = int(per.group(1)) if per else 1
        if replicas > 1:
            assert record.get("serving") and record["dp"] % replicas == 0, fmt
            want["dp"] = record["dp"] // replicas
        if "stage_layers" in record:  # the scored split, by Megatron's own assignment rule
            first, mid, last = (int(x) for x in layout.dims.stage_layers(load_model(job.model)))
            pp = layout.pp
            assert [first, *([mid] * (pp - 2)), last] == record["stage_layers"]
            assert len(set(record["stage_recompute"])) == 1
            assert layout.recompute == RECOMPUTE_CODES[record["stage_recompute"][0]]
            want.pop("recompute")
        got = layout.model_dump()
        assert {k: got[k] for k in want if k not in ("first_stage_layers", "last_stage_layers")} == {
            k: v for k, v in want.items() if k not in ("first_stage_layers", "last_stage_layers")
        }
        cj = record["job"]
        assert (job.model, job.num_devices, job.framework) == (
            cj["model"],
            cj["cluster"]["num_devices"] // replicas,
            cj.get("framework", "megatron"),
        )
        w = cj["workload"]
        assert (job.seq_len, job.global_batch) == (w["seq_len"], w["global_batch"] // replicas)
        if fmt != "env" or True:
            assert job.moe_dispatcher == w.get("moe_dispatcher", "alltoall")
            assert job.moe_a2a_overlap == w.get("moe_a2a_overlap", False)
        if record.get("serving"):
            assert EXPORTERS[fmt].serving or fmt == "env", fmt
        check_launcher(fmt, text, layout)


PROP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROP
@given(record=training_records())
def test_training_records_export_what_was_scored(record: dict[str, Any]) -> None:
    check_record(record)


@PROP
@given(record=study_records())
def test_study_records_export_what_was_scored(record: dict[str, Any]) -> None:
    check_record(record)


@PROP
@given(record=serve_records())
def test_serving_records_export_only_as_serving(record: dict[str, Any]) -> None:
    check_record(record)
