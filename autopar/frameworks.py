"""Training-stack profiles: what each stack keeps per parameter (MEMORY) and how its layers run (TIME).

One :class:`FrameworkProfile` per stack named by :data:`autopar.job.Framework`. MEMORY, read by
:func:`autopar.memory.stage_memory` and the engine's feasibility test: bytes per parameter of the
persistent weights, of the main gradients and of the optimizer state, the lowest ZeRO stage
(``Layout.zero``) that shards each of them over the data-parallel shard group, the caching
allocator's reserve above allocated memory, the runtime reserve outside the allocator and the
basis (allocated or reserved) the stack's own memory log reports. TIME, read by
:func:`autopar.latency.stage_slot`: the attention kernel (FlashAttention-class or the unfused
softmax/dropout core, which also sets the activation memory's attention term), the kernels one
layer launches per micro-batch and the host time per launch (the host floor), and whether TP
communication overlaps the GEMMs. Everything else of the step-time model (GEMM and attention
efficiencies, elementwise traffic, collectives, pipeline schedule) is Megatron-Core's for every
stack (see ``Job.assumptions``).

Sources (mixed bf16/fp16 training with Adam; pure fp32 training keeps ``autopar.memory``'s FP32_*
figures for every stack):

* Megatron-LM / Megatron-Core: bf16 parameters, fp32 main gradients, fp32 master + Adam moments.
  ``megatron/training/arguments.py``: "bfloat16 requires gradient accumulation and all-reduce to
  be done in fp32" (``accumulate_allreduce_grads_in_fp32 = True`` for bf16). The distributed
  optimizer (zero=1) "distribute[s] all 'non-overlapping' optimizer state ... [no] distribute model
  gradients, [no] distribute model parameters"; bytes per parameter "float16 param, fp32 grads:
  18 non-distributed, 6 + 12/d distributed" (Megatron-Core developer guide, distrib_optimizer,
  docs/source/api-guide/dist_optimizer.md). zero=2/3 is Megatron-FSDP (``optim_grads``,
  ``optim_grads_params``; see ``autopar.export.megatron``), which shards the fp32 main gradients
  and then the parameters.
* PyTorch FSDP (FSDP1 via accelerate/llm-foundry/Composer, FSDP2 ``fully_shard``) and torchtitan:
  the sharded parameter stays in its original dtype (fp32) and is what the optimizer steps:
  "FSDP ... keeps the high-precision sharded parameters in memory anyway ... does not require any
  extra memory to keep a high-precision copy of the parameters for the optimizer step", "The
  optimizer step uses the sharded parameter in the original dtype" (``MixedPrecisionPolicy``
  docstring, torch/distributed/fsdp/_fully_shard/_fsdp_api.py). Gradients land on that sharded
  fp32 parameter (torchtitan's default ``mixed_precision_reduce = "float32"``, ``mixed_precision_param
  = "bfloat16"``: torchtitan/config/job_config.py). So 4 (fp32 sharded param) + 4 (fp32 sharded
  grad) + 8 (Adam m, v) = 16/d bytes per parameter under full sharding -- the same total as the
  ZeRO-3 (2 + 2 + 12)/d, split differently; the bf16 gathered copies are the transient
  ``zero3_buffers``. FSDP shards parameters and gradients together (zero=2 is FSDP2's
  ``reshard_after_forward=False``, zero=3 ``True``); zero=0 is DDP with autocast (fp32 params and
  grads, 16 bytes unsharded).
* DeepSpeed ZeRO (and Megatron-DeepSpeed, which uses DeepSpeed's ZeRO optimizer): bf16/fp16
  parameters and gradients, fp32 master + Adam states, K = 12 (Rajbhandari et al. 2020, arXiv
  1910.02054, Fig. 1: (2 + 2 + K)); stage 1 shards the optimizer states, stage 2 also the
  gradients, stage 3 also the parameters. Under ZeRO the gradient dtype is the model dtype
  (``deepspeed/runtime/engine.py`` ``_do_optimizer_sanity_check``: bf16 with fp32 gradient
  accumulation takes the BF16_Optimizer only when asked for, ``grad_accum_dtype = fp32``).

Allocator: the PyTorch caching allocator reserves whole segments; reserved minus allocated
(fragmentation) comes from the activations, which are freed and re-allocated in varying sizes every
micro-batch, while model state lives in a few large buffers allocated once. PyTorch traces show
5-15% of the activations: 0.10 is kept. No measured reserved figure is in the published data to
check it (SimuMax's *simulated* reserved/allocated for run sm-45 of
``studies/data/published_runs_dev2.csv``, 68.75/64.63 GiB, would be ~0.33 of that stage's
activations: a simulator's output, not a measurement, so not used). The runtime reserve outside the allocator
(CUDA context, cuBLAS/cuDNN/TE workspaces, NCCL's own buffers are ``comm_buffers``) is ~2 GiB.

Time settings (sources):

* Attention kernel. Megatron-Core runs Transformer-Engine's ``DotProductAttention`` ("te"): TE's
  backend selection gives cuDNN's fused attention (FusedAttention, F16_arbitrary_seqlen) preference
  over FlashAttention on sm90 and newer ("Disabling FlashAttention to give FusedAttention
  preference on Hopper+ for performance reasons", ``get_attention_backend`` in
  transformer_engine/pytorch/attention/dot_product_attention/utils.py) and runs FlashAttention-2
  below sm90. The device's ``efficiency.fused_attention_speedup`` is that kernel's speed over
  FlashAttention-2 (the H100 figure: Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, Figs. 5
  and 6, head dim 128: cuDNN / FlashAttention-2 = 1.6 forward (causal, 1k-16k) and backward);
  torchtitan ``F.scaled_dot_product_attention`` (flash backend); llm-foundry's MPT FlashAttention
  (``attn_impl: flash``/``triton``). Megatron-DeepSpeed (bigscience-workshop, 2022) and the Megatron
  GPT model DeepSpeed ran with in 2021 have no FlashAttention: ``CoreAttention`` computes the whole
  s x s score matrix with ``baddbmm``, masks it, softmaxes it, applies attention dropout and
  multiplies by V with ``bmm`` ("unfused"), storing the 5as^2b bytes of Korthikanti et al. 2022
  Table 2. (Generic ``deepspeed`` rows are costed the same: the published ZeRO-3 runs are that
  Megatron GPT model, Narayanan et al. 2021 Sec. 5.2.)
* Host floor. An eager PyTorch stack launches every kernel from the host: ~5-25 us of CPU work per
  op (Python, autograd, ATen dispatcher, ``cudaLaunchKernel`` ~1-3 us on CUDA 12; "From PyTorch op
  to kernel launch", jiahuanglin.xyz gpu_kernel_serving lesson 18), 10 us is taken. The launch is
  asynchronous, so it costs nothing while the GPU is busier than the host; a layer cannot run
  faster than its launches (``autopar.latency.stage_slot``). CUDA graphs would lower it; none of
  these profiles captures graphs by default (Megatron's ``--enable-cuda-graph``, torchtitan's
  compile modes are opt-in). Kernels per layer per micro-batch (tp = 1, forward counted from the
  layer's code, backward 2x the forward: data- and weight-gradient GEMMs, one backward kernel per
  elementwise op; full recompute relaunches the forward):
  Megatron-Core/TE 12 forward (LayerNormLinear = norm + GEMM, 2 fused RoPE, attention, projection,
  bias-dropout-add, LayerNormMLP = norm + fc1 + SwiGLU + fc2, bias-dropout-add) -> 36, main-grad
  accumulation fused into the wgrad GEMM (``gradient_accumulation_fusion``);
  Megatron-DeepSpeed 15 forward (layernorm, QKV GEMM, baddbmm, masked_fill, softmax, dropout, bmm,
  permute-copy, projection, bias-dropout-add, layernorm, fc1, bias-GeLU, fc2, bias-dropout-add)
  -> 45, plus one gradient copy per parameter tensor (12) into ZeRO's reduction bucket -> 57;
  llm-foundry MPT 13 forward (layernorm, Wqkv, q/k/v rearrange copy, flash attention, out_proj,
  residual dropout, add, layernorm, up, GeLU, down, residual dropout, add) -> 39; torchtitan Llama 33 forward
  (two eager RMSNorms of 6 kernels, wq/wk/wv, RoPE as complex multiply of q and k, 6, three
  transposes, SDPA, wo, add, w1, w3, SiLU, mul, w2, add) -> 99.
* TP communication overlap. Megatron-Core/TE pipelines the TP all-gather/reduce-scatter with the
  neighbouring GEMMs (``--tp-comm-overlap``, userbuffers), the calibrated ``tp_overlap`` fraction
  is hidden; Megatron-DeepSpeed's ``RowParallelLinear`` all-reduces synchronously after the GEMM
  (no overlap), and torchtitan's async TP is opt-in (``enable_async_tensor_parallel``), FSDP has no TP.
* ZeRO-3 fetch rate. PyTorch FSDP and Megatron-FSDP gather a whole layer's flat buffer with one
  collective on its own stream: wire-bound (``zero3_fetch_gbps`` None). DeepSpeed's ZeRO-3 of the
  2021 runs gathered each sub-module's partitions with a device synchronization and Python-side
  copies per all_gather: 24 GB/s of parameter bytes per GPU inside one NVLink node (DeepSpeed
  issue #1174, v0.3.16 on 8x A100: a 5.1 B-parameter forward took 480 ms against 60 ms of compute),
  paid on top of the wire for both gathers and the gradient reduce-scatter. It is a measured rate,
  not a fitted one: it is what makes Narayanan et al.'s ZeRO-3 rows (Table 2, 384-2,240 A100s)
  comm-bound at a step time that does not shrink with more GPUs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MemoryBasis = Literal["allocated", "reserved"]
AttentionKernel = Literal["flash", "te", "unfused"]


class FrameworkProfile(BaseModel):
    """What one training stack keeps per parameter (mixed precision) and its allocator figures."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    weight_bytes: float = Field(
        gt=0, description="persistent weights per parameter (bf16 working copy, or FSDP's fp32 shard)"
    )
    weight_shard_stage: int = Field(ge=1, le=3, description="lowest zero stage that shards the weights")
    grad_bytes: float = Field(gt=0, description="main gradients per parameter")
    grad_shard_stage: int = Field(ge=1, le=3, description="lowest zero stage that shards the gradients")
    optimizer_bytes: float = Field(
        gt=0, description="optimizer state per parameter (fp32 master if separate, Adam m and v)"
    )
    optimizer_shard_stage: int = Field(ge=1, le=3, description="lowest zero stage that shards the optimizer")
    fragmentation: float = Field(
        ge=0, description="caching-allocator reserved above allocated, as a fraction of the activations"
    )
    framework_reserve_gib: float = Field(
        ge=0, description="CUDA context and workspaces outside the allocator"
    )
    reported_basis: MemoryBasis = Field(description="what the stack's own memory log reports")
    attention: AttentionKernel = Field(
        description="flash: FlashAttention-2-class fused kernel; te: Transformer Engine's "
        "DotProductAttention (cuDNN fused attention on sm90+, FlashAttention-2 below); unfused: s x s "
        "scores materialized (baddbmm, masked fill, softmax, dropout, bmm)"
    )
    kernels_per_layer: int = Field(
        ge=0, description="kernels one transformer layer launches per micro-batch, forward + backward"
    )
    launch_latency_us: float = Field(ge=0, description="host time per kernel launch (eager PyTorch)")
    tp_comm_overlap: bool = Field(description="TP collectives pipelined with the GEMMs (TE comm overlap)")
    pipeline_schedules: tuple[str, ...] = Field(
        ("1f1b",), description="pipeline schedules the stack runs (autopar.schedules)"
    )
    grad_reduce_fp32: bool = Field(
        description="16-bit training reduces its gradients in fp32 (4 bytes on the wire per "
        "gradient element; else the model's 16-bit dtype)"
    )
    param_gather_overlap: bool = Field(
        False,
        description="the ZeRO-1/2 parameter all-gather after the optimizer step overlaps the next "
        "step's forward (Megatron --overlap-param-gather); else it shares the backward's window",
    )
    fsdp_pp_defer: bool = Field(
        False,
        description="under pipeline parallelism, FSDP's gradient sync is off until the step's last "
        "backward: the unsharded gradients accumulate and are reduce-scattered once per step, not once "
        "per micro-batch",
    )
    zero3_fetch_gbps: float | None = Field(
        default=None,
        gt=0,
        description="software-bound rate of the stack's ZeRO-3 parameter gathers and gradient "
        "reductions, GB of parameter bytes per second per device, paid on top of the wire time "
        "(None: the collectives run at the links' rate)",
    )

    @property
    def flash_attention(self) -> bool:
        return self.attention != "unfused"


