"""Price what you export, export what you price (issue 21 item 5).

Every time setting a framework profile assumes (``autopar.frameworks.FrameworkProfile``, the fields
that are not memory) is, for the framework's own export format (``FRAMEWORK_EXPORT_FORMAT``),
either the launcher's default (the export must not override it) or written by the exporter (checked
on the rendered text, through the launcher's own config classes where they are installed). A new
profile field, or a profile value without a check here, fails the walk.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable

import pytest
import yaml
from test_export_validators import _megatron_flags as megatron_flags

from autopar.export import Job, export
from autopar.export.base import get_exporter
from autopar.frameworks import PROFILES, FrameworkProfile
from autopar.job import FRAMEWORK_EXPORT_FORMAT
from autopar.layout import resolve_layout

MEMORY_FIELDS = {
    "name",
    "weight_bytes",
    "weight_shard_stage",
    "grad_bytes",
    "grad_shard_stage",
    "optimizer_bytes",
    "optimizer_shard_stage",
    "fragmentation",
    "framework_reserve_gib",
    "reported_basis",
}
TIME_FIELDS = sorted(set(FrameworkProfile.model_fields) - MEMORY_FIELDS)


def job(framework: str, **kw) -> Job:
    base = dict(
        model="llama-3.1-8b",
        num_devices=64,
        seq_len=8192,
        global_batch=256,
        num_layers=32,
        device="h100-sxm-80gb",
        framework=framework,
    )
    return Job(**{**base, **kw})


def texts(framework: str) -> list[str]:
    """The framework's export of a few launchable layouts (its search limits applied)."""
    fmt = FRAMEWORK_EXPORT_FORMAT[framework]
    limits = get_exporter(fmt).search_limits(job(framework))
    zero = 3 if 3 in limits.get("zero", [3]) else 1
    cands = [
        dict(dp=64, zero=zero),
        dict(tp=2, dp=32, zero=zero),
        dict(tp=2, pp=2, vpp=2, dp=16, zero=zero),
        dict(tp=2, pp=2, dp=16, zero=1),
    ]
    out = []
    for c in cands:
        lay = resolve_layout(num_devices=64, global_batch=256, micro_batch=1, **c)
        try:
            out.append(export(lay, fmt, job(framework)))
        except Exception:  # noqa: BLE001 - layouts this launcher does not run
            continue
    assert out, framework
    return out


def body(fmt: str, text: str) -> dict:
    if fmt == "megatron":
        return megatron_flags(text)
    if fmt == "torchtitan":  # torchtitan 0.3: --section.field overrides of the config function
        return titan_overrides(text)
    if fmt == "deepspeed":
        return json.loads(text)
    return yaml.safe_load("\n".join(ln for ln in text.splitlines() if not ln.startswith("#")))


def titan_overrides(text: str) -> dict[str, dict[str, object]]:
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    toks = shlex.split(body.replace("\\\n", " "))
    toks = toks[toks.index("torchtitan.train") + 1 :]
    out: dict[str, dict[str, object]] = {}
    for i, t in enumerate(toks):
        if t.startswith("--") and "." in t:
            section, _, field = t[2:].partition(".")
            nxt = toks[i + 1] if i + 1 < len(toks) else ""
            out.setdefault(section, {})[field] = True if nxt.startswith(("--", "activation-")) else nxt
    return out


def titan_eager(framework: str, fmt: str) -> None:
    """torchtitan 0.3 captures CUDA graphs by default: every export switches them off (and
    compiles nothing), the eager launches the host floor prices."""
    for t in texts(framework):
        d = titan_overrides(t)
        assert d["training"]["disable_cuda_graphs"] is True and "compile" not in d


def flat_keys(d: object) -> set[str]:
    if isinstance(d, dict):
        return set(d) | {k for v in d.values() for k in flat_keys(v)}
    return set()


