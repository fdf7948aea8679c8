"""Accuracy of autopar's training predictions on the published runs, with held-out refits.

    python studies/accuracy.py [--csv A.csv --csv B.csv] [--json OUT] [--no-loso] [--lodo] [--cold]
        [--max-nfev N] [--workers N] [--write-expected-error PATH]

By default the three shipped CSVs (``studies/data/published_runs_dev.csv``, ``..._dev2.csv`` and
``..._dev3.csv``) are read. For training rows it prints:

* coverage (rows predicted / rows with any target) and the tokens/s-per-device error (MAPE,
  median APE, bias = mean signed error) overall and per source, device, model family, precision and
  stack (``orig_framework`` normalized by ``published.stack_of``);
* ranking: within every group of layouts of one job (model, device, device count, sequence) with
  >= 3 predicted rows, Spearman's rho between predicted and measured tokens/s and whether the
  predicted best layout is the measured best (top-1);
* memory: predicted against measured allocated memory where a row has ``memory_gib_per_device``;
* held-out refits (unless ``--no-loso``): the calibration is fitted on every fit row (predicted
  training rows with a target, run with ``fit_published.BASE``), then refitted without each source
  with >= 10 fit rows (leave-one-source-out) and, with ``--lodo``, without each device with >= 10
  fit rows (leave-one-device-out; unfitted devices take ``coefficients.Transfer``'s rules) and
  without every device of one die together (``same_silicon`` and the fit's ``dies``: holding out the A100 40GB alone
  leaves its 80GB twin, whose rates it takes, in the fit). Each refit starts from the fit on every
  row (``--cold``: from the profiles) and the refits run in ``--workers`` processes. Per fold it
  prints the rows, the in-sample MAPE and bias (the fit on every row), the held-out MAPE and bias,
  the verdict against the 15% line, the fit's seconds and whether it converged;
* expected error: every held-out row is classed by how its prediction extrapolates from the rows
  its fit saw (``coefficients.extrapolations``: device, precision on the device, stack, model
  class on the stack, device count beyond the stack's largest); the base p90 of |error| per stack
  comes from the rows that extrapolate in no way, one widening factor per kind from the others,
  and the band's coverage of the held-out rows and its median width are printed per mode (and
  across modes: calibrated on one, judged on the other). ``--write-expected-error PATH`` (needs
  ``--lodo``) writes that table, which predictions quote (the shipped one:
  ``cost_models/calibration/expected_error.yaml``).

All error figures use the shipped calibration (``cost_models/calibration/default.yaml``) unless
``--calibration`` names another. ``--json OUT`` writes every record (with the
``expected_error_p90`` it quotes) and every table. ``--plot OUT.svg`` draws predicted against
measured tokens/s per device (in-sample: the shipped calibration was fitted on these rows) and, with
the refits, ``OUT.out_of_sample.svg`` (each row under the fit that left its source out).
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
from fit_published import BASE, samples, usable
from published import (
    DEV2_CSV,
    DEV3_CSV,
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
from published_runs import with_expected_error

from autopar.calibration.fit import DEFAULT_MAX_NFEV, file_digest, fit, now_iso, residuals
from autopar.coefficients import (
    EXPECTED_ERROR_SCHEMA,
    EXTRAPOLATIONS,
    Calibration,
    base_entry,
    extrapolations,
    load_calibration,
    lookup_expected_error,
    model_class,
    stack_class_key,
)

TARGETS = ("tokens_per_s_per_device", "step_time_s", "hw_tflops_per_device", "model_tflops_per_device", "mfu")
GROUP_KEYS = ("source_id", "device", "model_family", "precision", "stack")
LOSO_MIN_ROWS = 10
LOSO_LINE = 0.15  # the acceptance line of the out-of-sample MAPE per held-out source
EXPECTED_ERROR_MIN_ROWS = 10  # a group quotes its own p90 only with at least this many held-out rows
SHIPPED_TABLE = "cost_models/calibration/expected_error.yaml"
COVERAGE_LINE = 0.85  # acceptance: the p90 band covers at least this share of the held-out rows
BAND_LINE = 0.30  # acceptance: the median band is at most this wide
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


def repeatability(training: list[Case]) -> dict[str, Any]:
    """How far apart identical runs are: rows that repeat a job exactly (same model as the source names
    it, device, device count, sequence, global batch and layout) in another stack release (the
    Megatron-Bridge archive re-measures its recipes in every NeMo container). Per model family: each
    row's distance from its group's geometric mean (a floor no prediction blind to the release can
    beat by much) beside the model's error on the same rows."""
    groups: dict[tuple, list[Case]] = defaultdict(list)
    for c in training:
        if predicted(c):
            r = c.row
            key = (
                r.get("model"),
                r.get("device"),
                r.get("num_devices"),
                r.get("seq_len"),
                r.get("global_batch"),
            )
            groups[(*key, c.prediction["layout"])].append(c)  # type: ignore[index]
    out: dict[str, Any] = {}
    fams: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for cs in groups.values():
        if len(cs) < 2 or len({c.row.get("orig_framework", "") for c in cs}) < 2:
            continue
        meas = np.array([c.measured_tps for c in cs], dtype=float)
        gm = float(np.exp(np.log(meas).mean()))
        for c, m in zip(cs, meas, strict=True):
            p = c.prediction["predicted_tokens_per_s_per_device"]  # type: ignore[index]
            fams[group_key(c, "model_family")].append(
                (abs(m / gm - 1.0), abs(p / m - 1.0), meas.max() / meas.min())
            )
    for fam, v in sorted(fams.items()):
        a = np.array(v)
        out[fam] = {
            "rows": len(v),
            "spread_mape": float(a[:, 0].mean()),
            "model_mape": float(a[:, 1].mean()),
            "max_ratio": float(a[:, 2].max()),
        }
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


