"""torchtitan launch, for **torchtitan 0.3.0** (default) or 0.2.2 (``--launcher-version 0.2``).

0.3.0 configures a job in Python: ``-m torchtitan.train --module <model> --config <config_registry
function>`` loads a ``Trainer.Config`` and ``--<section>.<field> value`` overrides it (tyro;
``torchtitan.config.manager.ConfigManager``). The export is that command. A preset with a
torchtitan config function (:data:`TORCHTITAN_CONFIGS`) names it; any other model leaves
``$TORCHTITAN_MODULE``/``$TORCHTITAN_CONFIG`` for the user to set. What changed from 0.2.2:

* no ``[model] converters`` key: fp8 is a ``*_float8`` config function's model spec (refused;
  ``--launcher-version 0.2`` writes the converter);
* no ``expert_tensor_parallel_degree``: experts borrow FSDP and TP ranks (``dp_shard*cp*tp ==
  efsdp*ep``), so an EP layout needs ``etp == 1`` (a dense layout's ETP travels in the header);
* activation checkpointing is a subcommand (``activation-checkpoint:none|selective|full``;
  selective is per-op, autopar's selective);
* CUDA graphs are on by default (and ``Trainer.Config.__post_init__`` refuses them with pipeline
  parallelism and with EP token dispatchers that synchronise with the host, the default one);
  autopar prices eager launches (the stack profile's host floor), so every export writes
  ``--training.disable_cuda_graphs``: the variant that was scored, which torchtitan accepts.

0.2.2 writes the ``--job.config_file`` TOML sections (the last TOML release): merge them into a
config that names the model. Mapping (checked against torchtitan 0.2.2's ``job_config.py``, ``parallel_dims.py``,
``pipeline_parallel.py`` and ``llama3/infra/parallelize.py``):

* ``dp = data_parallel_replicate_degree * data_parallel_shard_degree``; FSDP2 shards over
  ``dp_shard * cp`` ranks, so ``shard_group`` (default ``dp*cp``) gives
  ``dp_shard = shard_group / cp`` and ``dp_replicate = dp / dp_shard`` (HSDP when both > 1).
* ``zero=3`` -> ``fsdp_reshard_after_forward = "always"``; ``zero=2`` -> ``"never"`` (parameters
  stay gathered between forward and backward: FSDP2's ZeRO-2 analogue). ``zero=1`` has no
  FSDP2 equivalent (refused). ``zero=0`` is DDP, which torchtitan applies only when DP is the
  sole parallelism (and CP always brings FSDP), so ``zero=0`` needs ``cp == 1`` and either
  ``dp == 1`` or ``tp == pp == 1``.
* TP always runs with sequence parallelism in torchtitan: ``tp > 1`` needs ``sp=True``.
* ``vpp == 1`` -> schedule ``1F1B``; ``vpp >= 2`` -> ``Interleaved1F1B``, or the job's zero-bubble
  schedule (``zb`` -> ``InterleavedZeroBubble``, ``zbv`` -> ``ZBVZeroBubble``, ``dualpipev`` ->
  ``DualPipeV``: ``autopar.schedules``) (2 stages per rank by
  default; ``vpp > 2`` needs ``Job.num_layers`` to size ``pipeline_parallel_layers_per_stage``,
  counting the embedding and output as one layer each, torchtitan's defaults).
* batch: without PP, ``local_batch_size = micro_batch`` and torchtitan accumulates
  ``global / (local * dp)`` steps; with PP, ``local_batch_size = micro_batch * grad_accum`` and
  ``pipeline_parallel_microbatch_size = micro_batch``.
* ``recompute``: ``[activation_checkpoint] mode``; selective is per-op (``selective_ac_option = "op"``).
* precision: bf16/fp32 -> ``training.mixed_precision_param``; fp8 -> bf16 plus the
  ``quantize.linear.float8`` converter; fp16 refused (not offered by torchtitan).
* ``offload`` refused: ``training.enable_cpu_offload`` also offloads parameters and gradients.
* EP needs FSDP (``zero >= 2``) and ``etp in {1, tp}``; ``seq_len`` must divide by ``2*tp*cp``.
"""

from __future__ import annotations

import json
import math
import shlex
import tomllib
from typing import Any

