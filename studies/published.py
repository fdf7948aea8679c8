"""Published training runs (the published-runs CSV format) as autopar jobs, layouts and targets.

Reads any CSV with the columns documented in the data README, builds the model, cluster and layout
of every training row it can express and predicts it. Blank layout fields are filled with stated
assumptions (recorded per row and counted in the summary), never silently. Rows whose only target
is TFLOP/s or MFU are converted with the source's own FLOP convention and reported separately as
"derived targets". Used by ``studies/published_runs.py`` (accuracy) and the coefficient fit.
"""

from __future__ import annotations

import csv
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autopar.engine import evaluate
from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.job import Job, TrainingJob
from autopar.layout import LayoutTable, resolve_layout
from autopar.legality import Context, reasons_for_row
from autopar.model import load_model

TRAINING_KINDS = ("pretrain", "finetune")


def _num(row: dict[str, str], key: str) -> float | None:
    v = (row.get(key) or "").strip()
    if v == "":
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _int(row: dict[str, str], key: str) -> int | None:
    v = _num(row, key)
    return None if v is None or math.isnan(v) else int(round(v))


@dataclass
class Case:
    row: dict[str, str]
    run_id: str
    assumptions: list[str] = field(default_factory=list)
    skipped: str | None = None
    measured_tps: float | None = None
    target_kind: str = "measured"  # measured | derived
    prediction: dict[str, Any] | None = None
    job: TrainingJob | None = None
    measured_step: float | None = None
    table: LayoutTable | None = None


# Architecture conventions of model families whose rows give only dimensions (the data README says
# the architecture columns came from the public configs of these families).
FAMILY_CONVENTIONS = (
    (
        "mpt",
        dict(gated_mlp=False, norm="layernorm", tie_embeddings=True),
        "MPT: GELU MLP, LayerNorm, tied embeddings",
    ),
    (
        "gpt",
        dict(gated_mlp=False, norm="layernorm", tie_embeddings=True),
        "GPT: GELU MLP, LayerNorm, tied embeddings",
    ),
)


# Sources whose dims-only models are Megatron GPT models (the paper/README tables say so).
MEGATRON_GPT_SOURCES = ("narayanan", "korthikanti", "megatron_core")


def build_model(case: Case):
    row = case.row
    preset = (row.get("model_preset") or "").strip()
    if preset:
        return load_model(preset)
    need = {"layers": "layers", "hidden": "hidden", "heads": "heads"}
    dims = {k: _int(row, c) for k, c in need.items()}
    missing = [k for k, v in dims.items() if v is None]
    if missing:
        raise AutoparError(f"architecture columns missing: {', '.join(missing)}")
    name = (row.get("model") or "").lower()
    source = (row.get("source_id") or "").lower()
    if source.startswith(MEGATRON_GPT_SOURCES):
        name = "gpt " + name
    conv = None
    for key, fields, note in FAMILY_CONVENTIONS:
        if key in name:
            conv = (fields, note)
            break
    if conv is None:
        raise AutoparError(f"no preset and unknown family for dims-only model {row.get('model')!r}")
    fields, note = conv
    h = dims["hidden"]
    ffn = _int(row, "ffn_hidden")
    vocab = _int(row, "vocab")
    if ffn is None:
        ffn = 4 * h
        case.assumptions.append("ffn_hidden=4*hidden (GPT convention)")
    if vocab is None:
        vocab = 50257
        case.assumptions.append("vocab=50257 (GPT-2/3 tokenizer)")
    kv = _int(row, "kv_heads") or dims["heads"]
    case.assumptions.append(note)
    raw = dict(
        name=row.get("model") or "model",
        hidden=h,
        layers=dims["layers"],
        heads=dims["heads"],
        kv_heads=kv,
        head_dim=h // dims["heads"],
        ffn_hidden=ffn,
        vocab=vocab,
        **fields,
    )
    ne = _int(row, "num_experts")
    if ne:
        raw.update(
            num_experts=ne,
            moe_topk=_int(row, "moe_topk") or 1,
            moe_ffn_hidden=ffn,
            moe_layers=dims["layers"],
            ffn_hidden=0,
        )
    return load_model(raw)