def not_overridden(*keys: str) -> Callable[[str, str], None]:
    """The launcher's default holds: the export sets none of ``keys``."""

    def check(framework: str, fmt: str) -> None:
        for t in texts(framework):
            assert not flat_keys(body(fmt, t)) & set(keys), (framework, keys)

    return check


def megatron_tp_overlap(framework: str, fmt: str) -> None:
    lay = resolve_layout(num_devices=64, global_batch=256, tp=2, dp=32, micro_batch=1)
    flags = megatron_flags(export(lay, fmt, job(framework)))
    assert flags.get("tp_comm_overlap") is True and flags.get("sequence_parallel") is True
    mcore = pytest.importorskip("megatron.core.transformer.transformer_config")
    mcore.TransformerConfig(
        num_layers=32,
        hidden_size=256,
        num_attention_heads=8,
        tensor_model_parallel_size=2,
        sequence_parallel=True,
        tp_comm_overlap=True,
    )


def megatron_param_gather(framework: str, fmt: str) -> None:
    lay = resolve_layout(num_devices=64, global_batch=256, tp=2, dp=32, zero=1, micro_batch=1)
    flags = megatron_flags(export(lay, fmt, job(framework)))
    assert flags.get("overlap_param_gather") is True and flags.get("overlap_grad_reduce") is True
    ddp = pytest.importorskip("megatron.core.distributed")
    cfg = ddp.DistributedDataParallelConfig(
        use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True
    )
    assert cfg.overlap_param_gather


def schedules_written(framework: str, fmt: str) -> None:
    """Every schedule the profile runs renders (pp > 1) and is named as the launcher spells it;
    a launcher without pipeline parallelism pins pp to 1 in its search limits."""
    exporter = get_exporter(fmt)
    if exporter.search_limits(job(framework)).get("pp") == [1]:
        return
    from autopar.schedules import TORCHTITAN_NAMES

    for sched in PROFILES[framework].pipeline_schedules:
        lay = resolve_layout(
            num_devices=64, global_batch=256, tp=2, pp=2, vpp=2, dp=16, micro_batch=1, zero=3
        )
        if fmt == "megatron":
            lay = lay.model_copy(update={"zero": 1})
        text = export(lay, fmt, job(framework, pipeline_schedule=sched))
        if fmt == "torchtitan":
            name = titan_overrides(text)["parallelism"]["pipeline_parallel_schedule"]
            assert name == TORCHTITAN_NAMES.get(sched, "Interleaved1F1B")
        else:
            assert sched == "1f1b" and "--num-virtual-stages-per-pipeline-rank 2" in text


def deepspeed_reduce_dtype(framework: str, fmt: str) -> None:
    not_overridden("communication_data_type", "grad_accum_dtype")(framework, fmt)


