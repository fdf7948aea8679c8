"""``autopar completion bash|zsh``: the shell completion script (generated from the parser by shtab)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> dict[str, Any]:
    p = sub.add_parser(
        "completion",
        help="print the bash or zsh completion script",
        description="Print a completion script for every command and option. bash: save it as "
        "~/.local/share/bash-completion/completions/autopar (or source it); zsh: save it as _autopar "
        "in a directory of your $fpath.",
    )
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell")
    return {"completion": cmd_completion}


def cmd_completion(a: argparse.Namespace) -> int:
    import shtab

    from autopar.cli.main import build_parser

    parser, _ = build_parser()
    sys.stdout.write(shtab.complete(parser, shell=a.shell))
    return 0
