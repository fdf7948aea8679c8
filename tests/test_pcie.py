"""PCIe nodes: host islands (two CPU sockets) and no peer memory, by hand (autopar/collectives.py).

Figures of ``cost_models/devices/a100-pcie-80gb.yaml``: 32 GB/s per direction x16 link at 0.65 bus
efficiency (20.8 GB/s) inside an island of 4 GPUs, 14 GB/s between the two islands shared by every
ring collective crossing, 18.9 GB/s under all-to-all traffic (SimuMax's measured 8-GPU all2all),
5 us per PCIe step.
"""

from __future__ import annotations

import numpy as np
import pytest

from autopar import collectives as C
from autopar.frameworks import MEGATRON
from autopar.hardware import load_device
from autopar.latency import Coefficients, stage_slot
from autopar.layout import Layout, LayoutTable
from autopar.model import load_model

M = 4096 * 4096 * 2.0  # one micro-batch of 4096 tokens x hidden 4096 in bf16
PCIE_ISLAND = 32e9 * 0.65
LINK = 14e9
A2A_LINK = 18.9e9
LAT = 5e-6


def _links(device: str = "a100-pcie-80gb") -> C.Links:
    return C.Links.from_cluster(load_device(device), 8)


def _one(x) -> float:
    return float(np.asarray(x).reshape(-1)[0])


def test_profile_states_two_islands_and_no_peer_memory() -> None:
    links = _links()
    assert (links.island, links.island_bw, links.peer_memory) == (4, LINK, False)
    sxm = _links("a100-80gb")
    assert (sxm.island, sxm.peer_memory) == (0, True)


def test_tp8_all_reduce_crosses_the_socket_link() -> None:
    # 8 GPUs, one group: ring over the 14 GB/s link; latency: tree 2·log2(8)·5 us < ring 2·7·5 us.
    t = _one(C.all_reduce(_links(), M, np.array([8.0]), np.array([1.0])))
    assert t == pytest.approx(2 * 7 / 8 * M / LINK + 2 * 3 * LAT)


def test_tp4_all_reduce_stays_in_one_island() -> None:
    t = _one(C.all_reduce(_links(), M, np.array([4.0]), np.array([1.0])))
    assert t == pytest.approx(2 * 3 / 4 * M / PCIE_ISLAND + 2 * 2 * LAT)


@pytest.mark.parametrize(("n", "stride", "sharing"), [(4, 2, 2), (2, 4, 4), (4, 1, None)])
def test_strided_data_parallel_groups_share_the_link(n: int, stride: int, sharing: int | None) -> None:
    # tp2 x dp4: two dp groups {0,2,4,6}, {1,3,5,7}, each crossing -> 7 GB/s each; tp4 x dp2: four
    # groups {i, i+4} -> 3.5 GB/s (SimuMax measured 7.0-7.65 and 3.9-4.0); pp2 x dp4: {0..3}
    # and {4..7} stay inside their islands.
    bw = PCIE_ISLAND if sharing is None else LINK / sharing
    t = _one(C.reduce_scatter(_links(), M, np.array([float(n)]), np.array([float(stride)])))
    assert t == pytest.approx((n - 1) / n * M / bw + (n - 1) * LAT)


def test_all_to_all_bounded_by_the_cross_island_share() -> None:
    # ep8: each rank sends half its bytes to the other island; 4 ranks share the link at its
    # all-to-all rate.
    t = _one(C.all_to_all(_links(), M, np.array([8.0]), np.array([1.0])))
    assert t == pytest.approx(4 * M * 4 / 8 / A2A_LINK + 3 * LAT)
    # SimuMax's nccl-tests fit it comes from: 8 GPUs, busbw 0.2754 x 30 GB/s at (n-1)/n.
    assert 4 * M * 4 / 8 / A2A_LINK == pytest.approx(M * 7 / 8 / (0.2754 * 30e9), rel=0.01)


def test_all_to_all_link_defaults_to_the_ring_rate() -> None:
    dev = load_device("a100-pcie-80gb")
    hi = dev.scale_up.host_islands
    assert hi is not None
    plain = dev.model_copy(
        update={
            "scale_up": dev.scale_up.model_copy(
                update={"host_islands": hi.model_copy(update={"all_to_all_link_gbps": None})}
            )
        }
    )
    t = _one(C.all_to_all(C.Links.from_cluster(plain, 8), M, np.array([8.0]), np.array([1.0])))
    assert t == pytest.approx(4 * M * 4 / 8 / LINK + 3 * LAT)


