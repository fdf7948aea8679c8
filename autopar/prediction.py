"""``autopar.predict``: memory and step time of ONE training layout (the engine on a table of one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autopar.engine import TrainingJob, evaluate
from autopar.errors import AutoparError, LayoutError
from autopar.latency import TIME_COMPONENTS
from autopar.layout import Layout, LayoutTable, Reason, resolve_layout
from autopar.legality import Context, reasons_for_row
from autopar.memory import GIB, MEMORY_COMPONENTS

JOB_FIELDS = ("model", "device", "num_devices", "devices_per_node", "seq_len", "global_batch")


@dataclass
class Prediction:
    """The prediction for one layout; ``to_dict()`` is what ``predict --json`` prints."""

    layout: Layout
    job: dict[str, Any]
    step_time_s: float
    tokens_per_s_per_device: float
    mfu: float
    memory_gib_per_device: float
    memory_capacity_gib: float
    fits: bool
    reasons: list[Reason]
    time_breakdown: dict[str, float]
    memory_breakdown: dict[str, float]
    exposed_comm_fraction: float
    comm_exposed_s: float
    comm_total_s: float
    energy_j_per_step: float
    avg_power_w: float
    memory_stage: int
    coefficients: str = ""
    expected_error_p90: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.layout.model_dump())
        d.update(self.job)
        d.update(
            step_time_s=self.step_time_s,
            tokens_per_s_per_device=self.tokens_per_s_per_device,
            mfu=self.mfu,
            memory_gib_per_device=self.memory_gib_per_device,
            memory_capacity_gib=self.memory_capacity_gib,
            memory_stage=self.memory_stage,
            fits=self.fits,
            reasons=[r.to_dict() for r in self.reasons],
            exposed_comm_fraction=self.exposed_comm_fraction,
            comm_exposed_s=self.comm_exposed_s,
            comm_total_s=self.comm_total_s,
            energy_j_per_step=self.energy_j_per_step,
            avg_power_w=self.avg_power_w,
            time_breakdown=self.time_breakdown,
            memory_breakdown=self.memory_breakdown,
            coefficients=self.coefficients,
            expected_error_p90=self.expected_error_p90,
        )
        return d


def prediction_from_row(
    job: TrainingJob,
    job_info: dict[str, Any],
    lay: LayoutTable,
    res: dict[str, Any],
    i: int,
    calibration=None,
) -> Prediction:
    """Turn row ``i`` of ``evaluate``'s arrays into a :class:`Prediction`.

    ``calibration`` must be the one ``res`` was computed with (default: the shipped one).
    """
    from autopar.coefficients import coefficient_source, expected_error

    ctx = Context(job.num_devices, job.seq_len, job.global_batch, "fp8" in job.device.peak_tflops)
    reasons = reasons_for_row(job.model, lay, ctx, i)
    mem_gib = float(res["memory_bytes"][i]) / GIB
    cap_gib = float(res["memory_capacity_bytes"][i]) / GIB
    if mem_gib > cap_gib:
        parts = {k: float(res[f"mem_{k}"][i]) / GIB for k in MEMORY_COMPONENTS}
        top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
        reasons.append(
            Reason(
                "out_of_memory",
                f"needs {mem_gib:.1f} GiB per device on pipeline stage {int(res['memory_stage'][i])}, "
                f"the device has {cap_gib:.1f} GiB; largest parts: "
                + ", ".join(f"{k} {v:.1f} GiB" for k, v in top),
                {"memory_gib": round(mem_gib, 2), "capacity_gib": round(cap_gib, 2)},
                "more tp/pp, a higher zero stage, recompute, or a smaller micro-batch",
            )
        )
    return Prediction(
        layout=lay.row(i),
        job=job_info,
        step_time_s=float(res["step_time_s"][i]),
        tokens_per_s_per_device=float(res["tokens_per_s_per_device"][i]),
        mfu=float(res["mfu"][i]),
        memory_gib_per_device=mem_gib,
        memory_capacity_gib=cap_gib,
        fits=bool(res["fits"][i]),
        reasons=reasons,
        time_breakdown={k: float(res[f"time_{k}"][i]) for k in TIME_COMPONENTS},
        memory_breakdown={k: float(res[f"mem_{k}"][i]) / GIB for k in MEMORY_COMPONENTS},
        exposed_comm_fraction=float(res["exposed_comm_fraction"][i]),
        comm_exposed_s=float(res["comm_exposed_s"][i]),
        comm_total_s=float(res["comm_total_s"][i]),
        energy_j_per_step=float(res["energy_j_per_step"][i]),
        avg_power_w=float(res["avg_power_w"][i]),
        memory_stage=int(res["memory_stage"][i]),
        coefficients=coefficient_source(job.device.id, calibration),
        expected_error_p90=expected_error(job.device.id, calibration),
    )


def make_job(
    *,
    model,
    device,
    num_devices: int,
    devices_per_node: int | None,
    seq_len: int,
    global_batch: int,
    lora: bool = False,
) -> tuple[TrainingJob, dict[str, Any]]:
    """Load the model and device and check the cluster and workload sizes."""
    from autopar.hardware import load_cluster
    from autopar.model import ModelSpec, load_model

    for name, v in (("num_devices", num_devices), ("seq_len", seq_len), ("global_batch", global_batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise AutoparError(
                f"{name} must be a positive integer, got {v!r}", f"pass --{name.replace('_', '-')} >= 1"
            )
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    cluster = load_cluster(device, num_devices, devices_per_node)
    job = TrainingJob(
        spec,
        cluster.device,
        num_devices,
        cluster.devices_per_node,
        seq_len,
        global_batch,
        frozen_weights=bool(lora),
    )
    info = {
        "model": model if isinstance(model, str) else spec.name,
        "device": cluster.device.id,
        "num_devices": num_devices,
        "devices_per_node": cluster.devices_per_node,
        "seq_len": seq_len,
        "global_batch": global_batch,
        "lora": bool(lora),
    }
    return job, info


def predict(
    *,
    model,
    device: str,
    num_devices: int,
    devices_per_node: int | None = None,
    seq_len: int,
    global_batch: int,
    tp: int = 1,
    pp: int = 1,
    vpp: int = 1,
    dp: int | None = None,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    zero: int = 1,
    shard_group: int = 0,
    sp: bool | None = None,
    micro_batch: int = 1,
    recompute: str = "none",
    offload: bool = False,
    precision: str = "bf16",
    lora: bool = False,
    calibration: str | None = None,
) -> Prediction:
    """Predict per-device memory and step time of one training layout.

    Keyword names mirror ``autopar predict`` flags. ``dp`` defaults to what is left of the world
    size; ``sp`` defaults to on when tp > 1. ``lora``: LoRA/PEFT fine-tuning (base weights frozen). Raises :class:`LayoutError` (with ``reasons``) for a
    layout that is not legal; a legal layout that does not fit returns ``fits=False`` and reasons.
    """
    from autopar.coefficients import load_calibration

    job, info = make_job(
        model=model,
        device=device,
        num_devices=num_devices,
        devices_per_node=devices_per_node,
        seq_len=seq_len,
        global_batch=global_batch,
        lora=lora,
    )
    layout = resolve_layout(
        num_devices=num_devices,
        global_batch=global_batch,
        tp=tp,
        pp=pp,
        vpp=vpp,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=etp,
        zero=zero,
        shard_group=shard_group,
        sp=sp,
        micro_batch=micro_batch,
        recompute=recompute,
        offload=offload,
        precision=precision,
    )
    table = LayoutTable.from_layouts([layout])
    cal = load_calibration(calibration)
    res = evaluate(job, table, calibration=cal)
    pred = prediction_from_row(job, info, table, res, 0, cal)
    illegal = [r for r in pred.reasons if r.code != "out_of_memory"]
    if illegal:
        first = illegal[0]
        allowed = f"; allowed: {first.allowed}" if first.allowed is not None else ""
        raise LayoutError(
            f"illegal layout {layout.short()}: {first.message} ({first.values}{allowed})",
            "change the named degrees",
            illegal,
        )
    return pred
