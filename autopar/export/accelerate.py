"""Hugging Face Accelerate config YAML (``accelerate launch --config_file``; keys of accelerate 1.15).

The ``distributed_type`` is chosen from the layout, first match wins:

1. ``MEGATRON_LM`` when the layout needs Megatron: ``pp > 1``, ``ep > 1``, or TP/CP without
   FSDP (``zero <= 1``). Accelerate's Megatron plugin always passes a recompute granularity
   (default ``full``, method ``uniform``, and Megatron rejects a method with ``selective``), so
   only ``recompute="full"`` is expressible there; ``megatron_lm_context_parallel_size`` defaults
   to 2 in the plugin and is therefore always written. No virtual stages, FSDP, shard groups or fp8.
2. ``FSDP`` (``fsdp_version: 2`` + ``parallelism_config_*``) for ``zero`` 2/3 without offload:
   ``dp_shard = shard_group / cp``, ``dp_replicate = dp / dp_shard``,
   ``fsdp_reshard_after_forward`` true (ZeRO-3) / false (ZeRO-2), full recompute via
   ``fsdp_activation_checkpointing``. TP here is transformers' ``tp_plan``, not Megatron sequence
   parallelism, so ``sp=True`` is refused; so is FSDP2's parameter offload (not optimizer offload).
3. ``DEEPSPEED`` for ``zero=1`` or optimizer offload (``offload_optimizer_device: cpu``), data
   parallel only.
4. ``MULTI_GPU`` (or ``NO`` on one device) for plain DDP.

Accelerate's config has no key for the micro-batch, the sequence length or (outside DeepSpeed and
Megatron) gradient accumulation: the training script sets them. They travel in the autopar header
so that the script (or ``autopar export --format env``) can read them; the header is context,
the YAML is what ``accelerate launch`` enforces.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from autopar.export.base import (
    Exporter,
    ExportError,
    Job,
    build_layout,
    check_keys,
    check_sharding,
    etp_from_header,
    exact_div,
    header_line,
    inert_etp,
    merge_job,
    read_header,
    register,
    to_int,
    unsupported,
)
from autopar.layout import Layout

FMT = "accelerate"
MIXED = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "fp8": "fp8"}
COMMON = (
    "compute_environment",
    "distributed_type",
    "mixed_precision",
    "num_machines",
    "num_processes",
    "machine_rank",
    "main_training_function",
    "rdzv_backend",
    "same_network",
    "use_cpu",
)
SUB = {
    "fsdp_config": (
        "fsdp_version",
        "fsdp_reshard_after_forward",
        "fsdp_auto_wrap_policy",
        "fsdp_offload_params",
        "fsdp_state_dict_type",
        "fsdp_activation_checkpointing",
        "fsdp_cpu_ram_efficient_loading",
    ),
    "parallelism_config": (
        "parallelism_config_dp_replicate_size",
        "parallelism_config_dp_shard_size",
        "parallelism_config_tp_size",
        "parallelism_config_cp_size",
    ),
    "deepspeed_config": (
        "zero_stage",
        "gradient_accumulation_steps",
        "offload_optimizer_device",
        "offload_param_device",
        "zero3_init_flag",
    ),
    "megatron_lm_config": (
        "megatron_lm_tp_degree",
        "megatron_lm_pp_degree",
        "megatron_lm_num_micro_batches",
        "megatron_lm_sequence_parallelism",
        "megatron_lm_recompute_granularity",
        "megatron_lm_recompute_method",
        "megatron_lm_recompute_num_layers",
        "megatron_lm_use_distributed_optimizer",
        "megatron_lm_context_parallel_size",
        "megatron_lm_expert_model_parallel_size",
        "megatron_lm_expert_tensor_parallel_size",
        "megatron_lm_optimizer_cpu_offload",
        "megatron_lm_use_precision_aware_optimizer",
    ),
}


def distributed_type(layout: Layout) -> str:
    if layout.pp > 1 or layout.ep > 1 or (layout.zero <= 1 and (layout.tp > 1 or layout.cp > 1)):
        return "MEGATRON_LM"
    if layout.zero >= 2 and not layout.offload:
        return "FSDP"
    if layout.zero >= 1 or layout.offload:
        return "DEEPSPEED"
    return "MULTI_GPU" if layout.num_devices > 1 else "NO"


def accelerate_config(layout: Layout, job: Job) -> dict[str, Any]:
    check_sharding(layout, FMT)
    if layout.precision not in MIXED:
        raise unsupported(f"{layout.precision} precision", FMT, f"mixed_precision takes {', '.join(MIXED)}")
    kind = distributed_type(layout)
    if job.framework == "fsdp" and kind in ("MEGATRON_LM", "DEEPSPEED"):
        # the plan was priced as PyTorch FSDP (autopar.frameworks FSDP): another stack is another plan
        raise unsupported(
            f"a plan priced for PyTorch FSDP (framework fsdp) that needs {kind}",
            FMT,
            "fsdp plans launch as FSDP (zero 2/3 without offload) or DDP (zero=0, data parallel only)",
        )
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": kind,
        "mixed_precision": MIXED[layout.precision],
        "num_machines": job.nnodes,
        "num_processes": job.num_devices,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if kind == "MEGATRON_LM":
        for cond, feature in (
            (layout.vpp > 1, f"virtual pipeline stages (vpp={layout.vpp})"),
            (layout.zero >= 2, f"FSDP (zero={layout.zero}) with Megatron-LM"),
            (bool(layout.shard_group), f"shard_group={layout.shard_group}"),
            (layout.precision == "fp8", "fp8 precision with Megatron-LM"),
        ):
            if cond:
                raise unsupported(feature, f"{FMT} (MEGATRON_LM)")
        if layout.recompute != "full":
            raise unsupported(
                f"recompute={layout.recompute} with Megatron-LM",
                f"{FMT} (MEGATRON_LM)",
                "accelerate's Megatron plugin always passes a recompute granularity; only full works",
            )
        if layout.ep > 1 and layout.precision == "fp16":
            raise unsupported(f"expert parallel (ep={layout.ep}) with fp16", f"{FMT} (MEGATRON_LM)")
        if layout.cp > 1 and job.seq_len % (2 * layout.cp):
            raise unsupported(
                f"context parallel (cp={layout.cp}) with seq_len={job.seq_len}", f"{FMT} (MEGATRON_LM)"
            )
        cfg["megatron_lm_config"] = {
            "megatron_lm_tp_degree": layout.tp,
            "megatron_lm_pp_degree": layout.pp,
            "megatron_lm_num_micro_batches": layout.grad_accum,
            "megatron_lm_sequence_parallelism": layout.sp,
            "megatron_lm_recompute_granularity": "full",
            "megatron_lm_recompute_method": "uniform",
            "megatron_lm_recompute_num_layers": 1,
            "megatron_lm_use_distributed_optimizer": layout.zero == 1,
            "megatron_lm_context_parallel_size": layout.cp,
            "megatron_lm_expert_model_parallel_size": layout.ep,
            "megatron_lm_expert_tensor_parallel_size": layout.etp,
            "megatron_lm_optimizer_cpu_offload": layout.offload,
            "megatron_lm_use_precision_aware_optimizer": layout.offload,
        }
    elif kind == "FSDP":
        if layout.sp:
            raise unsupported(
                "sequence parallel (sp=True)",
                f"{FMT} (FSDP)",
                "accelerate's TP is transformers' tp_plan, not Megatron sequence parallelism",
            )
        if layout.recompute == "selective":
            raise unsupported(
                "selective recompute", f"{FMT} (FSDP)", "fsdp_activation_checkpointing is full recompute"
            )
        if layout.shard_size % layout.cp:
            raise unsupported(
                f"shard_group={layout.shard_size} not a multiple of cp={layout.cp}", f"{FMT} (FSDP)"
            )
        dp_shard = layout.shard_size // layout.cp
        if dp_shard * layout.cp == 1:
            raise unsupported(
                f"ZeRO-{layout.zero} over a single rank",
                f"{FMT} (FSDP)",
                "accelerate refuses FSDP with nothing to shard across; use zero=0",
            )
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": layout.zero == 3,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_offload_params": False,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_activation_checkpointing": layout.recompute == "full",
            "fsdp_cpu_ram_efficient_loading": True,
        }
        cfg["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": layout.dp // dp_shard,
            "parallelism_config_dp_shard_size": dp_shard,
            "parallelism_config_tp_size": layout.tp,
            "parallelism_config_cp_size": layout.cp,
        }
    else:
        for cond, feature in (
            (layout.tp > 1, f"tensor parallel (tp={layout.tp})"),
            (layout.cp > 1, f"context parallel (cp={layout.cp})"),
            (layout.recompute != "none", f"recompute={layout.recompute}"),
            (layout.precision == "fp8" and kind == "DEEPSPEED", "fp8 precision"),
        ):
            if cond:
                raise unsupported(
                    feature,
                    f"{FMT} ({kind})",
                    "recompute is switched on in model code" if "recompute" in feature else None,
                )
        if kind == "DEEPSPEED":
            if layout.shard_group:
                raise unsupported(f"shard_group={layout.shard_group}", f"{FMT} (DEEPSPEED)")
            cfg["deepspeed_config"] = {
                "zero_stage": layout.zero,
                "gradient_accumulation_steps": layout.grad_accum,
                "offload_optimizer_device": "cpu" if layout.offload else "none",
                "offload_param_device": "none",
                "zero3_init_flag": layout.zero == 3,
            }
    return cfg


@register
class AccelerateExporter(Exporter):
    name = FMT
    suffix = ".yaml"
    description = "Hugging Face Accelerate config (FSDP2, DEEPSPEED, MEGATRON_LM or MULTI_GPU)"

    def search_limits(self, job: Job) -> dict[str, list[Any]]:
        if job.framework != "fsdp":
            return {}
        # an fsdp plan runs as FSDP2 (accelerate_config's refusals on that path); DDP (zero=0) only
        # without tp and cp, which axes cannot say, so the search keeps FSDP (zero 2/3) only
        return {
            "pp": [1],
            "vpp": [1],
            "pipeline_ends": ["even"],
            "ep": [1],
            "sp": ["off"],
            "recompute": ["none", "full"],
            "offload": [False],
            "zero": [2, 3],
            "precision": ["bf16", "fp16", "fp32", "fp8"],
        }

    def _render(self, layout: Layout, job: Job) -> str:
        cfg = accelerate_config(layout, job)
        inert = inert_etp(layout) if cfg["distributed_type"] != "MEGATRON_LM" else {}
        batch = json.dumps(
            {"micro_batch": layout.micro_batch, "grad_accum": layout.grad_accum}, sort_keys=True
        )
        return "\n".join(
            [
                header_line(FMT, job, inert),
                f"# accelerate config for layout: {layout.short()}",
                f"# the training script sets the batch: {batch} (seq_len={job.seq_len})",
                yaml.safe_dump(cfg, sort_keys=False).rstrip("\n"),
            ]
        )

    def _parse(self, text: str) -> tuple[Layout, Job]:
        header = read_header(text, FMT)
        assert header is not None
        try:
            cfg = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ExportError(f"the {FMT} text is not YAML: {e}") from None
        if not isinstance(cfg, dict):
            raise ExportError(f"the {FMT} text is not a YAML mapping")
        kind = cfg.get("distributed_type")
        sub = {
            "MEGATRON_LM": ("megatron_lm_config",),
            "FSDP": ("fsdp_config", "parallelism_config"),
            "DEEPSPEED": ("deepspeed_config",),
            "MULTI_GPU": (),
            "NO": (),
        }.get(kind)  # type: ignore[arg-type]
        if sub is None:
            raise unsupported(f"distributed_type {kind!r}", "autopar (reading " + FMT + ")")
        check_keys(cfg, COMMON + sub, "the top level", FMT)
        for s in sub:
            check_keys(cfg.get(s) or {}, SUB[s], s, FMT)
        precision = {v: k for k, v in MIXED.items()}.get(cfg.get("mixed_precision", "no"))
        if precision is None:
            raise ExportError(f"mixed_precision={cfg.get('mixed_precision')!r} in the {FMT} text")
        num_devices = to_int(cfg.get("num_processes"), "num_processes", FMT)
        job = merge_job(header, {"num_devices": num_devices}, FMT)
        machines = to_int(cfg.get("num_machines", 1), "num_machines", FMT)
        if machines != job.nnodes:
            raise ExportError(f"num_machines={machines} but the job spans {job.nnodes} node(s) ({FMT})")
        # micro-batch and gradient accumulation outside DeepSpeed/Megatron come from the header line
        batch_line = next(
            (ln for ln in text.splitlines() if ln.startswith("# the training script sets the batch:")), ""
        )
        try:
            batch: Any = json.loads(batch_line.split(":", 1)[1].rsplit("(", 1)[0]) if batch_line else None
            mb = to_int(batch["micro_batch"], "micro_batch", FMT)
            ga_hdr = to_int(batch["grad_accum"], "grad_accum", FMT)
        except (TypeError, KeyError, IndexError, ValueError):
            raise ExportError(
                f"the batch comment line of the {FMT} text is missing or malformed",
                "parse reads text written by `autopar export`",
            ) from None
        v: dict[str, Any] = dict(micro_batch=mb, precision=precision)
        if kind == "MEGATRON_LM":
            m = cfg["megatron_lm_config"]
            if (
                m.get("megatron_lm_recompute_granularity"),
                m.get("megatron_lm_recompute_method"),
                m.get("megatron_lm_recompute_num_layers"),
            ) != ("full", "uniform", 1):
                raise unsupported("recompute other than full/uniform/1", "autopar (reading " + FMT + ")")
            v.update(
                tp=to_int(m.get("megatron_lm_tp_degree", 1), "tp", FMT),
                pp=to_int(m.get("megatron_lm_pp_degree", 1), "pp", FMT),
                cp=to_int(m.get("megatron_lm_context_parallel_size"), "cp", FMT),
                ep=to_int(m.get("megatron_lm_expert_model_parallel_size", 1), "ep", FMT),
                etp=to_int(m.get("megatron_lm_expert_tensor_parallel_size", 1), "etp", FMT),
                sp=bool(m.get("megatron_lm_sequence_parallelism")),
                recompute="full",
                zero=1 if m.get("megatron_lm_use_distributed_optimizer") else 0,
                offload=bool(m.get("megatron_lm_optimizer_cpu_offload")),
            )
            if bool(m.get("megatron_lm_use_precision_aware_optimizer")) != v["offload"]:
                raise ExportError(f"optimizer offload without the precision-aware optimizer ({FMT})")
            ga = to_int(m.get("megatron_lm_num_micro_batches", 1), "megatron_lm_num_micro_batches", FMT)
        elif kind == "FSDP":
            f, p = cfg["fsdp_config"], cfg["parallelism_config"]
            if f.get("fsdp_version") != 2 or f.get("fsdp_offload_params"):
                raise unsupported("FSDP v1 or FSDP parameter offload", "autopar (reading " + FMT + ")")
            rep = to_int(p.get("parallelism_config_dp_replicate_size", 1), "dp_replicate_size", FMT)
            shard = to_int(p.get("parallelism_config_dp_shard_size", 1), "dp_shard_size", FMT)
            cp = to_int(p.get("parallelism_config_cp_size", 1), "cp_size", FMT)
            v.update(
                tp=to_int(p.get("parallelism_config_tp_size", 1), "tp_size", FMT),
                cp=cp,
                dp=rep * shard,
                zero=3 if f.get("fsdp_reshard_after_forward", True) else 2,
                shard_group=shard * cp if rep > 1 else 0,
                recompute="full" if f.get("fsdp_activation_checkpointing") else "none",
            )
            ga = ga_hdr
        elif kind == "DEEPSPEED":
            d = cfg["deepspeed_config"]
            off = d.get("offload_optimizer_device", "none")
            if off not in ("none", "cpu") or d.get("offload_param_device", "none") != "none":
                raise unsupported("offload other than the optimizer to cpu", "autopar (reading " + FMT + ")")
            v.update(zero=to_int(d.get("zero_stage", 0), "zero_stage", FMT), offload=off == "cpu")
            ga = to_int(d.get("gradient_accumulation_steps", 1), "gradient_accumulation_steps", FMT)
        else:  # plain DDP (MULTI_GPU / NO): no sharded optimizer
            v.update(zero=0)
            ga = ga_hdr
        if ga != ga_hdr:
            raise ExportError(f"gradient accumulation {ga} in the {FMT} config != {ga_hdr} in its batch line")
        tp, pp, cp = v.get("tp", 1), v.get("pp", 1), v.get("cp", 1)
        v.setdefault("dp", exact_div(job.num_devices, tp * pp * cp, "num_devices / (tp*pp*cp)", FMT))
        v["grad_accum"] = ga
        if "etp" not in v:
            v["etp"] = etp_from_header(header, tp)
        if job.global_batch != mb * ga * v["dp"]:
            raise ExportError(
                f"micro_batch*grad_accum*dp = {mb}*{ga}*{v['dp']} != global_batch={job.global_batch} "
                f"in the {FMT} text"
            )
        return build_layout(v, FMT), job