from autopar.export.base import (
    Exporter,
    ExportError,
    Job,
    build_layout,
    check_keys,
    etp_from_header,
    exact_div,
    header_line,
    inert_etp,
    merge_job,
    parse_flags,
    read_header,
    register,
    register_previous,
    shell_lines,
    strip_comments,
    to_int,
    unsupported,
)
from autopar.layout import Layout
from autopar.schedules import PIPELINE_SCHEDULES, TORCHTITAN_NAMES

SCHEDULE_OF_NAME = {v: k for k, v in TORCHTITAN_NAMES.items()}

FMT = "torchtitan"
TORCHTITAN_VERSION = "0.2.2"
FP8_CONVERTER = "quantize.linear.float8"
SECTIONS = {
    "model": ("converters",),
    "training": ("local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param"),
    "parallelism": (
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "fsdp_reshard_after_forward",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "pipeline_parallel_layers_per_stage",
        "context_parallel_degree",
        "expert_parallel_degree",
        "expert_tensor_parallel_degree",
    ),
    "activation_checkpoint": ("mode", "selective_ac_option"),
}
EDGE_WEIGHT = 2  # pipeline_parallel_first/last_stage_less_layers, 1 each by default


def _degrees(layout: Layout) -> tuple[int, int]:
    """(dp_replicate, dp_shard) of a layout, or ExportError."""
    if layout.zero == 0:
        if layout.cp > 1:
            raise unsupported(
                f"context parallel (cp={layout.cp}) without FSDP (zero=0)",
                FMT,
                "torchtitan shards over dp_shard*cp whenever cp > 1; use zero=2 or 3",
            )
        if layout.dp > 1 and layout.num_devices != layout.dp:
            raise unsupported(
                f"DDP (zero=0, dp={layout.dp}) combined with tp/pp",
                FMT,
                "torchtitan's DDP supports only 1-D data parallelism; use zero=2 or 3",
            )
        return layout.dp, 1
    if layout.zero == 1:
        raise unsupported(
            "ZeRO-1 (optimizer-only sharding, zero=1)", FMT, "FSDP2 shards parameters too; use zero=2 or 3"
        )
    shard = layout.shard_size
    if shard % layout.cp:
        raise unsupported(
            f"shard_group={shard} not a multiple of cp={layout.cp}",
            FMT,
            "torchtitan's FSDP group is dp_shard*cp",
        )
    dp_shard = shard // layout.cp
    return layout.dp // dp_shard, dp_shard


def _layers_per_stage(layout: Layout, job: Job) -> int | None:
    if layout.vpp <= 2:
        return None
    if job.num_layers is None:
        raise unsupported(
            f"vpp={layout.vpp} without the model's layer count",
            FMT,
            "torchtitan sizes virtual stages in layers; pass Job.num_layers",
        )
    stages = layout.pp * layout.vpp
    lps = math.ceil((job.num_layers + EDGE_WEIGHT) / stages)
    if math.ceil((job.num_layers + EDGE_WEIGHT) / lps) != stages:
        raise unsupported(
            f"vpp={layout.vpp} for {job.num_layers} layers on pp={layout.pp}",
            FMT,
            "no pipeline_parallel_layers_per_stage yields exactly pp*vpp stages",
        )
    return lps


