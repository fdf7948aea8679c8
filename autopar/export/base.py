"""The exporter contract: a :class:`Job` (what a layout runs), the :class:`Exporter` ABC, the registry.

Every exporter renders a resolved :class:`~autopar.layout.Layout` plus its :class:`Job` as the
text one launcher reads, and parses that text back (``parse(render(l, j)) == (l, j)``). A layout
feature the launcher cannot express raises :class:`ExportError`; nothing is dropped or rewritten.

Job fields a launcher has no key for (the model id of a DeepSpeed JSON, the node size of a vLLM
command, ...) travel in a one-line *autopar header*: ``# autopar-export: {json}`` at the top of
the text (a top-level ``"autopar"`` key in JSON formats). Parsing takes every value the launcher
expresses from the launcher's own keys and only the rest from the header; a header that
disagrees with the launcher keys (a hand-edited file) is an error. The header also carries the
expert tensor-parallel size of a dense layout (``ep == 1``) where the target has no ETP key: it
has no effect there, and keeping it lets the layout round-trip exactly.
"""

from __future__ import annotations

import json
import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autopar.errors import AutoparError
from autopar.frameworks import (
    ATTENTION_KERNEL_DESCRIPTION,
    TP_OVERLAP_DESCRIPTION,
    AttentionChoice,
    TPOverlapChoice,
    attention_override,
    framework_profile,
    tp_overlap_override,
)
from autopar.job import Framework, GlobalBatch, ModelRef, NumDevices, SeqLen, job_error
from autopar.job import Job as CoreJob
from autopar.layout import COLUMNS, RECOMPUTE_CODES, RECOMPUTE_MODULES, Layout
from autopar.moe import A2A_OVERLAP_DESCRIPTION, DISPATCHER_DESCRIPTION, FUSED_GRAPH_DESCRIPTION, Dispatcher
from autopar.schedules import PIPELINE_SCHEDULE_DESCRIPTION, PipelineSchedule

HEADER_TAG = "autopar-export"
HEADER_VERSION = 1
_HEADER_RE = re.compile(r"^#\s*" + HEADER_TAG + r":\s*(\{.*\})\s*$", re.MULTILINE)


class ExportError(AutoparError):
    """A layout (or job) that a launcher format cannot express, or text that does not parse back."""


ModelFeature = Literal["moe", "mla", "dense_mlp", "shared_experts"]
# Recompute module -> the model feature it needs (Megatron-Core's TransformerConfig refuses
# ``moe_act`` without MoE grouped GEMMs and ``mla_up_proj`` without MLA); core_attn and layernorm
# apply to every model.
_MODULE_NEEDS: dict[str, str] = {
    "moe_act": "moe",
    "mla_up_proj": "mla",
    "mlp": "dense_mlp",
    "shared_experts": "shared_experts",
}


def model_features(model_ref: Any) -> tuple[ModelFeature, ...]:
    """The :data:`ModelFeature` s of a model (preset id, config path or loaded spec)."""
    from autopar.model import load_model

    m = load_model(model_ref)
    out: list[ModelFeature] = []
    if m.is_moe:
        out.append("moe")
    if m.is_mla:
        out.append("mla")
    if m.layers - (m.moe_layers if m.is_moe else 0) > 0:
        out.append("dense_mlp")
    if m.is_moe and m.shared_expert_ffn:
        out.append("shared_experts")
    return tuple(out)


def serving_model_ref(model_ref: str, fmt: str) -> str:
    """What a serving command (``vllm serve``, ``--model-path``) loads for the job's model.

    A preset id is not a checkpoint: its ``hf_id`` (the Hugging Face repo its config.json came
    from) is named instead; a preset that records none (a paper's or NeMo recipe's dimensions) is
    refused, saying what to pass. A config.json path becomes its folder (the checkpoint directory).
    """
    import os
    from importlib import resources
    from pathlib import Path

    from autopar.files import parse_json
    from autopar.model import list_presets

    key = model_ref.strip().lower()
    if key in list_presets():
        text = resources.files("autopar").joinpath("presets", f"{key}.json").read_text(encoding="utf-8")
        hf_id = parse_json(text, f"preset {key}").get("hf_id")
        if not hf_id:
            raise ExportError(
                f"preset {key!r} records no loadable checkpoint (its dimensions come from a paper or a "
                f"NeMo recipe), so a {fmt} command cannot name one",
                "give --model the checkpoint's config.json (or its folder) instead of the preset id",
            )
        return str(hf_id)
    p = Path(model_ref).expanduser()
    if p.is_file():
        return os.fspath(p.parent) if os.fspath(p.parent) else "."
    return model_ref


