"""Megatron Bridge (NeMo's successor to NeMo 2 recipes): Hydra/OmegaConf dotted overrides.

Append the lines to ``python scripts/training/run_recipe.py --recipe <name>_pretrain_config``.
Recipes ship their own parallelism (e.g. llama3_70b: TP=8, PP=4, VPP=5, SP on, distributed
optimizer on), so *every* knob is written, including the "off" states (``...=null``,
``...=false``); otherwise the recipe's value would silently survive. Field names are
Megatron-Core's (``model.*`` = TransformerConfig, ``ddp.*`` = DistributedDataParallelConfig,
``optimizer.*`` = OptimizerConfig) plus Bridge's ``train.*``, ``dataset.*``, ``dist.*``,
``checkpoint.*`` and ``mixed_precision`` recipe names. ZeRO and offload follow
:mod:`autopar.export.megatron` (zero=2/3 = Megatron-FSDP ``optim_grads``/``optim_grads_params``,
which also needs ``checkpoint.ckpt_format=fsdp_dtensor`` and ``ddp.average_in_collective=false``).
fp32 is refused: Bridge's ``mixed_precision`` takes recipe names (``bf16_mixed``, ``fp16_mixed``,
``bf16_with_fp8_delayed_scaling_mixed``, ...) and autopar has not verified a full-fp32 one.
"""

from __future__ import annotations

import shlex
from typing import Any

from autopar.export.base import (
    Exporter,
    ExportError,
    Job,
    build_layout,
    canonical_shard_group,
    check_sharding,
    exact_div,
    header_line,
    merge_job,
    pipeline_split,
    read_header,
    recompute_mode,
    recompute_modules,
    register,
    shard_instances,
    shell_lines,
    split_from_account_for,
    strip_comments,
    to_int,
    unsupported,
)
from autopar.export.megatron import FSDP_CONNECTIONS_NOTE
from autopar.layout import Layout

