"""α–β cost of each collective on the links a process group actually spans, vectorized.

Rank placement follows Megatron's order, tp innermost then cp, dp, pp (expert groups: etp, ep):
a group of ``n`` ranks spaced ``stride`` apart keeps ``g = ranks per node`` of them inside one
scale-up domain. Ring costs follow Thakur et al. 2005 and nccl-tests' PERFORMANCE.md: all-reduce
moves 2(n-1)/n·M per rank, all-gather and reduce-scatter (n-1)/n·M. Across nodes NCCL runs one
ring per NIC, so a group with ``g`` ranks per node drives ``g`` NICs: bus bandwidth g·NIC
(measured busbw ≈ node NIC aggregate, nccl-tests #119).

PCIe nodes whose GPUs sit behind separate host bridges (``ScaleUp.host_islands``, e.g. two CPU
sockets of four GPUs each): a group inside one island runs at the per-device PCIe rate; a group
spanning islands sends its ring (or its all-to-all share) over the inter-island link, which every
group of the same kind shares, since all of them run the same collective at the same time. With
``k`` such groups touching an island the ring's bus bandwidth is at most link / k. This is what
the nccl-tests fits of the 8x A100 PCIe node of the SimuMax rows show (``a100-pcie-80gb.yaml``):
2- and 4-GPU groups ~20.7 GB/s, one 8-GPU group ~12.5, two strided 4-GPU groups ~7.3 each and four
strided 2-GPU groups ~4 each, i.e. a ~14 GB/s link shared by the crossing rings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Links:
    """Achieved bandwidths (bytes/s) and latencies (s) of one cluster, from its device profile."""

    up_agg: float  # scale-up aggregate per direction, achieved (wire x bus efficiency)
    up_peer: float  # scale-up to one peer, achieved
    up_switched: bool
    out_nic: float  # scale-out per device NIC, achieved
    lat_up: float
    lat_out: float
    devices_per_node: int
    island: int = 0  # devices per host island of a PCIe node (0: no islands)
    island_bw: float = 0.0  # achieved bytes/s per direction between islands, shared
    island_a2a_bw: float = 0.0  # the same for all-to-all traffic (0: island_bw)
    peer_memory: bool = True  # devices map each other's memory (TE userbuffers comm overlap)
    # measured all-reduce bus bandwidth inside one domain: (log bytes, bytes/s) points, or empty
    busbw_log_bytes: tuple[float, ...] = ()
    busbw: tuple[float, ...] = ()
    busbw_scale: Any = 1.0  # a what-if's scale of the link rate (a float, or one per layout row)

    @classmethod
    def from_cluster(
        cls, device, devices_per_node: int, link_coeffs: dict[str, float] | None = None
    ) -> Links:
        """Links of a cluster of ``device``; ``link_coeffs`` (from a calibration) override efficiencies."""
        eff = device.efficiency
        lc = link_coeffs or {}
        su, so = device.scale_up, device.scale_out
        up_eff = lc.get("scale_up_bus", eff.scale_up_bus)
        out_eff = lc.get("scale_out_bus", eff.scale_out_bus)
        hi = su.host_islands
        return cls(
            up_agg=su.agg_gbps * 1e9 * up_eff,
            up_peer=su.per_peer_gbps * 1e9 * up_eff,
            up_switched=bool(su.switched),
            out_nic=so.per_device_gbps * 1e9 * out_eff,
            lat_up=lc.get("scale_up_latency_us", su.latency_us) * 1e-6,
            lat_out=lc.get("scale_out_latency_us", so.latency_us) * 1e-6,
            devices_per_node=int(devices_per_node),
            island=su.domain // hi.count if hi is not None else 0,
            island_bw=hi.link_gbps * 1e9 if hi is not None else 0.0,
            island_a2a_bw=(hi.all_to_all_link_gbps or 0.0) * 1e9 if hi is not None else 0.0,
            peer_memory=bool(su.peer_memory),
            busbw_log_bytes=tuple(float(np.log(b)) for b, _ in su.allreduce_busbw),
            busbw=tuple(g * 1e9 for _, g in su.allreduce_busbw),
        )


def ranks_per_node(n: np.ndarray, stride: np.ndarray, devices_per_node: int) -> np.ndarray:
    """How many members of a group (size n, members ``stride`` ranks apart) share one node."""
    n = np.asarray(n, dtype=np.float64)
    stride = np.asarray(stride, dtype=np.float64)
    dpn = float(devices_per_node)
    per_node = np.floor(np.maximum(dpn / stride, 1.0))
    return np.minimum(n, per_node)


def island_members(links: Links, g: np.ndarray, stride: np.ndarray | float) -> np.ndarray:
    """Members of a group (g per node, ``stride`` apart) inside one host island (g: no islands)."""
    g = np.asarray(g, dtype=np.float64)
    if not links.island:
        return g
    stride = np.asarray(stride, dtype=np.float64)
    return np.minimum(g, np.maximum(np.floor(links.island / stride), 1.0))


def _intra_bw(links: Links, g: np.ndarray, stride: np.ndarray | float = 1.0) -> np.ndarray:
    """Bus bandwidth of a collective among g ranks of one scale-up domain, ``stride`` apart."""
    g = np.asarray(g, dtype=np.float64)
    if links.up_switched:
        bw = np.full_like(g, links.up_agg, dtype=np.float64)
    else:
        # Full mesh (xGMI, Gaudi RoCE): each rank reaches g-1 peers at the per-peer rate.
        bw = np.minimum(links.up_agg, links.up_peer * np.maximum(g - 1.0, 1.0))
    if not links.island:
        return bw
    # A ring spanning islands crosses each island's link once per direction; the island / g_isl
    # groups touching an island (all running the same collective) share that link.
    g_isl = island_members(links, g, stride)
    sharing = min(links.island, links.devices_per_node) / g_isl
    return np.where(g > g_isl, np.minimum(bw, links.island_bw / sharing), bw)


def bus_bandwidth(links: Links, n: np.ndarray, stride: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bus bandwidth bytes/s, is-inter-node) for groups of size n with the given stride."""
    n = np.asarray(n, dtype=np.float64)
    g = ranks_per_node(n, stride, links.devices_per_node)
    inter = g < n
    intra_bw = _intra_bw(links, g, stride)
    inter_bw = np.minimum(g * links.out_nic, np.where(g > 1, intra_bw, np.inf))
    return np.where(inter, inter_bw, intra_bw), inter