_ALLOCATOR = dict(fragmentation=0.10, framework_reserve_gib=2.0)
_EAGER_LAUNCH_US = 10.0  # host work per eager PyTorch op (module docstring)

MEGATRON = FrameworkProfile(
    name="megatron",
    weight_bytes=2.0,  # bf16 params (param buffer)
    weight_shard_stage=3,  # Megatron-FSDP optim_grads_params
    grad_bytes=4.0,  # fp32 main_grad buffer (accumulate_allreduce_grads_in_fp32 for bf16)
    grad_shard_stage=2,  # the distributed optimizer keeps the full buffer; Megatron-FSDP optim_grads shards it
    optimizer_bytes=12.0,  # fp32 master + Adam m + v, sharded by the distributed optimizer
    optimizer_shard_stage=1,
    reported_basis="allocated",  # megatron/training/utils.py report_memory: "max allocated" per rank
    attention="te",
    kernels_per_layer=36,
    launch_latency_us=_EAGER_LAUNCH_US,
    tp_comm_overlap=True,
    # Megatron-LM arguments.py: bf16 turns on accumulate_allreduce_grads_in_fp32 (DDP
    # grad_reduce_in_fp32): the fp32 main_grad buffer is what the reduce-scatter moves; fp16 keeps
    # the 16-bit buffer (the flag's default) and reduces in fp16.
    grad_reduce_fp32=True,
    # --overlap-param-gather: the distributed optimizer gathers each bucket's updated parameters in
    # the next forward's pre-hooks (Megatron-Core DistributedDataParallel); the NeMo / Megatron-Bridge
    # recipes and Megatron-LM's published scaling runs turn it on with --overlap-grad-reduce.
    param_gather_overlap=True,
    **_ALLOCATOR,
)
_FSDP = dict(
    weight_bytes=4.0,  # fp32 sharded parameter, stepped by the optimizer (no separate master)
    weight_shard_stage=2,  # FSDP shards parameters and gradients together
    grad_bytes=4.0,  # gradients on the fp32 sharded parameter
    grad_shard_stage=2,
    optimizer_bytes=8.0,  # Adam m + v in fp32
    optimizer_shard_stage=1,
    attention="flash",
    launch_latency_us=_EAGER_LAUNCH_US,
    tp_comm_overlap=False,
    **_ALLOCATOR,
)
# torchtitan/components/metrics.py logs memory/max_reserved(GiB).
# torchtitan's parallelism.pipeline_parallel_schedule takes torch.distributed.pipelining's schedules.
TORCHTITAN = FrameworkProfile(
    name="torchtitan",
    reported_basis="reserved",
    # torchtitan's FSDP2 MixedPrecisionPolicy: reduce_dtype = training.mixed_precision_reduce, "float32".
    grad_reduce_fp32=True,
    kernels_per_layer=99,
    pipeline_schedules=("1f1b", "zb", "zbv", "dualpipev"),
    # torch.distributed.pipelining's stage turns an FSDP module's gradient sync off for every backward
    # of the step but the last (PipelineStage backward: set_requires_gradient_sync(last_backward)), so
    # the reduce-scatter runs once per step; the gathers follow the reshard policy the export writes.
    fsdp_pp_defer=True,
    **_FSDP,
)
# llm-foundry's benchmark configs run Composer FSDP with mixed_precision PURE (param, reduce and
# buffer dtypes all bf16).
FSDP = FrameworkProfile(
    name="fsdp", reported_basis="allocated", kernels_per_layer=39, grad_reduce_fp32=False, **_FSDP
)  # Composer/accelerate memory monitors
# DeepSpeed 0.3.x (2021) ZeRO-3 fetch rate: 5.1 B fp16 parameters (10.2 GB) gathered in a forward of
# 480 ms against 60 ms of compute under ZeRO-2 on one 8x A100 NVLink node, i.e. 24 GB/s although
# NVLink moves ~230 GB/s per GPU; backward 900 ms (gathers + gradient reduce-scatter of the same
# bytes). Cause: every all_gather synchronized the device and copied the gathered partitions on
# the Python side (deepspeedai/DeepSpeed issue #1174 and PR #1188, June 2021, which later halved it).
_DEEPSPEED_ZERO3_FETCH_GBPS = 24.0
_DEEPSPEED = dict(
    weight_bytes=2.0,
    weight_shard_stage=3,
    grad_bytes=2.0,  # model dtype under ZeRO
    grad_shard_stage=2,
    optimizer_bytes=12.0,
    optimizer_shard_stage=1,
    reported_basis="allocated",  # see_memory_usage: "MA" (allocated) / "Max_MA"
    attention="unfused",
    kernels_per_layer=57,
    launch_latency_us=_EAGER_LAUNCH_US,
    tp_comm_overlap=False,
    grad_reduce_fp32=False,  # DeepSpeed communication_data_type defaults to the model's dtype
    zero3_fetch_gbps=_DEEPSPEED_ZERO3_FETCH_GBPS,
    **_ALLOCATOR,
)
DEEPSPEED = FrameworkProfile(name="deepspeed", **_DEEPSPEED)
MEGATRON_DEEPSPEED = FrameworkProfile(name="megatron-deepspeed", **_DEEPSPEED)

