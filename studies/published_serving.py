"""Accuracy of autopar's serving model against published inference runs.

    python studies/published_serving.py [--csv studies/data/published_runs_dev.csv] [--json OUT] [--fit] [--lodo]

Predicts every inference row of a published-runs CSV (columns documented in the data README:
``isl``, ``osl``, ``output_tokens_per_s``, ``tp``/``pp``/``ep``, ``device``, ``precision``, the model
preset or its dimensions) and prints the MAPE of output tokens/s overall, by TP and by model, the
worst rows and every skipped row with its reason. The rows are offline max-throughput runs
(data README caveat 7): the runtime chooses the batch, modeled as the largest concurrency the
KV cache holds, capped by trtllm-bench's tuning cap of 4096 sequences, with its token-budget
heuristic. The model uses the device coefficients of the training calibration plus the
serving-specific ones of :class:`autopar.serving.estimate.ServingCoefficients`; ``--fit`` refits those
(least squares on log throughput, soft-L1) and prints them; ``--lodo`` prints, per device and per
model, the MAPE with one fit on every row (in-sample) and with a fit that never saw the group's rows
(held out). Prefill attention runs at the published forward-kernel efficiency of the device's die
(:data:`autopar.serving.estimate.PREFILL_ATTENTION_EFF`), not a fitted figure.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from published import DEV_CSV

from autopar.coefficients import load_calibration
from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import (
    ServingCoefficients,
    ServingTable,
    evaluate_serving,
    make_context,
    make_workload,
)

PRECISION = {"fp8": "fp8", "mxfp8": "fp8", "bf16": "bf16", "fp16": "fp16", "nvfp4": "nvfp4"}
# The serving stack a row states (data README: ``orig_framework``, or a ``stack`` column), by the
# spellings sources use; each row is predicted with its stack's backend profile
# (cost_models/backends/).
STACKS = (
    ("tensorrt-llm", "trtllm"),
    ("tensorrt_llm", "trtllm"),
    ("trtllm", "trtllm"),
    ("sglang", "sglang"),
    ("vllm", "vllm"),
)


def stack_of(row: dict[str, str]) -> tuple[str | None, str]:
    """(backend, the row's own words) for a row's serving stack; None: a stack no profile describes."""
    text = (row.get("stack") or row.get("orig_framework") or "").strip()
    low = text.lower()
    for key, name in STACKS:
        if key in low:
            return name, text
    return None, text


LONG_ISL = 5000  # the long-context rows of issue 23's acceptance (ISL >= 5000)


def _num(row: dict[str, str], key: str) -> float | None:
    v = (row.get(key) or "").strip()
    try:
        return float(v) if v else None
    except ValueError:
        return None


def _int(row: dict[str, str], key: str) -> int | None:
    v = _num(row, key)
    return None if v is None or math.isnan(v) else int(round(v))


def _model(row: dict[str, str]):
    preset = (row.get("model_preset") or "").strip()
    if preset:
        return load_model(preset)
    dims = {k: _int(row, k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")}
    missing = [k for k in ("layers", "hidden", "heads", "ffn_hidden", "vocab") if dims[k] is None]
    if missing:
        raise AutoparError(f"no model_preset and architecture columns missing: {', '.join(missing)}")
    raw: dict[str, Any] = {
        "name": row.get("model") or "model",
        **{k: v for k, v in dims.items() if v is not None},
    }
    return load_model(raw)


def load_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return [r for r in csv.DictReader(f) if (r.get("workload_kind") or "").strip() == "inference"]


def prepare(row: dict[str, str]) -> dict[str, Any]:
    """Everything a prediction needs, or ``skipped`` with the reason."""
    rec: dict[str, Any] = {"run_id": row.get("run_id"), "assumptions": []}
    meas = _num(row, "output_tokens_per_s")
    isl, osl = _int(row, "isl"), _int(row, "osl")
    if meas is None or not meas > 0:
        return rec | {"skipped": "no measured output_tokens_per_s"}
    if not isl or not osl:
        return rec | {"skipped": "isl/osl not stated"}
    prec = (row.get("precision") or "").strip().lower()
    if prec and prec not in PRECISION:
        return rec | {"skipped": f"precision {prec!r} is not modeled for serving"}
    if not prec:
        prec = "bf16"
        rec["assumptions"].append("precision bf16 (not stated)")
    why = instance(row, rec, stack_default="trtllm")
    if why:
        return rec | {"skipped": why}
    rec.update(
        isl=isl,
        osl=osl,
        precision=PRECISION[prec],
        measured=meas,
        label=f"{row.get('model_preset') or row.get('model')} {row.get('device')} tp{rec['tp']} "
        f"pp{rec['pp']} {isl}/{osl}",
    )
    return rec


def instance(row: dict[str, str], rec: dict[str, Any], *, stack_default: str | None) -> str | None:
    """The row's serving instance into ``rec``: tp, pp, ep, replicas, model, device,
    devices_per_node and backend (``stack_default`` where the row names no stack, noted in
    ``rec["assumptions"]``; None: such a row is skipped). Returns why the row cannot be predicted, or
    None. Shared with ``studies/serving_latency.py``."""
    tp = _int(row, "tp")
    if tp is None:
        return "tp not stated"
    pp = _int(row, "pp") or 1
    n = _int(row, "num_devices") or tp * pp
    if n % (tp * pp):
        return f"num_devices {n} is not a multiple of tp*pp {tp * pp}"
    try:
        model = _model(row)
        device = load_device((row.get("device") or "").strip())
    except AutoparError as exc:
        return str(exc)
    backend, said = stack_of(row)
    if backend is None:
        if said or stack_default is None:
            return f"serving stack {said!r} has no backend profile (trtllm, vllm, sglang)"
        backend = stack_default
        rec["assumptions"].append(f"stack {stack_default} (not stated)")
    rec.update(
        backend=backend,
        model=model,
        device=device,
        tp=tp,
        pp=pp,
        ep=_int(row, "ep") or 1,
        adp=_int(row, "adp") or 1,
        replicas=n // (tp * pp),
        devices_per_node=min(_int(row, "devices_per_node") or device.scale_up.domain, n),
    )
    return None


def study_calibration(path: Path, calibration: str | None, what: str):
    """The calibration of a study reading ``path``, or None after printing the one-line error (the
    study then exits 2)."""
    if not path.is_file():
        print(f"error: {path} does not exist (pass --csv PATH to {what})", file=sys.stderr)
        return None
    try:
        return load_calibration(calibration)
    except AutoparError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def evaluate_row(rec: dict[str, Any], cal, sc: ServingCoefficients | None, **load: Any) -> dict[str, Any]:
    """:func:`evaluate_serving` of one prepared row's instance (model, device, tp/pp/ep, precision,
    backend) under the workload ``load`` (offline=True, or concurrency= with arrival=; a
    ``conc`` column with the concurrency); shared with ``studies/serving_latency.py``."""
    w = make_workload(
        isl=rec["isl"], osl=rec["osl"], weight_precision=rec["precision"], backend=rec["backend"], **load
    )
    ctx = make_context(
        rec["model"],
        rec["device"],
        w,
        devices_per_node=rec["devices_per_node"],
        calibration=cal,
        serving_coefficients=sc,
    )
    cols = {"tp": rec["tp"], "pp": rec["pp"], "ep": rec["ep"], "adp": rec.get("adp", 1)}
    if load.get("concurrency"):
        cols["conc"] = load["concurrency"]
    return evaluate_serving(ctx, ServingTable(cols))


def predict(rec: dict[str, Any], cal, sc: ServingCoefficients | None) -> dict[str, Any]:
    res = evaluate_row(rec, cal, sc, offline=True)
    if not res["valid"][0]:
        bad = [k for k, v in res["bad"].items() if v[0]]
        return {"skipped": f"layout does not fit or is illegal: {', '.join(bad)}"}
    return {
        "predicted": float(res["output_tps_instance"][0]) * rec["replicas"],
        "batch": float(res["batch"][0]),
        "tpot_ms": float(res["tpot_s"][0]) * 1e3,
        "ttft_ms": float(res["ttft_service_s"][0]) * 1e3,
    }


def run(recs: list[dict[str, Any]], cal, sc: ServingCoefficients | None) -> None:
    for r in recs:
        for k in ("predicted", "batch", "tpot_ms", "ttft_ms", "error"):
            r.pop(k, None)
        if "skipped" in r and "measured" not in r:
            continue
        r.pop("skipped", None)
        out = predict(r, cal, sc)
        r.update(out)
        if "predicted" in r:
            r["error"] = r["predicted"] / r["measured"] - 1.0


def fit(recs: list[dict[str, Any]], cal) -> ServingCoefficients:
    """Least squares (soft-L1 on log throughput) of the fitted serving coefficients."""
    from scipy.optimize import least_squares

    ok = [r for r in recs if "measured" in r]
    base = ServingCoefficients.from_calibration(cal)
    meas = np.array([r["measured"] for r in ok])

    def coeffs(x) -> ServingCoefficients:
        return ServingCoefficients(
            host_step_s=x[0] * 1e-6,
            host_per_seq_s=x[1] * 1e-6,
            collective_sync_s=x[2] * 1e-6,
            runtime_reserve_bytes=base.runtime_reserve_bytes,
            comm_buffer_bytes=base.comm_buffer_bytes,
        )

    def resid(x):
        pred = np.array([predict(r, cal, coeffs(x)).get("predicted", np.nan) for r in ok])
        return np.nan_to_num(np.log(pred / meas), nan=5.0)

    x0 = [base.host_step_s * 1e6, base.host_per_seq_s * 1e6, base.collective_sync_s * 1e6]
    sol = least_squares(
        resid, x0, bounds=([0.0, 0.0, 0.0], [20000.0, 200.0, 1000.0]), loss="soft_l1", f_scale=0.1
    )
    return coeffs(sol.x)


def held_out(recs: list[dict[str, Any]], cal, key: str) -> dict[str, Any]:
    """Leave one ``key`` group out (device or model): refit the fitted serving coefficients on the
    other groups' rows, predict the group's rows; returns the in-sample (one fit on every row) and
    held-out MAPE per group. A group that is the only one has no held-out figure."""
    ok = [r for r in recs if "measured" in r]
    names = sorted({str(r[key].id if key == "device" else r[key].name) for r in ok})

    def name(r):
        return str(r[key].id if key == "device" else r[key].name)

    def mape(rows, sc):
        run(rows, cal, sc)
        e = [abs(r["error"]) for r in rows if "error" in r]
        return float(np.mean(e)) if e else float("nan"), len(e)

    sc_all = fit(ok, cal)
    errors: list[float] = []  # every held-out row's relative error
    out: dict[str, Any] = {"_errors": errors}
    for g in names:
        mine = [r for r in ok if name(r) == g]
        rest = [r for r in ok if name(r) != g]
        ins, n = mape(mine, sc_all)
        if not rest:
            print(
                f"  {g}: in-sample {ins:.1%} (n={n}, one fit on all rows); held out: none (the only {key} in the rows)"
            )
            out[g] = {"in_sample": ins, "held_out": None, "rows": n}
            continue
        ho, _ = mape(mine, fit(rest, cal))
        errors.extend(float(r["error"]) for r in mine if "error" in r)
        print(
            f"  {g}: in-sample {ins:.1%} (one fit on all rows), held out {ho:.1%} (n={n}, fit on {len(rest)} other rows)"
        )
        out[g] = {"in_sample": ins, "held_out": ho, "rows": n}
    run(recs, cal, sc_all)
    return out


def expected_error_table(
    recs: list[dict[str, Any]], held: dict[str, list[float]], csv_path: Path, *, measure_moe: bool = True
) -> dict[str, Any] | None:
    """The serving expected-error table: the p90 of |relative error| of output tokens/s over the
    held-out rows (each predicted by serving coefficients refitted without its device or model),
    the domain the rows cover (devices, model classes), the widening factors for predictions
    outside it, and the coverage of the p90 band per hold-out kind. The rows measure one stack
    (TensorRT-LLM) on too few devices to fit a device factor from serving rows: the device and
    model-class factors are the training table's out-of-sample ones, said so in the table."""
    import hashlib

    from autopar.coefficients import _expected_error_table, expected_error_path

    allerr = np.abs(np.array([e for v in held.values() for e in v]))
    if not len(allerr):
        return None
    p90 = float(np.quantile(allerr, 0.9))
    done = [r for r in recs if "error" in r]
    train = _expected_error_table(str(expected_error_path())).get("widening") or {}

    def borrowed(kind: str, text: str) -> dict[str, Any]:
        f = float((train.get(kind) or {}).get("factor", 1.0))
        return {
            "factor": f,
            "from": f"training expected_error.yaml widening.{kind} (no serving rows to fit it)",
            "text": text,
        }

    widening: dict[str, Any] = {
        "device": borrowed("device", "no serving run measured on this device or its same-silicon twin"),
        "datasheet": borrowed("device", "device coefficients are datasheet efficiencies (never fitted)"),
        "model_class": borrowed("model_class", "model class never measured in serving (MoE/MLA)"),
    }
    # A stack no row measured takes the largest of these borrowed factors (stated here, so that the
    # measured MoE/MLA factor below does not also become the stack's).
    k_max = max(widening, key=lambda k: widening[k]["factor"])
    widening["backend"] = {
        "factor": widening[k_max]["factor"],
        "from": f"the largest borrowed factor (widening.{k_max}): no serving run of another stack to fit one",
        "text": "no serving run of this stack measured (the stacks measured: trtllm)",
    }
    domain = {
        "devices": sorted({r["device"].id for r in done}),
        "model_classes": sorted({"moe" if r["model"].is_moe else "dense" for r in done}),
        "stacks": sorted({r["backend"] for r in done}),
    }
    partial = {"domain": domain, "base": {"p90_ape": p90}, "widening": widening}
    from serving_moe_anchor import model_class_widening

    # the measured MoE/MLA factor (its 218 predictions) only where the table is written
    measured = (
        model_class_widening(partial, extra=moe_row_needs(partial, MOE_HELD_OUT_CSV)) if measure_moe else None
    )
    if measured is not None:
        widening["model_class"] = measured
    return {
        "schema": "autopar.serving_expected_error/v1",
        "provenance": {
            "method": "p90 of |held-out relative error| of output tokens/s; rows held out by device and by "
            "model, each predicted with the serving coefficients refitted without them",
            "command": "python studies/published_serving.py --write-expected-error "
            "cost_models/calibration/serving_expected_error.yaml",
            "data": {csv_path.name: hashlib.sha256(csv_path.read_bytes()).hexdigest()[:16]},
            "stack": "trtllm (trtllm-bench max-throughput runs)",
        },
        "domain": domain,
        "base": {
            "rows": int(len(allerr)),
            "p90_ape": round(p90, 4),
            "median_ape": round(float(np.median(allerr)), 4),
            "in_sample_p90_ape": round(float(np.quantile([abs(r["error"]) for r in done], 0.9)), 4),
        },
        "widening": widening,
        "coverage": {
            k: {"rows": len(v), "coverage": round(float(np.mean(np.abs(v) <= p90)), 4)}
            for k, v in held.items()
            if v
        },
    }