def layout_for(case: Case, num_devices: int, global_batch: int):
    row = case.row
    tp, pp, cp = _int(row, "tp"), _int(row, "pp"), _int(row, "cp") or 1
    if tp is None or pp is None:
        return best_layout_for(case, num_devices, global_batch)
    vpp = _int(row, "vpp")
    if vpp is None:
        vpp = 1
        case.assumptions.append("vpp=1 (not stated)")
    ep = _int(row, "ep") or 1
    etp = _int(row, "etp")
    dp = _int(row, "dp")
    mb = _int(row, "micro_batch")
    if mb is None:
        mb = 1
        case.assumptions.append("micro_batch=1 (not stated)")
    zero = _int(row, "zero_stage")
    if zero is None:
        zero = 1
        case.assumptions.append("zero=1 (distributed optimizer; not stated)")
    sp_v = _int(row, "sequence_parallel")
    if sp_v is None:
        sp = tp > 1
        if sp:
            case.assumptions.append("sp=on (tp > 1; not stated)")
    else:
        sp = bool(sp_v) and tp > 1
    rec = (row.get("recompute") or "").strip()
    if not rec:
        rec = "none"
        case.assumptions.append("recompute=none (not stated)")
    prec = (row.get("precision") or "").strip()
    if not prec:
        prec = "bf16"
        case.assumptions.append("precision=bf16 (not stated; same peak as fp16 on these devices)")
    prec = normalize_precision(case, prec)
    shard = _int(row, "shard_group") or 0
    if shard and zero == 0:
        shard = 0
    return resolve_layout(
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
        shard_group=shard if shard and shard < (dp or 0) * cp else 0,
        sp=sp,
        micro_batch=mb,
        recompute=rec,
        precision=prec,
    )


def normalize_precision(case: Case, prec: str) -> str:
    """The data format's precision vocabulary onto autopar's GEMM precisions (stated when mapped)."""
    if prec == "mxfp8":  # MX block-scaled FP8 runs on the same FP8 tensor-core rate
        case.assumptions.append("mxfp8 costed as fp8 (same tensor-core rate; block scales neglected)")
        return "fp8"
    if prec not in ("bf16", "fp16", "fp8", "fp32"):
        raise AutoparError(f"precision {prec} is not modeled for training")
    return prec


def best_layout_for(case: Case, num_devices: int, global_batch: int):
    """The source does not state its layout: assume the practitioners ran autopar's top-1 layout of
    the default search space (a stated assumption; the prediction is then an upper bound)."""
    from autopar.search.recommend import recommend

    row = case.row
    prec = normalize_precision(case, (row.get("precision") or "").strip() or "bf16")
    model = build_model(case)
    dev = (row.get("device") or "").strip()
    res = recommend(
        model=model,
        device=dev,
        num_devices=num_devices,
        devices_per_node=_int(row, "devices_per_node"),
        seq_len=_int(row, "seq_len") or 0,
        global_batch=global_batch,
        top=1,
        overrides=[f"precision={prec}"],
        progress=False,
    )
    lay = res.results[0].layout
    case.assumptions.append("layout not stated: autopar's top-1 layout of the default space")
    return lay


def megatron_flops_per_iter(model, B: int, s: int) -> float:
    """Narayanan et al. 2021 Eq. 3 (full recompute, hardware FLOPs): 96·B·s·L·h²·(1 + s/6h + V/16Lh)."""
    L, h, V = model.layers, model.hidden, model.vocab
    return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def megatron_model_flops_per_token(model, s: int) -> float:
    """Megatron-LM ``num_floating_point_operations`` per token (GQA, gated MLP, no recompute)."""
    L, h, V = model.layers, model.hidden, model.vocab
    q = model.heads * model.head_dim
    g, a = model.kv_heads, model.heads
    F = model.ffn_hidden
    gamma = 1.5 if model.gated_mlp else 1.0
    return 12.0 * L * h * h * ((1 + g / a + s / h) * (q / h) + (F / h) * gamma + V / (2 * L * h))


