"""``autopar.predict``: memory and step time of ONE training layout (the engine on a table of one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autopar.coefficients import ExpectedError
from autopar.engine import evaluate
from autopar.errors import AutoparError, LayoutError
from autopar.job import SCHEMA_VERSION, Job, TrainingJob
from autopar.latency import COMM_KINDS, TIME_COMPONENTS
from autopar.layout import LAYOUT_ARGS, Layout, LayoutTable, Reason, resolve_layout
from autopar.legality import Context, reasons_for_row
from autopar.memory import GIB, MEMORY_COMPONENTS


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
    memory_allocated_gib: float = 0.0
    memory_reserved_gib: float = 0.0
    memory_limit_gib: float = 0.0
    coefficients: str = ""
    # the 90th-percentile |error| of tokens/s this prediction should expect, and where it comes from
    expected_error: ExpectedError | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # each collective's seconds per step: {"tp": {"exposed": s, "hidden": s}, ...} (sums to
    # comm_exposed_s and comm_total_s - comm_exposed_s)
    comm_breakdown: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def expected_error_p90(self) -> float | None:
        return self.expected_error.p90 if self.expected_error else None

    @property
    def mfu_basis(self) -> str:
        """The peak MFU is quoted against: the dense peak of the layout's GEMM precision."""
        from autopar.precision import PEAK_KEY

        return f"{PEAK_KEY[self.layout.precision]} dense peak"

    def mfu_text(self) -> str:
        """MFU with its basis, as every table prints it: ``41.2% (bf16 peak)``."""
        from autopar.precision import PEAK_KEY

        return f"{self.mfu:.1%} ({PEAK_KEY[self.layout.precision]} peak)"

    @property
    def assumptions(self) -> list[str]:
        out = Job.model_validate(self.job).assumptions + list(self.extra.get("model_assumptions", []))
        hidden = self.comm_breakdown.get("tp", {}).get("hidden", 0.0)
        if hidden > 0:
            # what the priced overlap needs of the launch (autopar.export.megatron writes the flag)
            out.append(
                f"TP communication overlap priced ({hidden * 1e3:,.1f} ms per step hidden behind GEMMs): "
                "Megatron --tp-comm-overlap (Transformer Engine userbuffers), which needs Transformer "
                "Engine, sequence parallelism, tp > 1 and NVLink peer memory; `autopar export --format "
                "megatron` writes it"
                + ("" if self.layout.sp else ", and refuses this layout: it has no sequence parallelism")
            )
        return out

    def __repr__(self) -> str:  # one line: the full record is to_dict()
        fit = "fits" if self.fits else "does not fit"
        return (
            f"Prediction({self.layout.short()}: step {self.step_time_s:.3f} s, "
            f"{self.tokens_per_s_per_device:,.0f} tokens/s/device, "
            f"{self.memory_gib_per_device:.1f} / {self.memory_capacity_gib:.0f} GiB, {fit})"
        )

    def to_dict(self) -> dict[str, Any]:
        """``schema_version``, the job (``Job``'s dump), the layout's fields, then the figures."""
        d: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "job": self.job}
        d.update(self.layout.model_dump())
        d.update(
            step_time_s=self.step_time_s,
            tokens_per_s_per_device=self.tokens_per_s_per_device,
            mfu=self.mfu,
            mfu_basis=self.mfu_basis,
            memory_gib_per_device=self.memory_gib_per_device,
            memory_allocated_gib=self.memory_allocated_gib,
            memory_reserved_gib=self.memory_reserved_gib,
            memory_capacity_gib=self.memory_capacity_gib,
            memory_limit_gib=self.memory_limit_gib,
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
            comm_breakdown=self.comm_breakdown,
            coefficients=self.coefficients,
            expected_error_p90=self.expected_error_p90,
            expected_error_basis=self.expected_error.to_dict() if self.expected_error else None,
            assumptions=self.assumptions,
        )
        if self.extra.get("also"):
            d["also"] = self.extra["also"]
        return d


def _same_figures(a: Prediction, b: Prediction, rel: float = 1e-9) -> bool:
    def close(x: float, y: float) -> bool:
        return abs(x - y) <= rel * max(abs(x), abs(y))

    return (
        close(a.step_time_s, b.step_time_s)
        and close(a.memory_gib_per_device, b.memory_gib_per_device)
        and close(a.energy_j_per_step, b.energy_j_per_step)
    )


