"""Calibration files: fitted coefficients per device type, with their provenance.

A calibration file (YAML) overrides the efficiency coefficients of device profiles. The shipped
default, ``cost_models/calibration/default.yaml``, was fitted to the published runs (see
docs/calibration.md, "How the coefficients were obtained"); ``autopar calibrate`` writes files of the same schema from
local microbenchmarks and ``--calibration FILE`` selects one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autopar.blocks.stage import recurrent_kinds
from autopar.errors import AutoparError
from autopar.frameworks import FrameworkProfile
from autopar.latency import Coefficients
from autopar.memory import COMM_BUFFER_BYTES, FRAGMENTATION, FRAMEWORK_RESERVE_BYTES, GIB

# Coefficients that are not device properties (how runtimes overlap communication with compute).
GLOBAL_DEFAULTS: dict[str, float] = {
    "overlap_contention": 0.15,  # compute slowdown per second of overlapped communication
    "kernel_overhead_us": 30.0,  # per layer per micro-batch (fwd+bwd+recompute launches and syncs)
    "tp_overlap": 0.0,  # fraction of TP/SP communication hidden behind GEMMs
    "tp_collective_overhead_us": 0.0,  # software cost per TP/SP collective beyond the link alpha (DTensor/gloo)
    # What a training stack's small GEMMs lose beyond the measured kernels' shape law: a factor on every
    # device's measured GEMM half-dimensions (profile efficiency.gemm_half_dim[_by_precision]).
    "half_dim_scale": 1.0,
    # Share of a MoE layer's per-local-expert GEMM launches the device waits for (latency.stage_slot):
    # the layer's device-to-host token-count copy stops the host from running ahead. 0: not charged.
    "moe_host_factor": 0.0,
    # The training stack's attention kernels (forward + backward) relative to the measured forward
    # FMHA of the device profile (efficiency.attention_fwd): one factor for every device that has one.
    "attention_scale": 1.0,
    # Memory model constants of the runtime: the CUDA + NCCL figures of autopar/memory.py (their one
    # definition, with sources), in the units of a calibration file's ``global`` section.
    "framework_reserve_gib": FRAMEWORK_RESERVE_BYTES / GIB,
    "comm_buffer_gb": COMM_BUFFER_BYTES / 1e9,
    "fragmentation": FRAGMENTATION,
}


# The range of every global coefficient a calibration may set (inclusive). A fraction is in [0, 1];
# overlap_contention is a slowdown per second of hidden communication (CPU/gloo refits reach ~8);
# fragmentation is the allocator's slack over the activations (a CPU refit may fit it negative).
GLOBAL_RANGES: dict[str, tuple[float, float]] = {
    "overlap_contention": (0.0, 20.0),
    "kernel_overhead_us": (0.0, 1e6),
    "tp_overlap": (0.0, 1.0),
    "tp_collective_overhead_us": (0.0, 1e6),
    "half_dim_scale": (0.05, 50.0),
    "moe_host_factor": (0.0, 20.0),
    "attention_scale": (0.05, 2.0),
    "framework_reserve_gib": (0.0, 1024.0),
    "comm_buffer_gb": (0.0, 1024.0),
    "fragmentation": (-1.0, 1.0),
    # The serving runtime's overrides (autopar.serving.estimate.ServingCoefficients, whose defaults
    # they replace; absent from GLOBAL_DEFAULTS, which training reads).
    "serving_host_step_us": (0.0, 1e6),
    "serving_host_per_seq_us": (0.0, 1e6),
    "serving_collective_sync_us": (0.0, 1e6),
    "serving_runtime_reserve_gb": (0.0, 1024.0),
    "serving_prefill_attention_eff": (0.01, 1.05),
}
# An achieved efficiency is a fraction of a peak: (0, 1.05] (5% slack over a datasheet peak).
MAX_EFFICIENCY = 1.05
# autopar.hardware.PRECISIONS and the block-scaled layout precisions a fit may calibrate on their own
GEMM_PRECISIONS = ("bf16", "fp16", "fp8", "fp32", "tf32", "fp4", "mxfp8", "nvfp4")


class DeviceCoefficients(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    gemm: dict[str, float] = Field(
        default_factory=dict,
        description=f"achieved GEMM fraction of peak per precision, (0, {MAX_EFFICIENCY}]",
    )
    gemm_half_dim: float | None = Field(None, gt=0, le=1e6)
    attention: float | None = Field(None, gt=0, le=MAX_EFFICIENCY)
    hbm: float | None = Field(None, gt=0, le=MAX_EFFICIENCY)
    scale_up_bus: float | None = Field(None, gt=0, le=MAX_EFFICIENCY)
    scale_out_bus: float | None = Field(None, gt=0, le=MAX_EFFICIENCY)
    scale_up_latency_us: float | None = Field(None, ge=0, le=1e7)
    scale_out_latency_us: float | None = Field(None, ge=0, le=1e7)

    @field_validator("gemm")
    @classmethod
    def _gemm(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(GEMM_PRECISIONS))
        if unknown:
            raise ValueError(f"unknown precision {unknown[0]!r}; allowed: {', '.join(GEMM_PRECISIONS)}")
        bad = {k: x for k, x in v.items() if not 0 < x <= MAX_EFFICIENCY}  # NaN fails too
        if bad:
            k = next(iter(bad))
            raise ValueError(f"gemm.{k} = {bad[k]} is not an efficiency in (0, {MAX_EFFICIENCY}]")
        return v


# The training stack whose rows set a calibration's global coefficients (autopar.job.Framework).
REFERENCE_STACK = "megatron"


class StackCoefficients(BaseModel):
    """Coefficients of one training stack (``autopar.job.Framework``) that differ from the global ones.

    ``overlap_contention``: how much a second of communication hidden behind compute still slows
    that compute, for this stack's overlap mechanism (DeepSpeed's host-synchronized ZeRO-3 fetches,
    FSDP's prefetching streams, Megatron's bucketed overlap). None: see
    :meth:`Calibration.stack_value`. (A per-stack kernel overhead was tried and went to the same
    bound for every stack: the host cost per layer stays global.)
    """

    model_config = ConfigDict(extra="forbid")
    overlap_contention: float | None = Field(None, ge=0.0, le=1.0)


class Transfer(BaseModel):
    """How fitted coefficients carry over to devices that were not in the fit.

    ``same_silicon`` maps a device id to a fitted one with the same compute die (H200 and H800 are
    GH100 like the H100): compute efficiencies are taken over unchanged, while memory, links and
    power stay the device's own. Other devices get their profile's published efficiencies scaled
    by the fitted/published ratios, i.e. by how far real training stacks fall short of
    microbenchmarks on the devices that were measured.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    same_silicon: dict[str, str] = Field(default_factory=dict)
    # device id -> compute die (e.g. h100-sxm-80gb, h200-sxm-141gb -> gh100): a fit gives every device
    # of one die the same compute coefficients (one die, one coefficient), fitted on all its rows.
    dies: dict[str, str] = Field(default_factory=dict)
    gemm_ratio: float = Field(1.0, gt=0, le=10)
    attention_ratio: float = Field(1.0, gt=0, le=10)


