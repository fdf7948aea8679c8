"""``autopar predict`` (one layout) and ``autopar model`` (one model's normalized spec)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from autopar.cli.args import add_job_args, add_layout_args, job_kwargs, layout_kwargs, print_json, print_names
from autopar.errors import AutoparError, UnsupportedArchitecture


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
    if a.name and a.config:
        raise AutoparError("pass the model once: a NAME or --config PATH, not both")
    name = a.config or a.name
    if not name:
        raise AutoparError("autopar model needs a preset id or a config.json path", "or pass --list")
    from autopar.model import load_model, raw_config

    raw = raw_config(name)  # the config.json as a dict (bad files refused here, before any work)
    meta, how = None, "not asked (--reader fields)"
    if a.reader != "fields" and raw is not None:
        from autopar.hf_meta import meta_count

        meta, how = meta_count(raw)
        if meta is None and a.reader == "transformers":
            raise AutoparError(f"{name}: no transformers count: {how}", "use --reader auto or fields")
    try:
        spec = load_model(name, own_code=a.reader != "fields")
    except UnsupportedArchitecture as e:
        if meta is None or a.reader != "transformers":
            raise  # refused the same way with or without the optional extra
        # asked for the library's count of what autopar cannot cost: the count, and why not costed
        sys.stderr.write(f"warning: not costed by autopar: {e.message}\n")
        if a.json:
            print_json({"name": str(name), "reader": "transformers", "meta": meta.to_dict(), "spec": None})
        else:
            from autopar.cli.render import print_meta

            print_meta(str(name), meta, how, None)
        return 0
    for w in spec.warnings:  # e.g. a multimodal tower counted apart: never dropped silently
        sys.stderr.write(f"warning: {w}\n")
    d = spec.to_dict()
    if a.json:
        from autopar.own_code import OWN_CODE

        own = OWN_CODE in spec.source  # the field reader refused it; read from its class's modules
        d["reader"] = "own-code" if own else "fields+transformers" if meta else "fields"
        d["meta"] = meta.to_dict() if meta else None
        d["meta_note"] = how
        print_json(d)
    else:
        from autopar.cli.render import print_meta, print_model

        print_model(spec)
        print_meta(spec.name, meta, how, spec)
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
    p.add_argument("--config", metavar="PATH", help="path to a HF config.json (or its folder); same as NAME")
    p.add_argument(
        "--reader",
        choices=("auto", "fields", "transformers"),
        default="auto",
        help="auto: also count the parameters with the model's transformers class on the meta device "
        "when the optional extra autopar[models] is installed; fields: autopar's field reader only; "
        "transformers: require the transformers count, and show it even for a model autopar refuses "
        "to cost (default: auto)",
    )
    p.add_argument("--list", action="store_true", help="list the presets")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return {"predict": cmd_predict, "model": cmd_model}
