"""Serving model: memory, iteration latency, throughput and energy of inference layouts, vectorized.

One *instance* is one copy of the model on ``tp * pp`` devices (attention optionally data-parallel
inside the TP group for MoE models, experts split ``ep`` ways). Every function takes numpy columns
over candidate instances and concurrencies (:class:`ServingTable`), so one code path scores one
layout or a whole search space, exactly like the training engine.

The model, term by term (REFERENCE Part D; AIConfigurator, Vidur, DistServe, BLIS):

* **Memory** per device of the heaviest pipeline stage: weights (linear layers at the weight
  precision; embedding, LM head, norms and router in 16-bit, as ModelOpt/AWQ checkpoints keep them),
  activation workspace for ``max_num_tokens`` tokens plus the fp32 logits buffer of the decode batch,
  a runtime reserve and NCCL buffers per communicating group. What is left, times
  ``kv_cache_fraction`` (TRT-LLM's ``kv_cache_free_gpu_mem_fraction``), holds the KV cache; with a
  guaranteed-no-evict scheduler every admitted sequence reserves ``isl + osl`` tokens (in 64-token
  pages), which gives the maximum concurrency.
* **One iteration** (continuous batching; all ``pp`` micro-batches of the in-flight batch pass every
  stage once) of ``n_dec`` decoding sequences plus ``n_pre`` prefill tokens (chunked prefill):
  weight GEMMs on the shared shape-dependent roofline (:func:`autopar.latency.gemm_time`, the SAME
  fitted ``gemm_eff``/``gemm_half_dim`` as training; the token dimension is padded to the 64-row MMA
  tile, and below it a GEMM is bound by streaming its weights at the achieved HBM bandwidth),
  attention (prefill: the quadratic FLOPs at the fitted FlashAttention efficiency; decode: reading the
  KV cache at the achieved HBM bandwidth), memory-bound elementwise work, TP all-reduces and EP
  all-to-alls from :mod:`autopar.collectives` (small decode messages are latency-bound), PP
  send/recv, and a host/scheduler overhead per iteration.
* **Steady state** of an offline or closed-loop load with ``B`` sequences in flight: each iteration
  advances ``B`` decodes and admits ``B/osl`` new requests, i.e. ``B*isl/osl`` prefill tokens
  (bounded by the token budget). TPOT is the mean iteration time, output tokens/s = B/TPOT. TTFT is
  the iterations a prompt needs at the chunk size the budget leaves (plus an M/D/1 queueing wait
  under an open request rate).

Serving-specific coefficients (everything else is the training calibration of the device):
see :class:`ServingCoefficients`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from pydantic import ValidationError

from autopar import blocks, hybrid, moe, moe_kernels
from autopar import collectives as C
from autopar.coefficients import (
    DEFAULT_MEMORY_CONSTANTS,
    Calibration,
    coefficients_for,
    load_calibration,
    memory_constants,
)
from autopar.energy import NODE_OVERHEAD_LOAD, comm_energy_j, phase_power, stall_power
from autopar.errors import AutoparError
from autopar.hardware import attention_fraction
from autopar.job import KVPrecision, ServingWorkload, WeightPrecision
from autopar.latency import Coefficients, gemm_time
from autopar.memory import GIB
from autopar.serving.backends import expert_parallel_ok, wide_ep

__all__ = [
    "WeightPrecision",
    "KVPrecision",
    "WEIGHT_BYTES",
    "KV_BYTES",
    "ServingWorkload",
    "ServingCoefficients",
    "ServingTable",
    "ServingContext",
    "make_context",
    "instance_memory",
    "iteration",
    "steady_state",
    "kv_bytes_per_token_per_device",
    "trtllm_max_num_tokens",
]


# Bytes per stored weight of the linear layers. int4 is weight-only (W4A16, AWQ/GPTQ) with one fp16
# scale per group of 128 weights.
# Bytes per weight, scales included: fp8-block one fp32 scale per 128x128 block (DeepSeek-V3), int8
# weight-only one 16-bit scale per output channel (negligible), int4 one 16-bit scale per group of
# 128 (AWQ/GPTQ), NVFP4 one FP8 (E4M3) scale per 16 elements, MXFP4 one E8M0 byte per 32 (OCP MX).
WEIGHT_BYTES: dict[str, float] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp8-block": 1.0 + 4.0 / (128 * 128),
    "int8": 1.0,
    "int4": 0.5 + 2.0 / 128,
    "nvfp4": 0.5 + 1.0 / 16,
    "mxfp4": 0.5 + 1.0 / 32,
}
# The GEMMs each weight format runs where the device has the tensor-core rate (peak key, efficiency
# key); otherwise the weights are dequantized into 16-bit GEMMs (weight-only kernels: Marlin, AWQ).
# fp8-block runs at the FP8 peak with the measured block-scaled FP8 efficiency (mxfp8: DeepGEMM's
# 128-blockwise kernels in studies/gemm_rates.py); MXFP4 at the FP4 peak with NVFP4's measured
# efficiency (the closest block-scaled FP4 measured). int8 and int4 are weight-only (W8A16, W4A16).
GEMM_FORMATS: dict[str, tuple[str, str]] = {
    "fp8": ("fp8", "fp8"),
    "fp8-block": ("fp8", "mxfp8"),
    "nvfp4": ("fp4", "nvfp4"),
    "mxfp4": ("fp4", "nvfp4"),
}
KV_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0}
ACT_BYTES = 2.0  # activations between kernels are 16-bit
LOGIT_BYTES = 4.0  # TRT-LLM/vLLM keep the decode logits in fp32
MMA_TILE_ROWS = 64.0  # Hopper wgmma M tile: fewer tokens still pay for 64 rows of compute
KV_PAGE_TOKENS = 64  # paged KV-cache block (TRT-LLM tokens_per_block, vLLM block_size 16..64)
ALIGN_TOKENS = 64.0

# Energy: the one power model of autopar.energy (phase_power: idle..TDP from the iteration's math and
# memory utilization).
# Power cap: dynamic power ~ f * V^2 with V ~ f in the DVFS range, so a cap that forces the dynamic
# power from D to D' runs the SM clock (hence the peak FLOP/s) at (D'/D)^(1/3); HBM bandwidth is on
# its own clock and unaffected. Caps below this fraction of TDP are outside the DVFS range: refused.
POWER_CAP_MIN_FRACTION = 0.3


# ============================================================================================ workload
def make_workload(**kw: Any) -> ServingWorkload:
    """Build a :class:`ServingWorkload`, turning validation errors into one-line AutoparErrors."""
    try:
        return ServingWorkload(**kw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        got = (
            f" (got {err['input']!r})"
            if loc and "input" in err and not isinstance(err["input"], dict)
            else ""
        )
        raise AutoparError(
            f"invalid serving workload: {loc + ': ' if loc else ''}{msg}{got}", "see `autopar serve --help`"
        ) from None


# ======================================================================================= coefficients
@dataclass(frozen=True)
class ServingCoefficients:
    """The serving-specific coefficients; every other number is the device's training calibration.

    * ``host_step_s``: host/scheduler time per scheduled micro-batch iteration that the GPU waits
      for (batch assembly, CUDA-graph launch, the executor's bookkeeping); BLIS's per-step term.
    * ``host_per_seq_s``: host/runtime time per sequence per iteration (sampling, stop checks,
      detokenization and KV-block bookkeeping of each in-flight request); it is what makes very large
      decode batches stop scaling.
    * ``collective_sync_s``: fixed cost of each TP all-reduce / EP all-to-all call of a serving
      iteration on top of the alpha-beta cost of :mod:`autopar.collectives` (kernel launch, the
      cross-GPU barrier, and NCCL's low-bandwidth LL protocols at the 0.1-30 MB messages of decode:
      measured 8-GPU busbw is 11.7 GB/s at 256 KiB and 107 GB/s at 4 MiB [S17]).

    Not fitted: the runtime reserve (CUDA context, cuBLAS/NCCL workspaces, decoder and sampling
    buffers) is the training model's framework reserve (2 GiB, ``framework_reserve_gib`` of the
    calibration) plus its NCCL buffers (0.4 GB) per communicating group; AIConfigurator reserves
    3.5 GB in all.

    Fitted once (``studies/published_serving.py --fit``: soft-L1 least squares on log throughput)
    to the 43 TensorRT-LLM 0.17 offline rows of ``published_runs_dev.csv`` (H100, FP8, Llama 3.1
    8B/70B, TP1-8) on top of the shipped training calibration: host_per_seq 5.33 us,
    collective_sync 53.3 us, host_step 0 (the fit drives it to zero: TRT-LLM's C++ executor hides
    its per-step work behind CUDA graphs; it stays a knob for runtimes with a Python scheduler).
    A calibration file may override them in its ``global`` section (``serving_host_step_us``,
    ``serving_host_per_seq_us``, ``serving_collective_sync_us``, ``serving_runtime_reserve_gb``,
    ``serving_prefill_attention_eff``).

    * ``prefill_attention_eff``: share of the 16-bit peak a prompt's attention runs at, at long
      sequences (the GEMM half-dimension law shortens it for short ones). None: the device's measured
      forward FMHA curve per head dimension and prompt length (``efficiency.attention_fwd``,
      TensorRT-LLM's context kernel: studies/attention_rates.py) where the profile has one, else the
      published figure of the device's die (:data:`PREFILL_ATTENTION_EFF`), else the training-fitted
      attention efficiency (a training stack's forward and backward, which forward-only kernels beat).

    * ``layer_latency_s``: pipeline latency each layer adds to a micro-batch's pass (0 on GPUs, whose
      per-kernel costs are in the terms above). A device profile's ``serving`` section (SRAM,
      wafer-scale and dataflow machines' own stacks) replaces the host, collective and layer terms
      (:func:`make_context`).
    """

    host_step_s: float = 0.0
    host_per_seq_s: float = 5.33e-6
    collective_sync_s: float = 53.3e-6
    layer_latency_s: float = 0.0
    tile_rows: float = MMA_TILE_ROWS
    prefill_attention_eff: float | None = None
    runtime_reserve_bytes: float = DEFAULT_MEMORY_CONSTANTS["framework_reserve_bytes"]
    comm_buffer_bytes: float = DEFAULT_MEMORY_CONSTANTS["comm_buffer_bytes"]

    @classmethod
    def from_calibration(cls, cal: Calibration | None) -> ServingCoefficients:
        """The defaults, the calibration's memory constants (framework reserve, NCCL buffers, as
        training uses them) and any ``serving_*`` overrides in its ``global`` section."""
        mc = memory_constants(cal) if cal is not None else DEFAULT_MEMORY_CONSTANTS
        base = cls(
            runtime_reserve_bytes=mc["framework_reserve_bytes"],
            comm_buffer_bytes=mc["comm_buffer_bytes"],
        )
        g = dict(cal.global_) if cal is not None else {}
        return cls(
            comm_buffer_bytes=base.comm_buffer_bytes,
            host_step_s=float(g.get("serving_host_step_us", base.host_step_s * 1e6)) * 1e-6,
            host_per_seq_s=float(g.get("serving_host_per_seq_us", base.host_per_seq_s * 1e6)) * 1e-6,
            collective_sync_s=float(g.get("serving_collective_sync_us", base.collective_sync_s * 1e6)) * 1e-6,
            runtime_reserve_bytes=float(g.get("serving_runtime_reserve_gb", base.runtime_reserve_bytes / 1e9))
            * 1e9,
            prefill_attention_eff=(
                float(g["serving_prefill_attention_eff"]) if "serving_prefill_attention_eff" in g else None
            ),
        )


# Prefill (context) attention runs a FlashAttention-class forward kernel (TensorRT-LLM's context FMHA,
# FlashAttention-2/3 or FlashInfer in vLLM/SGLang). Its published peak utilization per compute die
# (calibration transfer.dies) is the efficiency at long sequences; dies without a published figure
# keep the training-fitted attention efficiency (see ServingCoefficients.prefill_attention_eff).
PREFILL_ATTENTION_EFF: dict[str, tuple[float, str]] = {
    "gh100": (
        0.75,
        "FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608): FP16 forward up to 740 TFLOP/s, "
        "75% of the H100's peak",
    ),
    "ga100": (
        0.73,
        "FlashAttention-2 (Dao 2023, arXiv:2307.08691): forward 50-73% of the A100's peak, the top "
        "figure at long sequences",
    ),
}


def prefill_attention_source(device_id: str, cal: Calibration | None) -> tuple[float | None, str]:
    """The published prefill attention efficiency of a device's die and its source, or None (a
    device whose profile has a measured forward curve, ``efficiency.attention_fwd``, uses that)."""
    die = (cal.transfer.dies if cal is not None else {}).get(device_id)
    if die in PREFILL_ATTENTION_EFF:
        return PREFILL_ATTENTION_EFF[die]
    return (
        None,
        "no published forward-attention figure for this die: the training-fitted attention efficiency",
    )


# ============================================================================================ context
@dataclass(frozen=True)
class ServingContext:
    """Everything but the candidate columns: model, device, workload and coefficients."""

    model: Any
    device: Any
    workload: ServingWorkload
    co: Coefficients
    links: C.Links
    sc: ServingCoefficients
    devices_per_node: int
    compute_precision: str
    extra: dict[str, Any] = field(default_factory=dict)
    backend: Any = None  # autopar.serving.backends.BackendProfile (None: trtllm's, as make_context loads it)

    @property
    def weight_bytes(self) -> float:
        return WEIGHT_BYTES[self.workload.weight_precision]

    @property
    def kv_bytes(self) -> float:
        return KV_BYTES[self.workload.kv_dtype]

    @property
    def max_batch(self) -> int:
        """Sequences per instance the runtime admits (the workload's, else the backend's default:
        make_context resolves it)."""
        mb = self.workload.max_batch
        if mb is None:
            raise AutoparError("serving context without a resolved max_batch (build it with make_context)")
        return int(mb)


def make_context(
    model,
    device,
    workload: ServingWorkload,
    *,
    devices_per_node: int,
    calibration: Calibration | None = None,
    serving_coefficients: ServingCoefficients | None = None,
) -> ServingContext:
    from autopar.serving.backends import check_device, load_backend

    cal = calibration or load_calibration()
    backend = load_backend(workload.backend, workload.backend_version)
    check_device(backend, device)
    workload = resolve_workload(workload, backend, device)
    co, link_coeffs = coefficients_for(device, cal)
    links = C.Links.from_cluster(device, devices_per_node, link_coeffs)
    # fp8 weights run fp8 GEMMs where the device has an fp8 tensor-core rate; otherwise (and for
    # weight-only int4) the weights are dequantized into 16-bit GEMMs (Marlin/AWQ kernels).
    wp = workload.weight_precision
    fmt = GEMM_FORMATS.get(wp)
    prec = wp if fmt is not None and fmt[0] in device.peak_tflops else "bf16"
    sc = serving_coefficients or ServingCoefficients.from_calibration(cal)
    if sc.prefill_attention_eff is None and (
        not device.efficiency.attention_fwd or backend.attention.prefill == "published"
    ):
        # the die's published FlashAttention figure: where the device has no measured forward curve,
        # or where the stack runs FlashAttention rather than TensorRT-LLM's measured context kernel
        sc = replace(sc, prefill_attention_eff=prefill_attention_source(device.id, cal)[0])
    if device.runtime_reserve_gb is not None:  # a device-level reserve (0: statically compiled SRAM)
        sc = replace(sc, runtime_reserve_bytes=device.runtime_reserve_gb * 1e9, comm_buffer_bytes=0.0)
    if device.serving is not None:  # the vendor's own stack, not the GPU-fitted serving coefficients
        st = device.serving
        sc = replace(
            sc,
            host_step_s=st.host_step_us * 1e-6,
            host_per_seq_s=st.host_per_seq_us * 1e-6,
            collective_sync_s=st.collective_sync_us * 1e-6,
            layer_latency_s=st.layer_latency_us * 1e-6,
            tile_rows=st.gemm_tile_rows,
        )
    return ServingContext(model, device, workload, co, links, sc, devices_per_node, prec, backend=backend)


def resolve_workload(workload: ServingWorkload, backend: Any, device: Any) -> ServingWorkload:
    """The workload with the runtime limits left at None filled from the backend's defaults for this
    device (SGLang's KV fraction depends on the candidate's TP: it stays None, per candidate later)."""
    from autopar.serving import backends as B

    fill: dict[str, Any] = {}
    if workload.max_batch is None:
        fill["max_batch"] = B.max_batch(backend, device)
    if workload.max_num_tokens is None:
        fill["max_num_tokens"] = B.max_num_tokens(backend, device, workload.offline)
    if workload.chunked_prefill is None:
        fill["chunked_prefill"] = backend.scheduler.chunked_prefill.value
    if workload.kv_cache_fraction is None and backend.kv_cache.fraction.rule is None:
        fill["kv_cache_fraction"] = float(backend.kv_cache.fraction.tiers[0].value)
    return workload.model_copy(update=fill) if fill else workload


# ============================================================================================== table
SERVING_COLUMNS = ("tp", "pp", "ep", "adp", "conc", "cap_w")


class ServingTable:
    """Candidate serving instances as numpy columns.

    ``tp``: devices per pipeline stage (TP group); ``pp``: pipeline stages; ``ep``: expert-parallel
    size inside the TP group (experts split ep ways, each expert tp/ep ways); ``adp``: attention
    data-parallel size inside the TP group (attention TP = tp/adp; MoE only); ``conc``: sequences in
    flight per instance (0: as many as memory and ``max_batch`` allow); ``cap_w``: device power cap
    in W (0: none).
    """

    __slots__ = ("cols",)

    def __init__(self, cols: dict[str, Any]) -> None:
        n = max(len(np.atleast_1d(cols.get(k, 0))) for k in SERVING_COLUMNS)
        defaults = {"tp": 1, "pp": 1, "ep": 1, "adp": 1, "conc": 0, "cap_w": 0}
        self.cols = {
            k: np.broadcast_to(
                np.atleast_1d(np.asarray(cols.get(k, defaults[k]), dtype=np.float64)), (n,)
            ).copy()
            for k in SERVING_COLUMNS
        }

    def __len__(self) -> int:
        return len(self.cols["tp"])

    def __getitem__(self, k: str) -> np.ndarray:
        return self.cols[k]

    def take(self, idx) -> ServingTable:
        return ServingTable({k: v[idx] for k, v in self.cols.items()})

    def with_columns(self, **kw: Any) -> ServingTable:
        cols = dict(self.cols)
        cols.update(kw)
        return ServingTable(cols)

    @property
    def devices(self) -> np.ndarray:
        return self.cols["tp"] * self.cols["pp"]


# ================================================================================= legality and memory
def legal(ctx: ServingContext, tab: ServingTable) -> dict[str, np.ndarray]:
    """Boolean masks of violated rules (True = violated), keyed by reason code."""
    m = ctx.model
    tp, pp, ep, adp = (tab[k].astype(np.int64) for k in ("tp", "pp", "ep", "adp"))
    ta = np.maximum(tp // np.maximum(adp, 1), 1)
    kv_bad = np.zeros(len(tab), dtype=bool)
    for _, v in m.attn_views():  # every layer's shape (sliding layers may have KV heads of their own)
        g = v.heads if m.is_mla else v.kv_heads
        kv_bad = kv_bad | ((g % ta != 0) & (ta % g != 0))
    out = {
        "tp_heads": (m.tp_head_units[0] % ta != 0) | (tp % adp != 0),
        # KV heads are split when ta divides them and replicated when they divide ta (TRT-LLM, vLLM).
        "tp_kv_heads": kv_bad,
        "pp_layers": pp > m.layers,
        "ep_experts": ((ep > 1) & (not m.is_moe))
        | (tp % ep != 0)
        | ((m.num_experts % ep != 0) if m.is_moe else np.zeros(len(tab), dtype=bool)),
        "attention_dp_dense": (adp > 1) & (not m.is_moe),
    }
    if ctx.backend is not None:
        out["backend_ep"] = ~expert_parallel_ok(ctx.backend, ep, tp)
    # DeepEP's dispatch spans the instance: SGLang sets ep_size = tp_size with --moe-a2a-backend
    # deepep, vLLM's all2all backends run between all data-parallel ranks
    out["ep_dispatch_width"] = (
        wide_ep(ep, adp) & (ep != tp)
        if ctx.workload.ep_dispatch == "deepep"
        else np.zeros(len(tab), dtype=bool)
    )
    return out


def kv_bytes_per_token_per_device(ctx: ServingContext, tab: ServingTable) -> np.ndarray:
    """KV-cache bytes one cached token costs on one device of the instance (all its layers).

    GQA/MHA: the device holds ceil(kv_heads / attention-TP) heads (replicated when TP exceeds the
    KV heads); MLA: the compressed latent plus rope key, replicated on every attention-TP rank
    (DeepSeek-V2 Sec. 2.1.3); pipeline stages split the layers.
    """
    m = ctx.model
    ta = tab["tp"] / tab["adp"]
    if m.is_mla:
        share = np.ones_like(ta)
    else:
        share = np.ceil(m.kv_heads / ta) / m.kv_heads
    layers_dev = np.ceil(m.layers / tab["pp"]) / m.layers
    if m.per_layer_attention:  # each attention shape with its own KV heads
        return sum(n * _kv_layer_token_bytes(ctx, v, ta) for n, v in m.attn_views()) * layers_dev
    return m.kv_cache_bytes_per_token(ctx.kv_bytes) * share * layers_dev


def _kv_layer_token_bytes(ctx: ServingContext, v, ta) -> np.ndarray:
    """KV-cache bytes one cached token costs one attention layer of shape ``v`` (an attention view of
    :meth:`ModelSpec.attn_views`) on one device: its ceil(kv_heads / attention-TP) heads."""
    return v.kv_cache_elems_per_token_per_layer * ctx.kv_bytes * np.ceil(v.kv_heads / ta) / v.kv_heads


def _kv_seq_bytes_per_device(ctx: ServingContext, tab: ServingTable, seq_len: float) -> np.ndarray:
    """Bytes one sequence of ``seq_len`` tokens reserves on one device (pages; sliding-window cap).

    Linear-attention and Mamba layers hold a fixed-size recurrent state per sequence instead of a KV
    cache (:func:`recurrent_state_bytes_per_device`).
    """
    m = ctx.model
    page = ctx.backend.kv_cache.block_tokens if ctx.backend is not None else KV_PAGE_TOKENS
    paged = math.ceil(seq_len / page) * page
    per_full_token = kv_bytes_per_token_per_device(ctx, tab)
    full = m.attn_layers - m.sliding_window_layers
    sw = m.sliding_window_layers
    # Sliding-window layers keep at most window (+1 page) tokens.
    sw_tokens = min(paged, (math.ceil(m.sliding_window / page) + 1) * page) if sw else 0
    if m.per_layer_attention:  # each shape's layers: full ones the whole sequence, sliding the window
        ta = tab["tp"] / tab["adp"]
        layers_dev = np.ceil(m.layers / tab["pp"]) / m.layers
        kv = 0.0 * ta
        for n, v in m.attn_views():
            sw_n = min(n, v.sliding_window_layers)
            kv = kv + _kv_layer_token_bytes(ctx, v, ta) * ((n - sw_n) * paged + sw_n * sw_tokens) * layers_dev
        return kv + recurrent_state_bytes_per_device(ctx, tab)
    kv = per_full_token * (full * paged + sw * sw_tokens) / max(m.attn_layers, 1)
    return kv + recurrent_state_bytes_per_device(ctx, tab)


def recurrent_state_bytes_per_device(ctx: ServingContext, tab: ServingTable) -> np.ndarray:
    """Recurrent state of one sequence on one device: the Mamba / Gated DeltaNet layers' conv and SSM
    (delta-rule) states (:meth:`ModelSpec.recurrent_state_bytes`), 16-bit (vLLM's mamba cache dtype
    "auto" is the model dtype; the KV-cache dtype does not apply), split over the attention-TP ranks
    by heads, pipeline stages splitting the layers."""
    m = ctx.model
    ta = tab["tp"] / tab["adp"]
    layers_dev = np.ceil(m.layers / tab["pp"]) / m.layers
    return m.recurrent_state_bytes(ACT_BYTES) / ta * layers_dev


def trtllm_max_num_tokens(batch: np.ndarray, isl: int, osl: int) -> np.ndarray:
    """trtllm-bench's token budget: B*(1+isl/osl) capped at 32768, at least 2048, rounded up.

    TensorRT-LLM ``tensorrt_llm/bench/build/tuning.py`` ``finetune_setting`` (0.17 era).
    """
    raw = np.minimum(np.asarray(batch, dtype=np.float64) * (1.0 + isl / osl), 32768.0)
    step = np.where(raw < 4096, 256.0, np.where(raw < 8192, 512.0, 1024.0))
    return np.maximum(2048.0, step * np.ceil(raw / step))


def weights_per_device(ctx: ServingContext, tab: ServingTable) -> np.ndarray:
    """Weight bytes on one device of the heaviest pipeline stage."""
    m = ctx.model
    wb = ctx.weight_bytes
    tp, pp, adp = tab["tp"], tab["pp"], tab["adp"]
    ta = tp / adp
    g = m.kv_heads
    if m.is_mla:
        attn = m.attn_matmul_params_per_layer / ta
    else:
        kvproj = 2 * m.hidden * g * m.head_dim
        attn = (m.attn_matmul_params_per_layer - kvproj) / ta + kvproj * np.ceil(g / ta) / g
    attn_16 = m.attn_params_per_layer - m.attn_matmul_params_per_layer + m.norm_params_per_layer
    if m.per_layer_attention:  # the mean attention layer over the model's shapes
        attn, attn_16 = 0.0 * ta, float(m.norm_params_per_layer)
        for w_v, v in blocks.attention.shares(m):
            g = v.kv_heads
            kvproj = m.hidden * g * (v.head_dim + (0 if v.full_k_eq_v else v.v_dim))
            attn = attn + w_v * (
                (v.attn_matmul_params_per_layer - kvproj) / ta + kvproj * np.ceil(g / ta) / g
            )
            attn_16 += w_v * (v.attn_params_per_layer - v.attn_matmul_params_per_layer)
    dense_layer = wb * (attn + m.dense_mlp_params / ta) + 2.0 * attn_16
    if m.is_moe:
        moe_layer = wb * (attn + m.shared_expert_params / ta + m.num_experts * m.expert_params / tp) + 2.0 * (
            attn_16 + m.router_params
        )
        moe_layer = moe_layer + wb * m.latent_proj_params  # a latent MoE's projections, replicated
    else:
        moe_layer = 0.0
    lps = np.ceil(m.layers / pp)
    avg_layer = (m.dense_layers * dense_layer + m.moe_layers * moe_layer) / m.layers
    if m.is_hybrid:
        # Per block of the mix: attention on its share of the blocks, the recurrent mixers' GEMM
        # weights at the weight precision (their conv, gates and norms 16-bit), norms per block,
        # and the FFN parts without the attention the formulas above put in every layer.
        mx = hybrid.mix(m)
        mix_all = mx.linear * m.linear_attn_params_per_layer + mx.mamba * m.mamba_params_per_layer
        mix_gemm = sum(w * N * K for w, N, K in hybrid.mixer_gemm_shapes(m, 1.0))
        blk = (
            mx.attn * (wb * attn + 2.0 * (attn_16 - m.norm_params_per_layer))
            + wb * mix_gemm / ta
            + 2.0 * (mix_all - mix_gemm) / ta
            + 2.0 * m.norm_params_per_layer
        )
        ffn_attn = wb * attn + 2.0 * attn_16
        avg_layer = (
            blk
            + (m.dense_layers * (dense_layer - ffn_attn) + m.moe_layers * (moe_layer - ffn_attn)) / m.layers
        )
    # Embedding on the first stage, head + final norm on the last; both 16-bit, vocab-parallel.
    embed = 2.0 * m.embedding_params / tp
    head = 2.0 * (m.head_params / tp + m.final_norm_params)
    ends = np.where(pp > 1, np.maximum(embed, head), embed + head)
    return lps * avg_layer + ends


def instance_memory(
    ctx: ServingContext,
    tab: ServingTable,
    *,
    seq_len: float | None = None,
    batch_cap: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per-device memory (bytes) and the maximum concurrency per instance.

    ``seq_len`` defaults to isl + osl (guaranteed-no-evict reservation). ``batch_cap`` bounds the
    decode batch the logits buffer is sized for (default: the workload's ``max_batch``).
    """
    m, w = ctx.model, ctx.workload
    seq = float(seq_len if seq_len is not None else w.isl + w.osl)
    tp, pp, adp = tab["tp"], tab["pp"], tab["adp"]
    ta = tp / adp
    cap = np.full(len(tab), ctx.device.memory_bytes)
    weights = weights_per_device(ctx, tab)
    bcap = np.minimum(batch_cap if batch_cap is not None else float(ctx.max_batch), float(ctx.max_batch))
    budget = (
        np.full(len(tab), float(w.max_num_tokens))
        if w.max_num_tokens
        else trtllm_max_num_tokens(bcap, w.isl, w.osl)
    )
    # Activation workspace of one iteration of `budget` tokens on the widest layer (QKV + gated MLP
    # intermediate + residual stream), per attention-DP rank, plus the fp32 decode logits.
    F = max(m.ffn_hidden, m.moe_ffn_hidden * max(m.moe_topk, 1), m.shared_expert_ffn)
    qkv = (
        (m.heads * m.qk_head_dim + 2 * m.kv_heads * m.head_dim)
        if not m.is_mla
        else (m.heads * (m.qk_head_dim + m.v_dim) + m.kv_lora_rank)
    )
    if m.per_layer_attention:  # the widest attention shape
        qkv = max(v.heads * v.qk_head_dim + v.kv_heads * (v.head_dim + v.v_dim) for _, v in m.attn_views())
    if m.is_hybrid:  # the widest mixer input projection (Mamba in_proj, Gated DeltaNet in_proj_qkvz)
        qkv = max([qkv] + [N for _, N, K in hybrid.mixer_gemm_shapes(m, 1.0) if K == m.hidden])
    per_tok = ACT_BYTES * (4.0 * m.hidden + qkv / ta + 3.0 * F / ta)
    workspace = budget / adp * per_tok + bcap / adp * m.vocab / tp * LOGIT_BYTES
    groups = (tp > 1).astype(float) + (pp > 1).astype(float) + ((adp > 1) & (tp > 1)).astype(float)
    reserve = ctx.sc.runtime_reserve_bytes + groups * ctx.sc.comm_buffer_bytes
    free = cap - weights - workspace - reserve
    kv_avail = kv_memory(ctx, tab, free=free, weights=weights, budget=budget)
    kv_seq = _kv_seq_bytes_per_device(ctx, tab, seq)
    max_conc = np.floor(kv_avail / kv_seq) * adp  # each attention-DP rank caches its own requests
    return {
        "capacity": cap,
        "weights": weights,
        "workspace": workspace,
        "reserve": reserve,
        "kv_available": kv_avail,
        "kv_per_seq": kv_seq,
        "max_conc": max_conc,
        "weights_fit": weights + reserve + workspace <= cap,
        "budget": budget,
    }