class Calibration(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)
    schema_: Literal["autopar.calibration/v1"] = Field("autopar.calibration/v1", alias="schema")
    provenance: dict[str, Any] = Field(default_factory=dict)
    global_: dict[str, float] = Field(default_factory=dict, alias="global")
    transfer: Transfer = Field(default_factory=Transfer)
    devices: dict[str, DeviceCoefficients] = Field(default_factory=dict)
    stacks: dict[str, StackCoefficients] = Field(default_factory=dict)

    @field_validator("global_")
    @classmethod
    def _global(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if k not in GLOBAL_RANGES:
                raise ValueError(f"unknown global coefficient {k!r}; allowed: {', '.join(GLOBAL_RANGES)}")
            lo, hi = GLOBAL_RANGES[k]
            if not lo <= x <= hi:  # NaN fails too
                raise ValueError(f"global.{k} = {x} is outside [{lo:g}, {hi:g}]")
        return v

    def device(self, device_id: str) -> DeviceCoefficients:
        """Fitted coefficients of a device, or ones carried over from the fit (see Transfer)."""
        if device_id in self.devices:
            return self.devices[device_id]
        # (a die-mode fit writes every member of a fitted die, each on its own rates: nothing to carry)
        twin = self.transfer.same_silicon.get(device_id)
        if twin in self.devices:
            d = self.devices[twin]
            return DeviceCoefficients(gemm=dict(d.gemm), gemm_half_dim=d.gemm_half_dim, attention=d.attention)
        return DeviceCoefficients()

    def global_value(self, key: str) -> float:
        return float(self.global_.get(key, GLOBAL_DEFAULTS[key]))

    def stack_value(self, stack: str | None, key: str) -> float:
        """A stack's own coefficient where the calibration has one; else, for the reference stack
        (Megatron, whose rows set the global values) the global value, and for any other stack the
        most conservative overlap contention of the stacks that were measured: a stack whose
        overlap was never seen is not assumed to overlap better than the worst one that was."""
        sc = self.stacks.get(stack) if stack else None
        v = getattr(sc, key) if sc is not None else None
        if v is not None:
            return float(v)
        g = self.global_value(key)
        if stack is None or stack == REFERENCE_STACK:
            return g
        known = [getattr(c, key) for c in self.stacks.values() if getattr(c, key) is not None]
        return float(max([g, *known]))


def default_calibration_path() -> Path:
    return Path(str(resources.files("autopar.cost_models") / "calibration" / "default.yaml"))


# Blocks every calibration file must have (transfer and provenance are optional).
REQUIRED_BLOCKS = ("schema", "global", "devices")
SCHEMA_HINT = "see cost_models/calibration/default.yaml for the schema"


def parse_calibration(text: str, where: str) -> Calibration:
    """A calibration from YAML text: every block present, keys known, values in range."""
    from autopar.files import parse_yaml, require_mapping, validation_message

    raw = require_mapping(
        parse_yaml(text, f"calibration file {where}"), f"calibration file {where}", SCHEMA_HINT
    )
    missing = [b for b in REQUIRED_BLOCKS if b not in raw]
    if missing:
        raise AutoparError(f"calibration file {where}: required block {missing[0]!r} is missing", SCHEMA_HINT)
    for block in ("global", "devices", "transfer", "provenance"):
        if block in raw and raw[block] is None:
            raw[block] = {}
    try:
        return Calibration.model_validate(raw)
    except ValidationError as exc:
        raise AutoparError(
            validation_message(exc, f"calibration file {where}", Calibration), SCHEMA_HINT
        ) from None


@lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int = 0) -> Calibration:  # mtime in the key: edits are reloaded
    from autopar.files import read_text

    return parse_calibration(read_text(path, "calibration file", "pass an existing --calibration FILE"), path)


