"""The lint and type-check habit, enforced: ruff lint and format on everything, mypy on the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = ["autopar", "tests", "studies"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_clean() -> None:
    r = _run("ruff", "check", *TREES)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format() -> None:
    r = _run("ruff", "format", "--check", *TREES)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow  # ~2 minutes on 2 cores: run by .ci/run's second step (`-m "slow or stress"`)
def test_mypy_package() -> None:
    r = _run("mypy", "--no-error-summary", "autopar")
    assert r.returncode == 0, r.stdout + r.stderr
