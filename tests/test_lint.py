"""The lint and type-check habit, enforced: ruff on everything, mypy on the engine core."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ["autopar/layout.py", "autopar/memory.py", "autopar/latency.py", "autopar/collectives.py",
        "autopar/engine.py", "autopar/prediction.py", "autopar/calibration.py", "autopar/legality.py",
        "autopar/energy.py", "autopar/model.py", "autopar/hardware.py", "autopar/fit.py"]


def test_ruff_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "autopar", "tests", "studies"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_core() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", *CORE], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
