"""``autopar export``: a layout as launcher arguments (Megatron-LM, DeepSpeed, torchtitan, vLLM, ...)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autopar.errors import AutoparError


def _formats() -> list[str]:
    from autopar.export import EXPORTERS

    return sorted(EXPORTERS)


def add_export_output_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--out", type=Path, default=None, help="write here instead of stdout")


def write_output(text: str, out: Path | None) -> None:
    """stdout, or an atomic write of ``out`` (no half-written file on failure)."""
    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)


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
    text = sys.stdin.read() if src == "-" else None
    if text is None:
        p = Path(src)
        if not p.is_file():
            raise AutoparError(
                f"--from-json {src}: no such file", "pass the output of `autopar recommend --json`"
            )
        text = p.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AutoparError(
            f"--from-json {src}: not valid JSON ({exc.msg} at line {exc.lineno})",
            "pass the output of `autopar recommend --json` or `predict --json`",
        ) from None
    if isinstance(data, dict) and "results" in data:
        data = data["results"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise AutoparError(f"--from-json {src}: no layout records found", "expected predict/recommend JSON")
    return data


def _framework_format(record: dict[str, Any]) -> str:
    """The export format of the record's training stack (``Job.framework``)."""
    from autopar.job import FRAMEWORK_EXPORT_FORMAT

    job = record.get("job") if isinstance(record, dict) else None
    framework = job.get("framework", "megatron") if isinstance(job, dict) else None
    if framework not in FRAMEWORK_EXPORT_FORMAT:
        raise AutoparError("autopar export needs --format", f"one of: {', '.join(_formats())}")
    return FRAMEWORK_EXPORT_FORMAT[framework]


def cmd_export(a: argparse.Namespace) -> int:
    from autopar.export import EXPORTERS

    if a.list_formats:
        for name in _formats():
            desc = getattr(EXPORTERS[name], "description", "")
            sys.stdout.write(f"{name:<16} {desc}\n")
        return 0
    if a.from_json:
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
                + ", ".join("--" + m.replace("_", "-") for m in missing)
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
    return {"export": cmd_export}
