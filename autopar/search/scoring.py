"""Scoring chunks of an enumeration with the engine and reducing each to a :class:`Summary`.

The core that every executor runs (in-process, a process pool in ``autopar.search.recommend``, Ray
tasks in ``autopar.search.ray_backend``): each chunk keeps only its top-k, its Pareto front and its
closest misses, and :func:`merge` combines chunk summaries in any order to the same answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autopar.coefficients import Calibration
from autopar.engine import evaluate
from autopar.objectives import Objectives, pareto_mask
from autopar.search.enumerate import Enumeration

KEEP_CLOSEST = 3


# ------------------------------------------------------------------------------ chunk summaries
@dataclass
class Summary:
    """What a chunk (or a merge of chunks) keeps: counts, top-k, Pareto front, closest misses."""

    n_legal: int = 0
    n_fit: int = 0
    top_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    top_keys: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # (primary, secondary)
    front_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    front_vals: np.ndarray = field(default_factory=lambda: np.zeros((0, 1)))
    close_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    close_ratio: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _top(ids: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k best by (primary, secondary, id), ties included deterministically."""
    if len(ids) > 4 * k:
        kth = np.partition(keys[:, 0], k - 1)[k - 1]
        sel = keys[:, 0] <= kth
        ids, keys = ids[sel], keys[sel]
    order = np.lexsort((ids, keys[:, 1], keys[:, 0]))[:k]
    return ids[order], keys[order]


def merge(summaries: Sequence[Summary], *, k: int, pareto: bool) -> Summary:
    out = Summary()
    if not summaries:
        return out
    out.n_legal = sum(s.n_legal for s in summaries)
    out.n_fit = sum(s.n_fit for s in summaries)
    ids = np.concatenate([s.top_ids for s in summaries])
    keys = np.concatenate([s.top_keys for s in summaries])
    out.top_ids, out.top_keys = _top(ids, keys, k) if len(ids) else (ids, keys)
    if pareto:
        fi = np.concatenate([s.front_ids for s in summaries])
        fv = np.concatenate([s.front_vals for s in summaries])
        keep = pareto_mask(fv, fi)
        order = np.lexsort((fi[keep], *fv[keep].T[::-1]))
        out.front_ids, out.front_vals = fi[keep][order], fv[keep][order]
    ci = np.concatenate([s.close_ids for s in summaries])
    cr = np.concatenate([s.close_ratio for s in summaries])
    order = np.lexsort((ci, cr))[:KEEP_CLOSEST]
    out.close_ids, out.close_ratio = ci[order], cr[order]
    return out


@dataclass
class ScoringState:
    """Everything a worker needs to score chunks (sent once to each process or Ray worker)."""

    enum: Enumeration
    calibration: Calibration
    objectives: Objectives
    k: int


def summarize_results(
    state: ScoringState,
    ids: np.ndarray,
    res: dict[str, np.ndarray],
    legal: np.ndarray | None = None,
    shape: tuple[int, ...] | None = None,
    base: int = 0,
) -> Summary:
    """Reduce one chunk's engine output to a Summary.

    Grid path: ``res`` arrays broadcast to ``shape`` and ``legal`` is the legal-cell mask of that
    shape; values are gathered only at the cells that matter (fitting cells, or the misses of a
    chunk where nothing fits: only then can they be the closest misses overall); a cell's layout id
    is ``base`` + its flat index. Flat path: ``shape`` is None and ``ids`` are the rows' layout ids.
    """
    job, obj = state.enum.job, state.objectives
    flat_ids = ids if shape is None else None
    if shape is None:
        shape = (len(ids),)
        legal = np.ones(shape, dtype=bool)
    assert legal is not None

    def at(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.broadcast_to(x, shape)[mask]

    fits = np.broadcast_to(res["fits"], shape) & legal
    n_fit = int(fits.sum())
    s = Summary(n_legal=len(ids), n_fit=n_fit)

    def cell_ids(mask: np.ndarray) -> np.ndarray:
        return flat_ids[mask] if flat_ids is not None else base + np.flatnonzero(mask)

    if n_fit:
        fid = cell_ids(fits)
        primary = at(obj.values(obj.primary, res, job.tokens_per_step), fits)
        secondary = at(res["memory_bytes"] if obj.primary == "throughput" else res["step_time_s"], fits)
        s.top_ids, s.top_keys = _top(fid, np.stack([primary, secondary], axis=1), state.k)
        if len(obj.names) > 1:
            vals = np.stack([at(obj.values(n, res, job.tokens_per_step), fits) for n in obj.names], axis=1)
            keep = pareto_mask(vals, fid)
            s.front_ids, s.front_vals = fid[keep], vals[keep]
        else:
            s.front_vals = np.zeros((0, 1))
    else:
        s.front_vals = np.zeros((0, len(obj.names)))
        miss = legal & ~fits
        if miss.any():
            ratio = at(res["memory_bytes"] / res["memory_limit_bytes"], miss)
            mid = cell_ids(miss)
            order = np.lexsort((mid, ratio))[:KEEP_CLOSEST]
            s.close_ids, s.close_ratio = mid[order], ratio[order]
    return s


def score_chunk(state: ScoringState, p: int, s0: int, s1: int) -> Summary:
    """Score grid rows [s0, s1) at precision index p with the engine (broadcast grid)."""
    en = state.enum
    table, shape = en.grid_table(p, s0, s1)
    legal = en.grid_mask(s0, s1)
    base = (p * en.n_structural + s0) * en.cells_per_row
    ids = base + np.flatnonzero(legal)
    try:
        res = evaluate(en.job, table, calibration=state.calibration, check_legal=False)
    except (ValueError, IndexError):  # pragma: no cover - the engine stopped broadcasting: score flat
        return score_ids(state, ids)
    return summarize_results(state, ids, res, legal, shape, base)


def score_ids(state: ScoringState, ids: np.ndarray) -> Summary:
    """Score the given layout ids as a flat table (the reference path; used by tests and fallbacks)."""
    res = evaluate(state.enum.job, state.enum.table(ids), calibration=state.calibration, check_legal=False)
    return summarize_results(state, ids, res)


def score_chunks(state: ScoringState, chunks: Sequence[tuple[int, int, int]]) -> Summary:
    return merge([score_chunk(state, *c) for c in chunks], k=state.k, pareto=len(state.objectives.names) > 1)
