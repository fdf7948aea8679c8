"""The autopar command line: every user error exits with status 2 and one line on stderr.

Exit codes a launch script can rely on: 0 success, 2 bad input or nothing feasible (message on
stderr), 1 an internal error (a bug: please report it). The help text is in autopar.cli.help.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

from autopar.cli.args import EXIT_USAGE, Parser
from autopar.cli.commands import COMMAND_MODULES, COMMANDS
from autopar.errors import AutoparError
from autopar.limits import MAX_MESSAGE_CHARS, terminal_safe

Handler = Callable[[argparse.Namespace], int]


def _version() -> str:
    from autopar import __version__

    return f"autopar {__version__}"


def command_of(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names, if it names one: the first argument that is not an option
    (the top-level parser has no option that takes a value)."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    """The top-level parser and the handler of every sub-command; with ``command``, only the
    module that registers that command is imported and built (a fast start)."""
    parser = Parser(prog="autopar", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    handlers: dict[str, Handler] = {}
    for name in (COMMANDS[command],) if command is not None else COMMAND_MODULES:
        handlers.update(import_module(name).register(sub))
    from autopar.cli.help import decorate

    decorate(parser)
    return parser, handlers


def _tolerant_streams() -> None:
    """A character the terminal's encoding cannot show (``PYTHONIOENCODING=ascii`` and a name with
    an accent, a file name that is not UTF-8) is written as an escape instead of raising."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "strict") in ("strict", "surrogateescape"):
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # pragma: no cover - a stream that cannot change
                pass


def main(argv: Sequence[str] | None = None) -> int:
    _tolerant_streams()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = command_of(argv)
    if command is None and argv and argv[0] == "--version":
        sys.stdout.write(_version() + "\n")  # what argparse's version action prints, without the parsers
        return 0
    parser, handlers = build_parser(command)
    args = parser.parse_args(argv)
    from autopar import progress

    progress.set_quiet(getattr(args, "quiet", False))
    try:
        from autopar.files import check_distinct, command_paths

        check_distinct(*command_paths(args))  # no output replaces an input or another output
        return handlers[args.command](args)
    except AutoparError as exc:
        # one line: a path's newline is escaped; a 5,000-character value it quotes is cut in the middle
        text = terminal_safe(exc.message, MAX_MESSAGE_CHARS)
        if exc.hint:
            text += f" ({terminal_safe(exc.hint, MAX_MESSAGE_CHARS)})"
        sys.stderr.write(f"error: {text}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
