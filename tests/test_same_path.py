"""No output of a command replaces one of its inputs or another of its outputs (autopar.files.check_distinct,
run by the CLI before every handler): same name, symlink or hard link."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import pytest

from autopar.cli.main import build_parser, main
from autopar.files import OUTPUT_DESTS, check_distinct, command_paths

PRESETS = Path(__file__).resolve().parents[1] / "autopar" / "presets"
JOB = ["--device", "h100-sxm-80gb", "--num-devices", "8", "--seq-len", "4096", "--global-batch", "32"]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for n in needles:
        assert n in err[0], err[0]
    return err[0]


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    shutil.copy(PRESETS / "llama-3.1-8b.json", "model.json")
    Path("plan.json").write_text('{"results": []}\n')
    Path("space.yaml").write_text("name: mine\n")
    Path("cal.yaml").write_text("schema: autopar.calibration/v1\n")
    Path("sweep.yaml").write_text("name: s\n")
    Path("layouts.json").write_text("[]\n")
    Path("raw.json").write_text("{}\n")
    Path("autopar-studies.log").write_text("")
    os.symlink("plan.json", "plan-link.json")
    os.link("model.json", "model-hard.json")
    return tmp_path


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


CASES = [
    # (argv, words the one-line refusal must hold)
    (["recommend", "--model", "model.json", *JOB, "--html", "model.json"], ["--html model.json", "--model"]),
    (
        ["recommend", "--model", "model.json", *JOB, "--html", "model-hard.json"],
        ["(through a link)", "--model"],
    ),
    (
        ["recommend", "--model", "llama-3.1-8b", *JOB, "--space", "space.yaml", "--html", "space.yaml"],
        ["--space"],
    ),
    (
        ["recommend", "--model", "llama-3.1-8b", *JOB, "--calibration", "cal.yaml", "--html", "cal.yaml"],
        ["--calibration"],
    ),
    (
        [
            "recommend",
            "--model",
            "llama-3.1-8b",
            *JOB,
            "--export",
            "megatron",
            "--out",
            "x.html",
            "--html",
            "x.html",
        ],
        ["another output", "--out x.html"],
    ),
    (
        ["export", "--format", "megatron", "--from-json", "plan.json", "--out", "plan.json"],
        ["--from-json plan.json"],
    ),
    (
        ["export", "--format", "megatron", "--from-json", "plan-link.json", "--out", "plan.json"],
        ["(through a link)"],
    ),
    (
        ["export", "--format", "megatron", "--from-json", "plan.json", "--out", "plan-link.json"],
        ["--out plan-link.json"],
    ),
    (["predict", "--model", "model.json", *JOB, "--tp", "1"], None),  # no output: nothing to refuse here
    (
        [
            "serve",
            "--model",
            "model.json",
            "--device",
            "h100-sxm-80gb",
            "--num-devices",
            "8",
            "--isl",
            "128",
            "--osl",
            "16",
            "--html",
            "model.json",
        ],
        ["--model"],
    ),
    (["sweep", "sweep.yaml", "--out", "sweep.yaml"], ["FILE sweep.yaml"]),
    (["sweep", "sweep.yaml", "--out", "t.csv", "--html", "t.csv"], ["another output"]),
    (
        [
            "compare",
            "--model",
            "llama-3.1-8b",
            "--devices",
            "h100-sxm-80gb",
            "--num-devices",
            "8",
            "--seq-len",
            "1024",
            "--batch",
            "1",
            "--out",
            "r",
            "--html",
            "r.csv",
        ],
        ["--html r.csv", "--out r.csv"],
    ),
    (["study", "show", "--name", "s", "--html", "autopar-studies.log"], ["--storage autopar-studies.log"]),
    (["validate", "--layouts", "layouts.json", "--json", "layouts.json"], ["--layouts"]),
    (["validate", "--layouts", "layouts.json", "--json", "o.json", "--refit", "o.json"], ["another output"]),
    (
        ["validate", "--layouts", "layouts.json", "--refit", "cal.yaml", "--calibration", "cal.yaml"],
        ["--calibration"],
    ),
    (["calibrate", "--from-raw", "raw.json", "--save-raw", "raw.json"], ["--from-raw"]),
    (
        ["calibrate", "--from-raw", "raw.json", "--name", "x", "--out-dir", ".", "--save-raw", "x.yaml"],
        ["--out-dir"],
    ),
]


@pytest.mark.parametrize(
    "argv, needles", CASES, ids=lambda v: " ".join(v[:1]) if isinstance(v, list) else None
)
def test_an_output_on_an_input_or_another_output_is_refused_before_any_work(
    files: Path, argv: list[str], needles: list[str] | None, capsys: pytest.CaptureFixture[str]
) -> None:
    before, names = _snapshot(files), sorted(os.listdir(files))
    parser, _ = build_parser()
    ins, outs = command_paths(parser.parse_args(argv))
    if needles is None:
        check_distinct(ins, outs)  # nothing to refuse
        return
    _refused(argv, capsys, "is the same file as", *needles)
    assert _snapshot(files) == before  # nothing written, nothing replaced
    assert sorted(os.listdir(files)) == names  # nothing created (no temporary file, no directory)


def test_distinct_paths_pass_and_a_missing_input_is_not_a_file(files: Path) -> None:
    check_distinct([("--model", "model.json")], [("--html", "report.html"), ("--out", "sub/../other.txt")])
    check_distinct([("--model", "llama-3.1-8b")], [("--html", "llama-3.1-8b")])  # a preset id, not a file
    with pytest.raises(Exception, match="same file"):
        check_distinct([], [("--out", "a.txt"), ("--html", "./a.txt")])  # two new outputs on one path


def _actions(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _actions(sp, (*path, name))
        else:
            yield path, a


def test_every_flag_that_writes_a_file_is_checked() -> None:
    """A new output flag must be added to files.OUTPUT_DESTS (or it would escape the check)."""
    parser, _ = build_parser()
    missed = []
    for path, a in _actions(parser):
        if not a.option_strings or a.nargs == 0 or isinstance(a, argparse._HelpAction):
            continue
        h = (a.help or "").lower()
        writes = any(w in h for w in ("write", "also save", "report (plots"))
        if writes and a.dest not in OUTPUT_DESTS and a.dest != "out_dir":
            missed.append(f"{' '.join(path)} {a.option_strings[-1]}")
    assert not missed, missed
