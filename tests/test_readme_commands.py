"""A fresh clone: every command in the code blocks of the README and the docs pages runs as written.

The shell blocks of ``README.md`` and of every ``docs/*.md`` page (a fence with no language, or
``bash``/``sh``/``console``; ``text`` blocks are output excerpts) are read in that order, and a command
written twice runs once. The tracked files are copied to a temporary directory (a fresh clone: no ``autopar-calibration/``,
no ``autopar-studies.log``, nothing the checkout made) and each command runs there, with ``autopar``
and ``python`` from this interpreter's environment, so nothing is written into the checkout.
Transcript blocks (``$ command`` followed by its output) must end as shown: a shown ``error:`` line
means exit status 2 and that error. The commands too slow for the test suite are listed in
:data:`SKIPPED` with the reason; every entry there must still match a documented command.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = {"", "bash", "sh", "console", "shell"}
BIN = Path(sys.executable).parent

# command prefix -> why it is not run here (times measured on the 2-core development machine)
SKIPPED = {
    "python -m pip install": "installs the package: the suite runs against the installed one already",
    "pip install": "installs the package into the interpreter the suite runs on (it would repoint it at the "
    "test's temporary copy): the suite runs against the installed one already",
    "git clone --branch core_v0.16.1": "downloads Megatron-LM from GitHub (the suite has no network); the slow test "
    "of tests/test_export_launchers.py runs the same check when AUTOPAR_MEGATRON_LM names a checkout",
    "python tools/check_megatron_args.py --megatron-lm Megatron-LM": "needs the Megatron-LM checkout of the "
    "command before it (see there)",
    "python studies/suite_speed.py": "runs the whole default suite (minutes), of which this test is part",
    "mkdocs build --strict": "builds the documentation site: tests/test_docs_site.py builds it with the same "
    "--strict flag into a temporary directory",
    "python -m pytest": "the default test suite (not slow or stress; a few minutes on 2 cores), of which this test is part",
    "autopar calibrate --world-size 4": "microbenchmarks on 4 ranks (~75 s; --quick measured 39-62 s); the predict "
    "command after it runs on the files `calibrate --from-raw` fits from synthetic microbenchmarks",
    "autopar validate --layouts rec.json": "a template: rec.json is the reader's own recommend output and "
    "[--refit new.yaml] is optional; validate runs real training steps (tests/test_validate.py runs it)",
    "autopar validate --study NAME": "a template (NAME, ...) for a study of the reader's",
    "python studies/published_dit.py": "the DiT accuracy study with leave-one-out refits (~6 min)",
    "python studies/whatif_speed.py": "a speed benchmark: 131,950,000 evaluations plus the recommend path",
    "python studies/published_accel.py": "the serving accuracy study with leave-one-out refits (57 s; "
    "with --csv accel_runs_other.csv 15 s)",
    "python studies/accuracy.py --lodo --write-expected-error": "rewrites the shipped expected-error table from the "
    "full accuracy study with its 18 held-out refits (455 s measured; a maintainer's step)",
}


# command prefix -> why it runs in the slow step (`pytest -m slow`, which .ci/run runs) rather than the
# default suite: long studies whose subject other default tests cover (seconds measured on the 2-core
# development machine)
SLOW = {
    "python studies/model_configs.py": "reads all 60 shipped model configs twice over (19-22 s); "
    "tests/test_real_configs.py checks the same configs in the default suite",
    "python studies/cli_speed.py": "a speed benchmark of repeated CLI starts (15 s)",
}


@dataclass
class Command:
    line: int  # where it starts in its page
    text: str  # a shell command, or a whole script
    expect_error: str | None = None  # a transcript's "error: ..." line: exit 2 expected
    page: str = "README.md"  # the page, relative to the repository root

    @property
    def id(self) -> str:
        return f"{self.page}:L{self.line}: {self.text.splitlines()[0][:60]}"


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Continuation lines (a trailing backslash) joined; comments and blank lines dropped."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in lines:
        s = raw.rstrip()
        if not buf:
            start = n
        if s.endswith("\\"):
            buf += s[:-1].strip() + " "
            continue
        buf += s.strip()
        text = re.sub(r"\s+#.*$", "", buf).strip()  # a trailing comment
        buf = ""
        if text and not text.startswith("#"):
            out.append((start, text))
    return out


def page_commands(page: Path) -> list[Command]:
    """The commands of one Markdown page's shell blocks, in order."""
    cmds: list[Command] = []
    block: list[tuple[int, str]] | None = None
    shell = False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            if block is None:
                block = []
                shell = line[3:].strip().lower() in SHELL_FENCES
                continue
            if shell:
                rel = page.relative_to(ROOT).as_posix()
                cmds += [Command(c.line, c.text, c.expect_error, rel) for c in _block_commands(block)]
            block = None
        elif block is not None:
            block.append((n, line))
    return cmds


def documented_commands() -> list[Command]:
    """Every page's commands, README first; a command already met (same text) is not repeated."""
    seen: set[str] = set()
    out: list[Command] = []
    for page in PAGES:
        for c in page_commands(page):
            if c.text not in seen:
                seen.add(c.text)
                out.append(c)
    return out