# ------------------------------------------------------------------- held-out refits: LOSO, LODO
# A fold is (mode, key): ("source", source_id) leaves one source out, ("device", device_id) one
# device, ("die", (device_id, ...)) every device of one compute die (coefficients.Transfer's
# same_silicon: holding out A100 40GB alone leaves its 80GB twin, whose rates it takes, in the fit).
Fold = tuple[str, Any]
MODES = {"source": "leave-one-source-out", "device": "leave-one-device-out", "die": "die held out"}


def source_of(c: Case) -> str:
    return c.row.get("source_id") or ""


def in_fold(c: Case, fold: Fold | None) -> bool:
    if fold is None:
        return False
    mode, key = fold
    if mode == "source":
        return source_of(c) == key
    if mode == "device":
        return c.job.device.id == key  # type: ignore[union-attr]
    if mode == "die":
        return c.job.device.id in key  # type: ignore[union-attr]
    raise ValueError(f"unknown fold mode {mode!r}")


def fold_label(fold: Fold) -> str:
    return "+".join(fold[1]) if fold[0] == "die" else str(fold[1])


def _fit_rows(paths: list[str]) -> list[Case]:
    """The fit rows of the CSVs (predicted training rows with a target), run with BASE."""
    cases = load_all([Path(p) for p in paths])
    for c in cases:
        if is_training(c):
            run_case(c, BASE)
    return usable([c for c in cases if is_training(c)])


def _at_least(keys: list[str], min_rows: int) -> list[str]:
    counts: dict[str, int] = defaultdict(int)
    for k in keys:
        counts[k] += 1
    return sorted(k for k, n in counts.items() if n >= min_rows)


def loso_sources(rows: list[Case], min_rows: int = LOSO_MIN_ROWS) -> list[str]:
    return _at_least([source_of(c) for c in rows], min_rows)


def lodo_devices(rows: list[Case], min_rows: int = LOSO_MIN_ROWS) -> list[str]:
    return _at_least([c.job.device.id for c in rows], min_rows)  # type: ignore[union-attr]


