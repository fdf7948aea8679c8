"""``autopar export``: a layout as launcher arguments (Megatron-LM, DeepSpeed, torchtitan, vLLM, ...)."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

from autopar.errors import AutoparError


def _formats() -> list[str]:
    from autopar.export import EXPORTERS

    return sorted(EXPORTERS)


def add_export_output_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--out", type=Path, default=None, help="write here instead of stdout")


def check_out(out: Path | None) -> None:
    """Refuse a bad ``--out`` before any work (autopar.files.check_output)."""
    if out is not None:
        from autopar.files import check_output

        check_output(out, "launcher file", "--out")


def write_output(text: str, out: Path | None) -> None:
    """stdout, or an atomic write of ``out`` (autopar.files: no half-written file on failure)."""
    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    from autopar.files import write_text

    write_text(out, text if text.endswith("\n") else text + "\n", "launcher file", "--out")


def render_record(record: dict[str, Any], fmt: str) -> str:
    """Export one ``predict``/``recommend --json`` record (fills ``num_layers`` from the model)."""
    from autopar.export import export, layout_and_job_from_json

    layout, job = layout_and_job_from_json(record)
    if job.num_layers is None:
        try:
            from autopar.model import load_model

            job = job.model_copy(update={"num_layers": load_model(job.model).layers})
        except AutoparError:
            pass  # a model we cannot load here: formats that need the depth will say so
    return export(layout, fmt, job)


def _read_records(src: str) -> list[dict[str, Any]]:
    from autopar.files import MAX_INPUT_BYTES, parse_json, read_text

    hint = "pass the output of `autopar recommend --json` or `predict --json`"
    if src == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES or b"\x00" in data:
            raise AutoparError("--from-json -: standard input is binary or too large", hint)
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise AutoparError(
                f"--from-json -: standard input is not UTF-8 (offset {exc.start})", hint
            ) from None
    else:
        text = read_text(src, "--from-json", hint)
    data = parse_json(text, f"--from-json {src}")
    if isinstance(data, dict) and "results" in data:
        data = data["results"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise AutoparError(f"--from-json {src}: no layout records found", "expected predict/recommend JSON")
    bad = next((i for i, r in enumerate(data) if not isinstance(r, dict)), None)
    if bad is not None:
        raise AutoparError(f"--from-json {src}: record {bad} is not an object", hint)
    return data


def _framework_format(record: dict[str, Any]) -> str:
    """The export format of the record's training stack (``Job.framework``)."""
    from autopar.job import FRAMEWORK_EXPORT_FORMAT

    job = record.get("job") if isinstance(record, dict) else None
    framework = job.get("framework", "megatron") if isinstance(job, dict) else None
    if framework not in FRAMEWORK_EXPORT_FORMAT:
        raise AutoparError("autopar export needs --format", f"one of: {', '.join(_formats())}")
    return FRAMEWORK_EXPORT_FORMAT[framework]


@functools.cache
def _job_and_layout_dests() -> frozenset[str]:
    from autopar.cli.args import JOB_TOP_FIELDS, JOB_TRAINING_FIELDS
    from autopar.job import ClusterSpec
    from autopar.layout import LAYOUT_ARGS

    return frozenset(
        (*JOB_TOP_FIELDS, *ClusterSpec.model_fields, *JOB_TRAINING_FIELDS)
        + ("framework", "memory_headroom", "calibration")
        + tuple(LAYOUT_ARGS)
    )


def cmd_export(a: argparse.Namespace) -> int:
    from autopar.export import EXPORTERS

    if a.list_formats:
        for name in _formats():
            desc = getattr(EXPORTERS[name], "description", "")
            sys.stdout.write(f"{name:<16} {desc}\n")
        return 0
    check_out(a.out)
    if a.from_json:
        given = sorted(getattr(a, "_given", set()) & _job_and_layout_dests())
        if given:
            flags = ", ".join("--" + d.replace("_", "-") for d in given)
            raise AutoparError(
                f"--from-json carries the job and the layout, so {flags} would be ignored",
                "drop " + flags + ", or export from the job and layout flags without --from-json",
            )
        records = _read_records(a.from_json)
        if not 0 <= a.record < len(records):
            raise AutoparError(f"--record {a.record} is out of range (0..{len(records) - 1})")
        record = records[a.record]
    else:
        missing = [
            f for f in ("model", "device", "num_devices", "seq_len", "global_batch") if getattr(a, f) is None
        ]
        if missing:
            raise AutoparError(
                "autopar export needs --from-json FILE or the job flags; missing: "
                + ", ".join("--" + m.replace("_", "-") for m in missing),
                "pass --from-json plan.json (from `autopar recommend --json`) or every job flag",
            )
        from autopar.cli.args import job_kwargs, layout_kwargs
        from autopar.prediction import predict

        record = predict(**job_kwargs(a), **layout_kwargs(a)).to_dict()
    fmt = a.format or _framework_format(record)
    write_output(render_record(record, fmt), a.out)
    return 0


def register(sub) -> dict:
    from autopar.cli.args import add_job_args, add_layout_args

    p = sub.add_parser("export", help="render a layout as launcher arguments or config")
    p.add_argument(
        "--format",
        default=None,
        help="megatron, megatron_bridge, deepspeed, torchtitan, accelerate, "
        "torchrun, vllm, sglang or env (see --list-formats) (default: the job's framework's: "
        "megatron->megatron, torchtitan->torchtitan, deepspeed/megatron-deepspeed->deepspeed, "
        "fsdp->accelerate)",
    )
    p.add_argument("--list-formats", action="store_true", help="list the formats and exit")
    p.add_argument(
        "--from-json", default=None, metavar="FILE", help="a predict/recommend --json output ('-' for stdin)"
    )
    p.add_argument(
        "--record", type=int, default=0, help="which result of a recommend --json to export (0 = best)"
    )
    # The job flags of predict, optional here because --from-json carries them.
    add_job_args(p, optional=True)
    add_layout_args(p)
    add_export_output_args(p, required=False)
    from autopar.cli.args import track_given

    track_given(p, _job_and_layout_dests())
    return {"export": cmd_export}
