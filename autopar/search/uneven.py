"""Uneven pipeline splits with per-stage recompute: step time and memory of every stage.

The engine scores uniform pipelines (every stage ``ceil(L/p)`` layers, one recompute mode). Here
stage i holds ``layers[i]`` layers with its own recompute mode, and every stage is scored by the
engine's own per-stage entry point (:func:`autopar.engine.evaluate_stages`: the memory and
micro-batch time terms of ``autopar.memory``/``autopar.latency``, embedding on stage 0, LM head
and logits on the last, ``min(p - i, m)`` micro-batches in flight on stage i, Narayanan et al.
2021). Only the schedule is assembled here:

* synchronous 1F1B step: ``(m - 1) * max_i slot_i + sum_i slot_i`` (DAPPLE, Fan et al. 2021,
  PPoPP: the slowest stage paces the steady state, each stage appears once in fill and drain;
  :func:`autopar.latency.pipeline_schedule`, the engine's own schedule),
  plus the engine's send/recv time and data-parallel sync and optimizer step
  (:func:`autopar.engine.evaluate_tail`) for the most parameters on any stage, hidden behind the
  pacing stage's micro-batch;
* memory: the most loaded stage.

For an even split this is the engine's memory and step time (tests/test_study_uneven.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.blocks.stage import window
from autopar.coefficients import Calibration, load_calibration
from autopar.engine import evaluate_stages, evaluate_tail, memory_limit_bytes
from autopar.errors import SearchSpaceError
from autopar.job import TrainingJob
from autopar.latency import pipeline_schedule
from autopar.layout import RECOMPUTE_CODES, Layout, LayoutTable, recompute_weight
from autopar.memory import GIB, dense_moe
from autopar.schedules import bubble_terms


@dataclass(frozen=True)
class StagePlan:
    """Layers and recompute mode (code into RECOMPUTE_CODES) of each pipeline stage."""

    layers: tuple[int, ...]
    recompute: tuple[int, ...]

    def short(self) -> str:
        rc = {0: "n", 1: "s", 2: "f"}
        return " ".join(f"{n}{rc[r]}" for n, r in zip(self.layers, self.recompute, strict=True))


def even_split(layers: int, stages: int) -> list[int]:
    """Even split; the first ``layers % stages`` stages take one extra layer."""
    q, rem = divmod(layers, stages)
    return [q + (1 if i < rem else 0) for i in range(stages)]


def check_model(model) -> None:
    """Refuse a model whose stages cannot be told apart block by block: interleaved MoE or a hybrid
    stack without a stated block order, or a mix of sliding-window and full-attention layers."""
    ordered = bool(model.block_pattern)
    interleaved = model.is_moe and not (
        model.moe_layers == model.layers
        or model.first_dense_layers + model.moe_layers + model.no_ffn_layers == model.layers
    )
    if interleaved and not ordered:
        raise SearchSpaceError(
            f"uneven pipeline splits need the block order of {model.name}'s interleaved dense and MoE "
            "layers, which this model spec does not state",
            "load the model from its config.json (the reader records the order) or use a uniform search space",
        )
    if (model.no_ffn_layers or model.no_mixer_layers) and not ordered:
        raise SearchSpaceError(
            f"uneven pipeline splits need the block order of {model.name}'s blocks without a mixer or "
            "without a feed-forward part, which this model spec does not state",
            "load the model from its config.json (the reader records the order) or use a uniform search space",
        )
    if model.sliding_window_layers not in (0, model.layers):
        raise SearchSpaceError(
            f"uneven pipeline splits are not modeled for {model.name}'s mix of sliding-window "
            "and full-attention layers",
            "use a uniform search space for this model",
        )


def plan_blocks(model, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray, Any]:
    """(dense, MoE, mixers) of each stage of a contiguous split into ``layers`` blocks per stage:
    the stage's own blocks in the model's order (:func:`autopar.blocks.stage.window`), or dense and
    MoE layers where the model puts them (a dense prefix, :func:`autopar.memory.dense_moe`)."""
    starts = np.concatenate([[0], np.cumsum(layers)[:-1]]).astype(np.int64)
    if model.block_pattern:
        return window(model, starts, layers)
    nd, nm = dense_moe(model, starts, layers)
    return nd, nm, None


@dataclass(frozen=True)
class StageCosts:
    """Memory per device (bytes) and one micro-batch's time (s) of every stage, and the step tail."""

    memory: np.ndarray
    slot: np.ndarray
    tail: float  # pipeline send/recv + data-parallel sync + optimizer step
    bubble: np.ndarray  # each stage's share of the fill and drain (autopar.schedules.bubble_terms)