def die_groups(devices: list[str], same_silicon: dict[str, str]) -> list[tuple[str, ...]]:
    """``devices`` partitioned by compute die: connected through ``same_silicon`` (in either
    direction, also through devices not in ``devices``); each group sorted, groups sorted."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in same_silicon.items():
        parent[root(a)] = root(b)
    groups: dict[str, list[str]] = defaultdict(list)
    for d in sorted(set(devices)):
        groups[root(d)].append(d)
    return sorted(tuple(g) for g in groups.values())


def lodo_folds(rows: list[Case], same_silicon: dict[str, str], min_rows: int = LOSO_MIN_ROWS) -> list[Fold]:
    """One fold per device with >= ``min_rows`` fit rows, then one per die that has more than one
    device in the data, at least one of them with >= ``min_rows`` rows (all its devices held out)."""
    devices = lodo_devices(rows, min_rows)
    folds: list[Fold] = [("device", d) for d in devices]
    present = sorted({c.job.device.id for c in rows})  # type: ignore[union-attr]
    for g in die_groups(present, same_silicon):
        if len(g) > 1 and any(d in devices for d in g):
            folds.append(("die", g))
    return folds


def fit_domain(rows: list[Case], min_rows: int = EXPECTED_ERROR_MIN_ROWS) -> dict[str, Any]:
    """What a fit on ``rows`` measured, per training stack: rows, the largest device count and the
    rows per model class (what ``coefficients.extrapolations`` judges a prediction against)."""
    stacks: dict[str, dict[str, Any]] = {}
    for c in rows:
        j = c.job
        st = stacks.setdefault(j.framework.name, {"rows": 0, "max_devices": 0, "classes": {}})  # type: ignore[union-attr]
        st["rows"] += 1
        st["max_devices"] = max(st["max_devices"], int(j.num_devices))  # type: ignore[union-attr]
        cls = model_class(j.model)  # type: ignore[union-attr]
        st["classes"][cls] = st["classes"].get(cls, 0) + 1
    return {"min_rows": min_rows, "stacks": {k: stacks[k] for k in sorted(stacks)}}


def case_extrapolations(c: Case, cal: Calibration, domain: dict[str, Any]) -> tuple[str, ...]:
    j = c.job
    return extrapolations(
        j.device.id,  # type: ignore[union-attr]
        cal,
        domain,
        stack=j.framework.name,  # type: ignore[union-attr]
        precision=c.table.row(0).precision,  # type: ignore[union-attr]
        model_cls=model_class(j.model),  # type: ignore[union-attr]
        num_devices=j.num_devices,  # type: ignore[union-attr]
    )


def refit(
    rows: list[Case], fold: Fold | None, max_nfev: int, start: Calibration | None = None
) -> dict[str, Any]:
    """One fit without the rows of ``fold`` (None: on every row), warm-started from ``start``,
    and the signed relative error of tokens/s of every row under it (``errors[i]`` for
    ``rows[i]``: out-of-sample for the held-out rows ``held``, in-sample for the others), with the
    extrapolations each held-out row makes from the rows that fit saw (``kinds``)."""
    train = [c for c in rows if not in_fold(c, fold)]
    t0 = time.perf_counter()
    res = fit(samples(train), BASE, max_nfev=max_nfev, start=start)
    seconds = time.perf_counter() - t0
    errors = np.expm1(residuals(samples(rows), res.calibration))
    held = [i for i, c in enumerate(rows) if in_fold(c, fold)]
    domain = fit_domain(train)
    return {
        "fold": fold,
        "holdout": fold_label(fold) if fold else None,
        "train_rows": len(train),
        "train_mape": float(res.mape),
        "converged": res.converged,
        "convergence": res.convergence(),
        "nfev": res.nfev,
        "seconds": seconds,
        "errors": errors.tolist(),
        "held": held,
        "kinds": [list(case_extrapolations(rows[i], res.calibration, domain)) for i in held],
        "calibration": res.calibration if fold is None else None,
    }


def _refit_worker(job: tuple[list[str], Fold | None, int, Calibration | None]) -> dict[str, Any]:
    paths, fold, max_nfev, start = job
    return refit(_fit_rows(paths), fold, max_nfev, start)


def refits(
    rows: list[Case],
    folds: list[Fold],
    max_nfev: int,
    workers: int = 1,
    paths: list[Path] | None = None,
    warm: bool = True,
) -> list[dict[str, Any]]:
    """The fit on every row, then one per fold (in that order), each fold's fit warm-started from
    the fit on every row unless ``warm`` is False.

    With ``workers`` > 1 the fold fits run in a process pool; each worker reloads ``paths`` (the
    CSVs ``rows`` came from, in the same order) rather than unpickling the cases.
    """
    full = refit(rows, None, max_nfev)
    start = full["calibration"] if warm else None
    if workers <= 1 or paths is None or len(folds) <= 1:
        return [full, *[refit(rows, f, max_nfev, start) for f in folds]]
    jobs = [([str(p) for p in paths], f, max_nfev, start) for f in folds]
    with ProcessPoolExecutor(max_workers=min(workers, len(folds))) as ex:
        return [full, *ex.map(_refit_worker, jobs)]


def loso_refits(
    rows: list[Case], sources: list[str], max_nfev: int, workers: int = 1, paths: list[Path] | None = None
) -> list[dict[str, Any]]:
    """The fit on every row, then one per held-out source (in that order)."""
    return refits(rows, [("source", s) for s in sources], max_nfev, workers, paths)


def _stats(e: np.ndarray) -> tuple[float, float]:
    return float(np.abs(e).mean()), float(e.mean())


def loso_table(rows: list[Case], fits: list[dict[str, Any]], line: float = LOSO_LINE) -> list[dict[str, Any]]:
    """Per fold (``fits[0]`` is the fit on every row): rows, in-sample (the fit on every row) and
    out-of-sample (the fit without the fold) MAPE and bias, and the verdict against ``line``."""
    full, out = fits[0], []
    for r in fits[1:]:
        m = np.zeros(len(rows), dtype=bool)
        m[r["held"]] = True
        ins, ins_bias = _stats(np.asarray(full["errors"])[m])
        oos, oos_bias = _stats(np.asarray(r["errors"])[m])
        out.append(
            {
                "mode": r["fold"][0],
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
    """Every held-out row with its error under the fit that left its fold out."""
    return [(rows[i], r["errors"][i]) for r in fits[1:] for i in r["held"]]


def held_out_entries(rows: list[Case], fits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per held-out row of every fold: its mode, fold, error, stack and extrapolations."""
    return [
        {
            "mode": r["fold"][0],
            "fold": r["holdout"],
            "case": rows[i],
            "error": float(r["errors"][i]),
            "stack": rows[i].job.framework.name,  # type: ignore[union-attr]
            "cls": model_class(rows[i].job.model),  # type: ignore[union-attr]
            "kinds": tuple(k),
        }
        for r in fits[1:]
        for i, k in zip(r["held"], r["kinds"], strict=True)
    ]