def recompute_modules(mode: str, job: Job, fmt: str) -> list[str]:
    """Megatron-Core ``recompute_modules`` of a selective ``mode`` that apply to ``job``'s model."""
    try:
        features = model_features(job.model)
    except AutoparError as e:
        raise ExportError(
            f"recompute={mode} needs the model to pick Megatron recompute modules ({fmt}): {e}",
            "pass a preset id or a readable config.json as the model",
        ) from None
    return [m for m in RECOMPUTE_MODULES[mode] if m not in _MODULE_NEEDS or _MODULE_NEEDS[m] in features]


def recompute_mode(modules: list[str], fmt: str) -> str:
    """The autopar recompute mode of a Megatron ``recompute_modules`` list (inverse of the above).

    The generic modules decide the mode (``layernorm`` for norm_act, ``mlp``/``shared_experts``
    for norm_act_mlp); the model-specific ones may be absent (a model without MoE or MLA), but
    nothing outside the mode's set may be present.
    """
    got = set(modules)
    if got & {"mlp", "shared_experts"}:
        mode = "norm_act_mlp"
    elif "layernorm" in got:
        mode = "norm_act"
    else:
        mode = "selective"
    if (
        "core_attn" not in got
        or not got <= set(RECOMPUTE_MODULES[mode])
        or (mode != "selective" and "layernorm" not in got)
    ):
        raise unsupported(
            f"recompute modules {sorted(got)}",
            "autopar (reading " + fmt + ")",
            "autopar models core_attn; + layernorm, moe_act, mla_up_proj; + mlp, shared_experts",
        )
    return mode


def refuse_module_recompute(layout: Any, fmt: str) -> None:
    """Targets without Megatron's per-module recompute cannot express norm_act / norm_act_mlp."""
    if layout.recompute in ("norm_act", "norm_act_mlp"):
        raise unsupported(
            f"recompute={layout.recompute} (Megatron-Core recompute modules)",
            fmt,
            "use recompute none, selective or full, or export to megatron / megatron_bridge",
        )


def unsupported(feature: str, fmt: str, hint: str | None = None) -> ExportError:
    """The one wording for 'this target cannot say that': names the feature and the format."""
    return ExportError(f"{feature} cannot be expressed in {fmt}", hint)


