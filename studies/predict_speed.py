"""How fast `autopar predict` answers: in-process latency and end-to-end CLI wall time.

    python studies/predict_speed.py [--repeat 5]

Prints the median in-process `autopar.predict` call (model, device and calibration cached after the
first call), the end-to-end `autopar predict --json` wall time (process start included) and, for
scale, the wall time of a bare `python -c pass` measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

ARGS = dict(
    model="llama-3.1-70b",
    device="h100-sxm-80gb",
    num_devices=512,
    seq_len=8192,
    global_batch=512,
    tp=8,
    pp=4,
    vpp=5,
    micro_batch=1,
    recompute="selective",
)


def wall(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    import autopar

    t = time.perf_counter()
    autopar.predict(**ARGS)
    first = time.perf_counter() - t
    calls = []
    for _ in range(50):
        t = time.perf_counter()
        autopar.predict(**ARGS)
        calls.append(time.perf_counter() - t)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ARGS.items()]
    cli = wall([sys.executable, "-m", "autopar.cli", "predict", *flags, "--json"], a.repeat)
    bare = wall([sys.executable, "-c", "pass"], a.repeat)
    print(
        f"in-process predict: first call {first * 1e3:.1f} ms, then median {statistics.median(calls) * 1e3:.2f} ms"
    )
    print(
        f"end-to-end `autopar predict --json`: median {cli:.3f} s over {a.repeat} runs "
        f"(bare python start {bare:.3f} s; ratio {cli / bare:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
