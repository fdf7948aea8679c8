"""Device profiles (peak FLOP/s, memory, interconnect, power, achieved efficiency) and clusters.

A :class:`DeviceProfile` is loaded from ``cost_models/devices/<id>.yaml`` (shipped inside the wheel
as ``autopar.cost_models/devices``) or from any YAML file of the same schema ("what-if" hardware).

Units: dense TFLOP/s (no 2:4 sparsity), decimal GB and GB/s, bandwidths **per direction**, W, µs.

Every numeric value carries provenance: ``provenance`` maps a dotted field path
(``"scale_up.agg_gbps"``, ``"peak_tflops.bf16"``, ``"efficiency.gemm.fp8"``) to its source: a
datasheet, a published measurement ([S16], [S17], ... as in ``hardware.md``) or
``"estimate: <why>"``. In a YAML file a numeric leaf may be written inline as
``{value: 989, src: "..."}`` instead of a plain number plus a ``provenance:`` entry; the loader
flattens it. Values that a what-if file leaves to the model defaults get the default's provenance,
and numbers it gives without a source are marked as unsourced values of that file.
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autopar.errors import DeviceError

__all__ = [
    "PRECISIONS",
    "HostIslands",
    "ScaleUp",
    "ScaleOut",
    "Power",
    "Efficiency",
    "MemoryTier",
    "ServingStack",
    "TIER_NAMES",
    "DeviceProfile",
    "Cluster",
    "load_device",
    "list_devices",
    "load_cluster",
]

# Precisions a profile may list in ``peak_tflops`` / ``efficiency.gemm``. ``fp32`` is plain IEEE
# FP32 (CUDA-core / vector peak on NVIDIA, FP32 matrix peak elsewhere); ``tf32`` is NVIDIA/AMD's
# TF32 tensor-core path.
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp32", "tf32", "fp4")

# Keys of ``efficiency.gemm``: the peak precisions, and the block-scaled formats whose achieved rate is
# measured apart from their peak's (MXFP8 runs at the FP8 peak, NVFP4 at the FP4 one, each with its
# own scaling overheads: studies/gemm_rates.py).
GEMM_EFFICIENCY_KEYS: tuple[str, ...] = (*PRECISIONS, "mxfp8", "nvfp4")

# Aliases accepted by :meth:`DeviceProfile.peak_flops` (the data README's precision vocabulary).
_PRECISION_ALIASES = {"mxfp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4", "float32": "fp32", "bfloat16": "bf16"}

# Provenance recorded for a value that a profile leaves to the model default.
DEFAULT_PROVENANCE: dict[str, str] = {
    "power.node_overhead_w": "autopar default: 0 W host overhead (not modelled)",
    "efficiency.gemm_half_dim": "autopar default, estimate: half of max GEMM efficiency at min dim 1024 (H100-class)",
    "efficiency.hbm": "autopar default: 0.8 x peak HBM, as AIConfigurator's empirical mode [S20]",
    "efficiency.attention": "autopar default, estimate: FlashAttention-class kernels at ~60% of dense bf16 peak",
    "efficiency.fused_attention_speedup": "autopar default: 1 (Transformer Engine runs FlashAttention below sm90)",
    "efficiency.sfu_speedup": "autopar default: 1 (16 exponentials per SM per clock, CUDA C++ Programming Guide throughput table)",
}

_DEVICES_PACKAGE = "autopar.cost_models"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class HostIslands(_Frozen):
    """A PCIe node whose devices hang off separate host bridges (CPU sockets / root complexes).

    Devices of one island talk over their own PCIe links (through a PCIe switch or the root
    complex) at the scale-up rate; traffic between islands crosses the host's socket interconnect
    (UPI / xGMI, or NCCL's host-memory path where GPU peer-to-peer is off across sockets), whose
    bandwidth every collective spanning islands shares (:mod:`autopar.collectives`).
    """

    count: int = Field(ge=2, description="islands the scale-up domain splits into evenly")
    link_gbps: float = Field(
        gt=0,
        description="achieved GB/s per direction between islands, shared by all traffic crossing "
        "(a measured bus bandwidth: the scale-up bus efficiency is not applied again)",
    )
    all_to_all_link_gbps: float | None = Field(
        None,
        gt=0,
        description="achieved GB/s per direction between islands under all-to-all traffic, where "
        "every rank exchanges with every other at once (None: link_gbps, the ring collectives' rate)",
    )


class ScaleUp(_Frozen):
    """The fast domain: NVLink/NVSwitch, AMD xGMI, Gaudi on-board RoCE, TPU ICI, or a PCIe node."""

    fabric: str = Field(description="e.g. nvlink4, xgmi, roce-200gbe, ici")
    domain: int = Field(ge=1, description="devices per scale-up domain (8 for HGX, 72 for NVL72)")
    agg_gbps: float = Field(gt=0, description="GB/s per direction, one device to all peers together")
    per_peer_gbps: float = Field(
        gt=0, description="GB/s per direction to ONE peer (== agg_gbps for switched NVLink)"
    )
    switched: bool = Field(description="a switch gives every pair the full per-device rate")
    nvls: bool = Field(False, description="NVSwitch in-network reduction (NVLS/SHARP)")
    latency_us: float = Field(gt=0, description="per-hop / per-collective-step launch + link latency")
    peer_memory: bool = Field(
        True,
        description="devices map each other's memory over the fabric (NVLink, xGMI): what "
        "Transformer Engine's userbuffers comm+GEMM overlap needs; False on PCIe-only nodes",
    )
    host_islands: HostIslands | None = Field(
        None, description="PCIe node split over host bridges/sockets (None: one uniform domain)"
    )
    allreduce_busbw: list[tuple[float, float]] = Field(
        default_factory=list,
        description="measured nccl-tests/rccl-tests all-reduce bus bandwidth over one node's devices: "
        "[(message bytes, GB/s), ...]; a collective inside the domain is never faster than it at its "
        "size (empty: the alpha-beta model alone)",
    )

    @field_validator("allreduce_busbw")
    @classmethod
    def _busbw_curve(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        sizes = [b for b, _ in v]
        if v and (len(v) < 2 or sizes != sorted(set(sizes)) or sizes[0] <= 0 or any(g <= 0 for _, g in v)):
            raise ValueError(
                "needs two or more (bytes, GB/s) points with increasing sizes and positive rates"
            )
        return v

    @model_validator(mode="after")
    def _peer_le_agg(self) -> ScaleUp:
        if self.host_islands is not None and self.domain % self.host_islands.count:
            raise ValueError(
                f"host_islands.count ({self.host_islands.count}) must divide domain ({self.domain})"
            )
        if self.per_peer_gbps > self.agg_gbps * (1 + 1e-9):
            raise ValueError(
                f"per_peer_gbps ({self.per_peer_gbps}) exceeds agg_gbps ({self.agg_gbps}); "
                "one peer cannot get more than the device's aggregate"
            )
        return self


class ScaleOut(_Frozen):
    """The network between scale-up domains (InfiniBand, RoCE, EFA, TPU cross-cube ICI)."""

    fabric: str
    per_device_gbps: float = Field(gt=0, description="GB/s per direction per device (400 Gb/s -> 50.0)")
    latency_us: float = Field(gt=0)


class Power(_Frozen):
    tdp_w: float = Field(gt=0)
    idle_w: float = Field(ge=0)
    node_overhead_w: float = Field(0.0, ge=0, description="per-device share of CPU/NIC/switch/fan power")

    @model_validator(mode="after")
    def _idle_le_tdp(self) -> Power:
        if self.idle_w > self.tdp_w:
            raise ValueError(f"idle_w ({self.idle_w}) exceeds tdp_w ({self.tdp_w})")
        return self


class ServingStack(_Frozen):
    """How a vendor's own serving stack runs an iteration, for machines whose runtime is not a GPU one.

    Statically compiled SRAM, wafer-scale and dataflow systems (Groq, Cerebras, SambaNova) do not pay
    a GPU runtime's kernel launches and NCCL barriers, but a token crosses every layer's place on the
    chips in order: without this section the serving engine uses the GPU-fitted serving coefficients.
    """

    host_step_us: float = Field(
        ge=0, description="host/runtime time per scheduled iteration that the chips wait for"
    )
    host_per_seq_us: float = Field(
        ge=0, description="host/runtime time per in-flight sequence per iteration (sampling, bookkeeping)"
    )
    collective_sync_us: float = Field(
        ge=0, description="fixed cost of each tensor-parallel collective beyond its alpha-beta time"
    )
    layer_latency_us: float = Field(
        ge=0,
        description="pipeline latency each layer adds to a token's path (fill and drain of the layer's "
        "dataflow pipeline and its on-fabric hops), beyond its compute and memory time",
    )
    gemm_tile_rows: float = Field(
        64.0,
        ge=1,
        description="token rows a weight GEMM pays for at least (64: a GPU's MMA tile; 1: a weight-"
        "stationary matrix unit that streams one token vector per pass)",
    )


# Memory tiers, fastest first: on-chip SRAM, HBM (or GDDR), DDR/LPDDR next to the chip, and memory
# outside the system (Cerebras MemoryX, a host's DRAM) that weights stream from.
TIER_NAMES: tuple[str, ...] = ("sram", "hbm", "ddr", "external")


class MemoryTier(_Frozen):
    """One level of a device's memory hierarchy (capacity and peak read bandwidth)."""

    capacity_gb: float = Field(gt=0, description="decimal GB per chip (per system where per_system)")
    bw_gbps: float = Field(
        gt=0, description="peak read bandwidth, GB/s per chip (per system where per_system)"
    )
    per_system: bool = Field(False, description="shared by the whole system (e.g. MemoryX), not per chip")


def _per_precision(v: dict[str, float], top: float, what: str) -> dict[str, float]:
    """A per-precision mapping of ``efficiency``: known keys, every value in (0, top]."""
    unknown = sorted(set(v) - set(GEMM_EFFICIENCY_KEYS))
    if unknown:
        raise ValueError(f"unknown precision(s) {unknown}; allowed: {', '.join(GEMM_EFFICIENCY_KEYS)}")
    bad = {k: x for k, x in v.items() if not 0 < x <= top}  # NaN fails too
    if bad:
        raise ValueError(f"{what} must be in (0, {top:g}]: {bad}")
    return v


class Efficiency(_Frozen):
    """Achieved-efficiency coefficients (fractions of the matching peak)."""

    gemm: dict[str, float] = Field(description="max achieved fraction of dense peak per precision (MAMF)")
    gemm_half_dim: float = Field(1024.0, gt=0, description="GEMM min-dimension at half of max efficiency")
    gemm_half_dim_by_precision: dict[str, float] = Field(
        default_factory=dict,
        description="half-dimension of a precision whose kernels need larger shapes than bf16 to reach "
        "their rate (low-precision GEMMs: studies/gemm_rates.py); absent: gemm_half_dim",
    )
    hbm: float = Field(
        0.8, gt=0, le=1, description="achieved fraction of HBM bandwidth, memory-bound kernels"
    )
    scale_up_bus: float = Field(
        gt=0, le=1, description="achieved ring all-reduce busbw / wire rate in domain"
    )
    scale_out_bus: float = Field(gt=0, le=1, description="achieved fraction of the NIC rate across nodes")
    attention: float = Field(0.6, gt=0, le=1, description="achieved fraction of dense bf16 peak, attention")
    sfu_speedup: float = Field(
        1.0,
        gt=0,
        le=8,
        description="exponential (MUFU.EX2) throughput of the special-function units over the generation's "
        "16 per SM per clock (autopar.hardware.sfu_exp_rate): 2 on Blackwell Ultra",
    )
    fused_attention_speedup: float = Field(
        1.0,
        ge=1,
        description="speed of cuDNN fused attention, which Transformer Engine selects on sm90+, over the "
        "FlashAttention-2 kernel that 'attention' (and its calibration) describes",
    )
    attention_fwd: dict[int, list[tuple[float, float]]] = Field(
        default_factory=dict,
        description="measured causal forward attention (fused FMHA, exponentials included) per head "
        "dimension: [(sequence, achieved fraction of dense bf16 peak), ...] (studies/attention_rates.py); "
        "absent: 'attention' x the SFU exponential bound",
    )

    @field_validator("attention_fwd")
    @classmethod
    def _attention_curve(
        cls, v: dict[int, list[tuple[float, float]]]
    ) -> dict[int, list[tuple[float, float]]]:
        for d, pts in v.items():
            seqs = [s for s, _ in pts]
            if not 0 < d <= 1024 or len(pts) < 2 or seqs != sorted(set(seqs)) or seqs[0] <= 0:
                raise ValueError(
                    f"head dim {d}: needs a head dimension in (0, 1024] and two or more points with "
                    "increasing sequence lengths"
                )
            if not all(0 < f <= 1 for _, f in pts):
                raise ValueError(f"head dim {d}: fractions of peak must be in (0, 1]")
        return v

    @field_validator("gemm_half_dim_by_precision")
    @classmethod
    def _half_dim_keys(cls, v: dict[str, float]) -> dict[str, float]:
        return _per_precision(v, 1e6, "half-dimensions")

    @field_validator("gemm")
    @classmethod
    def _gemm_keys(cls, v: dict[str, float]) -> dict[str, float]:
        if "bf16" not in v:
            raise ValueError("needs a 'bf16' entry (the fallback for precisions without one)")
        return _per_precision(v, 1.0, "efficiencies")


# Special-function-unit rate: 16 exponentials (MUFU.EX2) per clock per SM on compute capability 8.x to
# 10.x (CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table), against 128 FP32 lanes
# per SM on Ada/Hopper/Blackwell and 64 on GA100: SFU ops/s = FP32 peak / 16 (or / 8 on GA100). FA3's
# paper (Shah et al. 2024, arXiv 2407.08608, sec. 3) states 3.9 T exp/s for H100 SXM5; 67 / 16 = 4.2
# from the profile's FP32 peak. Blackwell Ultra doubles it (NVIDIA, "Making Softmax More Efficient with
# NVIDIA Blackwell Ultra": profile field efficiency.sfu_speedup).
SFU_PER_FP32 = 1.0 / 16.0
SFU_PER_FP32_GA100 = 1.0 / 8.0  # A100 SM: 64 FP32 cores, 16 SFU (NVIDIA A100 whitepaper, fig. 7)


def attention_fraction(curve: dict[int, list[tuple[float, float]]], head_dim: float, seq):
    """The measured causal forward attention rate (fraction of dense bf16 peak) at ``head_dim`` and
    sequence ``seq`` (scalar or array): linear in log sequence between the measured points, in log head
    dimension between the measured head dimensions, and held at the end points beyond them (a kernel's
    rate saturates at long sequences; below the shortest measured sequence this is optimistic)."""
    import numpy as np

    s = np.log(np.maximum(np.asarray(seq, dtype=np.float64), 1.0))
    dims = sorted(curve)
    per = [np.interp(s, np.log([p[0] for p in curve[d]]), [p[1] for p in curve[d]]) for d in dims]
    if len(dims) == 1:
        return np.asarray(per[0], dtype=np.float64)
    x = float(np.log(min(max(head_dim, dims[0]), dims[-1])))
    i = int(np.searchsorted(np.log(dims), x, side="right")) - 1
    i = min(max(i, 0), len(dims) - 2)
    w = (x - np.log(dims[i])) / (np.log(dims[i + 1]) - np.log(dims[i]))
    return np.asarray((1.0 - w) * per[i] + w * per[i + 1], dtype=np.float64)


def sfu_exp_rate(device) -> float:
    """Exponentials per second of ``device``'s special-function units (the softmax's exp)."""
    fp32 = device.peak_tflops.get("fp32")
    if fp32 is None:  # no FP32 figure: assume the common 1/16 bf16-to-FP32 ratio of datacenter parts
        fp32 = device.peak_tflops["bf16"] / 16.0
    per = SFU_PER_FP32_GA100 if device.id.startswith("a100") else SFU_PER_FP32
    return float(fp32) * 1e12 * per * device.efficiency.sfu_speedup


class DeviceProfile(_Frozen):
    """One accelerator type: peaks, memory, interconnect, power and achieved efficiencies."""

    id: str
    name: str
    vendor: str
    peak_tflops: dict[str, float] = Field(description="dense TFLOP/s per precision")
    memory_gb: float = Field(gt=0, description="decimal GB (vendor label; GiB labels converted)")
    memory_bw_gbps: float = Field(gt=0, description="peak HBM bandwidth, GB/s")
    scale_up: ScaleUp
    scale_out: ScaleOut
    power: Power
    efficiency: Efficiency
    memory_kind: str = Field(
        "hbm",
        description="the tier memory_gb/memory_bw_gbps describe: where serving keeps weights and KV "
        "(hbm for GPUs, sram for SRAM-only chips such as Groq or a Cerebras wafer)",
    )
    memory_tiers: dict[str, MemoryTier] = Field(
        default_factory=dict,
        description="the other tiers of the hierarchy (sram, hbm, ddr, external); omitted: one HBM tier",
    )
    chips_per_system: int | None = Field(
        None,
        ge=1,
        description="chips in the unit sold and powered as one system (None: the scale-up domain); "
        "its power beyond the chips is power.node_overhead_w per chip",
    )
    runtime_reserve_gb: float | None = Field(
        None,
        ge=0,
        description="serving runtime reserve in device memory (None: the calibration's framework reserve; "
        "0 for statically compiled SRAM machines)",
    )
    serving: ServingStack | None = Field(
        None, description="the vendor serving stack's own per-iteration costs (None: GPU-fitted coefficients)"
    )
    provenance: dict[str, str] = Field(description="dotted field path -> source")

    @field_validator("peak_tflops")
    @classmethod
    def _peak_keys(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(PRECISIONS))
        if unknown:
            raise ValueError(f"unknown precision(s) {unknown}; allowed: {', '.join(PRECISIONS)}")
        if "bf16" not in v:
            raise ValueError("needs a 'bf16' peak")
        bad = {k: x for k, x in v.items() if not (x > 0 and math.isfinite(x))}
        if bad:
            raise ValueError(f"peaks must be positive: {bad}")
        return v

    @field_validator("memory_tiers")
    @classmethod
    def _tier_keys(cls, v: dict[str, MemoryTier]) -> dict[str, MemoryTier]:
        unknown = sorted(set(v) - set(TIER_NAMES))
        if unknown:
            raise ValueError(f"unknown memory tier(s) {unknown}; allowed: {', '.join(TIER_NAMES)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> DeviceProfile:
        if self.memory_kind not in TIER_NAMES:
            raise ValueError(f"memory_kind {self.memory_kind!r} is not one of {', '.join(TIER_NAMES)}")
        if self.memory_kind in self.memory_tiers:
            raise ValueError(
                f"memory_tiers repeats {self.memory_kind!r}, which memory_gb/memory_bw_gbps already describe"
            )
        extra = sorted(
            k for k in self.efficiency.gemm if _PRECISION_ALIASES.get(k, k) not in self.peak_tflops
        )
        if extra:
            raise ValueError(f"efficiency.gemm lists {extra}, which have no peak_tflops entry")
        known = set(_field_paths(self))
        stray = sorted(k for k in self.provenance if k not in known)
        if stray:
            raise ValueError(f"provenance keys name no field: {stray}")
        return self

    def __hash__(self) -> int:  # dict fields make the generated frozen hash fail
        return hash(self.model_dump_json())

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def system_chips(self) -> int:
        """Chips per system (``chips_per_system``, else the scale-up domain)."""
        return self.chips_per_system or self.scale_up.domain

    def tiers(self) -> dict[str, MemoryTier]:
        """Every memory tier, fastest first; the home tier (``memory_kind``) from memory_gb/_bw_gbps."""
        home = MemoryTier(capacity_gb=self.memory_gb, bw_gbps=self.memory_bw_gbps)
        allt = self.memory_tiers | {self.memory_kind: home}
        return {k: allt[k] for k in TIER_NAMES if k in allt}

    def resolve_precision(self, precision: str) -> str:
        """The ``peak_tflops`` key used for ``precision`` (fp16 falls back to bf16)."""
        p = precision.strip().lower()
        p = _PRECISION_ALIASES.get(p, p)
        if p not in PRECISIONS:
            raise DeviceError(
                f"unknown precision {precision!r} for device {self.id!r}",
                hint=f"use one of {', '.join(PRECISIONS)}",
            )
        if p in self.peak_tflops:
            return p
        if p == "fp16":
            return "bf16"
        raise DeviceError(
            f"device {self.id!r} has no {p} peak ({self.name} does not support {p} at tensor-core rate)",
            hint=f"choose one of {', '.join(sorted(self.peak_tflops))} or another device",
        )

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for ``precision``; raises DeviceError if the device lacks it."""
        return self.peak_tflops[self.resolve_precision(precision)] * 1e12

    def gemm_efficiency(self, precision: str) -> float:
        """Max achieved GEMM fraction of peak for ``precision`` (falls back to the bf16 value)."""
        p = self.resolve_precision(precision)
        return self.efficiency.gemm.get(p, self.efficiency.gemm["bf16"])

    def numeric_fields(self) -> list[str]:
        """Dotted paths of every numeric value in the profile (what provenance must cover)."""
        return [path for path, value in _leaves(self) if _is_number(value)]

    def missing_provenance(self) -> list[str]:
        return [p for p in self.numeric_fields() if not self.provenance.get(p, "").strip()]


# ----------------------------------------------------------------------------------------------
# field-path helpers


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, BaseModel):
        for name in type(obj).model_fields:
            if name == "provenance":
                continue
            yield from _leaves(getattr(obj, name), f"{prefix}{name}.")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], obj


def _field_paths(profile: DeviceProfile) -> list[str]:
    return [path for path, _ in _leaves(profile)]


def _flatten_inline(data: Any, path: str, prov: dict[str, str], where: str) -> Any:
    """Replace ``{value: x, src: "..."}`` leaves by ``x`` and record ``prov[path] = src``."""
    if isinstance(data, dict):
        if "value" in data and set(data) <= {"value", "src"}:
            src = data.get("src")
            if not isinstance(src, str) or not src.strip():
                raise DeviceError(
                    f"{where}: key {path!r} has a value but no 'src'",
                    hint="write {value: <number>, src: <datasheet, measurement or 'estimate: why'>}",
                )
            prov[path] = src.strip()
            return data["value"]
        return {
            k: _flatten_inline(v, f"{path}.{k}" if path else str(k), prov, where) for k, v in data.items()
        }
    return data


def _format_validation(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<top level>"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# loading


def _devices_dir() -> Any:
    """``autopar.cost_models/devices`` when installed; the repository's cost_models/ otherwise."""
    try:
        return resources.files(_DEVICES_PACKAGE) / "devices"
    except ModuleNotFoundError:  # running from a source checkout without installing
        return Path(__file__).resolve().parent.parent / "cost_models" / "devices"


@functools.lru_cache(maxsize=1)
def _builtin_files() -> dict[str, Any]:
    d = _devices_dir()
    try:
        return {f.name[: -len(".yaml")]: f for f in d.iterdir() if f.name.endswith(".yaml")}
    except (FileNotFoundError, NotADirectoryError):
        raise DeviceError(
            f"the device catalogue {d} is missing",
            hint="reinstall autopar (the wheel must ship autopar.cost_models/devices/*.yaml)",
        ) from None


def list_devices() -> list[str]:
    """Ids of the shipped device profiles, sorted."""
    return sorted(_builtin_files())


def _parse(text: str, where: str, *, builtin: bool) -> DeviceProfile:
    from autopar.errors import FileError
    from autopar.files import parse_yaml, validation_message

    try:
        raw = parse_yaml(text, where)
    except FileError as exc:  # keep the device error type (and "malformed YAML" wording)
        raise DeviceError(exc.message.replace("not valid YAML", "malformed YAML"), hint=exc.hint) from None
    if not isinstance(raw, dict):
        raise DeviceError(
            f"{where}: a device profile must be a YAML mapping, got {type(raw).__name__}",
            hint="see cost_models/devices/h100-sxm-80gb.yaml for the schema",
        )
    body = {k: v for k, v in raw.items() if k != "provenance"}
    explicit = raw.get("provenance") or {}
    if not isinstance(explicit, dict):
        raise DeviceError(f"{where}: key 'provenance' must map field paths to source strings")
    inline: dict[str, str] = {}
    body = _flatten_inline(body, "", inline, where)
    dup = sorted(set(inline) & set(explicit))
    if dup:
        raise DeviceError(f"{where}: provenance given twice (inline src and provenance map) for {dup}")
    prov = {str(k): str(v) for k, v in explicit.items()} | inline
    try:
        profile = DeviceProfile.model_validate(body | {"provenance": prov})
    except ValidationError as exc:
        raise DeviceError(
            validation_message(exc, f"{where}: invalid device profile", DeviceProfile),
            hint="see cost_models/devices/h100-sxm-80gb.yaml for the schema",
        ) from None

    missing = profile.missing_provenance()
    if missing:
        if builtin:
            raise DeviceError(f"{where}: numeric values without provenance: {missing}")
        fill = {}
        for path in missing:
            given = _has_path(body, path)
            fill[path] = (
                f"unsourced value in what-if file {where}"
                if given
                else DEFAULT_PROVENANCE.get(path, "autopar default")
            )
        profile = profile.model_copy(update={"provenance": profile.provenance | fill})
    return profile


def _has_path(data: Any, path: str) -> bool:
    for key in path.split("."):
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


@functools.lru_cache(maxsize=64)
def _load_builtin(device_id: str) -> DeviceProfile:
    f = _builtin_files()[device_id]
    where = f"cost_models/devices/{f.name}"
    profile = _parse(f.read_text(encoding="utf-8"), where, builtin=True)
    if profile.id != device_id:
        raise DeviceError(f"{where}: id {profile.id!r} does not match the file name {device_id!r}")
    return profile


@functools.lru_cache(maxsize=64)
def _load_path(path: str, mtime_ns: int) -> DeviceProfile:  # mtime in the key: edits are reloaded
    from autopar.errors import FileError
    from autopar.files import read_text

    try:
        text = read_text(path, "device profile file", "give a device YAML file or a device id")
    except FileError as exc:
        raise DeviceError(exc.message, hint=exc.hint) from None
    return _parse(text, path, builtin=False)


def _looks_like_path(s: str) -> bool:
    return s.endswith((".yaml", ".yml")) or "/" in s or "\\" in s


def load_device(id_or_path: str | Path) -> DeviceProfile:
    """A shipped profile by id (case-insensitive) or a what-if profile from a YAML path."""
    if isinstance(id_or_path, Path) or _looks_like_path(str(id_or_path)):
        p = Path(id_or_path).expanduser()
        if not p.exists():
            raise DeviceError(
                f"device profile file {str(p)!r} not found",
                hint=f"give an existing YAML file or one of the device ids: {', '.join(list_devices())}",
            )
        return _load_path(str(p.resolve()), p.stat().st_mtime_ns)
    key = str(id_or_path).strip().lower()
    known = list_devices()
    if key not in known:
        close = [k for k in known if key and k.startswith(key)] or difflib.get_close_matches(
            key, known, n=2, cutoff=0.6
        )
        guess = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise DeviceError(
            f"unknown device {str(id_or_path)!r}",
            hint=f"{guess}known devices: {', '.join(known)}; or pass a path to a YAML device profile",
        )
    return _load_builtin(key)


# ----------------------------------------------------------------------------------------------
# clusters


class Cluster(_Frozen):
    """``num_devices`` accelerators of one type, in fast domains of ``devices_per_node``.

    ``devices_per_node`` is the size of the scale-up domain actually used (8 for an HGX box, up to
    72 for an NVL72 rack); it defaults to the device's ``scale_up.domain``, may not exceed it, and
    must divide ``num_devices``. A job smaller than one domain uses ``num_devices`` of it.
    """

    device: DeviceProfile
    num_devices: int
    devices_per_node: int = 0  # 0 -> the device's scale-up domain (resolved on construction)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise DeviceError(f"invalid cluster: {_format_validation(exc)}") from None

    @field_validator("devices_per_node", mode="before")
    @classmethod
    def _none_is_default(cls, v: Any) -> Any:
        return 0 if v is None else v

    @model_validator(mode="after")
    def _resolve(self) -> Cluster:
        device, n, dpn = self.device, self.num_devices, self.devices_per_node
        dev_id, domain = device.id, device.scale_up.domain
        if n <= 0:
            raise DeviceError(
                f"a cluster of {n} {dev_id} devices is impossible", hint="num_devices must be at least 1"
            )
        if dpn < 0:
            raise DeviceError(
                f"devices_per_node={dpn} is negative",
                hint=f"omit it to use the {dev_id} scale-up domain ({domain})",
            )
        dpn = dpn or domain
        if dpn > domain:
            raise DeviceError(
                f"devices_per_node={dpn} exceeds the {dev_id} scale-up domain of {domain} "
                f"({device.scale_up.fabric})",
                hint=f"use devices_per_node <= {domain}",
            )
        if n < dpn:
            dpn = n  # a job smaller than one domain: one partial node
        elif n % dpn:
            lower, upper = (n // dpn) * dpn, (n // dpn + 1) * dpn
            divisor = next(d for d in range(dpn, 0, -1) if n % d == 0)
            raise DeviceError(
                f"{n} {dev_id} devices do not fill whole nodes of {dpn}",
                hint=f"use {lower} or {upper} devices, or devices_per_node={divisor}",
            )
        object.__setattr__(self, "devices_per_node", dpn)  # frozen: resolve the default once, here
        return self

    @property
    def num_nodes(self) -> int:
        return self.num_devices // self.devices_per_node


def load_cluster(
    device: str | Path | DeviceProfile, num_devices: int, devices_per_node: int | None = None
) -> Cluster:
    """A :class:`Cluster` of ``num_devices`` of ``device`` (an id, a YAML path or a profile)."""
    profile = device if isinstance(device, DeviceProfile) else load_device(device)
    return Cluster(device=profile, num_devices=num_devices, devices_per_node=devices_per_node)