def sections(layout: Layout, job: Job) -> dict[str, dict[str, Any]]:
    if layout.offload:
        raise unsupported(
            "optimizer-only offload (offload=True)",
            FMT,
            "training.enable_cpu_offload also offloads parameters and gradients",
        )
    if layout.precision == "fp16":
        raise unsupported("fp16 precision", FMT, "torchtitan trains in bf16 or fp32")
    if layout.precision in ("mxfp8", "nvfp4"):
        # torchtitan's MX path is torchao's converter, not Transformer Engine's recipe costed here.
        raise unsupported(
            f"{layout.precision} precision", FMT, "autopar writes torchtitan's tensorwise fp8 only"
        )
    if layout.tp > 1 and not layout.sp:
        raise unsupported(
            f"tensor parallel (tp={layout.tp}) without sequence parallel",
            FMT,
            "torchtitan's TP plans always shard the sequence; set sp=True",
        )
    if job.seq_len % (2 * layout.tp * layout.cp):
        raise unsupported(
            f"seq_len={job.seq_len} with tp={layout.tp}, cp={layout.cp}",
            FMT,
            "torchtitan needs seq_len divisible by tp * 2*cp",
        )
    replicate, shard = _degrees(layout)
    if layout.ep > 1:
        if layout.zero < 2:
            raise unsupported(f"expert parallel (ep={layout.ep}) without FSDP", FMT, "use zero=2 or 3")
        if layout.etp not in (1, layout.tp):
            raise unsupported(
                f"etp={layout.etp} (tp={layout.tp})", FMT, "torchtitan supports etp = 1 or etp = tp"
            )
        if (shard * layout.cp * layout.tp) % (layout.ep * layout.etp):
            raise unsupported(
                f"ep*etp = {layout.ep * layout.etp} across dp_shard*cp*tp = {shard * layout.cp * layout.tp}",
                FMT,
                "torchtitan carves EP out of the FSDP and TP ranks of one replica",
            )
    lps = _layers_per_stage(layout, job)
    par: dict[str, Any] = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard}
    if layout.zero >= 2:
        par["fsdp_reshard_after_forward"] = "always" if layout.zero == 3 else "never"
    par["tensor_parallel_degree"] = layout.tp
    par["pipeline_parallel_degree"] = layout.pp
    if layout.pp > 1:
        par["pipeline_parallel_schedule"] = TORCHTITAN_NAMES.get(
            job.pipeline_schedule, "Interleaved1F1B" if layout.vpp > 1 else "1F1B"
        )
        par["pipeline_parallel_microbatch_size"] = layout.micro_batch
        if lps is not None:
            par["pipeline_parallel_layers_per_stage"] = lps
    par["context_parallel_degree"] = layout.cp
    par["expert_parallel_degree"] = layout.ep
    par["expert_tensor_parallel_degree"] = layout.etp
    ac: dict[str, Any] = {"mode": layout.recompute}
    if layout.recompute == "selective":
        ac["selective_ac_option"] = "op"
    return {
        "model": {"converters": [FP8_CONVERTER] if layout.precision == "fp8" else []},
        "training": {
            "local_batch_size": layout.micro_batch * (layout.grad_accum if layout.pp > 1 else 1),
            "global_batch_size": job.global_batch,
            "seq_len": job.seq_len,
            "mixed_precision_param": "float32" if layout.precision == "fp32" else "bfloat16",
        },
        "parallelism": par,
        "activation_checkpoint": ac,
    }


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def dump_toml(doc: dict[str, dict[str, Any]]) -> str:
    """Tables of scalars and flat lists: all a torchtitan 0.2 job config needs."""
    out: list[str] = []
    for table, values in doc.items():
        out.append(f"\n[{table}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(out).lstrip("\n")


@register_previous
class TorchtitanTomlExporter(Exporter):
    name = FMT
    suffix = ".toml"
    description = f"torchtitan {TORCHTITAN_VERSION} job config (TOML, --job.config_file)"
    pipeline_schedules = PIPELINE_SCHEDULES
    launcher_version = TORCHTITAN_VERSION

    def search_limits(self, job: Job) -> dict[str, list[Any]]:
        # sections()'s refusals, axis by axis; zero=0 (DDP) runs only without tp, pp and cp, which
        # axes cannot say, and FSDP (zero 2/3) runs those layouts too, so the search keeps FSDP only
        return {
            "zero": [2, 3],
            "offload": [False],
            "precision": ["bf16", "fp32", "fp8"],
            "sp": ["auto", "on"],
            "pipeline_ends": ["even"],
            "recompute": ["none", "selective", "full"],
        }

    def _render(self, layout: Layout, job: Job) -> str:
        return "\n".join(
            [
                header_line(FMT, job),
                f"# torchtitan {TORCHTITAN_VERSION} job config sections for layout: {layout.short()}",
                f"# run: torchrun --nnodes {job.nnodes} --nproc-per-node {job.nproc_per_node} "
                "-m torchtitan.train --job.config_file <this file>",
                dump_toml(sections(layout, job)),
            ]
        )

    def _parse(self, text: str) -> tuple[Layout, Job]:
        header = read_header(text, FMT)
        assert header is not None
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ExportError(f"the {FMT} text is not TOML: {e}") from None
        check_keys(doc, SECTIONS, "the top level", FMT)
        for sec, keys in SECTIONS.items():
            check_keys(doc.get(sec, {}), keys, f"[{sec}]", FMT)
        tr, par, ac = (
            doc.get("training", {}),
            doc.get("parallelism", {}),
            doc.get("activation_checkpoint", {}),
        )

        def num(d: dict[str, Any], key: str, default: int | None = None) -> int:
            if key not in d:
                if default is None:
                    raise ExportError(f"{key} missing from the {FMT} text")
                return default
            return to_int(d[key], key, FMT)

        job = merge_job(
            header, {"seq_len": num(tr, "seq_len"), "global_batch": num(tr, "global_batch_size")}, FMT
        )
        tp, pp, cp = (
            num(par, "tensor_parallel_degree", 1),
            num(par, "pipeline_parallel_degree", 1),
            num(par, "context_parallel_degree", 1),
        )
        replicate = num(par, "data_parallel_replicate_degree", 1)
        shard = num(par, "data_parallel_shard_degree", -1)
        if shard == -1:
            shard = exact_div(
                job.num_devices, replicate * tp * pp * cp, "num_devices / (replicate*tp*pp*cp)", FMT
            )
        dp = replicate * shard
        fsdp = shard * cp > 1
        policy = par.get("fsdp_reshard_after_forward", "default")
        if policy not in ("default", "always", "never"):
            raise ExportError(f"fsdp_reshard_after_forward={policy!r} in the {FMT} text")
        if fsdp:
            zero = {"always": 3, "never": 2}.get(policy, 2 if pp > 1 else 3)
        elif policy != "default":
            zero = {"always": 3, "never": 2}[policy]
        else:
            zero = 0
        shard_group = 0 if replicate == 1 or zero == 0 else shard * cp
        pipeline_schedule = "1f1b"
        if pp > 1:
            mb = num(par, "pipeline_parallel_microbatch_size", 1)
            if num(tr, "local_batch_size") % mb:
                raise ExportError(f"local_batch_size is not a multiple of the pipeline micro-batch ({FMT})")
            schedule = par.get("pipeline_parallel_schedule", "1F1B")
            if schedule == "1F1B":
                vpp = 1
                if "pipeline_parallel_layers_per_stage" in par:
                    raise ExportError(f"layers per stage with a single-stage schedule in the {FMT} text")
            elif schedule in ("Interleaved1F1B", *TORCHTITAN_NAMES.values()):
                pipeline_schedule = SCHEDULE_OF_NAME.get(schedule, "1f1b")
                if "pipeline_parallel_layers_per_stage" not in par:
                    vpp = 2
                else:
                    if job.num_layers is None:
                        raise ExportError(
                            f"pipeline_parallel_layers_per_stage needs num_layers ({FMT})",
                            "keep the autopar header, which carries num_layers",
                        )
                    stages = math.ceil(
                        (job.num_layers + EDGE_WEIGHT) / num(par, "pipeline_parallel_layers_per_stage")
                    )
                    vpp = exact_div(stages, pp, "virtual stages / pp", FMT)
            else:
                raise unsupported(
                    f"pipeline schedule {schedule!r}",
                    "autopar (reading " + FMT + ")",
                    "autopar models 1F1B, Interleaved1F1B, " + ", ".join(TORCHTITAN_NAMES.values()),
                )
        else:
            mb = num(tr, "local_batch_size")
            vpp = 1
        ga = exact_div(job.global_batch, mb * dp, "global_batch / (micro_batch*dp)", FMT)
        mode = ac.get("mode", "selective")
        if mode == "selective" and ac.get("selective_ac_option", "2") != "op":
            raise unsupported(
                "layer-wise selective activation checkpointing",
                "autopar (reading " + FMT + ")",
                'autopar\'s selective recompute is per-op (selective_ac_option = "op")',
            )
        if mode not in ("none", "selective", "full"):
            raise unsupported(f"activation_checkpoint mode {mode!r}", "autopar (reading " + FMT + ")")
        converters = doc.get("model", {}).get("converters", [])
        if converters not in ([], [FP8_CONVERTER], ["float8"]):
            raise unsupported(f"model converters {converters}", "autopar (reading " + FMT + ")")
        mpp = tr.get("mixed_precision_param", "bfloat16")
        precision = "fp8" if converters else {"bfloat16": "bf16", "float32": "fp32"}.get(mpp)
        if precision is None or (converters and mpp != "bfloat16"):
            raise ExportError(f"mixed_precision_param={mpp!r} in the {FMT} text")
        layout = build_layout(
            dict(
                tp=tp,
                pp=pp,
                vpp=vpp,
                dp=dp,
                cp=cp,
                ep=num(par, "expert_parallel_degree", 1),
                etp=num(par, "expert_tensor_parallel_degree", 1),
                zero=zero,
                shard_group=shard_group,
                sp=tp > 1,
                micro_batch=mb,
                grad_accum=ga,
                recompute=mode,
                offload=False,
                precision=precision,
            ),
            FMT,
        )
        if pipeline_schedule != job.pipeline_schedule:  # the TOML's schedule is what torchtitan runs
            job = job.model_copy(update={"pipeline_schedule": pipeline_schedule})
        return layout, job


# ---------------------------------------------------------------------------------------------
# torchtitan 0.3: the torchrun command with ConfigManager overrides

TORCHTITAN_CURRENT = "0.3.0"
# autopar preset -> (torchtitan --module, --config): torchtitan 0.3.0's config_registry functions
# for the same model (torchtitan/models/*/config_registry.py).
TORCHTITAN_CONFIGS: dict[str, tuple[str, str]] = {
    "llama-3.1-8b": ("llama3", "llama3_8b"),
    "llama-3.1-70b": ("llama3", "llama3_70b"),
    "llama-3.1-405b": ("llama3", "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
    "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b"),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b"),
}
MODULE_VAR, CONFIG_VAR = "$TORCHTITAN_MODULE", "$TORCHTITAN_CONFIG"
AC_SUBCOMMAND = "activation-checkpoint:"
# --<section>.<field> overrides autopar writes and reads (0.3.0 Trainer.Config fields).
V3_VALUE_FLAGS = (
    "--training.local_batch_size",
    "--training.global_batch_size",
    "--training.seq_len",
    "--training.mixed_precision_param",
    "--parallelism.data_parallel_replicate_degree",
    "--parallelism.data_parallel_shard_degree",
    "--parallelism.fsdp_reshard_after_forward",
    "--parallelism.tensor_parallel_degree",
    "--parallelism.pipeline_parallel_degree",
    "--parallelism.pipeline_parallel_schedule",
    "--parallelism.pipeline_parallel_microbatch_size",
    "--parallelism.pipeline_parallel_layers_per_stage",
    "--parallelism.context_parallel_degree",
    "--parallelism.expert_parallel_degree",
)
V3_BOOL_FLAGS = ("--training.disable_cuda_graphs",)
TORCHRUN_FLAGS = ("--nnodes", "--nproc-per-node")


def torchtitan_model(model: str) -> tuple[str, str]:
    """(--module, --config) for ``model``: a preset's torchtitan config, else the shell variables."""
    return TORCHTITAN_CONFIGS.get(model.strip().lower(), (MODULE_VAR, CONFIG_VAR))


def overrides_v3(layout: Layout, job: Job) -> tuple[list[str], str]:
    """The 0.3.0 ``--section.field value`` overrides and the AC subcommand, or ExportError."""
    if layout.precision == "fp8":
        raise unsupported(
            "fp8 precision (a model converter)",
            f"{FMT} {TORCHTITAN_CURRENT}",
            "0.3 has no converters key: run a *_float8 config function, or export --launcher-version 0.2",
        )
    if layout.ep > 1 and layout.etp != 1:
        raise unsupported(
            f"expert tensor parallel (etp={layout.etp}, ep={layout.ep})",
            f"{FMT} {TORCHTITAN_CURRENT}",
            "0.3 has no expert_tensor_parallel_degree (experts borrow FSDP and TP ranks); use etp=1",
        )
    sec = sections(layout, job)
    par = dict(sec["parallelism"])
    par.pop("expert_tensor_parallel_degree")
    out: list[str] = []
    for k, v in sec["training"].items():
        out.append(f"--training.{k} {shlex.quote(str(v))}")
    for k, v in par.items():
        out.append(f"--parallelism.{k} {shlex.quote(str(v))}")
    out.append("--training.disable_cuda_graphs")  # autopar prices eager launches
    return out, AC_SUBCOMMAND + layout.recompute


@register
class TorchtitanExporter(Exporter):
    name = FMT
    suffix = ".sh"
    description = (
        f"torchtitan {TORCHTITAN_CURRENT} command (--module/--config + overrides; "
        f"--launcher-version 0.2 for the {TORCHTITAN_VERSION} TOML)"
    )
    pipeline_schedules = PIPELINE_SCHEDULES
    launcher_version = TORCHTITAN_CURRENT

    def search_limits(self, job: Job) -> dict[str, list[Any]]:
        # the 0.2.2 refusals, and fp8 (no converters key); etp is left to the rendering check
        # (a dense layout's etp has no effect)
        return {
            "zero": [2, 3],
            "offload": [False],
            "precision": ["bf16", "fp32"],
            "sp": ["auto", "on"],
            "pipeline_ends": ["even"],
            "recompute": ["none", "selective", "full"],
        }

    def _render(self, layout: Layout, job: Job) -> str:
        flags, ac = overrides_v3(layout, job)
        module, config = torchtitan_model(job.model)
        named = module != MODULE_VAR
        lines = [
            header_line(FMT, job, inert_etp(layout)),
            f"# torchtitan {TORCHTITAN_CURRENT} command for layout: {layout.short()}",
        ]
        if not named:
            lines.append(
                "# set TORCHTITAN_MODULE and TORCHTITAN_CONFIG to the model's torchtitan module and "
                "config_registry function (e.g. llama3 llama3_8b)"
            )
        head = [
            f"torchrun --nnodes {job.nnodes} --nproc-per-node {job.nproc_per_node} -m torchtitan.train",
            f"--module {module if named else chr(34) + module + chr(34)}",
            f"--config {config if named else chr(34) + config + chr(34)}",
        ]
        lines.append(shell_lines([*head, *flags, ac]))
        return "\n".join(lines)

    def _parse(self, text: str) -> tuple[Layout, Job]:
        if "-m torchtitan.train" not in strip_comments(text):
            return TorchtitanTomlExporter()._parse(text)  # a 0.2.2 TOML
        header = read_header(text, FMT)
        assert header is not None
        try:
            toks = shlex.split(strip_comments(text))
        except ValueError as e:
            raise ExportError(f"the {FMT} text is not a shell command: {e}") from None
        if (
            toks[:1] != ["torchrun"]
            or "-m" not in toks
            or toks[toks.index("-m") + 1 :][:1] != ["torchtitan.train"]
        ):
            raise ExportError(f"the {FMT} text is not `torchrun ... -m torchtitan.train ...`")
        i = toks.index("-m")
        run = parse_flags(toks[1:i], TORCHRUN_FLAGS, (), FMT)
        rest = toks[i + 2 :]
        acs = [t for t in rest if t.startswith(AC_SUBCOMMAND)]
        if len(acs) != 1 or rest[-1] != acs[0]:
            raise ExportError(f"the {FMT} text needs one trailing {AC_SUBCOMMAND}<mode> subcommand")
        mode = acs[0].removeprefix(AC_SUBCOMMAND)
        if mode not in ("none", "selective", "full"):
            raise unsupported(f"activation checkpointing {mode!r}", "autopar (reading " + FMT + ")")
        f = parse_flags(rest[:-1], (*V3_VALUE_FLAGS, "--module", "--config"), V3_BOOL_FLAGS, FMT)
        for k in ("--module", "--config"):
            if k not in f:
                raise ExportError(f"{k} missing from the {FMT} text", "torchtitan 0.3 requires it")
        tr = {k.removeprefix("--training."): v for k, v in f.items() if k.startswith("--training.")}
        par = {k.removeprefix("--parallelism."): v for k, v in f.items() if k.startswith("--parallelism.")}
        cuda_graphs_off = bool(tr.pop("disable_cuda_graphs", False))
        doc = {"training": tr, "parallelism": par, "activation_checkpoint": {"mode": mode}}
        if mode == "selective":
            doc["activation_checkpoint"]["selective_ac_option"] = "op"
        body = dump_toml(doc)
        layout, job = TorchtitanTomlExporter()._parse(
            header_line(FMT, Job.from_dict(header["job"])) + "\n" + body
        )
        layout = layout.model_copy(update={"etp": 1 if layout.ep > 1 else etp_from_header(header, layout.tp)})
        if not cuda_graphs_off:
            raise unsupported(
                "CUDA graphs (torchtitan 0.3's default)",
                "autopar (reading " + FMT + ")",
                "autopar prices eager launches; add --training.disable_cuda_graphs",
            )
        for k, v in (("--nnodes", job.nnodes), ("--nproc-per-node", job.nproc_per_node)):
            if k in run and to_int(run[k], k, FMT) != v:
                raise ExportError(f"{k} {run[k]} disagrees with the job ({v}) in the {FMT} text")
        return layout, job