PROFILES: dict[str, FrameworkProfile] = {
    p.name: p for p in (MEGATRON, TORCHTITAN, FSDP, DEEPSPEED, MEGATRON_DEEPSPEED)
}

# Headroom kept free on every device when judging whether a layout fits (fraction of capacity).
# 5%: the allocated-memory model under-predicts the measured Megatron runs by up to 4.6% per model
# (DeepSeek-V2 proxy; 1.8% MAPE overall: docs/accuracy.md, "Measured"), the reserved (fragmentation) figure
# has no measurement to check it against, and the allocator's peak moves by a few percent between
# iterations (transient optimizer-step and NCCL buffers); planning at 100% of capacity leaves no
# margin for any of them.
DEFAULT_MEMORY_HEADROOM = 0.05


# The attention core a training job may name instead of its stack's default (Job.attention_kernel):
# "default" keeps the profile's; "flash" is a FlashAttention-2-class fused kernel; "unfused" the
# s x s score matrix (Megatron-LM before FlashAttention, 2019-2022: fused softmax over baddbmm/bmm;
# Megatron-LM ``--attention-backend unfused`` today).
AttentionChoice = Literal["default", "flash", "unfused"]
# The cores a job may name in place of its stack's (every AttentionChoice but "default").
ATTENTION_OVERRIDES = ("flash", "unfused")
ATTENTION_KERNEL_DESCRIPTION = (
    "the training stack's attention core: default (the stack's own: Transformer Engine's fused "
    "attention for megatron, FlashAttention for torchtitan and fsdp, the unfused core for deepspeed "
    "and megatron-deepspeed), flash (a FlashAttention-2-class kernel) or unfused (the s x s scores "
    "materialized, as Megatron-LM ran before FlashAttention; Megatron-LM --attention-backend unfused)"
)


