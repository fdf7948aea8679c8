"""The ONE declaration of a job: model, cluster, workload, training stack and calibration.

Every other spelling is derived from these models: the CLI flags (``autopar.cli.args`` generates
them from the fields: name, type, bounds, choices, help and default), the Python API keywords
(the same names, flat: :meth:`Job.from_flat`), the ``"job"`` object of every JSON output
(:meth:`Job.to_dict`, with ``schema_version``), the exporters' job (``autopar.export.base.Job`` is
built from this one) and the engine's resolved runtime form (:class:`TrainingJob`, built
only by :meth:`Job.resolve`; ``autopar.engine`` re-exports it).

The parallel layout is declared separately, by :class:`autopar.layout.Layout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autopar.errors import AutoparError
from autopar.frameworks import (
    ATTENTION_KERNEL_DESCRIPTION,
    DEFAULT_MEMORY_HEADROOM,
    TP_OVERLAP_DESCRIPTION,
    TP_OVERLAP_STACKS,
    AttentionChoice,
    FrameworkProfile,
    TPOverlapChoice,
    attention_override,
    framework_profile,
    tp_overlap_override,
)
from autopar.hardware import DeviceProfile, load_cluster
from autopar.limits import (  # noqa: F401 - re-exported: job.MAX_* is public
    MAX_FRAMES,
    MAX_GLOBAL_BATCH,
    MAX_NUM_DEVICES,
    MAX_PIXELS,
    MAX_SEQ_LEN,
    MAX_STEPS,
)
from autopar.model import ModelSpec, check_context, check_costed, load_model
from autopar.moe import (
    A2A_OVERLAP_DESCRIPTION,
    DISPATCHER_DESCRIPTION,
    FUSED_GRAPH_DESCRIPTION,
    Dispatcher,
    MoEOptions,
)
from autopar.schedules import PIPELINE_SCHEDULE_DESCRIPTION, PipelineSchedule

SCHEMA_VERSION = 1

Framework = Literal["megatron", "torchtitan", "fsdp", "deepspeed", "megatron-deepspeed"]
WorkloadKind = Literal["training", "serving", "generation", "dit_training"]
WeightPrecision = Literal["bf16", "fp16", "fp8", "fp8-block", "int8", "int4", "nvfp4", "mxfp4"]
KVPrecision = Literal["bf16", "fp16", "fp8", "int8"]

# The export format a command writes for a training stack when no --format is given.
FRAMEWORK_EXPORT_FORMAT: dict[str, str] = {
    "megatron": "megatron",
    "torchtitan": "torchtitan",
    "fsdp": "accelerate",
    "deepspeed": "deepspeed",
    "megatron-deepspeed": "deepspeed",
}
# The stack whose step-time model every stack shares beyond its own time settings (attention
# kernel, host floor, TP overlap: autopar.frameworks); memory is wholly per stack.
COSTED_FRAMEWORK = "megatron"
FRAMEWORK_DESCRIPTION = (
    "training stack the job runs on; picks its profile (autopar.frameworks): memory (bytes per "
    "parameter of weights, gradients and optimizer state, ZeRO sharding, allocator reserve), the "
    "stack's time settings (flash or unfused attention, kernels launched per layer as a host floor, "
    "TP communication overlap) and the default export format (megatron->megatron, "
    "torchtitan->torchtitan, deepspeed and megatron-deepspeed->deepspeed, fsdp->accelerate). The rest "
    "of the step time (GEMM and attention efficiencies, collectives, pipeline schedule) is the "
    "calibrated Megatron-Core/Transformer-Engine model: a non-megatron stack's predictions say so as an assumption"
)
MEMORY_HEADROOM_DESCRIPTION = (
    "fraction of device memory kept free when judging whether a layout fits: it fits when the "
    "predicted device footprint (allocator-reserved + CUDA context + NCCL buffers) is at most "
    f"(1 - headroom) x capacity (default {DEFAULT_MEMORY_HEADROOM}: the memory model's error on "
    "measured runs is up to ~5 percent per model and the allocator's peak moves by a few percent between steps)"
)

ModelRef = Annotated[
    str,
    Field(min_length=1, description="preset id (see `autopar model --list`) or a HF config.json path"),
]
DeviceRef = Annotated[
    str, Field(min_length=1, description="device id, e.g. h100-sxm-80gb, or a device YAML path")
]
# Upper bounds keep absurd jobs (a typo, a hostile file) from building absurd arrays: they live in
# autopar.limits with every other input bound (MAX_NUM_DEVICES, MAX_SEQ_LEN, MAX_GLOBAL_BATCH, ...).
NumDevices = Annotated[
    int, Field(strict=True, ge=1, le=MAX_NUM_DEVICES, description="devices the job runs on")
]
DevicesPerNode = Annotated[
    int | None,
    Field(
        strict=True,
        ge=1,
        description="devices per scale-up domain actually used (None: the device's domain size)",
    ),
]
SeqLen = Annotated[int, Field(strict=True, ge=1, le=MAX_SEQ_LEN, description="tokens per sequence")]
GlobalBatch = Annotated[
    int, Field(strict=True, ge=1, le=MAX_GLOBAL_BATCH, description="sequences per optimizer step")
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClusterSpec(_Frozen):
    """The devices: which accelerator, how many, and how many share one scale-up domain."""

    device: DeviceRef
    num_devices: NumDevices
    devices_per_node: DevicesPerNode = None


class TrainingWorkload(_Frozen):
    """A training (or fine-tuning) run: sequence length, global batch, fine-tuning mode."""

    kind: Literal["training"] = "training"
    seq_len: SeqLen
    global_batch: GlobalBatch
    lora: bool = Field(
        False,
        description="LoRA/PEFT fine-tuning: base weights frozen (no weight gradients, sync or "
        "optimizer state; the adapters are neglected)",
    )
    moe_dispatcher: Dispatcher = Field("alltoall", description=DISPATCHER_DESCRIPTION)
    moe_a2a_overlap: bool = Field(False, description=A2A_OVERLAP_DESCRIPTION)
    moe_fused_graph: bool = Field(False, description=FUSED_GRAPH_DESCRIPTION)
    pipeline_schedule: PipelineSchedule = Field("1f1b", description=PIPELINE_SCHEDULE_DESCRIPTION)
    attention_kernel: AttentionChoice = Field("default", description=ATTENTION_KERNEL_DESCRIPTION)
    tp_comm_overlap: TPOverlapChoice = Field("default", description=TP_OVERLAP_DESCRIPTION)

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch


class ServingWorkload(_Frozen):
    """What is served: request shape, load, precisions, latency targets and runtime limits.

    Load is one of: ``concurrency`` (requests in flight over the whole deployment, closed loop),
    ``request_rate`` (open loop, requests/s over the whole deployment), ``offline`` (max-throughput:
    as many sequences as memory and ``max_batch`` allow), or none of them (sweep the concurrency).
    """

    kind: Literal["serving"] = "serving"
    isl: int = Field(ge=1, le=MAX_SEQ_LEN, description="prompt (input) tokens per request")
    osl: int = Field(ge=1, le=MAX_SEQ_LEN, description="generated (output) tokens per request")
    concurrency: int | None = Field(
        None, ge=1, le=MAX_GLOBAL_BATCH, description="requests in flight, whole deployment"
    )
    request_rate: float | None = Field(None, gt=0, description="requests/s, whole deployment")
    offline: bool = Field(False, description="max-throughput mode: memory decides the batch")
    weight_precision: WeightPrecision = Field(
        "bf16",
        description="precision of the linear-layer weights: fp8 (per-tensor scales), fp8-block (128x128 "
        "block scales), nvfp4 and mxfp4 (FP4 GEMMs where the device has them), int8 and int4 weight-only",
    )
    kv_precision: KVPrecision | None = Field(
        None, description="KV-cache precision (None: fp8 with fp8, fp8-block or nvfp4 weights, else bf16)"
    )
    ttft_ms: float | None = Field(
        None, gt=0, description="time-to-first-token target (ms): the mean, or the --percentile"
    )
    tpot_ms: float | None = Field(
        None, gt=0, description="time-per-output-token target (ms): the mean, or the --percentile"
    )
    goodput: float | None = Field(None, gt=0, le=1, description="share of requests meeting both targets")
    max_batch: int | None = Field(
        None,
        ge=1,
        description="runtime cap on sequences per instance (None: the backend's default: trtllm-bench's "
        "tuning cap 4096, vLLM max_num_seqs, SGLang max_running_requests)",
    )
    max_num_tokens: int | None = Field(
        None,
        ge=1,
        description="token budget per iteration (None: the backend's default: trtllm-bench's heuristic "
        "B*(1+isl/osl) in [2048, 32768], vLLM max_num_batched_tokens, SGLang chunked_prefill_size)",
    )
    chunked_prefill: bool | None = Field(
        None, description="chunked prefill (prompts split over iterations; None: the backend's default, on)"
    )
    kv_cache_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="memory share for the KV cache, as the backend counts it (None: its default): TRT-LLM "
        "free_gpu_memory_fraction of the memory left free (0.95), vLLM gpu_memory_utilization of the total "
        "(0.9), SGLang mem_fraction_static of the total, weights included (derived from the memory and TP)",
    )
    backend: Literal["trtllm", "vllm", "sglang"] = Field(
        "trtllm",
        description="serving stack whose scheduler, CUDA graphs, all-reduce, KV-cache and memory rules are "
        "modelled (profiles in cost_models/backends/)",
    )
    backend_version: str | None = Field(
        None, description="version of the backend (None: the version its profile was read at)"
    )
    percentile: Literal[50, 90, 95, 99] | None = Field(
        None,
        description="read --ttft-ms/--tpot-ms as this percentile over requests under Poisson arrivals at "
        "--request-rate (None: the targets are means)",
    )
    prefix_cache_hit_rate: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of each prompt's tokens found in the prefix cache: not prefilled again, "
        "still attended to and held in the KV cache",
    )
    arrival: Literal["staggered", "lockstep"] = Field(
        "staggered",
        description="how a fixed --concurrency's requests arrive: staggered (each finished request is "
        "replaced at once and the in-flight requests are spread over their lifetimes: steady state) or "
        "lockstep (all start together and, with one output length, finish together: the waves that "
        "closed-loop benchmark clients such as genai-perf or vllm bench --max-concurrency run, where "
        "each wave's prompts queue behind one another for their first token)",
    )
    expert_imbalance: float = Field(
        1.0,
        ge=1.0,
        le=64.0,
        description="routed tokens of the busiest expert-parallel rank over the mean (1: balanced; what "
        "expert load balancing such as EPLB brings down); an MoE layer waits for that rank's expert GEMMs "
        "and receives its share of the all-to-all",
    )
    ep_dispatch: Literal["default", "deepep"] = Field(
        "default",
        description="token dispatch of expert parallelism under attention data parallelism: default (the "
        "backend's own: every routed copy in 16 bits) or deepep (DeepEP kernels: a token crosses the "
        "network once per destination node and NVLink once per destination rank, dispatched in the "
        "GEMMs' 8- or 4-bit format; SGLang --moe-a2a-backend deepep, vLLM --all2all-backend deepep_*)",
    )
    ep_overlap: bool = Field(
        False,
        description="two-batch overlap: each iteration's batch runs as two halves, one's expert all-to-alls "
        "behind the other's compute (SGLang --enable-two-batch-overlap, vLLM --enable-dbo)",
    )
    speculative_tokens: int = Field(
        0,
        ge=0,
        le=16,
        description="draft tokens per decode step (MTP modules or a draft model; 0: no speculative decoding)",
    )
    acceptance_rate: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="probability that each draft token is accepted, given the ones before it were "
        "(needed with speculative_tokens)",
    )

    @model_validator(mode="after")
    def _check(self) -> ServingWorkload:
        modes = [
            n
            for n, on in (
                ("concurrency", self.concurrency is not None),
                ("request_rate", self.request_rate is not None),
                ("offline", self.offline),
            )
            if on
        ]
        if len(modes) > 1:
            raise ValueError(
                f"give at most one of concurrency, request_rate, offline (got {', '.join(modes)})"
            )
        if self.arrival == "lockstep" and (self.request_rate is not None or self.offline):
            raise ValueError(
                "arrival lockstep describes closed-loop clients at a fixed concurrency; give --concurrency "
                "(or none of the load flags, for a concurrency sweep) instead of request_rate/offline"
            )
        if self.speculative_tokens and self.acceptance_rate is None:
            raise ValueError("speculative_tokens needs acceptance_rate (the share of draft tokens accepted)")
        if self.percentile is not None and self.request_rate is None:
            raise ValueError(
                "percentile needs request_rate: the percentiles come from Poisson arrivals at that rate"
            )
        if self.percentile is not None and self.goodput is not None:
            raise ValueError("give percentile or goodput, not both (goodput is its own share of requests)")
        if self.goodput is not None and self.ttft_ms is None and self.tpot_ms is None:
            raise ValueError("goodput needs a ttft_ms or tpot_ms target to measure attainment against")
        return self

    @property
    def kv_dtype(self) -> str:
        if self.kv_precision is not None:
            return self.kv_precision
        return "fp8" if self.weight_precision in ("fp8", "fp8-block", "nvfp4") else "bf16"

    @property
    def mode(self) -> str:
        if self.offline:
            return "offline"
        if self.concurrency is not None:
            return "concurrency"
        if self.request_rate is not None:
            return "request_rate"
        return "sweep"

    @property
    def has_targets(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None


class GenerationWorkload(_Frozen):
    """Diffusion inference (``autopar.dit.inference``): one image or video per prompt batch."""

    kind: Literal["generation"] = "generation"
    height: int = Field(strict=True, ge=8, le=MAX_PIXELS, description="output height in pixels")
    width: int = Field(strict=True, ge=8, le=MAX_PIXELS, description="output width in pixels")
    frames: int = Field(1, strict=True, ge=1, le=MAX_FRAMES, description="output frames (1: an image)")
    steps: int = Field(50, strict=True, ge=1, le=MAX_STEPS, description="denoising steps")
    batch: int = Field(
        1, strict=True, ge=1, le=4096, description="samples generated together per prompt batch"
    )
    cfg: bool | None = Field(
        None,
        description="classifier-free guidance (a conditional and an unconditional pass per step); "
        "default: what the model needs (guidance-distilled FLUX.1-dev and HunyuanVideo run without)",
    )
    cache_skip: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of steps whose transformer forward a step cache (TeaCache, FBCache) reuses",
    )
    compiled: bool = Field(False, description="torch.compile (fewer elementwise passes and host launches)")
    parallel_vae: bool = Field(False, description="xDiT parallel VAE: the decode splits over the DiT ranks")
    warmup_steps: int = Field(
        1,
        strict=True,
        ge=0,
        le=MAX_STEPS,
        description="PipeFusion synchronous warm-up steps (xDiT default 1)",
    )
    offload_text_encoder: bool = Field(False, description="text encoders leave the GPU after encoding")
    latency_target_s: float | None = Field(
        None,
        gt=0,
        description="latency per image/video the layout must meet (s); ranks by throughput among those",
    )

    @model_validator(mode="after")
    def _warmup_within_steps(self) -> GenerationWorkload:
        if self.warmup_steps > self.steps:
            raise ValueError(
                f"warmup_steps {self.warmup_steps} exceeds steps {self.steps} (the warm-up steps are "
                "some of the denoising steps); pass --warmup-steps at most --steps"
            )
        return self


class DiTTrainingWorkload(_Frozen):
    """Diffusion-transformer training (``autopar.dit.training``) over a bucket list of shapes."""

    kind: Literal["dit_training"] = "dit_training"
    buckets: str = Field(
        min_length=1,
        max_length=4096,
        description="shapes in one batch: HEIGHTxWIDTHxFRAMES[:SHARE], comma-separated, e.g. "
        "720x1280x121:0.3,480x832x81:0.7 (shares normalized)",
    )
    global_batch: GlobalBatch = Field(description="samples per optimizer step")
    precomputed_latents: bool = Field(
        False, description="VAE latents and text features cached (no online encode)"
    )
    compiled: bool = Field(False, description="torch.compile")

    @field_validator("buckets")
    @classmethod
    def _check_buckets(cls, v: str) -> str:
        parse_buckets(v)
        return v

    def parsed_buckets(self) -> list[tuple[int, int, int, float]]:
        return parse_buckets(self.buckets)


def parse_buckets(text: str) -> list[tuple[int, int, int, float]]:
    """``HEIGHTxWIDTHxFRAMES[:SHARE]`` items, comma-separated."""
    out = []
    for part in text.split(","):
        shape, _, share = part.strip().partition(":")
        dims = shape.lower().split("x")
        try:
            h, w, f = (int(x) for x in dims)
            s = float(share) if share else 1.0
        except ValueError:
            h = w = f = -1
            s = 1.0
        if min(h, w, f) < 1 or max(h, w) > MAX_PIXELS or f > MAX_FRAMES or not 0 < s < float("inf"):
            raise ValueError(
                f"bucket {part.strip()!r} is not HEIGHTxWIDTHxFRAMES[:SHARE] with positive values"
            )
        out.append((h, w, f, s))
    return out


Workload = Annotated[
    TrainingWorkload | ServingWorkload | GenerationWorkload | DiTTrainingWorkload, Field(discriminator="kind")
]
WORKLOADS: dict[str, type[BaseModel]] = {
    "training": TrainingWorkload,
    "serving": ServingWorkload,
    "generation": GenerationWorkload,
    "dit_training": DiTTrainingWorkload,
}


class Job(_Frozen):
    """One job: the model, the cluster, the workload, the training stack and the calibration."""

    schema_version: Literal[1] = Field(1, description="version of this JSON shape (SCHEMA_VERSION)")
    model: ModelRef
    cluster: ClusterSpec
    workload: Workload
    framework: Framework = Field("megatron", description=FRAMEWORK_DESCRIPTION)
    memory_headroom: float = Field(
        DEFAULT_MEMORY_HEADROOM, ge=0, lt=1, description=MEMORY_HEADROOM_DESCRIPTION
    )
    calibration: str | None = Field(None, description="calibration YAML (None: the shipped one)")
    allow_long_context: bool = Field(
        False,
        description="accept sequences (training seq_len, serving isl+osl) beyond the model's position "
        "limit (max_position_embeddings, or the rope-scaled limit the config states), for long-context "
        "extension work; without it such a job is refused",
    )

    @model_validator(mode="after")
    def _check_schedule(self) -> Job:
        w = self.workload
        if (
            isinstance(w, TrainingWorkload)
            and w.pipeline_schedule not in self.framework_profile.pipeline_schedules
        ):
            runs = ", ".join(self.framework_profile.pipeline_schedules)
            raise ValueError(
                f"framework {self.framework} runs the {runs} pipeline schedule(s), not "
                f"{w.pipeline_schedule}; use --framework torchtitan for {w.pipeline_schedule}"
            )
        if (
            isinstance(w, TrainingWorkload)
            and w.tp_comm_overlap == "on"
            and self.framework not in TP_OVERLAP_STACKS
        ):
            raise ValueError(
                f"framework {self.framework} has no TP communication overlap autopar can export; "
                f"drop --tp-comm-overlap on or use --framework {' or '.join(TP_OVERLAP_STACKS)}"
            )
        return self

    # ---------------------------------------------------------------- flat keywords <-> the model
    @classmethod
    def from_flat(cls, *, kind: WorkloadKind = "training", **kw: Any) -> Job:
        """Build a Job from the flat keywords of the API and the CLI (the field names).

        Validation errors become one-line :class:`AutoparError` naming the flag to fix.
        """
        kw = {k: v for k, v in kw.items() if v is not None}  # None: the field's default
        top = {k: kw.pop(k) for k in JOB_TOP_KEYS if k in kw}
        cluster = {k: kw.pop(k) for k in ClusterSpec.model_fields if k in kw}
        try:
            return cls(**top, cluster=ClusterSpec(**cluster), workload=WORKLOADS[kind](**kw))
        except ValidationError as exc:
            raise job_error(exc) from None

    def flat(self) -> dict[str, Any]:
        """The flat keywords (field names) that :meth:`from_flat` takes back."""
        out: dict[str, Any] = {"model": self.model, **self.cluster.model_dump()}
        out.update((k, v) for k, v in self.workload.model_dump().items() if k != "kind")
        out.update(
            framework=self.framework,
            memory_headroom=self.memory_headroom,
            calibration=self.calibration,
            allow_long_context=self.allow_long_context,
        )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``"job"`` of every JSON output)."""
        return self.model_dump(mode="json")

    # ----------------------------------------------------------------------------- derived facts
    @property
    def training(self) -> TrainingWorkload:
        if not isinstance(self.workload, TrainingWorkload):
            raise AutoparError(f"this is a {self.workload.kind} job, not a training job")
        return self.workload

    @property
    def assumptions(self) -> list[str]:
        """What the prediction assumes about this job beyond its fields."""
        w = self.workload
        core_kw = (
            attention_override(self.framework, w.attention_kernel)
            if isinstance(w, TrainingWorkload)
            else None
        )
        core = (
            [
                f"attention core {core_kw} (the job's --attention-kernel; the {self.framework} "
                f"stack's default is {framework_profile(self.framework).attention})"
            ]
            if core_kw
            else []
        )
        tp_ov = (
            tp_overlap_override(self.framework, w.tp_comm_overlap)
            if isinstance(w, TrainingWorkload)
            else None
        )
        if tp_ov is not None:
            core.append(
                f"TP communication overlap {'on' if tp_ov else 'off'} (the job's --tp-comm-overlap; "
                f"the {self.framework} stack's default is "
                f"{'on' if framework_profile(self.framework).tp_comm_overlap else 'off'})"
            )
        if isinstance(w, TrainingWorkload) and w.moe_fused_graph:
            core.append(
                "MoE full-iteration CUDA graph with fused expert MLPs (the job's --moe-fused-graph: "
                "Megatron-Bridge's MXFP8 recipes from the 26.06 container, Blackwell; no host waits or "
                "launch gaps; no launcher writes it, so only the env export carries it)"
            )
        if self.framework == COSTED_FRAMEWORK:
            return core
        p = self.framework_profile
        return [
            f"framework={self.framework}: memory and the stack's time settings from the "
            f"{self.framework} profile (autopar.frameworks: {p.attention} attention, "
            f"{p.kernels_per_layer} kernels per layer per micro-batch x {p.launch_latency_us:g} us host "
            f"floor, TP comm overlap {'on' if p.tp_comm_overlap else 'off'}); GEMM and attention "
            "efficiencies, elementwise traffic, collectives and the pipeline schedule still costed with "
            "the calibrated Megatron-Core/Transformer-Engine model"
        ] + core

    @property
    def framework_profile(self) -> FrameworkProfile:
        """The profile (memory and time settings) of this job's training stack, with the job's own
        attention core and TP communication overlap where it names them
        (:attr:`TrainingWorkload.attention_kernel`, :attr:`TrainingWorkload.tp_comm_overlap`)."""
        w = self.workload
        if not isinstance(w, TrainingWorkload):
            return framework_profile(self.framework)
        return framework_profile(self.framework, w.attention_kernel, w.tp_comm_overlap)

    @property
    def export_format(self) -> str:
        """The export format written for this training stack when none is asked for."""
        return FRAMEWORK_EXPORT_FORMAT[self.framework]

    def resolve(self, *, model: ModelSpec | None = None, device: DeviceProfile | None = None) -> TrainingJob:
        """The engine's runtime form; ``model``/``device`` pass an already loaded spec/profile."""
        return TrainingJob.resolve(self, model=model, device=device)


