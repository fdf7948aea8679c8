"""Score many training layouts at once: legality, memory, step time, energy and derived metrics.

``evaluate`` is the one code path behind ``predict`` (a table of one row) and ``recommend``
(millions of rows), so the two can never disagree.
"""

from __future__ import annotations

import numpy as np

from autopar import blocks
from autopar import collectives as C
from autopar.coefficients import Calibration, coefficients_for, load_calibration, memory_constants
from autopar.energy import energy_per_step
from autopar.job import TrainingJob
from autopar.latency import (
    COMM_KINDS,
    SLOT_PARTS,
    TIME_COMPONENTS,
    Coefficients,
    data_parallel_tail,
    pipeline_p2p,
    stage_slot,
    step_time_breakdown,
)
from autopar.layout import PRECISION_CODES, LayoutTable
from autopar.legality import Context, legality_mask
from autopar.memory import (
    MEMORY_COMPONENTS,
    head_stage,
    memory_breakdown,
    stage_memory,
    stage_params,
    stage_params_at,
)
from autopar.precision import PEAK_KEY


def stage_param_counts(model, lay: LayoutTable, schedule: str = "1f1b") -> dict[str, np.ndarray]:
    """Non-expert and routed-expert parameters per rank on the heaviest pipeline stage."""
    sp = stage_params(model, lay, schedule)
    return {
        "nonexpert": np.maximum(np.maximum(sp["first_nonexp"], sp["last_nonexp"]), sp["mid_nonexp"]),
        "expert": np.maximum(np.maximum(sp["first_exp"], sp["last_exp"]), sp["mid_exp"]),
    }


def memory_limit_bytes(job: TrainingJob) -> float:
    """The device footprint a layout may reach: capacity less the job's memory headroom."""
    return job.device.memory_gb * 1e9 * (1.0 - job.memory_headroom)


def time_model(job: TrainingJob, cal: Calibration) -> tuple[Coefficients, C.Links]:
    """The latency coefficients and the links of ``job``'s device under calibration ``cal``."""
    co, link_coeffs = coefficients_for(job.device, cal, job.framework.name)
    return co, C.Links.from_cluster(job.device, job.devices_per_node, link_coeffs)