# Whether a training job pipelines its TP collectives with the GEMMs (Job.tp_comm_overlap):
# "default" keeps the profile's (on for megatron: Transformer Engine userbuffers, which Megatron-LM
# runs with --tp-comm-overlap; off elsewhere); "off" all-reduces / gathers synchronously, as
# Megatron-Core does without the flag and as many Megatron-Bridge recipes run (their NVFP4 and
# several MoE recipes set CommOverlapConfig(tp_comm_overlap=False)); "on" only where autopar can
# export it (megatron's userbuffers: TP_OVERLAP_STACKS).
TPOverlapChoice = Literal["default", "on", "off"]
TP_OVERLAP_STACKS = ("megatron",)
TP_OVERLAP_DESCRIPTION = (
    "TP communication overlap: default (the stack's own: on for megatron, Transformer Engine "
    "userbuffers with --tp-comm-overlap; off for the others), on (megatron only) or off (TP "
    "collectives run synchronously between the GEMMs: Megatron without --tp-comm-overlap, as many "
    "Megatron-Bridge recipes run)"
)


def tp_overlap_override(name: str, choice: str) -> bool | None:
    """The TP overlap a job names (``Job.tp_comm_overlap``) where it differs from its stack's, else
    None: what the cost model replaces, the assumptions state and an export must write or refuse."""
    if choice == "default":
        return None
    on = choice == "on"
    return None if on == PROFILES[name].tp_comm_overlap else on


def framework_profile(name: str, attention: str = "default", tp_overlap: str = "default") -> FrameworkProfile:
    """The profile of a stack named by :data:`autopar.job.Framework`, with ``attention``
    (:data:`AttentionChoice`) in place of its own attention core unless "default", and ``tp_overlap``
    (:data:`TPOverlapChoice`) in place of its TP communication overlap unless "default"."""
    p = PROFILES[name]
    update: dict[str, object] = {}
    if attention_override(name, attention) is not None:
        update["attention"] = attention
    ov = tp_overlap_override(name, tp_overlap)
    if ov is not None:
        update["tp_comm_overlap"] = ov
    return p.model_copy(update=update) if update else p


def attention_override(name: str, attention: str) -> str | None:
    """The core a job names (``Job.attention_kernel``) where it is not the stack's own, else None:
    what the cost model replaces, the assumptions state and an export must name or refuse."""
    return None if attention in ("default", PROFILES[name].attention) else attention
