"""Accuracy of autopar's training predictions on the published runs, with leave-one-source-out.

    python studies/accuracy.py [--csv A.csv --csv B.csv] [--json OUT] [--no-loso] [--max-nfev N]
        [--workers N] [--write-expected-error PATH]

By default both shipped CSVs (``studies/data/published_runs_dev.csv`` and ``..._dev2.csv``) are
read. For training rows it prints:

* coverage (rows predicted / rows with any target) and the tokens/s-per-device error (MAPE,
  median APE, bias = mean signed error) overall and per source, device, model family, precision and
  stack (``orig_framework`` normalized by ``published.stack_of``);
* ranking: within every group of layouts of one job (model, device, device count, sequence) with
  >= 3 predicted rows, Spearman's rho between predicted and measured tokens/s and whether the
  predicted best layout is the measured best (top-1);
* memory: predicted against measured allocated memory where a row has ``memory_gib_per_device``;
* leave-one-source-out (unless ``--no-loso``): the calibration is fitted on every fit row
  (predicted training rows with a target, run with ``fit_published.BASE``) and refitted once
  without each source with >= 10 fit rows (``fit_published.fit_cases``, in ``--workers``
  processes); per held-out source it prints the rows, the in-sample MAPE and bias (the fit on every
  row), the out-of-sample MAPE and bias (the fit without the source), the verdict against the 15%
  line, the fit's seconds and whether it converged; then the p90 of |out-of-sample error| per
  device, per stack and overall, which ``--write-expected-error PATH`` writes as the table that
  predictions quote (the shipped one: ``cost_models/calibration/expected_error.yaml``).

All error figures use the shipped calibration (``cost_models/calibration/default.yaml``) unless
``--calibration`` names another. ``--json OUT`` writes every record and every table. ``--plot
OUT.svg`` draws predicted against measured tokens/s per device (in-sample: the shipped calibration
was fitted on these rows) and, with the refits, ``OUT.out_of_sample.svg`` (each row under the fit
that left its source out).
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
import yaml
from fit_published import BASE, fit_cases, samples, usable
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

from autopar.calibration.fit import DEFAULT_MAX_NFEV, file_digest, now_iso, residuals
from autopar.coefficients import load_calibration

TARGETS = ("tokens_per_s_per_device", "step_time_s", "hw_tflops_per_device", "model_tflops_per_device", "mfu")
GROUP_KEYS = ("source_id", "device", "model_family", "precision", "stack")
LOSO_MIN_ROWS = 10
LOSO_LINE = 0.15  # the acceptance line of the out-of-sample MAPE per held-out source
EXPECTED_ERROR_MIN_ROWS = 10  # a group quotes its own p90 only with at least this many held-out rows
SHIPPED_TABLE = "cost_models/calibration/expected_error.yaml"
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
def source_of(c: Case) -> str:
    return c.row.get("source_id") or ""


def _fit_rows(paths: list[str]) -> list[Case]:
    """The fit rows of the CSVs (predicted training rows with a target), run with BASE."""
    cases = load_all([Path(p) for p in paths])
    for c in cases:
        if is_training(c):
            run_case(c, BASE)
    return usable([c for c in cases if is_training(c)])


def loso_sources(rows: list[Case], min_rows: int = LOSO_MIN_ROWS) -> list[str]:
    counts: dict[str, int] = defaultdict(int)
    for c in rows:
        counts[source_of(c)] += 1
    return sorted(s for s, k in counts.items() if k >= min_rows)


def refit(rows: list[Case], holdout: str | None, max_nfev: int) -> dict[str, Any]:
    """One fit without the rows of ``holdout`` (None: on every row) and the signed relative error
    of tokens/s of every row under it (``errors[i]`` for ``rows[i]``: out-of-sample for the
    held-out source's rows, in-sample for the others)."""
    train = [c for c in rows if source_of(c) != holdout]
    t0 = time.perf_counter()
    res = fit_cases(train, max_nfev=max_nfev)
    seconds = time.perf_counter() - t0
    errors = np.expm1(residuals(samples(rows), res.calibration))
    return {
        "holdout": holdout,
        "train_rows": len(train),
        "train_mape": float(res.mape),
        "converged": res.converged,
        "convergence": res.convergence(),
        "seconds": seconds,
        "errors": errors.tolist(),
    }


def _refit_worker(job: tuple[list[str], str | None, int]) -> dict[str, Any]:
    paths, holdout, max_nfev = job
    return refit(_fit_rows(paths), holdout, max_nfev)


def loso_refits(
    rows: list[Case],
    sources: list[str],
    max_nfev: int,
    workers: int = 1,
    paths: list[Path] | None = None,
) -> list[dict[str, Any]]:
    """The fit on every row, then one per held-out source (in that order).

    With ``workers`` > 1 the fits run in a process pool; each worker reloads ``paths`` (the CSVs
    ``rows`` came from, in the same order) rather than unpickling the cases.
    """
    holdouts: list[str | None] = [None, *sources]
    if workers <= 1 or paths is None:
        return [refit(rows, h, max_nfev) for h in holdouts]
    jobs = [([str(p) for p in paths], h, max_nfev) for h in holdouts]
    with ProcessPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(_refit_worker, jobs))