class Job(BaseModel):
    """What a layout runs, as launchers need it: the core :class:`autopar.job.Job` flattened, with the
    node size resolved. Keyword-only; build it with :meth:`from_core`.

    The fields are the core job's own declarations (same types, bounds and descriptions).
    ``model`` is a preset id or a config path, written as given. ``num_layers`` is needed only by
    targets that size virtual pipeline stages in layers (torchtitan with ``vpp > 2``) and is used to
    check ``num_layers % (pp * vpp) == 0`` where known. ``device`` is the device-profile id of the
    prediction and ``framework`` the training stack (context only; no launcher consumes them).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelRef
    num_devices: NumDevices
    seq_len: SeqLen
    global_batch: GlobalBatch
    devices_per_node: int = Field(8, strict=True, ge=1, description="devices per node the launcher starts")
    num_layers: int | None = Field(None, strict=True, ge=1, description="transformer layers of the model")
    device: str | None = None
    framework: Framework = "megatron"
    pipeline_schedule: PipelineSchedule = Field("1f1b", description=PIPELINE_SCHEDULE_DESCRIPTION)
    moe_dispatcher: Dispatcher = Field("alltoall", description=DISPATCHER_DESCRIPTION)
    moe_a2a_overlap: bool = Field(False, description=A2A_OVERLAP_DESCRIPTION)
    moe_fused_graph: bool = Field(False, description=FUSED_GRAPH_DESCRIPTION)
    attention_kernel: AttentionChoice = Field("default", description=ATTENTION_KERNEL_DESCRIPTION)
    tp_comm_overlap: TPOverlapChoice = Field("default", description=TP_OVERLAP_DESCRIPTION)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            err = e.errors()[0]
            name = ".".join(str(p) for p in err["loc"])
            raise ExportError(
                f"Job.{name}: {err['msg']}, got {err.get('input')!r}", "pass a value the core job accepts"
            ) from None

    @classmethod
    def from_core(
        cls, job: CoreJob, *, devices_per_node: int | None = None, num_layers: int | None = None
    ) -> Job:
        """The exporters' view of a training ``job``; the node size is resolved from the device
        (its scale-up domain) when neither ``devices_per_node`` nor the job gives it."""
        t = job.training
        dpn = devices_per_node or job.cluster.devices_per_node
        if dpn is None:
            from autopar.hardware import load_cluster

            dpn = load_cluster(job.cluster.device, job.cluster.num_devices).devices_per_node
        return cls(
            model=job.model,
            num_devices=job.cluster.num_devices,
            seq_len=t.seq_len,
            global_batch=t.global_batch,
            devices_per_node=dpn,
            num_layers=num_layers,
            device=job.cluster.device,
            framework=job.framework,
            pipeline_schedule=t.pipeline_schedule,
            moe_dispatcher=t.moe_dispatcher,
            moe_a2a_overlap=t.moe_a2a_overlap,
            moe_fused_graph=t.moe_fused_graph,
            attention_kernel=t.attention_kernel,
            tp_comm_overlap=t.tp_comm_overlap,
        )

    @property
    def nnodes(self) -> int:
        """Nodes the job spans; every node runs the same number of ranks."""
        if self.num_devices <= self.devices_per_node:
            return 1
        if self.num_devices % self.devices_per_node:
            raise ExportError(
                f"num_devices={self.num_devices} is not a multiple of devices_per_node={self.devices_per_node}",
                "launchers start the same number of ranks on every node; use whole nodes",
            )
        return self.num_devices // self.devices_per_node

    @property
    def nproc_per_node(self) -> int:
        return self.num_devices // self.nnodes

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Job:
        names = set(cls.model_fields)
        unknown = sorted(set(d) - names)
        if unknown:
            raise ExportError(f"unknown job field(s) {unknown}", f"known: {sorted(names)}")
        missing = sorted(n for n in ("model", "num_devices", "seq_len", "global_batch") if d.get(n) is None)
        if missing:
            raise ExportError(
                f"job field(s) {missing} missing", "predict/recommend --json records carry them"
            )
        return cls(**{k: v for k, v in d.items() if v is not None})


class Exporter(ABC):
    """One launcher format. Subclasses set ``name``, ``suffix`` and ``description``.

    ``serving`` exporters (vLLM, SGLang) refuse training-only settings that are not at their
    defaults (``zero``, ``shard_group``, ``recompute``, ``grad_accum``, ``offload``): a serving
    engine has no optimizer step, and a non-default value would mean the scored layout was a
    training layout.
    """

    name: ClassVar[str]
    suffix: ClassVar[str]
    description: ClassVar[str]
    serving: ClassVar[bool] = False
    # Whether the format can declare the first/last pipeline stage's layer counts (Megatron's
    # --decoder-first/last-pipeline-num-layers); the others refuse such layouts.
    stage_layers: ClassVar[bool] = False
    # Whether the format can name Megatron-Core's recompute modules (recompute norm_act /
    # norm_act_mlp); the others refuse such layouts rather than write a different recompute.
    module_recompute: ClassVar[bool] = False
    # Pipeline schedules (autopar.schedules) the format can name; the others are refused.
    pipeline_schedules: ClassVar[tuple[str, ...]] = ("1f1b",)
    # Whether the format can name the MoE token dispatcher and the EP all-to-all overlap
    # (Job.moe_dispatcher / moe_a2a_overlap); the others refuse an expert-parallel layout priced with
    # anything but the plain all-to-all dispatcher without overlap.
    moe_options: ClassVar[bool] = False
    # Whether the format can write the full-iteration CUDA graph with fused expert MLPs a job was
    # priced with (Job.moe_fused_graph); the others refuse such a job.
    fused_graph_option: ClassVar[bool] = False
    # The attention cores (Job.attention_kernel) the format can name besides the stack's default; a
    # job priced with another core is refused rather than launched with the stack's own.
    attention_kernels: ClassVar[tuple[str, ...]] = ()
    # Whether the format writes the TP communication overlap a job was priced with where it is not
    # the stack's default (Job.tp_comm_overlap); the others refuse such a job with TP.
    tp_overlap_option: ClassVar[bool] = False
    # The launcher release whose parser the format is checked against (``--launcher-version``
    # picks an earlier one where the format changed: :func:`register_previous`).
    launcher_version: ClassVar[str | None] = None

    def search_limits(self, job: Job) -> dict[str, list[Any]]:
        """Search-space axes this launcher cannot run every value of: axis -> the values it can
        (``autopar.search.space.restrict_axes``: ``--framework X`` searches only these). Each
        subclass lists what its refusals rule out axis by axis; a refusal that depends on several
        axes at once (a product, a combination) is left to the search's check that renders every
        returned layout (``autopar.search.recommend.search_layouts``)."""
        return {}

    def render(self, layout: Layout, job: Job) -> str:
        """The launcher text for ``layout`` running ``job``; raises :class:`ExportError`."""
        check_layout_and_job(layout, job, self.name)
        if not self.stage_layers and (layout.first_stage_layers or layout.last_stage_layers):
            raise unsupported(
                f"first/last pipeline stage layers ({layout.first_stage_layers}/{layout.last_stage_layers})",
                self.name,
                "export to megatron or megatron_bridge, or use the even split (0/0)",
            )
        if not self.module_recompute and not self.serving:
            refuse_module_recompute(layout, self.name)
        if layout.pp > 1 and job.pipeline_schedule not in self.pipeline_schedules:
            raise unsupported(
                f"pipeline schedule {job.pipeline_schedule}",
                self.name,
                "export to torchtitan (torch.distributed.pipelining schedules), or use --pipeline-schedule 1f1b",
            )
        from autopar.schedules import schedule_problem

        why = schedule_problem(job.pipeline_schedule, layout.pp, layout.vpp, layout.grad_accum)
        if why is not None:  # torch's schedule would run another pipeline than the one scored
            raise ExportError(f"{why}, got vpp={layout.vpp}, grad_accum={layout.grad_accum} ({self.name})")
        if (
            not self.moe_options
            and layout.ep > 1
            and (job.moe_dispatcher != "alltoall" or job.moe_a2a_overlap)
        ):
            raise unsupported(
                f"MoE dispatcher {job.moe_dispatcher}"
                + (" with the EP all-to-all overlap" if job.moe_a2a_overlap else ""),
                self.name,
                "export to megatron, or price the job with --moe-dispatcher alltoall and no --moe-a2a-overlap",
            )
        if job.moe_fused_graph and not self.fused_graph_option:
            raise unsupported(
                "the full-iteration CUDA graph with fused expert MLPs (moe_fused_graph)",
                self.name,
                "price the job without --moe-fused-graph (the eager recipe every launcher writes), or "
                "export to env and set Megatron-Bridge's full-iteration recipe options by hand",
            )
        core = attention_override(job.framework, job.attention_kernel)
        if not self.serving and core is not None and core not in self.attention_kernels:
            raise unsupported(
                f"attention core {job.attention_kernel} (the {job.framework} stack's default is "
                f"{framework_profile(job.framework).attention})",
                self.name,
                "export to megatron (--attention-backend), or price the job with --attention-kernel default",
            )
        ov = tp_overlap_override(job.framework, job.tp_comm_overlap)
        if not self.serving and ov is not None and layout.tp > 1 and not self.tp_overlap_option:
            raise unsupported(
                f"TP communication overlap {'on' if ov else 'off'} (the {job.framework} stack's default "
                f"is {'on' if framework_profile(job.framework).tp_comm_overlap else 'off'})",
                self.name,
                "export to megatron (--tp-comm-overlap), or price the job with --tp-comm-overlap default",
            )
        if self.serving:
            check_serving(layout, self.name)
        text = self._render(layout, job)
        return text if text.endswith("\n") else text + "\n"

    def parse(self, text: str) -> tuple[Layout, Job]:
        """Read text written by :meth:`render` back into the layout and the job."""
        layout, job = self._parse(text)
        check_layout_and_job(layout, job, self.name)
        return layout, job

    @abstractmethod
    def _render(self, layout: Layout, job: Job) -> str: ...

    @abstractmethod
    def _parse(self, text: str) -> tuple[Layout, Job]: ...


EXPORTERS: dict[str, Exporter] = {}
# (format, launcher version) -> the exporter for that earlier launcher release.
PREVIOUS: dict[tuple[str, str], Exporter] = {}
_E = TypeVar("_E", bound=type[Exporter])


def register(cls: _E) -> _E:
    """Class decorator: instantiate the exporter and file it under its ``name``."""
    if cls.name in EXPORTERS:
        raise ValueError(f"exporter {cls.name!r} registered twice")
    EXPORTERS[cls.name] = cls()
    return cls


def register_previous(cls: _E) -> _E:
    """Class decorator: file an exporter for an earlier release of its launcher
    (``launcher_version``), reached with ``export(..., launcher_version=...)``."""
    if cls.launcher_version is None or (cls.name, cls.launcher_version) in PREVIOUS:
        raise ValueError(f"exporter {cls.name!r} needs one distinct launcher_version")
    PREVIOUS[(cls.name, cls.launcher_version)] = cls()
    return cls


def launcher_versions(fmt: str) -> list[str]:
    """The launcher versions ``fmt`` can be written for, current first."""
    cur = get_exporter(fmt).launcher_version
    return ([cur] if cur else []) + sorted((v for f, v in PREVIOUS if f == fmt), reverse=True)


def _same_release(asked: str, have: str) -> bool:
    """``0.2`` and ``0.2.2`` name the 0.2.2 release; ``0.3`` and ``0.3.0`` the 0.3.0 one."""
    a, h = asked.strip().lstrip("v").split("."), have.split(".")
    return len(a) >= 2 and h[: len(a)] == a


def get_exporter(fmt: str, launcher_version: str | None = None) -> Exporter:
    try:
        cur = EXPORTERS[fmt]
    except KeyError:
        raise ExportError(
            f"unknown export format {fmt!r}", f"use one of {', '.join(sorted(EXPORTERS))}"
        ) from None
    if launcher_version is None:
        return cur
    for have in launcher_versions(fmt):
        if _same_release(launcher_version, have):
            return cur if have == cur.launcher_version else PREVIOUS[(fmt, have)]
    known = launcher_versions(fmt)
    raise ExportError(
        f"--launcher-version {launcher_version} is not one autopar writes for {fmt}",
        f"use one of {', '.join(known)}"
        if known
        else f"{fmt} has a single version-independent form; drop it",
    )


def export(layout: Layout, fmt: str, job: Job, launcher_version: str | None = None) -> str:
    """Render ``layout`` for ``job`` in format ``fmt`` (a key of :data:`EXPORTERS`), for the
    launcher's current release or ``launcher_version`` (see :func:`launcher_versions`)."""
    return get_exporter(fmt, launcher_version).render(layout, job)


