"""Pipeline schedules: the bubble each one leaves and the activations it keeps in flight.

The schedules autopar costs are the ones a launcher can run: Megatron-Core's 1F1B (interleaved when
vpp > 1) and the ``torch.distributed.pipelining`` schedules torchtitan exposes as
``pipeline_parallel_schedule`` (``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``).
Zero-bubble schedules (Qi et al. 2023, arXiv 2401.10241) split the backward into the input
gradient (B, on the critical path) and the weight gradient (W, deferred into the bubbles);
DualPipe (DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.1 and Table 2) runs micro-batches from
both ends of the pipeline and pairs a forward with a backward chunk. Both formulas below were
checked against the op lists torch generates for these schedules (``tests/test_pipeline_schedules.py``
simulates them with unit F, B, W and counts the idle time and the live activations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

PipelineSchedule = Literal["1f1b", "zb", "zbv", "dualpipev"]
PIPELINE_SCHEDULES: tuple[str, ...] = ("1f1b", "zb", "zbv", "dualpipev")
PIPELINE_SCHEDULE_DESCRIPTION = (
    "pipeline schedule: 1f1b (Megatron's 1F1B, interleaved when vpp > 1), zb (interleaved zero "
    "bubble, ZB-H1: weight gradients deferred into the bubbles; vpp >= 2), zbv (ZB-V, vpp = 2), "
    "dualpipev (DeepSeek's DualPipe cut in half, vpp = 2, grad_accum >= 2*pp); the last three are "
    "torch.distributed.pipelining schedules (torchtitan)"
)


def bubble_terms(schedule: str, slot, fwd, wgrad) -> np.ndarray:
    """Per stage, the time one fill-and-drain pass through it costs under ``schedule``.

    With F, B (full backward, recompute included) and W (weight-gradient GEMMs) of one micro-batch
    through a stage, slot = F + B, the bubble of p stages is (p-1)/v times (DeepSeek-V3 report,
    Table 2, per chunk of 1/v stage): 1F1B F + B; ZB-H1/ZB-V F + B - 2W (the deferred W fill the
    gaps); DualPipe(V) F&B + B - 3W with F&B = F + B (two chunks' compute does not overlap itself;
    what DualPipe overlaps is the EP all-to-all, the ``moe_a2a_overlap`` option). Checked against
    torch.distributed.pipelining's own schedules (tests/test_pipeline_schedules.py).
    """
    slot = np.asarray(slot, dtype=np.float64)
    if schedule == "1f1b":
        return slot
    if schedule in ("zb", "zbv"):
        return slot - 2.0 * np.asarray(wgrad)
    if schedule == "dualpipev":
        return 2.0 * slot - np.asarray(fwd) - 3.0 * np.asarray(wgrad)
    raise ValueError(f"unknown pipeline schedule {schedule!r}; one of {', '.join(PIPELINE_SCHEDULES)}")


# Schedules whose rank 0 holds the first and the last model chunk (embedding and LM head).
V_SHAPED = ("zbv", "dualpipev")

# torchtitan ``parallelism.pipeline_parallel_schedule`` names (torch.distributed.pipelining).
TORCHTITAN_NAMES = {"zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}


# What each schedule needs of a pipeline (pp > 1), as torch's schedules check it: a vectorized test of
# (pp, vpp, grad_accum) that is True where the layout breaks it, and the sentence that says why.
REQUIREMENTS: dict[str, tuple[tuple[Callable[..., Any], str], ...]] = {
    "1f1b": (),
    "zb": (
        (
            lambda pp, v, m: v < 2,
            "pipeline schedule zb (InterleavedZeroBubble) needs vpp >= 2 stages per rank",
        ),
    ),
    "zbv": (
        (lambda pp, v, m: v != 2, "pipeline schedule zbv is V-shaped: it needs vpp = 2 stages per rank"),
    ),
    "dualpipev": (
        (
            lambda pp, v, m: v != 2,
            "pipeline schedule dualpipev is V-shaped: it needs vpp = 2 stages per rank",
        ),
        (
            lambda pp, v, m: m < 2 * pp,
            "pipeline schedule dualpipev needs grad_accum >= 2*pp micro-batches (torch's DualPipeV)",
        ),
    ),
}


def schedule_unfit(schedule: str, pp, vpp, grad_accum) -> np.ndarray:
    """Where ``schedule`` cannot run the pipeline (vectorized; pp = 1 has no pipeline: always fine)."""
    pp, vpp, ga = (np.asarray(x) for x in (pp, vpp, grad_accum))
    bad = np.zeros(np.broadcast(pp, vpp, ga).shape, dtype=bool)
    for test, _ in REQUIREMENTS[schedule]:
        bad = bad | test(pp, vpp, ga)
    return (pp > 1) & bad


def schedule_problem(schedule: str, pp: int, vpp: int, grad_accum: int) -> str | None:
    """Why ``schedule`` cannot run this pipeline (None when it can)."""
    if pp < 2:  # no pipeline: the schedule does not apply
        return None
    return next((why for test, why in REQUIREMENTS[schedule] if test(pp, vpp, grad_accum)), None)


def inflight_chunks(schedule: str, p, v, m) -> np.ndarray:
    """Model chunks (1/v of a stage) whose activations every rank holds at its peak.

    Counted from torch's op lists as chunks forwarded whose weight gradient has not run (the
    deferred W still needs the layers' inputs): InterleavedZeroBubble and ZB-V p*v on every rank,
    DualPipeV 2p + 1; all capped at the m*v chunks of the step. (1F1B: ``autopar.memory``.)
    """
    p, v, m = (np.asarray(x, dtype=np.float64) for x in (p, v, m))
    if schedule in ("zb", "zbv"):
        return np.minimum(p * v, m * v)
    if schedule == "dualpipev":
        return np.minimum(2.0 * p + 1.0, m * v)
    raise ValueError(f"no in-flight count for schedule {schedule!r}")
