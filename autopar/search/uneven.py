"""Uneven pipeline splits with per-stage recompute: step time and memory of every stage.

The engine scores uniform pipelines (every stage ``ceil(L/p)`` layers, one recompute mode, the LM
head charged to every slot). Here stage i holds ``layers[i]`` layers with its own recompute mode:

* slot time of stage i per micro-batch = ``layers[i] * a[r_i]`` (+ ``c`` on the last stage, the LM
  head and loss), with ``a`` and ``c`` read off the engine itself by scoring the same layout on
  copies of the model with 1 and 2 layers per stage (the engine's slot is affine in the layer count);
* synchronous 1F1B step: ``(m - 1) * max_i slot_i + sum_i slot_i`` (DAPPLE, Fan et al. 2021,
  PPoPP: the slowest stage paces the steady state, each stage appears once in fill and drain),
  plus the engine's send/recv time and the slowest stage's data-parallel sync and optimizer step;
* memory of stage i: its layers' model state (ZeRO/offload as in ``autopar.memory``), activations
  of ``min(p - i, m)`` in-flight micro-batches (Narayanan et al. 2021, 1F1B), embedding on stage 0,
  logits on the last stage, the same buffers and reserve as the engine.

For an even split this is the engine's memory and step time exactly (both charge the LM head to
the last stage only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autopar.coefficients import Calibration, load_calibration, memory_constants
from autopar.engine import TrainingJob, evaluate
from autopar.errors import SearchSpaceError
from autopar.layout import RECOMPUTE_CODES, Layout, LayoutTable
from autopar.memory import (
    GIB,
    GRAD_BYTES,
    LOGIT_BYTES,
    OPTIM_BYTES,
    REC_FULL,
    WEIGHT_BYTES,
    activation_bytes_per_layer,
    layer_params_per_rank,
)

# Per-micro-batch parts of the engine's step time (``time_<part>`` are m x the slot's parts).
SLOT_PARTS = ("gemm", "attention", "elementwise", "recompute", "tp_comm", "cp_comm", "ep_comm")


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
    if model.is_moe and (model.first_dense_layers or model.moe_layers != model.layers):
        raise SearchSpaceError(
            f"uneven pipeline splits are modeled for dense or all-MoE models; {model.name} mixes "
            f"{model.dense_layers} dense and {model.moe_layers} MoE layers",
            "use a uniform search space for this model",
        )
    if model.sliding_window_layers not in (0, model.layers):
        raise SearchSpaceError(
            f"uneven pipeline splits are not modeled for {model.name}'s mix of sliding-window "
            "and full-attention layers",
            "use a uniform search space for this model",
        )


def _model_with_layers(model, n: int):
    update: dict[str, Any] = {"layers": n}
    if model.is_moe:
        update["moe_layers"] = n
    if model.sliding_window_layers:
        update["sliding_window_layers"] = n
    return model.model_copy(update=update)


@dataclass
class BaseCosts:
    """Per-recompute-mode slot coefficients of one base layout, and its tail cache."""

    a: np.ndarray  # (3,) seconds per layer per micro-batch, by recompute code
    c: float  # LM head + loss per micro-batch on the last stage
    pp_comm: float
    tail: dict[tuple[int, int], float]
    memory: dict[str, Any] | None = None


class UnevenScorer:
    """Score (base layout, stage plan) pairs; engine calls are cached per base layout."""

    def __init__(self, job: TrainingJob, calibration: Calibration | None = None) -> None:
        check_model(job.model)
        self.job = job
        self.cal = calibration or load_calibration()
        self.consts = memory_constants(self.cal)
        self._base: dict[tuple, BaseCosts] = {}

    # ------------------------------------------------------------------------------ engine reads
    def _eval(self, base: Layout, layers_per_stage: int, recompute: list[int]) -> dict[str, np.ndarray]:
        job = replace(self.job, model=_model_with_layers(self.job.model, layers_per_stage * base.pp))
        rows = [base.model_copy(update={"recompute": RECOMPUTE_CODES[r]}) for r in recompute]
        return evaluate(job, LayoutTable.from_layouts(rows), calibration=self.cal)

    @staticmethod
    def _slots(res: dict[str, np.ndarray], m: int) -> np.ndarray:
        total = np.zeros_like(res["step_time_s"])
        for k in SLOT_PARTS:
            total = total + res[f"time_{k}"]
        return total / float(m)

    def base_costs(self, base: Layout) -> BaseCosts:
        key = _base_key(base)
        bc = self._base.get(key)
        if bc is None:
            r = [0, 1, 2]
            one, two = self._eval(base, 1, r), self._eval(base, 2, r)
            s1, s2 = self._slots(one, base.grad_accum), self._slots(two, base.grad_accum)
            a = s2 - s1
            c = float((s1 - a)[0])
            bc = BaseCosts(a=a, c=c, pp_comm=float(one["time_pp_comm"][0]), tail={})
            self._base[key] = bc
        return bc

    def tail(self, base: Layout, layers: int, rec: int) -> float:
        bc = self.base_costs(base)
        t = bc.tail.get((layers, rec))
        if t is None:
            res = self._eval(base, layers, [rec])
            t = float(res["time_dp_comm"][0] + res["time_optimizer"][0])
            bc.tail[(layers, rec)] = t
        return t

    # ------------------------------------------------------------------------------------ score
    def _memory_terms(self, base: Layout) -> dict[str, Any]:
        """Per-layer and per-stage memory terms of a base layout (cached: they do not depend on the plan)."""
        bc = self.base_costs(base)
        if bc.memory is not None:
            return bc.memory
        model = self.job.model
        one = LayoutTable.from_layouts([base.model_copy(update={"recompute": r}) for r in RECOMPUTE_CODES])
        dense_p, moe_p, expert_p = (float(x[0]) for x in layer_params_per_rank(model, one))
        tp = float(base.tp)
        embed = model.embedding_params / tp
        head = model.head_params / tp + model.final_norm_params
        if model.tie_embeddings:
            head = head + embed
        common: dict[str, Any] = dict(
            seq_len=self.job.seq_len,
            micro_batch=one["micro_batch"],
            tp=one["tp"],
            cp=one["cp"],
            sp=one["sp"],
            recompute=one["recompute"],
            flash_attention=True,
            dropout=False,
        )
        act_layer = activation_bytes_per_layer(model, moe=model.is_moe, **common)  # by recompute code
        full_layer = float(
            activation_bytes_per_layer(
                model, moe=model.is_moe, **{**common, "recompute": one["recompute"] * 0}
            )[0]
        )
        sb = self.job.seq_len / base.cp * base.micro_batch
        sp_div = tp if base.sp else 1.0
        max_layer = max(dense_p, moe_p + expert_p if model.is_moe else 0.0)
        groups = (base.tp > 1) + (base.pp > 1) + (base.cp > 1) + (base.ep > 1) + (base.dp * base.cp > 1)
        terms = {
            "layer_nonexp": moe_p if model.is_moe else dense_p,
            "layer_exp": expert_p if model.is_moe else 0.0,
            "embed": embed,
            "head": head,
            "act_layer": np.asarray(act_layer, dtype=np.float64),
            "full_layer": full_layer,
            "embed_out": 2.0 * sb * model.hidden / sp_div,
            "logits": LOGIT_BYTES * sb * model.vocab / tp,
            "z3": (2.0 * max_layer * WEIGHT_BYTES + max_layer * GRAD_BYTES * 2) if base.zero >= 3 else 0.0,
            "fixed": self.consts["comm_buffer_bytes"] * groups + self.consts["framework_reserve_bytes"],
        }
        bc.memory = terms
        return terms

    def stage_memory(self, base: Layout, plan: StagePlan) -> np.ndarray:
        """Bytes per device of every stage (the components of ``autopar.memory``, stage by stage)."""
        t = self._memory_terms(base)
        p = base.pp
        layers = np.asarray(plan.layers, dtype=np.float64)
        rec = np.asarray(plan.recompute, dtype=np.int64)
        idx = np.arange(p)
        first, last = idx == 0, idx == p - 1
        nonexp = (
            layers * t["layer_nonexp"] + np.where(first, t["embed"], 0.0) + np.where(last, t["head"], 0.0)
        )
        exp = layers * t["layer_exp"]
        shard = float(base.shard_group or base.dp * base.cp)
        eshard = min(shard, base.tp * base.cp * base.dp / (base.ep * base.etp))
        z = base.zero
        w = WEIGHT_BYTES * ((nonexp / shard if z >= 3 else nonexp) + (exp / eshard if z >= 3 else exp))
        g = GRAD_BYTES * ((nonexp / shard if z >= 2 else nonexp) + (exp / eshard if z >= 2 else exp))
        o = OPTIM_BYTES * ((nonexp / shard if z >= 1 else nonexp) + (exp / eshard if z >= 1 else exp))
        if base.offload:
            o = o * 0.0
        inflight = np.minimum(p - idx, base.grad_accum).astype(np.float64)
        act = layers * t["act_layer"][rec] * inflight + np.where(rec == REC_FULL, t["full_layer"], 0.0)
        emb = np.where(first, t["embed_out"] * inflight, 0.0) + np.where(last, t["logits"], 0.0)
        return w + g + o + act * (1 + self.consts["fragmentation"]) + emb + t["z3"] + t["fixed"]

    def score(self, base: Layout, plan: StagePlan) -> dict[str, Any]:
        """Step time, throughput and per-stage memory of ``base`` split as ``plan``."""
        if base.pp < 2 or len(plan.layers) != base.pp or len(plan.recompute) != base.pp:
            raise ValueError(f"a stage plan for pp={base.pp} needs {base.pp} stages, got {len(plan.layers)}")
        if sum(plan.layers) != self.job.model.layers or min(plan.layers) < 1:
            raise ValueError(f"stage layers {plan.layers} must be >= 1 and sum to {self.job.model.layers}")
        bc = self.base_costs(base)
        layers = np.asarray(plan.layers, dtype=np.float64)
        rec = np.asarray(plan.recompute, dtype=np.int64)
        slots = layers * bc.a[rec]
        slots[-1] += bc.c
        m = base.grad_accum
        tail = max(
            self.tail(base, int(n), int(r))
            for n, r in sorted(set(zip(plan.layers, plan.recompute, strict=True)))
        )
        step = (m - 1) * float(slots.max()) + float(slots.sum()) + bc.pp_comm + tail
        mem = self.stage_memory(base, plan)
        cap = self.job.device.memory_gb * 1e9
        tokens = self.job.tokens_per_step
        return {
            "step_time_s": step,
            "tokens_per_s_per_device": tokens / (step * self.job.num_devices),
            "memory_bytes": float(mem.max()),
            "memory_gib_per_device": float(mem.max()) / GIB,
            "memory_capacity_gib": cap / GIB,
            "fits": bool(mem.max() <= cap),
            "stage_memory_gib": [float(x) / GIB for x in mem],
            "stage_slot_s": [float(x) for x in slots],
            "pacing_stage": int(np.argmax(slots)),
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
    import math

    p, L = base.pp, scorer.job.model.layers
    even = even_split(L, p)
    lo = [max(1, e - max_shift) for e in even]
    hi = [e + max_shift for e in even]
    m1 = scorer.stage_memory(base, StagePlan((1,) * p, rec))
    m2 = scorer.stage_memory(base, StagePlan((2,) * p, rec))
    alpha, beta = m2 - m1, 2 * m1 - m2
    cap = scorer.job.device.memory_gb * 1e9
    bc = scorer.base_costs(base)
    a = [float(bc.a[r]) for r in rec]
    c = [0.0] * (p - 1) + [bc.c]
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
    """:func:`balanced_split` over every monotone recompute assignment (heavier modes first)."""
    heavy = sorted(set(modes), reverse=True)
    p = base.pp
    best: tuple[float, StagePlan] | None = None
    counts: list[tuple[int, ...]] = [()] if len(heavy) == 1 else [(a,) for a in range(p + 1)]
    if len(heavy) == 3:
        counts = [(a, b) for a in range(p + 1) for b in range(p + 1 - a)]
    for cnt in counts:
        rec: list[int] = []
        for mode, n in zip(heavy, cnt, strict=False):
            rec += [mode] * n
        rec += [heavy[-1]] * (p - len(rec))
        got = balanced_split(scorer, base, tuple(rec), max_shift)
        if got is not None and (best is None or got[0] > best[0]):
            best = got
    return best
