"""Serving layout search: TP x PP x EP (x attention-DP) x replicas x concurrency x power cap, plus
disaggregated prefill/decode pools, under TTFT/TPOT/goodput targets.

``serve(...)`` (also ``autopar serve``) enumerates instance shapes, scores every candidate with the
vectorized model of :mod:`autopar.serving.estimate`, and returns the best layouts, the Pareto front of output
tokens/s per device against tokens/s per user, and, under a request rate, the fewest devices that
sustain it. The JSON has the shape of ``recommend --json``: ``layouts_enumerated``,
``layouts_feasible``, ``infeasible_by_reason`` and ``results``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopar.energy import NODE_OVERHEAD_LOAD
from autopar.errors import AutoparError, InfeasibleError
from autopar.job import SCHEMA_VERSION, Job
from autopar.limits import MAX_SERVE_DEVICES, check_count
from autopar.objectives import cost_per_mtok, pareto_front
from autopar.serving.estimate import (
    GIB,
    REASONS,
    ServingContext,
    ServingTable,
    ServingWorkload,
    attainment,
    draft_time,
    evaluate_serving,
    instance_memory,
    iteration,
    make_context,
    make_workload,
    meets_targets,
    power_demand,
    prefill_split,
    speculation,
    wait_quantile,
    z_score,
)

__all__ = ["serve", "ServingResult", "ServingInfeasible", "enumerate_instances", "search_serving"]

MAX_TP = 64
MAX_PP = 16
# What ``serve`` ranks by. "throughput": what the cluster the user gave delivers (output tokens/s of
# all its devices; devices a layout leaves idle deliver nothing; under a request rate, the highest
# request rate the layout sustains on the cluster). "fewest-devices": the fewest devices that carry
# the given load (request rate or concurrency) within the targets, then throughput.
OBJECTIVES = ("throughput", "fewest-devices")
MAX_PARETO = 64  # Pareto points listed (evenly spread along the front, the chosen layout always)
TARGET_REASONS = {
    "ttft_target": "TTFT (the mean, or the --percentile) above the target",
    "tpot_target": "TPOT (the mean, or the --percentile) above the target",
    "goodput_target": "share of requests meeting the targets below the goodput target",
}
# Rules of the layout's shape alone: a search that fails only on these failed on divisibility.
SHAPE_REASONS = (
    "tp_heads",
    "tp_kv_heads",
    "pp_layers",
    "ep_experts",
    "backend_ep",
    "attention_dp_dense",
    "ep_dispatch_width",
)
LEGALITY_REASONS = frozenset(SHAPE_REASONS)
# Order in which an infeasible candidate's first reason is counted.
REASON_ORDER = (
    *SHAPE_REASONS,
    "power_cap_range",
    "devices",
    "weights_do_not_fit",
    "kv_cache",
    "token_budget",
    "saturated",
    "ttft_target",
    "tpot_target",
    "goodput_target",
)


class ServingInfeasible(InfeasibleError):
    """No serving layout meets the request; ``closest`` holds the best achievable figures."""

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        closest: dict[str, Any] | None = None,
        result: ServingResult | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.closest = closest or {}
        self.result = result


@dataclass
class ServingResult:
    """What ``serve`` found; ``to_dict()`` is what ``autopar serve --json`` prints."""

    job: dict[str, Any]
    workload: dict[str, Any]
    layouts_enumerated: int
    layouts_feasible: int
    infeasible_by_reason: dict[str, int]
    results: list[dict[str, Any]]
    pareto: list[dict[str, Any]]
    min_devices: dict[str, Any] | None = None
    closest: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    costing: dict[str, Any] = field(default_factory=dict)
    objective: str = "throughput"
    num_devices: int = 0
    pareto_info: dict[str, Any] = field(default_factory=dict)

    @property
    def ranking(self) -> str:
        """One phrase saying what the results are ranked by."""
        n = self.num_devices
        if self.objective == "fewest-devices":
            then = "request rate sustained" if self.workload.get("request_rate") else "output tokens/s"
            return f"the fewest devices that carry the load, then the highest {then}"
        if self.workload.get("request_rate"):
            return f"the highest request rate sustained on the {n} devices given"
        return f"output tokens/s of the {n} devices given (idle devices deliver nothing)"

    @property
    def best(self) -> dict[str, Any] | None:
        return self.results[0] if self.results else None

    @property
    def expected_error_p90(self) -> float | None:
        """The 90th percentile of |relative error| of the predicted output tokens/s (held-out
        serving runs, widened where the prediction leaves their domain); None: not quoted."""
        ee = self.costing.get("expected_error")
        return ee["p90"] if ee else None

    def __repr__(self) -> str:  # one line: the full record is to_dict()
        c = self.job.get("cluster", {})
        head = f"{self.job.get('model')} on {c.get('num_devices')} x {c.get('device')}"
        b = self.best
        if b is None:
            return f"ServingResult({head}: no deployment meets the targets)"
        return (
            f"ServingResult({head}: best {b.get('short')} ({b.get('mode')}) at "
            f"{b.get('output_tokens_per_s_per_device') or 0:,.0f} output tokens/s/device; "
            f"{len(self.results)} results of {self.layouts_feasible:,} feasible)"
        )

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The ranked table (columns, formatted rows), as the HTML report and notebooks show it."""

        def f(x: Any, nd: int = 1) -> str:
            return "-" if x is None else f"{x:,.{nd}f}" if isinstance(x, float) else str(x)

        p = self.workload.get("percentile")
        pct_cols = [f"TTFT p{p} ms", f"TPOT p{p} ms"] if p else []
        cols = [
            "#",
            "layout",
            "devices",
            "idle",
            "TTFT ms",
            "TPOT ms",
            *pct_cols,
            "tok/s",
            "tok/s/device",
            "tok/s/user",
            "tok/J",
            "$/Mtok",
        ]
        rows = [
            [
                str(i),
                r["short"] + (f" cap{r['power_cap_w']:.0f}W" if r.get("power_cap_w") else ""),
                str(r["devices"]),
                str(r["idle_devices"]),
                f(r["ttft_ms"]),
                f(r["tpot_ms"], 2),
                *([f(r.get(f"ttft_ms_p{p}")), f(r.get(f"tpot_ms_p{p}"), 2)] if p else []),
                f(r["output_tokens_per_s"], 0),
                f(r["output_tokens_per_s_per_device"], 0),
                f(r["output_tokens_per_s_per_user"]),
                f(r["output_tokens_per_joule"], 2),
                f(r.get("cost_per_mtok"), 3),
            ]
            for i, r in enumerate(self.results, 1)
        ]
        return cols, rows

    def _repr_html_(self) -> str:
        from autopar.report import table_html

        cols, rows = self.table()
        return table_html(
            cols, rows, highlight_first=True, caption=f"{self.job['model']}: best serving layouts"
        )

    def to_frame(self) -> Any:
        """The ranked layouts as a pandas DataFrame, one row per layout; nested breakdowns are
        flattened into ``time_ms_<part>`` and ``memory_gib_<part>`` columns (needs pandas)."""
        from autopar.report import frame

        rows = []
        for r in self.results:
            d = {k: v for k, v in r.items() if not isinstance(v, dict | list)}
            for key, prefix in (
                ("time_ms_per_iteration", "time_ms_"),
                ("memory_gib_per_device", "memory_gib_"),
            ):
                for k, v in (r.get(key) or {}).items() if isinstance(r.get(key), dict) else ():
                    d[prefix + k] = v
            rows.append(d)
        return frame(rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "job": self.job,
            "objective": self.objective,
            "expected_error_p90": self.expected_error_p90,
            "ranked_by": self.ranking,
            "costing": self.costing,
            "workload": self.workload,
            "layouts_enumerated": self.layouts_enumerated,
            "layouts_feasible": self.layouts_feasible,
            "infeasible_by_reason": self.infeasible_by_reason,
            "results": self.results,
            "pareto": self.pareto,
            "pareto_front": self.pareto_info,
            "min_devices": self.min_devices,
            "closest": self.closest,
            "notes": self.notes,
        }


