"""The torchrun command for autopar's own reference runner (``autopar.runner.train``).

``python -m torch.distributed.run --nnodes N --nproc-per-node K <rendezvous> -m autopar.runner.train
--layout-json '<layout>' --model <model> --seq-len S --global-batch B``. One node uses
``--standalone``; several use a c10d rendezvous at ``$MASTER_ADDR:$MASTER_PORT`` (the same command
on every node). The runner reads the whole layout from ``--layout-json``, so every layout
expressible as a Layout is expressible here. The torchrun flag spellings are torch 2.13's.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from autopar.export.base import (
    Exporter,
    ExportError,
    Job,
    build_layout,
    check_keys,
    flag,
    header_line,
    merge_job,
    parse_flags,
    read_header,
    register,
    shell_lines,
    strip_comments,
    to_int,
)
from autopar.layout import COLUMNS, Layout

FMT = "torchrun"
RUNNER = "autopar.runner.train"
LAUNCHER = ["python", "-m", "torch.distributed.run"]
TORCHRUN_VALUE = ("--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id")
TORCHRUN_BOOL = ("--standalone",)
RUNNER_VALUE = ("--layout-json", "--model", "--seq-len", "--global-batch")


def layout_json(layout: Layout) -> str:
    return json.dumps(layout.model_dump(), sort_keys=True, separators=(",", ":"))


@register
class TorchrunExporter(Exporter):
    name = FMT
    suffix = ".sh"
    description = "torchrun command for autopar's reference runner (autopar.runner.train)"

    def _render(self, layout: Layout, job: Job) -> str:
        a = [" ".join(LAUNCHER), flag("--nnodes", job.nnodes), flag("--nproc-per-node", job.nproc_per_node)]
        if job.nnodes == 1:
            a.append(flag("--standalone"))
        else:
            a += [
                flag("--rdzv-backend", "c10d"),
                '--rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}"',
                flag("--rdzv-id", "autopar"),
            ]
        a += [
            f"-m {RUNNER}",
            flag("--layout-json", layout_json(layout)),
            flag("--model", job.model),
            flag("--seq-len", job.seq_len),
            flag("--global-batch", job.global_batch),
        ]
        return "\n".join(
            [header_line(FMT, job), f"# autopar reference run of layout: {layout.short()}", shell_lines(a)]
        )

    def _parse(self, text: str) -> tuple[Layout, Job]:
        header = read_header(text, FMT, required=False)
        tokens = shlex.split(strip_comments(text))
        if tokens[:3] == LAUNCHER:
            tokens = tokens[3:]
        elif tokens[:1] == ["torchrun"]:
            tokens = tokens[1:]
        else:
            raise ExportError(f"the {FMT} text does not start with {' '.join(LAUNCHER)!r} or 'torchrun'")
        try:
            split = next(i for i in range(len(tokens) - 1) if tokens[i] == "-m" and tokens[i + 1] == RUNNER)
        except StopIteration:
            raise ExportError(f"no '-m {RUNNER}' in the {FMT} text") from None
        launch = parse_flags(tokens[:split], TORCHRUN_VALUE, TORCHRUN_BOOL, FMT)
        run = parse_flags(tokens[split + 2 :], RUNNER_VALUE, (), FMT)
        for k in RUNNER_VALUE:
            if k not in run:
                raise ExportError(f"{k} missing from the {FMT} text")
        try:
            values: Any = json.loads(run["--layout-json"])
        except json.JSONDecodeError as e:
            raise ExportError(f"--layout-json is not JSON in the {FMT} text: {e}") from None
        if not isinstance(values, dict):
            raise ExportError(f"--layout-json is not a JSON object in the {FMT} text")
        check_keys(values, COLUMNS, "--layout-json", FMT)
        layout = build_layout(values, FMT)
        nnodes = to_int(launch.get("--nnodes", 1), "--nnodes", FMT)
        nproc = to_int(launch.get("--nproc-per-node", 1), "--nproc-per-node", FMT)
        native: dict[str, Any] = {
            "model": run["--model"],
            "seq_len": to_int(run["--seq-len"], "--seq-len", FMT),
            "global_batch": to_int(run["--global-batch"], "--global-batch", FMT),
            "num_devices": nnodes * nproc,
        }
        if nnodes > 1 or header is None:
            native["devices_per_node"] = nproc
        return layout, merge_job(header, native, FMT)