def _group(errs: list[float]) -> dict[str, Any]:
    a = np.abs(np.asarray(errs))
    return {
        "rows": len(a),
        "p90_ape": round(float(np.percentile(a, 90)), 4),
        "median_ape": round(float(np.median(a)), 4),
        "bias": round(float(np.mean(errs)), 4),
    }


def calibrate_widening(
    entries: list[dict[str, Any]], min_rows: int = EXPECTED_ERROR_MIN_ROWS
) -> dict[str, Any]:
    """The base p90 per stack and model class, and one widening factor per extrapolation kind, from
    held-out rows.

    Base: the p90 of |error| of the held-out rows that extrapolate in no way, per training stack and
    model class (``coefficients.model_class``: a stack's dense rows are not as uncertain as its
    fine-grained MoE rows) with >= ``min_rows`` of them, per training stack, and over all of them; a
    row takes the most specific of the three that has enough rows. Factors: for each kind with >= ``min_rows``
    held-out rows, the p90 of |error| / (base x the other kinds' factors of the row) over its rows
    (at least 1), iterated to a fixed point, so the band covers ~90% of each kind's rows; a kind
    with fewer rows takes the largest fitted factor (it is not assumed to extrapolate better than
    the worst one measured).
    """
    inside = [e for e in entries if not e["kinds"]]
    by_stack: dict[str, list[float]] = defaultdict(list)
    by_class: dict[str, list[float]] = defaultdict(list)
    for e in inside:
        by_stack[e["stack"]].append(e["error"])
        by_class[stack_class_key(e["stack"], e.get("cls"))].append(e["error"])
    base = {
        "stack": {k: _group(v) for k, v in sorted(by_stack.items()) if len(v) >= min_rows},
        "stack_class": {k: _group(v) for k, v in sorted(by_class.items()) if len(v) >= min_rows},
        "all": _group([e["error"] for e in inside]) if inside else None,
    }
    if base["all"] is None:
        raise ValueError("no held-out row is inside the measured domain: cannot set a base error")

    def b(e: dict[str, Any]) -> float:
        return float(base_entry(base, e["stack"], e.get("cls"))[0]["p90_ape"])

    factors = {k: 1.0 for k in EXTRAPOLATIONS}
    rows = {k: [e for e in entries if k in e["kinds"]] for k in EXTRAPOLATIONS}
    fitted = [k for k in EXTRAPOLATIONS if len(rows[k]) >= min_rows]
    for _ in range(50):
        before = dict(factors)
        for k in fitted:
            ratio = [
                abs(e["error"]) / (b(e) * float(np.prod([factors[j] for j in e["kinds"] if j != k])))
                for e in rows[k]
            ]
            factors[k] = max(1.0, round(float(np.percentile(ratio, 90)), 3))
        if factors == before:
            break
    worst = max([factors[k] for k in fitted], default=1.0)
    widening = {
        k: {
            "factor": factors[k] if k in fitted else worst,
            "rows": len(rows[k]),
            "from": "held-out rows" if k in fitted else f"largest fitted factor (< {min_rows} rows)",
            "text": EXTRAPOLATIONS[k],
        }
        for k in EXTRAPOLATIONS
    }
    return {"base": base, "widening": widening}