def measured_target(case: Case, model, num_devices: int, global_batch: int, seq: int) -> None:
    row = case.row
    tps = _num(row, "tokens_per_s_per_device")
    st = _num(row, "step_time_s")
    if tps is not None:
        case.measured_tps = tps
        return
    if st is not None and global_batch:
        case.measured_tps = global_batch * seq / (st * num_devices)
        return
    hw = _num(row, "hw_tflops_per_device")
    if hw is not None:  # Narayanan: TFLOP/s per GPU counting the recompute forward (Eq. 3)
        t = megatron_flops_per_iter(model, global_batch, seq) / (hw * 1e12 * num_devices)
        case.measured_tps = global_batch * seq / (t * num_devices)
        case.target_kind = "derived"
        return
    mfu, peak = _num(row, "mfu"), _num(row, "mfu_peak_tflops") or 989.0
    if mfu is not None:  # Megatron-Core table: MFU against the bf16 peak with Megatron's FLOP count
        case.measured_tps = mfu * peak * 1e12 / megatron_model_flops_per_token(model, seq)
        case.target_kind = "derived"
        return
    raise AutoparError("no throughput, step time, TFLOP/s or MFU target")


def run_case(case: Case, calibration=None) -> None:
    row = case.row
    kind = (row.get("workload_kind") or "").strip()
    if kind == "microbench":
        run_microbench(case, calibration)
        return
    if kind not in TRAINING_KINDS:
        case.skipped = f"workload_kind={kind or 'blank'} (not a training run)"
        return
    lora = "lora" in (row.get("model") or "").lower() or "lora" in (row.get("orig_workload") or "").lower()
    try:
        model = build_model(case)
        num_devices = _int(row, "num_devices")
        seq = _int(row, "seq_len")
        gb = _int(row, "global_batch")
        if not num_devices or not seq or not gb:
            raise AutoparError("num_devices, seq_len or global_batch missing")
        dev = load_device((row.get("device") or "").strip())
        measured_target(case, model, num_devices, gb, seq)
        lay = layout_for(case, num_devices, gb)
        dpn = _int(row, "devices_per_node") or dev.scale_up.domain
        job = Job.from_flat(
            model=model.name,
            device=dev.id,
            num_devices=num_devices,
            devices_per_node=min(dpn, num_devices),
            seq_len=seq,
            global_batch=gb,
            lora=lora,
        ).resolve(model=model, device=dev)
        if lora:
            case.assumptions.append("LoRA: base weights frozen (no weight gradients or optimizer)")
        table = LayoutTable.from_layouts([lay])
        case.job, case.table = job, table
        res = evaluate(job, table, calibration=calibration)
        ctx = Context(num_devices, seq, gb, "fp8" in dev.peak_tflops)
        illegal = reasons_for_row(model, table, ctx, 0)
        if illegal:
            case.assumptions.append("layout breaks rule(s): " + ", ".join(r.code for r in illegal))
        case.prediction = {
            "layout": lay.short(),
            "predicted_tokens_per_s_per_device": float(res["tokens_per_s_per_device"][0]),
            "predicted_step_time_s": float(res["step_time_s"][0]),
            "predicted_memory_gib": float(res["memory_bytes"][0]) / 2**30,
            "fits": bool(res["fits"][0]),
            "predicted_mfu": float(res["mfu"][0]),
        }
    except AutoparError as exc:
        case.skipped = str(exc)


