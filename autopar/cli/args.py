"""Argument types and the flag groups shared by the sub-commands (one place for each flag)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line with exit status 2 (its default) and no usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {message} (see `{self.prog} --help`)\n")
        sys.exit(EXIT_USAGE)


def _int_at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"{v} must be >= {low}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def nonneg_int(text: str) -> int:
    return _int_at_least(text, 0)


def add_job_args(p: argparse.ArgumentParser) -> None:
    """Model, cluster and training workload flags (shared by predict, recommend, study, export)."""
    p.add_argument(
        "--model", required=True, help="preset id (see `autopar model --list`) or a HF config.json path"
    )
    p.add_argument("--device", required=True, help="device id, e.g. h100-sxm-80gb, or a device YAML path")
    p.add_argument("--num-devices", type=positive_int, required=True)
    p.add_argument(
        "--devices-per-node",
        type=positive_int,
        default=None,
        help="devices per scale-up domain actually used (default: the device's domain size)",
    )
    p.add_argument("--seq-len", type=positive_int, required=True)
    p.add_argument("--global-batch", type=positive_int, required=True, help="sequences per optimizer step")
    p.add_argument("--calibration", default=None, help="calibration YAML (default: the shipped one)")
    p.add_argument(
        "--lora",
        action="store_true",
        help="LoRA/PEFT fine-tuning: base weights frozen (no weight gradients, sync or optimizer)",
    )


def add_layout_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=positive_int, default=1)
    p.add_argument("--pp", type=positive_int, default=1)
    p.add_argument("--vpp", type=positive_int, default=1)
    p.add_argument("--dp", type=positive_int, default=None, help="default: num_devices/(tp*pp*cp)")
    p.add_argument("--cp", type=positive_int, default=1)
    p.add_argument("--ep", type=positive_int, default=1)
    p.add_argument("--etp", type=positive_int, default=None, help="expert TP (default: tp, or 1 when ep > 1)")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=1)
    p.add_argument("--shard-group", type=nonneg_int, default=0, help="HSDP shard-group size (0 = all dp*cp)")
    p.add_argument(
        "--sp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sequence parallelism (default: on when tp > 1)",
    )
    p.add_argument("--micro-batch", type=positive_int, default=1)
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    p.add_argument(
        "--offload",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="optimizer state and step on the host",
    )
    p.add_argument("--precision", choices=["bf16", "fp8", "fp16", "fp32"], default="bf16")


def job_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return dict(
        model=a.model,
        device=a.device,
        num_devices=a.num_devices,
        devices_per_node=a.devices_per_node,
        seq_len=a.seq_len,
        global_batch=a.global_batch,
        lora=a.lora,
    )


def layout_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return dict(
        tp=a.tp,
        pp=a.pp,
        vpp=a.vpp,
        dp=a.dp,
        cp=a.cp,
        ep=a.ep,
        etp=a.etp,
        zero=a.zero,
        shard_group=a.shard_group,
        sp=a.sp,
        micro_batch=a.micro_batch,
        recompute=a.recompute,
        offload=a.offload,
        precision=a.precision,
    )


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=float) + "\n")