def kv_memory(ctx: ServingContext, tab: ServingTable, *, free, weights, budget) -> np.ndarray:
    """Bytes per device the backend gives the KV cache, by its own accounting of ``kv_cache_fraction``:
    TRT-LLM a share of the memory left free after weights, workspace and reserve; vLLM
    (gpu_memory_utilization) a share of the TOTAL memory, less all of those; SGLang
    (mem_fraction_static) a share of the TOTAL holding the weights and the KV pool, never more than
    is free."""
    from autopar.serving.backends import kv_fraction

    w, b = ctx.workload, ctx.backend
    rule = b.kv_cache.memory_rule if b is not None else "free"
    if w.kv_cache_fraction is not None:
        f = np.full(len(tab), float(w.kv_cache_fraction))
    else:
        f = kv_fraction(b, ctx.device, tab["tp"], tab["pp"], np.broadcast_to(budget, (len(tab),)))
    free = np.maximum(free, 0.0)
    if rule == "free":
        return free * f
    cap = ctx.device.memory_bytes
    if rule == "total":
        return np.maximum(free - (1.0 - f) * cap, 0.0)
    return np.clip(f * cap - weights, 0.0, free)  # static: weights + KV pool


# ========================================================================================= iteration
@dataclass
class _Acc:
    time: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    busy_compute: np.ndarray  # time the math units would need at their achievable rate
    busy_memory: np.ndarray  # time HBM would need at its achieved bandwidth


