"""Measured NCCL all-to-all bus bandwidth per device, from AIConfigurator's nccl-tests tables.

    pip install -e ".[aiconfigurator]"      # aiconfigurator-core (Apache-2.0) and pyarrow
    python studies/collective_rates.py [--json OUT] [--write]

NVIDIA's AIConfigurator ships NCCL latencies it measured on each system
(``aiconfigurator_core/systems/data/<system>/comm/nccl/<NCCL version>/nccl_perf.parquet``; columns
op_name in all_gather / all_reduce / alltoall / reduce_scatter, nccl_dtype half / int8, num_gpus,
message_size, latency). Its collector (``collector/network/collect_nccl.py`` of ai-dynamo/
aiconfigurator) runs the nccl-tests binary (``alltoall_perf -b S -e S -g num_gpus -d dtype``, NCCL's
own algorithm and protocol choice) and stores ``message_size = S / bytes per element`` (half: 2,
int8: 1), so an element count, and ``latency`` = the out-of-place time in ms (nccl-tests prints us;
the collector multiplies by 1e-3). For alltoall nccl-tests' size S is each rank's whole send
buffer (S / n to every rank, itself included) and its bus bandwidth is S / t x (n - 1) / n.

autopar's convention is the same: ``collectives.all_to_all(links, nbytes, n, ...)`` takes ``nbytes``
as what each rank sends in total, spread evenly over the n ranks, and moves ``nbytes (n-1)/n`` per
rank over the links. So the curve is ``[(S bytes, S / t x (n-1)/n in GB/s), ...]`` per GPU count.
The reading of the units is checked against an independent measurement: the same tables' 8-GPU
all-reduce (bus bandwidth S / t x 2(n-1)/n) at 512 MiB gives 445 GB/s on H100, 222 on A100 and 460
on H200, where the profiles' Azure nccl-tests curves (``scale_up.allreduce_busbw``) say 438, 222
and 443 (``tests/test_collective_rates.py``).

For each device it reads the newest NCCL version the package ships for the system, takes every
size from 1 MiB to 512 MiB (below 1 MiB the time is 7-20 us of launch and protocol latency, and
noisy) and, since half and int8 each measure every byte size once, the faster of the two at each
size (a floor is never above a measured rate). It prints the curves and the profile lines
(``scale_up.alltoall_busbw``, a floor for an all-to-all inside the scale-up domain); ``--write``
puts those lines into ``cost_models/devices/<id>.yaml``, which the shipped profiles do not carry:
the floor was tried (docs/accuracy.md, "Measured all-to-all rates") and not kept, since it made
the MoE rows and the held-out figures worse. ``--op all_reduce`` prints the all-reduce curves.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from importlib import resources
from pathlib import Path

from gemm_rates import have_tables  # the same optional tables and the same hint

PACKAGE = "aiconfigurator-core 0.12.0"
# autopar device id -> (AIConfigurator system, the system's own autopar id where the device is
# carried over from one of the same die and link)
SYSTEMS = {
    "a100-80gb": ("a100_sxm", None),
    "a100-40gb": ("a100_sxm", "a100-80gb"),
    "h100-sxm-80gb": ("h100_sxm", None),
    "h200-sxm-141gb": ("h200_sxm", None),
    "b200": ("b200_sxm", None),
    "b300": ("b300_sxm", None),
    "gb200-nvl72": ("gb200", None),
    "gb300-nvl72": ("gb300", None),
}
MIN_BYTES = 2**20
MAX_BYTES = 2**29
BYTES_PER_ELEMENT = {"half": 2, "int8": 1}
DEVICES = Path(__file__).resolve().parent.parent / "cost_models" / "devices"


def nccl_dir(system: str) -> Path:
    return Path(str(resources.files("aiconfigurator_core") / "systems" / "data" / system / "comm" / "nccl"))


def newest_version(system: str) -> str:
    """The newest NCCL version of ``system``'s tables (by numeric version, not string order)."""
    versions = [p.name for p in nccl_dir(system).iterdir() if (p / "nccl_perf.parquet").exists()]
    return max(versions, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))