class UnevenScorer:
    """Score (base layout, stage plan) pairs with the engine's per-stage entry point."""

    def __init__(self, job: TrainingJob, calibration: Calibration | None = None) -> None:
        check_model(job.model)
        self.job = job
        self.cal = calibration or load_calibration()
        self._rows: dict[tuple, LayoutTable] = {}

    def _stage_rows(self, base: Layout) -> LayoutTable:
        """The base layout once per recompute code (cached); a plan's stages are taken from it."""
        key = _base_key(base)
        t = self._rows.get(key)
        if t is None:
            t = LayoutTable.from_layouts([base.model_copy(update={"recompute": r}) for r in RECOMPUTE_CODES])
            self._rows[key] = t
        return t

    def stage_costs(self, base: Layout, plan: StagePlan) -> StageCosts:
        """Every stage of ``plan`` scored in one engine call."""
        if base.vpp != 1:
            raise ValueError("uneven pipeline splits are modeled for the plain 1F1B schedule (vpp = 1)")
        p = base.pp
        rows = self._stage_rows(base).take(np.asarray(plan.recompute, dtype=np.int64))
        nd, nm, mixers = plan_blocks(self.job.model, np.asarray(plan.layers, dtype=np.int64))
        res = evaluate_stages(
            self.job, rows, stage=np.arange(p), n_dense=nd, n_moe=nm, calibration=self.cal, mixers=mixers
        )
        pace = int(np.argmax(res["slot_s"]))
        one = rows.take([pace])
        tail = evaluate_tail(
            self.job,
            one,
            params_nonexpert=res["params_nonexpert"].max(keepdims=True),
            params_expert=res["params_expert"].max(keepdims=True),
            fwd_s=res["fwd_s"][[pace]],
            bwd_s=res["bwd_s"][[pace]],
            recompute_s=res["recompute_s"][[pace]],
            calibration=self.cal,
        )
        t = float(tail["time_pp_comm"][0] + tail["time_dp_comm"][0] + tail["time_optimizer"][0])
        q = bubble_terms(self.job.pipeline_schedule, res["slot_s"], res["fwd_s"], res["wgrad_s"])
        return StageCosts(memory=res["memory_bytes"], slot=res["slot_s"], tail=t, bubble=q)

    def stage_memory(self, base: Layout, plan: StagePlan) -> np.ndarray:
        """Bytes per device of every stage."""
        return self.stage_costs(base, plan).memory

    def score(self, base: Layout, plan: StagePlan) -> dict[str, Any]:
        """Step time, throughput and per-stage memory of ``base`` split as ``plan``."""
        if base.pp < 2 or len(plan.layers) != base.pp or len(plan.recompute) != base.pp:
            raise ValueError(f"a stage plan for pp={base.pp} needs {base.pp} stages, got {len(plan.layers)}")
        if sum(plan.layers) != self.job.model.layers or min(plan.layers) < 1:
            raise ValueError(f"stage layers {plan.layers} must be >= 1 and sum to {self.job.model.layers}")
        sc = self.stage_costs(base, plan)
        pace = int(np.argmax(sc.slot))
        steady, bubble = pipeline_schedule(
            np.asarray(base.grad_accum),
            np.asarray(base.vpp),
            sc.slot.max(),
            sc.slot.sum(),
            sc.bubble[pace],
            sc.bubble.sum(),
        )
        step = float(steady) + float(bubble) + sc.tail
        mem = sc.memory
        cap = memory_limit_bytes(self.job)  # capacity less the job's headroom
        tokens = self.job.tokens_per_step
        return {
            "step_time_s": step,
            "tokens_per_s_per_device": tokens / (step * self.job.num_devices),
            "memory_bytes": float(mem.max()),
            "memory_gib_per_device": float(mem.max()) / GIB,
            "memory_capacity_gib": self.job.device.memory_gb * 1e9 / GIB,
            "memory_limit_gib": cap / GIB,
            "fits": bool(mem.max() <= cap),
            "stage_memory_gib": [float(x) / GIB for x in mem],
            "stage_slot_s": [float(x) for x in sc.slot],
            "pacing_stage": int(np.argmax(sc.slot)),
        }


