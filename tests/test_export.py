"""Conformance suite for every registered exporter, plus format-specific checks.

Contract: ``parse(render(layout, job)) == (layout, job)`` for every layout a format can express,
``render`` raises ExportError (naming the feature and the format) for the rest, output is
deterministic, and the launcher keys each format emits are frozen (a change must update KEYS).
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.errors import AutoparError
from autopar.export import EXPORTERS, Exporter, ExportError, Job, export, layout_and_job_from_json, parse
from autopar.job import Job as CoreJob
from autopar.layout import PRECISION_CODES, Layout, resolve_layout


def J(
    n: int, gb: int, *, seq: int = 4096, dpn: int = 8, layers: int | None = 32, model: str = "llama3-8b"
) -> Job:
    return Job(
        model=model, num_devices=n, seq_len=seq, global_batch=gb, devices_per_node=dpn, num_layers=layers
    )


# name -> (layout, job). Every layout is canonical (shard_group 0 or a proper divisor of dp*cp).
CASES: dict[str, tuple[Layout, Job]] = {
    "ddp": (Layout(zero=0, dp=8, micro_batch=2, grad_accum=4), J(8, 64)),
    "single": (Layout(zero=0, micro_batch=4, grad_accum=2, precision="fp32"), J(1, 8)),
    "zero1": (Layout(dp=8, zero=1, micro_batch=1, grad_accum=2), J(8, 16)),
    "zero1_offload": (
        Layout(dp=8, zero=1, offload=True, micro_batch=1, grad_accum=2, precision="fp16"),
        J(8, 16),
    ),
    "zero2": (Layout(dp=16, zero=2, micro_batch=2, grad_accum=1), J(16, 32)),
    "fsdp_full_ac": (Layout(dp=8, zero=3, micro_batch=1, grad_accum=4, recompute="full"), J(8, 32)),
    "hsdp": (Layout(dp=16, zero=3, shard_group=8, micro_batch=1, grad_accum=2, recompute="full"), J(16, 32)),
    "megatron_3d": (
        Layout(
            tp=4,
            pp=4,
            vpp=2,
            dp=4,
            etp=4,
            sp=True,
            zero=1,
            micro_batch=1,
            grad_accum=8,
            recompute="selective",
        ),
        J(64, 32, seq=8192, layers=80, model="llama3-70b"),
    ),
    "titan_3d": (
        Layout(
            tp=2,
            pp=2,
            vpp=2,
            dp=4,
            etp=2,
            sp=True,
            zero=3,
            micro_batch=1,
            grad_accum=4,
            recompute="full",
            precision="fp8",
        ),
        J(16, 16),
    ),
    "titan_vpp4": (
        Layout(
            tp=2,
            pp=2,
            vpp=4,
            dp=2,
            etp=2,
            sp=True,
            zero=3,
            micro_batch=1,
            grad_accum=8,
            recompute="selective",
        ),
        J(8, 16, layers=48),
    ),
    "cp_ep": (Layout(tp=2, cp=2, dp=4, ep=4, etp=1, sp=True, zero=3, micro_batch=1, grad_accum=2), J(16, 8)),
    "autotp": (Layout(tp=2, dp=4, etp=2, zero=2, micro_batch=2, grad_accum=2, precision="fp16"), J(8, 16)),
    "mlm_tp_full": (
        Layout(tp=2, pp=2, dp=2, etp=2, sp=True, zero=1, micro_batch=1, grad_accum=4, recompute="full"),
        J(8, 8),
    ),
    "serve_tp": (
        Layout(zero=0, tp=8, etp=8, micro_batch=64),
        J(8, 64, layers=None, model="meta-llama/Llama-3.1-70B"),
    ),
    "serve_vllm_ep": (Layout(zero=0, tp=4, dp=2, ep=8, etp=1, micro_batch=32), J(8, 64, layers=None)),
    "serve_sglang_ep": (Layout(zero=0, tp=8, dp=2, ep=4, etp=2, micro_batch=16), J(16, 32, layers=None)),
    "serve_fp8_pp": (
        Layout(zero=0, tp=4, pp=2, etp=1, micro_batch=16, precision="fp8"),
        J(8, 16, layers=None),
    ),
    "serve_pcp": (Layout(zero=0, tp=2, cp=2, etp=2, micro_batch=8), J(4, 8, layers=None)),
    "mxfp8_tp": (
        Layout(tp=2, dp=4, etp=2, sp=True, zero=1, micro_batch=1, grad_accum=2, precision="mxfp8"),
        J(8, 8),
    ),
    "nvfp4_pp": (
        Layout(tp=2, pp=2, dp=2, etp=2, sp=True, zero=1, micro_batch=1, grad_accum=4, precision="nvfp4"),
        J(8, 8),
    ),
    "mxfp8_zero2": (Layout(dp=8, zero=2, micro_batch=1, grad_accum=1, precision="mxfp8"), J(8, 8)),
    "serve_nvfp4": (Layout(zero=0, tp=8, etp=8, micro_batch=64, precision="nvfp4"), J(8, 64, layers=None)),
}

# Which cases each format must express (the rest may or may not; the conformance test checks both ways).
EXPRESSIBLE: dict[str, set[str]] = {
    "megatron": {
        "ddp",
        "single",
        "zero1",
        "zero1_offload",
        "zero2",
        "fsdp_full_ac",
        "hsdp",
        "megatron_3d",
        "titan_3d",
        "titan_vpp4",
        "cp_ep",
        "autotp",
        "mlm_tp_full",
        "serve_tp",
        "serve_vllm_ep",
        "serve_sglang_ep",
        "serve_fp8_pp",
        "serve_pcp",
        "mxfp8_tp",
        "nvfp4_pp",
        "mxfp8_zero2",
        "serve_nvfp4",
    },
    "megatron_bridge": {
        "ddp",
        "zero1",
        "zero1_offload",
        "zero2",
        "fsdp_full_ac",
        "hsdp",
        "megatron_3d",
        "titan_3d",
        "titan_vpp4",
        "cp_ep",
        "autotp",
        "mlm_tp_full",
        "serve_tp",
        "serve_vllm_ep",
        "serve_sglang_ep",
        "serve_fp8_pp",
        "serve_pcp",
        "mxfp8_tp",
        "nvfp4_pp",
        "mxfp8_zero2",
        "serve_nvfp4",
    },
    "deepspeed": {"ddp", "single", "zero1", "zero1_offload", "zero2", "autotp", "serve_tp", "serve_vllm_ep"},
    # torchtitan 0.3.0 (the default); fp8 (titan_3d) only in the 0.2.2 TOML (test_export_launchers.py)
    "torchtitan": {"ddp", "single", "zero2", "fsdp_full_ac", "hsdp", "titan_vpp4", "cp_ep"},
    "accelerate": {
        "ddp",
        "single",
        "zero1",
        "zero1_offload",
        "zero2",
        "fsdp_full_ac",
        "hsdp",
        "mlm_tp_full",
        "autotp",
    },
    "torchrun": set(CASES),
    "env": set(CASES),
    "vllm": {"serve_tp", "serve_vllm_ep", "serve_fp8_pp", "serve_pcp"},
    # serve_vllm_ep (ep = tp*dp, etp 1) is attention DP in SGLang: --tp-size 8 --attn-dp-size 2
    "sglang": {"serve_tp", "serve_sglang_ep", "serve_fp8_pp", "serve_vllm_ep"},
}

# (format, case, words the error must contain)
REFUSED = [
    ("deepspeed", "cp_ep", "context parallel (cp=2) cannot be expressed in deepspeed"),
    ("deepspeed", "megatron_3d", "pipeline parallel (pp=4) cannot be expressed in deepspeed"),
    ("deepspeed", "fsdp_full_ac", "activation recompute (full) cannot be expressed in deepspeed"),
    ("deepspeed", "hsdp", "cannot be expressed in deepspeed"),
    ("torchtitan", "zero1", "ZeRO-1 (optimizer-only sharding, zero=1) cannot be expressed in torchtitan"),
    ("torchtitan", "zero1_offload", "cannot be expressed in torchtitan"),
    ("torchtitan", "autotp", "fp16 precision cannot be expressed in torchtitan"),
    (
        "torchtitan",
        "serve_tp",
        "tensor parallel (tp=8) without sequence parallel cannot be expressed in torchtitan",
    ),
    ("torchtitan", "megatron_3d", "cannot be expressed in torchtitan"),
    ("torchtitan", "titan_3d", "fp8 precision (a model converter) cannot be expressed in torchtitan 0.3.0"),
    ("accelerate", "megatron_3d", "virtual pipeline stages (vpp=2) cannot be expressed in accelerate"),
    ("accelerate", "cp_ep", "cannot be expressed in accelerate"),
    ("megatron_bridge", "single", "fp32 precision cannot be expressed in megatron_bridge"),
    ("vllm", "ddp", "training-only setting grad_accum=4 cannot be expressed in vllm"),
    ("vllm", "zero1", "training-only setting zero=1 cannot be expressed in vllm"),
    ("vllm", "serve_sglang_ep", "expert parallel ep=4, etp=2 cannot be expressed in vllm"),
    ("sglang", "serve_pcp", "context parallel (cp=2) cannot be expressed in sglang"),
    ("sglang", "megatron_3d", "cannot be expressed in sglang"),
    ("deepspeed", "mxfp8_zero2", "mxfp8 precision cannot be expressed in deepspeed"),
    ("torchtitan", "mxfp8_zero2", "mxfp8 precision cannot be expressed in torchtitan"),
    ("accelerate", "mxfp8_zero2", "mxfp8 precision cannot be expressed in accelerate"),
    ("vllm", "serve_nvfp4", "nvfp4 training precision cannot be expressed in vllm"),
    ("sglang", "serve_nvfp4", "nvfp4 training precision cannot be expressed in sglang"),
]

# The launcher keys each format may emit: a frozen public surface (torchtitan's test_no_new_cli_options idea).
KEYS: dict[str, set[str]] = {
    "megatron": {
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--num-virtual-stages-per-pipeline-rank",
        "--context-parallel-size",
        "--expert-model-parallel-size",
        "--expert-tensor-parallel-size",
        "--sequence-parallel",
        "--tp-comm-overlap",
        "--moe-token-dispatcher-type",
        "--moe-flex-dispatcher-backend",
        "--overlap-moe-expert-parallel-comm",
        "--micro-batch-size",
        "--global-batch-size",
        "--seq-length",
        "--recompute-granularity",
        "--recompute-method",
        "--recompute-num-layers",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy",
        "--ckpt-format",
        "--no-gradient-accumulation-fusion",
        "--num-distributed-optimizer-instances",
        "--optimizer-cpu-offload",
        "--optimizer-offload-fraction",
        "--use-precision-aware-optimizer",
        "--bf16",
        "--fp16",
        "--fp8-format",
        "--fp8-recipe",
        "--fp4-format",
        "--fp4-recipe",
    },
    "vllm": {
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--prefill-context-parallel-size",
        "--enable-expert-parallel",
        "--max-model-len",
        "--max-num-seqs",
        "--dtype",
        "--quantization",
        "--nnodes",
        "--node-rank",
        "--master-addr",
    },
    "sglang": {
        "--model-path",
        "--tp-size",
        "--pp-size",
        "--dp-size",
        "--attn-dp-size",
        "--ep-size",
        "--context-length",
        "--max-running-requests",
        "--dtype",
        "--quantization",
        "--disable-overlap-schedule",  # SGLang 0.5.23 refuses its overlap scheduler with pp > 1
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
    },
    "torchrun": {
        "--nnodes",
        "--nproc-per-node",
        "--standalone",
        "--rdzv-backend",
        "--rdzv-endpoint",
        "--rdzv-id",
        "--layout-json",
        "--model",
        "--seq-len",
        "--global-batch",
    },
}


def render_or_none(fmt: str, layout: Layout, job: Job) -> str | None:
    try:
        return export(layout, fmt, job)
    except ExportError:
        return None


ALL = sorted(EXPORTERS)


def test_registry_lists_every_format() -> None:
    assert set(EXPORTERS) == set(EXPRESSIBLE)
    for name, exp in EXPORTERS.items():
        assert isinstance(exp, Exporter) and exp.name == name and exp.suffix.startswith(".")
        assert exp.description


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_or_refusal(fmt: str, case: str) -> None:
    layout, job = CASES[case]
    try:
        text = export(layout, fmt, job)
    except ExportError as e:
        assert case not in EXPRESSIBLE[fmt], f"{fmt} should express {case}: {e}"
        assert fmt in str(e)
        return
    assert case in EXPRESSIBLE[fmt] or fmt in ("torchrun", "env"), f"{fmt} unexpectedly expressed {case}"
    assert text.endswith("\n")
    assert export(layout, fmt, job) == text  # deterministic
    assert parse(text, fmt) == (layout, job)
    again = EXPORTERS[fmt].parse(text)
    assert export(*again[:1], fmt, again[1]) == text  # type: ignore[misc]


@pytest.mark.parametrize("fmt,case,words", REFUSED)
def test_refusals_name_feature_and_format(fmt: str, case: str, words: str) -> None:
    layout, job = CASES[case]
    with pytest.raises(ExportError) as ei:
        export(layout, fmt, job)
    assert words in str(ei.value)
    assert isinstance(ei.value, AutoparError)


def _layouts() -> st.SearchStrategy[tuple[Layout, Job]]:
    pow2 = st.sampled_from([1, 2, 4])

    @st.composite
    def build(draw: st.DrawFn) -> tuple[Layout, Job]:
        tp, pp, cp, dp = (
            draw(pow2),
            draw(pow2),
            draw(st.sampled_from([1, 2])),
            draw(st.sampled_from([1, 2, 4, 8])),
        )
        vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
        ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (tp * cp * dp) % e == 0]))
        etp = draw(st.sampled_from([e for e in {1, tp} if (tp * cp * dp) % (ep * e) == 0]))
        zero = draw(st.integers(0, 3))
        shard_opts = [0] + [s for s in (2, 4) if zero and (dp * cp) % s == 0 and s < dp * cp]
        layout = Layout(
            tp=tp,
            pp=pp,
            vpp=vpp,
            dp=dp,
            cp=cp,
            ep=ep,
            etp=etp,
            zero=zero,
            shard_group=draw(st.sampled_from(shard_opts)),
            sp=tp > 1 and draw(st.booleans()),
            micro_batch=draw(st.sampled_from([1, 2])),
            grad_accum=draw(st.sampled_from([1, 2, 4])),
            recompute=draw(st.sampled_from(["none", "selective", "full"])),
            offload=zero > 0 and draw(st.booleans()),
            precision=draw(st.sampled_from(PRECISION_CODES)),
        )
        job = J(
            layout.num_devices,
            layout.global_batch,
            layers=draw(st.sampled_from([None, 32])),
            dpn=draw(st.sampled_from([4, 8])),
        )
        return layout, job

    return build()


@pytest.mark.parametrize("fmt", ALL)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_layouts())
def test_property_round_trip_or_refusal(fmt: str, case: tuple[Layout, Job]) -> None:
    layout, job = case
    text = render_or_none(fmt, layout, job)
    if text is not None:
        assert parse(text, fmt) == (layout, job)


def test_env_and_torchrun_express_everything_hypothesis_generates() -> None:
    for layout, job in CASES.values():
        for fmt in ("env", "torchrun"):
            assert parse(export(layout, fmt, job), fmt) == (layout, job)


@pytest.mark.parametrize("fmt", sorted(KEYS))
def test_emitted_flags_are_frozen(fmt: str) -> None:
    seen: set[str] = set()
    for layout, job in list(CASES.values()) + [(CASES["hsdp"][0], J(16, 32, dpn=4))]:
        text = render_or_none(fmt, layout, job)
        if text is None:
            continue
        body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#")).replace("\\\n", " ")
        seen |= {t.split("=")[0] for t in shlex.split(body) if t.startswith("--")}
    assert seen <= KEYS[fmt], f"new {fmt} keys {seen - KEYS[fmt]}: update KEYS deliberately"


# ---------------------------------------------------------------------------------------------
# job, header and JSON-record handling


def test_layout_and_job_from_predict_json_record() -> None:
    layout, job = CASES["megatron_3d"]
    core = CoreJob.from_flat(
        model=job.model,
        device="h100-sxm",
        num_devices=job.num_devices,
        devices_per_node=8,
        seq_len=job.seq_len,
        global_batch=job.global_batch,
    )
    rec = {
        "schema_version": 1,
        "job": core.to_dict(),
        **layout.model_dump(),
        "step_time_s": 1.5,
        "mfu": 0.4,
        "fits": True,
        "reasons": [],
        "time_breakdown": {"compute": 1.0},
    }
    lay, jb = layout_and_job_from_json(json.loads(json.dumps(rec)))
    assert lay == layout
    assert jb == Job(model=job.model, num_devices=64, seq_len=8192, global_batch=32, device="h100-sxm")
    text = export(lay, "megatron", jb)
    assert parse(text, "megatron") == (lay, jb)


def test_json_record_mismatch_and_missing_fields() -> None:
    layout, job = CASES["ddp"]

    def rec_job(**kw):
        flat = dict(
            model="m", device="h100-sxm", devices_per_node=8, num_devices=16, seq_len=4096, global_batch=64
        )
        return CoreJob.from_flat(**{**flat, **kw}).to_dict()

    rec = {**layout.model_dump(), "job": rec_job()}
    with pytest.raises(ExportError, match="num_devices=16"):
        layout_and_job_from_json(rec)
    with pytest.raises(ExportError, match="no 'job'"):
        layout_and_job_from_json({**layout.model_dump(), "model": "m", "num_devices": 8})
    with pytest.raises(ExportError, match="job is not valid"):
        layout_and_job_from_json({**layout.model_dump(), "job": {**rec_job(), "cluster": {"num_devices": 8}}})
    with pytest.raises(ExportError, match="valid layout"):
        layout_and_job_from_json({"tp": 0, "job": rec_job(num_devices=8, global_batch=8, seq_len=1)})


def test_resolved_layouts_export() -> None:
    lay = resolve_layout(num_devices=64, global_batch=256, tp=8, pp=2, zero=1, micro_batch=1)
    job = J(64, 256, layers=80)
    assert lay.etp == 8 and lay.sp
    for fmt in ("megatron", "megatron_bridge", "torchrun", "env"):
        assert parse(export(lay, fmt, job), fmt) == (lay, job)


def test_job_validation() -> None:
    with pytest.raises(ExportError):
        Job(model="", num_devices=8, seq_len=1, global_batch=1)
    with pytest.raises(ExportError):
        Job(model="m", num_devices=0, seq_len=1, global_batch=1)
    with pytest.raises(ExportError, match="multiple of devices_per_node"):
        _ = Job(model="m", num_devices=12, seq_len=1, global_batch=1).nnodes
    assert Job(model="m", num_devices=4, seq_len=1, global_batch=1).nnodes == 1
    assert Job(model="m", num_devices=32, seq_len=1, global_batch=1).nproc_per_node == 8


def test_mismatched_pair_is_refused_by_every_format() -> None:
    layout, _ = CASES["ddp"]
    for fmt in ALL:
        with pytest.raises(ExportError, match="num_devices"):
            export(layout, fmt, J(16, 64))
        with pytest.raises(ExportError, match="global_batch"):
            export(layout, fmt, J(8, 128))


def test_unknown_format() -> None:
    with pytest.raises(ExportError, match="unknown export format"):
        export(CASES["ddp"][0], "slurm", CASES["ddp"][1])


@pytest.mark.parametrize("fmt", [f for f in ALL if f not in ("deepspeed",)])
def test_edited_text_disagreeing_with_header_is_refused(fmt: str) -> None:
    case = next(c for c in sorted(EXPRESSIBLE[fmt]) if c in CASES)
    layout, job = CASES[case]
    text = export(layout, fmt, job)
    edited = re.sub(r'"seq_len":\d+', '"seq_len":123', text)
    if fmt in ("env", "accelerate", "torchrun"):
        # seq_len is native in env/torchrun (header must agree) and header-only in accelerate
        if fmt == "accelerate":
            assert parse(edited, fmt)[1].seq_len == 123
            return
    with pytest.raises(ExportError):
        parse(edited, fmt)


def test_wrong_format_header_and_unknown_keys() -> None:
    layout, job = CASES["ddp"]
    with pytest.raises(ExportError, match="exported as 'megatron'"):
        parse(export(layout, "megatron", job).replace("--tensor", "--tensor"), "megatron_bridge")
    text = export(layout, "megatron", job) + " \\\n--hidden-size 4096\n"
    with pytest.raises(ExportError, match="unknown argument"):
        parse(text, "megatron")
    cfg = json.loads(export(layout, "deepspeed", job))
    cfg["sequence_parallel_size"] = 2
    with pytest.raises(ExportError, match="unknown key"):
        parse(json.dumps(cfg), "deepspeed")
    with pytest.raises(ExportError, match="header"):
        parse("--tensor-model-parallel-size 2\n", "megatron")


def test_shard_group_equal_to_dp_cp_is_written_as_the_default() -> None:
    layout, job = CASES["fsdp_full_ac"]
    full = layout.model_copy(update={"shard_group": 8})
    for fmt in ("megatron", "torchtitan", "accelerate"):

        def body(t: str) -> list[str]:
            return [ln for ln in t.splitlines() if not ln.startswith("#")]

        assert body(export(full, fmt, job)) == body(export(layout, fmt, job))
        assert parse(export(full, fmt, job), fmt)[0] == layout


def test_megatron_exports_the_data_parallel_overlap_the_cost_model_assumes() -> None:
    """autopar prices Megatron's gradient reduction behind the backward and the distributed
    optimizer's parameter all-gather behind the next forward: the launch must ask for both."""
    job = J(64, 256, layers=80)
    zero1 = resolve_layout(num_devices=64, global_batch=256, tp=8, pp=2, zero=1, micro_batch=1)
    text = export(zero1, "megatron", job)
    assert "--overlap-grad-reduce" in text and "--overlap-param-gather" in text
    bridge = export(zero1, "megatron_bridge", job)
    assert "ddp.overlap_grad_reduce=true" in bridge and "ddp.overlap_param_gather=true" in bridge
    ddp = resolve_layout(num_devices=64, global_batch=256, tp=8, pp=2, zero=0, micro_batch=1)
    text = export(ddp, "megatron", job)
    assert "--overlap-grad-reduce" in text and "--overlap-param-gather" not in text
    # No data parallelism: nothing to overlap, no flag.
    alone = resolve_layout(num_devices=64, global_batch=256, tp=8, pp=8, zero=1, micro_batch=1)
    assert "--overlap-grad-reduce" not in export(alone, "megatron", J(64, 256, layers=80))