FMT = "megatron_bridge"
# Bridge's registered recipe names (megatron/bridge/training/mixed_precision.py): mxfp8 = fp8 e4m3
# with fp8_recipe mxfp8, nvfp4 = fp4 e2m1 with fp4_recipe nvfp4, both on a bf16 base.
MIXED_PRECISION = {
    "bf16": "bf16_mixed",
    "fp16": "fp16_mixed",
    "fp8": "bf16_with_fp8_delayed_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}
FSDP_STRATEGY = {0: "no_shard", 1: "no_shard", 2: "optim_grads", 3: "optim_grads_params"}
KEYS = (
    "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size",
    "model.num_layers_in_first_pipeline_stage",
    "model.num_layers_in_last_pipeline_stage",
    "model.account_for_embedding_in_pipeline_split",
    "model.account_for_loss_in_pipeline_split",
    "model.context_parallel_size",
    "model.expert_model_parallel_size",
    "model.expert_tensor_parallel_size",
    "model.sequence_parallel",
    "model.recompute_granularity",
    "model.recompute_method",
    "model.recompute_num_layers",
    "model.recompute_modules",
    "model.seq_length",
    "dataset.seq_length",
    "train.micro_batch_size",
    "train.global_batch_size",
    "ddp.use_distributed_optimizer",
    "optimizer.use_distributed_optimizer",
    "ddp.overlap_grad_reduce",
    "ddp.overlap_param_gather",
    "dist.use_megatron_fsdp",
    "ddp.use_megatron_fsdp",
    "ddp.data_parallel_sharding_strategy",
    "ddp.num_distributed_optimizer_instances",
    "ddp.average_in_collective",
    "checkpoint.ckpt_format",
    "optimizer.optimizer_cpu_offload",
    "optimizer.optimizer_offload_fraction",
    "optimizer.use_precision_aware_optimizer",
    "mixed_precision",
)


def _v(x: Any) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true" if x else "false"
    return str(x)


def _split_overrides(layout: Layout, job: Job) -> dict[str, Any]:
    """The first/last stage layers as Megatron-Core TransformerConfig fields (one form; see
    :func:`autopar.export.base.pipeline_split`), with the other form written off.

    Recipes set their own split (llama31_405b_pretrain_config sets
    ``account_for_embedding/loss_in_pipeline_split=True``) and Megatron-Core refuses
    ``num_layers_in_first/last_pipeline_stage`` together with either flag
    (TransformerConfig.__post_init__), so all four keys are written under pipeline parallelism:
    the recipe's split never survives next to the scored one, nor replaces an even split."""
    if layout.pp == 1:
        return {}
    form, first, last = pipeline_split(layout, job, FMT)
    if form == "account_for":
        return {
            "model.num_layers_in_first_pipeline_stage": None,
            "model.num_layers_in_last_pipeline_stage": None,
            "model.account_for_embedding_in_pipeline_split": bool(first),
            "model.account_for_loss_in_pipeline_split": bool(last),
        }
    return {
        "model.num_layers_in_first_pipeline_stage": first or None,
        "model.num_layers_in_last_pipeline_stage": last or None,
        "model.account_for_embedding_in_pipeline_split": False,
        "model.account_for_loss_in_pipeline_split": False,
    }


def bridge_overrides(layout: Layout, job: Job) -> dict[str, Any]:
    check_sharding(layout, FMT)
    if layout.precision == "fp32":
        raise unsupported(
            "fp32 precision", FMT, "Bridge's mixed_precision takes bf16/fp16/fp8/mxfp8/nvfp4 recipe names"
        )
    if layout.vpp > 1 and layout.pp < 2:
        raise unsupported(
            f"interleaved pipeline (vpp={layout.vpp}) with pp={layout.pp}", FMT, "needs pp >= 2"
        )
    if layout.cp > 1 and job.seq_len % (2 * layout.cp):
        raise unsupported(
            f"context parallel (cp={layout.cp}) with seq_len={job.seq_len}",
            FMT,
            "Megatron needs seq_len divisible by 2*cp",
        )
    if layout.ep > 1 and layout.precision == "fp16":
        raise unsupported(f"expert parallel (ep={layout.ep}) with fp16", FMT, "Megatron refuses EP with fp16")
    fsdp = layout.zero >= 2
    o: dict[str, Any] = {
        "model.tensor_model_parallel_size": layout.tp,
        "model.pipeline_model_parallel_size": layout.pp,
        "model.virtual_pipeline_model_parallel_size": layout.vpp if layout.vpp > 1 else None,
        **_split_overrides(layout, job),
        "model.context_parallel_size": layout.cp,
        "model.expert_model_parallel_size": layout.ep,
        "model.expert_tensor_parallel_size": layout.etp,
        "model.sequence_parallel": layout.sp,
        "model.recompute_granularity": {"none": None, "full": "full"}.get(layout.recompute, "selective"),
        # Hydra list syntax, as Bridge's own perf scripts pass it: [mla_up_proj,layernorm].
        "model.recompute_modules": (
            "[" + ",".join(recompute_modules(layout.recompute, job, FMT)) + "]"
            if layout.recompute in ("norm_act", "norm_act_mlp")
            else None
        ),
        "model.recompute_method": "uniform" if layout.recompute == "full" else None,
        "model.recompute_num_layers": 1 if layout.recompute == "full" else None,
        "model.seq_length": job.seq_len,
        "dataset.seq_length": job.seq_len,
        "train.micro_batch_size": layout.micro_batch,
        "train.global_batch_size": job.global_batch,
        "ddp.use_distributed_optimizer": layout.zero >= 1,
        "optimizer.use_distributed_optimizer": layout.zero >= 1,
        # The data-parallel overlap autopar's cost model assumes (see the megatron exporter).
        "ddp.overlap_grad_reduce": layout.zero <= 1 and layout.dp * layout.cp > 1,
        "ddp.overlap_param_gather": layout.zero == 1 and layout.dp * layout.cp > 1,
        "dist.use_megatron_fsdp": fsdp,
        "ddp.use_megatron_fsdp": fsdp,
        "ddp.data_parallel_sharding_strategy": FSDP_STRATEGY[layout.zero],
        "ddp.num_distributed_optimizer_instances": shard_instances(layout)
        if canonical_shard_group(layout)
        else 1,
    }
    if fsdp:
        o["ddp.average_in_collective"] = False
        o["checkpoint.ckpt_format"] = "fsdp_dtensor"
    o.update(
        {
            "optimizer.optimizer_cpu_offload": layout.offload,
            "optimizer.optimizer_offload_fraction": 1.0 if layout.offload else 0.0,
            "optimizer.use_precision_aware_optimizer": layout.offload,
            "mixed_precision": MIXED_PRECISION[layout.precision],
        }
    )
    return o


def _scalar(raw: str, key: str) -> Any:
    if raw == "null":
        return None
    if raw in ("true", "false"):
        return raw == "true"
    return raw


@register
class MegatronBridgeExporter(Exporter):
    name = FMT
    stage_layers = True
    module_recompute = True
    suffix = ".overrides"
    description = "Megatron Bridge recipe overrides (append to run_recipe.py --recipe <recipe>)"

    def _render(self, layout: Layout, job: Job) -> str:
        o = bridge_overrides(layout, job)
        return "\n".join(
            [
                header_line(FMT, job),
                f"# Megatron Bridge overrides for layout: {layout.short()}",
                # ConfigContainer validation asserts it with Megatron-FSDP (as Megatron-LM does)
                *([FSDP_CONNECTIONS_NOTE] if layout.zero >= 2 else []),
                shell_lines((shlex.quote(f"{k}={_v(v)}") for k, v in o.items()), indent=""),
            ]
        )

    def _parse(self, text: str) -> tuple[Layout, Job]:
        header = read_header(text, FMT)
        o: dict[str, Any] = {}
        for tok in shlex.split(strip_comments(text)):
            key, eq, raw = tok.partition("=")
            if not eq or key not in KEYS:
                raise ExportError(
                    f"unknown override {tok!r} in the {FMT} text", f"autopar reads only {', '.join(KEYS)}"
                )
            if key in o:
                raise ExportError(f"{key} given twice in the {FMT} text")
            o[key] = _scalar(raw, key)

        def num(key: str, default: int | None = None) -> int:
            v = o.get(key)
            if v is None:
                if default is None:
                    raise ExportError(f"{key} missing from the {FMT} text")
                return default
            return to_int(v, key, FMT)

        seq = num("model.seq_length")
        if "dataset.seq_length" in o and num("dataset.seq_length") != seq:
            raise ExportError(f"model.seq_length != dataset.seq_length in the {FMT} text")
        job = merge_job(header, {"seq_len": seq, "global_batch": num("train.global_batch_size")}, FMT)
        tp, pp, cp = (
            num("model.tensor_model_parallel_size", 1),
            num("model.pipeline_model_parallel_size", 1),
            num("model.context_parallel_size", 1),
        )
        dp = exact_div(job.num_devices, tp * pp * cp, "num_devices / (tp*pp*cp)", FMT)
        mb = num("train.micro_batch_size")
        ga = exact_div(job.global_batch, mb * dp, "global_batch / (micro_batch*dp)", FMT)
        dist_opt = bool(o.get("ddp.use_distributed_optimizer"))
        if bool(o.get("optimizer.use_distributed_optimizer")) != dist_opt:
            raise ExportError(
                f"ddp.use_distributed_optimizer and optimizer.use_distributed_optimizer differ ({FMT})"
            )
        fsdp = bool(o.get("ddp.use_megatron_fsdp"))
        if bool(o.get("dist.use_megatron_fsdp")) != fsdp:
            raise ExportError(f"dist.use_megatron_fsdp and ddp.use_megatron_fsdp differ ({FMT})")
        strategy = o.get("ddp.data_parallel_sharding_strategy", "no_shard")
        if fsdp:
            zero = {"optim_grads": 2, "optim_grads_params": 3}.get(strategy)
            if zero is None:
                raise unsupported(f"Megatron-FSDP strategy {strategy!r}", "autopar (reading " + FMT + ")")
            if o.get("checkpoint.ckpt_format") != "fsdp_dtensor":
                raise ExportError(f"Megatron-FSDP without checkpoint.ckpt_format=fsdp_dtensor ({FMT})")
        else:
            if strategy != "no_shard" or "checkpoint.ckpt_format" in o:
                raise ExportError(f"FSDP settings without ddp.use_megatron_fsdp=true in the {FMT} text")
            zero = 1 if dist_opt else 0
        instances = num("ddp.num_distributed_optimizer_instances", 1)
        shard_group = (
            0 if instances == 1 else exact_div(dp * cp, instances, "dp*cp / optimizer instances", FMT)
        )
        gran = o.get("model.recompute_granularity")
        recompute = "none" if gran is None else gran
        if recompute not in ("none", "selective", "full"):
            raise ExportError(f"model.recompute_granularity={gran!r} in the {FMT} text")
        mods = o.get("model.recompute_modules")
        if mods is not None:
            if recompute != "selective":
                raise ExportError(f"model.recompute_modules without selective granularity in the {FMT} text")
            recompute = recompute_mode(str(mods).strip("[]").replace(",", " ").split(), FMT)
        want_method = ("uniform", 1) if recompute == "full" else (None, None)
        got_method = (o.get("model.recompute_method"), o.get("model.recompute_num_layers"))
        if got_method[1] is not None:
            got_method = (got_method[0], to_int(got_method[1], "model.recompute_num_layers", FMT))
        if got_method != want_method:
            raise unsupported(
                f"recompute method {got_method}",
                "autopar (reading " + FMT + ")",
                "full recompute is uniform over 1 layer; selective has no method",
            )
        offload = bool(o.get("optimizer.optimizer_cpu_offload"))
        precision = {v: k for k, v in MIXED_PRECISION.items()}.get(o.get("mixed_precision"))  # type: ignore[arg-type]
        if precision is None:
            raise unsupported(
                f"mixed_precision={o.get('mixed_precision')!r}",
                "autopar (reading " + FMT + ")",
                f"autopar reads {sorted(MIXED_PRECISION.values())}",
            )
        vpp = o.get("model.virtual_pipeline_model_parallel_size")
        first = o.get("model.num_layers_in_first_pipeline_stage")
        last = o.get("model.num_layers_in_last_pipeline_stage")
        emb = bool(o.get("model.account_for_embedding_in_pipeline_split"))
        loss = bool(o.get("model.account_for_loss_in_pipeline_split"))
        if (emb or loss) and (first is not None or last is not None):
            raise ExportError(
                f"num_layers_in_first/last_pipeline_stage with account_for_*_in_pipeline_split ({FMT})",
                "Megatron-Core refuses to combine them; use one form",
            )
        if emb or loss:
            first, last = split_from_account_for(emb, loss, pp=pp, num_layers=job.num_layers, fmt=FMT)
        layout = build_layout(
            dict(
                tp=tp,
                pp=pp,
                vpp=1 if vpp is None else to_int(vpp, "vpp", FMT),
                first_stage_layers=0 if first is None else to_int(first, "first stage layers", FMT),
                last_stage_layers=0 if last is None else to_int(last, "last stage layers", FMT),
                dp=dp,
                cp=cp,
                ep=num("model.expert_model_parallel_size", 1),
                etp=num("model.expert_tensor_parallel_size", tp),
                zero=zero,
                shard_group=shard_group,
                sp=bool(o.get("model.sequence_parallel")),
                micro_batch=mb,
                grad_accum=ga,
                recompute=recompute,
                offload=offload,
                precision=precision,
            ),
            FMT,
        )
        return layout, job