def curves(system: str, op: str = "alltoall") -> tuple[str, dict[int, list[tuple[int, float]]]]:
    """(NCCL version, {GPU count: [(bytes, bus GB/s), ...]}) of ``op`` on ``system``."""
    import pandas as pd

    version = newest_version(system)
    df = pd.read_parquet(nccl_dir(system) / version / "nccl_perf.parquet")
    df = df[df.op_name == op].copy()
    df["bytes"] = df.message_size * df.nccl_dtype.map(BYTES_PER_ELEMENT)
    if df["bytes"].isna().any():
        raise ValueError(
            f"{system}: unknown nccl_dtype {sorted(set(df.nccl_dtype) - set(BYTES_PER_ELEMENT))}"
        )
    df = df[(df["bytes"] >= MIN_BYTES) & (df["bytes"] <= MAX_BYTES)]
    out: dict[int, list[tuple[int, float]]] = {}
    for n, g in df.groupby("num_gpus"):
        n = int(n)
        fastest = g.groupby("bytes").latency.min()  # ms; half and int8 measure each size once
        # nccl-tests' bus bandwidth: all-reduce moves 2(n-1)/n of its buffer per rank, the others
        # (n-1)/n (all-gather / reduce-scatter: of the whole gathered buffer)
        factor = 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
        out[n] = [(int(b), round(b / (t * 1e-3) * factor / 1e9, 2)) for b, t in fastest.items()]
    return version, out


def src_line(device_id: str, system: str, version: str, counts: list[int]) -> str:
    carried = SYSTEMS[device_id][1]
    where = (
        f"not measured on this device: the {carried} curve (same die and NVLink) carried over: "
        if carried
        else "measured: "
    )
    gpus = "/".join(str(n) for n in counts)
    return (
        f"{where}{PACKAGE} nccl_perf.parquet, system {system}, NCCL {version}, {gpus} GPUs: nccl-tests "
        f"alltoall_perf bus bandwidth (each rank's send buffer S / time x (n-1)/n), the faster of the "
        f"half and int8 runs per size, 1-512 MiB (below, latency-bound: the alpha-beta model alone) "
        f"(GB/s); [[GPU count, [[bytes, GB/s], ...]], ...], regenerated by studies/collective_rates.py"
    )


def profile_line(device_id: str) -> str:
    system = SYSTEMS[device_id][0]
    version, c = curves(system)
    value = json.dumps([[n, [[b, g] for b, g in pts]] for n, pts in c.items()])
    return f"  alltoall_busbw: {{value: {value}, src: {json.dumps(src_line(device_id, system, version, list(c)))}}}"


def write(device_id: str, line: str) -> None:
    """Replace (or add, after ``allreduce_busbw``) the profile's ``alltoall_busbw`` line."""
    path = DEVICES / f"{device_id}.yaml"
    lines = path.read_text().splitlines()
    at = [i for i, s in enumerate(lines) if s.startswith("  alltoall_busbw:")]
    if at:
        lines[at[0]] = line
    else:
        after = [i for i, s in enumerate(lines) if s.startswith("  allreduce_busbw:")]
        if not after:
            raise ValueError(f"{path}: no scale_up.allreduce_busbw line to put alltoall_busbw after")
        lines.insert(after[0] + 1, line)
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write the curves here")
    ap.add_argument("--write", action="store_true", help="put the lines into cost_models/devices/")
    ap.add_argument(
        "--op", default="alltoall", choices=("alltoall", "all_reduce", "all_gather", "reduce_scatter")
    )
    a = ap.parse_args(argv)
    if not have_tables():
        return 2
    table: dict[str, dict] = {}
    for dev, (system, _) in SYSTEMS.items():
        version, c = curves(system, a.op)
        table[dev] = {"system": system, "nccl": version, "busbw_gbps": {str(n): pts for n, pts in c.items()}}
        print(f"{dev} ({system}, NCCL {version}): {a.op} bus GB/s")
        sizes = [b for b, _ in next(iter(c.values()))]
        print("  GPUs " + " ".join(f"{b >> 20:>6}M" for b in sizes))
        for n, pts in c.items():
            print(f"  {n:>4} " + " ".join(f"{g:7.1f}" for _, g in pts))
    if a.op == "alltoall":
        print()
        for dev in SYSTEMS:
            line = profile_line(dev)
            print(f"# {dev}.yaml, scale_up:")
            print(line)
            if a.write:
                write(dev, line)
    if a.json:
        a.json.write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