def parse(text: str, fmt: str) -> tuple[Layout, Job]:
    """Parse text written by ``export(..., fmt, ...)`` back into ``(layout, job)``."""
    return get_exporter(fmt).parse(text)


def layout_and_job_from_json(d: Mapping[str, Any]) -> tuple[Layout, Job]:
    """Read one record of ``predict --json`` / ``recommend --json`` (``"job"``: the core Job's dump).

    Layout fields are taken by name from the record; metric keys (step time, memory, reasons, ...)
    are ignored. A missing layout field takes the Layout default; a missing or invalid job is an error.
    """
    if not isinstance(d, Mapping):
        raise ExportError(f"expected a JSON object (one predict/recommend record), got {type(d).__name__}")
    if not isinstance(d.get("job"), Mapping):
        raise ExportError(
            "the JSON record has no 'job' object", "pass the output of `autopar predict/recommend --json`"
        )
    try:
        core = CoreJob.model_validate(d["job"])
    except ValidationError as e:
        raise ExportError(f"the JSON record's job is not valid: {job_error(e)}") from None
    lay = {k: d[k] for k in COLUMNS if k in d}
    layout = apply_stage_plan(build_layout(lay, "the JSON record"), d)
    job = Job.from_core(core)
    check_layout_and_job(layout, job, "the JSON record")
    return layout, job


