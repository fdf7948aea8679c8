"""α–β cost of each collective on the links a process group actually spans, vectorized.

Rank placement follows Megatron's order, tp innermost then cp, dp, pp (expert groups: etp, ep):
a group of ``n`` ranks spaced ``stride`` apart keeps ``g = ranks per node`` of them inside one
scale-up domain. Ring costs follow Thakur et al. 2005 and nccl-tests' PERFORMANCE.md: all-reduce
moves 2(n-1)/n·M per rank, all-gather and reduce-scatter (n-1)/n·M. Across nodes NCCL runs one
ring per NIC, so a group with ``g`` ranks per node drives ``g`` NICs: bus bandwidth g·NIC
(measured busbw ≈ node NIC aggregate, nccl-tests #119).
"""

from __future__ import annotations

from dataclasses import dataclass

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
        return cls(
            up_agg=su.agg_gbps * 1e9 * up_eff,
            up_peer=su.per_peer_gbps * 1e9 * up_eff,
            up_switched=bool(su.switched),
            out_nic=so.per_device_gbps * 1e9 * out_eff,
            lat_up=lc.get("scale_up_latency_us", su.latency_us) * 1e-6,
            lat_out=lc.get("scale_out_latency_us", so.latency_us) * 1e-6,
            devices_per_node=int(devices_per_node),
        )


def ranks_per_node(n: np.ndarray, stride: np.ndarray, devices_per_node: int) -> np.ndarray:
    """How many members of a group (size n, members ``stride`` ranks apart) share one node."""
    n = np.asarray(n, dtype=np.float64)
    stride = np.asarray(stride, dtype=np.float64)
    dpn = float(devices_per_node)
    per_node = np.floor(np.maximum(dpn / stride, 1.0))
    return np.minimum(n, per_node)


def _intra_bw(links: Links, g: np.ndarray) -> np.ndarray:
    """Bus bandwidth of a collective among g ranks of one scale-up domain."""
    if links.up_switched:
        return np.full_like(g, links.up_agg, dtype=np.float64)
    # Full mesh (xGMI, Gaudi RoCE): each rank reaches g-1 peers at the per-peer rate.
    return np.minimum(links.up_agg, links.up_peer * np.maximum(g - 1.0, 1.0))


def bus_bandwidth(links: Links, n: np.ndarray, stride: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bus bandwidth bytes/s, is-inter-node) for groups of size n with the given stride."""
    n = np.asarray(n, dtype=np.float64)
    g = ranks_per_node(n, stride, links.devices_per_node)
    inter = g < n
    intra_bw = _intra_bw(links, g)
    inter_bw = np.minimum(g * links.out_nic, np.where(g > 1, intra_bw, np.inf))
    return np.where(inter, inter_bw, intra_bw), inter


def _ring_alpha(links: Links, n: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Latency of one pass around a ring: k-1 inter-node hops and n-k hops inside nodes (k nodes)."""
    k = n / np.maximum(g, 1.0)
    return (k - 1.0) * links.lat_out + (n - k) * links.lat_up


def _tree_alpha(links: Links, n: np.ndarray, inter: np.ndarray) -> np.ndarray:
    lat = np.where(inter, links.lat_out, links.lat_up)
    return 2.0 * np.log2(np.maximum(n, 1.0)) * lat


def all_reduce(links: Links, nbytes, n, stride) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    bw, inter = bus_bandwidth(links, n, stride)
    g = ranks_per_node(n, stride, links.devices_per_node)
    # NCCL picks ring (2 passes) or tree (log depth) by size; take the cheaper latency.
    alpha = np.minimum(2.0 * _ring_alpha(links, n, g), _tree_alpha(links, n, inter))
    return np.where(n > 1, 2.0 * (n - 1.0) / n * nbytes / bw + alpha, 0.0)


def all_gather(links: Links, nbytes, n, stride) -> np.ndarray:
    """All-gather (or reduce-scatter) whose *full* (gathered) buffer is ``nbytes``."""
    n = np.asarray(n, dtype=np.float64)
    bw, _ = bus_bandwidth(links, n, stride)
    g = ranks_per_node(n, stride, links.devices_per_node)
    return np.where(n > 1, (n - 1.0) / n * nbytes / bw + _ring_alpha(links, n, g), 0.0)


reduce_scatter = all_gather


def all_to_all(links: Links, nbytes, n, stride, inter_share=1.0) -> np.ndarray:
    """All-to-all where each rank sends ``nbytes`` in total, spread evenly over the n ranks.

    ``inter_share`` scales the bytes that leave the node (a dispatcher that de-duplicates copies
    bound for one node, e.g. DeepEP, sends fewer).
    """
    n = np.asarray(n, dtype=np.float64)
    g = ranks_per_node(n, stride, links.devices_per_node)
    intra = nbytes * (g - 1.0) / n / _intra_bw(links, g)
    inter = nbytes * (n - g) / n * inter_share / links.out_nic
    alpha = _tree_alpha(links, n, g < n) / 2.0  # pairwise exchanges run concurrently
    return np.where(n > 1, intra + inter + alpha, 0.0)


def p2p(links: Links, nbytes, inter) -> np.ndarray:
    bw = np.where(inter, links.out_nic, links.up_peer)
    lat = np.where(inter, links.lat_out, links.lat_up)
    return nbytes / bw + lat
