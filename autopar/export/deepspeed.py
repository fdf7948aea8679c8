"""DeepSpeed ``ds_config.json`` (keys of DeepSpeed 0.19.x).

* batch: ``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps`` always;
  ``train_batch_size = micro * GAS * dp`` only when ``tp == 1``. DeepSpeed checks
  ``train_batch_size == micro * GAS * world_size`` where ``world_size`` is the DP size when an
  ``mpu`` is passed but the *whole* world under AutoTP without one (the Hugging Face path), so with
  AutoTP the total is left out and DeepSpeed derives it (any two of the three suffice).
* ZeRO: ``zero_optimization.stage``; ``offload`` -> ``offload_optimizer.device = "cpu"``.
* TP: ``tensor_parallel.autotp_size`` (AutoTP training; no Megatron-style sequence parallel,
  so ``sp=True`` is refused).
* EP: ``expert_parallel.{enabled, autoep_size}`` (AutoEP, DeepSpeed >= 0.19; needs a MoE model
  AutoEP recognises). AutoEP reserves expert tensor parallelism (``etp`` must be 1) and has not
  validated offload together with AutoTP folding; both are refused.
* precision: ``bf16.enabled`` / ``fp16.enabled``; fp8 has no ds_config key (refused).
* refused: pipeline parallel (DeepSpeed's PipelineModule is code, not JSON), context parallel
  (Ulysses ``sequence_parallel_size`` is a different scheme), virtual stages, activation
  recompute (switched on in model code), shard groups (MiCS was removed from DeepSpeed).

The model id, sequence length and world size have no ds_config key: they travel in a top-level
``"autopar"`` object (DeepSpeed ignores unknown top-level keys).
"""

from __future__ import annotations

import json
from typing import Any

from autopar.export.base import (
    Exporter,
    ExportError,
    Job,
    build_layout,
    check_header,
    check_keys,
    check_sharding,
    etp_from_header,
    exact_div,
    header_payload,
    inert_etp,
    merge_job,
    register,
    to_int,
    unsupported,
)
from autopar.layout import Layout

FMT = "deepspeed"
TOP_KEYS = (
    "autopar",
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "bf16",
    "fp16",
    "tensor_parallel",
    "expert_parallel",
)


def ds_config(layout: Layout, job: Job) -> dict[str, Any]:
    check_sharding(layout, FMT)
    for cond, feature, hint in (
        (
            layout.pp > 1,
            f"pipeline parallel (pp={layout.pp})",
            "DeepSpeed pipelines are a PipelineModule in code",
        ),
        (layout.vpp > 1, f"virtual pipeline stages (vpp={layout.vpp})", None),
        (layout.cp > 1, f"context parallel (cp={layout.cp})", "DeepSpeed-Ulysses is a different scheme"),
        (layout.sp, "sequence parallel (sp=True)", "AutoTP has no Megatron-style sequence parallelism"),
        (
            layout.recompute != "none",
            f"activation recompute ({layout.recompute})",
            "DeepSpeed switches recompute on in model code, not in ds_config",
        ),
        (
            bool(layout.shard_group),
            f"shard_group={layout.shard_group} (HSDP)",
            "MiCS was removed from DeepSpeed",
        ),
        (
            layout.precision in ("fp8", "mxfp8", "nvfp4"),
            f"{layout.precision} precision",
            "ds_config has no fp8/fp4 switch",
        ),
        (
            layout.ep > 1 and layout.etp != 1,
            f"expert tensor parallel (etp={layout.etp}) with ep={layout.ep}",
            "AutoEP reserves expert_tensor_parallel_size; use etp=1",
        ),
        (
            layout.ep > 1 and layout.tp > 1 and layout.offload,
            "offload with AutoEP+AutoTP folding",
            "DeepSpeed has not validated this combination",
        ),
    ):
        if cond:
            raise unsupported(feature, FMT, hint)
    cfg: dict[str, Any] = {"autopar": header_payload(FMT, job, inert_etp(layout))}
    if layout.tp == 1:
        cfg["train_batch_size"] = job.global_batch
    cfg["train_micro_batch_size_per_gpu"] = layout.micro_batch
    cfg["gradient_accumulation_steps"] = layout.grad_accum
    zero: dict[str, Any] = {"stage": layout.zero}
    if layout.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg["zero_optimization"] = zero
    cfg["bf16"] = {"enabled": layout.precision == "bf16"}
    cfg["fp16"] = {"enabled": layout.precision == "fp16"}
    if layout.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": layout.tp}
    if layout.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": layout.ep}
    return cfg


