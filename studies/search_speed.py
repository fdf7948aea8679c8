"""How fast ``recommend`` is: layouts scored per second, and end-to-end wall time of the CLI.

    python studies/search_speed.py [--reps 3] [--no-cli]

Cases (the issue's benchmark): Llama-3.1-405B on 16,384 h100-sxm-80gb (seq 8192, global batch
2048) and DeepSeek-V3 on 2,048 h100-sxm-80gb (seq 4096, global batch 15,360), with the default
space; plus larger spaces of the same jobs (every micro-batch up to 16, bf16 and fp8, HSDP
shard groups) to show the steady-state scoring rate. "scored/s" counts legal layouts run through
the engine (memory, time, energy) per second of scoring; the CLI time is `autopar recommend
--json` in a fresh process, imports included. The machine's load average is printed because other
processes share its cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CASES = [
    (
        "Llama-3.1-405B / 16,384 H100",
        dict(model="llama-3.1-405b", num_devices=16384, seq_len=8192, global_batch=2048),
    ),
    (
        "DeepSeek-V3 / 2,048 H100",
        dict(model="deepseek-v3", num_devices=2048, seq_len=4096, global_batch=15360),
    ),
]
LARGE = ("micro_batch.max=16", "precision=bf16,fp8", "shard_group=0,8,64")


def _scoring_rate(job, space, workers: int, reps: int) -> tuple[int, float, float]:
    from autopar.coefficients import load_calibration
    from autopar.objectives import Objectives
    from autopar.search.enumerate import enumerate_space
    from autopar.search.recommend import ScoringState, run_scoring

    best_wall, best_cpu = float("inf"), float("inf")
    n = 0
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        en = enumerate_space(job, space)
        state = ScoringState(en, load_calibration(), Objectives(), 5)
        summary, _, _ = run_scoring(state, workers=workers)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = summary.n_legal
        best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
    return n, n / best_wall, n / best_cpu


def _cli_times(kw: dict, reps: int, extra: tuple[str, ...] = ()) -> list[float]:
    args = [
        sys.executable,
        "-m",
        "autopar.cli",
        "recommend",
        "--model",
        kw["model"],
        "--device",
        "h100-sxm-80gb",
        "--num-devices",
        str(kw["num_devices"]),
        "--seq-len",
        str(kw["seq_len"]),
        "--global-batch",
        str(kw["global_batch"]),
        "--json",
        *extra,
    ]
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        r = subprocess.run(args, capture_output=True, text=True)
        out.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise SystemExit(f"recommend failed: {r.stderr}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-cli", action="store_true", help="skip the end-to-end subprocess timings")
    a = ap.parse_args(argv)

    from autopar.prediction import training_job
    from autopar.search.space import load_space

    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (other processes share the cores)"
    )
    print(
        f"{'case':<32} {'space':<9} {'layouts':>10} {'1 proc scored/s':>16} {'(per CPU-s)':>12} "
        f"{'2 procs scored/s':>17}"
    )
    for label, kw in CASES:
        job = training_job(device="h100-sxm-80gb", **kw)
        for sname, space in (("default", load_space("default")), ("large", load_space("default", LARGE))):
            n, rate1, cpu1 = _scoring_rate(job, space, 1, a.reps)
            _, rate2, _ = _scoring_rate(job, space, 2, a.reps)
            print(f"{label:<32} {sname:<9} {n:>10,} {rate1:>16,.0f} {cpu1:>12,.0f} {rate2:>17,.0f}")
    if not a.no_cli:
        print("\nend-to-end `autopar recommend --json` (new process each run, imports included):")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import autopar"], check=True)
        bare = time.perf_counter() - t0
        print(f"  python -c 'import autopar': {bare:.2f} s")
        for label, kw in CASES:
            ts = _cli_times(kw, a.reps)
            print(f"  {label:<32} min {min(ts):.2f} s  median {statistics.median(ts):.2f} s  (target < 3 s)")
    heavy = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, autopar, autopar.search.recommend; "
            "print(sorted(m for m in ('optuna','scipy','ray','torch') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"\nheavy modules imported by `import autopar, autopar.search.recommend`: {heavy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
