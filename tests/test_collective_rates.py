"""studies/collective_rates.py reads aiconfigurator-core's NCCL tables the way its collector wrote
them (message_size in elements of nccl_dtype, latency in ms): the all-reduce bus bandwidth it derives
agrees with the independent Azure nccl-tests curves of the device profiles at 512 MiB, and the
all-to-all curves it derives lie below the NVLink wire rate. Skipped, saying why, without the
optional extra ``aiconfigurator``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autopar.hardware import load_device

pytest.importorskip("aiconfigurator_core", reason="the aiconfigurator extra is not installed")
pytest.importorskip("pyarrow", reason="pyarrow (the aiconfigurator extra) is not installed")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "studies"))
import collective_rates  # noqa: E402

MIB = 2**20


@pytest.mark.parametrize("device_id", ["a100-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "gb200-nvl72"])
def test_units_reproduce_the_profiles_independent_all_reduce_measurement(device_id: str) -> None:
    # the profiles' curves are measured (Azure AI-benchmarking-guide); at 512 MiB NCCL's own choice
    # and the forced algorithm of those runs agree, so a wrong unit (us vs ms, elements vs bytes)
    # would show as a factor of 2 or 1000
    system, _ = collective_rates.SYSTEMS[device_id]
    _, c = collective_rates.curves(system, "all_reduce")
    largest = max(c)
    ours = dict(c[largest])[512 * MIB]
    prof = load_device(device_id)
    assert "measured" in prof.provenance["scale_up.allreduce_busbw"]
    theirs = dict(prof.scale_up.allreduce_busbw)[512 * MIB]
    assert ours == pytest.approx(theirs, rel=0.05)


@pytest.mark.parametrize("device_id", sorted(collective_rates.SYSTEMS))
def test_all_to_all_curves(device_id: str) -> None:
    system, carried = collective_rates.SYSTEMS[device_id]
    version, c = collective_rates.curves(system)
    assert version == collective_rates.newest_version(system)
    assert list(c) == ([2, 4] if system.startswith("gb") else [2, 4, 8])
    wire = load_device(device_id).scale_up.agg_gbps
    for pts in c.values():
        assert [b for b, _ in pts] == [2**k for k in range(20, 30)]  # 1 MiB ... 512 MiB
        assert all(0 < g < wire for _, g in pts)
        assert pts[-1][1] > 0.3 * wire  # large messages reach a good share of the link
    line = collective_rates.profile_line(device_id)
    assert line.startswith("  alltoall_busbw: {value: [[2, [[1048576, ")
    assert f"NCCL {version}" in line and "aiconfigurator-core 0.12.0" in line
    assert ("carried over" in line) == bool(carried)


def test_newest_version_is_numeric() -> None:
    # b200_sxm ships 2.27.3, 2.27.5, 2.28.9 and 2.29.2
    assert collective_rates.newest_version("b200_sxm") == "2.29.2"