def run_microbench(case: Case, calibration=None) -> None:
    """One transformer layer, forward + backward (Korthikanti Table 4): no embedding, loss or optimizer.

    Predicted as a one-layer model with a one-token vocabulary on dp = 1, minus the optimizer step.
    """
    row = case.row
    try:
        if _int(row, "layers") != 1:
            raise AutoparError("microbench rows must describe one layer")
        if not (row.get("vocab") or "").strip():
            row = {**row, "vocab": "1"}
            case.row = row
        model = build_model(case)
        case.assumptions = [a for a in case.assumptions if not a.startswith("vocab=")]
        num_devices, seq, mb = _int(row, "num_devices"), _int(row, "seq_len"), _int(row, "micro_batch") or 1
        st = _num(row, "step_time_s")
        if not num_devices or not seq or st is None:
            raise AutoparError("num_devices, seq_len or step_time_s missing")
        dev = load_device((row.get("device") or "").strip())
        lay = layout_for(case, num_devices, mb)
        job = Job.from_flat(
            model=model.name,
            device=dev.id,
            num_devices=num_devices,
            devices_per_node=min(_int(row, "devices_per_node") or 8, num_devices),
            seq_len=seq,
            global_batch=mb,
        ).resolve(model=model, device=dev)
        table = LayoutTable.from_layouts([lay])
        res = evaluate(job, table, calibration=calibration, check_legal=False)
        layer = float(res["step_time_s"][0] - res["time_optimizer"][0] - res["time_dp_comm"][0])
        case.target_kind = "microbench"
        case.measured_step = st
        case.prediction = {"layout": lay.short(), "predicted_layer_time_s": layer}
    except AutoparError as exc:
        case.skipped = str(exc)


def load_cases(path: Path) -> list[Case]:
    with path.open(newline="") as f:
        return [Case(row=r, run_id=r.get("run_id", "")) for r in csv.DictReader(f)]


def ape(case: Case) -> float:
    p = case.prediction["predicted_tokens_per_s_per_device"]  # type: ignore[index]
    return abs(p - case.measured_tps) / case.measured_tps  # type: ignore[operator]