def apply_stage_plan(layout: Layout, d: Mapping[str, Any]) -> Layout:
    """The layout a study record's per-stage plan (``stage_layers``, ``stage_recompute``: an
    ``uneven_pipeline`` space) runs, as launchers spell it, so that what is exported is what was scored.

    Layer counts: the even split stays the even split; first/last stages that differ from equal
    middle stages become ``first_stage_layers``/``last_stage_layers`` (Megatron's
    --decoder-first/last-pipeline-num-layers: the rest split evenly, as scored). Middle stages of
    different sizes, or different recompute modes on different stages, have no launcher flag
    (Megatron-LM runs one recompute mode and one split rule on every stage): refused.
    """
    layers, recs = d.get("stage_layers"), d.get("stage_recompute")
    if layers is None and recs is None:
        return layout
    where = "the JSON record's per-stage plan"
    for name, v in (("stage_layers", layers), ("stage_recompute", recs)):
        if v is not None and (
            not isinstance(v, list)
            or len(v) != layout.pp
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
        ):
            raise ExportError(
                f"{where}: {name} must list one non-negative integer per pipeline stage (pp={layout.pp}), got {v!r}",
                "pass the record `autopar study show --json` wrote",
            )
    update: dict[str, Any] = {}
    if recs is not None:
        if any(c >= len(RECOMPUTE_CODES) for c in recs):
            raise ExportError(f"{where}: unknown recompute code in stage_recompute {recs!r}")
        modes = [RECOMPUTE_CODES[c] for c in recs]
        if len(set(modes)) > 1:
            raise unsupported(
                f"per-stage recompute ({'/'.join(modes)})",
                "any launcher",
                "Megatron-LM runs one recompute mode on every stage; run the study with "
                "uneven_pipeline.per_stage_recompute: false to get a launchable winner",
            )
        update["recompute"] = modes[0]
    if layers is not None:
        if layout.vpp != 1 or min(layers) < 1:
            raise ExportError(
                f"{where}: stage_layers {layers} with vpp={layout.vpp}",
                "vpp must be 1, every stage >= 1 layer",
            )
        q, rem = divmod(sum(layers), layout.pp)
        even = [q + (i < rem) for i in range(layout.pp)]  # autopar.search.uneven.even_split
        first = last = 0
        if layers != even:
            middle = layers[1:-1]
            if len(set(middle)) > 1:
                raise unsupported(
                    f"pipeline stages of {'/'.join(map(str, layers))} layers (uneven middle stages)",
                    "any launcher",
                    "Megatron sets only the first and the last stage's layers; the rest split evenly",
                )
            mid = middle[0] if middle else None
            first = layers[0] if layers[0] != mid else 0
            last = layers[-1] if layers[-1] != mid and mid is not None else 0
        update.update(first_stage_layers=first, last_stage_layers=last)
    return layout.model_copy(update=update)


