"""Serving stacks as an input: what TensorRT-LLM, vLLM and SGLang do that changes the cost.

A backend is a profile (``cost_models/backends/<name>.yaml``, one per stack, every figure with its
source: the file and symbol of the stack's code at the version stated) of the runtime's rules:

* scheduler defaults: sequences per instance (``max_batch``: trtllm-bench's 4096, vLLM
  ``max_num_seqs``, SGLang ``max_running_requests``), the token budget per iteration (trtllm-bench's
  heuristic, vLLM ``max_num_batched_tokens``, SGLang ``chunked_prefill_size``), chunked prefill;
* CUDA graphs: the largest captured step (vLLM: tokens per step; SGLang: decode batch); a step above
  it runs eager and pays the host launch time of its kernels where the GPU does not hide it (the
  training model's eager rule, :mod:`autopar.frameworks`);
* custom all-reduce: vLLM's and SGLang's one-shot/two-shot kernels for messages below their buffer
  (8 MiB) inside one NVLink node, at the measured latency per TP size and message size, instead of
  NCCL (the alpha-beta cost plus the fitted per-call sync);
* the KV cache: block size, and how the memory it gets is counted (TRT-LLM: a fraction of the
  memory left FREE after weights and activations; vLLM: ``gpu_memory_utilization`` of the TOTAL,
  less weights, activations and the runtime reserve; SGLang: ``mem_fraction_static`` of the TOTAL
  holds weights and the KV pool);
* the prefill attention kernel (TRT-LLM's measured context FMHA where the device has the curve,
  else the die's published FlashAttention figure).

``trtllm`` reproduces the model as it was fitted (bit for bit). The serving coefficients were fitted
on TensorRT-LLM runs only: a prediction for another stack says so and widens its expected error
(:mod:`autopar.serving.accuracy`).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autopar.errors import AutoparError

SCHEMA = "autopar.serving_backend/v1"
BACKENDS = ("trtllm", "vllm", "sglang")
GIB = float(1 << 30)
MIB = float(1 << 20)


class _M(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Tier(_M):
    """One row of a rule by device: the first row whose conditions hold gives the value."""

    below_gib: float | None = None
    at_least_gib: float | None = None
    exclude: tuple[str, ...] = ()  # device ids containing any of these do not match
    value: float
    value_tp4: float | None = None  # the value at tp >= 4 (SGLang's cuda_graph_max_bs)

    def matches(self, device_id: str, mem_gib: float) -> bool:
        if self.below_gib is not None and not mem_gib < self.below_gib:
            return False
        if self.at_least_gib is not None and not mem_gib >= self.at_least_gib:
            return False
        return not any(x in device_id for x in self.exclude)


class Tiered(_M):
    tiers: tuple[Tier, ...] = Field(min_length=1)
    source: str

    def tier(self, device_id: str, mem_gib: float) -> Tier:
        for t in self.tiers:
            if t.matches(device_id, mem_gib):
                return t
        return self.tiers[-1]

    def value(self, device_id: str, mem_gib: float) -> float:
        return self.tier(device_id, mem_gib).value

    def by_tp(self, device_id: str, mem_gib: float, tp: np.ndarray) -> np.ndarray:
        t = self.tier(device_id, mem_gib)
        hi = t.value if t.value_tp4 is None else t.value_tp4
        return np.where(np.asarray(tp) >= 4, hi, t.value)


class TokenBudget(_M):
    rule: Literal["trtllm-bench", "fixed"]
    tiers: tuple[Tier, ...] = ()
    offline_tiers: tuple[Tier, ...] = ()  # an offline run's defaults where they differ (vLLM's LLM class)
    source: str


class Flag(_M):
    value: bool
    source: str


class Scheduler(_M):
    max_batch: Tiered
    max_num_tokens: TokenBudget
    chunked_prefill: Flag
    mixed_batches: Flag


class CaptureRule(_M):
    rule: Literal["min(2*max_batch, 512, max_num_tokens)"]
    source: str


class CudaGraphs(_M):
    max_tokens: CaptureRule | None = None  # vLLM: tokens per step
    max_batch: Tiered | None = None  # SGLang: decode batch (prefill steps run eager)
    scope: Literal["tokens", "decode"] | None = None
    kernels_per_layer: int = Field(0, ge=0)
    kernels_source: str = ""
    launch_us: float = Field(0.0, ge=0)
    launch_source: str = ""
    source: str = ""

    @property
    def modelled(self) -> bool:
        return self.scope is not None


class CustomAllReduce(_M):
    max_bytes: float = Field(gt=0)
    world_sizes: tuple[int, ...]
    source: str
    latency_us: dict[int, tuple[tuple[float, float], ...]]
    measured_on: str
    latency_source: str


class AllReduce(_M):
    custom: CustomAllReduce | None = None
    source: str = ""


class SglangReserve(_M):
    base: float
    per_chunk_token: float
    min_chunk_tokens: float
    per_graph_batch: float
    per_device_over_8: float
    floor_above_60gib: float


class KvFraction(_M):
    tiers: tuple[Tier, ...] = ()
    rule: Literal["sglang-reserved"] | None = None
    reserve_mib: SglangReserve | None = None
    source: str


class KvCache(_M):
    block_tokens: int = Field(ge=1)
    block_source: str
    memory_rule: Literal["free", "total", "static"]
    fraction: KvFraction


class Attention(_M):
    prefill: Literal["measured", "published"]
    source: str


class ExpertParallel(_M):
    """Which expert-parallel widths the runtime can launch within an instance of ``tp`` ranks:
    ``divides_tp`` (any ep dividing tp, experts tensor-split over the rest: TensorRT-LLM's
    moe_expert_parallel_size x moe_tensor_parallel_size, SGLang's --ep-size) or ``all_ranks``
    (ep = 1 or every rank: vLLM's boolean --enable-expert-parallel)."""

    rule: Literal["divides_tp", "all_ranks"]
    source: str


class BackendProfile(_M):
    """One serving stack's rules (see the module docstring); loaded from its YAML."""

    schema_: str = Field(alias="schema")
    name: Literal["trtllm", "vllm", "sglang"]
    title: str
    version: str
    versions: tuple[str, ...]
    measured: bool
    gpu_vendors: tuple[str, ...] = ()  # where its CUDA/HIP graphs and custom all-reduce exist
    scheduler: Scheduler
    cuda_graphs: CudaGraphs
    all_reduce: AllReduce
    kv_cache: KvCache
    attention: Attention
    expert_parallel: ExpertParallel | None = None  # None: divides_tp


def expert_parallel_ok(profile: BackendProfile | None, ep, tp) -> np.ndarray:
    """Whether the runtime launches ``ep``-wide expert parallelism in an instance of ``tp`` ranks
    (arrays): its profile's ``expert_parallel`` rule, ``divides_tp`` where the profile states none.
    The serving search (``estimate.legal``) and the deployment exports (``deploy``) both ask here."""
    ep, tp = np.asarray(ep), np.asarray(tp)
    rule = profile.expert_parallel.rule if profile is not None and profile.expert_parallel else "divides_tp"
    if rule == "all_ranks":
        return (ep == 1) | (ep == tp)
    return tp % ep == 0


def wide_ep(ep, adp) -> np.ndarray:
    """Whether an instance's experts exchange tokens by all-to-all: expert parallelism under attention
    data parallelism (``ep > 1`` and ``adp > 1``; arrays). Elsewhere the experts' output is all-reduced
    as TP does, and the EP runtime knobs (``ServingWorkload.ep_dispatch``/``ep_overlap``) change
    nothing. The serving cost model (``estimate``) prices them and the exports (``deploy``, ``autopar
    export --format vllm|sglang``) write their flags exactly where this holds."""
    return (np.asarray(ep) > 1) & (np.asarray(adp) > 1)


def profile_path(name: str) -> Path:
    return Path(str(resources.files("autopar.cost_models") / "backends" / f"{name}.yaml"))


@lru_cache(maxsize=8)
def load_backend(name: str = "trtllm", version: str | None = None) -> BackendProfile:
    """The profile of backend ``name``; ``version`` must be one the profile was read at."""
    import yaml

    if name not in BACKENDS:
        raise AutoparError(f"unknown serving backend {name!r}", f"choose one of {', '.join(BACKENDS)}")
    path = profile_path(name)
    try:
        prof = BackendProfile.model_validate(yaml.safe_load(path.read_text()))
    except (OSError, ValidationError, yaml.YAMLError) as exc:  # a shipped file: say which
        raise AutoparError(f"backend profile {path} is unreadable: {str(exc).splitlines()[0]}") from None
    if version is not None and str(version) not in prof.versions:
        raise AutoparError(
            f"backend {name} has no profile for version {version!r} (profiled: {', '.join(prof.versions)})",
            f"drop --backend-version or give {prof.versions[0]}",
        )
    return prof


def check_device(b: BackendProfile, device) -> None:
    """Refuse a GPU serving stack on a machine that runs its vendor's own (SRAM, wafer-scale,
    dataflow: the device profile's ``serving`` section)."""
    if b.name != "trtllm" and device.serving is not None:
        raise AutoparError(
            f"{device.id} runs its vendor's own serving stack: --backend {b.name} does not run on it",
            "drop --backend (the device profile's serving figures are used)",
        )


def gpu_rules(b: BackendProfile, device) -> bool:
    """Whether the stack's CUDA/HIP-graph and custom all-reduce rules apply on this device's vendor."""
    return device.vendor in b.gpu_vendors


def _mem_gib(device) -> float:
    return float(device.memory_bytes) / GIB


def max_batch(b: BackendProfile, device) -> int:
    return int(b.scheduler.max_batch.value(device.id, _mem_gib(device)))


def max_num_tokens(b: BackendProfile, device, offline: bool = False) -> int | None:
    """The fixed token budget per iteration, or None for trtllm-bench's batch-dependent heuristic.
    ``offline``: an offline max-throughput run (vLLM's ``LLM`` class has its own defaults)."""
    mt = b.scheduler.max_num_tokens
    if mt.rule == "trtllm-bench":
        return None
    t = Tiered(tiers=mt.offline_tiers if offline and mt.offline_tiers else mt.tiers, source=mt.source)
    return int(t.value(device.id, _mem_gib(device)))


def graph_limit(b: BackendProfile, device, tp: np.ndarray, budget: np.ndarray, bmax: float) -> np.ndarray:
    """Per candidate: the largest step (tokens, or decode sequences for SGLang) a CUDA graph covers."""
    cg = b.cuda_graphs
    if cg.max_tokens is not None:  # vLLM: min(2 * max_num_seqs, 512, max_num_batched_tokens)
        return np.minimum(np.minimum(2.0 * bmax, 512.0), budget)
    if cg.max_batch is not None:
        return cg.max_batch.by_tp(device.id, _mem_gib(device), tp).astype(np.float64)
    return np.full(len(np.atleast_1d(tp)), np.inf)


def kv_fraction(b: BackendProfile, device, tp: np.ndarray, pp: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Per candidate: the memory share the backend gives the KV cache (its own accounting)."""
    fr = b.kv_cache.fraction
    if fr.rule == "sglang-reserved" and fr.reserve_mib is not None:
        r = fr.reserve_mib
        gpu_mib = float(device.memory_bytes) / MIB
        graph_bs = graph_limit(b, device, tp, budget, 0.0)
        reserved = (
            r.base
            + np.maximum(budget, r.min_chunk_tokens) * r.per_chunk_token
            + graph_bs * r.per_graph_batch
            + np.asarray(tp) * np.asarray(pp) / 8.0 * r.per_device_over_8
        )
        if gpu_mib > 60 * 1024:
            reserved = np.maximum(reserved, r.floor_above_60gib)
        return np.round((gpu_mib - reserved) / gpu_mib, 3)
    t = Tiered(tiers=fr.tiers, source=fr.source)
    return np.full(len(np.atleast_1d(tp)), t.value(device.id, _mem_gib(device)))


def custom_allreduce_s(car: CustomAllReduce, nbytes: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Seconds of one custom all-reduce of ``nbytes`` over ``n`` ranks: the measured latency table
    interpolated log-log in the message size (linear in bytes past its largest size, from its last
    segment), and linearly in the rank count between the measured sizes (2, 4, 8)."""
    nbytes = np.maximum(np.asarray(nbytes, dtype=np.float64), 1.0)
    n = np.asarray(n, dtype=np.float64)
    sizes = sorted(car.latency_us)

    def at(ws: int) -> np.ndarray:
        pts = np.array(car.latency_us[ws], dtype=np.float64)
        x, y = np.log(pts[:, 0]), np.log(pts[:, 1])
        inside = np.exp(np.interp(np.log(nbytes), x, y))
        slope = (pts[-1, 1] - pts[-2, 1]) / (pts[-1, 0] - pts[-2, 0])
        beyond = pts[-1, 1] + slope * (nbytes - pts[-1, 0])
        return np.where(nbytes > pts[-1, 0], beyond, inside) * 1e-6

    tables = [at(ws) for ws in sizes]
    out = tables[0]
    for lo, hi, t_lo, t_hi in zip(sizes, sizes[1:], tables, tables[1:], strict=False):
        f = np.clip((n - lo) / (hi - lo), 0.0, 1.0)
        out = np.where(n > lo, t_lo + f * (t_hi - t_lo), out)
    return out


def uses_custom_allreduce(
    car: CustomAllReduce | None,
    nbytes: np.ndarray,
    n: np.ndarray,
    devices_per_node: int,
    fully_connected: bool = True,
) -> np.ndarray:
    """Where the custom kernel runs: a supported rank count inside one node, below the buffer size,
    and on more than two ranks only where every GPU reaches every other directly (NVLink/xGMI, not
    PCIe: ``should_custom_ar``)."""
    n = np.asarray(n, dtype=np.float64)
    if car is None:
        return np.zeros(n.shape, dtype=bool)
    ok = np.isin(n, car.world_sizes) & (n <= devices_per_node) & (np.asarray(nbytes) < car.max_bytes)
    return ok & ((n == 2) | fully_connected)


def describe(b: BackendProfile, device, *, kv_fraction_text: str, offline: bool = False) -> list[str]:
    """The figures this prediction takes from the backend profile, one line each (the assumptions)."""
    mnt = max_num_tokens(b, device, offline)
    out = [
        f"backend {b.name} {b.version} ({b.title}): at most {max_batch(b, device)} sequences per instance; "
        + (
            "token budget per iteration trtllm-bench's B*(1+isl/osl) in [2048, 32768]"
            if mnt is None
            else f"token budget {mnt} tokens per iteration"
        )
        + f"; chunked prefill {'on' if b.scheduler.chunked_prefill.value else 'off'}; KV blocks of "
        f"{b.kv_cache.block_tokens} tokens; KV memory: {kv_fraction_text}",
    ]
    cg = b.cuda_graphs
    if not gpu_rules(b, device) and (cg.modelled or b.all_reduce.custom is not None):
        out.append(
            f"{device.id} ({device.vendor}) is not a GPU {b.name}'s CUDA graphs and custom all-reduce run on: "
            "neither is modelled (NCCL-style all-reduce, no eager term)"
        )
    elif cg.modelled:
        what = (
            "steps above min(2 x max_num_seqs, 512, max_num_batched_tokens) tokens"
            if cg.scope == "tokens"
            else "prefill steps and decode batches above cuda_graph_max_bs"
        )
        out.append(
            f"CUDA graphs: {what} run eager ({cg.kernels_per_layer} kernels per layer x {cg.launch_us:g} us of "
            "host launch where the GPU does not hide it)"
        )
    car = b.all_reduce.custom
    if car is not None and gpu_rules(b, device):
        out.append(
            f"TP all-reduce: {b.name}'s custom one-shot/two-shot kernel below {car.max_bytes / MIB:g} MiB inside "
            f"a node (TP {', '.join(map(str, car.world_sizes))}), at its latency measured on {car.measured_on}"
            + ("" if device.id == car.measured_on else f" (not measured on {device.id})")
            + "; NCCL above"
        )
    if not b.measured:
        out.append(
            f"no serving run of {b.name} on {device.id} was measured: the serving coefficients are the ones "
            "fitted on TensorRT-LLM runs (expected error widened)"
        )
    return out
