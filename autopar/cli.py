"""The ``autopar`` command line. Every user error exits with status 2 and one line on stderr.

Exit codes a launch script can rely on: 0 success, 2 bad input or nothing feasible (message on
stderr), 1 an internal error (a bug: please report it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from autopar.errors import AutoparError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
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
    p.add_argument("--model", required=True, help="preset id (see `autopar model --list`) or a HF config.json path")
    p.add_argument("--device", required=True, help="device id, e.g. h100-sxm-80gb, or a device YAML path")
    p.add_argument("--num-devices", type=positive_int, required=True)
    p.add_argument("--devices-per-node", type=positive_int, default=None,
                   help="devices per scale-up domain actually used (default: the device's domain size)")
    p.add_argument("--seq-len", type=positive_int, required=True)
    p.add_argument("--global-batch", type=positive_int, required=True, help="sequences per optimizer step")
    p.add_argument("--calibration", default=None, help="calibration YAML (default: the shipped one)")
    p.add_argument("--lora", action="store_true",
                   help="LoRA/PEFT fine-tuning: base weights frozen (no weight gradients, sync or optimizer)")


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
    p.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                   help="sequence parallelism (default: on when tp > 1)")
    p.add_argument("--micro-batch", type=positive_int, default=1)
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    p.add_argument("--offload", action=argparse.BooleanOptionalAction, default=False,
                   help="optimizer state and step on the host")
    p.add_argument("--precision", choices=["bf16", "fp8", "fp16", "fp32"], default="bf16")


def _job_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return dict(model=a.model, device=a.device, num_devices=a.num_devices, devices_per_node=a.devices_per_node,
                seq_len=a.seq_len, global_batch=a.global_batch, lora=a.lora)


def _layout_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return dict(tp=a.tp, pp=a.pp, vpp=a.vpp, dp=a.dp, cp=a.cp, ep=a.ep, etp=a.etp, zero=a.zero,
                shard_group=a.shard_group, sp=a.sp, micro_batch=a.micro_batch, recompute=a.recompute,
                offload=a.offload, precision=a.precision)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=float) + "\n")


def cmd_predict(a: argparse.Namespace) -> int:
    from autopar.prediction import predict

    pred = predict(**_job_kwargs(a), **_layout_kwargs(a), calibration=a.calibration)
    if a.json:
        _print_json(pred.to_dict())
    else:
        from autopar.report import print_prediction

        print_prediction(pred)
    return 0


def cmd_model(a: argparse.Namespace) -> int:
    from autopar.model import list_presets, load_model

    if a.list:
        names = list_presets()
        if a.json:
            _print_json(names)
        else:
            sys.stdout.write("\n".join(names) + "\n")
        return 0
    if not a.name:
        raise AutoparError("autopar model needs a preset id or a config.json path", "or pass --list")
    spec = load_model(a.name)
    d = spec.to_dict()
    if a.json:
        _print_json(d)
    else:
        from autopar.report import print_model

        print_model(spec)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"predict": cmd_predict, "model": cmd_model}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autopar", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"autopar {__import__('autopar').__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("predict", help="memory and step time of one training layout")
    add_job_args(p)
    add_layout_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("model", help="show a model's normalized spec and parameter counts")
    p.add_argument("name", nargs="?", help="preset id or path to a HF config.json")
    p.add_argument("--list", action="store_true", help="list the presets")
    p.add_argument("--json", action="store_true")

    from importlib import import_module

    from autopar.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        COMMANDS.update(import_module(name).register(sub))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except AutoparError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
