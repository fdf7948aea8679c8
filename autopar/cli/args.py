"""Argument types and the flag groups shared by the sub-commands (one place for each flag)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from types import UnionType
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from autopar.limits import (  # noqa: F401 - the caps commands import from here
    MAX_LOCAL_RANKS,
    MAX_MESSAGE_CHARS,
    MAX_SEED,
    MAX_TOP,
    MAX_WORKERS,
    IntegerTooLong,
    echo,
    int_literal,
    terminal_safe,
)

if TYPE_CHECKING:  # pydantic and the job models load with the first command that builds flags from them
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo

    from autopar.job import Job

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line with exit status 2 (its default) and no usage dump;
    every option's help shows its default (:class:`DefaultsFormatter`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {terminal_safe(message, MAX_MESSAGE_CHARS)} (see `{self.prog} --help`)\n")
        sys.exit(EXIT_USAGE)


def parse_int(text: str) -> int:
    """An integer flag's value (:func:`autopar.limits.int_literal`: at most MAX_INT_DIGITS digits)."""
    try:
        return int_literal(text)
    except IntegerTooLong as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{echo(text)} is not an integer") from None


def _int_at_least(text: str, low: int) -> int:
    v = parse_int(text)
    if v < low:
        raise argparse.ArgumentTypeError(f"{v} must be >= {low}")
    return v


def track_given(p: argparse.ArgumentParser, dests: Any) -> None:
    """Record on the namespace (``_given``, a set) which of ``dests`` the command line set.

    argparse cannot tell ``--tp 1`` from the default 1; a command that must refuse flags it would
    otherwise ignore (``export --from-json``) asks this set instead.
    """
    for action in p._actions:
        if action.dest in dests and action.option_strings:
            base = type(action)

            def call(
                self: Any, parser: Any, namespace: Any, values: Any, option_string: Any = None, _b=base
            ) -> None:
                given = getattr(namespace, "_given", None)
                if given is None:
                    given = set()
                    namespace._given = given
                given.add(self.dest)
                _b.__call__(self, parser, namespace, values, option_string)

            action.__class__ = type(f"Tracked{base.__name__}", (base,), {"__call__": call})


def positive_float(text: str) -> float:
    """A finite number > 0 (``nan``, ``inf``, 0 and negatives refused)."""
    return _finite(text, lambda v: v > 0, "> 0")


def nonneg_float(text: str) -> float:
    """A finite number >= 0."""
    return _finite(text, lambda v: v >= 0, ">= 0")


def _finite(text: str, ok: Callable[[float], bool], rule: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{echo(text)} is not a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{echo(text)} must be a finite number")
    if not ok(v):
        raise argparse.ArgumentTypeError(f"{v:g} must be {rule}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def int_range(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (a cap keeps a typo from asking for a billion)."""

    def parse(text: str) -> int:
        v = _int_at_least(text, low)
        if v > high:
            raise argparse.ArgumentTypeError(f"{v} must be <= {high:,}")
        return v

    parse.__name__ = "int"
    return parse


def nonneg_int(text: str) -> int:
    return _int_at_least(text, 0)


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, or says the option is required."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or "(default:" in text
            or "%(default)" in text
            or action.default is argparse.SUPPRESS
        ):
            return text
        if action.required:
            return f"{text} (required)"
        return f"{text} (default: %(default)s)"


# ------------------------------------------------------------------ flags generated from fields
def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True)."""
    args = [t for t in get_args(annotation) if t is not type(None)]
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
        return args[0], True
    return annotation, False


def _bounds(info: FieldInfo) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in info.metadata:
        for k in ("ge", "gt", "le", "lt"):
            v = getattr(m, k, None)
            if v is not None:
                out[k] = v
    return out


def _number(kind: type, bounds: dict[str, float]) -> Callable[[str], Any]:
    """An argparse type that parses ``kind`` and checks the field's bounds."""
    checks = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b)}
    checks.update({"le": ("<=", lambda v, b: v <= b), "lt": ("<", lambda v, b: v < b)})

    def parse(text: str) -> Any:
        if kind is int:
            v = parse_int(text)
        else:
            try:
                v = kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{echo(text)} is not a number") from None
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{v} must be finite")
        for k, b in bounds.items():
            sym, ok = checks[k]
            if not ok(v, b):
                raise argparse.ArgumentTypeError(f"{v} must be {sym} {b}")
        return v

    parse.__name__ = kind.__name__
    return parse


