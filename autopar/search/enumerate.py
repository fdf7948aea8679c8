"""Generate every legal layout of a search space as numpy columns, without building illegal ones.

Generation runs in stages (tp*pp*cp -> ep, etp -> micro-batch -> vpp -> sp -> ZeRO/offload/
recompute/precision); each stage broadcasts its candidate values against the survivors of the
previous one and applies only the rules its axes decide (the rule functions of
``autopar.legality`` themselves, plus the space rules below), so a candidate is built only if every
rule about the axes bound so far holds. Each excluded candidate is counted once, under the first
rule it breaks, weighted by the number of full layouts it stood for, so that
``candidates_total == layouts + sum(excluded.values())`` exactly.

Scoring uses a broadcast grid: structural rows along one axis and recompute, ZeRO stage, shard
group and offload along their own axes, so the engine computes each term once per combination of
the axes it depends on (GEMM times once per (tp, cp, micro-batch), optimizer state once per
(tp, pp, ZeRO, offload), ...) and only the final sums at full size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopar.errors import SearchSpaceError
from autopar.layout import COLUMNS, PRECISION_CODES, RECOMPUTE_CODES, LayoutTable
from autopar.legality import RULES, Context
from autopar.search.space import PIPELINE_ENDS_CODES, SearchSpace, axis_bases, int_candidates, product

_RULE = {r.code: r for r in RULES}

# Space rules: conventions of the search spaces on top of autopar.legality (whose rules are looked
# up first, so a code here must not repeat one there).
SPACE_RULES: dict[str, tuple[str, Callable[..., np.ndarray]]] = {
    # A shard group spanning every dp*cp rank is shard_group=0 (plain ZeRO/FSDP) under another name.
    "duplicate": (
        "shard_group equal to dp*cp duplicates shard_group=0",
        lambda m, L, c: (L["shard_group"] > 0) & (L["shard_group"] == L["dp"] * L["cp"]),
    ),
    # With pp = 2 "one layer less on each end" of (L+2)/2 is the even split under another name.
    "ends_duplicate": (
        "minus_one pipeline ends with pp < 3 duplicate the even split",
        lambda m, L, c: ((L["first_stage_layers"] > 0) | (L["last_stage_layers"] > 0)) & (L["pp"] < 3),
    ),
}

# Rule codes checked at each generation stage, in this order (a candidate is counted under the first).
STAGE_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "tp*pp*cp",
        (
            "world_size",
            "tp_heads",
            "tp_kv_heads",
            "tp_hidden",
            "tp_mixer_heads",
            "pp_layers",
            "cp_seq",
            "cp_recurrent",
        ),
    ),
    ("ep,etp", ("ep_dense", "ep_experts", "ep_ranks")),
    ("micro_batch", ("batch",)),
    (
        "vpp",
        (
            "vpp_needs_pp",
            "pp_layers",
            "stage_layers",
            "vpp_layers",
            "vpp_microbatches",
            "ends_duplicate",
            "pipeline_schedule",
        ),
    ),
    ("sp", ("sp_needs_tp", "moe_sp")),
    ("zero,shard_group,offload", ("shard_group", "offload_needs_zero", "duplicate")),
    ("precision", ("precision_unsupported",)),
)
STRUCTURAL = (
    "tp",
    "pp",
    "cp",
    "dp",
    "ep",
    "etp",
    "micro_batch",
    "grad_accum",
    "vpp",
    "first_stage_layers",
    "last_stage_layers",
    "sp",
)
GRID_NDIM = 6  # (1, structural row, recompute, zero, shard_group, offload); precision is one per call


def rule_message(code: str) -> str:
    if code in _RULE:
        return _RULE[code].message
    if code in SPACE_RULES:
        return SPACE_RULES[code][0]
    if code == "out_of_memory":
        return "legal but needs more memory than the device has"
    return code


def _violated(code: str, model, cols: dict[str, np.ndarray], ctx: Context) -> np.ndarray:
    if code in _RULE:
        return np.asarray(_RULE[code].violated(model, cols, ctx), dtype=bool)
    return np.asarray(SPACE_RULES[code][1](model, cols, ctx), dtype=bool)


@dataclass
class AxisValues:
    """Concrete candidate values of every axis for one job (codes for recompute and precision)."""

    tp: list[int]
    pp: list[int]
    vpp: list[int]
    pipeline_ends: list[int]
    cp: list[int]
    ep: list[int]
    etp: list[Any]
    micro_batch: list[int]
    zero: list[int]
    shard_group: list[int]
    sp: str
    recompute: list[int]
    offload: list[int]
    precision: list[int]


def axis_values(space: SearchSpace, job) -> AxisValues:
    a = space.axes
    bases = axis_bases(
        job.model, num_devices=job.num_devices, seq_len=job.seq_len, global_batch=job.global_batch
    )
    node = job.devices_per_node
    ints = {k: int_candidates(getattr(a, k), base=bases[k], node=node) for k in bases}
    if "minus_one" in a.pipeline_ends:
        # Megatron's account-for-embedding/loss split interleaves (L + 2)/pp layers per rank:
        # offer the vpp values that divide L + 2 as well.
        extra = int_candidates(a.vpp, base=job.model.layers + 2, node=node)
        ints["vpp"] = sorted(set(ints["vpp"]) | set(extra))
    for k, v in ints.items():
        if not v:
            ax = getattr(a, k)
            raise SearchSpaceError(
                f"search space {space.name}: axes.{k} has no candidate values for this job "
                f"(candidates={ax.candidates}, min={ax.min}, max={ax.max}, base {bases[k]})",
                f"widen axes.{k} or pass --set {k}=V1,V2",
            )
    return AxisValues(
        tp=ints["tp"],
        pp=ints["pp"],
        vpp=ints["vpp"],
        pipeline_ends=[PIPELINE_ENDS_CODES.index(x) for x in a.pipeline_ends],
        cp=ints["cp"],
        ep=ints["ep"],
        etp=list(a.etp),
        micro_batch=ints["micro_batch"],
        zero=sorted(a.zero),
        shard_group=ints["shard_group"],
        sp=a.sp,
        recompute=[RECOMPUTE_CODES.index(r) for r in a.recompute],
        offload=sorted({int(bool(x)) for x in a.offload}),
        precision=[PRECISION_CODES.index(p) for p in a.precision],
    )


def _expand(rows: dict[str, np.ndarray], name: str, values: np.ndarray) -> dict[str, np.ndarray]:
    """Cartesian product of the surviving rows with one more axis (row-major: old rows outer)."""
    n, k = len(next(iter(rows.values()))), len(values)
    out = {c: np.repeat(v, k) for c, v in rows.items()}
    out[name] = np.tile(values, n)
    return out


def _filter(rows: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    return {c: v[keep] for c, v in rows.items()}


@dataclass
class Enumeration:
    """All legal layouts of a space for one job, as structural rows times variant axes.

    Layout ``id`` (row-major over the grid ``(precision, structural row, recompute, zero,
    shard_group, offload)``) identifies a layout for ranking, chunking and materializing.
    """

    job: Any
    space: SearchSpace
    values: AxisValues
    S: dict[str, np.ndarray]  # structural rows: STRUCTURAL columns
    recompute: np.ndarray
    zero: np.ndarray
    shard_group: np.ndarray
    offload: np.ndarray
    precision: np.ndarray  # legal precision codes
    vmask: np.ndarray  # (S, zero, shard_group, offload): legal variant cells
    excluded: dict[str, int] = field(default_factory=dict)
    candidates_total: int = 0

    @property
    def n_structural(self) -> int:
        return len(self.S["tp"])

    @property
    def variant_shape(self) -> tuple[int, int, int, int]:
        return (len(self.recompute), len(self.zero), len(self.shard_group), len(self.offload))

    @property
    def cells_per_row(self) -> int:
        return product(self.variant_shape)

    @property
    def grid_size(self) -> int:
        return len(self.precision) * self.n_structural * self.cells_per_row

    @property
    def size(self) -> int:
        """Number of legal layouts."""
        return int(self.vmask.sum()) * len(self.recompute) * len(self.precision)

    # ------------------------------------------------------------------------------------- grids
    def grid_table(self, p: int, s0: int, s1: int) -> tuple[LayoutTable, tuple[int, ...]]:
        """A broadcast LayoutTable of structural rows [s0, s1) with precision index ``p``."""
        n = s1 - s0

        def col(a: np.ndarray, axis: int) -> np.ndarray:
            shape = [1] * GRID_NDIM
            shape[axis] = len(a)
            return np.asarray(a, dtype=np.int64).reshape(shape)

        cols = {c: col(self.S[c][s0:s1], 1) for c in STRUCTURAL}
        cols["recompute"] = col(self.recompute, 2)
        cols["zero"] = col(self.zero, 3)
        cols["shard_group"] = col(self.shard_group, 4)
        cols["offload"] = col(self.offload, 5)
        cols["precision"] = np.array([self.precision[p]], dtype=np.int64)
        return LayoutTable(cols), (1, n, *self.variant_shape)

    def grid_mask(self, s0: int, s1: int) -> np.ndarray:
        """Legal cells of the grid of rows [s0, s1), shape (1, n, R, Z, G, O)."""
        m = self.vmask[s0:s1][None, :, None]
        return np.broadcast_to(m, (1, s1 - s0, *self.variant_shape))

    def chunks(self, target_cells: int = 100_000) -> list[tuple[int, int, int]]:
        """(precision index, s0, s1) pieces of about ``target_cells`` grid cells each."""
        rows = max(1, target_cells // max(self.cells_per_row, 1))
        out = []
        for p in range(len(self.precision)):
            for s0 in range(0, self.n_structural, rows):
                out.append((p, s0, min(self.n_structural, s0 + rows)))
        return out

    # ------------------------------------------------------------------------------ materialize
    def decode(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Flat columns (COLUMNS) of the layouts with the given grid ids."""
        ids = np.asarray(ids, dtype=np.int64)
        R, Z, G, O = self.variant_shape
        o = ids % O
        rest = ids // O
        g = rest % G
        rest //= G
        z = rest % Z
        rest //= Z
        r = rest % R
        rest //= R
        s = rest % self.n_structural
        p = rest // self.n_structural
        cols = {c: self.S[c][s] for c in STRUCTURAL}
        cols.update(
            recompute=self.recompute[r],
            zero=self.zero[z],
            shard_group=self.shard_group[g],
            offload=self.offload[o],
            precision=self.precision[p],
        )
        return {c: np.asarray(cols[c], dtype=np.int64) for c in COLUMNS}

    def table(self, ids: np.ndarray) -> LayoutTable:
        return LayoutTable(self.decode(ids))

    def legal_ids(self) -> np.ndarray:
        """Grid ids of every legal layout (materializes; for tests and small spaces)."""
        full = np.broadcast_to(self.vmask[:, None], (self.n_structural, *self.variant_shape))
        per_p = np.flatnonzero(full.reshape(-1))
        span = self.n_structural * self.cells_per_row
        return np.concatenate([per_p + p * span for p in range(len(self.precision))]) if len(per_p) else per_p

    def iter_tables(self, target_cells: int = 100_000) -> Iterator[tuple[np.ndarray, LayoutTable]]:
        """(grid ids, flat LayoutTable) of all legal layouts, in pieces (for tests and small spaces)."""
        ids = self.legal_ids()
        step = max(target_cells, 1)
        for i in range(0, len(ids), step):
            yield ids[i : i + step], self.table(ids[i : i + step])