def band_coverage(entries: list[dict[str, Any]], table: dict[str, Any]) -> dict[str, Any]:
    """How many held-out rows the band of ``table`` covers (|error| <= the quoted p90, as
    ``coefficients.lookup_expected_error`` quotes it) and the median band."""
    if not entries:
        return {"rows": 0, "covered": 0, "coverage": float("nan"), "median_band": float("nan")}
    bands = np.array(
        [lookup_expected_error(table, e["stack"], e["kinds"], e.get("cls")).p90 for e in entries]  # type: ignore[union-attr]
    )
    errs = np.abs([e["error"] for e in entries])
    covered = int((errs <= bands).sum())
    return {
        "rows": len(entries),
        "covered": covered,
        "coverage": round(covered / len(entries), 4),
        "median_band": round(float(np.median(bands)), 4),
    }


def expected_error_table(
    entries: list[dict[str, Any]],
    domain: dict[str, Any],
    provenance: dict[str, Any],
    min_rows: int = EXPECTED_ERROR_MIN_ROWS,
) -> dict[str, Any]:
    """The ``autopar.expected_error/v2`` table: the domain the fit measured, the base p90 per stack,
    the widening factors, and the band's coverage of the held-out rows per mode."""
    table: dict[str, Any] = {
        "schema": EXPECTED_ERROR_SCHEMA,
        "provenance": {**provenance, "min_group_rows": min_rows},
        "domain": domain,
        **calibrate_widening(entries, min_rows),
    }
    modes = sorted({e["mode"] for e in entries}, key=list(MODES).index)
    table["coverage"] = {m: band_coverage([e for e in entries if e["mode"] == m], table) for m in modes}
    table["coverage"]["all"] = band_coverage(entries, table)
    return table


def cross_mode_coverage(entries: list[dict[str, Any]], domain: dict[str, Any]) -> dict[str, Any]:
    """The band calibrated on one mode's held-out rows, judged on the other's (a check that the
    factors are not just fitted to the rows they are judged on): source <-> device and die."""
    loso = [e for e in entries if e["mode"] == "source"]
    lodo = [e for e in entries if e["mode"] != "source"]
    out: dict[str, Any] = {}
    for name, fit_on, judge in (("source -> device", loso, lodo), ("device -> source", lodo, loso)):
        try:
            t = {"schema": EXPECTED_ERROR_SCHEMA, "domain": domain, **calibrate_widening(fit_on)}
        except ValueError:
            continue
        if judge:
            out[name] = band_coverage(judge, t)
    return out