def collapse_equivalent(preds: list[Prediction], limit: int | None = None) -> list[Prediction]:
    """Group layouts whose step time, memory and energy agree within 1e-9 relative (their difference
    changes no figure, e.g. a ZeRO stage without data parallelism) and keep the first of each group,
    in order, at most ``limit`` groups. The kept one's ``extra["also"]`` names the fields in which the
    others differ and their values, e.g. ``{"zero": [0, 2, 3]}``.
    """
    groups: list[list[Prediction]] = []
    for p in preds:
        for g in groups:
            if _same_figures(g[0], p):
                g.append(p)
                break
        else:
            groups.append([p])
    out = []
    for g in groups[:limit]:
        head = g[0]
        also: dict[str, list[Any]] = {}
        ref = head.layout.model_dump()
        for other in g[1:]:
            for k, v in other.layout.model_dump().items():
                if v != ref[k] and v not in also.setdefault(k, []):
                    also[k].append(v)
        if also:
            head.extra["also"] = {k: sorted(v, key=str) for k, v in also.items() if v}
        out.append(head)
    return out


def also_text(also: dict[str, list[Any]] | None) -> str:
    """``zero=0,2,3; offload=True`` (empty when nothing was collapsed)."""
    if not also:
        return ""
    return "; ".join(f"{k}={','.join(str(x) for x in v)}" for k, v in also.items())


def model_assumptions(model, seq_len: int) -> list[str]:
    """What costing an encoder or an encoder-decoder model assumes (none for a decoder)."""
    if model.is_encoder:
        return [
            f"{model.name}: a bidirectional encoder: every token attends to all {seq_len:,} positions "
            "(unmasked attention, twice a decoder's core FLOPs); "
            + (
                "the MLM head's vocabulary GEMM and loss on the last stage"
                if model.lm_head
                else "no vocabulary head"
            )
        ]
    if model.is_encoder_decoder:
        s_enc = int(model.encoder_tokens(seq_len))
        return [
            f"{model.name}: encoder-decoder: seq_len {seq_len:,} is the decoder's tokens per sample; the "
            f"encoder runs {s_enc:,} positions per sample ("
            + ("the config's max_source_positions" if model.encoder_seq else "seq_len")
            + "); each decoder block cross-attends to them; pp = 1 and cp = 1 only"
        ]
    return []


def prediction_from_row(
    job: TrainingJob,
    lay: LayoutTable,
    res: dict[str, Any],
    i: int,
    calibration=None,
) -> Prediction:
    """Turn row ``i`` of ``evaluate``'s arrays into a :class:`Prediction`.

    ``calibration`` must be the one ``res`` was computed with (default: the shipped one).
    """
    from autopar.coefficients import coefficient_source, expected_error

    ctx = Context.for_job(job)
    reasons = reasons_for_row(job.model, lay, ctx, i)
    mem_gib = float(res["memory_bytes"][i]) / GIB
    alloc_gib = float(res["memory_allocated_bytes"][i]) / GIB
    resv_gib = float(res["memory_reserved_bytes"][i]) / GIB
    cap_gib = float(res["memory_capacity_bytes"][i]) / GIB
    limit_gib = float(res["memory_limit_bytes"][i]) / GIB
    if mem_gib > limit_gib:
        parts = {k: float(res[f"mem_{k}"][i]) / GIB for k in MEMORY_COMPONENTS}
        top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
        reasons.append(
            Reason(
                "out_of_memory",
                f"needs {mem_gib:.1f} GiB per device on pipeline stage {int(res['memory_stage'][i])} "
                f"({alloc_gib:.1f} GiB allocated, {resv_gib:.1f} GiB reserved by the allocator, plus "
                f"CUDA context and NCCL buffers); the limit is {limit_gib:.1f} GiB ({cap_gib:.1f} GiB "
                f"capacity less {job.memory_headroom:.0%} headroom); largest parts: "
                + ", ".join(f"{k} {v:.1f} GiB" for k, v in top),
                {
                    "memory_gib": round(mem_gib, 2),
                    "allocated_gib": round(alloc_gib, 2),
                    "reserved_gib": round(resv_gib, 2),
                    "limit_gib": round(limit_gib, 2),
                    "capacity_gib": round(cap_gib, 2),
                },
                "more tp/pp, a higher zero stage, recompute, a smaller micro-batch, or a lower --memory-headroom",
            )
        )
    return Prediction(
        layout=lay.row(i),
        job=job.info(),
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
        memory_allocated_gib=alloc_gib,
        memory_reserved_gib=resv_gib,
        memory_limit_gib=limit_gib,
        coefficients=coefficient_source(job.device.id, calibration),
        extra={"model_assumptions": model_assumptions(job.model, job.seq_len)}
        if job.model.arch != "decoder"
        else {},
        expected_error=expected_error(
            job.device.id,
            calibration,
            job.framework.name,
            precision=lay.row(i).precision,
            model=job.model,
            num_devices=job.num_devices,
        ),
        comm_breakdown={
            k: {
                "exposed": float(res[f"comm_exposed_{k}_s"][i]),
                "hidden": float(res[f"comm_total_{k}_s"][i] - res[f"comm_exposed_{k}_s"][i]),
            }
            for k in COMM_KINDS
        },
    )


