"""``autopar validate``: run layouts for real (reference runner) and compare them with the predictions."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: Any) -> dict[str, Any]:
    from autopar.cli.args import MAX_TOP, int_range, nonneg_int, positive_float, positive_int

    p = sub.add_parser(
        "validate",
        help="run layouts for real and compare step time and memory with the predictions",
        description="Launch each layout with the reference runner (torchrun; gloo on CPU, NCCL on GPU), "
        "measure the median step time after warm-up, the peak memory per rank and the loss, "
        "compare with the prediction, and optionally refit the calibration. Layouts come from "
        "`recommend --json` output or a layouts file (--layouts), or an `autopar study` (--study).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--layouts",
        metavar="FILE",
        help="recommend --json output, a JSON/YAML list of layouts, or {job: {...}, layouts: [...]}",
    )
    src.add_argument("--study", metavar="NAME", help="validate the best trials of this study")
    p.add_argument("--storage", default=None, help="study storage (default: autopar-studies.log)")
    p.add_argument(
        "--top",
        type=int_range(1, MAX_TOP),
        default=5,
        help="how many of the study's best trials (default: 5)",
    )
    g = p.add_argument_group("job (overrides what the source records)")
    g.add_argument("--model", default=None, help="preset id, HF config.json or raw-dimensions JSON")
    g.add_argument("--device", default=None, help="device id or device YAML (e.g. from autopar calibrate)")
    g.add_argument(
        "--devices-per-node",
        type=positive_int,
        default=None,
        help="override the source's (default: the source's)",
    )
    g.add_argument(
        "--seq-len", type=positive_int, default=None, help="override the source's (default: the source's)"
    )
    g.add_argument(
        "--global-batch",
        type=positive_int,
        default=None,
        help="override the source's (default: the source's)",
    )
    g.add_argument("--calibration", default=None, help="calibration YAML for the predictions")
    r = p.add_argument_group("runs")
    r.add_argument("--steps", type=positive_int, default=7, help="optimizer steps per run, warm-up included")
    r.add_argument("--warmup", type=nonneg_int, default=2, help="steps left out of the median (default: 2)")
    r.add_argument(
        "--timeout", type=positive_float, default=300.0, help="seconds per layout before a run is failed"
    )
    r.add_argument(
        "--batch-size", type=positive_int, default=6, help="layouts per torchrun launch (default: 6)"
    )
    r.add_argument(
        "--run-device", choices=("auto", "cpu", "cuda"), default="auto", help="where the runs execute"
    )
    p.add_argument(
        "--refit",
        default=None,
        metavar="OUT",
        help="refit the calibration to the measurements and write it (atomically) to OUT",
    )
    p.add_argument("--json", default=None, metavar="OUT", help="write records and summary as JSON to OUT")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    from autopar.cli.recommend import add_html_arg

    add_html_arg(p)
    return {"validate": cmd_validate}


def cmd_validate(a: argparse.Namespace) -> int:
    from autopar.calibration.calibrate import write_calibration_atomic
    from autopar.calibration.validate import (
        Progress,
        attach_to_study,
        derive_grad_accum,
        format_summary,
        load_layouts_file,
        load_study_layouts,
        predict_items,
        preflight,
        refit_calibration,
        resolve_run_device,
        run_items,
        runner_model_for,
        summarize,
    )
    from autopar.coefficients import load_calibration
    from autopar.errors import AutoparError, RunError
    from autopar.files import check_output, check_study_name, write_text
    from autopar.job import SCHEMA_VERSION, Job
    from autopar.memory import GIB

    if a.warmup < 0 or a.steps <= a.warmup:
        raise AutoparError(f"--steps {a.steps} must exceed --warmup {a.warmup} (>= 0)", "raise --steps")
    # Every destination is checked before any run: a bad path must not cost the measurements.
    json_out = check_output(a.json, "validation results", "--json") if a.json else None
    refit_out = check_output(a.refit, "refitted calibration", "--refit") if a.refit else None
    html_out = check_output(a.html, "HTML report", "--html") if a.html else None
    if a.study is not None:
        check_study_name(a.study, "--study")
    source = load_study_layouts(a.study, a.storage, top=a.top) if a.study else load_layouts_file(a.layouts)
    info = dict(source.job)
    for k in ("model", "device", "devices_per_node", "seq_len", "global_batch"):
        v = getattr(a, k)
        if v is not None:
            info[k] = v
    missing = [k for k in ("model", "device", "seq_len", "global_batch") if info.get(k) in (None, "")]
    if missing:
        raise AutoparError(
            f"the {source.kind} does not say the job's {', '.join(missing)}",
            "pass " + " ".join(f"--{k.replace('_', '-')}" for k in missing),
        )
    derive_grad_accum(source.items, int(info["global_batch"]))
    worlds = sorted({it.layout.num_devices for it in source.items})
    from autopar.cli.args import MAX_LOCAL_RANKS

    if worlds[-1] > MAX_LOCAL_RANKS:
        raise AutoparError(
            f"a layout needs {worlds[-1]:,} ranks; validate launches at most {MAX_LOCAL_RANKS} local processes",
            "validate layouts of a smaller world size (tp*pp*cp*dp)",
        )
    if a.refit and len(worlds) != 1:
        raise AutoparError("--refit needs layouts of one world size", "validate one world size at a time")
    if info.get("pipeline_schedule", "1f1b") != "1f1b":
        raise AutoparError(
            f"the layouts were scored for pipeline schedule {info['pipeline_schedule']}; the reference "
            "runner runs 1F1B (interleaved when vpp > 1)",
            "validate layouts scored with `autopar recommend --pipeline-schedule 1f1b`, or run them with torchtitan",
        )
    cal_path = a.calibration or info.get("calibration")
    cal = load_calibration(cal_path)
    jobs = {}
    for w in worlds:
        dpn = info.get("devices_per_node")
        jobs[w] = Job.from_flat(
            model=info["model"],
            device=info["device"],
            num_devices=w,
            devices_per_node=min(dpn, w) if dpn else None,
            seq_len=int(info["seq_len"]),
            global_batch=int(info["global_batch"]),
            lora=info.get("lora"),
            framework=info.get("framework"),
            allow_long_context=info.get("allow_long_context"),
            calibration=cal_path,
        ).resolve()
    spec = jobs[worlds[0]].model
    runner_model = runner_model_for(spec)
    for w, job in jobs.items():  # predictions first, so that the progress lines can show them
        sel = [it for it in source.items if it.layout.num_devices == w]
        res = predict_items(job, [it.layout for it in sel], cal)
        for i, it in enumerate(sel):
            it.prediction = {
                "predicted_step_time_s": float(res["step_time_s"][i]),
                "predicted_peak_memory_gib": float(res["memory_bytes"][i]) / GIB,
            }
    # Before anything is launched: the device, and every layout against what this machine and the
    # runner can do (features, one rank per GPU, memory); nothing runnable is one line, exit 2.
    device, n_gpus = resolve_run_device(a.run_device)
    gpu_free = None
    if device == "cuda":
        from autopar.runner.resources import gpu_free_bytes

        gpu_free = gpu_free_bytes()
    refused = preflight(
        source.items,
        runner_model,
        seq_len=int(info["seq_len"]),
        global_batch=int(info["global_batch"]),
        device=device,
        n_gpus=n_gpus,
        gpu_free=gpu_free,
    )
    if len(refused) == len(source.items):
        i = min(refused)
        more = f" (and {len(refused) - 1} more layout(s) refused)" if len(refused) > 1 else ""
        raise RunError(
            f"no layout can run on this machine ({device}): {source.items[i].layout.short()}: {refused[i]}{more}",
            "nothing was launched: validate layouts this machine can run, or run on one that has what they need",
        )
    head: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "job": jobs[worlds[0]].info(),
        "calibration": cal_path or "default",
        "source": source.kind,
    }
    finished: list[dict[str, Any]] = []

    def save(rec: dict[str, Any]) -> None:  # each measurement is on disk as soon as it exists
        finished.append(rec)
        if json_out is not None:
            partial = {**head, "complete": False, "records": finished}
            write_text(json_out, json.dumps(partial, indent=1, default=float), "validation results", "--json")

    progress = Progress(len(source.items), enabled=not (a.no_progress or a.quiet), on_record=save)
    records = run_items(
        source.items,
        runner_model,
        seq_len=int(info["seq_len"]),
        global_batch=int(info["global_batch"]),
        steps=a.steps,
        warmup=a.warmup,
        timeout_s=a.timeout,
        batch_size=a.batch_size,
        device=device,
        progress=progress,
        refused=refused,
    )
    summary = summarize(records)
    out: dict[str, Any] = {**head, "complete": True, "summary": summary, "records": records}
    if json_out is not None:  # the measurements first, before the refit can fail
        write_text(json_out, json.dumps(out, indent=1, default=float), "validation results", "--json")
    lines = [format_summary(summary, "validate")]
    if summary.get("n_ok"):
        lines.append(
            f"  predicted best {summary['predicted_best']}, measured best {summary['measured_best']}"
        )
    if source.study is not None:
        n = attach_to_study(source.study, records, summary)
        lines.append(f"  attached {n} measurement(s) to study {a.study!r} (user attrs validation.trial_<n>)")
    if refit_out is not None:
        new, info_fit = refit_calibration(
            records, jobs[worlds[0]], cal, provenance={"refit_from": a.layouts or f"study {a.study}"}
        )
        path = write_calibration_atomic(new, refit_out)
        out["refit"] = {"path": str(path), **info_fit}
        t = info_fit["time_after"]
        lines.append(
            f"  refit: step-time residual median {t.get('median_abs_pct')}%, max {t.get('max_abs_pct')}% "
            f"-> wrote {path}"
        )
    if json_out is not None:
        write_text(json_out, json.dumps(out, indent=1, default=float), "validation results", "--json")
        lines.append(f"  wrote {a.json}")
    if html_out is not None:
        from autopar.cli.report import validate_report

        validate_report(out).write(html_out)
        lines.append(f"  wrote {a.html}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if summary.get("n_ok") else 2