# Measured MoE serving throughput never fitted: TensorRT-LLM 1.0's perf overview on H100, H200, B200
# and GB200 (studies/data/serving_throughput_trtllm_v1.README.md).
MOE_HELD_OUT_CSV = Path(__file__).resolve().parent / "data" / "serving_throughput_trtllm_v1.csv"


def moe_row_needs(table: dict[str, Any], path: Path, cal=None) -> list[float]:
    """Per MoE row of ``path`` (predicted with the shipped coefficients): the widening factor its
    |error| needs beyond the table's base p90 and its other widenings
    (:func:`serving_moe_anchor.needed_widening`)."""
    from serving_moe_anchor import needed_widening

    if not path.is_file():
        return []
    cal = cal if cal is not None else load_calibration()
    sc = ServingCoefficients.from_calibration(cal)
    needs = []
    for row in load_rows(path):
        rec = prepare(row)
        if "skipped" in rec or not rec["model"].is_moe:
            continue
        rec.update(predict(rec, cal, sc))
        if "predicted" in rec:
            err = rec["predicted"] / rec["measured"] - 1.0
            needs.append(needed_widening(table, cal, rec["device"].id, rec["model"], rec["backend"], err))
    return needs


def summarize(recs: list[dict[str, Any]], worst: int) -> dict[str, Any]:
    done = [r for r in recs if "error" in r]
    skipped = [r for r in recs if "error" not in r]
    if not done:
        print("no inference row could be predicted")
        for r in skipped:
            print(f"  skipped run {r['run_id']}: {r.get('skipped')}")
        return {"rows": 0}
    ape = np.array([abs(r["error"]) for r in done])
    print(f"inference rows predicted: {len(done)}, skipped: {len(skipped)}")
    print(
        f"MAPE output tokens/s: {ape.mean():.1%} (median {np.median(ape):.1%}, max {ape.max():.1%}, "
        f"bias {np.mean([r['error'] for r in done]):+.1%})"
    )
    groups: dict[str, dict[str, list[float]]] = {
        "tp": defaultdict(list),
        "model": defaultdict(list),
        "device": defaultdict(list),
        "context": defaultdict(list),
        "stack": defaultdict(list),
    }
    for r in done:
        groups["tp"][f"tp{r['tp']}"].append(abs(r["error"]))
        long = r["isl"] >= LONG_ISL
        groups["context"][f"isl>={LONG_ISL}" if long else f"isl<{LONG_ISL}"].append(abs(r["error"]))
        groups["model"][str(r["model"].name)].append(abs(r["error"]))
        groups["device"][r["device"].id].append(abs(r["error"]))
        groups["stack"][r["backend"]].append(abs(r["error"]))
    summary: dict[str, Any] = {"rows": len(done), "skipped": len(skipped), "mape": float(ape.mean())}
    for g, d in groups.items():
        parts = ", ".join(f"{k} {np.mean(v):.1%} (n={len(v)})" for k, v in sorted(d.items()))
        print(f"  by {g}: {parts}")
        summary[f"mape_by_{g}"] = {k: float(np.mean(v)) for k, v in d.items()}
    print(f"worst {min(worst, len(done))} rows:")
    for r in sorted(done, key=lambda r: -abs(r["error"]))[:worst]:
        print(
            f"  run {r['run_id']:>5} {r['label']:45s} measured {r['measured']:10.1f} predicted "
            f"{r['predicted']:10.1f} ({r['error']:+.1%}), batch {r['batch']:.0f}, TPOT {r['tpot_ms']:.1f} ms"
        )
    for r in skipped:
        print(f"  skipped run {r['run_id']}: {r.get('skipped')}")
    return summary