def _stats(e: np.ndarray) -> tuple[float, float]:
    return float(np.abs(e).mean()), float(e.mean())


def loso_table(rows: list[Case], fits: list[dict[str, Any]], line: float = LOSO_LINE) -> list[dict[str, Any]]:
    """Per held-out source: rows, in-sample (the fit on every row) and out-of-sample (the fit
    without the source) MAPE and bias, and the verdict against ``line``."""
    full, out = fits[0], []
    src = np.array([source_of(c) for c in rows])
    for r in fits[1:]:
        m = src == r["holdout"]
        ins, ins_bias = _stats(np.asarray(full["errors"])[m])
        oos, oos_bias = _stats(np.asarray(r["errors"])[m])
        out.append(
            {
                "source_id": r["holdout"],
                "rows": int(m.sum()),
                "in_sample_mape": ins,
                "in_sample_bias": ins_bias,
                "out_of_sample_mape": oos,
                "out_of_sample_bias": oos_bias,
                "passes": oos <= line,
                "fit_rows": r["train_rows"],
                "fit_train_mape": r["train_mape"],
                "fit_seconds": r["seconds"],
                "fit_converged": r["converged"],
                "fit_convergence": r["convergence"],
            }
        )
    return out


def out_of_sample_errors(rows: list[Case], fits: list[dict[str, Any]]) -> list[tuple[Case, float]]:
    """Every held-out row with its error under the fit that left its source out."""
    out = []
    for r in fits[1:]:
        out += [(c, e) for c, e in zip(rows, r["errors"], strict=True) if source_of(c) == r["holdout"]]
    return out


def _group(errs: list[float]) -> dict[str, Any]:
    a = np.abs(np.asarray(errs))
    return {
        "rows": len(a),
        "p90_ape": round(float(np.percentile(a, 90)), 4),
        "median_ape": round(float(np.median(a)), 4),
        "bias": round(float(np.mean(errs)), 4),
    }


def expected_error_groups(
    held: list[tuple[Case, float]], min_rows: int = EXPECTED_ERROR_MIN_ROWS
) -> dict[str, Any]:
    """The out-of-sample |error| percentiles by the keys a prediction knows: its device, its
    training stack (the job's framework), and all held-out rows; groups with fewer than
    ``min_rows`` rows are left out (a lookup falls through to the next, wider group)."""
    by: dict[str, dict[str, list[float]]] = {"device": defaultdict(list), "stack": defaultdict(list)}
    for c, e in held:
        by["device"][c.job.device.id].append(e)  # type: ignore[union-attr]
        by["stack"][c.job.framework.name].append(e)  # type: ignore[union-attr]
    out: dict[str, Any] = {
        kind: {k: _group(v) for k, v in sorted(g.items()) if len(v) >= min_rows} for kind, g in by.items()
    }
    out["all"] = _group([e for _, e in held]) if held else None
    return out


