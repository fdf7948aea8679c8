"""Accuracy of autopar's training predictions on the published runs, with leave-one-source-out.

    python studies/accuracy.py [--csv A.csv --csv B.csv] [--json OUT] [--no-loso] [--max-nfev N]

By default both shipped CSVs (``studies/data/published_runs_dev.csv`` and ``..._dev2.csv``) are
read. For training rows it prints:

* coverage (rows predicted / rows with any target) and the tokens/s-per-device error (MAPE,
  median APE, bias = mean signed error) overall and per source, device, model family, precision and
  stack (``orig_framework`` normalized by ``published.stack_of``);
* ranking: within every group of layouts of one job (model, device, device count, sequence) with
  >= 3 predicted rows, Spearman's rho between predicted and measured tokens/s and whether the
  predicted best layout is the measured best (top-1);
* memory: predicted against measured allocated memory where a row has ``memory_gib_per_device``;
* leave-one-source-out (unless ``--no-loso``): for every source with >= 10 fit rows (predicted rows
  with a target), the calibration is refitted without it (``fit_published.fit_cases``) and the
  source's out-of-sample MAPE is printed next to its in-sample MAPE (a fit on every row) and its
  MAPE under the shipped calibration. The fits run in two processes.

All error figures use the shipped calibration (``cost_models/calibration/default.yaml``) unless
``--calibration`` names another. ``--json OUT`` writes every record and every table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from fit_published import BASE, fit_cases, holdout_mape, usable
from published import (
    DEV2_CSV,
    DEV_CSV,
    TRAINING_KINDS,
    Case,
    _num,
    identity,
    load_cases,
    records,
    run_case,
    stack_of,
)

from autopar.coefficients import load_calibration

TARGETS = ("tokens_per_s_per_device", "step_time_s", "hw_tflops_per_device", "model_tflops_per_device", "mfu")
GROUP_KEYS = ("source_id", "device", "model_family", "precision", "stack")
LOSO_MIN_ROWS = 10
RANK_MIN_ROWS = 3


def load_all(paths: list[Path]) -> list[Case]:
    cases = []
    for p in paths:
        for c in load_cases(p):
            c.row["_csv"] = p.name
            cases.append(c)
    return cases


def has_target(c: Case) -> bool:
    return any(_num(c.row, k) is not None for k in TARGETS)


def is_training(c: Case) -> bool:
    return (c.row.get("workload_kind") or "").strip() in TRAINING_KINDS


def predicted(c: Case) -> bool:
    return c.prediction is not None and bool(c.measured_tps) and c.target_kind in ("measured", "derived")


def signed_error(c: Case) -> float:
    return (c.prediction["predicted_tokens_per_s_per_device"] - c.measured_tps) / c.measured_tps  # type: ignore[index,operator]


def error_stats(cs: list[Case]) -> dict[str, float]:
    e = np.array([signed_error(c) for c in cs])
    if not len(e):
        return {"n": 0, "mape": float("nan"), "median_ape": float("nan"), "bias": float("nan")}
    return {
        "n": len(e),
        "mape": float(np.abs(e).mean()),
        "median_ape": float(np.median(np.abs(e))),
        "bias": float(e.mean()),
    }


def group_key(c: Case, key: str) -> str:
    if key == "stack":
        return stack_of(c.row)
    return (c.row.get(key) or "").strip() or "(blank)"


def error_table(training: list[Case], key: str) -> list[dict[str, Any]]:
    groups: dict[str, list[Case]] = defaultdict(list)
    for c in training:
        if has_target(c):
            groups[group_key(c, key)].append(c)
    out = []
    for k in sorted(groups):
        cs = groups[k]
        done = [c for c in cs if predicted(c)]
        out.append({key: k, "rows_with_target": len(cs), **error_stats(done)})
    return out


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (Spearman's convention)."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):
        m = x == v
        if m.sum() > 1:
            r[m] = r[m].mean()
    return r


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def ranking(training: list[Case]) -> list[dict[str, Any]]:
    groups: dict[tuple, list[Case]] = defaultdict(list)
    for c in training:
        if predicted(c):
            r = c.row
            groups[(r.get("model"), r.get("device"), r.get("num_devices"), r.get("seq_len"))].append(c)
    out = []
    for (model, device, n, seq), cs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len(cs) < RANK_MIN_ROWS:
            continue
        pred = np.array([c.prediction["predicted_tokens_per_s_per_device"] for c in cs])  # type: ignore[index]
        meas = np.array([c.measured_tps for c in cs], dtype=float)
        best_meas = meas.max()
        out.append(
            {
                "model": model,
                "device": device,
                "num_devices": n,
                "seq_len": seq,
                "source_id": cs[0].row.get("source_id"),
                "rows": len(cs),
                "spearman": spearman(pred, meas),
                # the predicted best layout is (one of) the measured best
                "top1": bool(meas[int(np.argmax(pred))] >= best_meas),
                "top1_regret": float(1 - meas[int(np.argmax(pred))] / best_meas),
            }
        )
    return out


def memory_table(training: list[Case]) -> dict[str, Any]:
    rows = []
    for c in training:
        m = _num(c.row, "memory_gib_per_device")
        if m is None or c.prediction is None or "predicted_memory_gib" not in c.prediction:
            continue
        p = c.prediction["predicted_memory_gib"]
        rows.append(
            {"run_id": c.run_id, **identity(c), "predicted_gib": p, "measured_gib": m, "error": (p - m) / m}
        )
    e = np.array([r["error"] for r in rows])
    with_mem = sum(1 for c in training if _num(c.row, "memory_gib_per_device") is not None)
    summary = {
        "rows_with_memory": with_mem,
        "n": len(rows),
        "mape": float(np.abs(e).mean()) if len(e) else float("nan"),
        "median_ape": float(np.median(np.abs(e))) if len(e) else float("nan"),
        "bias": float(e.mean()) if len(e) else float("nan"),
    }
    by_model: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_model[r["model"]].append(r["error"])
    summary["by_model"] = {
        k: {"n": len(v), "mape": float(np.abs(v).mean()), "bias": float(np.mean(v))}
        for k, v in sorted(by_model.items())
    }
    return {"summary": summary, "rows": rows}


# ---------------------------------------------------------------------------------------- LOSO
def _fit_rows(paths: list[str]) -> list[Case]:
    cases = load_all([Path(p) for p in paths])
    for c in cases:
        if is_training(c):
            run_case(c, BASE)
    return usable([c for c in cases if is_training(c)])


def _loso_worker(job: tuple[list[str], str | None, int]) -> dict[str, Any]:
    """One fit without ``holdout`` (None: on every row); the MAPE of every source under it."""
    paths, holdout, max_nfev = job
    rows = _fit_rows(paths)
    train = [c for c in rows if c.row.get("source_id") != holdout]
    t0 = time.perf_counter()
    res = fit_cases(train, max_nfev=max_nfev)
    by_src: dict[str, list[Case]] = defaultdict(list)
    for c in rows:
        by_src[c.row.get("source_id") or ""].append(c)
    return {
        "holdout": holdout,
        "train_rows": len(train),
        "train_mape": float(res.mape),
        "seconds": time.perf_counter() - t0,
        "source_mape": {s: holdout_mape(cs, res.calibration) for s, cs in by_src.items()},
    }


def loso(paths: list[Path], training: list[Case], max_nfev: int, workers: int) -> list[dict[str, Any]]:
    counts: dict[str, int] = defaultdict(int)
    for c in _fit_rows([str(p) for p in paths]):
        counts[c.row.get("source_id") or ""] += 1
    sources = sorted(s for s, k in counts.items() if k >= LOSO_MIN_ROWS)
    jobs = [([str(p) for p in paths], s, max_nfev) for s in [None, *sources]]
    with ProcessPoolExecutor(max_workers=workers) as ex:
        results = list(ex.map(_loso_worker, jobs))
    full = results[0]
    shipped = {}
    for s in sources:
        cs = [c for c in training if predicted(c) and c.row.get("source_id") == s]
        shipped[s] = error_stats(cs)["mape"]
    out = []
    for r in results[1:]:
        s = r["holdout"]
        out.append(
            {
                "source_id": s,
                "rows": counts[s],
                "in_sample_mape": full["source_mape"][s],
                "out_of_sample_mape": r["source_mape"][s],
                "shipped_calibration_mape": shipped[s],
                "fit_rows": r["train_rows"],
                "fit_train_mape": r["train_mape"],
                "fit_seconds": r["seconds"],
            }
        )
    out.append(
        {
            "source_id": "(all, in-sample fit)",
            "rows": full["train_rows"],
            "in_sample_mape": full["train_mape"],
            "fit_seconds": full["seconds"],
        }
    )
    return out


# ---------------------------------------------------------------------------------------- print
def _pct(x: float) -> str:
    return "     -" if x != x else f"{x:6.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--csv", type=Path, action="append", default=None, help="repeatable; default: both shipped CSVs"
    )
    ap.add_argument("--json", type=Path, default=None, help="write every record and table")
    ap.add_argument("--calibration", default=None, help="calibration YAML (default: the shipped one)")
    ap.add_argument("--no-loso", action="store_true", help="skip the leave-one-source-out refits (fast)")
    ap.add_argument("--max-nfev", type=int, default=60, help="function evaluations per LOSO fit")
    ap.add_argument("--workers", type=int, default=2, help="processes for the LOSO fits")
    a = ap.parse_args(argv)
    paths = a.csv or [DEV_CSV, DEV2_CSV]
    for p in paths:
        if not p.is_file():
            print(f"error: {p} does not exist (pass --csv PATH to a published-runs CSV)", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    cal = load_calibration(a.calibration)
    cases = load_all(paths)
    for c in cases:
        run_case(c, cal)
    training = [c for c in cases if is_training(c)]
    with_target = [c for c in training if has_target(c)]
    done = [c for c in with_target if predicted(c)]

    print(
        f"== accuracy: {', '.join(p.name for p in paths)} (calibration: {a.calibration or 'shipped default'}) =="
    )
    print("== coverage ==")
    print(
        f"  training rows {len(training)}, with a target {len(with_target)}, predicted {len(done)} "
        f"({len(done) / max(len(with_target), 1):.1%}); measured targets "
        f"{sum(c.target_kind == 'measured' for c in done)}, converted from TFLOP/s or MFU "
        f"{sum(c.target_kind == 'derived' for c in done)}"
    )
    overall = error_stats(done)
    print(
        f"  overall tokens/s per device: n={overall['n']}  MAPE {_pct(overall['mape'])}  "
        f"median {_pct(overall['median_ape'])}  bias {overall['bias']:+.1%}"
    )
    tables: dict[str, Any] = {"overall": overall}
    for key in GROUP_KEYS:
        t = error_table(training, key)
        tables[f"by_{key}"] = t
        print(f"== by {key} ==")
        print(f"  {'':<36} {'target':>6} {'pred':>5} {'cover':>6} {'MAPE':>6} {'median':>6} {'bias':>7}")
        for r in t:
            cover = r["n"] / r["rows_with_target"]
            bias = "      -" if r["n"] == 0 else f"{r['bias']:+7.1%}"
            print(
                f"  {r[key][:36]:<36} {r['rows_with_target']:>6} {r['n']:>5} {cover:6.0%} "
                f"{_pct(r['mape'])} {_pct(r['median_ape'])} {bias}"
            )
    rk = ranking(training)
    tables["ranking"] = rk
    print(
        f"== ranking within jobs (model, device, devices, sequence) with >= {RANK_MIN_ROWS} predicted layouts =="
    )
    for r in rk:
        print(
            f"  {str(r['model'])[:30]:<30} {r['device']:<14} n={r['num_devices']:>4} s={r['seq_len']:>6} "
            f"rows={r['rows']:>2}  spearman {r['spearman']:+.2f}  top1 {'yes' if r['top1'] else 'no '}"
            f"  regret {r['top1_regret']:.1%}"
        )
    if rk:
        rho = np.array([r["spearman"] for r in rk if r["spearman"] == r["spearman"]])
        hits = sum(r["top1"] for r in rk)
        print(
            f"  {len(rk)} groups: mean spearman {rho.mean():+.2f}, median {np.median(rho):+.2f}; "
            f"top-1 agreement {hits}/{len(rk)} ({hits / len(rk):.0%})"
        )
        tables["ranking_summary"] = {
            "groups": len(rk),
            "mean_spearman": float(rho.mean()),
            "median_spearman": float(np.median(rho)),
            "top1_hits": hits,
        }
    mem = memory_table(training)
    tables["memory"] = mem
    ms = mem["summary"]
    print("== allocated memory per device (rows with memory_gib_per_device) ==")
    print(
        f"  rows {ms['rows_with_memory']}, predicted {ms['n']}: MAPE {_pct(ms['mape'])}  "
        f"median {_pct(ms['median_ape'])}  bias {ms['bias']:+.1%}"
        if ms["n"]
        else f"  rows {ms['rows_with_memory']}, predicted 0"
    )
    for k, v in ms["by_model"].items():
        print(f"  {k[:50]:<50} n={v['n']:>3}  MAPE {_pct(v['mape'])}  bias {v['bias']:+.1%}")
    skipped = defaultdict(list)
    for c in with_target:
        if not predicted(c):
            skipped[c.skipped or "not predicted"].append(c.run_id)
    tables["skipped"] = {k: v for k, v in skipped.items()}
    print(f"== training rows with a target that are not predicted: {sum(map(len, skipped.values()))} ==")
    for reason, ids in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(ids):>3} x {reason[:150]}: runs {', '.join(ids[:8])}{' ...' if len(ids) > 8 else ''}")
    if not a.no_loso:
        t1 = time.perf_counter()
        lo = loso(paths, training, a.max_nfev, a.workers)
        tables["loso"] = lo
        print(
            f"== leave-one-source-out (sources with >= {LOSO_MIN_ROWS} fit rows; max_nfev={a.max_nfev}; "
            f"{time.perf_counter() - t1:.0f} s) =="
        )
        print(f"  {'source':<36} {'rows':>5} {'in-sample':>9} {'held out':>9} {'shipped':>8}")
        for r in lo:
            if "out_of_sample_mape" in r:
                print(
                    f"  {r['source_id']:<36} {r['rows']:>5} {r['in_sample_mape']:9.1%} "
                    f"{r['out_of_sample_mape']:9.1%} {r['shipped_calibration_mape']:8.1%}"
                )
            else:
                print(f"  {r['source_id']:<36} {r['rows']:>5} {r['in_sample_mape']:9.1%}")
    print(f"(done in {time.perf_counter() - t0:.0f} s)")
    if a.json:
        recs = records(cases)
        for r, c in zip(recs, cases, strict=True):
            r["csv"] = c.row.get("_csv")
        a.json.write_text(json.dumps({"records": recs, "tables": tables}, indent=1, default=str))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