def check_objective(objective: str, workload: ServingWorkload) -> None:
    """Refuse an unknown objective, or "fewest-devices" without a load to carry."""
    if objective not in OBJECTIVES:
        raise AutoparError(
            f"unknown serving objective {objective!r}", f"choose one of {', '.join(OBJECTIVES)}"
        )
    if objective == "fewest-devices" and workload.mode not in ("request_rate", "concurrency"):
        raise AutoparError(
            "objective fewest-devices needs a load to carry",
            "give --request-rate or --concurrency (or drop --objective fewest-devices)",
        )


# ========================================================================================= enumeration
def pow2_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def enumerate_instances(
    model,
    num_devices: int,
    *,
    tp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    adp: int | None = None,
) -> ServingTable:
    """Instance shapes (tp, pp, ep, adp) with tp*pp <= num_devices; given values pin a dimension."""
    tps = [tp] if tp else [t for t in pow2_upto(min(num_devices, MAX_TP))]
    pps = [pp] if pp else [p for p in pow2_upto(min(num_devices, MAX_PP)) if p <= model.layers]
    rows = []
    for t in tps:
        for p in pps:
            if t * p > num_devices:
                continue
            if model.is_moe:
                eps = [ep] if ep else [e for e in pow2_upto(t) if model.num_experts % e == 0]
                adps = [adp] if adp else sorted({1, t})
            else:
                eps, adps = [ep or 1], [adp or 1]
            for e in eps:
                for a in adps:
                    rows.append((t, p, e, a))
    if not rows:
        raise AutoparError(
            f"no instance shape fits {num_devices} devices with the pinned degrees (tp={tp}, pp={pp})",
            "pin degrees whose product is at most --num-devices",
        )
    arr = np.array(rows, dtype=np.float64)
    return ServingTable({"tp": arr[:, 0], "pp": arr[:, 1], "ep": arr[:, 2], "adp": arr[:, 3]})


def _levels(max_conc: np.ndarray, cap: int) -> list[np.ndarray]:
    """Per instance: concurrency levels 1, 2, 4, ... below its memory maximum, plus the maximum."""
    out = []
    for mc in max_conc:
        top = int(min(mc, cap))
        if top < 1:
            out.append(np.array([1.0]))
            continue
        lv = [v for v in pow2_upto(top) if v < top] + [top]
        out.append(np.array(lv, dtype=np.float64))
    return out


# ============================================================================================ helpers
def _first_reason(masks: dict[str, np.ndarray], n: int) -> np.ndarray:
    """Index into REASON_ORDER of each row's first violated rule (-1 where none)."""
    first = np.full(n, -1)
    for i, code in reversed(list(enumerate(REASON_ORDER))):
        if code in masks:
            first = np.where(masks[code], i, first)
    return first


def _count(first: np.ndarray, out: dict[str, int]) -> None:
    for i in np.unique(first[first >= 0]):
        out[REASON_ORDER[int(i)]] = out.get(REASON_ORDER[int(i)], 0) + int(np.sum(first == i))


def _cost_per_mtok(price: float | None, tps_per_device: np.ndarray) -> np.ndarray | None:
    return None if price is None else cost_per_mtok(tps_per_device, price)


def _short(tp: int, pp: int, ep: int, adp: int) -> str:
    s = f"tp{tp} pp{pp}"
    if ep > 1:
        s += f" ep{ep}"
    if adp > 1:
        s += f" adp{adp}"
    return s


