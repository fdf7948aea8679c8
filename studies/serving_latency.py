"""Measured-latency anchor of autopar's serving model: TTFT and TPOT against published runs.

    python studies/serving_latency.py [--csv studies/data/serving_latency_runs.csv] [--json OUT] [--no-rows]

Every row of ``serving_latency_runs.csv`` (columns and sources in its README) is one measured
closed-loop benchmark: a client keeps ``concurrency`` requests in flight against one serving instance
(genai-perf / AIPerf ``--concurrency N``: a new request is sent as soon as one finishes), each request
``isl`` prompt tokens and ``osl`` forced output tokens, on ``tp`` devices of one node. The study
predicts each row with the same path as ``autopar serve --tp T --concurrency N`` (and as
``studies/published_serving.py`` for its offline rows): :func:`autopar.serving.estimate.make_workload`
with the row's ``concurrency``, :func:`make_context` with the shipped calibration and serving
coefficients, :func:`evaluate_serving` on a one-row :class:`ServingTable` with ``conc`` = the row's
concurrency per instance. Mapping of the measured figures:

* measured TTFT (mean over requests, from the request being sent to the first streamed token, so
  it includes any wait in the runtime's queue) vs ``ttft_s``: in a closed loop (no request rate) this
  is the model's service TTFT (the prompt's chunks riding along with the other decodes, plus the
  admission wait of sequences the token budget cannot keep decoding); there is no open-loop queue.
* measured ITL (genai-perf/AIPerf: the mean gap between streamed tokens after the first) vs
  ``tpot_s`` (the mean iteration time of the steady state with ``concurrency`` sequences in flight).
* ``concurrency`` is a fixed number of requests in flight, which is what the model's ``conc`` column
  means; the runtime's own maximum batch (the engine's ``max_batch_size``, not stated by the sources)
  is left at the backend's default. A row whose concurrency the KV cache cannot hold is skipped
  with the reason (the runtime would queue the excess; the model does not model that queue).

Nothing is fitted to these rows: it is a held-out check of the shipped model, and the figures are
reported as printed. Errors are relative (predicted / measured - 1); MAPE is the mean |error|.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from published_serving import PRECISION, _int, _num, evaluate_row, instance, study_calibration

from autopar.serving.estimate import (
    REASONS,
    ServingCoefficients,
)

DATA = Path(__file__).resolve().parent / "data" / "serving_latency_runs.csv"
# concurrency buckets of the breakdown (requests in flight per instance); at concurrency 1 no
# other request shares the prompt's iterations, whatever the arrival pattern
BUCKETS = ((1, 1, "conc 1"), (2, 10, "conc 2-10"), (11, 50, "conc 11-50"), (51, 10**9, "conc >50"))


ORDER = {name: i for i, (_, _, name) in enumerate(BUCKETS)}  # buckets print in this order


def load_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def prepare(row: dict[str, str]) -> dict[str, Any]:
    """Everything a prediction needs, or ``skipped`` with the reason."""
    rec: dict[str, Any] = {"run_id": row.get("run_id"), "source": (row.get("source") or "").strip()}
    ttft, tpot = _num(row, "ttft_ms"), _num(row, "tpot_ms")
    isl, osl, conc = _int(row, "isl"), _int(row, "osl"), _int(row, "concurrency")
    if not (ttft and ttft > 0 and tpot and tpot > 0):
        return rec | {"skipped": "no measured ttft_ms and tpot_ms"}
    if not isl or not osl:
        return rec | {"skipped": "isl/osl not stated"}
    if not conc or conc < 1:
        return rec | {"skipped": "concurrency not stated"}
    prec = (row.get("precision") or "").strip().lower()
    if prec not in PRECISION:
        return rec | {"skipped": f"precision {prec!r} is not modeled for serving"}
    why = instance(row, rec, stack_default=None)
    if why:
        return rec | {"skipped": why}
    replicas = rec.pop("replicas")
    if conc % replicas:
        return rec | {"skipped": f"concurrency {conc} does not split evenly over {replicas} replicas"}
    return rec | {
        "isl": isl,
        "osl": osl,
        "conc": conc // replicas,
        "precision": PRECISION[prec],
        "ttft_meas_ms": ttft,
        "tpot_meas_ms": tpot,
        "label": f"{row.get('model_preset') or row.get('model')} {rec['device'].id} tp{rec['tp']} {prec} "
        f"{isl}/{osl} c{conc}",
    }


def predict(
    rec: dict[str, Any], cal, sc: ServingCoefficients | None = None, arrival: str = "lockstep"
) -> dict[str, Any]:
    """The model's TTFT and TPOT (ms) for one prepared row, or ``skipped`` with the reason."""
    res = evaluate_row(rec, cal, sc, concurrency=rec["conc"], arrival=arrival)
    if not res["valid"][0]:
        bad = [k for k, v in res["bad"].items() if v[0]]
        why = "; ".join(REASONS.get(k, k) for k in bad)
        extra = f" (max {res['max_conc'][0]:.0f} sequences)" if "kv_cache" in bad else ""
        return {"skipped": f"layout not valid in the model: {why}{extra}"}
    return {
        "ttft_pred_ms": float(res["ttft_s"][0]) * 1e3,
        "tpot_pred_ms": float(res["tpot_s"][0]) * 1e3,
        "max_conc": float(res["max_conc"][0]),
    }


