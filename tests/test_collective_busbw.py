"""Collectives inside a scale-up domain are never faster than the device's measured nccl-tests
all-reduce bus bandwidth at their message size (``scale_up.allreduce_busbw``): the alpha-beta model
with a few step latencies reaches the link rate at a few MB, NCCL only at hundreds of MB."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.collectives import Links, all_gather, all_reduce, measured_busbw
from autopar.errors import AutoparError
from autopar.hardware import load_device

MIB = 2**20
# Azure AI-benchmarking-guide, ND H100 v5 (8x H100 SXM, NCCL 2.18.5, NVLS): bus GB/s per size
H100 = {4 * MIB: 128.73, 16 * MIB: 234.45, 64 * MIB: 361.78, 8192 * MIB: 478.87}


def _links(dev: str = "h100-sxm-80gb", per_node: int = 8) -> Links:
    return Links.from_cluster(load_device(dev), per_node)


def _one(x) -> float:
    return float(np.asarray(x).reshape(-1)[0])


def test_an_8_gpu_all_reduce_takes_the_measured_time_at_mid_sizes() -> None:
    L = _links()
    n, one = np.array([8.0]), np.array([1.0])
    for size in (4 * MIB, 16 * MIB):
        measured = 2 * 7 / 8 * size / (H100[size] * 1e9)  # nccl-tests busbw = 2(n-1)/n * M / t
        assert _one(all_reduce(L, size, n, one)) == pytest.approx(measured, rel=1e-9)


def test_large_messages_keep_the_alpha_beta_rate() -> None:
    # 8 GiB: the profile's calibrated ring rate (bus efficiency x NVLink) is below NVLS's 479 GB/s,
    # so the floor does not bind and the time is the alpha-beta one.
    L = _links()
    nb = 8192 * MIB
    t = _one(all_reduce(L, nb, np.array([8.0]), np.array([1.0])))
    no = Links(**{**L.__dict__, "busbw": (), "busbw_log_bytes": ()})
    no_floor = _one(all_reduce(no, nb, np.array([8.0]), np.array([1.0])))
    assert t == pytest.approx(no_floor, rel=1e-12)
    assert t > 2 * 7 / 8 * nb / (H100[nb] * 1e9)


def test_interpolation_is_log_linear_and_latency_bound_below_the_table() -> None:
    L = _links()
    assert _one(measured_busbw(L, 8 * MIB)) == pytest.approx(172.13e9, rel=1e-9)  # a measured point
    # halfway (in log size) between the 4 and 8 MiB points: the geometric mean of their rates
    between = measured_busbw(L, 2**22.5)
    assert _one(between) == pytest.approx(np.sqrt(128.73e9 * 172.13e9), rel=1e-9)
    # below the smallest point (1 MiB; measured with a forced algorithm, which NCCL's own choice of
    # low-latency protocol beats on small messages) there is no floor: the alpha-beta model alone
    assert np.isinf(_one(measured_busbw(L, 512 * 1024)))
    no = Links(**{**L.__dict__, "busbw": (), "busbw_log_bytes": ()})
    small = 256 * 1024
    n, one = np.array([8.0]), np.array([1.0])
    assert _one(all_reduce(L, small, n, one)) == _one(all_reduce(no, small, n, one))


def test_the_floor_applies_inside_the_domain_only() -> None:
    L = _links()
    # 16 ranks over two nodes cross the NICs: the alpha-beta model alone
    no = Links(**{**L.__dict__, "busbw": (), "busbw_log_bytes": ()})
    n, one = np.array([16.0]), np.array([1.0])
    assert _one(all_reduce(L, 4 * MIB, n, one)) == _one(all_reduce(no, 4 * MIB, n, one))
    # all-gather inside the node: never under the measured all-reduce bus rate for its buffer
    ag = _one(all_gather(L, 16 * MIB, np.array([8.0]), one))
    assert ag == pytest.approx(
        max(_one(all_gather(no, 16 * MIB, np.array([8.0]), one)), 7 / 8 * 16 * MIB / (H100[16 * MIB] * 1e9)),
        rel=1e-12,
    )
    assert ag > _one(all_gather(no, 16 * MIB, np.array([8.0]), one))


def test_a_device_without_a_measurement_is_unchanged() -> None:
    L = _links("h800-sxm-80gb")
    assert L.busbw == () and np.isinf(_one(measured_busbw(L, MIB)))


@pytest.mark.parametrize("bad", [[[1024, 1.0]], [[2048, 1.0], [1024, 2.0]], [[1024, 1.0], [2048, 0.0]]])
def test_a_bad_curve_is_refused(tmp_path, bad) -> None:
    import yaml

    from autopar.hardware import _builtin_files

    src = yaml.safe_load(_builtin_files()["h100-sxm-80gb"].read_text())
    src["scale_up"]["allreduce_busbw"] = {"value": bad, "src": "test"}
    p = tmp_path / "d.yaml"
    p.write_text(yaml.safe_dump(src))
    with pytest.raises(AutoparError):
        load_device(p)
