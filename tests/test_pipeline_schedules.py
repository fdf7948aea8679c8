"""Pipeline schedules (autopar.schedules) against the schedules torch.distributed.pipelining runs.

torch generates the op order of each schedule (``_schedule_visualizer.get_schedule_ops``); a small
discrete-event simulation runs those ops with given forward (F), input-gradient (I) and
weight-gradient (W) chunk times and the cross-stage dependencies, and gives the step's makespan and
each rank's live activations. autopar's closed forms must reproduce them.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from autopar import predict
from autopar.errors import AutoparError
from autopar.export.base import export, parse
from autopar.latency import pipeline_schedule
from autopar.layout import Layout, LayoutTable
from autopar.memory import stage_inflight
from autopar.schedules import bubble_terms, schedule_problem


class _Torch:
    """torch's schedule visualizer and op types, imported by the first test that needs them (not at
    collection: every xdist worker collects every file, and torch takes seconds to import)."""

    def __getattr__(self, name: str) -> Any:
        vis = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")
        from torch.distributed.pipelining.schedules import _ComputationType

        self.get_schedule_ops, self.CT = vis.get_schedule_ops, _ComputationType
        return getattr(self, name)


vis = _Torch()

TORCH = {
    "1f1b": "Interleaved1F1B",
    "zb": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}


def _ops(name: str, pp: int, m: int, v: int):
    return [
        [a for a in rank if a is not None]
        for rank in vis.get_schedule_ops(name, pp, m, num_stages_per_rank=v)
    ]


def _subs(a):
    return a.sub_actions if a.computation_type == vis.CT.OVERLAP_F_B else [a]


def simulate(name: str, pp: int, m: int, v: int, F: float, I: float, W: float) -> float:
    """Makespan of torch's op order: each rank runs its ops in order, each op when its inputs exist."""
    ops = _ops(name, pp, m, v)
    stages = pp * v
    dur = {
        vis.CT.FORWARD: F,
        vis.CT.BACKWARD_INPUT: I,
        vis.CT.BACKWARD_WEIGHT: W,
        vis.CT.FULL_BACKWARD: I + W,
    }
    done: dict[tuple[int, int, str], float] = {}
    clock, nxt = [0.0] * pp, [0] * pp

    def deps(a):
        s, mb, c = a.stage_index, a.microbatch_index, a.computation_type
        if c == vis.CT.FORWARD:
            return [(s - 1, mb, "F")] if s > 0 else []
        if c in (vis.CT.BACKWARD_INPUT, vis.CT.FULL_BACKWARD):
            return [(s, mb, "F")] + ([(s + 1, mb, "B")] if s < stages - 1 else [])
        return [(s, mb, "B")]  # weight gradient after the input gradient

    def key(a):
        c = a.computation_type
        tag = "F" if c == vis.CT.FORWARD else "W" if c == vis.CT.BACKWARD_WEIGHT else "B"
        return (a.stage_index, a.microbatch_index, tag)

    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while nxt[r] < len(ops[r]):
                subs = _subs(ops[r][nxt[r]])
                need = [d for sa in subs for d in deps(sa)]
                if not all(d in done for d in need):
                    break
                end = max([clock[r]] + [done[d] for d in need]) + sum(dur[sa.computation_type] for sa in subs)
                for sa in subs:
                    done[key(sa)] = end
                clock[r], nxt[r] = end, nxt[r] + 1
                progress = True
    assert nxt == [len(o) for o in ops], "the simulated schedule deadlocked"
    return max(clock)


def live_peaks(name: str, pp: int, m: int, v: int) -> list[int]:
    """Per rank, the most chunks forwarded whose weight gradient has not run yet."""
    out = []
    for rank in _ops(name, pp, m, v):
        live = peak = 0
        for a in rank:
            for sa in _subs(a):
                c = sa.computation_type
                live += (
                    1
                    if c == vis.CT.FORWARD
                    else -1
                    if c in (vis.CT.BACKWARD_WEIGHT, vis.CT.FULL_BACKWARD)
                    else 0
                )
                peak = max(peak, live)
        out.append(peak)
    return out


def closed_form(schedule: str, pp: int, m: int, v: int, F: float, I: float, W: float) -> float:
    """autopar's step for p equal stages whose chunk times are F, I, W (stage = v chunks)."""
    slot, fwd, wgrad = v * (F + I + W), v * F, v * W
    q = float(bubble_terms(schedule, slot, fwd, wgrad))
    steady, bubble = pipeline_schedule(np.array(m), np.array(v), slot, pp * slot, q, pp * q)
    return float(steady + bubble)


# The step's largest deviation from torch's op order over backward/forward and weight/input ratios of
# real layers: 1F1B exact; ZB within 1% (exact while W <= I); the V-shaped ones within 5%.
TOLERANCE = {"1f1b": 1e-9, "zb": 0.01, "zbv": 0.05, "dualpipev": 0.05}