# ====================================================================================== aggregated
def _aggregated(
    ctx: ServingContext, inst: ServingTable, num_devices: int, caps: list[float], price: float | None
) -> dict[str, Any]:
    """Score aggregated (co-located prefill+decode) candidates; returns arrays and row metadata."""
    w = ctx.workload
    mode = w.mode
    base_mem = instance_memory(ctx, inst)
    max_conc = np.minimum(base_mem["max_conc"], ctx.max_batch)
    n_inst = len(inst)
    devs = inst.devices
    idx: list[np.ndarray] = []
    conc: list[np.ndarray] = []
    reps: list[np.ndarray] = []
    if mode == "sweep":
        lv = _levels(max_conc, ctx.max_batch)
        for i in range(n_inst):
            idx.append(np.full(len(lv[i]), i))
            conc.append(lv[i])
            reps.append(np.full(len(lv[i]), max(num_devices // int(devs[i]), 1)))
    elif mode == "offline":
        idx.append(np.arange(n_inst))
        conc.append(np.zeros(n_inst))
        reps.append(np.maximum(num_devices // devs, 1))
    elif mode == "concurrency":
        for i in range(n_inst):
            r = np.arange(1, max(num_devices // int(devs[i]), 1) + 1, dtype=np.float64)
            idx.append(np.full(len(r), i))
            conc.append(np.ceil(float(w.concurrency or 1) / r))
            reps.append(r)
    else:  # request_rate: every replica count up to the device budget
        for i in range(n_inst):
            r = np.arange(1, max(num_devices // int(devs[i]), 1) + 1, dtype=np.float64)
            idx.append(np.full(len(r), i))
            conc.append(np.zeros(len(r)))
            reps.append(r)
    ii = np.concatenate(idx)
    cc = np.concatenate(conc)
    rr = np.concatenate(reps)
    k = len(caps)
    ii, cc, rr = np.repeat(ii, k), np.repeat(cc, k), np.repeat(rr, k)
    cap = np.tile(np.asarray(caps, dtype=np.float64), len(ii) // k)
    tab = inst.take(ii).with_columns(conc=cc, cap_w=cap)
    rate = None if mode != "request_rate" else w.request_rate / rr
    res = evaluate_serving(ctx, tab, rate_per_instance=rate)
    bad = dict(res["bad"])
    bad["devices"] = tab.devices > num_devices
    bad.update(meets_targets(ctx, res))
    first = _first_reason(bad, len(tab))
    res["attainment"] = attainment(ctx, res)
    # What the replicas deliver together, and the highest request rate they sustain (under a request
    # rate, each replica's load factor rho = lambda / mu says how far below its capacity it runs).
    total = res["output_tps_instance"] * rr
    if mode == "request_rate":
        capacity = w.request_rate / np.maximum(res["rho"], 1e-30)
    else:
        capacity = total / w.osl
    return {
        "num_devices": num_devices,
        "total_tps": total,
        "capacity_rate": capacity,
        "tab": tab,
        "res": res,
        "replicas": rr,
        "first": first,
        "inst_index": ii,
        "cost": _cost_per_mtok(price, res["output_tps_per_device"]),
    }


def _agg_record(ctx: ServingContext, agg: dict[str, Any], i: int, price: float | None) -> dict[str, Any]:
    tab, res = agg["tab"], agg["res"]
    w = ctx.workload
    t = {k: int(tab[k][i]) for k in ("tp", "pp", "ep", "adp")}
    reps = int(agg["replicas"][i])
    dev = int(tab.devices[i])
    batch = float(res["batch"][i])
    rec: dict[str, Any] = {
        "mode": "aggregated",
        **t,
        "replicas": reps,
        "devices_per_instance": dev,
        "devices": dev * reps,
        "idle_devices": int(agg["num_devices"]) - dev * reps,
        "concurrency_per_instance": round(batch, 2),
        "concurrency": round(batch * reps, 2),
        "max_num_tokens": int(res["budget"][i]),  # token budget per iteration it was scored with
        "power_cap_w": float(tab["cap_w"][i]) or None,
        "short": _short(**t) + f" x{reps} b{batch:.0f}",
        "ttft_ms": float(res["ttft_s"][i]) * 1e3,
        "tpot_ms": float(res["tpot_s"][i]) * 1e3,
        "output_tokens_per_s": float(res["output_tps_instance"][i]) * reps,
        "output_tokens_per_s_per_device": float(res["output_tps_per_device"][i]),
        "output_tokens_per_s_per_user": float(res["output_tps_per_user"][i]),
        "request_rate": float(res["request_rate_instance"][i]) * reps,
        "max_request_rate": float(agg["capacity_rate"][i]),
        "load_factor": float(res["rho"][i]) if w.mode == "request_rate" else None,
        "saturated": bool(res["saturated"][i]),
        "slo_attainment": float(res["attainment"][i]),
        "avg_power_w": float(res["power_w"][i]),
        "clock_factor": float(res["clock"][i]),
        "j_per_output_token": float(res["j_per_token"][i]),
        "j_per_request": float(res["j_per_request"][i]),
        "output_tokens_per_joule": 1.0 / float(res["j_per_token"][i]),
        "cost_per_mtok": None if agg["cost"] is None else float(agg["cost"][i]),
        "memory_gib_per_device": {
            "weights": float(res["mem_weights"][i]) / GIB,
            "workspace": float(res["mem_workspace"][i]) / GIB,
            "runtime_reserve": float(res["mem_reserve"][i]) / GIB,
            "kv_cache_available": float(res["mem_kv_available"][i]) / GIB,
            "kv_cache_used": float(res["mem_kv_per_seq"][i] * batch / tab["adp"][i]) / GIB,
            "capacity": float(res["mem_capacity"][i]) / GIB,
        },
        "max_concurrency_per_instance": float(res["max_conc"][i]),
        "time_ms_per_iteration": {
            "compute": float(res["t_compute"][i]) * 1e3,
            "comm": float(res["t_comm"][i]) * 1e3,
            "host": float(res["t_host"][i]) * 1e3,
        },
    }
    if w.percentile is not None:
        rec[f"ttft_ms_p{w.percentile}"] = float(res["ttft_pct_s"][i]) * 1e3
        rec[f"tpot_ms_p{w.percentile}"] = float(res["tpot_pct_s"][i]) * 1e3
    return rec


# ==================================================================================== disaggregated
def kv_handoff_s(ctx: ServingContext, np_dev: Any, nd_dev: Any) -> Any:
    """Seconds to hand a prompt's whole KV cache from a prefill instance of ``np_dev`` devices to a
    decode instance of ``nd_dev``: over the scale-up links when both share a node, else the NICs."""
    kv_bytes = ctx.model.kv_cache_bytes(int(ctx.workload.isl), ctx.kv_bytes)
    same_node = (np_dev + nd_dev) <= ctx.devices_per_node
    lanes = np.minimum(np_dev, nd_dev)
    bw = np.where(same_node, ctx.links.up_peer, ctx.links.out_nic) * lanes
    return kv_bytes / bw + np.where(same_node, ctx.links.lat_up, ctx.links.lat_out)


def _disaggregated(
    ctx: ServingContext,
    inst: ServingTable,
    num_devices: int,
    price: float | None,
    objective: str = "throughput",
) -> dict[str, Any] | None:
    """xPyD: prefill instances hand the KV cache to decode instances (DistServe, Splitwise, Dynamo)."""
    w = ctx.workload
    isl, osl = float(w.isl), float(w.osl)
    if num_devices < 2:
        return None
    inst = inst.with_columns(conc=np.zeros(len(inst)), cap_w=np.zeros(len(inst)))
    # ---- prefill pool: prompts only; k prompts per iteration (k = 1, 2, 4, ... what the budget
    # holds: larger k is more throughput and a longer TTFT), or chunks of the budget -------------
    budget_p = float(w.max_num_tokens or 8192)
    new, cached = prefill_split(w)  # prefix-cached prompt tokens are not prefilled again
    mem_p = instance_memory(ctx, inst, seq_len=isl, batch_cap=np.ones(len(inst)))
    kmax = np.minimum(max(math.floor(budget_p / new), 1), np.maximum(mem_p["max_conc"], 1))
    klv = _levels(kmax, 1 << 20)
    pi_ = np.concatenate([np.full(len(v), i) for i, v in enumerate(klv)])
    k = np.concatenate(klv)
    ptab = inst.take(pi_)
    chunk = min(new, budget_p)
    n_chunks = math.ceil(new / chunk)
    tok = k * new if new <= budget_p else np.full(len(k), chunk)
    it_p = iteration(
        ctx, ptab, n_dec=0.0, n_pre=tok, dec_ctx=0.0, pre_ctx=cached + new / 2.0, pre_len=isl, logit_rows=k
    )
    t_p = it_p["t_iter"] * (1.0 if new <= budget_p else n_chunks)
    rate_p = k / t_p
    pw_p = power_demand(ctx, it_p)["avg_w"]
    legal_masks = [
        v
        for kk, v in evaluate_serving(ctx, inst)["bad"].items()
        if kk in SHAPE_REASONS and kk != "backend_ep"
    ]
    illegal = np.logical_or.reduce(legal_masks) if legal_masks else np.zeros(len(inst), dtype=bool)
    ok_p = (~illegal & mem_p["weights_fit"] & (mem_p["max_conc"] >= 1))[pi_]
    # ---- decode pool: decode-only iterations at every concurrency level ------------------------
    mem_d = instance_memory(ctx, inst)
    maxc = np.minimum(mem_d["max_conc"], ctx.max_batch)
    lv = _levels(maxc, ctx.max_batch)
    di = np.concatenate([np.full(len(v), i) for i, v in enumerate(lv)])
    B = np.concatenate(lv)
    dtab = inst.take(di)
    q, tau = speculation(w)  # speculative decoding: q tokens verified per step, tau emitted
    it_d = iteration(
        ctx, dtab, n_dec=B, n_pre=0.0, dec_ctx=isl + osl / 2.0, pre_ctx=0.0, pre_len=1.0, logit_rows=B * q,
        dec_tokens=q,
    )  # fmt: skip
    t_d = (it_d["t_iter"] + draft_time(ctx, dtab, B, isl + osl / 2.0)) / tau  # per output token
    t_dq = t_d  # TPOT at the target's percentile: the decode batch's quantile under Poisson arrivals
    if w.percentile is not None and w.percentile > 50:
        Bq = np.minimum(B + z_score(w.percentile / 100.0) * np.sqrt(B), maxc[di])
        it_dq = iteration(
            ctx, dtab, n_dec=Bq, n_pre=0.0, dec_ctx=isl + osl / 2.0, pre_ctx=0.0, pre_len=1.0,
            logit_rows=Bq * q, dec_tokens=q,
        )  # fmt: skip
        t_dq = np.maximum((it_dq["t_iter"] + draft_time(ctx, dtab, Bq, isl + osl / 2.0)) / tau, t_d)
    rate_d = B / (osl * np.maximum(t_d, 1e-12))
    pw_d = power_demand(ctx, it_d)["avg_w"]
    ok_d = ~illegal[di] & mem_d["weights_fit"][di] & (maxc[di] >= B)
    # Only the Pareto-efficient pool members can be in a best xPyD pair: rate per instance (higher),
    # devices per instance (fewer) and latency (TTFT for prefill, TPOT for decode), among those
    # meeting the target alone. A member beaten on all three is replaced by its better in any pairing
    # without losing throughput or fitting fewer instances, whatever the objective.
    if w.ttft_ms is not None and w.goodput is None:
        ok_p &= t_p * 1e3 <= w.ttft_ms
    if w.tpot_ms is not None and w.goodput is None:
        ok_d &= t_dq * 1e3 <= w.tpot_ms
    # every pool member that can serve (the search's whole xPyD space is pairs of these at any
    # instance counts): tests check the pruned, vectorized choice against it
    pools = {
        "prefill": {"rate": rate_p, "t": t_p, "devices": ptab.devices, "ok": ok_p.copy()},
        "decode": {"rate": rate_d, "t": t_d, "devices": dtab.devices, "ok": ok_d.copy()},
    }
    P = np.flatnonzero(ok_p)
    D = np.flatnonzero(ok_d)
    P = P[pareto_front(np.stack([-rate_p[P], ptab.devices[P], t_p[P]], axis=1))]
    D = D[pareto_front(np.stack([-rate_d[D], dtab.devices[D], t_d[D]], axis=1))]
    if len(P) == 0 or len(D) == 0:
        return {"count": len(k) * len(B), "records": [], "P": P, "D": D, "pools": pools}
    np_dev = ptab.devices[P][:, None]
    nd_dev = dtab.devices[D][None, :]
    rp = rate_p[P][:, None]
    rd = rate_d[D][None, :]
    kv_t = kv_handoff_s(ctx, np_dev, nd_dev)
    ttft_service = t_p[P][:, None] + kv_t
    tpot = np.broadcast_to(t_d[D][None, :], ttft_service.shape)
    shape = (len(P), len(D))
    if w.mode == "request_rate" and objective == "fewest-devices":
        # just enough instances of each pool for the request rate
        lam = float(w.request_rate or 0.0)
        x = np.broadcast_to(np.ceil(lam / rp), shape)
        y = np.broadcast_to(np.ceil(lam / rd), shape)
        cap = np.minimum(x * rp, y * rd)
    else:
        # The pool ratio that delivers the most on the devices given: x prefill instances, as many
        # decoders as they feed (or as fit); among equal throughputs, the fewest devices.
        xs = np.arange(1, num_devices + 1, dtype=np.float64)[None, None, :]
        y_max = np.floor((num_devices - xs * np_dev[..., None]) / nd_dev[..., None])
        y_need = np.ceil(xs * rp[..., None] / rd[..., None])
        y3 = np.minimum(y_max, y_need)
        x3 = np.broadcast_to(xs, y3.shape)
        thr3 = np.where(y3 >= 1, np.minimum(x3 * rp[..., None], y3 * rd[..., None]), 0.0)
        dev3 = x3 * np_dev[..., None] + np.maximum(y3, 0) * nd_dev[..., None]
        top3 = np.max(thr3, axis=2, keepdims=True)
        best = np.argmin(np.where(thr3 >= top3 * (1 - 1e-12), dev3, np.inf), axis=2)
        x = np.take_along_axis(x3, best[..., None], axis=2)[..., 0]
        y = np.take_along_axis(y3, best[..., None], axis=2)[..., 0]
        cap = np.take_along_axis(thr3, best[..., None], axis=2)[..., 0]
    if w.mode == "request_rate":
        thr = np.full(shape, float(w.request_rate or 0.0))
    else:
        thr = cap
    devices = x * np_dev + y * nd_dev
    rho_p = np.where(x > 0, thr / (x * rp), 1.0)
    rho_d = np.where(y > 0, thr / np.maximum(y * rd, 1e-30), 1.0)
    r = np.clip(rho_p, 0, 0.999)
    wait = np.where(w.mode == "request_rate", r / (2 * (1 - r)) * t_p[P][:, None], 0.0)
    ttft = ttft_service + wait
    p = ctx.device.power
    pool_w = (
        x * np_dev * (rho_p * pw_p[P][:, None] + (1 - rho_p) * p.idle_w)
        + y * nd_dev * (rho_d * pw_d[D][None, :] + (1 - rho_d) * p.idle_w)
        + devices * p.node_overhead_w * NODE_OVERHEAD_LOAD
    )
    out_tps = thr * osl
    tps_dev = out_tps / np.maximum(devices, 1)
    valid = (y >= 1) & (x >= 1) & (devices <= num_devices) & (thr > 0)
    res = {
        "ttft_s": ttft,
        "ttft_service_s": ttft_service,
        "tpot_s": tpot,
        "rho": np.maximum(rho_p, rho_d) if w.mode == "request_rate" else np.zeros_like(ttft),
    }
    if w.percentile is not None:
        res["ttft_pct_s"] = ttft_service + wait_quantile(wait, r, w.percentile / 100.0)
        res["tpot_pct_s"] = np.broadcast_to(t_dq[D][None, :], ttft_service.shape)
    flat = {k: v.ravel() for k, v in res.items()}
    targets = meets_targets(ctx, flat)
    att = attainment(ctx, flat).reshape(ttft.shape)
    bad = {"devices": ~valid.ravel(), **targets}
    if w.mode == "request_rate":
        # the pools the cluster holds do not carry the rate
        bad["saturated"] = ~(cap >= thr * (1 - 1e-12)).ravel()
    return {
        "count": int(valid.size),
        "P": P,
        "D": D,
        "di": di,
        "B": B,
        "x": x,
        "y": y,
        "devices": devices,
        "ttft": ttft,
        "tpot": tpot,
        "pct": {k: v for k, v in res.items() if k.endswith("_pct_s")},
        "percentile": w.percentile,
        "kv_t": kv_t,
        "out_tps": out_tps,
        "tps_dev": tps_dev,
        "capacity_rate": cap,
        "num_devices": num_devices,
        "pool_w": pool_w,
        "bad": bad,
        "first": _first_reason(bad, valid.size),
        "inst": inst,
        "dtab": dtab,
        "cost": _cost_per_mtok(price, tps_dev),
        "t_p": t_p,
        "t_d": t_d,
        "ptab": ptab,
        "k": k,
        "budget_p": int(budget_p),
        "budget_d": np.broadcast_to(mem_d["budget"], (len(inst),)),
        "att": att,
        "pools": pools,
    }


def _dis_record(dis: dict[str, Any], flat: int) -> dict[str, Any]:
    i, j = np.unravel_index(flat, dis["x"].shape)
    ptab, dtab = dis["ptab"], dis["dtab"]
    pi, dj = int(dis["P"][i]), int(dis["D"][j])
    pre = {k: int(ptab[k][pi]) for k in ("tp", "pp", "ep", "adp")}
    dec = {k: int(dtab[k][dj]) for k in ("tp", "pp", "ep", "adp")}
    x, y = int(dis["x"][i, j]), int(dis["y"][i, j])
    B = float(dis["B"][dj])
    tps = float(dis["out_tps"][i, j])
    jt = float(dis["pool_w"][i, j]) / max(tps, 1e-30)
    return {
        "mode": "disaggregated",
        "prefill": {
            **pre,
            "instances": x,
            "prompts_per_batch": int(dis["k"][pi]),
            "max_num_tokens": dis["budget_p"],
        },
        "decode": {
            **dec,
            "instances": y,
            "concurrency_per_instance": B,
            "max_num_tokens": int(dis["budget_d"][int(dis["di"][dj])]),
        },
        "devices": int(dis["devices"][i, j]),
        "idle_devices": int(dis["num_devices"]) - int(dis["devices"][i, j]),
        "short": f"{x}P({_short(**pre)} k{int(dis['k'][pi])}) + {y}D({_short(**dec)} b{B:.0f})",
        "ttft_ms": float(dis["ttft"][i, j]) * 1e3,
        "tpot_ms": float(dis["tpot"][i, j]) * 1e3,
        "kv_transfer_ms": float(dis["kv_t"][i, j]) * 1e3,
        "slo_attainment": float(dis["att"][i, j]),
        "output_tokens_per_s": tps,
        "max_request_rate": float(dis["capacity_rate"][i, j]),
        "output_tokens_per_s_per_device": float(dis["tps_dev"][i, j]),
        "output_tokens_per_s_per_user": 1.0 / float(dis["tpot"][i, j]),
        "avg_power_w": float(dis["pool_w"][i, j]) / max(int(dis["devices"][i, j]), 1),
        "j_per_output_token": jt,
        "output_tokens_per_joule": 1.0 / jt,
        "cost_per_mtok": None if dis["cost"] is None else float(dis["cost"][i, j]),
        **{
            f"{k.removesuffix('_pct_s')}_ms_p{dis['percentile']}": float(v[i, j]) * 1e3
            for k, v in dis["pct"].items()
        },
    }


# ============================================================================================ search
def search_serving(
    ctx: ServingContext,
    *,
    num_devices: int,
    top: int = 10,
    power_caps_w: list[float] | None = None,
    price_per_device_hour: float | None = None,
    disaggregated: bool = True,
    pin: dict[str, int | None] | None = None,
    job: dict[str, Any] | None = None,
    costing: dict[str, Any] | None = None,
    objective: str = "throughput",
    notes: list[str] | None = None,
) -> ServingResult:
    """Run the whole serving search for one model/device/workload; see :func:`serve`."""
    w = ctx.workload
    check_objective(objective, w)
    pin = pin or {}
    inst = enumerate_instances(ctx.model, num_devices, **pin)
    caps = [0.0] + sorted({float(c) for c in (power_caps_w or []) if c})
    agg = _aggregated(ctx, inst, num_devices, caps, price_per_device_hour)
    res = agg["res"]
    reasons: dict[str, int] = {}
    _count(agg["first"], reasons)
    feas = np.flatnonzero(agg["first"] < 0)
    enumerated = len(agg["tab"])
    dis = (
        _disaggregated(ctx, inst, num_devices, price_per_device_hour, objective)
        if (disaggregated and w.mode != "concurrency" and not any(pin.values()))
        else None
    )
    dfeas = np.zeros(0, dtype=np.int64)
    if dis is not None:
        enumerated += dis["count"]
        if "first" in dis:
            _count(dis["first"], reasons)
            dfeas = np.flatnonzero(dis["first"] < 0)
    notes = list(notes or [])
    if ctx.model.is_moe and (w.ep_dispatch != "default" or w.ep_overlap):
        notes.append(
            "expert all-to-alls under attention DP: "
            + (
                "DeepEP (a token once per destination node over the network and once per destination "
                "rank over NVLink, dispatched in the GEMMs' format; ep = tp)"
                if w.ep_dispatch == "deepep"
                else "the backend's default collective (every routed copy in 16 bits)"
            )
            + ("; two-batch overlap hides them behind the compute" if w.ep_overlap else "")
            + "; layouts without attention DP all-reduce the experts' output as TP does"
        )
    if w.mode == "offline":
        notes.append(
            "offline mode: the batch is what memory and max_batch allow; TTFT excludes the offline queue"
        )
    from autopar.serving.tiers import placement_note

    notes.append(
        placement_note(
            ctx.model,
            ctx.device,
            num_devices=num_devices,
            batch=int(w.concurrency or 1),
            seq_len=w.isl + w.osl,
            weight_precision=w.weight_precision,
            kv_precision=w.kv_dtype,
        )
    )

    # ---- candidates: score, rank ---------------------------------------------------------------
    # "throughput": what the cluster given delivers (output tokens/s of all its devices, or under a
    # request rate the highest rate sustained on them); "fewest-devices": devices first. Exact ties
    # go to the faster layout per user, then the shorter TTFT.
    cands: list[tuple[tuple[float, ...], str, int, float]] = []
    per_rate = w.mode == "request_rate"
    fewest = objective == "fewest-devices"
    a_score = agg["capacity_rate"] if per_rate else agg["total_tps"]
    for i in feas:
        dev = float(agg["tab"].devices[i] * agg["replicas"][i])
        key = (
            dev if fewest else 0.0,
            -float(a_score[i]),
            -float(res["output_tps_per_user"][i]),
            float(res["ttft_s"][i]),
        )
        cands.append((key, "a", int(i), dev))
    if dis is not None and len(dfeas):
        d_score = dis["capacity_rate"] if per_rate else dis["out_tps"]
        for f in dfeas:
            i, j = np.unravel_index(f, dis["x"].shape)
            ddev = float(dis["devices"][i, j])
            key = (
                ddev if fewest else 0.0,
                -float(d_score[i, j]),
                -1.0 / float(dis["tpot"][i, j]),
                float(dis["ttft"][i, j]),
            )
            cands.append((key, "d", int(f), ddev))
    cands.sort(key=lambda c: c[0])

    def record(kind: str, i: int) -> dict[str, Any]:
        return _agg_record(ctx, agg, i, price_per_device_hour) if kind == "a" else _dis_record(dis, i)  # type: ignore[arg-type]

    # Distinct layouts only (the same shape at other replica counts/caps adds nothing to a top list).
    results, seen = [], set()
    for _, kind, ci, _ in cands:
        r = record(kind, ci)
        key2 = (
            r["short"]
            if r["mode"] == "aggregated"
            else f"{r['prefill']}{r['decode']}".replace(
                f"'prompts_per_batch': {r['prefill']['prompts_per_batch']}", ""
            )
        )
        key2 += str(r.get("power_cap_w"))
        if key2 in seen:
            continue
        seen.add(key2)
        results.append(r)
        if len(results) >= top:
            break

    # ---- Pareto front of tokens/s/device vs tokens/s/user ----------------------------------------
    tps_dev = res["output_tps_per_device"]
    xs = [float(tps_dev[i]) for i in feas]
    ys = [float(res["output_tps_per_user"][i]) for i in feas]
    refs = [("a", int(i)) for i in feas]
    for f in dfeas:
        i, j = np.unravel_index(f, dis["x"].shape)  # type: ignore[index]
        xs.append(float(dis["tps_dev"][i, j]))  # type: ignore[index]
        ys.append(1.0 / float(dis["tpot"][i, j]))  # type: ignore[index]
        refs.append(("d", int(f)))
    front = pareto_front(-np.stack([np.array(xs), np.array(ys)], axis=1).reshape(-1, 2))
    # At most MAX_PARETO points, evenly spread along the front (sorted by tokens/s per device), and
    # always the chosen layout when it is on the front (it is ranked by what the whole cluster
    # delivers, so a layout on fewer devices can beat it per device and per user).
    chosen = (cands[0][1], cands[0][2]) if cands else None
    keep = list(front)
    if len(keep) > MAX_PARETO:
        pick = np.unique(np.linspace(0, len(keep) - 1, MAX_PARETO).round().astype(int))
        sub = [keep[i] for i in pick]
        on = [k for k in keep if refs[k] == chosen]
        keep = sorted(set(sub) | set(on), key=keep.index)
    pareto = [dict(record(*refs[k]), chosen=refs[k] == chosen) for k in keep]
    pareto_info = {
        "x": "output_tokens_per_s_per_user",
        "y": "output_tokens_per_s_per_device",
        "candidates": len(xs),
        "front_size": int(len(front)),
        "listed": len(pareto),
        "chosen_on_front": any(refs[k] == chosen for k in front),
    }

    # ---- fewest devices for the request rate ------------------------------------------------------
    min_dev = None
    if w.mode == "request_rate" and cands:
        c0 = min(cands, key=lambda c: (c[3], *c[0][1:]))
        min_dev = dict(record(c0[1], c0[2]))
        min_dev = {"devices": min_dev["devices"], "layout": min_dev}

    ee = (costing or {}).get("expected_error")
    for r in [*results, *pareto, *([min_dev["layout"]] if min_dev else [])]:
        r["expected_error_p90"] = ee["p90"] if ee else None
    n_feasible = len(feas) + len(dfeas)
    result = ServingResult(
        job=job or {},
        costing=costing or {},
        workload=w.model_dump(),
        layouts_enumerated=int(enumerated),
        layouts_feasible=int(n_feasible),
        infeasible_by_reason=dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
        results=results,
        pareto=pareto,
        min_devices=min_dev,
        notes=notes,
        objective=objective,
        num_devices=num_devices,
        pareto_info=pareto_info,
    )
    if not results:
        result.closest = _closest(ctx, agg, dis)
        raise ServingInfeasible(
            _infeasible_message(ctx, result), _infeasible_hint(result), closest=result.closest, result=result
        )
    return result


def _closest(ctx: ServingContext, agg: dict[str, Any], dis: dict[str, Any] | None) -> dict[str, Any]:
    """Best achievable TTFT, TPOT and throughput among candidates that fit (ignoring targets)."""
    res = agg["res"]
    runs = np.isin(
        agg["first"],
        [REASON_ORDER.index(c) for c in ("ttft_target", "tpot_target", "goodput_target", "saturated")],
    ) | (agg["first"] < 0)
    out: dict[str, Any] = {}
    if not np.any(runs):  # nothing fits in memory: say by how much the best shape misses
        i = int(np.argmin(res["mem_weights"] + res["mem_workspace"] + res["mem_reserve"]))
        rec = _agg_record(ctx, agg, i, None)
        mem = rec["memory_gib_per_device"]
        out["least_memory_layout"] = rec["short"].split(" x")[0]
        out["needs_gib_per_device"] = mem["weights"] + mem["workspace"] + mem["runtime_reserve"]
        out["weights_gib_per_device"] = mem["weights"]
        out["capacity_gib"] = mem["capacity"]
        return out
    if np.any(runs):
        idx = np.flatnonzero(runs)
        # the statistic the targets are stated in (the mean, or the percentile)
        tpot_s = res["tpot_pct_s"] if "tpot_pct_s" in res else res["tpot_s"]
        ttft_s = res["ttft_pct_s"] if "ttft_pct_s" in res else res["ttft_s"]
        i_tpot = idx[np.argmin(tpot_s[idx])]
        i_ttft = idx[np.argmin(ttft_s[idx])]
        i_tps = idx[np.argmax(res["output_tps_per_device"][idx])]
        out["min_tpot_ms"] = float(tpot_s[i_tpot]) * 1e3
        out["min_tpot_layout"] = _agg_record(ctx, agg, int(i_tpot), None)["short"]
        out["min_ttft_ms"] = float(ttft_s[i_ttft]) * 1e3
        out["min_ttft_layout"] = _agg_record(ctx, agg, int(i_ttft), None)["short"]
        out["max_output_tokens_per_s_per_device"] = float(res["output_tps_per_device"][i_tps])
        if ctx.workload.mode == "request_rate":
            out["max_request_rate"] = float(
                np.max(
                    res["request_rate_instance"][idx]
                    * agg["replicas"][idx]
                    / np.maximum(res["rho"][idx], 1.0)
                )
            )
    if dis is not None and "ttft" in dis and dis["ttft"].size:
        valid = ~dis["bad"]["devices"].reshape(dis["ttft"].shape)
        if np.any(valid):
            pct = dis.get("pct") or {}
            out["disaggregated_min_tpot_ms"] = float(np.min(pct.get("tpot_pct_s", dis["tpot"])[valid])) * 1e3
            out["disaggregated_min_ttft_ms"] = float(np.min(pct.get("ttft_pct_s", dis["ttft"])[valid])) * 1e3
    return out


def _infeasible_message(ctx: ServingContext, result: ServingResult) -> str:
    w = ctx.workload
    reasons = result.infeasible_by_reason
    c = result.closest or {}
    top = ", ".join(f"{k} {v}" for k, v in list(reasons.items())[:4])
    if reasons and set(reasons) <= LEGALITY_REASONS:  # the cause is divisibility, not memory
        m = ctx.model
        sizes = {
            "tp_heads": f"{m.heads} attention heads",
            "tp_kv_heads": f"{m.kv_heads} KV heads",
            "pp_layers": f"{m.layers} layers",
            "ep_experts": f"{m.num_experts} experts" if m.is_moe else "no experts (a dense model)",
            "attention_dp_dense": "no experts (a dense model)",
            "ep_dispatch_width": f"{m.num_experts} experts" if m.is_moe else "no experts (a dense model)",
        }
        why = "; ".join(f"{REASONS[k]} ({m.name} has {sizes[k]})" for k in reasons)
        return f"no serving layout is legal: {why} [{top}]"
    if "needs_gib_per_device" in c:
        return (
            f"no serving layout fits in memory: even {c['least_memory_layout']} needs "
            f"{c['needs_gib_per_device']:.1f} GiB per device (weights {c['weights_gib_per_device']:.1f} GiB) "
            f"of {c['capacity_gib']:.1f} GiB [{top}]; the weights alone need {_chips_to_hold(ctx)} "
            f"{ctx.device.id} chips in its {ctx.device.memory_kind}"
        )
    if not c:
        return (
            f"no serving layout fits: {top} of {result.layouts_enumerated} candidates "
            f"({REASONS.get(next(iter(reasons), ''), '')})"
        )
    parts = []
    stat = f"p{w.percentile} " if w.percentile is not None else ""
    if w.tpot_ms is not None:
        parts.append(
            f"{stat}TPOT target {w.tpot_ms:g} ms (best achievable {c['min_tpot_ms']:.2f} ms with "
            f"{c['min_tpot_layout']})"
        )
    if w.ttft_ms is not None:
        parts.append(
            f"{stat}TTFT target {w.ttft_ms:g} ms (best achievable {c['min_ttft_ms']:.1f} ms with "
            f"{c['min_ttft_layout']})"
        )
    if w.mode == "request_rate" and "max_request_rate" in c:
        parts.append(
            f"request rate {w.request_rate:g}/s (at most ~{c['max_request_rate']:.2f}/s on the devices given)"
        )
    if w.goodput is not None:
        parts.append(f"goodput {w.goodput:g}")
    return f"no serving layout meets {'; '.join(parts) or 'the targets'} [{top}]"


def _chips_to_hold(ctx: ServingContext) -> int:
    from autopar.serving.tiers import placement

    w = ctx.workload
    r = placement(ctx.model, ctx.device, weight_precision=w.weight_precision, kv_precision=w.kv_dtype)
    return int(r["chips_to_hold_weights"])


def _infeasible_hint(result: ServingResult) -> str:
    r = result.infeasible_by_reason
    if r and set(r) <= LEGALITY_REASONS:
        return "pin degrees that divide those counts (--ep and --adp only for MoE models), or drop the pin"
    if "weights_do_not_fit" in r and set(r) <= {"weights_do_not_fit", "kv_cache", "devices"}:
        return "use more devices, a lower weight precision, or a device with more memory"
    return "relax the targets, add devices, or lower the load"


# ================================================================================================ API
def serve(
    *,
    job: Job | None = None,
    model: Any = None,
    device: str | None = None,
    num_devices: int | None = None,
    isl: int | None = None,
    osl: int | None = None,
    devices_per_node: int | None = None,
    concurrency: int | None = None,
    request_rate: float | None = None,
    offline: bool | None = None,
    weight_precision: str | None = None,
    kv_precision: str | None = None,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
    goodput: float | None = None,
    max_batch: int | None = None,
    max_num_tokens: int | None = None,
    chunked_prefill: bool | None = None,
    kv_cache_fraction: float | None = None,
    prefix_cache_hit_rate: float | None = None,
    speculative_tokens: int | None = None,
    acceptance_rate: float | None = None,
    expert_imbalance: float | None = None,
    ep_dispatch: str | None = None,
    ep_overlap: bool | None = None,
    arrival: str | None = None,
    backend: str | None = None,
    backend_version: str | None = None,
    percentile: int | None = None,
    calibration: str | None = None,
    allow_long_context: bool | None = None,
    power_caps_w: list[float] | None = None,
    price_per_device_hour: float | None = None,
    disaggregated: bool = True,
    tp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    adp: int | None = None,
    top: int = 10,
    objective: str = "throughput",
) -> ServingResult:
    """Search serving layouts for ``model`` on ``num_devices`` of ``device``.

    The job: ``job=Job(...)`` with a serving workload, or the flat keywords (the ``autopar serve``
    flag names; a keyword left at None takes the :class:`~autopar.job.ServingWorkload` default).
    Load: ``concurrency`` (closed loop, whole deployment), ``request_rate`` (requests/s; also returns
    the fewest devices that sustain it), ``offline=True`` (max throughput), or none (sweep the
    concurrency for the Pareto front). ``tp``/``pp``/``ep``/``adp`` pin those degrees.
    ``objective``: ``"throughput"`` ranks by what the ``num_devices`` given deliver together (output
    tokens/s; under a request rate, the highest rate sustained; each result says how many devices it
    leaves idle), ``"fewest-devices"`` by the fewest devices that carry the ``request_rate`` or
    ``concurrency`` within the targets. Raises
    :class:`ServingInfeasible` (an :class:`~autopar.errors.InfeasibleError`, exit status 2 on the
    CLI) with the closest achievable figures when no layout meets the targets.
    """
    from autopar.coefficients import coefficient_source, load_calibration
    from autopar.hardware import load_cluster
    from autopar.model import ModelSpec, check_context, check_costed, load_model
    from autopar.prediction import job_from_api

    spec = model if isinstance(model, ModelSpec) else None
    workload_kw = dict(
        isl=isl,
        osl=osl,
        concurrency=concurrency,
        request_rate=request_rate,
        offline=offline,
        weight_precision=weight_precision,
        kv_precision=kv_precision,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        goodput=goodput,
        max_batch=max_batch,
        max_num_tokens=max_num_tokens,
        chunked_prefill=chunked_prefill,
        kv_cache_fraction=kv_cache_fraction,
        prefix_cache_hit_rate=prefix_cache_hit_rate,
        speculative_tokens=speculative_tokens,
        acceptance_rate=acceptance_rate,
        expert_imbalance=expert_imbalance,
        ep_dispatch=ep_dispatch,
        ep_overlap=ep_overlap,
        arrival=arrival,
        backend=backend,
        backend_version=backend_version,
        percentile=percentile,
    )
    if job is None:
        # the workload's own validation messages (one line, naming the field)
        make_workload(**{k: v for k, v in workload_kw.items() if v is not None})
    decl = job_from_api(
        job,
        "serving",
        model=spec.name if spec else model,
        device=device,
        num_devices=num_devices,
        devices_per_node=devices_per_node,
        **workload_kw,
        calibration=calibration,
        allow_long_context=allow_long_context,
    )
    workload = decl.workload
    assert isinstance(workload, ServingWorkload)
    check_objective(objective, workload)
    num_devices = decl.cluster.num_devices
    check_count(
        num_devices,
        MAX_SERVE_DEVICES,
        "num_devices of a serving deployment",
        "pass fewer devices: a larger fleet is replicas of the layout found for a part of it",
        AutoparError,
    )
    if top < 1:
        raise AutoparError(f"top must be >= 1, got {top}")
    if price_per_device_hour is not None and not price_per_device_hour > 0:
        raise AutoparError(f"price per device-hour must be positive, got {price_per_device_hour}")
    for name, v in (("tp", tp), ("pp", pp), ("ep", ep), ("adp", adp)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise AutoparError(f"{name} must be a positive integer, got {v!r}")
    spec = spec or load_model(decl.model)
    check_costed(spec, "serving memory and latency")
    check_context(
        spec, workload.isl + workload.osl, allow_long_context=decl.allow_long_context, what="isl + osl"
    )
    cluster = load_cluster(decl.cluster.device, num_devices, decl.cluster.devices_per_node)
    dev = cluster.device
    if power_caps_w:
        for c in power_caps_w:
            if not (0 < c <= dev.power.tdp_w):
                raise AutoparError(
                    f"power cap {c:g} W is outside (0, TDP {dev.power.tdp_w:g} W] of {dev.id}",
                    "give caps in watts up to the TDP",
                )
    cal = load_calibration(decl.calibration)
    ctx = make_context(spec, dev, workload, devices_per_node=cluster.devices_per_node, calibration=cal)
    resolved = decl.to_dict()
    resolved["cluster"]["devices_per_node"] = cluster.devices_per_node
    from autopar.serving.accuracy import expected_error
    from autopar.serving.backends import describe

    b = ctx.backend
    w_res = ctx.workload
    if w_res.kv_cache_fraction is not None:
        kv_text = {
            "free": f"{w_res.kv_cache_fraction:g} of the memory left free after weights, workspace and reserve",
            "total": f"{w_res.kv_cache_fraction:g} of the total memory, less weights, workspace and reserve",
            "static": f"{w_res.kv_cache_fraction:g} of the total memory for weights and the KV pool",
        }[b.kv_cache.memory_rule]
    else:
        kv_text = "mem_fraction_static derived per layout from the memory, TP and CUDA-graph batch (weights + KV pool)"
    assumptions = describe(b, dev, kv_fraction_text=kv_text, offline=w_res.offline)
    if spec.is_moe:
        from autopar.serving.estimate import moe_rate

        rate = moe_rate(ctx)
        if rate is not None:
            assumptions.append(
                f"MoE layers: {b.name}'s fused MoE kernel at {ctx.compute_precision} on {dev.id}, rates "
                f"{rate.source}: grouped GEMMs at {rate.compute:.2f} of the dense peak, weights and token "
                f"rows at {rate.bandwidth:.2f} of HBM bandwidth, {rate.fixed_us:g} us per layer + "
                f"{rate.per_token_ns:g} ns per routed token (cost_models/backends/moe_kernels.yaml)"
            )
    targets = latency_targets(w_res)
    if w_res.percentile is not None:
        assumptions.append(targets["text"])
    costing = {
        "backend": {
            "name": b.name,
            "version": b.version,
            "max_batch": w_res.max_batch,
            "max_num_tokens": w_res.max_num_tokens,
            "chunked_prefill": w_res.chunked_prefill,
            "kv_cache_fraction": w_res.kv_cache_fraction,
            "kv_memory_rule": b.kv_cache.memory_rule,
            "kv_block_tokens": b.kv_cache.block_tokens,
            "measured": b.measured,
            "assumptions": assumptions,
            "profile": f"cost_models/backends/{b.name}.yaml",
        },
        "latency_targets": targets,
        "expected_error": expected_error(dev.id, cal, spec, b.name),
        "compute_precision": ctx.compute_precision,
        "kv_precision": workload.kv_dtype,
        "coefficients": coefficient_source(dev.id, cal),
        "serving_coefficients": {
            "host_step_us": ctx.sc.host_step_s * 1e6,
            "host_per_seq_us": ctx.sc.host_per_seq_s * 1e6,
            "collective_sync_us": ctx.sc.collective_sync_s * 1e6,
            "runtime_reserve_gb": ctx.sc.runtime_reserve_bytes / 1e9,
        },
    }
    return search_serving(
        ctx,
        num_devices=num_devices,
        top=top,
        power_caps_w=power_caps_w,
        price_per_device_hour=price_per_device_hour,
        disaggregated=disaggregated,
        pin={"tp": tp, "pp": pp, "ep": ep, "adp": adp},
        job=resolved,
        costing=costing,
        objective=objective,
        notes=assumptions,
    )


def latency_targets(w: ServingWorkload) -> dict[str, Any]:
    """What the TTFT/TPOT targets are stated in, and the arrival assumption behind a percentile."""
    if w.percentile is None:
        if w.mode == "concurrency":
            arrival = (
                "lockstep: each wave of requests starts together (closed-loop benchmark clients)"
                if w.arrival == "lockstep"
                else "staggered: in-flight requests spread over their lifetimes (steady state)"
            )
            return {
                "statistic": "mean",
                "arrival": arrival,
                "text": f"TTFT/TPOT targets are means; arrivals {arrival}",
            }
        return {"statistic": "mean", "arrival": w.mode, "text": "TTFT/TPOT targets are means"}
    p = w.percentile
    return {
        "statistic": f"p{p}",
        "percentile": p,
        "arrival": f"Poisson at {w.request_rate:g} requests/s (open loop, split evenly over the replicas)",
        "approximation": "TTFT: the prompt's service at the p-quantile of the in-flight batch plus the "
        "p-quantile of the M/G/1 queueing wait (an arrival waits with probability rho; the wait of those "
        "who do is exponential, Kingman's heavy-traffic approximation, with the M/D/1 mean wait); TPOT: "
        "the iteration time at the p-quantile of the in-flight batch (Poisson by M/G/inf, normal "
        "approximation): the inter-token time, an upper bound on the per-request mean",
        "text": f"TTFT/TPOT targets are p{p} over requests: arrivals Poisson at {w.request_rate:g} req/s; "
        f"TTFT p{p} = service at the p{p} in-flight batch + the p{p} M/G/1 wait (exponential tail, "
        f"Kingman); TPOT p{p} = the iteration time at the p{p} in-flight batch",
    }


def workload_from_kwargs(**kw: Any) -> ServingWorkload:
    return make_workload(**kw)
