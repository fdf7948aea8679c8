"""Search spaces as data: which values each layout axis may take, validated with unknown keys rejected.

A space file (YAML or TOML, ``search_spaces/*.yaml`` ship with autopar) lists candidate values per
axis; the legality rules (``autopar.legality``) and the space rules below then carve the legal
layouts out of their product. ``--set AXIS=V1,V2`` / ``--set AXIS.FIELD=V`` override one axis.
"""

from __future__ import annotations

import hashlib
import json
from functools import reduce
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autopar.errors import SearchSpaceError
from autopar.layout import PRECISION_CODES, RECOMPUTE_CODES, Precision, Recompute, divisors

SCHEMA = "autopar.search_space/v1"

Candidates = Literal["pow2", "divisors", "divisors+pow2", "all"]
SpMode = Literal["auto", "on", "off", "both"]
# Pipeline end stages: "even" (the even split) or "minus_one" (the first and the last stage hold one
# layer less than a middle stage, for the embedding and the loss: Llama 3, Sec. 3.3.2; Megatron's
# --account-for-embedding/loss-in-pipeline-split; needs (layers + 2) divisible by pp, pp >= 3).
PipelineEnds = Literal["even", "minus_one"]
PIPELINE_ENDS_CODES: tuple[str, ...] = ("even", "minus_one")

# What "divisors" means for each integer axis: the job-level number its legal values divide.
DIVISOR_BASE = {
    "tp": "attention heads",
    "pp": "layers",
    "vpp": "layers",
    "cp": "seq_len",
    "ep": "experts (1 for a dense model)",
    "micro_batch": "global_batch",
    "shard_group": "num_devices",
}
INT_AXES = tuple(DIVISOR_BASE)
ALL_AXES = (
    "tp",
    "pp",
    "vpp",
    "pipeline_ends",
    "cp",
    "ep",
    "etp",
    "micro_batch",
    "zero",
    "shard_group",
    "sp",
    "recompute",
    "offload",
    "precision",
)


