"""How fast the ``autopar`` command starts: ``--version``, ``--help`` and the 405B ``recommend``.

    python studies/cli_speed.py [--reps 7] [--root DIR]

Each command runs ``--reps`` times in a fresh process (``python -m autopar ...`` from ``--root``,
default: this checkout; point it at another checkout to measure a baseline) after one warm-up run
that writes the bytecode caches (the child runs without ``PYTHONDONTWRITEBYTECODE``, as an
installed package does). Printed per command: the median wall time, the median CPU time of the
child (user + system: steadier than wall time on a shared machine) and both as a ratio of
``python -c pass`` measured the same way. Two floor rows follow: the libraries ``recommend``
needs imported alone, and the same 405B search through the Python API (what the CLI adds is
the difference). The machine's load average is printed because other
processes share its cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RECOMMEND = (
    "recommend --model llama-3.1-405b --device h100-sxm-80gb --num-devices 16384 --seq-len 8192 "
    "--global-batch 2048"
)
# The floor under ``recommend``: the third-party modules its search and report cannot do without
# (numpy arrays, pydantic models - the first model built loads most of pydantic -, rich tables,
# YAML cost data), and the same search through the Python API (no parser, no table).
LIBRARIES = (
    "import numpy, pydantic, rich.console, rich.table, yaml\nclass M(pydantic.BaseModel):\n    x: int = 0"
)
API = (
    "import autopar; autopar.recommend(model='llama-3.1-405b', device='h100-sxm-80gb', "
    "num_devices=16384, seq_len=8192, global_batch=2048, progress=False)"
)
COMMANDS = [
    ("python -c pass", ["-c", "pass"]),
    ("autopar --version", ["-m", "autopar", "--version"]),
    ("autopar --help", ["-m", "autopar", "--help"]),
    ("autopar recommend 405B/16,384 H100", ["-m", "autopar", *RECOMMEND.split()]),
    ("floor: numpy+pydantic+rich+yaml", ["-c", LIBRARIES]),
    ("floor: autopar.recommend() 405B (API)", ["-c", API]),
]


def _run(args: list[str], root: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7, help="runs per command (default 7)")
    ap.add_argument(
        "--root", type=Path, default=Path(__file__).resolve().parent.parent, help="checkout to measure"
    )
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    print(f"checkout {a.root}; python {sys.version.split()[0]}; load average {os.getloadavg()[0]:.2f}")
    rows = []
    for name, args in COMMANDS:
        _run(args, a.root, env)  # warm-up: bytecode caches, page cache
        runs = [_run(args, a.root, env) for _ in range(a.reps)]
        rows.append((name, statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)))
    base_wall, base_cpu = rows[0][1], rows[0][2]
    print(f"{'command':38} {'wall s':>8} {'x pass':>7} {'cpu s':>8} {'x pass':>7}   (medians of {a.reps})")
    for name, wall, cpu in rows:
        print(f"{name:38} {wall:8.3f} {wall / base_wall:7.1f} {cpu:8.3f} {cpu / base_cpu:7.1f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