@pytest.mark.parametrize("schedule", list(TORCH))
@pytest.mark.parametrize("pp,m", [(4, 8), (8, 16), (8, 32)])
def test_bubbles_match_torch_schedules(schedule: str, pp: int, m: int) -> None:
    # F = I = W, the timing torch's fixed op order is built for: exact for every schedule.
    assert closed_form(schedule, pp, m, 2, 1, 1, 1) == pytest.approx(
        simulate(TORCH[schedule], pp, m, 2, 1, 1, 1)
    )
    for I, W in itertools.product([1.0, 1.25, 1.5, 2.0], [0.5, 0.75, 1.0, 1.1]):
        got, want = closed_form(schedule, pp, m, 2, 1.0, I, W), simulate(TORCH[schedule], pp, m, 2, 1.0, I, W)
        assert abs(got / want - 1) <= TOLERANCE[schedule], (I, W, got, want)


def test_zero_bubble_beats_1f1b_and_the_bubble_shrinks_by_the_deferred_weight_gradients() -> None:
    pp, m = 8, 16
    one = closed_form("1f1b", pp, m, 2, 1, 1, 1) - m * 6
    zb = closed_form("zb", pp, m, 2, 1, 1, 1) - m * 6
    assert (one, zb) == (21.0, 7.0)  # (p-1)(F+B) vs (p-1)(F+B-2W) per chunk: a third


@pytest.mark.parametrize("schedule", ["zb", "zbv", "dualpipev"])
@pytest.mark.parametrize("pp,m", [(4, 8), (4, 16), (8, 32)])
def test_activations_in_flight_match_torch(schedule: str, pp: int, m: int) -> None:
    lay = LayoutTable.from_layouts([Layout(pp=pp, vpp=2, grad_accum=m)] * pp)
    got = stage_inflight(lay, np.arange(pp), schedule) * 2  # chunks of 1/v stage
    assert list(got) == live_peaks(TORCH[schedule], pp, m, 2)


def test_1f1b_activations_in_flight_match_torch_interleaved() -> None:
    pp, m = 4, 16
    lay = LayoutTable.from_layouts([Layout(pp=pp, vpp=2, grad_accum=m)] * pp)
    # torch's Interleaved1F1B frees a chunk's activations at its full backward, like Megatron's.
    assert list(stage_inflight(lay, np.arange(pp)) * 2) == live_peaks("Interleaved1F1B", pp, m, 2)


def test_schedule_problems_name_what_torch_refuses() -> None:
    assert schedule_problem("1f1b", 8, 1, 1) is None
    assert schedule_problem("zb", 1, 1, 1) is None  # no pipeline: the schedule does not apply
    assert "vpp >= 2" in schedule_problem("zb", 4, 1, 8)
    assert "vpp = 2" in schedule_problem("zbv", 4, 4, 8)
    assert "grad_accum >= 2*pp" in schedule_problem("dualpipev", 4, 2, 6)
    with pytest.raises(Exception, match="at least as many microbatches"):
        vis.get_schedule_ops("DualPipeV", 4, 6, num_stages_per_rank=2)
    vis.get_schedule_ops("DualPipeV", 4, 8, num_stages_per_rank=2)


JOB = dict(
    model="llama-3.1-70b",
    device="h100-sxm-80gb",
    num_devices=64,
    seq_len=8192,
    global_batch=128,
    framework="torchtitan",
)
LAYOUT = dict(tp=8, pp=4, vpp=2, zero=2, micro_batch=1)


def test_predict_costs_each_schedule_and_its_memory() -> None:
    res = {s: predict(**JOB, **LAYOUT, pipeline_schedule=s) for s in ("1f1b", "zb", "zbv", "dualpipev")}
    bubble = {s: r.time_breakdown["pipeline_bubble"] for s, r in res.items()}
    assert bubble["zb"] < bubble["1f1b"] and bubble["zbv"] < bubble["1f1b"]
    # ZB keeps p*v chunks (p stages) in flight on every rank, less than interleaved 1F1B's stage 0.
    assert res["zb"].memory_gib_per_device < res["1f1b"].memory_gib_per_device
    # DualPipeV holds one chunk more than ZB-V.
    assert res["dualpipev"].memory_gib_per_device > res["zbv"].memory_gib_per_device
    assert all(r.fits for r in res.values())


def test_megatron_refuses_torch_schedules_and_illegal_vpp_is_named() -> None:
    with pytest.raises(AutoparError, match="framework megatron runs the 1f1b"):
        predict(**{**JOB, "framework": "megatron"}, **LAYOUT, pipeline_schedule="zb")
    with pytest.raises(AutoparError, match="needs vpp >= 2"):
        predict(**JOB, **{**LAYOUT, "vpp": 1}, pipeline_schedule="zb")


@pytest.mark.parametrize(
    "schedule,name", [("zb", "InterleavedZeroBubble"), ("zbv", "ZBVZeroBubble"), ("dualpipev", "DualPipeV")]
)
def test_torchtitan_export_names_the_schedule_and_parses_back(schedule: str, name: str) -> None:
    p = predict(**JOB, **LAYOUT, pipeline_schedule=schedule)
    from autopar.export.base import Job as ExportJob
    from autopar.job import Job

    job = ExportJob.from_core(Job.model_validate(p.job), num_layers=80)
    text = export(p.layout, "torchtitan", job)
    assert f"--parallelism.pipeline_parallel_schedule {name} " in text  # torchtitan 0.3
    layout, back = parse(text, "torchtitan")
    assert back.pipeline_schedule == schedule and layout == p.layout
    with pytest.raises(AutoparError, match=f"pipeline schedule {schedule} cannot be expressed in megatron"):
        export(p.layout, "megatron", job)