def _block_commands(block: list[tuple[int, str]]) -> list[Command]:
    texts = [t for _, t in block]
    if any(t.startswith("$ ") for t in texts):  # a transcript: commands and what they printed
        out: list[Command] = []
        i = 0
        while i < len(block):
            n, t = block[i]
            if not t.startswith("$ "):
                i += 1
                continue
            parts = [t[2:]]
            while parts[-1].rstrip().endswith("\\") and i + 1 < len(block):
                i += 1
                parts.append(block[i][1])
            text = " ".join(p.rstrip().removesuffix("\\").strip() for p in parts)
            nxt = block[i + 1][1] if i + 1 < len(block) else ""
            out.append(Command(n, text, nxt if nxt.startswith("error:") else None))
            i += 1
        return out
    if any(t.strip() == "set -euo pipefail" for t in texts):  # a script: run as one
        return [Command(block[0][0], "\n".join(texts))]
    out = []
    for n, text in _logical_lines(block):
        for part in text.split(" && "):
            out.append(Command(n, part.strip()))
    return out


COMMANDS = documented_commands()


def _skip_reason(cmd: Command) -> str | None:
    for prefix, why in SKIPPED.items():
        if cmd.text.startswith(prefix):
            return why
    return None


def _slow(cmd: Command) -> bool:
    return any(cmd.text.startswith(prefix) for prefix in SLOW)


def test_the_docs_have_commands_and_every_skip_names_one() -> None:
    assert len(COMMANDS) >= 15
    for prefix in (*SKIPPED, *SLOW):
        assert any(c.text.startswith(prefix) for c in COMMANDS), f"stale skip or slow entry: {prefix}"
    assert sum(_skip_reason(c) is None for c in COMMANDS) >= 10  # most commands really run
    assert len(PAGES) > 1 and {c.page for c in COMMANDS} >= {"README.md", "docs/quickstart.md"}


def test_the_readme_sets_up_in_two_commands_and_ci_runs_the_second() -> None:
    """The README's first section holds exactly two commands: the main job and the whole test suite."""
    lines = README.read_text().splitlines()
    sections = [n for n, line in enumerate(lines, 1) if line.startswith("## ")]
    assert lines[sections[0] - 1] == "## Set up"
    first = [c for c in page_commands(README) if sections[0] < c.line < sections[1]]
    starts = sorted({c.line for c in first})
    assert len(starts) == 2, starts
    main_job, suite = ([c.text for c in first if c.line == n] for n in starts)
    assert main_job[0].startswith("python -m pip install ") and main_job[1].startswith("autopar recommend ")
    assert suite == [
        'python -m pip install -e ".[dev]"',
        "python -m pytest",
        'python -m pytest -m "slow or stress" -n 0',
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    # the same, quietly
    assert (
        'python -m pip install -q -e ".[dev]" && python -m pytest && python -m pytest -m "slow or stress" -n 0\n'
        in ci
    )


def test_the_readme_stays_short() -> None:
    assert len(README.read_bytes()) < 15_000


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files of the checkout, as a fresh clone has them."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy its tracked files")
    if not (BIN / "autopar").exists():
        pytest.skip("the autopar script is not installed next to this interpreter")
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.split(b"\0")
    d = tmp_path_factory.mktemp("clone")
    for f in files:
        if not f:
            continue
        src = ROOT / os.fsdecode(f)
        if src.is_file():
            dst = d / os.fsdecode(f)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return d


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    env["COLUMNS"] = "160"
    return env


def _prepare(cmd: Command, clone: Path) -> None:
    """The files a command reads that an earlier, skipped documented command would have made."""
    if "autopar-calibration/my-cpu-w4" in cmd.text and not (clone / "autopar-calibration").exists():
        from test_calibrate import synthetic_raw

        raw = clone.parent / "raw-w4.json"
        raw.write_text(json.dumps(synthetic_raw(world=4)))
        r = subprocess.run(
            [str(BIN / "autopar"), "calibrate", "--from-raw", str(raw), "--name", "my-cpu-w4"],
            cwd=clone,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "cmd", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if _slow(c) else []) for c in COMMANDS]
)
def test_documented_command_runs_as_written(cmd: Command, clone: Path) -> None:
    why = _skip_reason(cmd)
    if why is not None:
        pytest.skip(why)
    _prepare(cmd, clone)
    argv = ["bash", "-c", cmd.text] if "\n" in cmd.text else shlex.split(cmd.text)
    if argv[0] == "python":
        argv[0] = sys.executable
    r = subprocess.run(argv, cwd=clone, env=_env(), capture_output=True, text=True, timeout=180)
    if cmd.expect_error is not None:
        assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
        shown = cmd.expect_error.split(":")[:2]  # "error: <what>" (its figures may move with the model)
        assert r.stderr.startswith(":".join(shown)), (cmd.expect_error, r.stderr[-2000:])
    else:
        assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
