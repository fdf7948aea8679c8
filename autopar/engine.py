"""Score many training layouts at once: legality, memory, step time, energy and derived metrics.

``evaluate`` is the one code path behind ``predict`` (a table of one row) and ``recommend``
(millions of rows), so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar import collectives as C
from autopar.coefficients import Calibration, coefficients_for, load_calibration, memory_constants
from autopar.energy import energy_per_step
from autopar.hardware import DeviceProfile
from autopar.job import Job
from autopar.latency import TIME_COMPONENTS, step_time_breakdown
from autopar.layout import PRECISION_CODES, LayoutTable
from autopar.legality import Context, legality_mask
from autopar.memory import MEMORY_COMPONENTS, memory_breakdown, stage_params
from autopar.model import ModelSpec


@dataclass(frozen=True)
class TrainingJob:
    """The resolved runtime form of a training :class:`~autopar.job.Job`: the loaded model and device.

    Built only by :meth:`resolve` (``Job.resolve()``); everything but the loaded objects and the
    resolved node size is read from the declaration ``job``.
    """

    job: Job
    model: ModelSpec
    device: DeviceProfile
    devices_per_node: int

    @classmethod
    def resolve(
        cls, job: Job, *, model: ModelSpec | None = None, device: DeviceProfile | None = None
    ) -> TrainingJob:
        """Load the model and device of ``job`` (unless given) and resolve the node size."""
        from autopar.hardware import load_cluster
        from autopar.model import load_model

        job.training  # noqa: B018  (raises for a non-training job)
        spec = model if model is not None else load_model(job.model)
        cluster = load_cluster(
            device or job.cluster.device, job.cluster.num_devices, job.cluster.devices_per_node
        )
        return cls(job, spec, cluster.device, cluster.devices_per_node)

    @property
    def num_devices(self) -> int:
        return self.job.cluster.num_devices

    @property
    def seq_len(self) -> int:
        return self.job.training.seq_len

    @property
    def global_batch(self) -> int:
        return self.job.training.global_batch

    @property
    def frozen_weights(self) -> bool:
        """LoRA-style fine-tuning: base weights frozen, adapters neglected."""
        return self.job.training.lora

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    def info(self) -> dict[str, Any]:
        """The job as JSON outputs record it: the declaration with the node size resolved."""
        d = self.job.to_dict()
        d["cluster"]["devices_per_node"] = self.devices_per_node
        return d


def stage_param_counts(model, lay: LayoutTable) -> dict[str, np.ndarray]:
    """Non-expert and routed-expert parameters per rank on the heaviest pipeline stage."""
    sp = stage_params(model, lay)
    return {
        "nonexpert": np.maximum(sp["first_nonexp"], sp["last_nonexp"]),
        "expert": np.maximum(sp["first_exp"], sp["last_exp"]),
    }


def evaluate(
    job: TrainingJob, lay: LayoutTable, *, calibration: Calibration | None = None, check_legal: bool = True
) -> dict[str, np.ndarray]:
    """Arrays over layouts: ``legal``, ``fits``, memory and time breakdowns, metrics, energy."""
    model, dev = job.model, job.device
    cal = calibration or load_calibration()
    co, link_coeffs = coefficients_for(dev, cal)
    links = C.Links.from_cluster(dev, job.devices_per_node, link_coeffs)
    n = len(lay)
    if check_legal:
        ctx = Context(job.num_devices, job.seq_len, job.global_batch, "fp8" in dev.peak_tflops)
        legal, _ = legality_mask(model, lay, ctx)
    else:
        legal = np.ones(n, dtype=bool)

    mc = memory_constants(cal)
    mem = memory_breakdown(
        model,
        lay,
        seq_len=job.seq_len,
        framework_reserve_bytes=mc["framework_reserve_bytes"],
        comm_buffer_bytes=mc["comm_buffer_bytes"],
        fragmentation=mc["fragmentation"],
        frozen_weights=job.frozen_weights,
    )
    capacity = dev.memory_gb * 1e9
    fits = mem["total"] <= capacity

    params = stage_param_counts(model, lay)
    t = step_time_breakdown(
        model,
        lay,
        seq_len=job.seq_len,
        links=links,
        co=co,
        param_counts=params,
        frozen_weights=job.frozen_weights,
    )
    step = t["step_time"]
    tokens = float(job.tokens_per_step)
    tps_dev = tokens / (step * job.num_devices)
    model_flops = model.flops_per_token(job.seq_len, attention=True, causal=False) * tokens
    # MFU against the dense peak of the layout's GEMM precision (PaLM App. B convention: attention
    # FLOPs counted without causal halving; the logits GEMM included).
    peak = np.array([co.peak(p) for p in PRECISION_CODES])[lay["precision"]]
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
        "memory_capacity_bytes": np.full(n, capacity),
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
    return out