def load_calibration(path: str | Path | None = None) -> Calibration:
    """The calibration at ``path``, or the shipped default (an empty one if none ships)."""
    if path is None:
        p = default_calibration_path()
        return _load(str(p), _mtime(p)) if p.is_file() else Calibration()
    if str(path).strip() == "":
        raise AutoparError(
            "--calibration is empty", "pass a calibration YAML file, or omit it for the shipped one"
        )
    p = Path(path).expanduser().resolve()
    return _load(str(p), _mtime(p))


def _mtime(p: Path) -> int:
    try:
        return p.stat().st_mtime_ns
    except OSError:
        return 0


def expected_error_path() -> Path:
    """The shipped out-of-sample error table (written by ``studies/accuracy.py --write-expected-error``)."""
    return Path(str(resources.files("autopar.cost_models") / "calibration" / "expected_error.yaml"))


@lru_cache(maxsize=4)
def _expected_error_table(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        return {}
    return yaml.load(p.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


# The ways a prediction can reach beyond what the shipped fit measured, in the order the basis text
# names them. Each widens the expected error by its own factor (the table's ``widening``), fitted on
# the held-out rows of the leave-one-source-out and leave-one-device-out refits. Nested kinds are
# not counted twice: a precision is judged only on a measured device, a model class and a scale only
# on a measured stack.
EXTRAPOLATIONS: dict[str, str] = {
    "device": "device never measured",
    "precision": "precision never measured on this device",
    "stack": "training stack with too few measured runs",
    "model_class": "model class with too few measured runs on this stack",
    "scale": "more devices than measured on this stack",
}
EXPECTED_ERROR_SCHEMA = "autopar.expected_error/v2"
# A routed MoE with at least this many experts counts as fine-grained (many small experts: its
# dispatch, grouped GEMMs and all-to-all behave unlike a few large experts).
FINE_GRAINED_EXPERTS = 64


def model_class(model: Any) -> str:
    """``hybrid``, ``dense``, ``moe`` or ``moe-fine`` (>= FINE_GRAINED_EXPERTS routed experts) of a
    ModelSpec. ``hybrid``: a recurrent token mixer (a Mamba SSM or linear attention) in some blocks,
    MoE or not; its held-out error is its own (Nemotron 3 Nano and Super: 1.1-1.6x too fast on every
    device they ran on), not a fine-grained MoE's."""
    if hasattr(model, "layers") and recurrent_kinds(model):  # the block registry's recurrent mixers
        return "hybrid"
    n = int(getattr(model, "num_experts", 0) or 0)
    if n <= 0:
        return "dense"
    return "moe-fine" if n >= FINE_GRAINED_EXPERTS else "moe"


def _gemm_key(precision: str) -> str:
    return "bf16" if precision == "fp16" else precision


def extrapolations(
    device_id: str,
    cal: Calibration,
    domain: dict[str, Any],
    *,
    stack: str | None = None,
    precision: str | None = None,
    model_cls: str | None = None,
    num_devices: int | None = None,
) -> tuple[str, ...]:
    """The kinds of :data:`EXTRAPOLATIONS` a prediction makes.

    The device and its precision are judged by ``cal`` (fitted rates of the device or of its
    same-silicon twin, and a fitted GEMM rate at that precision); the stack, the model class and
    the device count by ``domain``, the rows the fit saw (``{"min_rows": n, "stacks": {stack:
    {"rows": n, "max_devices": n, "classes": {class: n}}}}``, as ``expected_error.yaml`` records
    them). Arguments left None are not judged.
    """
    kinds: list[str] = []
    gemm = cal.device(device_id).gemm
    if not gemm:
        kinds.append("device")
    elif precision is not None and _gemm_key(precision) not in {_gemm_key(k) for k in gemm}:
        kinds.append("precision")
    if stack is not None:
        min_rows = int(domain.get("min_rows", 1))
        st = (domain.get("stacks") or {}).get(stack) or {}
        if int(st.get("rows", 0)) < min_rows:
            kinds.append("stack")
        else:
            if model_cls is not None and int((st.get("classes") or {}).get(model_cls, 0)) < min_rows:
                kinds.append("model_class")
            if num_devices is not None and num_devices > int(st.get("max_devices", 0)):
                kinds.append("scale")
    return tuple(kinds)


@dataclass(frozen=True)
class ExpectedError:
    """The 90th percentile of |relative error| of tokens/s that a prediction quotes, and its basis.

    ``basis`` is ``out_of_sample`` (the leave-one-source-out and leave-one-device-out refits of the
    published runs: each run's error under coefficients fitted without its source or device) or
    ``in_sample`` (a calibration's own fit residuals, a lower bound); ``group`` names the runs the
    base figure comes from (``stack NAME``, ``all``, or for in-sample ``device ID``) and ``rows``
    how many there were. ``widened_by``: the :data:`EXTRAPOLATIONS` this prediction makes, whose
    factors (product ``factor``) widened the base figure to ``p90``.
    """

    p90: float
    basis: str
    group: str
    rows: int
    widened_by: tuple[str, ...] = ()
    factor: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "basis": self.basis,
            "group": self.group,
            "rows": self.rows,
            "widened_by": list(self.widened_by),
            "factor": round(self.factor, 4),
        }

    def describe(self) -> str:
        runs = "held-out runs" if self.basis == "out_of_sample" else "fitted runs"
        kind = "out-of-sample" if self.basis == "out_of_sample" else "in-sample"
        text = f"within ±{self.p90:.0%} on 90% of {runs} ({kind}, {self.group}, {self.rows} runs)"
        if self.widened_by:
            text += f"; widened x{self.factor:.2f} for: " + ", ".join(
                EXTRAPOLATIONS[k] for k in self.widened_by
            )
        return text


def stack_class_key(stack: str | None, model_cls: str | None) -> str:
    """The key of a (training stack, model class) base entry: ``megatron/moe-fine``."""
    return f"{stack}/{model_cls}"


def base_entry(
    base: dict[str, Any], stack: str | None, model_cls: str | None = None
) -> tuple[dict[str, Any] | None, str]:
    """(entry, group name) of the most specific base figure a prediction has: its training stack and
    model class, else its stack, else all in-domain held-out runs."""
    if stack and model_cls:
        entry = (base.get("stack_class") or {}).get(stack_class_key(stack, model_cls))
        if entry:
            return entry, f"stack {stack}, {model_cls}"
    entry = (base.get("stack") or {}).get(stack) if stack else None
    if entry:
        return entry, f"stack {stack}"
    return base.get("all"), "all"


def lookup_expected_error(
    table: dict[str, Any], stack: str | None, kinds: tuple[str, ...] = (), model_cls: str | None = None
) -> ExpectedError | None:
    """The out-of-sample figure of an ``autopar.expected_error/v2`` table: the base p90 of the
    prediction's training stack and model class (or of its stack, or of all in-domain held-out runs,
    where those had too few: :func:`base_entry`), times the widening factor of every extrapolation
    kind in ``kinds``."""
    if table.get("schema") != EXPECTED_ERROR_SCHEMA:
        return None
    entry, group = base_entry(table.get("base") or {}, stack, model_cls)
    if not entry:
        return None
    widening = table.get("widening") or {}
    factor = 1.0
    for k in kinds:
        factor *= float((widening.get(k) or {}).get("factor", 1.0))
    return ExpectedError(
        round(float(entry["p90_ape"]) * factor, 4),
        "out_of_sample",
        group,
        int(entry["rows"]),
        tuple(kinds),
        factor,
    )


def expected_error(
    device_id: str,
    cal: Calibration | None = None,
    stack: str | None = None,
    *,
    precision: str | None = None,
    model: Any = None,
    num_devices: int | None = None,
) -> ExpectedError | None:
    """The error a prediction on ``device_id`` (training ``stack``, GEMM ``precision``, ModelSpec
    ``model``, ``num_devices``) should expect, and its basis.

    Under the shipped calibration: the out-of-sample table (:func:`expected_error_path`), widened
    for every way the prediction extrapolates (:func:`extrapolations`; arguments left None are
    not judged). Under any other calibration that table does not describe it, so its own in-sample
    fit residuals on this device (or its same-silicon twin) answer, if it records any.
    """
    shipped = load_calibration()
    cal = cal or shipped
    twin = cal.transfer.same_silicon.get(device_id)
    if cal == shipped:
        table = _expected_error_table(str(expected_error_path()))
        cls = model_class(model) if model is not None else None
        kinds = extrapolations(
            device_id,
            cal,
            table.get("domain") or {},
            stack=stack,
            precision=precision,
            model_cls=cls,
            num_devices=num_devices,
        )
        found = lookup_expected_error(table, stack, kinds, cls)
        if found is not None:
            return found
    res = cal.provenance.get("residuals") or {}
    key = device_id if device_id in res else twin
    entry = res.get(key) if key else None
    if not isinstance(entry, dict) or "p90_ape" not in entry:
        return None
    group = f"device {key}" + ("" if key == device_id else " (same silicon)")
    return ExpectedError(float(entry["p90_ape"]), "in_sample", group, int(entry.get("rows", 0)))


def coefficient_source(device_id: str, cal: Calibration | None = None) -> str:
    """Where a device's time-model coefficients come from (shown with every prediction).

    A prediction for a device that was never measured rests on transferred coefficients; the
    user should treat it as less certain and validate it (``autopar validate``) before relying on it.
    """
    cal = cal or load_calibration()
    data = cal.provenance.get("data", "measurements")
    if device_id in cal.devices:
        return f"fitted ({data})"
    twin = cal.transfer.same_silicon.get(device_id)
    if twin in cal.devices:
        return f"same silicon as {twin} (fitted on {data})"
    return (
        "published efficiencies x fitted/published ratio (device not measured: validate before relying on it)"
    )


def _memory_constants(value: Any) -> dict[str, float]:
    return {
        "framework_reserve_bytes": value("framework_reserve_gib") * 2**30,
        "comm_buffer_bytes": value("comm_buffer_gb") * 1e9,
        "fragmentation": value("fragmentation"),
    }


def memory_constants(
    cal: Calibration | None = None, profile: FrameworkProfile | None = None
) -> dict[str, float]:
    """Keyword arguments of :func:`autopar.memory.memory_breakdown` from a calibration.

    A value the calibration file sets wins (it measured its runtime, e.g. CPU/gloo); otherwise the
    training stack's ``profile`` gives the reserve and the fragmentation (default: GLOBAL_DEFAULTS,
    Megatron's).
    """
    cal = cal or load_calibration()
    own = (
        {
            "framework_reserve_gib": profile.framework_reserve_gib,
            "fragmentation": profile.fragmentation,
        }
        if profile is not None
        else {}
    )

    def value(key: str) -> float:
        if key in cal.global_:
            return float(cal.global_[key])
        return float(own.get(key, GLOBAL_DEFAULTS[key]))

    return _memory_constants(value)


# The same without a calibration file (what every calibration that does not set them uses).
DEFAULT_MEMORY_CONSTANTS: dict[str, float] = _memory_constants(GLOBAL_DEFAULTS.__getitem__)


def _exp_rate(device) -> float:
    """The softmax exponential rate charged in attention: NVIDIA's SFU rate (16 MUFU.EX2 per SM per clock,
    :func:`autopar.hardware.sfu_exp_rate`); 0 (not charged separately) on other vendors' parts, whose
    transcendental units autopar has no sourced figure for, and on CPUs."""
    if device.vendor != "nvidia":
        return 0.0
    from autopar.hardware import sfu_exp_rate

    return sfu_exp_rate(device)


def _attention_eff(dc, eff) -> float:
    """One attention efficiency for the models that take a scalar (serving, calibrate's report): the
    calibration's where it has one; else the measured forward kernel at head dim 128 and 8k tokens
    (efficiency.attention_fwd) where the profile has that curve; else the profile's estimate."""
    if dc.attention is not None:
        return float(dc.attention)
    if eff.attention_fwd:
        from autopar.hardware import attention_fraction

        return float(attention_fraction(eff.attention_fwd, 128.0, 8192.0))
    return float(eff.attention)


def coefficients_for(
    device, calibration: Calibration | None = None, stack: str | None = None
) -> tuple[Coefficients, dict[str, float]]:
    """Merge a device profile's efficiencies with a calibration's overrides.

    ``stack``: the training stack (its own overlap contention where the calibration has one).
    Returns the compute coefficients and the link efficiencies/latencies (for :class:`Links`).
    """
    cal = calibration or load_calibration()
    dc = cal.device(device.id)
    eff = device.efficiency
    if not dc.gemm:  # not fitted: published efficiencies scaled by the fitted/published ratios
        gemm = {k: min(v * cal.transfer.gemm_ratio, 0.95) for k, v in eff.gemm.items()}
        if dc.attention is None:
            dc = dc.model_copy(update={"attention": eff.attention * cal.transfer.attention_ratio})
    else:
        gemm = {**eff.gemm, **dc.gemm}
    attention = _attention_eff(dc, eff)
    # a measured kernel's forward rate as is; a training figure (fitted, or transferred to a device
    # without a curve) over the share of it a training stack's forward+backward reaches
    measured_fwd = bool(eff.attention_fwd) and dc.attention is None
    attention_fwd = attention if measured_fwd else attention / cal.global_value("attention_scale")
    peak = {k: v * 1e12 for k, v in device.peak_tflops.items()}
    hd_scale = cal.global_value("half_dim_scale")
    hbm = dc.hbm if dc.hbm is not None else eff.hbm
    co = Coefficients(
        peak_flops=peak,
        gemm_eff=gemm,
        gemm_half_dim=dc.gemm_half_dim if dc.gemm_half_dim is not None else eff.gemm_half_dim * hd_scale,
        gemm_half_dim_by={k: v * hd_scale for k, v in eff.gemm_half_dim_by_precision.items()},
        attention_eff=attention,
        attention_eff_fwd=attention_fwd,
        hbm_bw=device.memory_bw_gbps * 1e9 * hbm,
        overlap_contention=cal.stack_value(stack, "overlap_contention"),
        tp_overlap=cal.global_value("tp_overlap"),
        kernel_overhead_s=cal.global_value("kernel_overhead_us") * 1e-6,
        tp_collective_overhead_s=cal.global_value("tp_collective_overhead_us") * 1e-6,
        fused_attention_speedup=eff.fused_attention_speedup,
        exp_rate=_exp_rate(device),
        moe_host_factor=cal.global_value("moe_host_factor"),
        attention_fwd=dict(eff.attention_fwd),
        attention_scale=cal.global_value("attention_scale"),
    )
    links = {
        "scale_up_bus": dc.scale_up_bus if dc.scale_up_bus is not None else eff.scale_up_bus,
        "scale_out_bus": dc.scale_out_bus if dc.scale_out_bus is not None else eff.scale_out_bus,
    }
    if dc.scale_up_latency_us is not None:
        links["scale_up_latency_us"] = dc.scale_up_latency_us
    if dc.scale_out_latency_us is not None:
        links["scale_out_latency_us"] = dc.scale_out_latency_us
    return co, links