def _gemm(
    co_inf: Coefficients,
    co: Coefficients,
    peak: np.ndarray,
    eff: float,
    M,
    N,
    K,
    wbytes: float,
    weight_frac=1.0,
    count=1.0,
    tile_rows: float = MMA_TILE_ROWS,
) -> tuple[np.ndarray, ...]:
    """(time, flops, HBM bytes, compute time, traffic time) of ``count`` GEMMs (M tokens x K) @ (K x N weights).

    Compute: the shared shape-dependent roofline in N and K (``gemm_time`` with the token dim taken
    large, i.e. per-row time), paid for ``max(M, tile_rows)`` rows (64: a GPU's MMA tile). Traffic: the weights (``weight_frac``
    of them are read, e.g. the activated experts) plus 16-bit activations in and out.
    """
    M = np.asarray(M, dtype=np.float64)
    ref = 1.0e9
    per_row = gemm_time(co_inf, peak, np.asarray(eff, dtype=np.float64), ref, N, K) / ref
    rows = np.where(M > 0, np.maximum(M, tile_rows), 0.0)
    compute = count * per_row * rows
    traffic_b = count * (
        np.asarray(N, dtype=np.float64) * K * wbytes * weight_frac * (M > 0)
        + ACT_BYTES * M * (np.asarray(K, dtype=np.float64) + N)
    )
    traffic = traffic_b / co.hbm_bw
    # Power follows the useful work: padded MMA rows of a skinny GEMM run while HBM is the bottleneck.
    useful = count * per_row * M
    return np.maximum(compute, traffic), count * 2.0 * M * N * K, traffic_b, useful, traffic