def test_pipeline_hop_between_islands_shares_the_link() -> None:
    # pp2 x dp4: ranks 0..3 send to 4..7 at once, each at 14/4 GB/s.
    t = _one(C.p2p(_links(), M, np.array([False]), stride=np.array([4.0]), span=np.array([2.0])))
    assert t == pytest.approx(M / (LINK / 4) + LAT)
    inside = _one(C.p2p(_links(), M, np.array([False]), stride=np.array([1.0]), span=np.array([2.0])))
    assert inside == pytest.approx(M / PCIE_ISLAND + LAT)


def test_nvlink_node_is_unchanged() -> None:
    # The island logic leaves an NVLink node's alpha-beta ring alone; the measured nccl-tests floor
    # (tests/test_collective_busbw.py) is the only other term, and it is the larger one at this size.
    links = _links("a100-80gb")
    plain = C.Links(**{**links.__dict__, "busbw": (), "busbw_log_bytes": ()})
    t = _one(C.all_reduce(plain, M, np.array([8.0]), np.array([1.0])))
    assert t == pytest.approx(2 * 7 / 8 * M / (300e9 * 0.78) + 2 * 3 * 3e-6)
    floor = 2 * 7 / 8 * M / float(C.measured_busbw(links, M))
    assert _one(C.all_reduce(links, M, np.array([8.0]), np.array([1.0]))) == pytest.approx(max(t, floor))


# Round coefficients for the by-hand slot checks (TP overlap 0.8 where the device allows it).
_CO = Coefficients(
    peak_flops={"bf16": 100e12},
    gemm_eff={"bf16": 0.5},
    gemm_half_dim=64.0,
    attention_eff=0.4,
    hbm_bw=1e12,
    overlap_contention=0.5,
    tp_overlap=0.8,
    kernel_overhead_s=0.0,
)


def test_no_tp_comm_overlap_without_peer_memory() -> None:
    # Megatron/TE pipelines TP collectives through userbuffers only where GPUs map each other's
    # memory: on the PCIe node every TP byte is exposed.
    co = _CO
    model = load_model("llama-3.1-8b")
    lay = LayoutTable.from_layouts([Layout(tp=8, micro_batch=1, sp=True)])
    out = {}
    for dev in ("a100-pcie-80gb", "a100-80gb"):
        out[dev] = stage_slot(
            model,
            lay,
            seq_len=4096,
            links=_links(dev),
            co=co,
            n_dense=np.array([1.0]),
            n_moe=np.zeros(1),
            head=np.zeros(1, dtype=bool),
            profile=MEGATRON,
        )
    pcie, sxm = out["a100-pcie-80gb"], out["a100-80gb"]
    assert pcie["tp_comm"][0] == pytest.approx(pcie["tp_raw"][0])
    assert sxm["tp_comm"][0] == pytest.approx(sxm["tp_raw"][0] * (0.2 + 0.5 * 0.8))


def test_sp_regather_in_backward_is_exposed_beyond_the_dgrad_gemm() -> None:
    # Without userbuffers TE all-gathers the sharded input of QKV and fc1 again in backward, behind
    # their dgrad GEMMs: the extra exposed time is max(AG - dgrad, 0) for each.
    co = _CO
    model = load_model("llama-3.1-8b")
    links = _links()

    def slot(sp: bool):
        lay = LayoutTable.from_layouts([Layout(tp=8, micro_batch=1, sp=sp)])
        return stage_slot(
            model,
            lay,
            seq_len=4096,
            links=links,
            co=co,
            n_dense=np.array([1.0]),
            n_moe=np.zeros(1),
            head=np.zeros(1, dtype=bool),
            profile=MEGATRON,
        )

    T, h = 4096.0, 4096.0
    ag = 7 / 8 * T * h * 2 / LINK + 7 * LAT

    def gemm(M, N, K):  # CO's roofline by hand (as tests/test_stack_time.py)
        shape = (1 + 3 * 64 / 16384) / (1 + 64 / M + 64 / N + 64 / K)
        return max(2 * M * N * K / (100e12 * 0.5 * shape), 2 * (M * K + K * N + M * N) / 1e12)

    dq = gemm(T, h, (32 * 128 + 2 * 8 * 128) / 8)
    dfc1 = gemm(T, h, 2 * 14336 / 8)
    with_sp, without = slot(True), slot(False)
    four_ar = 4 * (2 * 7 / 8 * T * h * 2 / LINK + 2 * 3 * LAT)
    assert without["tp_comm"][0] == pytest.approx(four_ar)
    assert with_sp["tp_comm"][0] == pytest.approx(four_ar + max(ag - dq, 0) + max(ag - dfc1, 0))
