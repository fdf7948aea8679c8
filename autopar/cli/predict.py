"""``autopar predict`` (one layout) and ``autopar model`` (one model's normalized spec)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from autopar.cli.args import add_job_args, add_layout_args, job_kwargs, layout_kwargs, print_json, print_names
from autopar.errors import AutoparError


def cmd_predict(a: argparse.Namespace) -> int:
    from autopar.prediction import predict

    pred = predict(**job_kwargs(a), **layout_kwargs(a))
    if a.json:
        print_json(pred.to_dict())
    else:
        from autopar.cli.render import print_prediction

        print_prediction(pred)
    return 0


def cmd_model(a: argparse.Namespace) -> int:
    from autopar.model import list_presets

    if a.list:
        print_names(list_presets(), a.json)
        return 0
    if not a.name:
        raise AutoparError("autopar model needs a preset id or a config.json path", "or pass --list")
    from autopar.model import load_model

    spec = load_model(a.name)
    for w in spec.warnings:  # e.g. a multimodal tower counted apart: never dropped silently
        sys.stderr.write(f"warning: {w}\n")
    d = spec.to_dict()
    if a.json:
        print_json(d)
    else:
        from autopar.cli.render import print_model

        print_model(spec)
    return 0


def register(sub: Any) -> dict[str, Any]:
    p = sub.add_parser("predict", help="memory and step time of one training layout")
    add_job_args(p)
    add_layout_args(p)
    p.add_argument(
        "--json", action="store_true", help="machine-readable output (schema_version, job, layout, figures)"
    )

    p = sub.add_parser("model", help="show a model's normalized spec and parameter counts")
    p.add_argument("name", nargs="?", help="preset id or path to a HF config.json")
    p.add_argument("--list", action="store_true", help="list the presets")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return {"predict": cmd_predict, "model": cmd_model}