def add_field_args(
    p: Any,
    model: type[BaseModel],
    names: Sequence[str],
    *,
    required: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
    helps: Mapping[str, str] | None = None,
) -> None:
    """One flag per field: ``--field-name``, the field's type, bounds, choices and description.

    A field without a default is a required flag unless ``defaults`` gives one; ``defaults``
    (e.g. None for a derived value) and ``helps`` (the text of that default) override the field.
    """
    defaults, helps = dict(defaults or {}), dict(helps or {})
    for name in names:
        info = model.model_fields[name]
        ann, _ = _unwrap(info.annotation)
        flag = "--" + name.replace("_", "-")
        default = defaults[name] if name in defaults else (None if info.is_required() else info.default)
        text = (info.description or name.replace("_", " ")) + helps.get(name, "")
        kw: dict[str, Any] = {"default": default, "help": text, "dest": name}
        if name in required or (info.is_required() and name not in defaults):
            kw["required"] = True
        if get_origin(ann) is Literal:  # the choices ARE the Literal's values
            kw["choices"] = list(get_args(ann))
            kw["type"] = type(kw["choices"][0])
        elif ann is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif ann in (int, float):
            kw["type"] = _number(ann, _bounds(info))
        elif ann is not str:
            raise TypeError(f"no flag type for field {model.__name__}.{name}: {ann!r}")
        p.add_argument(flag, **kw)


JOB_TOP_FIELDS = ("model",)
JOB_TRAINING_FIELDS = (
    "seq_len",
    "global_batch",
    "lora",
    "moe_dispatcher",
    "moe_a2a_overlap",
    "moe_fused_graph",
    "pipeline_schedule",
    "attention_kernel",
    "tp_comm_overlap",
)


def add_job_args(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """Model, cluster and training workload flags, generated from :mod:`autopar.job`.

    ``optional``: no flag is required (``export``, where ``--from-json`` carries the job).
    """
    from autopar.job import ClusterSpec, Job, TrainingWorkload

    names: list[tuple[type[BaseModel], tuple[str, ...]]] = [
        (Job, JOB_TOP_FIELDS),
        (ClusterSpec, tuple(ClusterSpec.model_fields)),
        (TrainingWorkload, JOB_TRAINING_FIELDS),
    ]
    for model, fields in names:
        req = {f: None for f in fields if model.model_fields[f].is_required()} if optional else {}
        add_field_args(
            p, model, fields, defaults=req, helps={f: " (required unless --from-json)" for f in req}
        )
    add_field_args(p, Job, ("framework", "memory_headroom", "calibration", "allow_long_context"))


def add_layout_args(p: argparse.ArgumentParser) -> None:
    """One flag per :class:`~autopar.layout.Layout` field (grad_accum is derived from the batch)."""
    from autopar.layout import DERIVED_DEFAULTS, LAYOUT_ARGS, Layout

    add_field_args(
        p,
        Layout,
        LAYOUT_ARGS,
        defaults={k: None for k in DERIVED_DEFAULTS},
        helps={k: f" (default: {v})" for k, v in DERIVED_DEFAULTS.items()},
    )


def job_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    """The flat job keywords of the API (the field names) from parsed flags."""
    from autopar.job import ClusterSpec

    names = (
        *JOB_TOP_FIELDS,
        *ClusterSpec.model_fields,
        *JOB_TRAINING_FIELDS,
        "framework",
        "memory_headroom",
        "calibration",
        "allow_long_context",
    )
    return {k: getattr(a, k) for k in names if hasattr(a, k)}


def job_from_args(a: argparse.Namespace) -> Job:
    from autopar.job import Job

    return Job.from_flat(kind="training", **job_kwargs(a))


def layout_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    from autopar.layout import LAYOUT_ARGS

    return {k: getattr(a, k) for k in LAYOUT_ARGS}


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=float) + "\n")


def print_names(names: list[str], as_json: bool) -> None:
    """A list of ids (``--list``): one per line, or a JSON array."""
    if as_json:
        print_json(names)
    else:
        sys.stdout.write("\n".join(names) + "\n")