def write_expected_error(path: Path, table: dict[str, Any]) -> None:
    """Write the table that ``autopar.coefficients.expected_error`` reads (whole or not at all)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(table, sort_keys=False))
    tmp.replace(path)


def base_fingerprint(rows: list[Case]) -> float:
    """MAPE of the fit rows under BASE (the uncalibrated device profiles every fit starts from): it
    moves with any change of the model, the device profiles or the data, so ``tests/test_fit.py``
    can tell when the shipped table is stale."""
    return round(error_stats(rows)["mape"], 6)


def expected_error_provenance(
    paths: list[Path], rows: list[Case], fits: list[dict[str, Any]], max_nfev: int, warm: bool
) -> dict[str, Any]:
    held: dict[str, dict[str, int]] = {}
    for f in fits[1:]:
        held.setdefault(f["fold"][0], {})[f["holdout"]] = len(f["held"])
    return {
        "method": "base: p90 of |out-of-sample relative error| of tokens/s of the held-out rows that "
        "extrapolate in no way, per stack and model class (else per stack); widening: one factor per extrapolation kind, the p90 of "
        "|error| / band of its held-out rows; rows held out by source, by device and by die, each "
        "predicted under fit_published BASE refitted without them",
        "command": f"python studies/accuracy.py --lodo --write-expected-error {SHIPPED_TABLE}",
        "data": {p.name: file_digest(p) for p in paths},
        "fit_rows": len(rows),
        "held_out": held,
        "loso_min_rows": LOSO_MIN_ROWS,
        "max_nfev": max_nfev,
        "warm_start": warm,
        "fits_converged": f"{sum(f['converged'] for f in fits[1:])}/{len(fits) - 1}",
        "base_mape_of_fit_rows": base_fingerprint(rows),
        "date": now_iso(),
    }


def print_folds(
    mode: str, table: list[dict[str, Any]], fits: list[dict[str, Any]], seconds: float | None, max_nfev: int
) -> None:
    full = fits[0]
    what = {"source": "source", "device": "device", "die": "die"}[mode]
    head = f"== {MODES[mode]} ({what}s with >= {LOSO_MIN_ROWS} fit rows; max_nfev={max_nfev}"
    print(head + (f"; {seconds:.0f} s) ==" if seconds is not None else ") =="))
    print(
        f"  fit on all {full['train_rows']} rows: train MAPE {full['train_mape']:.1%}, "
        f"{full['seconds']:.0f} s, {full['convergence']}"
    )
    print(
        f"  {'held-out ' + what:<36} {'rows':>5} {'in-sample':>9} {'bias':>7} {'held out':>9} {'bias':>7} "
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
        f"  {ok}/{len(table)} held-out {what}s within {LOSO_LINE:.0%} out of sample "
        "(shipped: their MAPE under the shipped calibration)"
    )


def print_expected_error(table: dict[str, Any], cross: dict[str, Any]) -> None:
    base, widening = table["base"], table["widening"]
    print(
        "== expected error: base p90 of held-out rows inside the measured domain x widening per extrapolation =="
    )
    for k, g in base["stack"].items():
        print(
            f"  base stack {k:<26} rows {g['rows']:>4}  p90 {g['p90_ape']:6.1%}  median {g['median_ape']:6.1%}"
        )
    for k, g in (base.get("stack_class") or {}).items():
        print(
            f"  base stack/class {k:<20} rows {g['rows']:>4}  p90 {g['p90_ape']:6.1%}  median {g['median_ape']:6.1%}"
        )
    g = base["all"]
    print(f"  base all {'':<28} rows {g['rows']:>4}  p90 {g['p90_ape']:6.1%}  median {g['median_ape']:6.1%}")
    for k, w in widening.items():
        print(f"  widen {k:<12} {w['text']:<42} x{w['factor']:<6.3g} rows {w['rows']:>4}  ({w['from']})")
    print("  coverage of the band on the held-out rows (calibrated on these rows):")
    for m, c in table["coverage"].items():
        name = MODES.get(m, "all modes")
        print(
            f"    {name:<28} rows {c['rows']:>4}  covered {c['covered']:>4} ({c['coverage']:.1%})  "
            f"median band {c['median_band']:.1%}"
        )
    for name, c in cross.items():
        print(
            f"    cross-mode {name:<17} rows {c['rows']:>4}  covered {c['covered']:>4} ({c['coverage']:.1%})  "
            f"median band {c['median_band']:.1%}  (calibrated on the other mode only)"
        )
    c = table["coverage"]["all"]
    ok = c["coverage"] >= COVERAGE_LINE and c["median_band"] <= BAND_LINE
    print(
        f"  acceptance (coverage >= {COVERAGE_LINE:.0%}, median band <= {BAND_LINE:.0%}): "
        + ("ok" if ok else "FAIL")
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
    ap.add_argument(
        "--lodo",
        action="store_true",
        help="also leave each device (and each die of same-silicon devices) out",
    )
    ap.add_argument(
        "--cold",
        action="store_true",
        help="start every refit from the profiles, not from the fit on every row",
    )
    ap.add_argument("--workers", type=int, default=2, help="processes for the held-out fits")
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
    refusal = None
    if a.no_loso and (a.write_expected_error or a.lodo):
        refusal = "--write-expected-error and --lodo need the held-out refits (drop --no-loso)"
    elif a.write_expected_error and not a.lodo:
        refusal = "--write-expected-error needs both held-out modes (add --lodo)"
    elif a.max_nfev < 1 or a.workers < 1:
        refusal = "--max-nfev and --workers must be at least 1"
    elif a.write_expected_error and not a.write_expected_error.parent.is_dir():
        refusal = (
            f"--write-expected-error: folder {a.write_expected_error.parent} does not exist (create it first)"
        )
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    paths = a.csv or [DEV_CSV, DEV2_CSV, DEV3_CSV]
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
    rep = repeatability(training)
    tables["repeatability"] = rep
    print("== repeatability: the same job and layout measured in more than one stack release ==")
    for fam, v in rep.items():
        print(
            f"  {fam:<8} rows {v['rows']:>3}: spread about the group mean {_pct(v['spread_mape'])}, "
            f"largest ratio in a group {v['max_ratio']:.2f}x; model MAPE on the same rows {_pct(v['model_mape'])}"
        )
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
        folds: list[Fold] = [("source", s) for s in loso_sources(rows)]
        if a.lodo:
            # dies: the fit's own (one die, one coefficient: BASE.transfer.dies) joined with same_silicon
            dies = {d: f"die:{x}" for d, x in BASE.transfer.dies.items()}
            folds += lodo_folds(rows, {**BASE.transfer.same_silicon, **dies})
        fits = refits(rows, folds, a.max_nfev, a.workers, paths, warm=not a.cold)
        seconds = time.perf_counter() - t1
        shipped_of = defaultdict(list)
        for c in training:
            if predicted(c):
                shipped_of[("source", source_of(c))].append(c)
                shipped_of[("device", c.job.device.id)].append(c)  # type: ignore[union-attr]
        for mode in MODES:
            mode_fits = [f for f in fits[1:] if f["fold"][0] == mode]
            if not mode_fits:
                continue
            table = loso_table(rows, [fits[0], *mode_fits])
            for r, f in zip(table, mode_fits, strict=True):
                keys = [f["fold"]] if mode != "die" else [("device", d) for d in f["fold"][1]]
                r["shipped_calibration_mape"] = error_stats([c for k in keys for c in shipped_of[k]])["mape"]
            tables["loso" if mode == "source" else "lodo" if mode == "device" else "die_held_out"] = {
                "folds": table,
                "fits": [
                    {k: v for k, v in f.items() if k not in ("errors", "calibration")} for f in mode_fits
                ],
            }
            print_folds(mode, table, fits, seconds if mode == "source" else None, a.max_nfev)
        print(
            f"  ({len(fits)} fits in {seconds:.0f} s wall, {a.workers} worker(s), "
            f"{'cold' if a.cold else 'warm-started from the fit on every row'}; fit seconds "
            f"{sum(f['seconds'] for f in fits):.0f} in all, residual evaluations "
            f"{sum(f['nfev'] for f in fits)})"
        )
        held = out_of_sample_errors(rows, [fits[0], *[f for f in fits[1:] if f["fold"][0] == "source"]])
        if a.plot is not None:
            oos = float(np.mean([abs(e) for _, e in held])) if held else float("nan")
            _plot(
                [c.measured_tps for c, _ in held],
                [c.measured_tps * (1.0 + e) for c, e in held],  # type: ignore[operator]
                [group_key(c, "device") for c, _ in held],
                f"out-of-sample: each source under the fit without it (n={len(held)}, MAPE {oos:.1%})",
                a.plot.with_name(a.plot.stem + ".out_of_sample.svg"),
            )
        entries = held_out_entries(rows, fits)
        domain = fit_domain(rows)
        prov = expected_error_provenance(paths, rows, fits, a.max_nfev, not a.cold)
        try:
            ee = expected_error_table(entries, domain, prov)
        except ValueError as exc:
            print(f"== expected error: not calibrated: {exc} ==")
            if a.write_expected_error:
                print(f"error: {a.write_expected_error} not written: {exc}", file=sys.stderr)
                return 1
            ee = None
    if not a.no_loso and ee is not None:
        cross = cross_mode_coverage(entries, domain)
        tables["expected_error"] = {**ee, "cross_mode_coverage": cross}
        print_expected_error(ee, cross)
        if a.write_expected_error:
            write_expected_error(a.write_expected_error, ee)
            print(f"wrote {a.write_expected_error}")
    print(f"(done in {time.perf_counter() - t0:.0f} s)")
    if a.json:
        recs = with_expected_error(records(cases), cases, cal)
        for r, c in zip(recs, cases, strict=True):
            r["csv"] = c.row.get("_csv")
        a.json.write_text(json.dumps({"records": recs, "tables": tables}, indent=1, default=str))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