def summarize(cases: list[Case], *, out=sys.stdout, worst: int = 10) -> dict[str, Any]:
    done = [c for c in cases if c.prediction is not None and c.measured_tps and c.target_kind != "microbench"]
    micro = [c for c in cases if c.target_kind == "microbench" and c.prediction is not None]
    meas = [c for c in done if c.target_kind == "measured"]
    derived = [c for c in done if c.target_kind == "derived"]
    training = [c for c in cases if (c.row.get("workload_kind") or "") in TRAINING_KINDS]
    with_target = [
        c
        for c in training
        if _num(c.row, "tokens_per_s_per_device") is not None or _num(c.row, "step_time_s") is not None
    ]

    def stats(cs: list[Case]) -> dict[str, float]:
        e = np.array([ape(c) for c in cs])
        signed = np.array(
            [
                (c.prediction["predicted_tokens_per_s_per_device"] - c.measured_tps) / c.measured_tps
                for c in cs
            ]
        )
        return {
            "n": len(cs),
            "mape": float(e.mean()) if len(e) else float("nan"),
            "median_ape": float(np.median(e)) if len(e) else float("nan"),
            "p90_ape": float(np.percentile(e, 90)) if len(e) else float("nan"),
            "mean_signed": float(signed.mean()) if len(e) else float("nan"),
        }

    def line(label: str, s: dict[str, float]) -> str:
        return (
            f"  {label:<38} n={s['n']:>4}  MAPE {s['mape']:6.1%}  median {s['median_ape']:6.1%}  "
            f"p90 {s['p90_ape']:6.1%}  bias {s['mean_signed']:+6.1%}"
        )

    p = lambda *a: print(*a, file=out)  # noqa: E731
    overall = stats(meas)
    covered = sum(1 for c in with_target if c.prediction is not None)
    p("== tokens/s per device, rows with a measured throughput or step time ==")
    p(line("overall", overall))
    p(
        f"  coverage: {covered}/{len(with_target)} training rows with a measured target "
        f"({covered / max(len(with_target), 1):.1%})"
    )
    for key in ("source_id", "device", "precision"):
        groups: dict[str, list[Case]] = defaultdict(list)
        for c in meas:
            groups[c.row.get(key) or "(blank)"].append(c)
        p(f"-- by {key}")
        for k in sorted(groups):
            p(line(k, stats(groups[k])))
    if derived:
        p("== derived targets (TFLOP/s or MFU converted with the source's FLOP formula) ==")
        p(line("derived", stats(derived)))
        groups = defaultdict(list)
        for c in derived:
            groups[c.row.get("source_id") or ""].append(c)
        for k in sorted(groups):
            p(line(k, stats(groups[k])))
    if micro:
        p("== microbench: one layer forward+backward (step time) ==")
        for c in micro:
            pr, m = c.prediction["predicted_layer_time_s"], c.measured_step  # type: ignore[index]
            p(
                f"  run {c.run_id:>4} {c.prediction['layout']:<40} pred {pr * 1e3:7.2f} ms  "  # type: ignore[index]
                f"meas {m * 1e3:7.2f} ms  ({(pr - m) / m:+.0%})"
            )
    p(f"== worst {worst} rows ==")
    for c in sorted(done, key=ape, reverse=True)[:worst]:
        pr = c.prediction
        p(
            f"  run {c.run_id:>4} {c.row.get('source_id', '')[:28]:<28} {c.row.get('model', '')[:28]:<28} "
            f"{c.row.get('device', '')[:14]:<14} {pr['layout']:<40} pred {pr['predicted_tokens_per_s_per_device']:>9.0f} "
            f"meas {c.measured_tps:>9.0f}  ({ape(c):.0%})"
        )
    skipped = [c for c in cases if c.skipped]
    p(f"== skipped {len(skipped)} rows ==")
    reasons = Counter(c.skipped for c in skipped)
    for reason, k in reasons.most_common():
        ids = [c.run_id for c in skipped if c.skipped == reason]
        p(f"  {k:>3} x {reason}: runs {', '.join(ids[:12])}{' ...' if len(ids) > 12 else ''}")
    assumed = Counter(a for c in done for a in c.assumptions)
    if assumed:
        p("== assumptions made for blank fields (rows) ==")
        for a, k in assumed.most_common():
            p(f"  {k:>3} x {a}")
    return {
        "overall": overall,
        "coverage": covered / max(len(with_target), 1),
        "derived": stats(derived) if derived else None,
    }


def records(cases: list[Case]) -> list[dict[str, Any]]:
    out = []
    for c in cases:
        if c.skipped or c.prediction is None:
            out.append({"run_id": c.run_id, "skipped": c.skipped or "no target"})
            continue
        if c.target_kind == "microbench":
            out.append(
                {
                    "run_id": c.run_id,
                    "target_kind": "microbench",
                    "layout": c.prediction["layout"],
                    "predicted_step_time_s": c.prediction["predicted_layer_time_s"],
                    "measured_step_time_s": c.measured_step,
                    "assumptions": c.assumptions,
                }
            )
            continue
        out.append(
            {
                "run_id": c.run_id,
                "predicted_tokens_per_s_per_device": c.prediction["predicted_tokens_per_s_per_device"],
                "measured_tokens_per_s_per_device": c.measured_tps,
                "target_kind": c.target_kind,
                "predicted_step_time_s": c.prediction["predicted_step_time_s"],
                "predicted_memory_gib": c.prediction["predicted_memory_gib"],
                "measured_memory_gib": _num(c.row, "memory_gib_per_device"),
                "layout": c.prediction["layout"],
                "assumptions": c.assumptions,
            }
        )
    return out
