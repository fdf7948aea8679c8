"""Shell ``export AUTOPAR_*=...`` lines: the whole layout and job, for scripts to read.

Every Layout field becomes ``AUTOPAR_<FIELD>`` (booleans as 0/1) and every Job field
``AUTOPAR_<FIELD>`` (unset optional fields are left out), plus the derived ``AUTOPAR_NNODES`` and
``AUTOPAR_NPROC_PER_NODE``. ``source`` the file, or read it with ``parse``. Nothing is refused:
the file is a plain serialization.
"""

from __future__ import annotations

import shlex
from typing import Any

from autopar.export.base import (
    Exporter,
    ExportError,
    Job,
    build_layout,
    header_line,
    merge_job,
    read_header,
    register,
)
from autopar.frameworks import ATTENTION_OVERRIDES
from autopar.layout import COLUMNS, Layout
from autopar.schedules import PIPELINE_SCHEDULES

FMT = "env"
PREFIX = "AUTOPAR_"
BOOL_FIELDS = ("sp", "offload")
STR_FIELDS = ("recompute", "precision")
STR_JOB_FIELDS = (
    "model",
    "device",
    "framework",
    "pipeline_schedule",
    "moe_dispatcher",
    "attention_kernel",
    "tp_comm_overlap",
)
JOB_FIELDS = tuple(Job.model_fields)
DERIVED = ("nnodes", "nproc_per_node")


@register
class EnvExporter(Exporter):
    name = FMT
    suffix = ".env"
    description = "shell `export AUTOPAR_*=...` lines (layout + job) for scripts"
    pipeline_schedules = PIPELINE_SCHEDULES  # AUTOPAR_PIPELINE_SCHEDULE names any of them
    moe_options = True  # AUTOPAR_MOE_DISPATCHER / AUTOPAR_MOE_A2A_OVERLAP
    fused_graph_option = True  # AUTOPAR_MOE_FUSED_GRAPH
    attention_kernels = ATTENTION_OVERRIDES  # AUTOPAR_ATTENTION_KERNEL
    tp_overlap_option = True  # AUTOPAR_TP_COMM_OVERLAP

    def _render(self, layout: Layout, job: Job) -> str:
        lines = [header_line(FMT, job), f"# autopar layout: {layout.short()}"]
        for k in COLUMNS:
            v = getattr(layout, k)
            lines.append(
                f"export {PREFIX}{k.upper()}={shlex.quote(str(int(v) if isinstance(v, bool) else v))}"
            )
        for k in JOB_FIELDS:
            v = getattr(job, k)
            if v is not None:
                lines.append(f"export {PREFIX}{k.upper()}={shlex.quote(str(v))}")
        for k in DERIVED:
            lines.append(f"export {PREFIX}{k.upper()}={getattr(job, k)}")
        return "\n".join(lines)

    def _parse(self, text: str) -> tuple[Layout, Job]:
        header = read_header(text, FMT, required=False)
        env: dict[str, str] = {}
        for ln in text.splitlines():
            ln = ln.strip()
            if not ln or ln.startswith("#"):
                continue
            toks = shlex.split(ln)
            if len(toks) != 2 or toks[0] != "export" or "=" not in toks[1]:
                raise ExportError(
                    f"unexpected line {ln!r} in the {FMT} text", "expected `export AUTOPAR_NAME=value`"
                )
            name, _, value = toks[1].partition("=")
            if not name.startswith(PREFIX):
                raise ExportError(f"variable {name} in the {FMT} text is not an {PREFIX}* variable")
            key = name[len(PREFIX) :].lower()
            if key not in COLUMNS and key not in JOB_FIELDS and key not in DERIVED:
                raise ExportError(f"unknown variable {name} in the {FMT} text")
            if key in env:
                raise ExportError(f"{name} set twice in the {FMT} text")
            env[key] = value
        lay: dict[str, Any] = {}
        for k in COLUMNS:
            if k not in env:
                raise ExportError(f"{PREFIX}{k.upper()} missing from the {FMT} text")
            v = env[k]
            if k in BOOL_FIELDS:
                if v not in ("0", "1"):
                    raise ExportError(f"{PREFIX}{k.upper()}={v!r} is not 0 or 1")
                lay[k] = v == "1"
            elif k in STR_FIELDS:
                lay[k] = v
            else:
                lay[k] = _int(v, k)
        jd: dict[str, Any] = {}
        for k in JOB_FIELDS:
            if k in env:
                if k in STR_JOB_FIELDS:
                    jd[k] = env[k]
                elif k in ("moe_a2a_overlap", "moe_fused_graph"):
                    if env[k] not in ("True", "False"):
                        raise ExportError(f"{PREFIX}{k.upper()}={env[k]!r} is not True or False")
                    jd[k] = env[k] == "True"
                else:
                    jd[k] = _int(env[k], k)
        job = merge_job(header, jd, FMT) if header else Job.from_dict(jd)
        for k in DERIVED:
            if k in env and _int(env[k], k) != getattr(job, k):
                raise ExportError(f"{PREFIX}{k.upper()}={env[k]} disagrees with the job ({getattr(job, k)})")
        return build_layout(lay, FMT), job


def _int(v: str, k: str) -> int:
    from autopar.limits import IntegerTooLong, echo, int_literal

    try:
        return int_literal(v)  # at most limits.MAX_INT_DIGITS digits
    except IntegerTooLong as exc:
        raise ExportError(f"{PREFIX}{k.upper()}: {exc}") from None
    except ValueError:
        raise ExportError(f"{PREFIX}{k.upper()}={echo(v)} is not an integer") from None