def records(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in recs:
        d: dict[str, Any] = {"run_id": r["run_id"]}
        if "error" in r:
            d.update(
                predicted_output_tokens_per_s=r["predicted"],
                measured_output_tokens_per_s=r["measured"],
                error=r["error"],
                batch=r["batch"],
                tpot_ms=r["tpot_ms"],
                ttft_ms=r["ttft_ms"],
                assumptions=r["assumptions"],
            )
        else:
            d["skipped"] = r.get("skipped", "not predicted")
            if "measured" in r:
                d["measured_output_tokens_per_s"] = r["measured"]
        out.append(d)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEV_CSV, help="default: the shipped studies/data copy")
    ap.add_argument("--json", type=Path, default=None, help="write one record per inference row")
    ap.add_argument("--calibration", default=None, help="calibration YAML (default: the shipped one)")
    ap.add_argument("--fit", action="store_true", help="refit the serving-specific coefficients first")
    ap.add_argument("--worst", type=int, default=8)
    ap.add_argument(
        "--lodo",
        action="store_true",
        help="also leave one device out, then one model out: refit the serving coefficients on the "
        "other rows and print in-sample and held-out MAPE per group",
    )
    ap.add_argument(
        "--write-expected-error",
        type=Path,
        default=None,
        help="write the serving expected-error table (held-out p90 |error|, widening factors, coverage) "
        "to this YAML (the shipped one is cost_models/calibration/serving_expected_error.yaml); implies --lodo",
    )
    a = ap.parse_args(argv)
    cal = study_calibration(a.csv, a.calibration, "a published-runs CSV")
    if cal is None:
        return 2
    recs = [prepare(r) for r in load_rows(a.csv)]
    sc = None
    if a.fit:
        sc = fit(recs, cal)
        print(
            f"fitted serving coefficients: host_step {sc.host_step_s * 1e6:.1f} us, host_per_seq "
            f"{sc.host_per_seq_s * 1e6:.2f} us, collective_sync {sc.collective_sync_s * 1e6:.1f} us "
            f"(runtime reserve fixed at {sc.runtime_reserve_bytes / 2**30:.2f} GiB)"
        )
    else:
        sc = ServingCoefficients.from_calibration(cal)
        print(
            f"serving coefficients: host_step {sc.host_step_s * 1e6:.1f} us, host_per_seq "
            f"{sc.host_per_seq_s * 1e6:.2f} us, collective_sync {sc.collective_sync_s * 1e6:.1f} us, "
            f"runtime reserve {sc.runtime_reserve_bytes / 2**30:.2f} GiB"
        )
    run(recs, cal, sc)
    summary = summarize(recs, a.worst)
    if (a.lodo or a.write_expected_error) and summary.get("rows"):
        held: dict[str, list[float]] = {}
        for key in ("device", "model"):
            print(f"leave one {key} out (serving coefficients refitted without its rows):")
            ho = held_out(recs, cal, key)
            held[key] = ho.pop("_errors")
            summary[f"leave_one_{key}_out"] = ho
        table = expected_error_table(recs, held, a.csv, measure_moe=bool(a.write_expected_error))
        if table is None:
            print("expected error: no held-out row (one device and one model): nothing to calibrate on")
        else:
            b = table["base"]
            print(
                f"expected error (held out, {b['rows']} rows): p90 |error| {b['p90_ape']:.1%}, "
                f"median {b['median_ape']:.1%}; coverage of the p90 band: "
                + ", ".join(f"{k} {v['coverage']:.0%} of {v['rows']}" for k, v in table["coverage"].items())
            )
            if a.write_expected_error:
                import yaml

                a.write_expected_error.write_text(yaml.safe_dump(table, sort_keys=False))
                print(f"wrote {a.write_expected_error}")
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "records": records(recs)}, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
