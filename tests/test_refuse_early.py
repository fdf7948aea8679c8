"""Refusals come before any long work and create nothing: `calibrate` and studies/cpu_validation.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from autopar.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def _no_measuring(*a: object, **k: object) -> None:
    raise AssertionError("the microbenchmarks ran before the refusal")


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """cwd is an empty directory; running the microbenchmarks fails the test."""
    import autopar.calibration.microbench as mb

    monkeypatch.setattr(mb, "run_microbenchmarks", _no_measuring)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--name", "a" * 300], "300 bytes long"),
        (["--name", "é" * 150], "300 bytes long"),
        (["--name", "x/y"], "not a plain file name"),
        (["--name", "ok", "--out-dir", "missing"], "does not exist"),
        (["--name", "ok", "--save-raw", "nodir/raw.json"], "does not exist"),
    ],
)
def test_calibrate_refuses_before_measuring_and_creates_nothing(
    guarded: Path, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", "--quick", "--run-device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert os.listdir(guarded) == []  # no autopar-calibration/, no temporary file


def test_a_name_at_the_limit_makes_files_that_can_exist(tmp_path: Path) -> None:
    from autopar.calibration.calibrate import MAX_NAME_BYTES, check_calibration_outputs

    name = "n" * MAX_NAME_BYTES
    check_calibration_outputs(name, tmp_path, create_out_dir=False)
    for suffix in (".device.yaml", ".yaml", "-probes.yaml"):  # and their temporaries (+26 bytes)
        (tmp_path / f".{name}{suffix}.abcdefgh.tmp").write_text("")


def _cpu_validation():
    spec = importlib.util.spec_from_file_location("cpu_validation", ROOT / "studies" / "cpu_validation.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--json", "nodir/out.json"], "--json nodir/out.json: directory"),
        (["--out-dir", "missing"], "--out-dir missing does not exist"),
        (["--name", "a" * 201], "201 bytes long"),
        (["--from-raw", "raw.json"], "--from-raw raw.json does not exist"),
        (["--json", "same.json", "--raw", "same.json"], "is the same file as"),
        (["--warmup", "6", "--steps", "6"], "--warmup 6"),
    ],
)
def test_cpu_validation_refuses_before_measuring(
    guarded: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    needle: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mod = _cpu_validation()
    monkeypatch.setattr(mod, "run_microbenchmarks", _no_measuring)
    assert mod.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert os.listdir(guarded) == []


def test_cpu_validation_from_a_fresh_directory_gets_past_its_checks(guarded: Path) -> None:
    """The docs' `python studies/cpu_validation.py` (docs/accuracy.md): the default ./autopar-calibration need not
    exist (it is made once the fit succeeded); checking creates nothing."""
    mod = _cpu_validation()
    a = mod.argparse.Namespace(out_dir=None, name="cpu-gloo-w4", json="out.json", raw=None, from_raw=None)
    out, make = mod.check_outputs(a)
    assert make and out == Path("autopar-calibration") and os.listdir(guarded) == []