@dataclass
class _Iter:
    """What the parts of one iteration share: the instance's degrees, tokens per rank, the stage's
    layers and the GEMM rates (one array per candidate instance)."""

    ctx: ServingContext
    n: int
    tp: np.ndarray
    pp: np.ndarray
    ep: np.ndarray
    adp: np.ndarray
    ta: np.ndarray  # attention TP = tp / adp
    tok_mb: np.ndarray  # tokens of one micro-batch (whole instance)
    M: np.ndarray  # tokens per attention-DP rank
    dec_a: np.ndarray  # decoding sequences per attention rank
    pre_a: np.ndarray  # prefill tokens per attention rank
    lps: np.ndarray  # blocks per stage
    n_dense: np.ndarray
    n_moe: np.ndarray
    layers: np.ndarray  # layers with an MLP (every block of a hybrid model)
    attn_l: np.ndarray  # attention layers of the stage
    mx: Any  # a hybrid model's mix (autopar.hybrid.Mix), or None
    peak: np.ndarray
    eff: float
    peak16: np.ndarray
    eff16: float
    acc: _Acc
    co_inf: Coefficients  # the coefficients with HBM taken infinite (a GEMM's compute side)
    dec_tokens: float = 1.0  # tokens each decoding sequence runs per step (1 + speculative drafts)

    def gemm(self, Mx, N, K, wbytes=None, p=None, e=None, **kw) -> tuple[np.ndarray, ...]:
        c = self.ctx
        return _gemm(
            self.co_inf,
            c.co,
            self.peak if p is None else p,
            self.eff if e is None else e,
            Mx,
            N,
            K,
            c.weight_bytes if wbytes is None else wbytes,
            tile_rows=c.sc.tile_rows,
            **kw,
        )

    def add(self, res, weight=1.0) -> None:
        t, f, b, tc, tm = res
        acc = self.acc
        acc.time += weight * t
        acc.flops += weight * f
        acc.bytes += weight * b
        acc.busy_compute += weight * tc
        acc.busy_memory += weight * tm

    def add_sum(self, parts, weight=1.0) -> None:
        self.add(tuple(sum(p[i] for p in parts) for i in range(5)), weight)


def _iter_mixers(it: _Iter) -> None:
    """Attention (or MLA) projections on every attention layer; a hybrid model's recurrent mixers:
    projection GEMMs of every token, the prefill tokens' chunked scan as in training's forward
    (GEMM-class chunk-local matmuls, fp32 state passing), decoding tokens reading and rewriting their
    sequence's state (the recurrent form), memory-bound."""
    m, co, ta, M = it.ctx.model, it.ctx.co, it.ta, it.M
    h, a = float(m.hidden), float(m.heads)
    if m.is_mla:
        up, down = blocks.mla.gemm_shapes(m, ta)
        attn_parts = [it.gemm(M, N, K) for N, K in up + down]
    elif m.per_layer_attention:  # each shape's projections on its share of the attention layers
        attn_parts = []
        for w_v, v in blocks.attention.shares(m):
            kvh = np.ceil(v.kv_heads / ta)
            qkv_n = v.heads / ta * v.head_dim + kvh * (v.head_dim + (0 if v.full_k_eq_v else v.v_dim))
            qkv_n = qkv_n + (v.heads / ta if v.attn_head_gate else 0.0)
            for part in (it.gemm(M, qkv_n, h), it.gemm(M, h, v.heads * v.v_dim / ta)):
                attn_parts.append(tuple(w_v * x for x in part))
    else:
        d = m.head_dim
        kvh = np.ceil(m.kv_heads / ta)  # KV heads replicate when tp exceeds them
        attn_parts = [it.gemm(M, (a / ta + 2.0 * kvh) * d, h), it.gemm(M, h, a * d / ta)]
    it.add_sum(attn_parts, it.attn_l)
    if it.mx is None:
        return
    it.add_sum(
        [tuple(w * x for x in it.gemm(M, N, K)) for w, N, K in hybrid.mixer_gemm_shapes(m, ta) if w], it.lps
    )

    def gt16(Mx, N, K):
        return gemm_time(co, it.peak16, np.asarray(it.eff16, dtype=np.float64), Mx, N, K)

    scan_t = hybrid.scan_time(m, gt16, it.pre_a, ta)
    scan_fl = hybrid.scan_flops_per_token(m, ta) * it.pre_a
    pass_b = it.pre_a * hybrid.state_pass_bytes(m, ta)
    st_fl, st_el = hybrid.decode_state_step(m, ta)
    dec_fl = it.dec_a * st_fl
    dec_b = it.dec_a * st_el * ACT_BYTES
    dec_tc_r, dec_tm_r = dec_fl / (it.peak16 * it.eff16), dec_b / co.hbm_bw
    rec_t = scan_t + pass_b / co.hbm_bw + np.maximum(dec_tc_r, dec_tm_r)
    it.add(
        (rec_t, scan_fl + dec_fl, pass_b + dec_b, scan_t + dec_tc_r, (pass_b + dec_b) / co.hbm_bw),
        it.lps,
    )