# (field, value, format) -> the check; "default" checks name the launcher keys that would override it.
HOST_FLOOR = not_overridden("enable_cuda_graph", "cuda_graph_impl", "compile", "external_cuda_graph")
CHECKS: dict[tuple[str, object, str], Callable[[str, str], None] | None] = {
    # Megatron-LM: TE is the default --transformer-impl, attention backend auto (cuDNN fused on sm90)
    ("attention", "te", "megatron"): not_overridden(
        "transformer_impl", "attention_backend", "use_flash_attn"
    ),
    ("attention", "flash", "torchtitan"): not_overridden("attn_type", "use_flex_attn"),  # SDPA default
    ("attention", "flash", "accelerate"): not_overridden("attn_implementation"),  # the model's code
    ("attention", "unfused", "deepspeed"): not_overridden("sparse_attention"),  # the model's code
    ("tp_comm_overlap", True, "megatron"): megatron_tp_overlap,
    ("tp_comm_overlap", False, "torchtitan"): not_overridden("enable_async_tensor_parallel"),
    ("tp_comm_overlap", False, "accelerate"): not_overridden("megatron_lm_tp_comm_overlap"),
    ("tp_comm_overlap", False, "deepspeed"): not_overridden("tp_overlap_comm"),
    ("param_gather_overlap", True, "megatron"): megatron_param_gather,
    ("param_gather_overlap", False, "torchtitan"): not_overridden("overlap_param_gather"),
    ("param_gather_overlap", False, "accelerate"): not_overridden("overlap_param_gather"),
    ("param_gather_overlap", False, "deepspeed"): not_overridden("overlap_comm"),
    # Megatron-LM arguments.py: bf16 turns on accumulate_allreduce_grads_in_fp32 (not overridden)
    ("grad_reduce_fp32", True, "megatron"): not_overridden(
        "accumulate_allreduce_grads_in_fp32", "grad_reduce_in_bf16"
    ),
    # torchtitan's mixed_precision_reduce defaults to float32
    ("grad_reduce_fp32", True, "torchtitan"): not_overridden("mixed_precision_reduce"),
    # accelerate's FSDP plugin reduces in the mixed-precision dtype unless a policy says otherwise
    ("grad_reduce_fp32", False, "accelerate"): not_overridden(
        "fsdp_mixed_precision_policy", "mixed_precision_policy"
    ),
    ("grad_reduce_fp32", False, "deepspeed"): deepspeed_reduce_dtype,
    ("pipeline_schedules", ("1f1b",), "megatron"): schedules_written,
    ("pipeline_schedules", ("1f1b", "zb", "zbv", "dualpipev"), "torchtitan"): schedules_written,
    ("pipeline_schedules", ("1f1b",), "accelerate"): schedules_written,
    ("pipeline_schedules", ("1f1b",), "deepspeed"): schedules_written,
    # the host floor assumes eager launches: no CUDA graphs / compile switched on by the export
    **{
        ("kernels_per_layer", p.kernels_per_layer, FRAMEWORK_EXPORT_FORMAT[n]): (
            titan_eager if FRAMEWORK_EXPORT_FORMAT[n] == "torchtitan" else HOST_FLOOR
        )
        for n, p in PROFILES.items()
    },
    **{
        ("launch_latency_us", p.launch_latency_us, FRAMEWORK_EXPORT_FORMAT[n]): (
            titan_eager if FRAMEWORK_EXPORT_FORMAT[n] == "torchtitan" else HOST_FLOOR
        )
        for n, p in PROFILES.items()
    },
    # torchtitan under PP: torch.distributed.pipelining itself defers FSDP's gradient sync to the step's
    # last backward; no launch setting turns it on or off
    ("fsdp_pp_defer", True, "torchtitan"): None,
    # the other stacks' ZeRO-3/FSDP has no such deferral to switch on (Megatron-FSDP, DeepSpeed ZeRO-3,
    # accelerate's FSDP without pipeline parallelism): nothing a launch sets
    **{
        ("fsdp_pp_defer", False, FRAMEWORK_EXPORT_FORMAT[n]): None
        for n, p in PROFILES.items()
        if not p.fsdp_pp_defer
    },
    # a measured rate of the stack's own ZeRO-3 code (DeepSpeed 0.3.x), not a launch setting
    **{
        ("zero3_fetch_gbps", p.zero3_fetch_gbps, FRAMEWORK_EXPORT_FORMAT[n]): None
        for n, p in PROFILES.items()
    },
}


@pytest.mark.parametrize("field", TIME_FIELDS)
@pytest.mark.parametrize("framework", sorted(PROFILES))
def test_every_priced_feature_is_the_launchers_default_or_exported(framework: str, field: str) -> None:
    fmt = FRAMEWORK_EXPORT_FORMAT[framework]
    value = getattr(PROFILES[framework], field)
    key = (field, value, fmt)
    assert key in CHECKS, f"profile {framework} prices {field}={value!r}: say how {fmt} launches it"
    check = CHECKS[key]
    if check is not None:
        check(framework, fmt)


def test_every_profile_has_an_export_format() -> None:
    assert set(PROFILES) == set(FRAMEWORK_EXPORT_FORMAT)
