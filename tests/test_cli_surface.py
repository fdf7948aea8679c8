"""The CLI surface: every option documents itself and its default; the set of flags is frozen.

Changing a command's flags must change FROZEN below (torchtitan's test_no_new_cli_options idea):
a new, renamed or removed flag is then a reviewed change.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autopar.cli.main import build_parser

FROZEN = Path(__file__).with_name("cli_flags.json")


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every (sub-)command's parser by its full name, e.g. ``study run``."""
    parser, _ = build_parser()
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, name: str) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if name:
            out[name] = p
        for s in subs:
            for cmd, sp in s.choices.items():
                walk(sp, f"{name} {cmd}".strip())

    walk(parser, "")
    return out


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in p._actions
        if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
    ]


def test_every_option_has_help_that_names_its_default() -> None:
    bad = []
    for name, p in _commands().items():
        fmt = p._get_formatter()
        for a in _options(p):
            text = fmt._expand_help(a) if a.help else ""
            if not text.strip() or not ("(default:" in text or "(required)" in text):
                bad.append(f"{name} {a.option_strings[0]}: {text!r}")
    assert not bad, "options without help or default:\n" + "\n".join(bad)


def test_predict_help_shows_every_default() -> None:
    p = _commands()["predict"]
    fmt = p._get_formatter()
    helps = {a.option_strings[0]: fmt._expand_help(a) for a in _options(p)}
    assert helps["--zero"].endswith("(default: 1)")  # the Layout's one ZeRO default
    assert helps["--dp"].endswith("(default: num_devices/(tp*pp*cp))")
    assert helps["--model"].endswith("(required)") and "megatron" in helps["--framework"]
    assert " ".join(p.format_help().split()).count("(default:") >= len(helps) - 5


def test_no_new_cli_options() -> None:
    surface = {
        name: sorted(s for a in _options(p) for s in a.option_strings) for name, p in _commands().items()
    }
    frozen = json.loads(FROZEN.read_text())
    assert surface == frozen, (
        "the CLI surface changed; if intended, regenerate tests/cli_flags.json "
        "(python -c 'import tests.test_cli_surface as t; t.write_frozen()') and review the diff"
    )


def write_frozen() -> None:
    surface = {
        name: sorted(s for a in _options(p) for s in a.option_strings) for name, p in _commands().items()
    }
    FROZEN.write_text(json.dumps(surface, indent=1, sort_keys=True) + "\n")
