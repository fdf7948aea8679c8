"""The fast CLI start: ``--version`` imports no model code, a command builds only its own parser,
and that parser parses and answers exactly as the full one does."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from importlib import import_module

from autopar.cli.commands import COMMAND_MODULES, COMMANDS
from autopar.cli.main import build_parser, command_of, main

RECOMMEND = [
    "recommend",
    "--model",
    "llama-3.1-8b",
    "--device",
    "h100-sxm-80gb",
    "--num-devices",
    "16",
    "--seq-len",
    "4096",
    "--global-batch",
    "64",
    "--top",
    "3",
    "--json",
]


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_command_table_matches_the_modules() -> None:
    assert set(COMMANDS.values()) == set(COMMAND_MODULES)
    for module in COMMAND_MODULES:
        parser, handlers = build_parser(next(c for c, m in COMMANDS.items() if m == module))
        assert {c for c, m in COMMANDS.items() if m == module} <= set(handlers)
        owned = set(import_module(module).register(argparse.ArgumentParser().add_subparsers()))
        assert owned == {c for c, m in COMMANDS.items() if m == module}, module
    full, handlers = build_parser()
    assert set(_commands(full)) == set(COMMANDS) == set(handlers)


def test_command_of() -> None:
    assert command_of(["recommend", "--model", "x"]) == "recommend"
    assert command_of(["--quiet"]) is None
    assert command_of(["nonsense", "recommend"]) is None  # argparse names the bad choice
    assert command_of(["--", "recommend"]) is None


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


def test_one_command_parser_answers_as_the_full_one() -> None:
    """The same namespace, and the same search result, from the one-module parser and the full one."""
    lazy, lazy_handlers = build_parser("recommend")
    full, full_handlers = build_parser()
    a, b = lazy.parse_args(RECOMMEND), full.parse_args(RECOMMEND)
    assert vars(a) == vars(b)
    out_full = io.StringIO()
    with contextlib.redirect_stdout(out_full):
        assert full_handlers["recommend"](b) == 0
    rc, out_lazy = _run(RECOMMEND)
    assert rc == 0
    left, right = json.loads(out_lazy), json.loads(out_full.getvalue())
    left.pop("elapsed_s"), right.pop("elapsed_s")  # wall-clock time differs run to run
    assert left["results"] and left == right


def test_version_imports_no_model_code() -> None:
    code = (
        "import sys; from autopar.cli import main; rc = main(['--version']); "
        "print(rc, sorted(m for m in ('pydantic', 'numpy', 'rich', 'autopar.job') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    version, result = out.splitlines()
    assert version.startswith("autopar ")
    assert result == "0 []"


def test_version_matches_argparse() -> None:
    """The fast path prints what argparse's version action prints."""
    full, _ = build_parser()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        full.parse_args(["--version"])
    assert _run(["--version"]) == (0, buf.getvalue())


# Every module the CLI could have loaded before the fast start: all command modules, every
# exporter, the report, serving, what-if and the study backends (the "before" import state).
_EAGER = (
    "import sys; from autopar.cli.main import build_parser, main; build_parser(); "
    "import autopar.export, autopar.report, autopar.serving.search, autopar.whatif.compare, "
    "autopar.search.study; sys.exit(main(sys.argv[1:]))"
)


def _json_of(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    data.pop("elapsed_s")  # wall-clock time differs run to run
    return data


def test_recommend_json_same_lazy_and_eager() -> None:
    """`autopar recommend --json` from a fresh process, which imports only what the command needs,
    prints what it prints with every module of the package loaded first: lazy imports change no
    figure, ranking or note."""
    lazy = _json_of([sys.executable, "-m", "autopar", *RECOMMEND])
    eager = _json_of([sys.executable, "-c", _EAGER, *RECOMMEND])
    assert lazy["results"] and lazy == eager


def test_recommend_json_loads_no_report_or_other_command() -> None:
    """`recommend --json` imports neither the HTML report nor another command's module."""
    code = (
        "import sys, io, contextlib; from autopar.cli import main; buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf): rc = main(sys.argv[1:])\n"
        "print(rc, sorted(m for m in sys.modules if m in ('autopar.report', 'autopar.serving', "
        "'autopar.whatif', 'autopar.search.study', 'autopar.cli.serve', 'autopar.cli.study', "
        "'autopar.cli.whatif', 'autopar.cli.dit')))"
    )
    out = subprocess.run([sys.executable, "-c", code, *RECOMMEND], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0 []"