def test_megatron_exports_the_tp_comm_overlap_the_megatron_profile_prices() -> None:
    """The megatron profile hides part of the TP communication behind the GEMMs (TE userbuffers) on
    NVLink devices; the launch asks for it (--tp-comm-overlap), never on a PCIe node (priced without
    it), and a layout priced with it that Megatron cannot run with it (no SP) is refused."""
    lay = resolve_layout(num_devices=64, global_batch=256, tp=8, pp=2, zero=1, micro_batch=1)
    h100 = J(64, 256, layers=80).model_copy(update={"device": "h100-sxm-80gb"})
    text = export(lay, "megatron", h100)
    assert "--tp-comm-overlap" in text and "--sequence-parallel" in text
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert parse(text, "megatron") == (lay, h100)
    # parse refuses a hand-edited text that drops the flag: that launch is not what was priced
    with pytest.raises(ExportError, match="lacks --tp-comm-overlap"):
        parse(text.replace(" \\\n--tp-comm-overlap", ""), "megatron")
    pcie = h100.model_copy(update={"device": "l40s"})
    assert "--tp-comm-overlap" not in export(lay, "megatron", pcie)
    no_sp = lay.model_copy(update={"sp": False})
    with pytest.raises(ExportError, match="without sequence parallel"):
        export(no_sp, "megatron", h100)
    # another stack's plan (no TP overlap priced) exports without the flag
    titan = h100.model_copy(update={"framework": "torchtitan"})
    assert "--tp-comm-overlap" not in export(no_sp, "megatron", titan)
    # tp = 1: nothing to overlap, and no CUDA_DEVICE_MAX_CONNECTIONS requirement
    dp_only = resolve_layout(num_devices=64, global_batch=256, pp=2, zero=1, micro_batch=1)
    text = export(dp_only, "megatron", h100)
    assert "--tp-comm-overlap" not in text and "CUDA_DEVICE_MAX_CONNECTIONS" not in text


def test_prediction_states_what_the_priced_tp_overlap_needs() -> None:
    from autopar.prediction import predict

    kw = dict(model="llama-3.1-8b", num_devices=8, seq_len=4096, global_batch=16, tp=4, micro_batch=1)
    nvlink = predict(device="h100-sxm-80gb", **kw)
    assert any("--tp-comm-overlap" in a and "sequence parallelism" in a for a in nvlink.assumptions)
    pcie = predict(device="l40s", **kw)
    assert not any("--tp-comm-overlap" in a for a in pcie.assumptions)
    job = Job.from_core(CoreJob.model_validate(nvlink.job))
    assert "--tp-comm-overlap" in export(nvlink.layout, "megatron", job)