class IntAxis(BaseModel):
    """Candidate values of one integer degree: an explicit list, or generated from a rule.

    Generated candidates: ``pow2`` (1, 2, 4, ...), ``divisors`` (of the axis's base, see
    :data:`DIVISOR_BASE`), ``divisors+pow2`` (their union) or ``all`` (every integer), each kept
    within ``[min, max]``; ``max: node`` means the devices per node (the scale-up domain). Explicit
    ``values`` are kept as given (the legality rules still apply). ``shard_group`` 0 means "all
    dp*cp ranks" (plain ZeRO/FSDP); other values are HSDP shard groups.
    """

    model_config = ConfigDict(extra="forbid")

    values: list[int] | None = None
    candidates: Candidates = "pow2"
    min: int = Field(1, ge=0)
    max: int | Literal["node"] | None = None

    @field_validator("values")
    @classmethod
    def _values(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if not v:
                raise ValueError("values must not be empty")
            bad = [x for x in v if x < 0]
            if bad:
                raise ValueError(f"values must be >= 0 (0 only for shard_group), got {bad}")
            return sorted(set(v))
        return v

    @field_validator("max")
    @classmethod
    def _max(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"max must be >= 1 or 'node', got {v}")
        return v


class UnevenPipeline(BaseModel):
    """Per-stage layer counts (even split +- ``max_shift``) and, optionally, per-stage recompute.

    The product over stages is astronomically large ((2k+1)^(p-1) splits times the recompute
    assignments), so such a space is searched with ``autopar study`` (Optuna), never enumerated.
    ``recompute_pattern``: ``free`` (any mode on any stage, 3^p) or ``monotone`` (heavier modes on
    the earlier stages, which hold more micro-batches in flight under 1F1B: a count of stages per
    mode, O(p^2) assignments).
    """

    model_config = ConfigDict(extra="forbid")

    max_shift: int = Field(4, ge=1, le=64, description="layers a stage may hold above/below the even split")
    per_stage_recompute: bool = True
    recompute_pattern: Literal["free", "monotone"] = "free"


class Axes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tp: IntAxis = IntAxis(candidates="pow2", max="node")
    pp: IntAxis = IntAxis(candidates="divisors+pow2", max=64)
    vpp: IntAxis = IntAxis(candidates="divisors", max=8)
    pipeline_ends: list[PipelineEnds] = Field(default_factory=lambda: ["even"])  # type: ignore[arg-type]
    cp: IntAxis = IntAxis(candidates="pow2", max=8)
    ep: IntAxis = IntAxis(candidates="divisors", max=64)
    etp: list[Literal[1, "tp"]] = Field(default_factory=lambda: [1, "tp"])  # type: ignore[arg-type]
    micro_batch: IntAxis = IntAxis(candidates="divisors", max=8)
    zero: list[Literal[0, 1, 2, 3]] = Field(default_factory=lambda: [0, 1, 2, 3])  # type: ignore[arg-type]
    shard_group: IntAxis = IntAxis(values=[0])
    sp: SpMode = "auto"
    recompute: list[Recompute] = Field(default_factory=lambda: list(RECOMPUTE_CODES))  # type: ignore[arg-type]
    offload: list[bool] = Field(default_factory=lambda: [False, True])
    precision: list[Precision] = Field(default_factory=lambda: ["bf16"])  # type: ignore[arg-type]

    @field_validator("etp", "zero", "recompute", "offload", "precision", "pipeline_ends")
    @classmethod
    def _nonempty_unique(cls, v: list[Any]) -> list[Any]:
        if not v:
            raise ValueError("list must not be empty")
        out: list[Any] = []
        for x in v:
            if x not in out:
                out.append(x)
        return out


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_layouts: int = Field(
        200_000_000, ge=1, description="refuse to enumerate more legal layouts than this"
    )


class SearchSpace(BaseModel):
    """A validated search space; :meth:`fingerprint` identifies it in studies and sweeps."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["autopar.search_space/v1"] = Field("autopar.search_space/v1", alias="schema")
    name: str = "custom"
    description: str = ""
    axes: Axes = Field(default_factory=Axes)
    uneven_pipeline: UnevenPipeline | None = None
    limits: Limits = Field(default_factory=Limits)

    @model_validator(mode="after")
    def _cross(self) -> SearchSpace:
        a = self.axes
        if self.uneven_pipeline is not None and (a.vpp.values != [1]):
            raise ValueError(
                "uneven_pipeline needs axes.vpp: {values: [1]} (uneven splits use the plain 1F1B schedule)"
            )
        sg = a.shard_group
        if sg.values is None and sg.min == 0:
            raise ValueError(
                "axes.shard_group.min must be >= 1 when candidates are generated (0 = full shard "
                "goes in values)"
            )
        for name in INT_AXES:
            ax = getattr(a, name)
            if name != "shard_group" and ax.values is not None and 0 in ax.values:
                raise ValueError(f"axes.{name}.values must be >= 1, got 0")
            if ax.candidates == "all" and ax.values is None and ax.max is None:
                raise ValueError(f"axes.{name}: candidates 'all' needs a max")
            if isinstance(ax.max, int) and ax.values is None and ax.max < ax.min:
                raise ValueError(f"axes.{name}: max ({ax.max}) is below min ({ax.min})")
        return self

    @property
    def enumerable(self) -> bool:
        return self.uneven_pipeline is None

    def fingerprint(self) -> str:
        """Short hash of the resolved content (what a study or sweep row was searched over)."""
        blob = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


# ------------------------------------------------------------------------------------- candidates
def _pow2(lo: int, hi: int) -> list[int]:
    out, v = [], 1
    while v <= hi:
        if v >= lo:
            out.append(v)
        v *= 2
    return out


def int_candidates(axis: IntAxis, *, base: int, node: int) -> list[int]:
    """Concrete candidate values of one integer axis for a job (``base``: the divisor base)."""
    if axis.values is not None:
        return list(axis.values)
    hi = node if axis.max == "node" else (axis.max if axis.max is not None else base)
    lo = max(axis.min, 1)
    if axis.candidates == "pow2":
        vals = _pow2(lo, hi)
    elif axis.candidates == "divisors":
        vals = [d for d in divisors(max(base, 1)) if lo <= d <= hi]
    elif axis.candidates == "divisors+pow2":
        vals = sorted(set(divisors(max(base, 1))) | set(_pow2(1, hi)))
        vals = [d for d in vals if lo <= d <= hi]
    else:
        vals = list(range(lo, hi + 1))
    return vals


def axis_bases(model, *, num_devices: int, seq_len: int, global_batch: int) -> dict[str, int]:
    return {
        "tp": model.tp_head_units[0],
        "pp": model.layers,
        "vpp": model.layers,
        "cp": seq_len,
        "ep": model.num_experts or 1,
        "micro_batch": global_batch,
        "shard_group": num_devices,
    }


def product(xs) -> int:
    return reduce(lambda a, b: a * b, xs, 1)


# ---------------------------------------------------------------------------------------- loading
def builtin_spaces() -> list[str]:
    root = resources.files("autopar.search_spaces")
    return sorted(
        p.name.rsplit(".", 1)[0] for p in root.iterdir() if p.name.endswith((".yaml", ".yml", ".toml"))
    )


def _format_error(where: str, exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = [str(x) for x in err["loc"] if not str(x).startswith(("function-", "literal["))]
    key = ".".join(loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        parent: Any = SearchSpace
        for part in loc[:-1]:
            field = getattr(parent, "model_fields", {}).get(part)
            ann = getattr(field, "annotation", None) if field else None
            parent = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
            if parent is None:
                break
        allowed = (
            ", ".join((f.alias or n) for n, f in parent.model_fields.items()) if parent is not None else ""
        )
        msg = f"unknown key {loc[-1]!r}" + (f" (allowed: {allowed})" if allowed else "")
    else:
        msg = err["msg"].removeprefix("Value error, ")
        if "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict):
            msg += f" (got {err['input']!r})"
    return f"search space {where}: {key}: {msg}"


def parse_space(raw: Any, where: str) -> SearchSpace:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SearchSpaceError(
            f"search space {where}: the top level must be a mapping, got {type(raw).__name__}",
            "see search_spaces/default.yaml for the schema",
        )
    try:
        return SearchSpace.model_validate(raw)
    except ValidationError as exc:
        raise SearchSpaceError(
            _format_error(where, exc), "see search_spaces/default.yaml for the schema"
        ) from None


def _read(path: Path) -> Any:
    """The file's mapping (autopar.files: regular UTF-8 file, no repeated keys); errors as SearchSpaceError."""
    from autopar.errors import FileError
    from autopar.files import load_structured

    try:
        return load_structured(path, "search space", SPACE_HINT)
    except FileError as exc:
        raise SearchSpaceError(exc.message, exc.hint) from None


SPACE_HINT = "pass a YAML/TOML space file (see search_spaces/README.md) or a built-in space name"


def load_space_raw(name_or_path: str | Path | None) -> tuple[dict[str, Any], str]:
    """(raw mapping, where) for a built-in space name or a file path."""
    if name_or_path is None:
        name_or_path = "default"
    s = str(name_or_path)
    p = Path(s)
    if not s.strip():
        raise SearchSpaceError(
            "--space is empty", f"pass a YAML/TOML file or one of: {', '.join(builtin_spaces())}"
        )
    if p.suffix in (".yaml", ".yml", ".toml") or p.exists() or "/" in s:
        if not p.exists():
            raise SearchSpaceError(
                f"search space file {s} does not exist",
                f"pass a YAML/TOML file or one of: {', '.join(builtin_spaces())}",
            )
        raw = _read(p)
        if raw is None or raw == {}:
            raise SearchSpaceError(
                f"search space file {s} is empty",
                "give at least a name and axes (see search_spaces/default.yaml), or omit --space for the default",
            )
        return raw, str(p)
    root = resources.files("autopar.search_spaces")
    for ext in (".yaml", ".yml", ".toml"):
        f = root / f"{s}{ext}"
        if f.is_file():
            raw = _read(Path(str(f)))
            return (raw if raw is not None else {}), f"{s}{ext}"
    raise SearchSpaceError(
        f"unknown search space {s!r}", f"use a file path or one of: {', '.join(builtin_spaces())}"
    )


def _parse_scalar(text: str) -> Any:
    t = text.strip()
    low = t.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    try:
        return int(t)
    except ValueError:
        return t


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Apply ``AXIS=V1,V2`` (the axis's candidate list) and ``AXIS.FIELD=V`` overrides to a raw space."""
    out = json.loads(json.dumps(raw))
    axes = out.setdefault("axes", {}) or {}
    out["axes"] = axes
    for ov in overrides:
        if "=" not in ov:
            raise SearchSpaceError(
                f"--set {ov!r}: expected AXIS=VALUES or AXIS.FIELD=VALUE",
                "e.g. --set tp=1,2,4,8 or --set cp.max=16",
            )
        key, _, value = ov.partition("=")
        key = key.strip().replace("-", "_")
        axis, _, field = key.partition(".")
        if axis not in ALL_AXES:
            raise SearchSpaceError(f"--set {ov!r}: unknown axis {axis!r}", f"axes are: {', '.join(ALL_AXES)}")
        items = [_parse_scalar(v) for v in value.split(",") if v.strip() != ""]
        if field:
            if axis not in INT_AXES:
                raise SearchSpaceError(
                    f"--set {ov!r}: axis {axis} takes a list, not fields", f"use --set {axis}=V1,V2"
                )
            cur = axes.get(axis)
            cur = dict(cur) if isinstance(cur, dict) else ({"values": cur} if isinstance(cur, list) else {})
            cur[field] = items[0] if len(items) == 1 else items
            axes[axis] = cur
        elif axis in INT_AXES:
            axes[axis] = {"values": items}
        elif axis == "sp":
            if len(items) != 1:
                raise SearchSpaceError(
                    f"--set {ov!r}: sp takes one of auto, on, off, both", "e.g. --set sp=both"
                )
            v = items[0]
            axes[axis] = {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v
        else:
            axes[axis] = items
    return out


def load_space(
    name_or_path: str | Path | SearchSpace | dict | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> SearchSpace:
    """A built-in space by name (``default``, ``moe``, ...), a YAML/TOML file, or a mapping; plus overrides."""
    if isinstance(name_or_path, SearchSpace):
        if not overrides:
            return name_or_path
        raw, where = name_or_path.to_dict(), name_or_path.name
    elif isinstance(name_or_path, dict):
        raw, where = name_or_path, "(mapping)"
    else:
        raw, where = load_space_raw(name_or_path)
    if overrides:
        if not isinstance(raw, dict):
            raise SearchSpaceError(f"search space {where}: the top level must be a mapping", "fix the file")
        raw = apply_overrides(raw, overrides)
        where = f"{where} with --set {' '.join(overrides)}"
    return parse_space(raw, where)


def restrict_axes(space: SearchSpace, limits: dict[str, list[Any]], who: str) -> tuple[SearchSpace, str]:
    """``space`` with every axis cut to the values in ``limits`` (axis -> allowed values, from
    :meth:`autopar.export.base.Exporter.search_limits`), and one line naming what was cut ("" when
    nothing was). An axis the space pins to values ``who`` cannot launch at all is an error.

    Integer axes: explicit values are intersected; generated ones (pow2, divisors, ...) become the
    allowed values (the legality rules still apply). ``sp``: a mode outside the allowed ones becomes
    the first allowed one.
    """
    raw = space.to_dict()
    axes = raw["axes"]
    cut: list[str] = []
    for name, allowed in limits.items():
        cur = axes[name]
        if name == "sp":
            if cur not in allowed:
                axes[name] = allowed[0]
                cut.append(f"sp={cur} (now {allowed[0]})")
            continue
        if name in INT_AXES:
            vals = cur.get("values")
            if vals is None:  # generated candidates within [min, max]
                lo, hi = cur.get("min", 1), cur.get("max")
                top = hi if isinstance(hi, int) else None
                keep = [v for v in allowed if v >= lo and (top is None or v <= top)]
                if not keep:
                    raise SearchSpaceError(
                        f"{who} cannot launch {name} >= {lo}",
                        f"use {name} in {', '.join(map(str, allowed))}, or another --framework",
                    )
                if top is not None and set(range(max(lo, 1), top + 1)) <= set(keep):
                    continue  # already no wider than the allowed values
                axes[name] = {"values": keep}
                cut.append(f"{name} other than {'/'.join(map(str, keep))}")
                continue
            keep = [v for v in vals if v in allowed]
        else:
            vals = list(cur)
            keep = [v for v in vals if v in allowed]
        if not keep:
            shown = ",".join(str(v).lower() for v in vals)
            raise SearchSpaceError(
                f"{who} cannot launch {name}={shown}",
                f"use {name} in {', '.join(str(v).lower() for v in allowed)}, or another --framework",
            )
        if len(keep) < len(vals):
            gone = [str(v).lower() for v in vals if v not in keep]
            cut.append(f"{name}={','.join(gone)}")
            axes[name] = {"values": keep} if name in INT_AXES else keep
    if not cut:
        return space, ""
    return parse_space(
        raw, f"{space.name} for {who}"
    ), f"{who} cannot launch, so the search leaves out: " + "; ".join(cut)


__all__ = [
    "restrict_axes",
    "SearchSpace",
    "Axes",
    "IntAxis",
    "UnevenPipeline",
    "Limits",
    "load_space",
    "builtin_spaces",
    "int_candidates",
    "axis_bases",
    "apply_overrides",
    "DIVISOR_BASE",
    "PRECISION_CODES",
]
