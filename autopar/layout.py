"""One parallel layout (:class:`Layout`) and many of them as columns (:class:`LayoutTable`).

A Layout is resolved once against the world size and the global batch (torchtitan's
ParallelDims idea: -1/None means "what is left"), then validated; every violation is a
:class:`Reason` (a code, the values, what would be allowed), never an ``assert``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autopar.errors import LayoutError

# Appended values keep the integer codes of the earlier ones. ``selective`` is Megatron's default
# ``--recompute-modules core_attn``; ``norm_act`` adds the output-discarding modules (layernorm,
# moe_act, mla_up_proj: norm outputs, the routed experts' activation output and MLA's up-projected
# Q/K/V are dropped and recomputed from tensors kept anyway); ``norm_act_mlp`` adds the dense MLP
# and the shared experts (normal checkpointing: their intermediates recomputed from the MLP input).
# Megatron-Core transformer_config.py ``recompute_modules`` (mcore 0.13+).
Recompute = Literal["none", "selective", "full", "norm_act", "norm_act_mlp"]
# Appended values keep the integer codes of the earlier ones (saved tables, studies). What each
# means physically: autopar.precision.
Precision = Literal["bf16", "fp8", "fp16", "fp32", "mxfp8", "nvfp4"]
ZeroStage = Literal[0, 1, 2, 3]
RECOMPUTE_CODES: tuple[str, ...] = get_args(Recompute)
# Lightest to heaviest (activation memory kept, most to least): the order of monotone per-stage
# assignments and of "the heaviest mode of a plan".
RECOMPUTE_ORDER: tuple[str, ...] = ("none", "selective", "norm_act", "norm_act_mlp", "full")
# Megatron-Core --recompute-modules of each selective mode (the model decides which apply).
RECOMPUTE_MODULES: dict[str, tuple[str, ...]] = {
    "selective": ("core_attn",),
    "norm_act": ("core_attn", "layernorm", "moe_act", "mla_up_proj"),
    "norm_act_mlp": ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts"),
}


def recompute_weight(code: int) -> int:
    """Position of recompute code ``code`` in :data:`RECOMPUTE_ORDER` (heavier = larger)."""
    return RECOMPUTE_ORDER.index(RECOMPUTE_CODES[code])


PRECISION_CODES: tuple[str, ...] = get_args(Precision)

# Columns of a LayoutTable, in order; integer-coded so that whole candidate sets are numpy arrays.
COLUMNS: tuple[str, ...] = (
    "tp",
    "pp",
    "vpp",
    "first_stage_layers",
    "last_stage_layers",
    "dp",
    "cp",
    "ep",
    "etp",
    "zero",
    "shard_group",
    "sp",
    "micro_batch",
    "grad_accum",
    "recompute",
    "offload",
    "precision",
)
# Columns a LayoutTable may omit (older callers, hand-built tables): their value when absent.
OPTIONAL_COLUMNS: dict[str, int] = {"first_stage_layers": 0, "last_stage_layers": 0}


class ParallelDims:
    """Sizes derived from a layout's degrees, defined ONCE over numpy arrays (torchtitan's ParallelDims).

    ``ParallelDims(table.cols)`` gives whole columns (what the vectorized models use);
    :class:`Layout`'s properties of the same names give the scalars of one layout.
    """

    __slots__ = ("_c",)

    def __init__(self, cols: Any) -> None:
        self._c = cols

    def _a(self, name: str) -> np.ndarray:
        return np.asarray(self._c[name], dtype=np.int64)

    @property
    def shard_size(self) -> np.ndarray:
        """Ranks that share one copy of the sharded model state (ZeRO/FSDP group; HSDP's inner size)."""
        sg = self._a("shard_group")
        return np.where(sg > 0, sg, self._a("dp") * self._a("cp"))

    @property
    def expert_dp(self) -> np.ndarray:
        """Expert-data-parallel size: each stage's tp*cp*dp ranks regrouped as etp*ep*expert_dp
        (Megatron-Core's expert rank order); float where ep*etp does not divide (an illegal layout)."""
        return (self._a("tp") * self._a("cp") * self._a("dp")) / (self._a("ep") * self._a("etp"))

    @property
    def expert_shard(self) -> np.ndarray:
        """Ranks sharding the expert state: Megatron's distributed optimizer shards it over the whole
        expert-DP group (tp*cp*dp/(ep*etp) ranks); an HSDP shard group caps it."""
        sg = self._a("shard_group").astype(np.float64)
        return np.where(sg > 0, np.minimum(sg, self.expert_dp), self.expert_dp)

    @property
    def sp_divisor(self) -> np.ndarray:
        """What divides the sequence dimension of activations outside attention/MLP (tp with SP)."""
        return np.where(self._a("sp") > 0, self._a("tp"), 1)

    @property
    def process_groups(self) -> np.ndarray:
        """Communicating process groups a rank belongs to (each holds NCCL buffers): TP, PP, CP, EP, DP*CP."""
        tp, pp, cp, ep, dp = (self._a(k) for k in ("tp", "pp", "cp", "ep", "dp"))
        return (tp > 1).astype(np.int64) + (pp > 1) + (cp > 1) + (ep > 1) + (dp * cp > 1)

    def stage_layers(self, model: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Transformer layers on the first stage, on each middle stage (the most loaded one) and on
        the last stage.

        Declared end counts (``first_stage_layers``/``last_stage_layers`` > 0) follow Megatron-Core's
        ``get_num_layers_to_build`` (megatron/core/transformer/transformer_block.py, mcore 0.16):
        the layers left after the declared ends are split evenly over the other stages. Undeclared
        (0): the even split, the first ``L % pp`` stages taking one extra layer (as
        ``search.uneven.even_split``), so the first and the middle stages take ``ceil(L/pp)``.
        With pp = 1 the one stage holds every layer.
        """
        L = int(model.layers)
        pp = self._a("pp")
        f, last = self._a("first_stage_layers"), self._a("last_stage_layers")
        declared = (f > 0) | (last > 0)
        ends = (f > 0).astype(np.int64) + (last > 0)
        rest = np.maximum(pp - ends, 1)
        mid_declared = -(-np.maximum(L - f - last, 0) // rest)
        q, rem = L // pp, L % pp
        first = np.where(f > 0, f, np.where(declared, mid_declared, q + (rem > 0)))
        mid = np.where(declared, mid_declared, q + (rem > 1))
        lst = np.where(last > 0, last, np.where(declared, mid_declared, q + (rem > pp - 1)))
        one = pp == 1
        return np.where(one, L, first), np.where(one, L, mid), np.where(one, L, lst)

    def layers_per_stage(self, model: Any) -> np.ndarray:
        """Transformer layers on the heaviest pipeline stage."""
        first, mid, last = self.stage_layers(model)
        has_mid = self._a("pp") >= 3
        return np.maximum(np.maximum(first, last), np.where(has_mid, mid, 0))


def _scalar(v: np.ndarray) -> Any:
    x = v.item()
    return int(x) if isinstance(x, float) and x.is_integer() else x


# Bounds of a layout's integers: far above any real job, low enough for int64 columns and products.
MAX_DEGREE = 2**20
MAX_BATCH = 2**24
MAX_LAYERS = 10_000


class Layout(BaseModel):
    """A fully resolved parallel layout of one training job.

    World size identity (Megatron convention): ``num_devices == tp * pp * cp * dp``. Expert
    parallelism is carved out of the same ranks: each pipeline stage's ``tp * cp * dp`` ranks are
    regrouped as ``etp * ep * expert_dp``, so ``etp * ep`` must divide ``tp * cp * dp``.
    Batch identity: ``global_batch == micro_batch * grad_accum * dp``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(1, ge=1, le=MAX_DEGREE, description="tensor-parallel size")
    pp: int = Field(1, ge=1, le=MAX_DEGREE, description="pipeline-parallel stages")
    vpp: int = Field(1, ge=1, le=MAX_DEGREE, description="virtual (interleaved) stages per pipeline rank")
    first_stage_layers: int = Field(
        0,
        ge=0,
        le=MAX_LAYERS,
        description="decoder layers on the first pipeline stage (0 = even split; Megatron "
        "--decoder-first-pipeline-num-layers); the rest split evenly over the other stages",
    )
    last_stage_layers: int = Field(
        0,
        ge=0,
        le=MAX_LAYERS,
        description="decoder layers on the last pipeline stage (0 = even split; Megatron "
        "--decoder-last-pipeline-num-layers)",
    )
    dp: int = Field(1, ge=1, le=MAX_DEGREE, description="data-parallel size (dense)")
    cp: int = Field(
        1, ge=1, le=MAX_DEGREE, description="context-parallel size (sequence sharded for attention)"
    )
    ep: int = Field(1, ge=1, le=MAX_DEGREE, description="expert-parallel size (MoE); divides tp*cp*dp / etp")
    etp: int = Field(
        1,
        ge=1,
        le=MAX_DEGREE,
        description="expert tensor-parallel size (Megatron-Core's expert_tensor_parallel_size; "
        "left blank it is tp, as in ModelParallelConfig)",
    )
    zero: ZeroStage = Field(
        1,
        description="ZeRO stage: 0 DDP, 1 optimizer sharding (Megatron's distributed optimizer), "
        "2 +grads, 3 +params (FSDP)",
    )
    shard_group: int = Field(
        0, ge=0, le=MAX_DEGREE, description="ZeRO/FSDP shard-group size (HSDP); 0 = all dp*cp ranks"
    )
    sp: bool = Field(False, description="Megatron sequence parallelism (needs tp > 1)")
    micro_batch: int = Field(1, ge=1, le=MAX_BATCH, description="sequences per micro-batch per rank")
    grad_accum: int = Field(1, ge=1, le=MAX_BATCH, description="micro-batches per optimizer step per rank")
    recompute: Recompute = Field(
        "none",
        description="activation recomputation: none, selective (attention core), norm_act (+ norms, "
        "MoE activation, MLA up-projections), norm_act_mlp (+ dense MLP, shared experts), full",
    )
    offload: bool = Field(False, description="optimizer state and step on the host (CPU)")
    precision: Precision = Field("bf16", description="GEMM precision")

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def dims(self) -> ParallelDims:
        return ParallelDims(self.__dict__)

    @property
    def shard_size(self) -> int:
        """See :attr:`ParallelDims.shard_size`."""
        return int(self.dims.shard_size)

    @property
    def expert_dp(self) -> int | float:
        """See :attr:`ParallelDims.expert_dp`."""
        return _scalar(self.dims.expert_dp)

    @property
    def expert_shard(self) -> int | float:
        """See :attr:`ParallelDims.expert_shard`."""
        return _scalar(self.dims.expert_shard)

    @property
    def sp_divisor(self) -> int:
        """See :attr:`ParallelDims.sp_divisor`."""
        return int(self.dims.sp_divisor)

    @property
    def process_groups(self) -> int:
        """See :attr:`ParallelDims.process_groups`."""
        return int(self.dims.process_groups)

    def layers_per_stage(self, model: Any) -> int:
        """See :meth:`ParallelDims.layers_per_stage`."""
        return int(self.dims.layers_per_stage(model))

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    def short(self) -> str:
        """Compact one-line description, e.g. ``tp8 pp4 vpp2 dp16 z1 sp mb1 sel bf16``."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        if self.first_stage_layers or self.last_stage_layers:
            parts.append(f"ends{self.first_stage_layers or '-'}/{self.last_stage_layers or '-'}")
        parts.append(f"dp{self.dp}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.ep > 1 and self.etp != 1:
            parts.append(f"etp{self.etp}")
        parts.append(f"z{self.zero}")
        if self.shard_group:
            parts.append(f"sg{self.shard_group}")
        if self.sp:
            parts.append("sp")
        parts.append(f"mb{self.micro_batch}x{self.grad_accum}")
        parts.append(
            {"none": "norc", "selective": "sel", "full": "full", "norm_act": "na", "norm_act_mlp": "namlp"}[
                self.recompute
            ]
        )
        if self.offload:
            parts.append("offload")
        parts.append(self.precision)
        return " ".join(parts)


@dataclass(frozen=True)
class Reason:
    """Why a layout is not legal or does not fit: machine-readable code plus a sentence."""

    code: str
    message: str
    values: dict[str, Any] = field(default_factory=dict)
    allowed: Any = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message, "values": self.values}
        if self.allowed is not None:
            out["allowed"] = self.allowed
        return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# Keywords of resolve_layout (and of predict()); None = the Layout field's default, except the
# derived ones: dp (what is left of the world size), etp (tp, Megatron-Core's default), sp (tp > 1).
LAYOUT_ARGS: tuple[str, ...] = tuple(c for c in COLUMNS if c != "grad_accum")
DERIVED_DEFAULTS: dict[str, str] = {
    "dp": "num_devices/(tp*pp*cp)",
    "etp": "tp (Megatron-Core's expert_tensor_parallel_size default)",
    "sp": "on when tp > 1",
}


def resolve_layout(
    *,
    num_devices: int,
    global_batch: int,
    tp: int | None = None,
    pp: int | None = None,
    vpp: int | None = None,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    dp: int | None = None,
    cp: int | None = None,
    ep: int | None = None,
    etp: int | None = None,
    zero: int | None = None,
    shard_group: int | None = None,
    sp: bool | None = None,
    micro_batch: int | None = None,
    recompute: str | None = None,
    offload: bool | None = None,
    precision: str | None = None,
) -> Layout:
    """Derive ``dp`` (if None) and ``grad_accum`` from the world size and the global batch.

    A keyword left at None takes the :class:`Layout` field default (see :data:`DERIVED_DEFAULTS`
    for dp, etp and sp). Raises :class:`LayoutError` naming every factor of the product when they
    do not divide.
    """
    d = {k: f.default for k, f in Layout.model_fields.items()}
    tp = d["tp"] if tp is None else tp
    pp = d["pp"] if pp is None else pp
    vpp = d["vpp"] if vpp is None else vpp
    cp = d["cp"] if cp is None else cp
    ep = d["ep"] if ep is None else ep
    zero = d["zero"] if zero is None else zero
    shard_group = d["shard_group"] if shard_group is None else shard_group
    micro_batch = d["micro_batch"] if micro_batch is None else micro_batch
    recompute = d["recompute"] if recompute is None else recompute
    offload = d["offload"] if offload is None else offload
    precision = d["precision"] if precision is None else precision
    for name, value in (
        ("num_devices", num_devices),
        ("global_batch", global_batch),
        ("tp", tp),
        ("pp", pp),
        ("vpp", vpp),
        ("cp", cp),
        ("ep", ep),
        ("micro_batch", micro_batch),
    ):
        if value is None or int(value) < 1:
            raise LayoutError(f"{name} must be a positive integer, got {value}", "pass a value >= 1")
    mp = tp * pp * cp
    if dp is None:
        if num_devices % mp:
            raise LayoutError(
                f"num_devices={num_devices} is not divisible by tp*pp*cp = {tp}*{pp}*{cp} = {mp}",
                f"choose tp, pp, cp whose product divides {num_devices}",
                [
                    Reason(
                        "world_size",
                        "tp*pp*cp must divide num_devices",
                        {"num_devices": num_devices, "tp": tp, "pp": pp, "cp": cp},
                    )
                ],
            )
        dp = num_devices // mp
    if dp < 1:
        raise LayoutError(f"dp must be a positive integer, got {dp}", "pass --dp >= 1 or leave it out")
    if tp * pp * cp * dp != num_devices:
        raise LayoutError(
            f"tp*pp*cp*dp = {tp}*{pp}*{cp}*{dp} = {tp * pp * cp * dp} != num_devices={num_devices}",
            "leave --dp out to derive it, or make the product equal the device count",
            [
                Reason(
                    "world_size",
                    "tp*pp*cp*dp must equal num_devices",
                    {"num_devices": num_devices, "tp": tp, "pp": pp, "cp": cp, "dp": dp},
                )
            ],
        )
    per_step = micro_batch * dp
    if global_batch % per_step:
        raise LayoutError(
            f"global_batch={global_batch} is not divisible by micro_batch*dp = {micro_batch}*{dp} = {per_step}",
            "choose a micro-batch and dp whose product divides the global batch",
            [
                Reason(
                    "batch",
                    "micro_batch*dp must divide global_batch",
                    {"global_batch": global_batch, "micro_batch": micro_batch, "dp": dp},
                )
            ],
        )
    if recompute not in RECOMPUTE_CODES:
        raise LayoutError(
            f"recompute={recompute!r} is not one of {', '.join(RECOMPUTE_CODES)}",
            f"use one of {', '.join(RECOMPUTE_CODES)}",
        )
    if precision not in PRECISION_CODES:
        raise LayoutError(
            f"precision={precision!r} is not one of {', '.join(PRECISION_CODES)}",
            f"use one of {', '.join(PRECISION_CODES)}",
        )
    if zero not in (0, 1, 2, 3):
        raise LayoutError(f"zero={zero} is not a ZeRO stage", "use 0, 1, 2 or 3")
    return Layout(
        tp=tp,
        pp=pp,
        vpp=vpp,
        first_stage_layers=first_stage_layers or 0,
        last_stage_layers=last_stage_layers or 0,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=tp if etp is None else etp,
        zero=zero,  # type: ignore[arg-type]
        shard_group=shard_group or 0,
        sp=(tp > 1) if sp is None else bool(sp),
        micro_batch=micro_batch,
        grad_accum=global_batch // per_step,
        recompute=recompute,  # type: ignore[arg-type]
        offload=offload,
        precision=precision,  # type: ignore[arg-type]
    )


class LayoutTable:
    """Many layouts as integer numpy columns (one row per layout): the input of the vectorized models.

    ``recompute`` and ``precision`` are stored as codes indexing :data:`RECOMPUTE_CODES` and
    :data:`PRECISION_CODES`; booleans as 0/1.
    """

    __slots__ = ("cols",)

    def __init__(self, cols: dict[str, np.ndarray]) -> None:
        n = {len(np.atleast_1d(v)) for v in cols.values()}
        if len(n) != 1:
            raise ValueError(f"columns of unequal length: {n}")
        rows = n.pop()
        cols = {**{k: np.zeros(rows, dtype=np.int64) + v for k, v in OPTIONAL_COLUMNS.items()}, **cols}
        missing = set(COLUMNS) - set(cols)
        if missing:
            raise ValueError(f"missing layout columns: {sorted(missing)}")
        self.cols = {k: np.atleast_1d(np.asarray(cols[k], dtype=np.int64)) for k in COLUMNS}

    def __len__(self) -> int:
        return len(self.cols["tp"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name]

    @property
    def dims(self) -> ParallelDims:
        """The derived sizes of every row, as columns."""
        return ParallelDims(self.cols)

    @classmethod
    def from_layouts(cls, layouts: Sequence[Layout]) -> LayoutTable:
        cols: dict[str, list[int]] = {k: [] for k in COLUMNS}
        for lay in layouts:
            for k in COLUMNS:
                v = getattr(lay, k)
                if k == "recompute":
                    v = RECOMPUTE_CODES.index(v)
                elif k == "precision":
                    v = PRECISION_CODES.index(v)
                cols[k].append(int(v))
        return cls({k: np.asarray(v, dtype=np.int64) for k, v in cols.items()})

    def take(self, idx: np.ndarray | Iterable[int]) -> LayoutTable:
        idx = np.asarray(list(idx) if not isinstance(idx, np.ndarray) else idx)
        return LayoutTable({k: v[idx] for k, v in self.cols.items()})

    def row(self, i: int) -> Layout:
        c = {k: int(v[i]) for k, v in self.cols.items()}
        coded = {
            "sp": bool(c["sp"]),
            "offload": bool(c["offload"]),
            "recompute": RECOMPUTE_CODES[c["recompute"]],
            "precision": PRECISION_CODES[c["precision"]],
        }
        return Layout(**{**c, **coded})

    def rows(self) -> list[Layout]:
        return [self.row(i) for i in range(len(self))]

    @staticmethod
    def concat(tables: Sequence[LayoutTable]) -> LayoutTable:
        return LayoutTable({k: np.concatenate([t.cols[k] for t in tables]) for k in COLUMNS})