def _iter_attention_core(
    it: _Iter, tab: ServingTable, dec_ctx, pre_ctx, pre_len
) -> tuple[np.ndarray, np.ndarray]:
    """The attention cores of the stage: decode reads each sequence's KV cache (absorbed MLA: scores
    and values over the latent per head), prefill runs FlashAttention over its prompt. Returns the
    stage's (decode, prefill) attention seconds."""
    m, co = it.ctx.model, it.ctx.co
    if m.per_layer_attention:
        return _iter_attention_core_per_shape(it, tab, dec_ctx, pre_ctx, pre_len)
    a = float(m.heads)
    full_l = m.attn_layers - m.sliding_window_layers
    sw_l = m.sliding_window_layers
    win = float(m.sliding_window or 0)

    def mean_ctx(c):
        return (full_l * c + sw_l * np.minimum(c, win if win else c)) / max(m.attn_layers, 1)

    # KV bytes per cached token of one attention layer on a device
    kv_tok_dev = kv_bytes_per_token_per_device(it.ctx, tab) / np.maximum(it.attn_l, 1e-30)
    dec_c = mean_ctx(dec_ctx)
    dec_bytes = it.dec_a * dec_c * kv_tok_dev
    if m.is_mla:  # absorbed MLA decode: scores and values over the 576/512-wide latent per head
        dec_dims = (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
    else:
        dec_dims = m.qk_head_dim + m.v_dim
    dec_flops = 2.0 * it.dec_a * it.dec_tokens * dec_c * (a / it.ta) * dec_dims
    dec_tc, dec_tm = dec_flops / (it.peak16 * co.forward_attention_eff), dec_bytes / co.hbm_bw
    dec_t = np.maximum(dec_tc, dec_tm)
    pre_flops = 2.0 * it.pre_a * mean_ctx(pre_ctx) * (a / it.ta) * (m.qk_head_dim + m.v_dim)
    s_kv = np.maximum(pre_len, 1.0)
    sc = it.ctx.sc
    if sc.prefill_attention_eff is None and co.attention_fwd:
        # the measured forward kernel at this head dimension and prompt length
        pre_eff = attention_fraction(co.attention_fwd, 0.5 * (m.qk_head_dim + m.v_dim), s_kv)
    else:
        pre_eff = (sc.prefill_attention_eff or co.forward_attention_eff) * s_kv / (s_kv + co.gemm_half_dim)
    pre_t = pre_flops / (it.peak16 * pre_eff)
    pre_b = it.pre_a * kv_tok_dev * 2.0
    it.add(
        (dec_t + pre_t, dec_flops + pre_flops, dec_bytes + pre_b, dec_tc + pre_t, dec_tm + pre_b / co.hbm_bw),
        it.attn_l,
    )
    return it.attn_l * dec_t, it.attn_l * pre_t


def _iter_attention_core_per_shape(
    it: _Iter, tab: ServingTable, dec_ctx, pre_ctx, pre_len
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_iter_attention_core` of a model whose attention layers have more than one shape: each
    shape's decode (its own KV heads and head sizes, its window) and prefill on its share of the
    stage's attention layers."""
    m, co, sc = it.ctx.model, it.ctx.co, it.ctx.sc
    win = float(m.sliding_window or 0)
    s_kv = np.maximum(pre_len, 1.0)
    dec_bytes = dec_flops = pre_flops = pre_t = pre_b = 0.0
    for w_v, v in blocks.attention.shares(m):
        sliding = v.sliding_window_layers > 0 and win > 0  # a view is all full or all sliding

        def c_of(c, sliding=sliding):
            return np.minimum(c, win) if sliding else c

        dims, a = v.qk_head_dim + v.v_dim, float(v.heads)
        kv_tok = _kv_layer_token_bytes(it.ctx, v, it.ta)
        dec_bytes = dec_bytes + w_v * it.dec_a * c_of(dec_ctx) * kv_tok
        dec_flops = dec_flops + w_v * 2.0 * it.dec_a * it.dec_tokens * c_of(dec_ctx) * (a / it.ta) * dims
        fl = 2.0 * it.pre_a * c_of(pre_ctx) * (a / it.ta) * dims
        if sc.prefill_attention_eff is None and co.attention_fwd:
            pre_eff = attention_fraction(co.attention_fwd, 0.5 * dims, s_kv)
        else:
            pre_eff = (
                (sc.prefill_attention_eff or co.forward_attention_eff) * s_kv / (s_kv + co.gemm_half_dim)
            )
        pre_flops = pre_flops + w_v * fl
        pre_t = pre_t + w_v * fl / (it.peak16 * pre_eff)
        pre_b = pre_b + w_v * it.pre_a * kv_tok * 2.0
    dec_tc, dec_tm = dec_flops / (it.peak16 * co.forward_attention_eff), dec_bytes / co.hbm_bw
    dec_t = np.maximum(dec_tc, dec_tm)
    it.add(
        (dec_t + pre_t, dec_flops + pre_flops, dec_bytes + pre_b, dec_tc + pre_t, dec_tm + pre_b / co.hbm_bw),
        it.attn_l,
    )
    return it.attn_l * dec_t, it.attn_l * pre_t


def moe_rate(ctx: ServingContext) -> moe_kernels.MoeRate | None:
    """The measured MoE-kernel rates of the context's device, backend and GEMM precision
    (:func:`autopar.moe_kernels.rate_for`), or None on a machine that runs its vendor's own stack."""
    if ctx.device.serving is not None:
        return None
    peak_key, eff_key = GEMM_FORMATS.get(ctx.compute_precision, (ctx.compute_precision,) * 2)
    co = ctx.co
    dense = co.gemm_eff.get(eff_key, co.gemm_eff.get(peak_key, co.gemm_eff["bf16"]))
    backend = ctx.backend.name if ctx.backend is not None else "trtllm"
    return moe_kernels.rate_for(ctx.device.id, backend, ctx.compute_precision, dense)


def _expert_imbalance(it: _Iter) -> np.ndarray:
    """The busiest expert-parallel rank's routed rows over the balanced count: the workload's
    ``expert_imbalance`` where experts are split (ep > 1), 1 where every rank holds them all."""
    return np.where(np.asarray(it.ep) > 1, float(it.ctx.workload.expert_imbalance), 1.0)


def _iter_ffn(it: _Iter) -> None:
    """Dense MLPs and MoE layers (routed experts: the backend's fused MoE kernel at the measured rates
    of :mod:`autopar.moe_kernels`, balanced routing over the micro-batch, the weights of the experts
    that get any token read; the 16-bit router; shared experts as a dense MLP). With expert
    parallelism the layer waits for the busiest rank: its local experts' rows are the workload's
    ``expert_imbalance`` times the balanced count."""
    m, ta, M = it.ctx.model, it.ta, it.M
    h = float(m.hidden)
    if m.dense_layers:
        it.add_sum([it.gemm(M, N, K) for N, K in blocks.mlp.gemm_shapes(m, m.ffn_hidden, ta)], it.n_dense)
    if m.is_moe:
        E, k, Fe = float(m.num_experts), float(m.moe_topk), float(m.moe_ffn_hidden)
        etp = it.tp / it.ep
        local = E / it.ep
        tpe = it.tok_mb * k / E  # tokens per expert (balanced routing), whole micro-batch
        activated = 1.0 - np.power(1.0 - k / E, it.tok_mb)  # share of experts that get any token
        busiest = _expert_imbalance(it)
        shapes = blocks.mlp.gemm_shapes(m, Fe, etp, m.moe_dim)
        rate = moe_rate(it.ctx)
        if rate is None:  # a vendor stack's own machine: its experts as dense GEMMs
            parts = [it.gemm(tpe * busiest, N, K, weight_frac=activated, count=local) for N, K in shapes]
        else:
            # The fused MoE kernel at the measured rates of this device and backend
            # (autopar.moe_kernels). Each attention-DP rank routes its own tokens where the experts
            # exchange them by all-to-all; elsewhere every rank routes the whole micro-batch.
            parts = [
                moe_kernels.layer_time(
                    rate,
                    tokens=np.where(wide_ep(it.ep, it.adp), it.M, it.tok_mb),
                    rows=tpe * busiest * local,
                    local_experts=local,
                    activated=activated,
                    flops_per_row=sum(2.0 * N * K for N, K in shapes),
                    weight_bytes_per_expert=sum(N * K for N, K in shapes) * it.ctx.weight_bytes,
                    row_width=float(m.moe_dim),
                    peak=it.peak,
                    hbm_bw=it.ctx.co.hbm_bw,
                )
            ]
        parts.append(it.gemm(M, E, h, wbytes=2.0, p=it.peak16, e=it.eff16))
        if m.moe_latent_size:  # h -> latent before the routed experts, latent -> h after
            lat = float(m.moe_latent_size)
            parts += [it.gemm(M, lat, h), it.gemm(M, h, lat)]
        if m.shared_expert_ffn:
            parts += [it.gemm(M, N, K) for N, K in blocks.mlp.gemm_shapes(m, m.shared_expert_ffn, ta)]
        it.add_sum(parts, it.n_moe)


def _iter_elementwise(it: _Iter) -> None:
    """Norms, residual adds, the activation function and RoPE (a hybrid model's mix, its recurrent
    mixers' traffic), memory-bound."""
    m, ta, mx = it.ctx.model, it.ta, it.mx
    h = float(m.hidden)
    act_f = m.ffn_hidden if m.ffn_hidden else m.moe_ffn_hidden * max(m.moe_topk, 1)
    rope = sum(w_v * (v.heads + v.kv_heads) * v.qk_head_dim for w_v, v in blocks.attention.shares(m))
    per_tok = ACT_BYTES * (10.0 * h + 3.0 * act_f / ta + 2.0 * rope / ta)
    if mx is not None:
        f_d, f_m = m.dense_layers / m.layers, m.moe_layers / m.layers
        per_tok = ACT_BYTES * (
            (mx.mixer_sub + mx.ffn_sub) * 5.0 * h  # a norm and a residual add per sublayer
            + 3.0 * (f_d * m.ffn_hidden + f_m * m.moe_ffn_hidden * m.moe_topk) / ta
            + mx.attn * 2.0 * rope / ta
            + hybrid.mixer_elementwise_elems(m, ta)
        )
    t_el = it.M * per_tok / it.ctx.co.hbm_bw
    it.add((t_el, np.zeros(it.n), it.M * per_tok, np.zeros(it.n), t_el), it.layers)


def _all_reduce(ctx: ServingContext, nbytes: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Seconds of one TP all-reduce per call: NCCL (the alpha-beta cost plus the fitted per-call sync),
    or, where the backend has one and the message qualifies, its custom kernel at its measured latency."""
    from autopar.serving.backends import custom_allreduce_s, gpu_rules, uses_custom_allreduce

    nccl = C.all_reduce(ctx.links, nbytes, n, np.ones(len(n))) + np.where(
        n > 1, ctx.sc.collective_sync_s, 0.0
    )
    b = ctx.backend
    car = b.all_reduce.custom if b is not None and gpu_rules(b, ctx.device) else None
    if car is None:
        return nccl
    use = uses_custom_allreduce(car, nbytes, n, ctx.devices_per_node, ctx.device.scale_up.peer_memory)
    return np.where(use, custom_allreduce_s(car, nbytes, n), nccl)


def _eager_launch_s(ctx: ServingContext, tab: ServingTable, it: _Iter, stage: np.ndarray) -> np.ndarray:
    """Host time per micro-batch a step outside the backend's CUDA graphs waits for: its kernels'
    launches (kernels per layer x layers of the stage x the eager launch cost) less the GPU time that
    hides them (launches are asynchronous; the training model's eager rule). 0 where a graph covers
    the step, and for backends whose host work is in the fitted coefficients (trtllm)."""
    from autopar.serving.backends import gpu_rules, graph_limit

    b = ctx.backend
    if b is None or not b.cuda_graphs.modelled or not gpu_rules(b, ctx.device):
        return np.zeros(it.n)
    cg, w = b.cuda_graphs, ctx.workload
    budget = np.full(it.n, float(w.max_num_tokens or 0) or np.inf)
    limit = graph_limit(b, ctx.device, tab["tp"], budget, float(ctx.max_batch))
    if cg.scope == "tokens":
        eager = it.tok_mb > limit
    else:  # decode batches up to the limit replay a graph; steps with prefill run eager
        # each attention data-parallel rank replays its own graphs for its own decode batch
        eager = (it.pre_a > 0) | (it.dec_a > limit)
    host = it.lps * cg.kernels_per_layer * cg.launch_us * 1e-6
    return np.where(eager, np.maximum(host - stage, 0.0), 0.0)


def _iter_comm(it: _Iter) -> dict[str, np.ndarray]:
    """The stage's TP all-reduces (attention-DP: the attention group's, and the MoE all-to-alls), the
    pipeline send, and the bytes each device puts on its links per micro-batch."""
    ctx, m = it.ctx, it.ctx.model
    links, tp, pp, adp, ta = ctx.links, it.tp, it.pp, it.adp, it.ta
    h = float(m.hidden)
    ar_bytes = it.tok_mb * h * ACT_BYTES
    ar_tp = _all_reduce(ctx, ar_bytes, tp)
    a2a_stage = np.zeros(it.n)
    if m.is_moe:
        ar_attn = _all_reduce(ctx, ar_bytes / adp, ta)
        a2a_pair = _ep_all_to_all(it)
        moe_comm = np.where(adp > 1, ar_attn + a2a_pair, 2.0 * ar_tp)
        dense_comm = np.where(adp > 1, 2.0 * ar_attn, 2.0 * ar_tp)
        comm = it.n_moe * moe_comm + it.n_dense * dense_comm
        # what two-batch overlap can hide: the all-to-alls of the EP runtime (autopar.serving.backends.wide_ep)
        a2a_stage = np.where(wide_ep(it.ep, adp), it.n_moe * a2a_pair, 0.0)
    else:
        comm = it.layers * 2.0 * ar_tp
    if it.mx is not None:
        # One all-reduce per mixer (attention, Mamba, Gated DeltaNet: row-parallel out_proj) and per
        # dense MLP; MoE as above less its attention's.
        mx = it.mx
        ar_mix = ar_attn if m.is_moe else ar_tp
        mixers = mx.attn + mx.linear + mx.mamba
        comm = it.lps * mixers * np.where(adp > 1, ar_mix, ar_tp) + it.n_dense * ar_tp
        if m.is_moe:
            comm = comm + it.n_moe * np.where(adp > 1, a2a_pair, ar_tp)
    inter_pp = tp >= ctx.devices_per_node
    p2p = np.where(pp > 1, C.p2p(links, it.tok_mb * h * ACT_BYTES, inter_pp), 0.0)

    # Bytes each device puts on its links per micro-batch (for the link energy of autopar.energy):
    # two ring all-reduces per layer, 2(tp-1)/tp of the message each (MoE all-to-alls counted as
    # all-reduces of the same tokens: an approximation), and the pipeline send of the activations.
    tp_bytes = 2.0 * it.lps * 2.0 * (tp - 1.0) / tp * ar_bytes
    tp_inter = tp > ctx.devices_per_node
    pp_bytes = np.where(pp > 1, it.tok_mb * h * ACT_BYTES, 0.0)
    link_up = np.where(tp_inter, 0.0, tp_bytes) + np.where(inter_pp, 0.0, pp_bytes)
    link_out = np.where(tp_inter, tp_bytes, 0.0) + np.where(inter_pp, pp_bytes, 0.0)
    return {"comm": comm, "p2p": p2p, "link_up": link_up, "link_out": link_out, "a2a": a2a_stage}


# Bytes per element DeepEP dispatches at, by the expert GEMMs' format: FP8 with one fp32 scale per 128
# channels (DeepEP README: "FP8 dispatching"; SGLang/vLLM quantize before dispatch for FP8 experts),
# NVFP4 with one FP8 scale per 16 elements (fused into DeepEP for NVFP4 experts: LMSYS, "Deploying
# DeepSeek on GB200 NVL72 ... Part II", 2025-09-25), MXFP4 with one 8-bit scale per 32; 16-bit otherwise.
# The combine returns 16-bit rows.
DEEPEP_DISPATCH_BYTES: dict[str, float] = {
    "fp8": 1.0 + 4.0 / 128.0,
    "fp8-block": 1.0 + 4.0 / 128.0,
    "nvfp4": 0.5 + 1.0 / 16.0,
    "mxfp4": 0.5 + 1.0 / 32.0,
}


def _ep_all_to_all(it: _Iter) -> np.ndarray:
    """Seconds of one MoE layer's dispatch and combine per micro-batch under attention data parallelism.

    Each attention-DP rank routes its ``M`` tokens' ``k`` copies (a latent MoE: its projected width);
    the busiest expert rank receives and returns its imbalance times the balanced share. ``default``:
    the backend's own collective, every copy in 16 bits. ``deepep``: DeepEP sends a token once per
    destination rank over NVLink and once per destination node over the network
    (:func:`autopar.moe.deepep_intranode_share`, :func:`autopar.moe.deepep_internode_share`, the
    training model's functions) and dispatches in the expert GEMMs' format
    (:data:`DEEPEP_DISPATCH_BYTES`); the combine is 16-bit."""
    ctx, m, tp = it.ctx, it.ctx.model, it.tp
    ones = np.ones(it.n)
    copies = it.M * m.moe_topk * float(m.moe_dim) * _expert_imbalance(it)
    sync = np.where(tp > 1, ctx.sc.collective_sync_s, 0.0)
    default = 2.0 * (C.all_to_all(ctx.links, copies * ACT_BYTES, tp, ones) + sync)
    if ctx.workload.ep_dispatch != "deepep":
        return default
    inter = moe.deepep_internode_share(m, tp, ones, ctx.devices_per_node)
    intra = moe.deepep_intranode_share(m, tp)
    d_bytes = DEEPEP_DISPATCH_BYTES.get(ctx.workload.weight_precision, ACT_BYTES)
    dispatch = C.all_to_all(ctx.links, copies * d_bytes, tp, ones, inter_share=inter, intra_share=intra)
    combine = C.all_to_all(ctx.links, copies * ACT_BYTES, tp, ones, inter_share=inter, intra_share=intra)
    # DeepEP runs where EP does (wide_ep); attention DP with the experts tensor-split (ep = 1) keeps
    # the backend's collective, as its export does
    return np.where(wide_ep(it.ep, it.adp), dispatch + combine + 2.0 * sync, default)


def iteration(
    ctx: ServingContext,
    tab: ServingTable,
    *,
    n_dec,
    n_pre,
    dec_ctx,
    pre_ctx,
    pre_len,
    logit_rows,
    pre_seqs=None,
    clock=1.0,
    dec_tokens=1.0,
) -> dict[str, np.ndarray]:
    """Seconds (and FLOPs, HBM bytes) of ONE continuous-batching iteration of an instance.

    ``dec_tokens``: tokens each decoding sequence runs through the model per step (1, or 1 + the
    draft tokens a speculative step verifies: GEMM rows and attention FLOPs grow with them, the KV
    cache is read once).

    ``n_dec`` sequences decode one token, ``n_pre`` prompt tokens are prefilled (mean attended
    context ``pre_ctx`` keys, prompt length ``pre_len``), decode sequences have ``dec_ctx`` cached
    tokens on average, ``logit_rows`` tokens need logits, ``pre_seqs`` requests are in prefill
    (default ``n_pre / pre_len``). ``clock`` scales the compute peaks (power cap). The whole batch is split into ``pp`` micro-batches that each pass every stage once.
    The stage's cost is the sum of its blocks' (:func:`_iter_mixers`, :func:`_iter_attention_core`,
    :func:`_iter_ffn`, :func:`_iter_elementwise`, the LM head) and its communication (:func:`_iter_comm`).
    """
    m, co, sc = ctx.model, ctx.co, ctx.sc
    n = len(tab)
    tp, pp, ep, adp = tab["tp"], tab["pp"], tab["ep"], tab["adp"]

    def col(x):
        return np.broadcast_to(np.asarray(x, dtype=np.float64), (n,))

    n_dec, n_pre, dec_ctx, pre_ctx = col(n_dec), col(n_pre), col(dec_ctx), col(pre_ctx)
    pre_len, logit_rows, clock = col(pre_len), col(logit_rows), col(clock)
    # a weight format's GEMMs: the peak it runs at and the efficiency key of its measured rate
    peak_key, eff_key = GEMM_FORMATS.get(ctx.compute_precision, (ctx.compute_precision,) * 2)
    mb = pp  # micro-batches in flight
    tok_mb = (n_dec * dec_tokens + n_pre) / mb  # tokens of one micro-batch (whole instance)
    lps = np.ceil(m.layers / pp)
    n_dense = lps * m.dense_layers / m.layers
    n_moe = lps * m.moe_layers / m.layers
    # Attention layers of the stage: every layer, or a hybrid model's attention share of its blocks
    # (each stage holds the model's mix, autopar.hybrid).
    mx = hybrid.mix(m) if m.is_hybrid else None
    layers = lps if mx is not None else n_dense + n_moe
    it = _Iter(
        ctx=ctx,
        n=n,
        tp=tp,
        pp=pp,
        ep=ep,
        adp=adp,
        ta=tp / adp,
        tok_mb=tok_mb,
        M=tok_mb / adp,
        dec_a=n_dec / mb / adp,
        pre_a=n_pre / mb / adp,
        lps=lps,
        n_dense=n_dense,
        n_moe=n_moe,
        layers=layers,
        attn_l=layers * (mx.attn if mx is not None else 1.0),
        mx=mx,
        peak=co.peak(peak_key) * clock,
        eff=co.gemm_eff.get(eff_key, co.gemm_eff.get(peak_key, co.gemm_eff["bf16"])),
        dec_tokens=float(dec_tokens),
        peak16=co.peak("bf16") * clock,
        eff16=co.gemm_eff["bf16"],
        acc=_Acc(np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)),
        co_inf=replace(co, hbm_bw=math.inf),
    )
    _iter_mixers(it)
    t_attn_dec, t_attn_pre = _iter_attention_core(it, tab, dec_ctx, pre_ctx, pre_len)
    _iter_ffn(it)
    _iter_elementwise(it)
    # ---- LM head on the last stage (16-bit weights) + sampling over the logits ---------------------
    rows = logit_rows / mb
    hd = it.gemm(rows, m.vocab / tp, float(m.hidden), wbytes=2.0, p=it.peak16, e=it.eff16)
    samp_b = rows * m.vocab / tp * LOGIT_BYTES * 2.0
    t_s = samp_b / co.hbm_bw
    it.add((hd[0] + t_s, hd[1], hd[2] + samp_b, hd[3], hd[4] + t_s))
    acc = it.acc
    gpu_stage = acc.time.copy()
    cm = _iter_comm(it)
    comm, p2p = cm["comm"], cm["p2p"]
    if ctx.workload.ep_overlap:
        # Two-batch overlap: the batch runs as two halves, each one's dispatch and combine behind the
        # other's compute (DeepSeek's inference system; SGLang --enable-two-batch-overlap): only the
        # all-to-all time beyond the compute stays exposed, and the hidden part slows the compute it
        # shares the SMs and HBM with (DeepEP's normal kernels hold 20-24 SMs), at the calibrated
        # overlap contention.
        hidden = np.minimum(cm["a2a"], gpu_stage)
        comm = comm - hidden + co.overlap_contention * hidden

    # A statically scheduled dataflow machine: each layer of the stage adds its pipeline latency to the
    # micro-batch's pass (GPUs: 0; their per-kernel costs are the host and collective terms).
    lat = lps * sc.layer_latency_s
    stage = gpu_stage + comm + p2p + lat
    gpu = mb * stage
    if pre_seqs is None:
        pre_seqs = n_pre / np.maximum(pre_len, 1.0)
    # Each attention data-parallel rank runs its own scheduler over its own requests (SGLang's DP
    # attention workers, vLLM's data-parallel engine cores), so the per-sequence host work of the
    # instance is done adp ways in parallel.
    host = (
        mb * sc.host_step_s
        + sc.host_per_seq_s * (n_dec + pre_seqs) / adp
        + mb * _eager_launch_s(ctx, tab, it, stage)
    )
    t_iter = gpu + host
    # FLOPs and bytes per device for one iteration.
    return {
        "t_iter": t_iter,
        "gpu": gpu,
        "host": host,
        "comm": mb * (comm + p2p),
        "pipeline_latency": mb * lat,
        "compute": mb * gpu_stage,
        "flops_per_device": mb * acc.flops,
        "bytes_per_device": mb * acc.bytes,
        "busy_compute": mb * acc.busy_compute,
        "busy_memory": mb * acc.busy_memory,
        "attn_decode": mb * t_attn_dec,
        "attn_prefill": mb * t_attn_pre,
        "link_bytes_up": mb * cm["link_up"],
        "link_bytes_out": mb * cm["link_out"],
    }


# ====================================================================================== steady state
def speculation(w: ServingWorkload) -> tuple[float, float]:
    """(tokens each sequence verifies per decode step, tokens it emits on average): with k draft
    tokens each accepted with probability a given the ones before, 1 + k and (1 - a^(k+1)) / (1 - a)
    (the accepted run plus the target's own token; Leviathan et al. 2023, eq. 1)."""
    k = float(w.speculative_tokens)
    if not k:
        return 1.0, 1.0
    a = float(w.acceptance_rate or 0.0)
    return 1.0 + k, (1.0 - a ** (k + 1.0)) / (1.0 - a)


def draft_time(ctx: ServingContext, tab: ServingTable, n_dec, dec_ctx, clock=1.0) -> np.ndarray:
    """Seconds the draft tokens of one speculative step add: one transformer layer of the target's
    shape per draft token and sequence (DeepSeek-V3's MTP module is one block; a small draft model
    costs about as much per token), decode-only; the draft's LM head is not charged."""
    k = float(ctx.workload.speculative_tokens)
    if not k:
        return np.zeros(len(tab))
    it = iteration(
        ctx,
        tab,
        n_dec=n_dec,
        n_pre=0.0,
        dec_ctx=dec_ctx,
        pre_ctx=0.0,
        pre_len=1.0,
        logit_rows=0.0,
        clock=clock,
    )
    per_layer = it["compute"] / np.ceil(ctx.model.layers / tab["pp"])
    return k * per_layer


def prefill_split(w: ServingWorkload) -> tuple[float, float]:
    """(tokens of a prompt prefilled, tokens of it found in the prefix cache); at least one token is
    always computed (the last prompt token's logits give the first output token)."""
    cached = min(math.floor(w.isl * w.prefix_cache_hit_rate), w.isl - 1)
    return float(w.isl - cached), float(cached)


def steady_state(
    ctx: ServingContext, tab: ServingTable, batch, *, budget, clock=1.0
) -> dict[str, np.ndarray]:
    """Offline/closed-loop steady state with ``batch`` sequences in flight per instance.

    Each iteration advances ``B`` decodes and admits ``B/osl`` requests (``B*isl/osl`` prefill
    tokens, chunked); the token budget caps ``B*(1+isl/osl)``. TPOT is the mean iteration time.
    TTFT (service, no open-loop queueing) is the iterations the prompt needs at the chunk the budget
    leaves, plus the admission wait of sequences the budget cannot keep decoding.
    """
    w = ctx.workload
    isl, osl = float(w.isl), float(w.osl)
    # Prefix caching: a prompt's cached tokens are not prefilled again; its new tokens still attend
    # to them (mean attended context: the cached prefix plus half the new part).
    new, cached = prefill_split(w)
    # Speculative decoding: each step verifies q tokens per sequence and emits tau of them.
    q, tau = speculation(w)
    B = np.maximum(np.asarray(batch, dtype=np.float64), 1e-9)
    budget = np.asarray(budget, dtype=np.float64)
    if ctx.backend is not None and not ctx.backend.scheduler.mixed_batches.value:
        return _steady_state_split(ctx, tab, B, budget, clock)
    b_eff = np.minimum(B, budget / (q + tau * new / osl))
    pre = b_eff * tau * new / osl
    dec_ctx = isl + osl / 2.0
    pre_ctx = cached + new / 2.0
    it = iteration(
        ctx,
        tab,
        n_dec=b_eff,
        n_pre=pre,
        dec_ctx=dec_ctx,
        pre_ctx=pre_ctx,
        pre_len=isl,
        logit_rows=b_eff * q + b_eff * tau / osl,
        pre_seqs=b_eff * tau / osl,
        clock=clock,
        dec_tokens=q,
    )
    t_draft = draft_time(ctx, tab, b_eff, dec_ctx, clock)
    t_step = it["t_iter"] + t_draft
    tpot = t_step / tau
    if w.chunked_prefill:
        chunk = np.clip(budget - b_eff, min(ALIGN_TOKENS, new), new)
    else:
        chunk = np.full_like(b_eff, new)
    n_chunks = np.ceil(new / chunk)
    last = new - (n_chunks - 1.0) * chunk
    # The prompt's chunks ride along with the other decodes (its own decode slot is not yet used).
    others = np.maximum(b_eff - 1.0, 0.0)
    itc = iteration(
        ctx,
        tab,
        n_dec=others,
        n_pre=chunk,
        dec_ctx=dec_ctx,
        pre_ctx=pre_ctx,
        pre_len=isl,
        logit_rows=others * q,
        pre_seqs=1.0,
        clock=clock,
        dec_tokens=q,
    )
    itl = iteration(
        ctx,
        tab,
        n_dec=others,
        n_pre=last,
        dec_ctx=dec_ctx,
        pre_ctx=pre_ctx,
        pre_len=isl,
        logit_rows=others * q + 1.0,
        pre_seqs=1.0,
        clock=clock,
        dec_tokens=q,
    )
    ttft = (n_chunks - 1.0) * itc["t_iter"] + itl["t_iter"] + n_chunks * t_draft
    # Closed loop: sequences beyond what the token budget keeps decoding wait for admission; by
    # Little's law B = X * (wait + osl * TPOT) with X = b_eff / (osl * TPOT).
    ttft = ttft + osl * tpot * (B / b_eff - 1.0)
    return {
        "batch": b_eff,
        "tpot": tpot,
        "ttft": ttft,
        "prefill_tokens_per_iter": pre,
        "output_tps_instance": b_eff / tpot,
        "request_rate_instance": b_eff / (osl * tpot),
        "step_s": t_step,
        "tokens_per_step": tau,
        "iter": it,
        "budget_bound": b_eff < B - 1e-9,
    }


# The first prompts of a lock-step wave whose iteration counts are summed exactly (ceil of each);
# beyond them each prompt adds its share of an iteration plus half of one on average.
LOCKSTEP_EXACT = 64


def mean_ceil(x, B) -> np.ndarray:
    """Mean over k = 1..B of ceil(k * x): the iteration in which a wave's k-th prompt finishes when
    each iteration prefills 1/x prompts. Exact for the first :data:`LOCKSTEP_EXACT` prompts,
    k x + 1/2 beyond."""
    x = np.asarray(x, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    tot = np.zeros(np.broadcast(x, B).shape)
    for k in range(1, LOCKSTEP_EXACT + 1):
        tot = tot + np.where(k <= B, np.ceil(k * x - 1e-9), 0.0)
    k0 = float(LOCKSTEP_EXACT)
    rest = np.maximum(B - k0, 0.0)
    tot = tot + np.where(rest > 0, x * (B * (B + 1.0) - k0 * (k0 + 1.0)) / 2.0 + 0.5 * rest, 0.0)
    return tot / np.maximum(B, 1.0)


def lockstep_ttft(ctx: ServingContext, tab: ServingTable, batch, *, budget, clock=1.0) -> np.ndarray:
    """Mean TTFT (seconds) when an instance's ``batch`` requests arrive together and, with one output
    length, finish together: the waves of closed-loop benchmark clients (genai-perf, vllm bench
    ``--max-concurrency``; ``ServingWorkload.arrival == "lockstep"``). The wave's prompts are
    prefilled in arrival order at the iteration's token budget (whole prompts per iteration without
    chunked prefill); the k-th prompt's first token comes with the iteration that finishes it. The
    prompts already prefilled decode in the same iterations and take their share of the budget (half
    the wave on average over the prefill phase), with a context of about the prompt."""
    w = ctx.workload
    isl = float(w.isl)
    new, cached = prefill_split(w)
    q, _tau = speculation(w)
    B = np.maximum(np.round(np.asarray(batch, dtype=np.float64)), 1.0)
    budget = np.asarray(budget, dtype=np.float64)
    dec = np.floor(B / 2.0)
    room = np.maximum(budget - dec * q, min(ALIGN_TOKENS, new))
    if w.chunked_prefill:
        per_iter = np.minimum(room, B * new)
        x = new / per_iter
    else:
        whole = np.minimum(np.maximum(np.floor(room / new), 1.0), B)
        per_iter = whole * new
        x = 1.0 / whole
    it = iteration(
        ctx,
        tab,
        n_dec=dec,
        n_pre=per_iter,
        dec_ctx=isl + 1.0,
        pre_ctx=cached + new / 2.0,
        pre_len=isl,
        logit_rows=dec * q + per_iter / new,
        pre_seqs=per_iter / new,
        clock=clock,
        dec_tokens=q,
    )
    # The wave's last iteration holds only what is left of the prompts (a share f of a full one): the
    # prompts it finishes wait that much less (a single prompt's last chunk, the wave's tail).
    n_it = np.ceil(B * x - 1e-9)
    f = B * x - (n_it - 1.0)
    last = B - np.floor((n_it - 1.0) / x + 1e-9)
    m = mean_ceil(x, B) - last / B * (1.0 - f)
    return m * (it["t_iter"] + draft_time(ctx, tab, dec, isl + 1.0, clock))


def _steady_state_split(ctx: ServingContext, tab: ServingTable, B, budget, clock=1.0) -> dict[str, Any]:
    """The steady state of a scheduler that runs prefill and decode in separate batches (SGLang
    without --enable-mixed-chunk): every decode step of the ``B`` sequences is a decode-only
    iteration, and the ``B * isl / osl`` prompt tokens it admits run in prefill-only batches of the
    token budget (``pre / budget`` of one per step; the KV cache, not the budget, bounds ``B``). A
    prompt's TTFT is the prefill batches its tokens need. The step's figures are the decode
    iteration's plus that share of a prefill batch's (every figure of an iteration is additive)."""
    w = ctx.workload
    isl, osl = float(w.isl), float(w.osl)
    new, cached = prefill_split(w)
    q, tau = speculation(w)
    dec_ctx, pre_ctx = isl + osl / 2.0, cached + new / 2.0
    B = np.broadcast_to(np.asarray(B, dtype=np.float64), (len(tab),))
    budget = np.broadcast_to(np.asarray(budget, dtype=np.float64), (len(tab),))
    pre = B * tau * new / osl
    it_d = iteration(
        ctx, tab, n_dec=B, n_pre=0.0, dec_ctx=dec_ctx, pre_ctx=pre_ctx, pre_len=isl, logit_rows=B * q,
        pre_seqs=0.0, clock=clock, dec_tokens=q,
    )  # fmt: skip
    batch_p = np.maximum(budget, 1.0) if w.chunked_prefill else np.maximum(budget, new)
    it_p = iteration(
        ctx, tab, n_dec=0.0, n_pre=batch_p, dec_ctx=dec_ctx, pre_ctx=pre_ctx, pre_len=isl,
        logit_rows=batch_p / new, pre_seqs=batch_p / new, clock=clock,
    )  # fmt: skip
    share = pre / batch_p
    it = {k: it_d[k] + share * it_p[k] for k in it_d}
    t_draft = draft_time(ctx, tab, B, dec_ctx, clock)
    t_step = it["t_iter"] + t_draft
    tpot = t_step / tau
    ttft = np.ceil(new / batch_p) * it_p["t_iter"]
    return {
        "batch": B,
        "tpot": tpot,
        "ttft": ttft,
        "prefill_tokens_per_iter": pre,
        "output_tps_instance": B / tpot,
        "request_rate_instance": B / (osl * tpot),
        "step_s": t_step,
        "tokens_per_step": tau,
        "iter": it,
        "budget_bound": np.zeros(len(tab), dtype=bool),
    }


def power_demand(ctx: ServingContext, it: dict[str, np.ndarray], clock=1.0) -> dict[str, np.ndarray]:
    """Average device power during one iteration (kernels, communication/host stalls, node share)."""
    busy = np.maximum(it["compute"], 1e-15)
    # Share of kernel time the math units (at their achievable rate) and HBM are busy.
    u_c = np.clip(it["busy_compute"] / busy, 0.0, 1.0)
    u_m = np.clip(it["busy_memory"] / busy, 0.0, 1.0)
    active = phase_power(ctx.device, u_c, u_m)
    stall = stall_power(ctx.device)
    t = it["t_iter"]
    avg = (it["compute"] * active + (t - it["compute"]) * stall) / t
    return {
        "active_w": active,
        "stall_w": np.full_like(active, stall),
        "avg_w": avg,
        "u_compute": u_c,
        "u_memory": u_m,
    }


def clock_under_cap(ctx: ServingContext, active_w: np.ndarray, cap_w: np.ndarray) -> np.ndarray:
    """SM clock factor a power cap allows: dynamic power ~ f^3 (V ~ f); 1 where the cap does not bind."""
    idle = ctx.device.power.idle_w
    dyn = np.maximum(active_w - idle, 1e-9)
    allowed = np.maximum(cap_w - idle, 1e-9)
    s = np.cbrt(np.minimum(allowed / dyn, 1.0))
    return np.where(cap_w > 0, s, 1.0)


# =========================================================================================== evaluate
REASONS = {
    "tp_heads": "attention-TP (tp/adp) must divide the attention heads",
    "tp_kv_heads": "attention-TP must divide the KV heads or be a multiple of them",
    "pp_layers": "pp must not exceed the number of layers",
    "ep_experts": "ep must divide both tp and the number of experts (MoE only)",
    "backend_ep": "the backend runs expert parallelism over every rank of the instance or not at all "
    "(vLLM: ep = 1 or ep = tp)",
    "attention_dp_dense": "attention data parallelism is for MoE models",
    "ep_dispatch_width": "DeepEP dispatch (--ep-dispatch deepep) under attention DP spans every rank of "
    "the instance (ep = tp)",
    "power_cap_range": f"power cap below {POWER_CAP_MIN_FRACTION:.0%} of TDP or above TDP",
    "weights_do_not_fit": "weights, workspace and runtime reserve exceed device memory",
    "kv_cache": "no room in the KV cache for the requested concurrency",
    "token_budget": "without chunked prefill the token budget must hold a whole prompt",
    "saturated": "the request rate exceeds what the instance can sustain",
    "devices": "the instance (or the prefill and decode pools) needs more devices than given",
}


def evaluate_serving(
    ctx: ServingContext, tab: ServingTable, *, rate_per_instance: np.ndarray | None = None
) -> dict[str, Any]:
    """Arrays over candidate instances: memory, batch, TTFT, TPOT, throughput, power, energy.

    Without ``rate_per_instance`` the batch is ``conc`` (or the memory maximum where ``conc`` is 0);
    with it, the batch that sustains that request rate (Little's law on the steady state), plus an
    M/D/1 queueing wait on TTFT and the load factor ``rho``.
    """
    w = ctx.workload
    n = len(tab)
    bad = legal(ctx, tab)
    tdp = ctx.device.power.tdp_w
    cap_w = tab["cap_w"]
    bad["power_cap_range"] = (cap_w > 0) & ((cap_w < POWER_CAP_MIN_FRACTION * tdp) | (cap_w > tdp))
    mem0 = instance_memory(ctx, tab)
    fixed = tab["conc"] > 0
    bcap = np.where(fixed, tab["conc"], np.clip(mem0["max_conc"], 1, ctx.max_batch))
    mem = instance_memory(ctx, tab, batch_cap=bcap)
    budget = mem["budget"]
    max_conc = np.minimum(mem["max_conc"], float(ctx.max_batch))
    bad["weights_do_not_fit"] = ~mem["weights_fit"]
    bad["token_budget"] = np.full(n, (not w.chunked_prefill)) & (budget < prefill_split(w)[0])
    bmax = np.maximum(max_conc, 1.0)

    def run(clock):
        if rate_per_instance is None:
            B = np.where(fixed, tab["conc"], bmax)
            ss = steady_state(ctx, tab, B, budget=budget, clock=clock)
            if w.arrival == "lockstep":
                lock = lockstep_ttft(ctx, tab, B, budget=budget, clock=clock)
                ss = {**ss, "ttft": np.where(fixed, lock, ss["ttft"])}
            return ss, np.zeros(n), np.zeros(n), {}
        lam = np.broadcast_to(np.asarray(rate_per_instance, dtype=np.float64), (n,))
        top = steady_state(ctx, tab, bmax, budget=budget, clock=clock)
        rho = lam / np.maximum(top["request_rate_instance"], 1e-30)
        lo, hi = np.full(n, 1e-3), bmax.copy()
        for _ in range(40):  # bisection in log space for X(B) = lambda
            mid = np.sqrt(lo * hi)
            x = steady_state(ctx, tab, mid, budget=budget, clock=clock)["request_rate_instance"]
            below = x < lam
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        ss = steady_state(ctx, tab, hi, budget=budget, clock=clock)
        r = np.clip(rho, 0.0, 0.999)
        wait = r / (2.0 * (1.0 - r)) * ss["ttft"]  # M/D/1 mean wait, prefill as the server
        pct = dict[str, np.ndarray]()
        if w.percentile is not None:
            q = w.percentile / 100.0
            # in flight under Poisson arrivals: Poisson about the mean (M/G/inf), its quantile by
            # the normal approximation; the iteration and the prompt's service at that batch
            bq = np.minimum(hi + z_score(q) * np.sqrt(hi), bmax) if q > 0.5 else hi
            ssq = steady_state(ctx, tab, bq, budget=budget, clock=clock)
            pct = {
                "tpot_pct_s": np.maximum(ssq["tpot"], ss["tpot"]),
                "ttft_pct_s": np.maximum(ssq["ttft"], ss["ttft"]) + wait_quantile(wait, r, q),
                "batch_pct": bq,
            }
        return ss, rho, wait, pct

    ss, rho, wait, pct = run(1.0)
    pw = power_demand(ctx, ss["iter"])
    clock = clock_under_cap(ctx, pw["active_w"], cap_w)
    if np.any(clock < 1.0):
        ss2, rho2, wait2, pct2 = run(clock)
        sel = clock < 1.0
        pct = {k: np.where(sel, pct2[k], v) for k, v in pct.items()}
        ss = {k: (np.where(sel, ss2[k], v) if isinstance(v, np.ndarray) else v) for k, v in ss.items()}
        ss["iter"] = {k: np.where(sel, ss2["iter"][k], v) for k, v in ss["iter"].items()}
        rho, wait = np.where(sel, rho2, rho), np.where(sel, wait2, wait)
        pw = power_demand(ctx, ss["iter"], clock)
        capped = np.where(sel, np.minimum(pw["active_w"], cap_w), pw["active_w"])
        it = ss["iter"]
        pw["active_w"] = capped
        pw["avg_w"] = (it["compute"] * capped + (it["t_iter"] - it["compute"]) * pw["stall_w"]) / it["t_iter"]

    if rate_per_instance is None:
        B = np.where(fixed, tab["conc"], bmax)
        bad["kv_cache"] = mem["weights_fit"] & ((max_conc < 1) | (B > max_conc))
        bad["saturated"] = np.zeros(n, dtype=bool)
        duty = np.ones(n)
    else:
        bad["kv_cache"] = mem["weights_fit"] & (max_conc < 1)
        bad["saturated"] = rho >= 1.0
        duty = np.clip(rho, 0.0, 1.0)

    tpot = ss["tpot"]
    ttft = ss["ttft"] + wait
    devs = tab.devices
    out_inst = ss["output_tps_instance"]
    if rate_per_instance is not None:
        out_inst = np.minimum(out_inst, np.asarray(rate_per_instance) * w.osl)
    p = ctx.device.power
    # Energy per second of wall time per device: busy share at the iteration's average power, the rest
    # idle; node overhead (CPU, NIC, fans share, at typical load as in training) always.
    it = ss["iter"]
    link_w = (
        comm_energy_j(it["link_bytes_up"], "scale_up") + comm_energy_j(it["link_bytes_out"], "scale_out")
    ) / it["t_iter"]
    dev_w = duty * (pw["avg_w"] + link_w) + (1.0 - duty) * p.idle_w + p.node_overhead_w * NODE_OVERHEAD_LOAD
    j_per_tok = dev_w * devs / np.maximum(out_inst, 1e-30)
    valid = ~np.logical_or.reduce([v for v in bad.values()])
    return {
        "valid": valid,
        "bad": bad,
        "batch": ss["batch"],
        "max_conc": max_conc,
        "budget": budget,
        "ttft_s": ttft,
        "ttft_service_s": ss["ttft"],
        "queue_wait_s": wait,
        "tpot_s": tpot,
        "output_tps_instance": out_inst,
        "output_tps_per_device": out_inst / devs,
        "output_tps_per_user": 1.0 / tpot,
        "request_rate_instance": out_inst / w.osl,
        "rho": rho,
        "saturated": np.where(rate_per_instance is None, ss["budget_bound"] | (~fixed), rho >= 0.85),
        "power_w": dev_w,
        "link_power_w": duty * link_w,
        "active_power_w": pw["active_w"],
        "clock": clock,
        "j_per_token": j_per_tok,
        "j_per_request": j_per_tok * w.osl,
        "u_compute": pw["u_compute"],
        "u_memory": pw["u_memory"],
        "mem_weights": mem["weights"],
        "mem_workspace": mem["workspace"],
        "mem_reserve": mem["reserve"],
        "mem_kv_available": mem["kv_available"],
        "mem_kv_per_seq": mem["kv_per_seq"],
        "mem_capacity": mem["capacity"],
        "t_host": ss["iter"]["host"],
        "t_comm": ss["iter"]["comm"],
        "t_compute": ss["iter"]["compute"],
        **pct,
    }


def z_score(q: float) -> float:
    """The standard normal quantile at ``q``."""
    from statistics import NormalDist

    return float(NormalDist().inv_cdf(q))


def wait_quantile(mean_wait, rho, q: float) -> np.ndarray:
    """The ``q`` quantile of the queueing wait before a prompt's prefill under Poisson arrivals.

    M/G/1: an arrival waits with probability rho (PASTA); the wait of those who do is taken
    exponential (Kingman's heavy-traffic approximation, exact for M/M/1), with the mean that keeps
    the M/D/1 mean wait E[W] of :func:`evaluate_serving`: P(W > t) = rho exp(-rho t / E[W]), so
    W_q = E[W] / rho * ln(rho / (1 - q)) where rho > 1 - q, else 0 (that share never waits).
    """
    mean_wait = np.asarray(mean_wait, dtype=np.float64)
    r = np.clip(np.asarray(rho, dtype=np.float64), 1e-12, 0.999)
    tail = 1.0 - q
    return np.where(r > tail, mean_wait / r * np.log(np.maximum(r / tail, 1.0)), 0.0)


def attainment(ctx: ServingContext, res: dict[str, Any]) -> np.ndarray:
    """Share of requests meeting both targets.

    TPOT is deterministic in the steady state (met or not). TTFT is the service time plus a queueing
    wait whose tail under an open request rate follows the heavy-traffic exponential approximation of
    an M/D/1 queue, P(W > t) = rho * exp(-2 (1 - rho) t / (rho * s)) (Kingman); closed-loop and
    offline loads have no queue (attainment 0 or 1).
    """
    w = ctx.workload
    ok = np.ones(len(res["tpot_s"]))
    if w.tpot_ms is not None:
        ok = ok * (res["tpot_s"] * 1e3 <= w.tpot_ms * (1 + 1e-9))
    if w.ttft_ms is not None:
        s = res["ttft_service_s"]
        T = w.ttft_ms * 1e-3
        rho = np.clip(res["rho"], 1e-9, 0.999)
        slack = T - s
        tail = np.where(
            res["rho"] > 0, rho * np.exp(-2.0 * (1.0 - rho) * np.maximum(slack, 0) / (rho * s)), 0.0
        )
        ok = ok * np.where(slack >= 0, 1.0 - tail, 0.0)
    return ok


def meets_targets(ctx: ServingContext, res: dict[str, Any]) -> dict[str, np.ndarray]:
    """Masks of target violations: TTFT/TPOT, the mean or the workload's percentile (``ttft_pct_s``,
    ``tpot_pct_s`` of :func:`evaluate_serving`), or attainment < goodput."""
    w = ctx.workload
    n = len(res["tpot_s"])
    out = {}
    if w.goodput is not None:
        out["goodput_target"] = attainment(ctx, res) < w.goodput
        return out
    # the statistic the targets are stated in: the mean, or the percentile over requests
    tpot = res["tpot_pct_s"] if w.percentile is not None else res["tpot_s"]
    ttft = res["ttft_pct_s"] if w.percentile is not None else res["ttft_s"]
    if w.tpot_ms is not None:
        out["tpot_target"] = tpot * 1e3 > w.tpot_ms * (1 + 1e-9)
    if w.ttft_ms is not None:
        out["ttft_target"] = ttft * 1e3 > w.ttft_ms * (1 + 1e-9)
    return out or {"tpot_target": np.zeros(n, dtype=bool)}


def gib(x) -> float:
    return float(x) / GIB
