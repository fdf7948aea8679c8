"""CPU validation study: calibrate on this machine, run every layout of a small space for real, compare.

    python studies/cpu_validation.py [--json OUT] [--raw RAW.json] [--from-raw RAW.json]

A small Llama-style model (4 layers, hidden 256, GQA 8/4 heads, SwiGLU 768, vocab 512; seq 128,
global batch 4, fp32) at world size 4 on gloo (4 processes sharing this host's cores):

1. **calibrate**: ``autopar calibrate``'s microbenchmarks at world size 4, fitted into a local device
   profile and a calibration (``autopar-calibration/cpu-gloo-w4{,.device}.yaml`` in the working
   directory by default, ``--out-dir cost_models/calibration`` to refresh the shipped ones; the
   probe refit below is written as ``cpu-gloo-w4-probes.yaml``);
2. **enumerate** every legal layout of the space (tp, pp in {1, 2, 4}, dp = rest, ZeRO 0-3,
   every micro-batch that divides the batch, recompute none/full; cp, ep, vpp and fp8 excluded on
   CPU) with ``autopar.search.enumerate``, minus the layouts the runner treats identically (ZeRO > 0
   without data parallelism shards nothing) and the ones it refuses (1F1B with fewer micro-batches
   than stages);
3. **run** them all with the reference runner (``autopar validate``'s machinery, 8 per launch);
4. **compare** step time (MAPE, Spearman, top-1 regret) and per-rank peak memory with the predictions
   of four calibrations:

   * ``before``: a naive profile (theoretical FLOP/s, guessed DRAM and loopback rates) and the
     shipped default calibration (fitted to published GPU runs; CUDA memory constants);
   * ``microbench``: the calibration from microbenchmarks alone (no layout seen);
   * ``after`` (the headline): microbenchmarks plus a refit on 8 *probe* layouts chosen by a fixed
     rule before anything is measured (one per (tp, pp) shape, plus ZeRO-3 and full recompute on
     pure DP) of the overlap contention, the link latency and the per-TP-collective overhead (and
     the memory constants); figures on all layouts and on the 36 held-out ones;
   * ``refit``: refitted on all measured layouts (in-sample) and 4-fold cross-validated
     (each layout predicted by a refit that did not see it).

Memory compares the engine's per-device memory (its most loaded pipeline stage) with the highest
per-rank peak measured (live parameters/gradients/optimizer state + the training thread's allocator
peak; autopar/runner/memory.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autopar.calibration.calibrate import (  # noqa: E402
    calibrate,
    check_calibration_outputs,
    naive_cpu_profile,
    refit_memory,
    refit_time,
    write_calibration_atomic,
    write_profile_atomic,
)
from autopar.calibration.microbench import run_microbenchmarks  # noqa: E402
from autopar.calibration.validate import Item, Progress, run_items, summarize  # noqa: E402
from autopar.coefficients import Calibration, load_calibration  # noqa: E402
from autopar.engine import evaluate  # noqa: E402
from autopar.errors import AutoparError, RunError  # noqa: E402
from autopar.files import check_distinct, check_output, load_json, require_mapping, write_text  # noqa: E402
from autopar.hardware import load_device  # noqa: E402
from autopar.job import Job, TrainingJob  # noqa: E402
from autopar.layout import Layout, LayoutTable  # noqa: E402
from autopar.memory import GIB  # noqa: E402
from autopar.model import load_model  # noqa: E402
from autopar.search.enumerate import enumerate_space  # noqa: E402
from autopar.search.space import SearchSpace  # noqa: E402

WORLD, SEQ, BATCH = 4, 128, 4
MODEL = {
    "name": "cpu-validation-llama",
    "hidden": 256,
    "layers": 4,
    "heads": 8,
    "kv_heads": 4,
    "head_dim": 32,
    "ffn_hidden": 768,
    "vocab": 512,
}
SPACE = {
    "name": "cpu-validation",
    "description": "tp x pp x dp x ZeRO x micro-batch x recompute at world size 4, fp32 (no cp/ep/vpp/fp8 on CPU)",
    "axes": {
        "tp": {"values": [1, 2, 4]},
        "pp": {"values": [1, 2, 4]},
        "vpp": {"values": [1]},
        "cp": {"values": [1]},
        "ep": {"values": [1]},
        "micro_batch": {"candidates": "divisors"},
        "zero": [0, 1, 2, 3],
        "shard_group": {"values": [0]},
        "recompute": ["none", "full"],
        "offload": [False],
        "precision": ["fp32"],
    },
}
# Coefficients refitted on the probe layouts: the ones microbenchmarks measure least faithfully,
# the links and the overlap contention as they behave inside a training step (gloo's threads and
# FSDP's per-unit work competing with compute for the cores) and DTensor's cost per TP collective.
PROBE_PARAMS = ("global.overlap_contention", "scale_up_latency_us", "global.tp_collective_overhead_us")


def space_layouts(job: TrainingJob) -> tuple[list[Layout], dict[str, int]]:
    from autopar.runner import check_layout
    from autopar.runner.config import RunnerModelConfig

    en = enumerate_space(job, SearchSpace.model_validate(SPACE))
    rows = en.table(en.legal_ids()).rows()
    cfg = RunnerModelConfig.from_model_spec(job.model)
    keep, dropped = [], {"legal": len(rows), "zero_without_dp": 0, "runner_refuses": 0}
    for lay in rows:
        if lay.dp == 1 and lay.zero > 0:
            dropped["zero_without_dp"] += 1
            continue
        try:
            check_layout(lay, cfg, seq_len=SEQ, global_batch=BATCH)
        except RunError:
            dropped["runner_refuses"] += 1
            continue
        keep.append(lay)
    return keep, dropped


def probe_indices(layouts: list[Layout]) -> list[int]:
    """Fixed rule, applied before measuring: per (tp, pp) the lowest ZeRO stage, no recompute,
    smallest micro-batch; plus pure DP with ZeRO-3 and pure DP with full recompute."""
    out: list[int] = []
    seen: set[tuple[int, int]] = set()
    order = sorted(
        range(len(layouts)),
        key=lambda i: (layouts[i].zero, layouts[i].recompute != "none", layouts[i].micro_batch),
    )
    for i in order:
        lay = layouts[i]
        if lay.recompute == "none" and (lay.tp, lay.pp) not in seen:
            seen.add((lay.tp, lay.pp))
            out.append(i)
    for want in ({"zero": 3, "recompute": "none"}, {"zero": 0, "recompute": "full"}):
        for i in order:
            lay = layouts[i]
            if (
                lay.tp == 1
                and lay.pp == 1
                and all(getattr(lay, k) == v for k, v in want.items())
                and i not in out
            ):
                out.append(i)
                break
    return sorted(out)


def predict(job: TrainingJob, layouts: list[Layout], cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    res = evaluate(job, LayoutTable.from_layouts(layouts), calibration=cal, check_legal=False)
    return res["step_time_s"], res["memory_bytes"] / GIB


def refit(
    job: TrainingJob,
    layouts: list[Layout],
    recs: list[dict[str, Any]],
    idx: list[int],
    base: Calibration,
    params: tuple[str, ...],
) -> Calibration:
    ok = [i for i in idx if recs[i]["status"] == "ok"]
    table = LayoutTable.from_layouts([layouts[i] for i in ok])
    t = np.array([recs[i]["measured_step_time_s"] for i in ok])
    cal = refit_time([(job, table, t)], base, params=params, precisions=("fp32",)).calibration
    mem_ok = [j for j, i in enumerate(ok) if recs[i].get("measured_peak_memory_gib")]
    if mem_ok:
        m = np.array([recs[ok[j]]["measured_peak_memory_gib"] * GIB for j in mem_ok])
        cal, _ = refit_memory([(job, table.take(np.array(mem_ok)), m)], cal)
    return cal


def figures(recs: list[dict[str, Any]], key: str, idx: list[int] | None = None) -> dict[str, Any]:
    sel = recs if idx is None else [recs[i] for i in idx]
    rows = [
        dict(
            r, predicted_step_time_s=r[f"{key}_step_time_s"], predicted_peak_memory_gib=r[f"{key}_memory_gib"]
        )
        for r in sel
    ]
    return summarize(rows)


def line(name: str, s: dict[str, Any]) -> str:
    if not s.get("n_ok"):
        return f"{name:<34} no successful runs"
    return (
        f"{name:<34} {100 * s['step_time_mape']:6.1f}%  {s['spearman']:7.3f}  {s['top1_regret']:7.3f}   "
        f"{100 * s.get('memory_mape', float('nan')):6.1f}%  {100 * s.get('memory_max_abs_error', float('nan')):6.1f}%"
        f"  {100 * s.get('memory_within_20pct', float('nan')):5.0f}%   {s['n_ok']:>3}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, metavar="OUT", help="one record per layout (and the summary)")
    ap.add_argument("--raw", default=None, metavar="OUT", help="save microbenchmarks and runs for --from-raw")
    ap.add_argument("--from-raw", default=None, metavar="RAW", help="re-analyze a saved run (no measuring)")
    ap.add_argument(
        "--out-dir",
        default=None,
        help="an existing directory for the fitted profile and calibrations (default: ./autopar-calibration, "
        "created if missing; pass cost_models/calibration to refresh the shipped ones)",
    )
    ap.add_argument("--name", default="cpu-gloo-w4")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per layout")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--folds", type=int, default=4)
    a = ap.parse_args(argv)
    try:
        return run(a)
    except AutoparError as exc:  # bad input: one line, exit 2 (checked before anything is measured)
        print(f"error: {exc}", file=sys.stderr)
        return 2


def check_outputs(a: argparse.Namespace) -> tuple[Path, bool]:
    """Every destination, before anything is measured or created: the calibration directory and its
    files (the default ./autopar-calibration is made once the fit succeeded), --json, --raw, and that
    no output is an input or another output."""
    out_dir = a.out_dir or "autopar-calibration"
    out, make = check_calibration_outputs(a.name, out_dir, create_out_dir=a.out_dir is None)
    probes = out / f"{a.name}-probes.yaml"
    if not make:
        check_output(probes, "probe-refitted calibration", "--out-dir")
    for flag, path, what in (("--json", a.json, "records"), ("--raw", a.raw, "raw measurements")):
        if path:
            check_output(path, what, flag)
    outputs = [("--out-dir", str(out / f"{a.name}{x}")) for x in (".yaml", ".device.yaml", "-probes.yaml")]
    outputs += [(f, p) for f, p in (("--json", a.json), ("--raw", a.raw)) if p]
    check_distinct([("--from-raw", a.from_raw)] if a.from_raw else [], outputs)
    return out, make


def run(a: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    for flag, v in (
        ("--steps", a.steps),
        ("--timeout", a.timeout),
        ("--batch-size", a.batch_size),
        ("--folds", a.folds),
    ):
        if not v > 0:
            raise AutoparError(f"{flag} {v} must be > 0", f"pass {flag} > 0")
    if not 0 <= a.warmup < a.steps:
        raise AutoparError(f"--warmup {a.warmup} must be >= 0 and below --steps {a.steps}", "lower --warmup")
    out_dir, make = check_outputs(a)
    spec = load_model(MODEL)
    hint = "pass a file written by --raw"
    saved = (
        require_mapping(load_json(a.from_raw, "--from-raw", hint), f"--from-raw {a.from_raw}", hint)
        if a.from_raw
        else None
    )
    if saved is not None and not {"microbench", "records"} <= set(saved):
        raise AutoparError(f"--from-raw {a.from_raw}: no microbench and records keys", hint)

    # 1. calibrate
    print(f"[{time.perf_counter() - t0:5.0f} s] calibrate: microbenchmarks on {WORLD} ranks", file=sys.stderr)
    raw_mb = (
        saved["microbench"]
        if saved
        else run_microbenchmarks(WORLD, sweep="full", device="cpu", timeout_s=900)
    )
    fitted, cal_path, prof_path = calibrate(
        world_size=WORLD, name=a.name, out_dir=out_dir, raw=raw_mb, create_out_dir=make
    )
    cal_mb = load_calibration(cal_path)
    dev = load_device(prof_path)
    flat = dict(model=spec.name, num_devices=WORLD, devices_per_node=WORLD, seq_len=SEQ, global_batch=BATCH)
    job = Job.from_flat(device=dev.id, **flat).resolve(model=spec, device=dev)
    with tempfile.TemporaryDirectory() as tmp:
        naive_dev = load_device(
            write_profile_atomic(naive_cpu_profile("naive-cpu", WORLD), Path(tmp) / "naive.yaml")
        )
    job_before = Job.from_flat(device=naive_dev.id, **flat).resolve(model=spec, device=naive_dev)
    cal_default = load_calibration()

    # 2. enumerate
    layouts, dropped = space_layouts(job)
    probes = probe_indices(layouts)
    held = [i for i in range(len(layouts)) if i not in probes]
    print(
        f"[{time.perf_counter() - t0:5.0f} s] space: {dropped['legal']} legal layouts, {dropped['zero_without_dp']} "
        f"duplicates (ZeRO without dp), {dropped['runner_refuses']} refused by the runner -> {len(layouts)} to run",
        file=sys.stderr,
    )

    # 3. run
    if saved:
        by_key = {json.dumps(r["layout"], sort_keys=True): r for r in saved["records"]}
        recs = [by_key[json.dumps(lay.model_dump(), sort_keys=True)] for lay in layouts]
    else:
        from autopar.runner.config import RunnerModelConfig

        t_mb, m_mb = predict(job, layouts, cal_mb)  # shown next to each measurement as the runs finish
        items = [
            Item(
                lay,
                prediction={
                    "predicted_step_time_s": float(t_mb[i]),
                    "predicted_peak_memory_gib": float(m_mb[i]),
                },
            )
            for i, lay in enumerate(layouts)
        ]
        recs = run_items(
            items,
            RunnerModelConfig.from_model_spec(spec),
            seq_len=SEQ,
            global_batch=BATCH,
            steps=a.steps,
            warmup=a.warmup,
            timeout_s=a.timeout,
            batch_size=a.batch_size,
            device="cpu",
            progress=Progress(len(layouts)),
        )
    if a.raw and not saved:
        write_text(
            a.raw, json.dumps({"microbench": raw_mb, "records": recs}, indent=1), "raw measurements", "--raw"
        )

    # 4. predict with each calibration
    variants: dict[str, tuple[TrainingJob, Calibration]] = {
        "before": (job_before, cal_default),
        "microbench": (job, cal_mb),
    }
    cal_after = refit(job, layouts, recs, probes, cal_mb, PROBE_PARAMS)
    prov = dict(cal_after.provenance)
    prov["refit"] = {
        "on": f"{len(probes)} probe layouts of studies/cpu_validation.py",
        "params": list(PROBE_PARAMS),
        "probes": [layouts[i].short() for i in probes],
    }
    cal_after = cal_after.model_copy(update={"provenance": prov})
    after_path = write_calibration_atomic(cal_after, out_dir / f"{a.name}-probes.yaml", flag="--out-dir")
    variants["after"] = (job, cal_after)
    all_idx = list(range(len(layouts)))
    variants["refit_in_sample"] = (job, refit(job, layouts, recs, all_idx, cal_mb, PROBE_PARAMS))
    for name, (j, c) in variants.items():
        t, m = predict(j, layouts, c)
        for i, r in enumerate(recs):
            r[f"{name}_step_time_s"], r[f"{name}_memory_gib"] = float(t[i]), float(m[i])
    folds = [all_idx[k :: a.folds] for k in range(a.folds)]
    for fold in folds:
        train = [i for i in all_idx if i not in fold]
        t, m = predict(
            job, [layouts[i] for i in fold], refit(job, layouts, recs, train, cal_mb, PROBE_PARAMS)
        )
        for j, i in enumerate(fold):
            recs[i]["refit_cv_step_time_s"], recs[i]["refit_cv_memory_gib"] = float(t[j]), float(m[j])

    # 5. report
    print(
        f"\nCPU validation: {spec.name}, seq {SEQ}, batch {BATCH}, fp32, world {WORLD} on gloo "
        f"({fitted.values['peak_tflops_fp32'] * 1e3:.0f} GFLOP/s per rank theoretical)"
    )
    print(
        f"{'layout':<40} {'measured':>9} {'before':>8} {'microb.':>8} {'after':>8}   {'mem MiB':>8} {'after':>7}  probe"
    )
    for i, r in enumerate(recs):
        if r["status"] != "ok":
            print(f"{r['layout_short']:<40} FAILED: {r.get('error', '')[:60]}")
            continue
        print(
            f"{r['layout_short']:<40} {r['measured_step_time_s']:9.3f} {r['before_step_time_s']:8.3f} "
            f"{r['microbench_step_time_s']:8.3f} {r['after_step_time_s']:8.3f}   "
            f"{1024 * (r['measured_peak_memory_gib'] or 0):8.1f} {1024 * r['after_memory_gib']:7.1f}  "
            f"{'*' if i in probes else ''}"
        )
    summary = {
        "before (naive profile + default cal.)": figures(recs, "before"),
        "microbench only": figures(recs, "microbench"),
        "after: microbench + 8 probes, all": figures(recs, "after"),
        "after: held-out layouts only": figures(recs, "after", held),
        "refit on all (in-sample)": figures(recs, "refit_in_sample"),
        f"refit, {a.folds}-fold cross-validated": figures(recs, "refit_cv"),
    }
    print(
        f"\n{'calibration':<34} {'MAPE':>7}  {'Spearman':>7}  {'regret':>7}   {'mem MAPE':>7} {'max':>7}  "
        f"{'<=20%':>5}   {'n':>3}"
    )
    for k, s in summary.items():
        print(line(k, s))
    print(
        f"\nmeasured best {summary['microbench only'].get('measured_best')}; predicted best (after) "
        f"{summary['after: microbench + 8 probes, all'].get('predicted_best')}"
    )
    print("probe refit: " + ", ".join(f"{k}={_coef(cal_after, dev.id, k):.4g}" for k in PROBE_PARAMS))
    print(
        f"wrote {cal_path} (microbenchmarks), {after_path} (+ probes) and {prof_path}; "
        f"total {time.perf_counter() - t0:.0f} s"
    )
    if a.json:
        out = [
            {
                "layout": r["layout"],
                "layout_short": r["layout_short"],
                "status": r["status"],
                "predicted_step_time_s": r.get("after_step_time_s"),
                "measured_step_time_s": r.get("measured_step_time_s"),
                "predicted_peak_memory_gib": r.get("after_memory_gib"),
                "measured_peak_memory_gib": r.get("measured_peak_memory_gib"),
                "measured_peak_memory_gib_per_rank": r.get("measured_peak_memory_gib_per_rank"),
                "probe": i in probes,
                "error": r.get("error"),
                "predictions": {
                    k: {"step_time_s": r.get(f"{k}_step_time_s"), "peak_memory_gib": r.get(f"{k}_memory_gib")}
                    for k in ("before", "microbench", "after", "refit_in_sample", "refit_cv")
                },
                "final_loss": r.get("final_loss"),
            }
            for i, r in enumerate(recs)
        ]
        write_text(
            a.json,
            json.dumps(
                {
                    "job": {**MODEL, "seq_len": SEQ, "global_batch": BATCH, "world": WORLD},
                    "summary": summary,
                    "records": out,
                },
                indent=1,
                default=float,
            ),
            "records",
            "--json",
        )
    return 0


def _coef(cal: Calibration, dev_id: str, name: str) -> float:
    if name.startswith("global."):
        return cal.global_value(name.split(".", 1)[1])
    dc = cal.devices[dev_id]
    return dc.gemm["fp32"] if name == "gemm" else float(getattr(dc, name))


if __name__ == "__main__":
    sys.exit(main())
