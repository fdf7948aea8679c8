"""The wheel: one version source, an SPDX license, every data folder shipped, no setuptools warnings."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import autopar

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_the_data_and_builds_without_warnings(tmp_path: Path) -> None:
    # setuptools writes build/ and *.egg-info beside the sources: build from a copy, so that nothing
    # is written into the checkout (another test, run at the same time, checks exactly that).
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git",
            "build",
            "dist",
            "site",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
            ".benchmarks",
        ),
    )
    out = tmp_path / "wheel"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(out),
            ".",
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    log = r.stdout + r.stderr
    for bad in ("is absent from the `packages` configuration", "SetuptoolsDeprecationWarning"):
        assert bad not in log, [ln for ln in log.splitlines() if bad in ln][:3]
    (wheel,) = out.glob("autopar-*.whl")
    assert wheel.name.startswith(f"autopar-{autopar.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (
        "autopar/presets/llama-3.1-8b.json",
        "autopar/cost_models/devices/h100-sxm-80gb.yaml",
        "autopar/cost_models/calibration/default.yaml",
        "autopar/search_spaces/default.yaml",
        "autopar/py.typed",
        "autopar/cli/__main__.py",
    ):
        assert path in names, path
    meta = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert f"Version: {autopar.__version__}" in text and "License-Expression: Apache-2.0" in text