JOB_TOP_KEYS = ("model", "framework", "memory_headroom", "calibration", "allow_long_context")


def flat_job_keys() -> tuple[str, ...]:
    """Every flat keyword of a training job (:meth:`Job.flat` / :meth:`Job.from_flat`)."""
    work = tuple(k for k in TrainingWorkload.model_fields if k != "kind")
    return ("model", *ClusterSpec.model_fields, *work, *JOB_TOP_KEYS[1:])


def job_error(exc: ValidationError) -> AutoparError:
    """One line naming the first invalid field and its flag."""
    err = exc.errors()[0]
    name = str(err["loc"][-1]) if err["loc"] else ""
    msg = err["msg"].removeprefix("Value error, ")
    got = f", got {err['input']!r}" if name and not isinstance(err.get("input"), dict) else ""
    where = f"{name}: " if name else ""
    hint = f"pass a valid --{name.replace('_', '-')}" if name else "see `autopar --help`"
    return AutoparError(f"invalid job: {where}{msg}{got}", hint)


@dataclass(frozen=True)
class TrainingJob:
    """The resolved runtime form of a training :class:`~autopar.job.Job`: the loaded model and device.

    Built only by :meth:`resolve` (``Job.resolve()``); everything but the loaded objects and the
    resolved node size is read from the declaration ``job``.
    """

    job: Job
    model: ModelSpec
    device: DeviceProfile
    devices_per_node: int

    @classmethod
    def resolve(
        cls, job: Job, *, model: ModelSpec | None = None, device: DeviceProfile | None = None
    ) -> TrainingJob:
        """Load the model and device of ``job`` (unless given) and resolve the node size."""
        job.training  # noqa: B018  (raises for a non-training job)
        spec = model if model is not None else load_model(job.model)
        check_costed(spec, "training step time and memory")
        check_context(spec, job.training.seq_len, allow_long_context=job.allow_long_context, what="seq_len")
        cluster = load_cluster(
            device or job.cluster.device, job.cluster.num_devices, job.cluster.devices_per_node
        )
        return cls(job, spec, cluster.device, cluster.devices_per_node)

    @property
    def num_devices(self) -> int:
        return self.job.cluster.num_devices

    @property
    def seq_len(self) -> int:
        return self.job.training.seq_len

    @property
    def global_batch(self) -> int:
        return self.job.training.global_batch

    @property
    def framework(self) -> FrameworkProfile:
        """The training stack's profile (memory per parameter, sharding, allocator; time settings)."""
        return self.job.framework_profile

    @property
    def memory_headroom(self) -> float:
        return self.job.memory_headroom

    @property
    def frozen_weights(self) -> bool:
        """LoRA-style fine-tuning: base weights frozen, adapters neglected."""
        return self.job.training.lora

    @property
    def moe_options(self) -> MoEOptions:
        """How the MoE layers run: the token dispatcher, the EP all-to-all overlap and the
        full-iteration graph with fused expert MLPs."""
        w = self.job.training
        return MoEOptions(
            dispatcher=w.moe_dispatcher, a2a_overlap=w.moe_a2a_overlap, fused_graph=w.moe_fused_graph
        )

    @property
    def pipeline_schedule(self) -> str:
        """The pipeline schedule (autopar.schedules): 1f1b, zb, zbv or dualpipev."""
        return self.job.training.pipeline_schedule

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    def info(self) -> dict[str, Any]:
        """The job as JSON outputs record it: the declaration with the node size resolved."""
        d = self.job.to_dict()
        d["cluster"]["devices_per_node"] = self.devices_per_node
        return d