def step_breakdown(
    job: TrainingJob,
    lay: LayoutTable,
    *,
    co: Coefficients,
    links: C.Links,
    params: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """:func:`autopar.latency.step_time_breakdown` with ``job``'s settings (``params``: the
    :func:`stage_param_counts` of ``lay`` when already known)."""
    return step_time_breakdown(
        job.model,
        lay,
        seq_len=job.seq_len,
        links=links,
        co=co,
        param_counts=stage_param_counts(job.model, lay, job.pipeline_schedule) if params is None else params,
        frozen_weights=job.frozen_weights,
        moe_options=job.moe_options,
        profile=job.framework,
        schedule=job.pipeline_schedule,
    )


def evaluate(
    job: TrainingJob, lay: LayoutTable, *, calibration: Calibration | None = None, check_legal: bool = True
) -> dict[str, np.ndarray]:
    """Arrays over layouts: ``legal``, ``fits``, memory and time breakdowns, metrics, energy.

    ``memory_bytes`` is the device footprint (allocator-reserved + CUDA context + NCCL buffers),
    ``memory_allocated_bytes``/``memory_reserved_bytes`` the caching allocator's peak allocated and
    reserved; a layout fits when the footprint is at most ``memory_limit_bytes``
    (:func:`memory_limit_bytes`).
    """
    model, dev = job.model, job.device
    cal = calibration or load_calibration()
    co, links = time_model(job, cal)
    n = len(lay)
    if check_legal:
        ctx = Context.for_job(job)
        legal, _ = legality_mask(model, lay, ctx)
    else:
        legal = np.ones(n, dtype=bool)

    mc = memory_constants(cal, job.framework)
    mem = memory_breakdown(
        model,
        lay,
        seq_len=job.seq_len,
        framework_reserve_bytes=mc["framework_reserve_bytes"],
        comm_buffer_bytes=mc["comm_buffer_bytes"],
        fragmentation=mc["fragmentation"],
        frozen_weights=job.frozen_weights,
        profile=job.framework,
        schedule=job.pipeline_schedule,
    )
    capacity = dev.memory_gb * 1e9
    limit = memory_limit_bytes(job)
    fits = mem["total"] <= limit

    t = step_breakdown(job, lay, co=co, links=links)
    step = t["step_time"]
    tokens = float(job.tokens_per_step)
    tps_dev = tokens / (step * job.num_devices)
    model_flops = model.flops_per_token(job.seq_len, attention=True, causal=False) * tokens
    # MFU against the dense peak of the layout's GEMM precision (PaLM App. B convention: attention
    # FLOPs counted without causal halving; the logits GEMM included).
    peak = np.array([co.peak(PEAK_KEY[p]) for p in PRECISION_CODES])[lay["precision"]]
    mfu = model_flops / (step * job.num_devices * peak)
    energy = energy_per_step(
        dev,
        t,
        num_devices=job.num_devices,
        peak_flops=peak,
        model_flops_per_device=model_flops / job.num_devices,
    )

    out: dict[str, np.ndarray] = {
        "legal": legal,
        "fits": fits & legal,
        "step_time_s": step,
        "tokens_per_s_per_device": tps_dev,
        "mfu": mfu,
        "memory_bytes": mem["total"],
        "memory_allocated_bytes": mem["allocated"],
        "memory_reserved_bytes": mem["reserved"],
        "memory_capacity_bytes": np.full(n, capacity),
        "memory_limit_bytes": np.full(n, limit),
        "memory_stage": mem["stage"],
        "comm_exposed_s": t["comm_exposed"],
        "comm_total_s": t["comm_total"],
        "exposed_comm_fraction": t["comm_exposed"] / step,
        "energy_j_per_step": energy["energy_j"],
        "avg_power_w": energy["avg_power_w"],
    }
    for k in MEMORY_COMPONENTS:
        out[f"mem_{k}"] = mem[k]
    for k in TIME_COMPONENTS:
        out[f"time_{k}"] = t[k]
    # A collective a layout never runs is a scalar 0: broadcast it to the step's shape (rows, or the
    # search's broadcast grid), as every other figure has.
    for k in COMM_KINDS:
        out[f"comm_total_{k}_s"] = np.broadcast_to(t[f"comm_total_{k}"], np.shape(step))
        out[f"comm_exposed_{k}_s"] = np.broadcast_to(t[f"comm_exposed_{k}"], np.shape(step))
    return out


def evaluate_stages(
    job: TrainingJob,
    lay: LayoutTable,
    *,
    stage: np.ndarray,
    n_dense: np.ndarray,
    n_moe: np.ndarray,
    calibration: Calibration | None = None,
    mixers: blocks.StageMixers | None = None,
) -> dict[str, np.ndarray]:
    """Arrays over pipeline stages: memory per device and one micro-batch's time on each stage.

    Each row of ``lay`` is one stage of a layout (its own recompute mode): stage index ``stage``,
    ``n_dense`` dense and ``n_moe`` MoE layers; stage 0 holds the embedding, stage pp-1 the LM head
    and logits (rank 0 under a V-shaped schedule), and the activations in flight follow the job's
    pipeline schedule. The same memory and time
    terms as :func:`evaluate` (:func:`autopar.memory.stage_memory`, :func:`autopar.latency.stage_slot`),
    which applies them to the first and the last stage of a uniform pipeline. Returns ``mem_*``
    components and ``memory_bytes``; ``slot_s`` and its ``time_*`` parts per micro-batch; ``fwd_s``,
    ``bwd_s``, ``recompute_s`` (overlap windows), ``wgrad_s`` (weight-gradient GEMMs); ``params_nonexpert``/``params_expert`` per rank.
    ``mixers``: a hybrid model's mixers of each stage in its block order (:func:`autopar.blocks.stage.window`).
    """
    model = job.model
    cal = calibration or load_calibration()
    co, links = time_model(job, cal)
    mc = memory_constants(cal, job.framework)
    mem = stage_memory(
        model,
        lay,
        seq_len=job.seq_len,
        stage=stage,
        n_dense=n_dense,
        n_moe=n_moe,
        framework_reserve_bytes=mc["framework_reserve_bytes"],
        comm_buffer_bytes=mc["comm_buffer_bytes"],
        fragmentation=mc["fragmentation"],
        frozen_weights=job.frozen_weights,
        profile=job.framework,
        schedule=job.pipeline_schedule,
        mixers=mixers,
    )
    sl = stage_slot(
        model,
        lay,
        seq_len=job.seq_len,
        links=links,
        co=co,
        n_dense=n_dense,
        n_moe=n_moe,
        head=stage == head_stage(lay, job.pipeline_schedule),
        frozen_weights=job.frozen_weights,
        moe_options=job.moe_options,
        profile=job.framework,
        mixers=mixers,
    )
    nonexp, exp = stage_params_at(model, lay, stage, n_dense, n_moe, job.pipeline_schedule, mixers=mixers)
    out: dict[str, np.ndarray] = {f"mem_{k}": mem[k] for k in MEMORY_COMPONENTS}
    out["memory_bytes"] = mem["total"]
    out["memory_allocated_bytes"] = mem["allocated"]
    out["memory_reserved_bytes"] = mem["reserved"]
    out["slot_s"] = sum((sl[k] for k in SLOT_PARTS), np.zeros(len(lay)))
    for k in SLOT_PARTS:
        out[f"time_{k}"] = sl[k]
    out.update(fwd_s=sl["fwd"], bwd_s=sl["bwd"], recompute_s=sl["recompute"], wgrad_s=sl["wgrad"])
    out.update(params_nonexpert=nonexp, params_expert=exp)
    return out


def evaluate_tail(
    job: TrainingJob,
    lay: LayoutTable,
    *,
    params_nonexpert: np.ndarray,
    params_expert: np.ndarray,
    fwd_s: np.ndarray,
    bwd_s: np.ndarray,
    recompute_s: np.ndarray,
    calibration: Calibration | None = None,
) -> dict[str, np.ndarray]:
    """Per layout: pipeline send/recv, data-parallel/ZeRO communication and the optimizer step.

    The parameters per rank and the overlap windows are those of the stage that decides (as
    :func:`evaluate_stages` returns them); :func:`evaluate` passes its heaviest stage's.
    """
    cal = calibration or load_calibration()
    co, links = time_model(job, cal)
    tail = data_parallel_tail(
        job.model,
        lay,
        links=links,
        co=co,
        nonexpert_params=params_nonexpert,
        expert_params=params_expert,
        fwd=fwd_s,
        bwd=bwd_s,
        recompute=recompute_s,
        frozen_weights=job.frozen_weights,
        profile=job.framework,
    )
    return {
        "time_pp_comm": pipeline_p2p(job.model, lay, seq_len=job.seq_len, links=links),
        "time_dp_comm": tail["dp_comm"],
        "time_optimizer": tail["optimizer"],
    }
