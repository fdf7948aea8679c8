"""Megatron-LM ``pretrain_gpt.py`` arguments (flag spellings of Megatron-LM main, 2026; mcore 0.16+).

ZeRO mapping (decided here, documented in the module):

* ``zero=1`` -> ``--use-distributed-optimizer`` (Megatron's distributed optimizer shards optimizer
  state over dp*cp, i.e. ZeRO-1).
* ``zero=2`` -> Megatron-FSDP ``--data-parallel-sharding-strategy optim_grads``: the only way
  Megatron-LM shards gradients as well as optimizer state. Plain ``--use-distributed-optimizer``
  keeps a full gradient buffer per rank, so writing it for zero=2 would rewrite the layout.
* ``zero=3`` -> Megatron-FSDP ``optim_grads_params``.
  Megatron-FSDP also needs ``--use-distributed-optimizer``, ``--ckpt-format fsdp_dtensor``
  (asserted by ``validate_args``) and ``--no-gradient-accumulation-fusion`` (per NVIDIA's
  Megatron-FSDP guide); they are written with it.
* ``shard_group`` (HSDP) -> ``--num-distributed-optimizer-instances = dp*cp / shard_group``.
* ``offload`` -> ``--optimizer-cpu-offload --optimizer-offload-fraction 1.0
  --use-precision-aware-optimizer`` (``validate_args`` requires the last; the precision-aware
  optimizer requires the distributed optimizer, so ``offload`` needs ``zero >= 1``).
* ``recompute=full`` -> ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1`` (every layer's input kept, everything else recomputed);
  ``selective`` -> ``--recompute-granularity selective`` (no method: Megatron rejects one);
  ``norm_act``/``norm_act_mlp`` -> the same plus ``--recompute-modules`` with the modules of
  ``autopar.layout.RECOMPUTE_MODULES`` that apply to the model (moe_act only with MoE,
  mla_up_proj only with MLA: Megatron-Core refuses them otherwise).
* ``fp8`` -> ``--bf16 --fp8-format hybrid`` (E4M3 forward, E5M2 backward, on a bf16 base).
* ``mxfp8`` -> ``--bf16 --fp8-format e4m3 --fp8-recipe mxfp8``; ``nvfp4`` -> ``--bf16 --fp4-format
  e2m1 --fp4-recipe nvfp4`` (mcore ``TransformerConfig.fp8_recipe`` / ``fp4`` / ``fp4_recipe``; the
  recipes of Megatron-Bridge's ``bf16_with_mxfp8_mixed`` / ``bf16_with_nvfp4_mixed``).
* first/last stage layers -> ``--decoder-first/last-pipeline-num-layers N`` (Megatron-LM
  arguments.py; mcore ``num_layers_in_first/last_pipeline_stage``), or, with interleaving when
  they are not divisible by vpp, ``--account-for-embedding-in-pipeline-split`` /
  ``--account-for-loss-in-pipeline-split`` (the end stage one layer short of a middle stage: the
  Llama 3 balance); Megatron-Core refuses to combine the two forms.
* interleaving -> ``--num-virtual-stages-per-pipeline-rank`` (parse also reads
  ``--num-layers-per-virtual-pipeline-stage`` when the header carries ``num_layers``).
* TP communication overlap -> ``--tp-comm-overlap`` (Transformer Engine userbuffers), which the
  megatron profile prices (``autopar.frameworks.MEGATRON.tp_comm_overlap``): written when
  ``tp > 1`` with sequence parallelism (Megatron-LM ``validate_args``: "Tensor parallel
  communication/GEMM overlap can happen only when sequence parallelism is enabled") on a device
  whose GPUs map each other's memory (``scale_up.peer_memory``, NVLink: the cost model hides
  nothing on a PCIe node, so nothing is written there). A megatron-framework job on such a device
  with ``tp > 1`` and ``sp=False`` is refused: it was priced with the overlap, which Megatron
  cannot run without SP. It needs Transformer Engine (Megatron's default ``--transformer-impl``).
* environment (:func:`max_connections`): with ``tp > 1`` or ``cp > 1`` below Blackwell, without
  Megatron-FSDP and without the EP all-to-all overlap (where it only warns), ``validate_args``
  asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1``; with Megatron-FSDP it asserts the variable is not 1
  ("FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset"). The text says which in a comment line
  (the arguments are appended to a command, so no ``export`` line can be part of them).

Refused, because Megatron-LM would reject or silently change them: interleaving with ``pp < 2``,
``cp > 1`` with ``seq_len % (2*cp) != 0``, expert parallelism with fp16.
The world size comes from the launcher (torchrun), so ``num_devices``/``devices_per_node`` and the
model id travel in the autopar header.
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
    flag,
    header_line,
    merge_job,
    parse_flags,
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
from autopar.frameworks import ATTENTION_OVERRIDES, attention_override, framework_profile
from autopar.layout import Layout

FMT = "megatron"

VALUE_FLAGS = (
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--num-virtual-stages-per-pipeline-rank",
    "--num-layers-per-virtual-pipeline-stage",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--micro-batch-size",
    "--global-batch-size",
    "--seq-length",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--data-parallel-sharding-strategy",
    "--ckpt-format",
    "--num-distributed-optimizer-instances",
    "--optimizer-offload-fraction",
    "--fp8-format",
    "--fp8-recipe",
    "--fp4-format",
    "--fp4-recipe",
    "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend",
    "--attention-backend",
)
BOOL_FLAGS = (
    "--overlap-moe-expert-parallel-comm",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--use-megatron-fsdp",
    "--no-gradient-accumulation-fusion",
    "--optimizer-cpu-offload",
    "--use-precision-aware-optimizer",
    "--tp-comm-overlap",
    "--bf16",
    "--fp16",
)
FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}


def _peer_memory(job: Job) -> bool | None:
    """Whether the job's devices map each other's memory (TE userbuffers); None when unknown."""
    if job.device is None:
        return None
    from autopar.errors import AutoparError
    from autopar.hardware import load_device

    try:
        return bool(load_device(job.device).scale_up.peer_memory)
    except AutoparError:
        return None


def tp_comm_overlap(layout: Layout, job: Job, fmt: str = FMT) -> bool:
    """Whether to write ``--tp-comm-overlap``: what the megatron profile priced (module docstring).

    Raises when a megatron-framework job was priced with the overlap but Megatron cannot run it
    (``tp > 1`` without sequence parallelism on an NVLink device). A job priced without it (its
    stack's profile, or ``Job.tp_comm_overlap`` off) gets none.
    """
    if layout.tp == 1 or not framework_profile(job.framework, tp_overlap=job.tp_comm_overlap).tp_comm_overlap:
        return False
    peer = _peer_memory(job)
    if peer is False:
        return False  # PCIe node: no userbuffers, and the cost model hides no TP communication
    if not layout.sp:
        if peer:
            raise unsupported(
                f"tensor parallel (tp={layout.tp}) without sequence parallel, priced with TP "
                "communication overlap (megatron profile)",
                fmt,
                "Megatron's --tp-comm-overlap needs --sequence-parallel; use sp=True (the default)",
            )
        return False
    return True


def moe_args(layout: Layout, job: Job, fmt: str = FMT) -> list[str]:
    """The token dispatcher and EP all-to-all overlap the job was priced with (expert-parallel
    layouts; Megatron's own dispatcher default is allgather, not autopar's alltoall)."""
    if layout.ep == 1:
        return []
    a = [flag("--moe-token-dispatcher-type", "alltoall" if job.moe_dispatcher == "alltoall" else "flex")]
    if job.moe_dispatcher == "deepep":
        a.append(flag("--moe-flex-dispatcher-backend", "deepep"))
    if job.moe_a2a_overlap:
        # Megatron-Core TransformerConfig.__post_init__ (mcore 0.16) asserts these
        for cond, why in (
            (layout.pp > 1 and layout.vpp == 1, "pp > 1 without interleaving (vpp = 1)"),
            (layout.recompute == "full", "full recompute"),
            (layout.precision == "fp32", "fp32"),
        ):
            if cond:
                raise unsupported(
                    f"EP all-to-all overlap (--overlap-moe-expert-parallel-comm) with {why}",
                    fmt,
                    "Megatron-Core refuses it; price the job without --moe-a2a-overlap",
                )
        a.append(flag("--overlap-moe-expert-parallel-comm"))
    return a


# Job.attention_kernel -> Megatron-LM --attention-backend, spelled alike (megatron/core/transformer/
# enums.py AttnBackend: flash, fused, unfused, local, auto; "auto", the default, lets Transformer
# Engine pick cuDNN's fused attention on sm90+, the megatron profile's "te").
def attention_args(job: Job) -> list[str]:
    """``--attention-backend`` where the job names a core other than its stack's default."""
    core = attention_override(job.framework, job.attention_kernel)
    return [] if core is None else [flag("--attention-backend", core)]


# Devices of compute capability 10 and later: Megatron-LM's CUDA_DEVICE_MAX_CONNECTIONS
# requirement "no longer exists since the Blackwell architecture" (validate_args).
BLACKWELL_DEVICES = frozenset({"b200", "b300", "gb200-nvl72", "gb300-nvl72"})


def max_connections(layout: Layout, job: Job) -> str | None:
    """What Megatron-LM's validate_args needs of ``CUDA_DEVICE_MAX_CONNECTIONS``: ``"1"``,
    ``"unset"`` (Megatron-FSDP asserts it is not 1) or None (no requirement). An unknown device is
    taken as Hopper or older."""
    if layout.zero >= 2:
        return "unset"
    if (
        (layout.tp > 1 or layout.cp > 1)
        and (job.device or "").lower() not in BLACKWELL_DEVICES
        and not (layout.ep > 1 and job.moe_a2a_overlap)
    ):
        return "1"
    return None


def needs_max_connections(layout: Layout, job: Job) -> bool:
    """Megatron-LM validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for these (below Blackwell)."""
    return max_connections(layout, job) == "1"


MAX_CONNECTIONS_NOTE = (
    "# environment: export CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM requires it with tensor or "
    "context parallelism on Hopper and older GPUs)"
)
FSDP_CONNECTIONS_NOTE = (
    "# environment: unset CUDA_DEVICE_MAX_CONNECTIONS (Megatron-FSDP requires it unset or > 1)"
)
CONNECTIONS_NOTES = {"1": MAX_CONNECTIONS_NOTE, "unset": FSDP_CONNECTIONS_NOTE}
TP_OVERLAP_NOTE = (
    "# --tp-comm-overlap needs Transformer Engine (the default --transformer-impl) and NVLink "
    "(userbuffers); it is what the megatron profile priced"
)


def megatron_args(layout: Layout, job: Job, fmt: str = FMT) -> list[str]:
    """The Megatron-LM flags of a layout (shared with the accelerate MEGATRON_LM checks)."""
    check_sharding(layout, fmt)
    if layout.vpp > 1 and layout.pp < 2:
        raise unsupported(
            f"interleaved pipeline (vpp={layout.vpp}) with pp={layout.pp}", fmt, "needs pp >= 2"
        )
    if layout.cp > 1 and job.seq_len % (2 * layout.cp):
        raise unsupported(
            f"context parallel (cp={layout.cp}) with seq_len={job.seq_len}",
            fmt,
            "Megatron-LM needs seq_len divisible by 2*cp",
        )
    if layout.ep > 1 and layout.precision == "fp16":
        raise unsupported(
            f"expert parallel (ep={layout.ep}) with fp16", fmt, "Megatron-LM refuses EP with fp16"
        )
    a = [
        flag("--tensor-model-parallel-size", layout.tp),
        flag("--pipeline-model-parallel-size", layout.pp),
    ]
    if layout.vpp > 1:
        a.append(flag("--num-virtual-stages-per-pipeline-rank", layout.vpp))
    form, first, last = pipeline_split(layout, job, fmt)
    if form == "layers":
        if first:
            a.append(flag("--decoder-first-pipeline-num-layers", first))
        if last:
            a.append(flag("--decoder-last-pipeline-num-layers", last))
    elif form == "account_for":
        if first:
            a.append(flag("--account-for-embedding-in-pipeline-split"))
        if last:
            a.append(flag("--account-for-loss-in-pipeline-split"))
    a += [
        flag("--context-parallel-size", layout.cp),
        flag("--expert-model-parallel-size", layout.ep),
        flag("--expert-tensor-parallel-size", layout.etp),
    ]
    if layout.sp:
        a.append(flag("--sequence-parallel"))
    if tp_comm_overlap(layout, job, fmt):
        a.append(flag("--tp-comm-overlap"))
    a += moe_args(layout, job, fmt)
    a += attention_args(job)
    a += [
        flag("--micro-batch-size", layout.micro_batch),
        flag("--global-batch-size", job.global_batch),
        flag("--seq-length", job.seq_len),
    ]
    if layout.recompute == "selective":
        a.append(flag("--recompute-granularity", "selective"))
    elif layout.recompute in ("norm_act", "norm_act_mlp"):
        a.append(flag("--recompute-granularity", "selective"))
        a.append(" ".join(["--recompute-modules", *recompute_modules(layout.recompute, job, FMT)]))
    elif layout.recompute == "full":
        a += [
            flag("--recompute-granularity", "full"),
            flag("--recompute-method", "uniform"),
            flag("--recompute-num-layers", 1),
        ]
    if layout.zero >= 1:
        a.append(flag("--use-distributed-optimizer"))
    if layout.zero <= 1 and layout.dp * layout.cp > 1:
        # What autopar's cost model assumes of Megatron's data-parallel communication: the gradient
        # reduction overlaps the backward and (distributed optimizer) the parameter all-gather the
        # next forward (autopar.frameworks MEGATRON.param_gather_overlap).
        a.append(flag("--overlap-grad-reduce"))
        if layout.zero == 1:
            a.append(flag("--overlap-param-gather"))
    if layout.zero >= 2:
        a += [
            flag("--use-megatron-fsdp"),
            flag("--data-parallel-sharding-strategy", FSDP_STRATEGY[layout.zero]),
            flag("--ckpt-format", "fsdp_dtensor"),
            flag("--no-gradient-accumulation-fusion"),
        ]
    if canonical_shard_group(layout):
        a.append(flag("--num-distributed-optimizer-instances", shard_instances(layout)))
    if layout.offload:
        a += [
            flag("--optimizer-cpu-offload"),
            flag("--optimizer-offload-fraction", "1.0"),
            flag("--use-precision-aware-optimizer"),
        ]
    if layout.precision == "bf16":
        a.append(flag("--bf16"))
    elif layout.precision == "fp16":
        a.append(flag("--fp16"))
    elif layout.precision == "fp8":
        a += [flag("--bf16"), flag("--fp8-format", "hybrid")]
    elif layout.precision == "mxfp8":
        a += [flag("--bf16"), flag("--fp8-format", "e4m3"), flag("--fp8-recipe", "mxfp8")]
    elif layout.precision == "nvfp4":
        a += [flag("--bf16"), flag("--fp4-format", "e2m1"), flag("--fp4-recipe", "nvfp4")]
    return a


def layout_fields_from_megatron(
    f: dict[str, Any], *, num_devices: int, global_batch: int, num_layers: int | None, fmt: str = FMT
) -> dict[str, Any]:
    """Layout fields from parsed Megatron flags (underscored names, Megatron defaults applied)."""

    def num(key: str, default: int | None = None) -> int:
        if key not in f:
            if default is None:
                raise ExportError(f"{key} missing from the {fmt} text")
            return default
        return to_int(f[key], key, fmt)

    tp, pp, cp = (
        num("tensor_model_parallel_size", 1),
        num("pipeline_model_parallel_size", 1),
        num("context_parallel_size", 1),
    )
    ep = num("expert_model_parallel_size", 1)
    etp = num("expert_tensor_parallel_size", tp)  # Megatron's default ETP is TP
    if "num_virtual_stages_per_pipeline_rank" in f and "num_layers_per_virtual_pipeline_stage" in f:
        raise ExportError(
            f"both virtual-pipeline flags given in the {fmt} text", "Megatron-LM allows only one"
        )
    if "num_layers_per_virtual_pipeline_stage" in f:
        if num_layers is None:
            raise ExportError(
                f"--num-layers-per-virtual-pipeline-stage needs num_layers ({fmt})",
                "keep the autopar header, which carries num_layers",
            )
        per_stage = exact_div(num_layers, pp, "num_layers / pp", fmt)
        vpp = exact_div(
            per_stage,
            num("num_layers_per_virtual_pipeline_stage"),
            "layers per stage / layers per virtual stage",
            fmt,
        )
    else:
        vpp = num("num_virtual_stages_per_pipeline_rank", 1)
    emb, loss = (
        bool(f.get("account_for_embedding_in_pipeline_split")),
        bool(f.get("account_for_loss_in_pipeline_split")),
    )
    first, last = num("decoder_first_pipeline_num_layers", 0), num("decoder_last_pipeline_num_layers", 0)
    if (emb or loss) and (first or last):
        raise ExportError(
            f"--decoder-first/last-pipeline-num-layers with --account-for-*-in-pipeline-split in the {fmt} text",
            "Megatron-Core refuses to combine them; use one form",
        )
    if emb or loss:
        first, last = split_from_account_for(emb, loss, pp=pp, num_layers=num_layers, fmt=fmt)
    dp = exact_div(num_devices, tp * pp * cp, "num_devices / (tp*pp*cp)", fmt)
    mb = num("micro_batch_size")
    gb = num("global_batch_size", mb * dp)
    if gb != global_batch:
        raise ExportError(f"global batch {gb} in the {fmt} text != job global_batch={global_batch}")
    ga = exact_div(gb, mb * dp, "global_batch / (micro_batch*dp)", fmt)

    gran = f.get("recompute_granularity")
    if gran is None:
        recompute = "none"
        if "recompute_method" in f or "recompute_num_layers" in f:
            raise ExportError(f"--recompute-method without --recompute-granularity in the {fmt} text")
    elif gran == "selective":
        if "recompute_method" in f:
            raise ExportError(f"selective recompute takes no --recompute-method ({fmt})")
        mods = f.get("recompute_modules")
        recompute = "selective" if mods is None else recompute_mode(str(mods).split(), fmt)
    elif gran == "full":
        if f.get("recompute_method") != "uniform" or num("recompute_num_layers", 0) != 1:
            raise unsupported(
                "full recompute other than '--recompute-method uniform --recompute-num-layers 1'",
                "autopar (reading " + fmt + ")",
                "autopar models full recompute of every layer",
            )
        recompute = "full"
    else:
        raise ExportError(f"--recompute-granularity {gran!r} in the {fmt} text", "use full or selective")

    dist_opt = bool(f.get("use_distributed_optimizer"))
    if f.get("use_megatron_fsdp"):
        strategy = f.get("data_parallel_sharding_strategy", "optim_grads_params")
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(strategy)
        if zero is None:
            raise ExportError(f"unknown --data-parallel-sharding-strategy {strategy!r} in the {fmt} text")
    else:
        if "data_parallel_sharding_strategy" in f:
            raise ExportError(
                f"--data-parallel-sharding-strategy without --use-megatron-fsdp in the {fmt} text"
            )
        zero = 1 if dist_opt else 0
    instances = num("num_distributed_optimizer_instances", 1)
    shard_group = 0 if instances == 1 else exact_div(dp * cp, instances, "dp*cp / optimizer instances", fmt)

    offload = bool(f.get("optimizer_cpu_offload"))
    if offload and f.get("optimizer_offload_fraction", "1.0") not in ("1.0", "1", 1.0, 1):
        raise unsupported(
            f"partial optimizer offload (fraction {f['optimizer_offload_fraction']})",
            "autopar (reading " + fmt + ")",
            "autopar models offloading the whole optimizer",
        )

    fp8, fp4 = f.get("fp8_format"), f.get("fp4_format")
    reader = "autopar (reading " + fmt + ")"
    if (fp8 is not None or fp4 is not None) and not f.get("bf16"):
        raise unsupported("fp8/fp4 on a non-bf16 base", reader)
    if fp8 is not None and fp4 is not None:
        raise ExportError(f"both --fp8-format and --fp4-format in the {fmt} text")
    if fp8 is not None:
        # Megatron-Core's fp8_recipe defaults to 'delayed' (per-tensor scaling, as 'tensorwise').
        recipe = f.get("fp8_recipe", "delayed")
        if fp8 == "hybrid" and recipe in ("delayed", "tensorwise"):
            precision = "fp8"
        elif fp8 == "e4m3" and recipe == "mxfp8":
            precision = "mxfp8"
        else:
            raise unsupported(
                f"fp8 format {fp8!r} with recipe {recipe!r}",
                reader,
                "autopar's fp8 is 'hybrid' per-tensor scaling and its mxfp8 is 'e4m3' with recipe mxfp8",
            )
    elif fp4 is not None:
        recipe = f.get("fp4_recipe", "nvfp4")  # Megatron-Core's default fp4_recipe
        if fp4 != "e2m1" or recipe != "nvfp4":
            raise unsupported(
                f"fp4 format {fp4!r} with recipe {recipe!r}", reader, "autopar's nvfp4 is e2m1/nvfp4"
            )
        precision = "nvfp4"
    elif f.get("bf16") and f.get("fp16"):
        raise ExportError(f"both --bf16 and --fp16 in the {fmt} text")
    else:
        precision = "bf16" if f.get("bf16") else "fp16" if f.get("fp16") else "fp32"

    return dict(
        tp=tp,
        pp=pp,
        vpp=vpp,
        first_stage_layers=first,
        last_stage_layers=last,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=etp,
        zero=zero,
        shard_group=shard_group,
        sp=bool(f.get("sequence_parallel")),
        micro_batch=mb,
        grad_accum=ga,
        recompute=recompute,
        offload=offload,
        precision=precision,
    )


@register
class MegatronExporter(Exporter):
    name = FMT
    suffix = ".sh"
    stage_layers = True
    module_recompute = True
    moe_options = True
    attention_kernels = ATTENTION_OVERRIDES  # --attention-backend
    tp_overlap_option = True  # --tp-comm-overlap written exactly where the job was priced with it
    description = (
        "Megatron-LM pretrain_gpt.py arguments (append to your torchrun ... pretrain_gpt.py command)"
    )

    def search_limits(self, job: Job) -> dict[str, list[Any]]:
        # a megatron-framework plan on NVLink is priced with TP comm overlap, which needs SP
        if job.framework == "megatron" and _peer_memory(job) is not False:
            return {"sp": ["auto", "on"]}
        return {}

    def _render(self, layout: Layout, job: Job) -> str:
        args = megatron_args(layout, job)
        env = max_connections(layout, job)
        notes = [CONNECTIONS_NOTES[env]] if env else []
        if "--tp-comm-overlap" in args:
            notes.append(TP_OVERLAP_NOTE)
        return "\n".join(
            [
                header_line(FMT, job),
                f"# Megatron-LM arguments for layout: {layout.short()}",
                *notes,
                shell_lines(args, indent=""),
            ]
        )

    def _parse(self, text: str) -> tuple[Layout, Job]:
        header = read_header(text, FMT)
        assert header is not None
        flags = parse_flags(
            shlex.split(strip_comments(text)),
            VALUE_FLAGS,
            BOOL_FLAGS,
            FMT,
            list_flags=("--recompute-modules",),
        )
        f = {k[2:].replace("-", "_"): v for k, v in flags.items()}
        if f.pop("no_gradient_accumulation_fusion", False) and not f.get("use_megatron_fsdp"):
            raise ExportError(f"--no-gradient-accumulation-fusion outside Megatron-FSDP in the {FMT} text")
        if "ckpt_format" in f and (f.pop("ckpt_format") != "fsdp_dtensor" or not f.get("use_megatron_fsdp")):
            raise ExportError(f"autopar writes --ckpt-format only as fsdp_dtensor with Megatron-FSDP ({FMT})")
        hj = header["job"]
        native: dict[str, Any] = (
            {"seq_len": to_int(f["seq_length"], "--seq-length", FMT)} if "seq_length" in f else {}
        )
        if "global_batch_size" in f:
            native["global_batch"] = to_int(f["global_batch_size"], "--global-batch-size", FMT)
        disp, backend = f.pop("moe_token_dispatcher_type", None), f.pop("moe_flex_dispatcher_backend", None)
        if disp is not None:
            if (disp, backend) not in (("alltoall", None), ("flex", "deepep")):
                raise unsupported(
                    f"MoE dispatcher {disp}" + (f" ({backend})" if backend else ""),
                    "autopar (reading " + FMT + ")",
                    "autopar prices alltoall, or flex with the deepep backend",
                )
            native["moe_dispatcher"] = "alltoall" if disp == "alltoall" else "deepep"
        elif backend is not None:
            raise ExportError(
                f"--moe-flex-dispatcher-backend without --moe-token-dispatcher-type flex ({FMT})"
            )
        if f.pop("overlap_moe_expert_parallel_comm", False):
            native["moe_a2a_overlap"] = True
        backend_attn = f.pop("attention_backend", None)
        if backend_attn is not None:
            if backend_attn not in ATTENTION_OVERRIDES:
                raise unsupported(
                    f"--attention-backend {backend_attn}",
                    "autopar (reading " + FMT + ")",
                    "autopar prices flash and unfused, or the default (no --attention-backend)",
                )
            native["attention_kernel"] = backend_attn
        job = merge_job(header, native, FMT)
        if (backend_attn is None) != (attention_args(job) == []):
            raise ExportError(
                f"the {FMT} text's --attention-backend ({backend_attn or 'none'}) is not the attention "
                f"core the job was priced with ({job.attention_kernel})",
                "re-export it with `autopar export`",
            )
        values = layout_fields_from_megatron(
            f, num_devices=job.num_devices, global_batch=job.global_batch, num_layers=hj.get("num_layers")
        )
        layout = build_layout(values, FMT)
        if layout.zero >= 1 and not f.get("use_distributed_optimizer"):
            raise ExportError(f"Megatron-FSDP without --use-distributed-optimizer in the {FMT} text")
        if layout.ep > 1 and (
            "moe_dispatcher" not in native or job.moe_a2a_overlap != bool(native.get("moe_a2a_overlap"))
        ):
            raise ExportError(
                f"the {FMT} text does not name the MoE dispatcher and overlap the job was priced with",
                "re-export it with `autopar export`",
            )
        overlap = bool(f.get("tp_comm_overlap"))
        if overlap and not layout.sp:
            raise ExportError(
                f"--tp-comm-overlap without --sequence-parallel in the {FMT} text",
                "Megatron-LM refuses it; add --sequence-parallel",
            )
        if overlap != tp_comm_overlap(layout, job):
            raise ExportError(
                f"the {FMT} text {'has' if overlap else 'lacks'} --tp-comm-overlap, but the layout was "
                f"priced {'without' if overlap else 'with'} TP communication overlap",
                "re-export it with `autopar export`",
            )
        return layout, job