def enumerate_space(job, space: SearchSpace, *, enforce_limit: bool = True) -> Enumeration:
    """Every legal layout of ``space`` for ``job`` (a :class:`autopar.engine.TrainingJob`)."""
    if not space.enumerable:
        raise SearchSpaceError(
            f"search space {space.name} has uneven pipeline splits with per-stage choices: far too many "
            "layouts to enumerate",
            "search it with `autopar study` (Optuna), or drop the uneven_pipeline section",
        )
    model = job.model
    av = axis_values(space, job)
    ctx = Context.for_job(job)
    N, B = job.num_devices, job.global_batch
    excluded: dict[str, int] = {}

    V = len(av.zero) * len(av.shard_group) * len(av.offload) * len(av.recompute) * len(av.precision)
    n_sp = 2 if av.sp == "both" else 1
    n_mb, n_ep = len(av.micro_batch), len(av.ep)
    n_vpp = len(av.vpp) * len(av.pipeline_ends)  # interleaving x end-stage split, bound together

    def etp_count(tp: np.ndarray) -> np.ndarray:
        if not model.is_moe:
            return np.ones_like(tp)
        if len(av.etp) == 1:
            return np.ones_like(tp)
        return np.where(tp == 1, 1, len(av.etp))

    def neutral(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(next(iter(rows.values())))
        base = {c: np.ones(n, dtype=np.int64) for c in COLUMNS}
        for c in (
            "zero",
            "shard_group",
            "sp",
            "offload",
            "recompute",
            "precision",
            "first_stage_layers",
            "last_stage_layers",
        ):
            base[c] = np.zeros(n, dtype=np.int64)
        base.update(rows)
        return base

    def apply(
        rows: dict[str, np.ndarray], codes: tuple[str, ...], weight: np.ndarray
    ) -> dict[str, np.ndarray]:
        alive = np.ones(len(weight), dtype=bool)
        cols = neutral(rows)
        for code in codes:
            bad = np.broadcast_to(_violated(code, model, cols, ctx), alive.shape) & alive
            if bad.any():
                excluded[code] = excluded.get(code, 0) + int(weight[bad].sum())
                alive &= ~bad
        return _filter(rows, alive)

    # Stage 1: tp x pp x cp, dp derived (world size).
    g_tp, g_pp, g_cp = np.meshgrid(np.array(av.tp), np.array(av.pp), np.array(av.cp), indexing="ij")
    rows = {"tp": g_tp.ravel(), "pp": g_pp.ravel(), "cp": g_cp.ravel()}
    mp = rows["tp"] * rows["pp"] * rows["cp"]
    rows["dp"] = np.where(N % mp == 0, N // mp, 0)
    rows["grad_accum"] = np.zeros_like(mp)
    w1 = etp_count(rows["tp"]) * n_ep * n_mb * n_vpp * n_sp * V
    candidates_total = int(w1.sum())
    rows = apply(rows, STAGE_RULES[0][1], w1)

    # Stage 2: expert parallelism and expert TP (dense models: etp = tp, as predict() resolves it).
    rows = _expand(rows, "ep", np.array(av.ep, dtype=np.int64))
    if model.is_moe:
        modes = np.array([0 if e == 1 else 1 for e in av.etp])  # 0: etp=1, 1: etp=tp
        rows = _expand(rows, "etp_mode", modes)
        rows["etp"] = np.where(rows["etp_mode"] == 1, rows["tp"], 1)
        # etp=1 and etp=tp coincide at tp=1: keep one (the candidate set is a set of layouts).
        keep = ~((rows["tp"] == 1) & (rows["etp_mode"] == 1) & (len(av.etp) > 1))
        rows = _filter(rows, keep)
        del rows["etp_mode"]
    else:
        rows["etp"] = rows["tp"].copy()
    rows = apply(rows, STAGE_RULES[1][1], np.full(len(rows["tp"]), n_mb * n_vpp * n_sp * V, dtype=np.int64))

    # Stage 3: micro-batch; gradient accumulation derived (global batch).
    rows = _expand(rows, "micro_batch", np.array(av.micro_batch, dtype=np.int64))
    per = rows["micro_batch"] * rows["dp"]
    rows["grad_accum"] = np.where((per > 0) & (B % np.maximum(per, 1) == 0), B // np.maximum(per, 1), 0)
    rows = apply(rows, STAGE_RULES[2][1], np.full(len(rows["tp"]), n_vpp * n_sp * V, dtype=np.int64))

    # Stage 4: virtual pipeline stages.
    rows = _expand(rows, "vpp", np.array(av.vpp, dtype=np.int64))
    # End-stage split: "minus_one" = (L + 2)/pp - 1 layers on the first and the last stage (illegal
    # values, where pp does not divide L + 2, are caught by the stage_layers rule).
    rows = _expand(rows, "ends", np.array(av.pipeline_ends, dtype=np.int64))
    pp_ = np.maximum(rows["pp"], 1)
    minus_one = np.where((model.layers + 2) % pp_ == 0, (model.layers + 2) // pp_ - 1, model.layers + 1)
    ends = np.where(rows.pop("ends") == 1, minus_one, 0)
    rows["first_stage_layers"] = ends
    rows["last_stage_layers"] = ends.copy()
    rows = apply(rows, STAGE_RULES[3][1], np.full(len(rows["tp"]), n_sp * V, dtype=np.int64))

    # Stage 5: sequence parallelism.
    if av.sp == "auto":
        rows["sp"] = (rows["tp"] > 1).astype(np.int64)
    else:
        rows = _expand(rows, "sp", np.array({"on": [1], "off": [0], "both": [0, 1]}[av.sp], dtype=np.int64))
        rows = apply(rows, STAGE_RULES[4][1], np.full(len(rows["tp"]), V, dtype=np.int64))
    S = {c: np.ascontiguousarray(rows[c], dtype=np.int64) for c in STRUCTURAL}

    # Stage 6: ZeRO stage x shard group x offload, per structural row (recompute has no rules).
    zero = np.array(av.zero, dtype=np.int64)
    sg = np.array(av.shard_group, dtype=np.int64)
    off = np.array(av.offload, dtype=np.int64)
    n_s = len(S["tp"])
    shape = (n_s, len(zero), len(sg), len(off))
    cols = neutral(
        {
            "dp": S["dp"][:, None, None, None],
            "cp": S["cp"][:, None, None, None],
            "tp": S["tp"][:, None, None, None],
            "zero": zero[None, :, None, None],
            "shard_group": sg[None, None, :, None],
            "offload": off[None, None, None, :],
        }
    )
    vmask = np.ones(shape, dtype=bool)
    weight = len(av.recompute) * len(av.precision)
    for code in STAGE_RULES[5][1]:
        if code == "duplicate" and 0 not in av.shard_group:
            continue
        bad = np.broadcast_to(_violated(code, model, cols, ctx), shape) & vmask
        if bad.any():
            excluded[code] = excluded.get(code, 0) + int(bad.sum()) * weight
            vmask &= ~bad

    # Stage 7: precision (fp8/mxfp8/nvfp4 need the device's tensor cores for them).
    prec = np.array(av.precision, dtype=np.int64)
    pcols = neutral({"precision": prec})
    bad_p = _violated("precision_unsupported", model, pcols, ctx) & np.ones(len(prec), dtype=bool)
    if bad_p.any():
        excluded["precision_unsupported"] = int(vmask.sum()) * len(av.recompute) * int(bad_p.sum())
    prec = prec[~bad_p]

    en = Enumeration(
        job=job,
        space=space,
        values=av,
        S=S,
        recompute=np.array(av.recompute, dtype=np.int64),
        zero=zero,
        shard_group=sg,
        offload=off,
        precision=prec,
        vmask=vmask,
        excluded=excluded,
        candidates_total=candidates_total,
    )
    if enforce_limit and en.size > space.limits.max_layouts:
        raise SearchSpaceError(
            f"search space {space.name} has {en.size:,} legal layouts for this job, above "
            f"limits.max_layouts={space.limits.max_layouts:,}",
            "narrow an axis (e.g. --set micro_batch=1,2) or raise limits.max_layouts",
        )
    return en


__all__ = ["Enumeration", "enumerate_space", "axis_values", "rule_message", "STAGE_RULES", "SPACE_RULES"]