# ---------------------------------------------------------------------------------------------
# checks shared by every format


def check_layout_and_job(layout: Layout, job: Job, fmt: str) -> None:
    """Identities every launcher relies on; a mismatch means the pair was not scored together."""
    if layout.num_devices != job.num_devices:
        raise ExportError(
            f"layout uses tp*pp*cp*dp = {layout.tp}*{layout.pp}*{layout.cp}*{layout.dp} = {layout.num_devices} "
            f"devices but the job has num_devices={job.num_devices} ({fmt})",
            "export the layout with the job it was resolved for",
        )
    if layout.global_batch != job.global_batch:
        raise ExportError(
            f"layout batch micro_batch*grad_accum*dp = {layout.micro_batch}*{layout.grad_accum}*{layout.dp} = "
            f"{layout.global_batch} != job global_batch={job.global_batch} ({fmt})",
            "export the layout with the job it was resolved for",
        )
    expert_width = layout.ep * layout.etp
    dense_width = layout.tp * layout.cp * layout.dp
    if dense_width % expert_width:
        raise ExportError(
            f"ep*etp = {layout.ep}*{layout.etp} = {expert_width} does not divide "
            f"tp*cp*dp = {dense_width} ({fmt})",
            "expert ranks are carved out of tp*cp*dp",
        )
    if layout.sp and layout.tp == 1:
        raise ExportError(
            f"sequence parallel (sp=True) with tp=1 ({fmt})",
            "sequence parallelism shards along the tensor-parallel group; set sp=False",
        )
    if layout.vpp > 1 and layout.pp == 1:
        raise ExportError(
            f"virtual pipeline stages (vpp={layout.vpp}) without pipeline parallelism ({fmt})",
            "vpp > 1 needs pp > 1",
        )
    declared = layout.first_stage_layers or layout.last_stage_layers
    if declared and job.num_layers is not None:
        from autopar.legality import stage_split_problems

        cols = {
            k: np.asarray([getattr(layout, k)])
            for k in ("pp", "vpp", "first_stage_layers", "last_stage_layers")
        }
        bad_split, bad_vpp = stage_split_problems(_Layers(job.num_layers), cols)
        if bad_split[0] or bad_vpp[0]:
            raise ExportError(
                f"first/last stage layers {layout.first_stage_layers}/{layout.last_stage_layers} do not "
                f"split num_layers={job.num_layers} over pp={layout.pp}, vpp={layout.vpp} as Megatron "
                f"requires ({fmt})",
                "see `autopar predict` with these flags for the allowed values",
            )
    # Serving runtimes split the layers over pipeline stages themselves, unevenly where they do not
    # divide (vLLM/SGLang get_pp_indices: the remainder goes to the stages before the last).
    serving = fmt in EXPORTERS and EXPORTERS[fmt].serving
    if (
        not declared
        and not serving
        and job.num_layers is not None
        and job.num_layers % (layout.pp * layout.vpp)
    ):
        raise ExportError(
            f"num_layers={job.num_layers} is not divisible by pp*vpp = {layout.pp}*{layout.vpp} ({fmt})",
            "choose pp and vpp that split the layers evenly",
        )
    job.nnodes  # noqa: B018  (raises on a partial last node)


class _Layers:
    """The one model attribute the stage-split rule reads."""

    def __init__(self, layers: int) -> None:
        self.layers = layers


def pipeline_split(layout: Layout, job: Job, fmt: str) -> tuple[str, int, int]:
    """How Megatron spells the layout's first/last stage layers: ``("even", 0, 0)``,
    ``("layers", first, last)`` (``--decoder-first/last-pipeline-num-layers``; Megatron-Core needs
    them divisible by vpp) or ``("account_for", embedding, loss)`` (``--account-for-embedding/
    loss-in-pipeline-split``: the end stage holds one layer less than a middle one; the only form
    with interleaving when the ends are not divisible by vpp; Megatron-Core refuses to combine the
    two forms, TransformerConfig.__post_init__, mcore 0.16)."""
    f, last, v = layout.first_stage_layers, layout.last_stage_layers, layout.vpp
    if not (f or last):
        return "even", 0, 0
    if f % v == 0 and last % v == 0:
        return "layers", f, last
    if job.num_layers is None:
        raise ExportError(
            f"first/last stage layers {f}/{last} with vpp={v} need num_layers to be written ({fmt})",
            "pass the job with num_layers (export from predict/recommend --json)",
        )
    ends = (f > 0) + (last > 0)
    mid = (job.num_layers - f - last) // (layout.pp - ends)
    if all(x in (0, mid - 1) for x in (f, last)):
        return "account_for", int(f > 0), int(last > 0)
    raise unsupported(
        f"first/last stage layers {f}/{last} with vpp={v}",
        fmt,
        "Megatron needs them divisible by vpp, or one layer less than a middle stage",
    )


