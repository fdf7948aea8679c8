"""Shared parsing of one rendered shell command: ``<program...> --flag value ...`` after comments."""

from __future__ import annotations

import shlex
from typing import Any

from autopar.export.base import ExportError, parse_flags, strip_comments


def split_command(
    text: str,
    program: list[str],
    value_flags: tuple[str, ...],
    bool_flags: tuple[str, ...],
    fmt: str,
    positional: int = 0,
) -> tuple[list[str], dict[str, Any]]:
    """``(positional args, flags)`` of the command in ``text``; the program words must match."""
    tokens = shlex.split(strip_comments(text))
    n = len(program)
    if tokens[:n] != program:
        raise ExportError(
            f"the {fmt} text does not start with {' '.join(program)!r}",
            "parse reads text written by `autopar export`",
        )
    rest = tokens[n:]
    pos, rest = rest[:positional], rest[positional:]
    if len(pos) < positional or any(p.startswith("-") for p in pos):
        raise ExportError(f"the {fmt} command lacks its {positional} positional argument(s)")
    return pos, parse_flags(rest, value_flags, bool_flags, fmt)