def _ring_alpha(links: Links, n: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Latency of one pass around a ring: k-1 inter-node hops and n-k hops inside nodes (k nodes)."""
    k = n / np.maximum(g, 1.0)
    return (k - 1.0) * links.lat_out + (n - k) * links.lat_up


def _tree_alpha(links: Links, n: np.ndarray, inter: np.ndarray) -> np.ndarray:
    lat = np.where(inter, links.lat_out, links.lat_up)
    return 2.0 * np.log2(np.maximum(n, 1.0)) * lat


def measured_busbw(links: Links, nbytes) -> np.ndarray:
    """The device's measured in-domain all-reduce bus bandwidth (bytes/s) at ``nbytes``: log-linear
    in the message size between the measured points, above the largest its rate; ``inf`` (no floor)
    below the smallest point and where the profile has no measurement. The shipped curves start at
    1 MiB: they were measured with one algorithm forced (NVLS or ring), which NCCL's own tuning beats
    with its low-latency protocols on small messages (decode-sized all-reduces)."""
    nb = np.maximum(np.asarray(nbytes, dtype=np.float64), 1.0)
    if not links.busbw:
        return np.full(np.shape(nb), np.inf)
    xs, ys = np.asarray(links.busbw_log_bytes), np.log(np.asarray(links.busbw))
    x = np.log(nb)
    return np.where(x < xs[0], np.inf, np.exp(np.interp(x, xs, ys)) * links.busbw_scale)


def _floor_in_domain(links: Links, t, moved, nbytes, inter) -> np.ndarray:
    """``t``, but a collective that stays inside one scale-up domain never beats the measured
    all-reduce bus bandwidth at its message size (nccl-tests: NCCL's protocols and channels reach
    the link rate only at hundreds of MB, which the alpha-beta model's few step latencies miss);
    ``moved``: the bytes per rank the bus bandwidth is defined on."""
    if not links.busbw:
        return t
    return np.where(inter, t, np.maximum(t, moved / measured_busbw(links, nbytes)))


def all_reduce(links: Links, nbytes, n, stride) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    bw, inter = bus_bandwidth(links, n, stride)
    g = ranks_per_node(n, stride, links.devices_per_node)
    # NCCL picks ring (2 passes) or tree (log depth) by size; take the cheaper latency.
    alpha = np.minimum(2.0 * _ring_alpha(links, n, g), _tree_alpha(links, n, inter))
    moved = 2.0 * (n - 1.0) / n * nbytes
    t = _floor_in_domain(links, moved / bw + alpha, moved, nbytes, inter)
    return np.where(n > 1, t, 0.0)


def all_gather(links: Links, nbytes, n, stride) -> np.ndarray:
    """All-gather (or reduce-scatter) whose *full* (gathered) buffer is ``nbytes``; inside a domain
    never faster than the measured all-reduce bus bandwidth at that buffer size."""
    n = np.asarray(n, dtype=np.float64)
    bw, inter = bus_bandwidth(links, n, stride)
    g = ranks_per_node(n, stride, links.devices_per_node)
    moved = (n - 1.0) / n * nbytes
    t = _floor_in_domain(links, moved / bw + _ring_alpha(links, n, g), moved, nbytes, inter)
    return np.where(n > 1, t, 0.0)


reduce_scatter = all_gather


def all_to_all(links: Links, nbytes, n, stride, inter_share=1.0, intra_share=1.0) -> np.ndarray:
    """All-to-all where each rank sends ``nbytes`` in total, spread evenly over the n ranks.

    ``inter_share`` scales the bytes that leave the node and ``intra_share`` those sent to peers in
    the node (a dispatcher that de-duplicates the copies bound for one node or one rank, e.g.
    DeepEP, sends fewer).
    """
    n = np.asarray(n, dtype=np.float64)
    g = ranks_per_node(n, stride, links.devices_per_node)
    intra = nbytes * intra_share * (g - 1.0) / n / _intra_bw(links, g)
    if links.island:
        # The share bound for the other islands leaves every rank of an island over one link.
        g_isl = island_members(links, g, stride)
        ranks = min(links.island, links.devices_per_node)
        cross = ranks * nbytes * intra_share * (g - g_isl) / n / (links.island_a2a_bw or links.island_bw)
        intra = np.maximum(intra, cross)
    inter = nbytes * (n - g) / n * inter_share / links.out_nic
    alpha = _tree_alpha(links, n, g < n) / 2.0  # pairwise exchanges run concurrently
    return np.where(n > 1, intra + inter + alpha, 0.0)


def p2p(links: Links, nbytes, inter, stride=1.0, span=1.0) -> np.ndarray:
    """Point-to-point send of ``nbytes``; ``inter``: it crosses nodes.

    Pipeline sends pair ranks ``stride`` apart over a group ``span`` ranks long; inside a node
    with host islands, the hops of a group longer than an island cross the island link, which the
    min(stride, island) pairs sending at once share.
    """
    bw = np.where(inter, links.out_nic, links.up_peer)
    if links.island:
        stride = np.asarray(stride, dtype=np.float64)
        cross = np.asarray(span, dtype=np.float64) * stride > links.island
        shared = links.island_bw / np.minimum(stride, float(links.island))
        bw = np.where(~np.asarray(inter) & cross, np.minimum(bw, shared), bw)
    lat = np.where(inter, links.lat_out, links.lat_up)
    return nbytes / bw + lat