def split_from_account_for(
    embedding: bool, loss: bool, *, pp: int, num_layers: int | None, fmt: str
) -> tuple[int, int]:
    """(first, last) stage layers of Megatron's account-for-embedding/loss split."""
    if not (embedding or loss):
        return 0, 0
    if num_layers is None:
        raise ExportError(
            f"--account-for-embedding/loss-in-pipeline-split needs num_layers ({fmt})",
            "keep the autopar header, which carries num_layers",
        )
    per_rank = exact_div(num_layers + int(embedding) + int(loss), pp, "(num_layers + ends) / pp", fmt)
    return (per_rank - 1 if embedding else 0), (per_rank - 1 if loss else 0)


def check_sharding(layout: Layout, fmt: str) -> None:
    """For launcher formats: a shard group and optimizer offload both need a sharded optimizer."""
    if layout.shard_group:
        if layout.zero == 0:
            raise unsupported(
                f"shard_group={layout.shard_group} without ZeRO/FSDP (zero=0)",
                fmt,
                "a shard group only means something with zero >= 1",
            )
        if (layout.dp * layout.cp) % layout.shard_group:
            raise ExportError(
                f"shard_group={layout.shard_group} does not divide dp*cp = {layout.dp * layout.cp} ({fmt})"
            )
    if layout.offload and layout.zero == 0:
        raise unsupported(
            "optimizer offload without a sharded optimizer (offload=True, zero=0)",
            fmt,
            "the launcher offloads the distributed/ZeRO optimizer; use zero >= 1",
        )


def check_serving(layout: Layout, fmt: str) -> None:
    """Serving engines have no optimizer: training-only settings must be at their defaults."""
    for name, default in (
        ("zero", 0),
        ("shard_group", 0),
        ("recompute", "none"),
        ("grad_accum", 1),
        ("offload", False),
    ):
        v = getattr(layout, name)
        if v != default:
            raise unsupported(
                f"training-only setting {name}={v}",
                fmt,
                f"a serving engine has no optimizer step; {name} must be {default!r}",
            )


def build_layout(values: Mapping[str, Any], fmt: str) -> Layout:
    try:
        return Layout(**values)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ExportError(f"{fmt} text does not describe a valid layout: {errs}") from None


def canonical_shard_group(layout: Layout) -> int:
    """``shard_group`` as launchers express it: 0 when the group is all dp*cp ranks."""
    return 0 if layout.shard_group in (0, layout.dp * layout.cp) else layout.shard_group


def shard_instances(layout: Layout) -> int:
    """Replicas of the sharded state (HSDP outer size): dp*cp / shard size."""
    return (layout.dp * layout.cp) // layout.shard_size


# ---------------------------------------------------------------------------------------------
# the autopar header