def _base_key(base: Layout) -> tuple:
    d = base.model_dump()
    d.pop("recompute")
    return tuple(sorted(d.items()))


def balanced_split(
    scorer: UnevenScorer, base: Layout, rec: tuple[int, ...], max_shift: int
) -> tuple[float, StagePlan] | None:
    """The split that minimizes the slowest stage for a fixed recompute assignment (None if none fits).

    Stage memory and slot time are affine in a stage's layer count, so for a target slot time T
    stage i can hold at most min((T - c_i) / a_i, (capacity - beta_i) / alpha_i, even_i + k)
    layers; the smallest T whose maxima add up to the model's layers is found by bisection, and the
    surplus layers come off the stages with the most expensive layers first.
    """
    p, L = base.pp, scorer.job.model.layers
    even = even_split(L, p)
    lo = [max(1, e - max_shift) for e in even]
    hi = [e + max_shift for e in even]
    # The engine's stage memory and slot time are affine in the layer count: read the slope and
    # intercept of every stage off two engine calls.
    one = scorer.stage_costs(base, StagePlan((1,) * p, rec))
    two = scorer.stage_costs(base, StagePlan((2,) * p, rec))
    alpha, beta = two.memory - one.memory, 2 * one.memory - two.memory
    cap = memory_limit_bytes(scorer.job)
    a = [float(x) for x in two.slot - one.slot]
    c = [float(x) for x in 2 * one.slot - two.slot]
    mem_max = [min(hi[i], math.floor((cap - beta[i]) / alpha[i])) for i in range(p)]
    if any(mem_max[i] < lo[i] for i in range(p)) or sum(mem_max) < L:
        return None

    def most(t: float) -> list[int]:
        return [min(mem_max[i], math.floor((t - c[i]) / a[i] + 1e-9)) for i in range(p)]

    t_lo, t_hi = 0.0, max(mem_max[i] * a[i] + c[i] for i in range(p))
    for _ in range(60):
        t = 0.5 * (t_lo + t_hi)
        cnt = most(t)
        if all(cnt[i] >= lo[i] for i in range(p)) and sum(cnt) >= L:
            t_hi = t
        else:
            t_lo = t
    layers = most(t_hi)
    surplus = sum(layers) - L
    for i in sorted(range(p), key=lambda i: -a[i]):
        take = min(surplus, layers[i] - lo[i])
        layers[i] -= take
        surplus -= take
    plan = StagePlan(tuple(layers), rec)
    s = scorer.score(base, plan)
    return (s["tokens_per_s_per_device"], plan) if s["fits"] else None


def best_monotone_split(
    scorer: UnevenScorer, base: Layout, modes: list[int], max_shift: int
) -> tuple[float, StagePlan] | None:
    """:func:`balanced_split` over every monotone recompute assignment (heavier modes first).

    A monotone assignment is a count of stages per mode (heaviest on the first stages, which hold
    the most micro-batches in flight): the compositions of p into len(modes) parts, O(p^(k-1)).
    """
    heavy = sorted(set(modes), key=recompute_weight, reverse=True)
    p = base.pp
    best: tuple[float, StagePlan] | None = None

    def counts(k: int, left: int) -> Iterator[tuple[int, ...]]:
        if k == 1:
            yield (left,)
            return
        for a in range(left + 1):
            for rest in counts(k - 1, left - a):
                yield (a, *rest)

    for cnt in counts(len(heavy), p):
        rec: list[int] = []
        for mode, n in zip(heavy, cnt, strict=True):
            rec += [mode] * n
        got = balanced_split(scorer, base, tuple(rec), max_shift)
        if got is not None and (best is None or got[0] > best[0]):
            best = got
    return best