@register
class DeepSpeedExporter(Exporter):
    name = FMT

    def search_limits(self, job: Job) -> dict[str, list[Any]]:
        # ds_config's refusals above, axis by axis
        return {
            "pp": [1],
            "vpp": [1],
            "pipeline_ends": ["even"],
            "cp": [1],
            "sp": ["off"],
            "recompute": ["none"],
            "shard_group": [0],
            "precision": ["bf16", "fp16", "fp32"],
            "etp": [1],
        }

    suffix = ".json"
    description = "DeepSpeed ds_config.json (ZeRO, offload, AutoTP, AutoEP, batch, precision)"

    def _render(self, layout: Layout, job: Job) -> str:
        return json.dumps(ds_config(layout, job), indent=2)

    def _parse(self, text: str) -> tuple[Layout, Job]:
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as e:
            raise ExportError(f"the {FMT} text is not JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise ExportError(f"the {FMT} text is not a JSON object")
        check_keys(cfg, TOP_KEYS, "the top level", FMT)
        if "autopar" not in cfg:
            raise ExportError(
                f"no 'autopar' key in the {FMT} text", "parse reads text written by `autopar export`"
            )
        header = check_header(cfg["autopar"], FMT)
        zero_cfg = cfg.get("zero_optimization", {})
        check_keys(zero_cfg, ("stage", "offload_optimizer"), "zero_optimization", FMT)
        off = zero_cfg.get("offload_optimizer")
        if off is not None and off != {"device": "cpu"}:
            raise unsupported(
                f"offload_optimizer={off}", "autopar (reading " + FMT + ")", "autopar offloads to cpu"
            )
        tpc = cfg.get("tensor_parallel", {})
        check_keys(tpc, ("autotp_size",), "tensor_parallel", FMT)
        epc = cfg.get("expert_parallel", {"enabled": False})
        check_keys(epc, ("enabled", "autoep_size"), "expert_parallel", FMT)
        tp = to_int(tpc.get("autotp_size", 1), "tensor_parallel.autotp_size", FMT) or 1
        ep = (
            to_int(epc.get("autoep_size", 1), "expert_parallel.autoep_size", FMT) if epc.get("enabled") else 1
        )
        mb = to_int(cfg.get("train_micro_batch_size_per_gpu"), "train_micro_batch_size_per_gpu", FMT)
        ga = to_int(cfg.get("gradient_accumulation_steps", 1), "gradient_accumulation_steps", FMT)
        job_hdr = header["job"]
        dp = exact_div(
            to_int(job_hdr.get("num_devices"), "num_devices", FMT), tp, "num_devices / autotp_size", FMT
        )
        native: dict[str, Any] = {}
        if "train_batch_size" in cfg:
            tb = to_int(cfg["train_batch_size"], "train_batch_size", FMT)
            if tb != mb * ga * dp:
                raise ExportError(f"train_batch_size={tb} != micro*GAS*dp = {mb}*{ga}*{dp} in the {FMT} text")
            native["global_batch"] = tb
        job = merge_job(header, native, FMT)
        for k in ("bf16", "fp16"):
            check_keys(cfg.get(k, {}), ("enabled",), k, FMT)
        bf16, fp16 = bool(cfg.get("bf16", {}).get("enabled")), bool(cfg.get("fp16", {}).get("enabled"))
        if bf16 and fp16:
            raise ExportError(f"bf16 and fp16 both enabled in the {FMT} text")
        layout = build_layout(
            dict(
                tp=tp,
                dp=dp,
                ep=ep,
                etp=etp_from_header(header, tp) if ep == 1 else 1,
                zero=to_int(zero_cfg.get("stage", 0), "zero_optimization.stage", FMT),
                micro_batch=mb,
                grad_accum=ga,
                offload=off is not None,
                precision="bf16" if bf16 else "fp16" if fp16 else "fp32",
            ),
            FMT,
        )
        return layout, job
