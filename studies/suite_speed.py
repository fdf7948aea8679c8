"""How long the test suite takes: the default suite (`python -m pytest`, parallel, not slow) and,
with ``--slow``, the second step of ``.ci/run`` (``-m "slow or stress" -n 0``); with ``--serial``
also the whole suite in one process, as it ran before xdist (the baseline of the ratio).

    python studies/suite_speed.py [--slow] [--serial] [--durations 30]

Printed: each run's wall time, its pytest summary line, the slowest tests (``--durations``), the
machine's load average before and after (other processes share its cores, so quote the ratios of
one invocation) and the ratio of the serial run to the default suite.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "default suite (python -m pytest)": [],
    "slow step (.ci/run step 2)": ["-m", "slow or stress", "-n", "0"],
    "serial, everything (before xdist)": ["-m", "slow or not slow", "-n", "0"],
}


def _run(name: str, extra: list[str], durations: int) -> float:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--durations={durations}", *extra]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = r.stdout.splitlines()
    summary = next((ln for ln in reversed(lines) if re.search(r"\d+ (passed|failed)", ln)), "(no summary)")
    print(
        f"== {name}: {wall:.0f} s wall (exit {r.returncode}; load average {load:.1f} -> {os.getloadavg()[0]:.1f})"
    )
    print(f"   {' '.join(cmd[1:])}")
    print(f"   {summary.strip('= ')}")
    for ln in lines:
        if ln.startswith(("FAILED ", "ERROR ")):
            print(f"   {ln}")
    start = next((i for i, ln in enumerate(lines) if "slowest" in ln and "durations" in ln), None)
    if start is not None:
        for ln in lines[start + 1 : start + 1 + durations]:
            if ln.strip():
                print(f"   {ln}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", action="store_true", help="also run .ci/run's slow step")
    ap.add_argument("--serial", action="store_true", help="also run everything in one process (baseline)")
    ap.add_argument("--durations", type=int, default=30, help="slowest tests to list per run (default 30)")
    a = ap.parse_args()
    print(f"{os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    names = list(RUNS)
    chosen = [names[0]] + ([names[1]] if a.slow else []) + ([names[2]] if a.serial else [])
    walls = {n: _run(n, RUNS[n], a.durations) for n in chosen}
    if a.serial:
        print(f"serial / default suite: {walls[names[2]] / walls[names[0]]:.1f}x")


if __name__ == "__main__":
    main()
