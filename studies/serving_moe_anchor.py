"""A measured anchor for MoE + MLA serving: DeepSeek-V3 with wide expert parallelism.

    python studies/serving_moe_anchor.py [--csv studies/data/serving_moe_anchor_runs.csv] [--json OUT]

Every row of the CSV is one phase of a prefill-decode disaggregated deployment measured and published
by its authors (SGLang's large-scale EP posts: 32/72 H100 and GB200 NVL72), with the instance that ran
it (GPUs, expert parallelism over all of them with data-parallel attention), the batch (prefill tokens
per device, or decode sequences per device and their KV length), the precisions, the token dispatcher
and the overlap it ran. Each row is predicted on autopar's own serving path
(:func:`autopar.serving.estimate.iteration`, one iteration of that batch on that instance: the phase
alone, as the source measured it with the other phase unlimited) and compared with the measured
tokens/s per GPU. Nothing is fitted to these rows.

Printed: each row's prediction, the ratio predicted / measured and its time breakdown (GPU compute,
communication, host), then the MAPE by phase and by device.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from autopar.coefficients import load_calibration
from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.accuracy import expected_error
from autopar.serving.estimate import ServingTable, iteration, make_context, make_workload

HERE = Path(__file__).resolve().parent
DEFAULT_CSV = HERE / "data" / "serving_moe_anchor_runs.csv"
PHASES = ("prefill", "decode")


def load_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise AutoparError(f"cannot read {path}: {exc.strerror}", "pass an existing CSV with --csv") from None


def _int(row: dict[str, str], key: str) -> int:
    text = (row.get(key) or "").strip()
    if not text:
        raise AutoparError(f"row {row.get('run_id')}: {key} is blank", "fill it in the CSV")
    return int(float(text))


def workload_of(row: dict[str, str]):
    """The serving workload of a row: its prompt length, precisions, backend and EP runtime."""
    return make_workload(
        isl=_int(row, "isl"),
        osl=1 if row["phase"] == "prefill" else 100,
        offline=True,
        weight_precision=row["weight_precision"],
        kv_precision=row["kv_precision"] or None,
        backend=row["stack"],
        ep_dispatch=row.get("dispatch") or "default",
        ep_overlap=(row.get("overlap") or "none") == "tbo",
    )


def predict(row: dict[str, str], cal=None) -> dict[str, Any]:
    """Predicted tokens/s per GPU of the row's phase and the iteration's time parts."""
    phase = row["phase"]
    if phase not in PHASES:
        raise AutoparError(f"row {row.get('run_id')}: phase {phase!r}", f"use one of {', '.join(PHASES)}")
    model = load_model(row["model_preset"])
    dev = load_device(row["device"])
    n = _int(row, "instance_gpus")
    dpn = min(dev.scale_up.domain, n)  # published_serving.instance's rule
    ctx = make_context(model, dev, workload_of(row), devices_per_node=dpn, calibration=cal)
    tab = ServingTable({"tp": n, "ep": n, "adp": n})
    if phase == "prefill":
        isl = _int(row, "isl")
        n_pre = _int(row, "tokens_per_device") * n
        it = iteration(
            ctx, tab, n_dec=0, n_pre=n_pre, dec_ctx=0, pre_ctx=isl / 2.0, pre_len=isl, logit_rows=n_pre / isl
        )
        tokens = n_pre
    else:
        n_dec = _int(row, "batch_per_device") * n
        it = iteration(
            ctx,
            tab,
            n_dec=n_dec,
            n_pre=0,
            dec_ctx=_int(row, "kv_len"),
            pre_ctx=0,
            pre_len=1,
            logit_rows=n_dec,
        )
        tokens = n_dec
    t = float(it["t_iter"][0])
    parts = {k: float(it[k][0]) for k in ("compute", "comm", "host")}
    pred = tokens / t / n
    meas = float(row["measured_tokens_per_s_per_gpu"])
    band = expected_error(dev.id, cal if cal is not None else load_calibration(), model, row["stack"])
    p90 = band["p90"] if band else None
    return {
        "run_id": row["run_id"],
        "device": row["device"],
        "phase": phase,
        "instance_gpus": n,
        "predicted_tokens_per_s_per_gpu": pred,
        "measured_tokens_per_s_per_gpu": meas,
        "ratio": pred / meas,
        "expected_error_p90": p90,
        "within_band": None if p90 is None else abs(pred / meas - 1.0) <= p90,
        "iteration_s": t,
        **{f"{k}_s": v for k, v in parts.items()},
    }


def mape(recs: list[dict[str, Any]]) -> float:
    return float(np.mean([abs(r["ratio"] - 1.0) for r in recs])) if recs else float("nan")


def summarize(recs: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {"all": recs}
    for r in recs:
        groups.setdefault(f"phase {r['phase']}", []).append(r)
        groups.setdefault(f"device {r['device']}", []).append(r)
    out: dict[str, Any] = {k: {"rows": len(v), "mape": mape(v)} for k, v in groups.items()}
    banded = [r for r in recs if r["within_band"] is not None]
    out["band"] = {
        "rows": len(banded),
        "covered": sum(bool(r["within_band"]) for r in banded),
        "median_p90": float(np.median([r["expected_error_p90"] for r in banded])) if banded else None,
    }
    return out


def needed_widening(table: dict[str, Any], cal, device_id: str, model, backend: str, error: float) -> float:
    """The ``model_class`` factor a MoE prediction with relative ``error`` needs: its |error| over the
    table's base p90 times the prediction's other widenings (device, datasheet, a stack no run measured)."""
    from autopar.serving.accuracy import backend_widening, extrapolations, stacks

    widening = table.get("widening") or {}
    kinds = [k for k in extrapolations(device_id, cal, model, table) if k != "model_class"]
    other = float(np.prod([float((widening.get(k) or {}).get("factor", 1.0)) for k in kinds]))
    if backend not in stacks(table):
        other *= float(backend_widening(table, backend)["factor"])
    return abs(error) / (float(table["base"]["p90_ape"]) * other)


def model_class_widening(
    table: dict[str, Any], cal=None, path: Path = DEFAULT_CSV, extra: list[float] | None = None
) -> dict[str, Any] | None:
    """The serving expected-error table's ``model_class`` widening measured on these rows.

    Each row is a MoE + MLA prediction outside the table's domain in other ways too (a stack, a
    device); the factor a row needs is its |error| over the table's base p90 times its other
    widenings, and the table takes the p90 of those over the rows (at least 1). ``table``: the serving
    expected-error table being written (its ``base``, ``domain`` and other ``widening`` entries).
    None where the rows cannot be read."""
    try:
        rows = load_rows(path)
    except AutoparError:
        return None
    cal = cal if cal is not None else load_calibration()
    needs = [
        needed_widening(
            table,
            cal,
            row["device"],
            load_model(row["model_preset"]),
            row["stack"],
            predict(row, cal)["ratio"] - 1.0,
        )
        for row in rows
    ]
    anchor = len(needs)
    needs += list(extra or [])
    if not needs:
        return None
    f = max(1.0, float(np.quantile(needs, 0.9)))
    more = (
        f" and {len(needs) - anchor} MoE max-throughput runs (TensorRT-LLM 1.0 perf overview)"
        if len(needs) > anchor
        else ""
    )
    return {
        "factor": round(f, 3),
        "from": f"p90 over {anchor} measured MoE + MLA serving phases (DeepSeek-V3 wide EP, {path.name}){more}, "
        "none fitted, of the factor each needs beyond the base and its other widenings "
        "(studies/serving_moe_anchor.py, studies/published_serving.py)",
        "text": f"MoE/MLA serving, measured on {len(needs)} runs none fitted (their p90 needs x{f:.2f})",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--json", type=Path, help="write every record and the summary")
    args = ap.parse_args(argv)
    try:
        rows = load_rows(args.csv)
        cal = load_calibration()
        recs = [predict(r, cal) for r in rows]
    except AutoparError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(recs)} measured phases of wide-EP DeepSeek-V3 serving ({args.csv.name}); nothing fitted")
    print(
        f"{'run':24} {'gpus':>4} {'phase':8} {'pred/GPU':>9} {'meas/GPU':>9} {'ratio':>6}  iteration: compute comm host (s)"
    )
    for r in recs:
        print(
            f"{r['run_id']:24} {r['instance_gpus']:>4} {r['phase']:8} {r['predicted_tokens_per_s_per_gpu']:9.0f} "
            f"{r['measured_tokens_per_s_per_gpu']:9.0f} {r['ratio']:6.2f}  "
            f"{r['iteration_s']:.3f}: {r['compute_s']:.3f} {r['comm_s']:.3f} {r['host_s']:.3f}"
        )
    summ = summarize(recs)
    for k, v in summ.items():
        if k != "band":
            print(f"  MAPE {k}: {100 * v['mape']:.1f}% ({v['rows']} rows)")
    b = summ["band"]
    if b["rows"]:
        print(
            f"  the expected error autopar states for these predictions (p90, median {100 * b['median_p90']:.0f}%) "
            f"covers {b['covered']} of {b['rows']} rows"
        )
    if args.json:
        args.json.write_text(json.dumps({"records": recs, "summary": summ}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