def write_expected_error(
    path: Path, held: list[tuple[Case, float]], provenance: dict[str, Any], min_rows: int
) -> dict[str, Any]:
    """Write the out-of-sample table that ``autopar.coefficients.expected_error`` reads."""
    data = {
        "schema": "autopar.expected_error/v1",
        "provenance": {**provenance, "min_group_rows": min_rows},
        "groups": expected_error_groups(held, min_rows),
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(path)
    return data


def base_fingerprint(rows: list[Case], sources: list[str]) -> float:
    """MAPE of the held-out sources' rows under BASE (the uncalibrated device profiles every refit
    starts from): it moves with any change of the model, the device profiles or the data, so
    ``tests/test_fit.py`` can tell when the shipped table is stale."""
    return round(error_stats([c for c in rows if source_of(c) in sources])["mape"], 6)


def expected_error_provenance(
    paths: list[Path], rows: list[Case], fits: list[dict[str, Any]], max_nfev: int
) -> dict[str, Any]:
    sources = [str(f["holdout"]) for f in fits[1:]]
    return {
        "method": "p90 of |out-of-sample relative error| of tokens/s per device: each held-out row "
        "predicted under fit_published.fit_cases refitted without its source (BASE calibration)",
        "command": f"python studies/accuracy.py --write-expected-error {SHIPPED_TABLE}",
        "data": {p.name: file_digest(p) for p in paths},
        "fit_rows": len(rows),
        "held_out_sources": {s: int(sum(source_of(c) == s for c in rows)) for s in sources},
        "loso_min_rows": LOSO_MIN_ROWS,
        "max_nfev": max_nfev,
        "fits_converged": f"{sum(f['converged'] for f in fits[1:])}/{len(fits) - 1}",
        "base_mape_on_held_out_rows": base_fingerprint(rows, sources),
        "date": now_iso(),
    }


def print_loso(
    table: list[dict[str, Any]], fits: list[dict[str, Any]], seconds: float, max_nfev: int
) -> None:
    full = fits[0]
    print(
        f"== leave-one-source-out (sources with >= {LOSO_MIN_ROWS} fit rows; max_nfev={max_nfev}; "
        f"{seconds:.0f} s) =="
    )
    print(
        f"  fit on all {full['train_rows']} rows: train MAPE {full['train_mape']:.1%}, "
        f"{full['seconds']:.0f} s, {full['convergence']}"
    )
    print(
        f"  {'held-out source':<36} {'rows':>5} {'in-sample':>9} {'bias':>7} {'held out':>9} {'bias':>7} "
        f"{'verdict':>12} {'shipped':>8} {'fit s':>6}  fit"
    )
    for r in table:
        verdict = f"<= {LOSO_LINE:.0%} ok" if r["passes"] else f"> {LOSO_LINE:.0%} FAIL"
        print(
            f"  {r['source_id'][:36]:<36} {r['rows']:>5} {r['in_sample_mape']:9.1%} {r['in_sample_bias']:+7.1%} "
            f"{r['out_of_sample_mape']:9.1%} {r['out_of_sample_bias']:+7.1%} {verdict:>12} "
            f"{_pct(r.get('shipped_calibration_mape', float('nan'))):>8} "
            f"{r['fit_seconds']:6.0f}  {'converged' if r['fit_converged'] else 'max_nfev'}"
        )
    ok = sum(r["passes"] for r in table)
    print(
        f"  {ok}/{len(table)} held-out sources within {LOSO_LINE:.0%} out of sample "
        "(shipped: the source's MAPE under the shipped calibration, fitted on dev only)"
    )


# ---------------------------------------------------------------------------------------- print
def _pct(x: float) -> str:
    return "     -" if x != x else f"{x:6.1%}"


def _plot(measured: list[Any], predicted_: list[Any], groups: list[str], title: str, path: Path) -> None:
    from autopar import plots

    svg = plots.parity(
        [float(x) for x in measured],
        [float(x) for x in predicted_],
        groups=groups,
        unit="tokens/s per device",
        title=title,
        band=LOSO_LINE,
    )
    plots.write_svg(svg, path, "accuracy plot", "--plot")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--csv", type=Path, action="append", default=None, help="repeatable; default: both shipped CSVs"
    )
    ap.add_argument("--json", type=Path, default=None, help="write every record and table")
    ap.add_argument("--calibration", default=None, help="calibration YAML (default: the shipped one)")
    ap.add_argument("--no-loso", action="store_true", help="skip the leave-one-source-out refits (fast)")
    ap.add_argument(
        "--max-nfev", type=int, default=DEFAULT_MAX_NFEV, help="residual evaluations per LOSO fit"
    )
    ap.add_argument("--workers", type=int, default=2, help="processes for the LOSO fits")
    ap.add_argument(
        "--write-expected-error",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the out-of-sample expected-error table (shipped: " + str(SHIPPED_TABLE) + ")",
    )
    ap.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="OUT.svg",
        help="write predicted vs measured tokens/s (and OUT.out_of_sample.svg with the refits)",
    )
    a = ap.parse_args(argv)
    if a.plot is not None:
        from autopar.files import check_output

        check_output(a.plot, "accuracy plot", "--plot")
    if a.write_expected_error and a.no_loso:
        print(
            "error: --write-expected-error needs the leave-one-source-out refits (drop --no-loso)",
            file=sys.stderr,
        )
        return 2
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
    if a.plot is not None:
        _plot(
            [c.measured_tps for c in done],
            [c.prediction["predicted_tokens_per_s_per_device"] for c in done],  # type: ignore[index]
            [group_key(c, "device") for c in done],
            f"in-sample: the shipped calibration on its own fit rows (n={len(done)}, MAPE {overall['mape']:.1%})",
            a.plot,
        )
    print(f"== training rows with a target that are not predicted: {sum(map(len, skipped.values()))} ==")
    for reason, ids in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(ids):>3} x {reason[:150]}: runs {', '.join(ids[:8])}{' ...' if len(ids) > 8 else ''}")
    if not a.no_loso:
        t1 = time.perf_counter()
        rows = _fit_rows([str(p) for p in paths])
        sources = loso_sources(rows)
        fits = loso_refits(rows, sources, a.max_nfev, a.workers, paths)
        table = loso_table(rows, fits)
        for r in table:
            cs = [c for c in training if predicted(c) and source_of(c) == r["source_id"]]
            r["shipped_calibration_mape"] = error_stats(cs)["mape"]
        tables["loso"] = {
            "sources": table,
            "fits": [{k: v for k, v in f.items() if k != "errors"} for f in fits],
        }
        print_loso(table, fits, time.perf_counter() - t1, a.max_nfev)
        held = out_of_sample_errors(rows, fits)
        if a.plot is not None:
            oos = float(np.mean([abs(e) for _, e in held])) if held else float("nan")
            _plot(
                [c.measured_tps for c, _ in held],
                [c.measured_tps * (1.0 + e) for c, e in held],  # type: ignore[operator]
                [group_key(c, "device") for c, _ in held],
                f"out-of-sample: each source under the fit without it (n={len(held)}, MAPE {oos:.1%})",
                a.plot.with_name(a.plot.stem + ".out_of_sample.svg"),
            )
        groups = expected_error_groups(held)
        tables["expected_error"] = groups
        print(
            f"== expected error: p90 of |out-of-sample error| of the {len(held)} held-out rows "
            f"(groups with >= {EXPECTED_ERROR_MIN_ROWS} rows) =="
        )
        for kind in ("device", "stack"):
            for k, g in groups[kind].items():
                print(
                    f"  {kind} {k:<30} rows {g['rows']:>4}  p90 {g['p90_ape']:6.1%}  median {g['median_ape']:6.1%}"
                )
        if groups["all"]:
            g = groups["all"]
            print(
                f"  all {'':<33} rows {g['rows']:>4}  p90 {g['p90_ape']:6.1%}  median {g['median_ape']:6.1%}"
            )
        if a.write_expected_error:
            prov = expected_error_provenance(paths, rows, fits, a.max_nfev)
            write_expected_error(a.write_expected_error, held, prov, EXPECTED_ERROR_MIN_ROWS)
            print(f"wrote {a.write_expected_error}")
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