def run(
    recs: list[dict[str, Any]], cal, sc: ServingCoefficients | None = None, arrival: str = "lockstep"
) -> None:
    """Predict every row with ``arrival`` (and, for comparison, the other arrival's TTFT)."""
    other = "staggered" if arrival == "lockstep" else "lockstep"
    for r in recs:
        if "skipped" in r:
            continue
        out = predict(r, cal, sc, arrival)
        r.update(out)
        if "skipped" not in out:
            r["ttft_err"] = r["ttft_pred_ms"] / r["ttft_meas_ms"] - 1.0
            r["tpot_err"] = r["tpot_pred_ms"] / r["tpot_meas_ms"] - 1.0
            r["ttft_other_err"] = predict(r, cal, sc, other)["ttft_pred_ms"] / r["ttft_meas_ms"] - 1.0


def bucket(conc: int) -> str:
    return next(name for lo, hi, name in BUCKETS if lo <= conc <= hi)


def _stats(v: list[float]) -> dict[str, float]:
    a = np.asarray(v)
    return {
        "mape": float(np.mean(np.abs(a))),
        "median_ape": float(np.median(np.abs(a))),
        "bias": float(np.mean(a)),
        "n": len(a),
    }


def summarize(recs: list[dict[str, Any]], show_rows: bool = True) -> dict[str, Any]:
    done = [r for r in recs if "ttft_err" in r]
    skipped = [r for r in recs if "ttft_err" not in r]
    if show_rows and done:
        print(
            f"{'run':>10} {'row':52s} {'TTFT meas':>10} {'pred':>9} {'err':>8} {'TPOT meas':>10} {'pred':>7} {'err':>8}"
        )
        for r in done:
            print(
                f"{r['run_id']:>10} {r['label']:52s} {r['ttft_meas_ms']:10.1f} {r['ttft_pred_ms']:9.1f} "
                f"{r['ttft_err']:+8.1%} {r['tpot_meas_ms']:10.2f} {r['tpot_pred_ms']:7.2f} {r['tpot_err']:+8.1%}"
            )
    print(f"latency rows predicted: {len(done)}, skipped: {len(skipped)}")
    if not done:
        for r in skipped:
            print(f"  skipped {r['run_id']}: {r.get('skipped')}")
        return {"rows": 0, "skipped": len(skipped)}
    summary: dict[str, Any] = {"rows": len(done), "skipped": len(skipped)}
    for metric in ("ttft", "tpot"):
        s = _stats([r[f"{metric}_err"] for r in done])
        summary[f"{metric}_mape"] = s["mape"]
        summary[f"{metric}_median_ape"] = s["median_ape"]
        summary[f"{metric}_bias"] = s["bias"]
        print(
            f"MAPE {metric.upper()}: {s['mape']:.1%} (median {s['median_ape']:.1%}, bias {s['bias']:+.1%}, n={s['n']})"
        )
    s = _stats([r["ttft_other_err"] for r in done])
    summary["ttft_other_arrival_mape"] = s["mape"]
    print(f"  TTFT with the other arrival assumption: MAPE {s['mape']:.1%} (bias {s['bias']:+.1%})")
    keys = {
        "device": lambda r: r["device"].id,
        "source": lambda r: r["source"],
        "model": lambda r: str(r["model"].name),
        "precision": lambda r: r["precision"],
        "concurrency": lambda r: bucket(r["conc"]),
    }
    for g, key in keys.items():
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in done:
            groups[key(r)].append(r)
        summary[f"by_{g}"] = {}
        for metric in ("ttft", "tpot"):
            parts = []
            for k, rows in sorted(groups.items(), key=lambda kv: (ORDER.get(kv[0], len(ORDER)), kv[0])):
                s = _stats([r[f"{metric}_err"] for r in rows])
                summary[f"by_{g}"].setdefault(k, {})[metric] = s
                parts.append(f"{k} {s['mape']:.1%} (bias {s['bias']:+.0%}, n={s['n']})")
            print(f"  {metric.upper()} by {g}: " + ", ".join(parts))
    reasons: dict[str, int] = defaultdict(int)
    for r in skipped:
        reasons[r.get("skipped", "not predicted")] += 1
        print(f"  skipped {r['run_id']} ({r.get('label', '')}): {r.get('skipped')}")
    summary["skipped_reasons"] = dict(reasons)
    return summary


def records(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in recs:
        d: dict[str, Any] = {"run_id": r["run_id"], "source": r["source"]}
        if "ttft_err" in r:
            d.update(
                {
                    k: r[k]
                    for k in (
                        "ttft_meas_ms",
                        "ttft_pred_ms",
                        "ttft_err",
                        "tpot_meas_ms",
                        "tpot_pred_ms",
                        "tpot_err",
                    )
                }
            )
        else:
            d["skipped"] = r.get("skipped", "not predicted")
        out.append(d)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DATA, help="default: the shipped studies/data copy")
    ap.add_argument("--json", type=Path, default=None, help="write the summary and one record per row")
    ap.add_argument("--calibration", default=None, help="calibration YAML (default: the shipped one)")
    ap.add_argument("--no-rows", action="store_true", help="print only the summary, not every row")
    ap.add_argument(
        "--arrival",
        choices=("lockstep", "staggered"),
        default="lockstep",
        help="how the benchmark's concurrent requests arrive in the model (default lockstep: the clients' "
        "waves; the summary also prints the other assumption's TTFT error)",
    )
    a = ap.parse_args(argv)
    cal = study_calibration(a.csv, a.calibration, "a serving-latency CSV")
    if cal is None:
        return 2
    recs = [prepare(r) for r in load_rows(a.csv)]
    print(f"arrival: {a.arrival} (ServingWorkload.arrival)")
    run(recs, cal, ServingCoefficients.from_calibration(cal), a.arrival)
    summary = summarize(recs, show_rows=not a.no_rows)
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "records": records(recs)}, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