def header_payload(fmt: str, job: Job, inert: Mapping[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"format": fmt, "version": HEADER_VERSION, "job": job.to_dict()}
    if inert:
        out["inert"] = dict(inert)
    return out


def header_line(fmt: str, job: Job, inert: Mapping[str, Any] | None = None) -> str:
    body = json.dumps(header_payload(fmt, job, inert), sort_keys=True, separators=(",", ":"))
    return f"# {HEADER_TAG}: {body}"


def read_header(text: str, fmt: str, *, required: bool = True) -> dict[str, Any] | None:
    """The header dict of ``text`` (from a ``# autopar-export:`` line)."""
    found = _HEADER_RE.findall(text)
    if not found:
        if required:
            raise ExportError(
                f"no '# {HEADER_TAG}:' header line in the {fmt} text",
                "parse reads text written by `autopar export`",
            )
        return None
    if len(found) > 1:
        raise ExportError(
            f"{len(found)} '# {HEADER_TAG}:' header lines in the {fmt} text", "keep exactly one"
        )
    try:
        payload = json.loads(found[0])
    except json.JSONDecodeError as e:
        raise ExportError(f"malformed {HEADER_TAG} header in the {fmt} text: {e}") from None
    return check_header(payload, fmt)


def check_header(payload: Any, fmt: str) -> dict[str, Any]:
    if not isinstance(payload, dict) or not isinstance(payload.get("job"), dict):
        raise ExportError(f"malformed {HEADER_TAG} header in the {fmt} text: expected an object with 'job'")
    if payload.get("format") != fmt:
        raise ExportError(
            f"the text was exported as {payload.get('format')!r}, not {fmt!r}",
            f"parse it with format {payload.get('format')!r}",
        )
    if payload.get("version") != HEADER_VERSION:
        raise ExportError(f"{HEADER_TAG} header version {payload.get('version')!r} is not {HEADER_VERSION}")
    unknown = set(payload) - {"format", "version", "job", "inert"}
    if unknown:
        raise ExportError(f"unknown {HEADER_TAG} header key(s) {sorted(unknown)} in the {fmt} text")
    inert = payload.get("inert", {})
    if not isinstance(inert, dict) or set(inert) - {"etp"}:
        raise ExportError(f"malformed 'inert' entry in the {HEADER_TAG} header of the {fmt} text")
    return payload


def merge_job(header: Mapping[str, Any] | None, native: Mapping[str, Any], fmt: str) -> Job:
    """The job from launcher keys (``native``) completed by the header; disagreement is an error."""
    d: dict[str, Any] = dict(header["job"]) if header else {}
    for k, v in native.items():
        if k in d and d[k] is not None and d[k] != v:
            raise ExportError(
                f"{fmt} text says {k}={v!r} but its {HEADER_TAG} header says {d[k]!r}",
                "the file was edited after export; re-export it",
            )
        d[k] = v
    return Job.from_dict(d)


def inert_etp(layout: Layout) -> dict[str, int]:
    """ETP of a dense layout, for targets without an ETP key (it has no effect when ep == 1)."""
    return {"etp": layout.etp} if layout.ep == 1 else {}


def etp_from_header(header: Mapping[str, Any] | None, tp: int) -> int:
    """Dense-layout ETP back from the header; Megatron's own default (etp = tp) when absent."""
    inert = (header or {}).get("inert", {})
    v = inert.get("etp", tp)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ExportError(f"malformed inert etp {v!r} in the {HEADER_TAG} header")
    return v


# ---------------------------------------------------------------------------------------------
# command-line helpers (Megatron flags, vLLM/SGLang/torchrun commands)


def strip_comments(text: str) -> str:
    """Shell text without comment lines and line continuations."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return "\n".join(lines).replace("\\\n", " ")


def shell_lines(parts: Iterable[str], indent: str = "  ") -> str:
    """Arguments one per line, joined with backslash continuations (already shell-quoted)."""
    parts = list(parts)
    if not parts:
        return ""
    return (" \\\n" + indent).join(parts)


def flag(name: str, value: Any = None) -> str:
    if value is None:
        return name
    return f"{name} {shlex.quote(str(value))}"


def parse_flags(
    tokens: list[str],
    value_flags: Iterable[str],
    bool_flags: Iterable[str],
    fmt: str,
    list_flags: Iterable[str] = (),
) -> dict[str, Any]:
    """``--flag value`` / ``--flag`` tokens into a dict; unknown or repeated flags are errors.

    ``list_flags`` take every following token up to the next ``--flag`` (argparse ``nargs='*'``),
    as a space-joined string.
    """
    value_flags, bool_flags, list_flags = set(value_flags), set(bool_flags), set(list_flags)
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        name, eq, inline = tok.partition("=")
        if name in out:
            raise ExportError(f"{name} given twice in the {fmt} text")
        if name in list_flags and not eq:
            j = i + 1
            while j < len(tokens) and not tokens[j].startswith("--"):
                j += 1
            out[name] = " ".join(tokens[i + 1 : j])
            i = j
        elif name in bool_flags and not eq:
            out[name] = True
            i += 1
        elif name in value_flags:
            if eq:
                out[name] = inline
                i += 1
            else:
                if i + 1 >= len(tokens):
                    raise ExportError(f"{name} has no value in the {fmt} text")
                out[name] = tokens[i + 1]
                i += 2
        else:
            raise ExportError(
                f"unknown argument {tok!r} in the {fmt} text",
                f"autopar reads only {', '.join(sorted(value_flags | bool_flags | list_flags))}",
            )
    return out


def to_int(value: Any, what: str, fmt: str) -> int:
    if isinstance(value, bool):
        raise ExportError(f"{what} must be an integer in the {fmt} text, got {value!r}")
    from autopar.limits import echo, int_literal

    try:
        return int_literal(value) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ExportError(f"{what} must be an integer in the {fmt} text, got {echo(value)}") from None


def exact_div(a: int, b: int, what: str, fmt: str) -> int:
    if b <= 0 or a % b:
        raise ExportError(f"{what}: {a} is not divisible by {b} in the {fmt} text")
    return a // b


def check_keys(d: Mapping[str, Any], allowed: Iterable[str], where: str, fmt: str) -> None:
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ExportError(
            f"unknown key(s) {unknown} in {where} of the {fmt} text", f"autopar reads only {sorted(allowed)}"
        )


def expect(cond: bool, make: Callable[[], ExportError]) -> None:
    if not cond:
        raise make()