def job_from_api(job: Job | None, kind: str = "training", **flat: Any) -> Job:
    """The API's two spellings of a job: ``job=Job(...)`` or the flat keywords (field names)."""
    given = {k: v for k, v in flat.items() if v is not None}
    if job is None:
        return Job.from_flat(kind=kind, **flat)  # type: ignore[arg-type]
    if not isinstance(job, Job):
        raise AutoparError(f"job must be an autopar.job.Job, got {type(job).__name__}", "pass job=Job(...)")
    if given:
        raise AutoparError(
            f"job= given together with the job keyword(s) {sorted(given)}",
            "pass either job=Job(...) or the flat keywords, not both",
        )
    if job.workload.kind != kind:
        raise AutoparError(f"expected a {kind} job, got a {job.workload.kind} job")
    return job


def training_job(job: Job | None = None, *, model: Any = None, **flat: Any) -> TrainingJob:
    """The resolved training job of the API's keywords (``model`` may be a loaded ModelSpec)."""
    from autopar.model import ModelSpec

    spec = model if isinstance(model, ModelSpec) else None
    decl = job_from_api(job, "training", model=spec.name if spec else model, **flat)
    return decl.resolve(model=spec)


def predict(
    *,
    job: Job | None = None,
    layout: Layout | None = None,
    model: Any = None,
    device: str | None = None,
    num_devices: int | None = None,
    devices_per_node: int | None = None,
    seq_len: int | None = None,
    global_batch: int | None = None,
    lora: bool | None = None,
    moe_dispatcher: str | None = None,
    moe_a2a_overlap: bool | None = None,
    moe_fused_graph: bool | None = None,
    pipeline_schedule: str | None = None,
    attention_kernel: str | None = None,
    tp_comm_overlap: str | None = None,
    framework: str | None = None,
    memory_headroom: float | None = None,
    allow_long_context: bool | None = None,
    calibration: str | None = None,
    **layout_kw: Any,
) -> Prediction:
    """Predict per-device memory and step time of one training layout.

    The job: ``job=Job(...)`` or the flat keywords (the ``autopar predict`` flag names: model,
    device, num_devices, devices_per_node, seq_len, global_batch, lora, moe_dispatcher,
    moe_a2a_overlap, moe_fused_graph, pipeline_schedule, attention_kernel, tp_comm_overlap, framework, memory_headroom,
    allow_long_context, calibration).
    The layout: ``layout=Layout(...)`` or the layout keywords of :func:`resolve_layout` (tp, pp,
    vpp, dp, cp, ep, etp, zero, shard_group, sp, micro_batch, recompute, offload, precision;
    defaults: the :class:`Layout` field defaults, ``dp`` what is left of the world size, ``sp`` on
    when tp > 1). Raises :class:`LayoutError` (with ``reasons``) for a layout that is not legal; a
    legal layout that does not fit returns ``fits=False`` and reasons.
    """
    from autopar.coefficients import load_calibration

    tj = training_job(
        job,
        model=model,
        device=device,
        num_devices=num_devices,
        devices_per_node=devices_per_node,
        seq_len=seq_len,
        global_batch=global_batch,
        lora=lora,
        moe_dispatcher=moe_dispatcher,
        moe_a2a_overlap=moe_a2a_overlap,
        moe_fused_graph=moe_fused_graph,
        pipeline_schedule=pipeline_schedule,
        attention_kernel=attention_kernel,
        tp_comm_overlap=tp_comm_overlap,
        framework=framework,
        memory_headroom=memory_headroom,
        allow_long_context=allow_long_context,
        calibration=calibration,
    )
    if layout is not None:
        if layout_kw:
            raise AutoparError(
                f"layout= given together with the layout keyword(s) {sorted(layout_kw)}",
                "pass either layout=Layout(...) or the layout keywords, not both",
            )
        if not isinstance(layout, Layout):
            raise AutoparError(f"layout must be an autopar.Layout, got {type(layout).__name__}")
    else:
        unknown = sorted(set(layout_kw) - set(LAYOUT_ARGS))
        if unknown:
            raise AutoparError(
                f"predict() got unknown keyword(s) {unknown}", f"known layout keywords: {list(LAYOUT_ARGS)}"
            )
        layout = resolve_layout(num_devices=tj.num_devices, global_batch=tj.global_batch, **layout_kw)
    table = LayoutTable.from_layouts([layout])
    cal = load_calibration(tj.job.calibration)
    res = evaluate(tj, table, calibration=cal)
    pred = prediction_from_row(tj, table, res, 0, cal)
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
