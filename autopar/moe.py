"""Routing arithmetic of a Megatron-Core MoE layer, vectorized over layouts.

How Megatron-Core runs one MoE layer (``megatron/core/transformer/moe/token_dispatcher.py``,
``MoEAlltoAllTokenDispatcher``; MCore 0.16):

1. With tp > 1 MoE runs sequence parallel: each rank holds and routes ``T/tp`` of the micro-batch's
   ``T = micro_batch * seq_len / cp`` tokens (``T`` without SP). The router is a ``T_r x E x h`` GEMM.
2. Permutation 1 copies each routed token once per chosen expert (``T_r * k`` rows of ``h``), and
   the all-to-all over the EP group (``ep`` ranks, placed ``etp`` apart: the expert rank order is
   etp, ep, edp) sends every copy to the rank holding its expert.
3. With expert-TP (``etp`` > 1, MCore default ``etp = tp``: ``ModelParallelConfig.__post_init__``)
   the received copies are all-gathered in the ETP group; each rank runs its ``E/ep`` local experts
   at width ``F/etp`` over all ``etp`` ranks' copies, then reduce-scatters the output.
4. Permutation 2 sorts the copies by local expert; after the expert MLP the two unpermutations
   and the combine all-to-all run the same path backwards.

Balanced routing (the published MoE runs are force-balanced), so every local expert sees

    tokens_per_expert = (T / sp) * k * ep * etp / E

(``ep`` ranks of an EP group each send ``T_r * k`` copies spread over ``E`` experts: ``T_r*k*ep/E``
per expert and EP group; the ETP all-gather adds the copies of the other ``etp - 1`` EP groups that
hold the same experts). Summed over the ``E/ep`` local experts at width ``F/etp`` this is exactly
``T*k/tp`` tokens' worth of expert FLOPs per rank: the ``tp*cp*dp`` ranks of a stage share the expert
work evenly whatever ``ep`` and ``etp`` are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from autopar.collectives import ranks_per_node

Dispatcher = Literal["alltoall", "deepep"]
DISPATCHER_DESCRIPTION = (
    "MoE token dispatcher: alltoall (Megatron --moe-token-dispatcher-type alltoall: one copy per "
    "chosen expert) or deepep (the flex dispatcher with the DeepEP or HybridEP backend: a token is "
    "sent once per destination rank inside a node and crosses the network once per destination node, "
    "then fans out over NVLink)"
)
FUSED_GRAPH_DESCRIPTION = (
    "run an MoE model's whole training iteration as one CUDA graph with Transformer Engine's fused "
    "grouped expert MLP (Megatron-Bridge's full-iteration MXFP8 MoE recipes since the 26.06 "
    "container: cuda_graph_impl=full_iteration, moe_paged_stash, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1; "
    "Blackwell): no host launch waits or per-layer launch gaps, and "
    "the routed experts' activation and block-scaling casts fused into their GEMMs. No launcher "
    "writes it yet: predict and what-if only"
)
A2A_OVERLAP_DESCRIPTION = (
    "hide each micro-batch's EP all-to-all behind another micro-batch's compute (Megatron "
    "--overlap-moe-expert-parallel-comm, MCore >= 0.13; not with full recompute)"
)


@dataclass(frozen=True)
class MoEOptions:
    """How the framework runs the MoE layers of a job (dispatcher, all-to-all overlap, and whether the
    iteration runs as one CUDA graph with fused grouped expert MLPs)."""

    dispatcher: Dispatcher = "alltoall"
    a2a_overlap: bool = False
    fused_graph: bool = False


def routed_tokens(T, sp_div) -> np.ndarray:
    """Tokens one rank routes per micro-batch: its sequence-parallel share ``T / sp``."""
    return np.asarray(T, dtype=np.float64) / np.asarray(sp_div, dtype=np.float64)


def tokens_per_expert(model, T, sp_div, ep, etp) -> np.ndarray:
    """Rows of each local expert's GEMMs per rank, balanced routing: ``(T/sp) * k * ep * etp / E``."""
    ep = np.asarray(ep, dtype=np.float64)
    etp = np.asarray(etp, dtype=np.float64)
    return routed_tokens(T, sp_div) * model.moe_topk * ep * etp / model.num_experts


def expert_rows_per_rank(model, T, sp_div, etp) -> np.ndarray:
    """Rows of all local experts together per rank (after the ETP all-gather): ``(T/sp) * k * etp``."""
    return routed_tokens(T, sp_div) * model.moe_topk * np.asarray(etp, dtype=np.float64)


def dispatch_bytes(model, T, sp_div, elem) -> np.ndarray:
    """Bytes one rank sends in one dispatch (and receives back in one combine): ``(T/sp) * k * h * elem``
    (``h``: :attr:`ModelSpec.moe_dim`, the latent width of a latent MoE, which dispatches projected tokens)."""
    return routed_tokens(T, sp_div) * model.moe_topk * float(model.moe_dim) * np.asarray(elem)


def distinct_share(model, groups) -> np.ndarray:
    """Distinct destinations per routed token over its ``k`` copies, balanced uniform routing.

    The ``E`` experts sit evenly on ``groups`` destinations (ranks or nodes), ``E/groups`` each. A
    token whose ``k`` experts are drawn without replacement misses a given destination with
    probability ``C(E - E/groups, k) / C(E, k)``, so it reaches ``groups * (1 - that)`` distinct
    destinations on average, against the ``k`` copies the all-to-all dispatcher sends.
    """
    groups = np.maximum(np.asarray(groups, dtype=np.float64), 1.0)
    E = float(model.num_experts)
    k = int(model.moe_topk)
    return np.minimum(groups * (1.0 - _miss(E, E / groups, k)) / k, 1.0)


def deepep_intranode_share(model, ep) -> np.ndarray:
    """Bytes of DeepEP's / HybridEP's dispatch to one peer rank relative to the all-to-all's.

    Both send a token to each destination rank once, with the list of its local experts, and the
    receiver expands it into per-expert copies (DeepEP ``is_token_in_rank``; Megatron's flex
    dispatcher with the ``deepep`` or ``hybridep`` backend), where the all-to-all dispatcher sends
    one copy per chosen expert: ``ep * (1 - miss) / k`` of the bytes (:func:`distinct_share` over
    the ``ep`` ranks). With one expert per rank nothing is de-duplicated.
    """
    return distinct_share(model, ep)


def deepep_internode_share(model, ep, etp, devices_per_node: int) -> np.ndarray:
    """Inter-node bytes of DeepEP's dispatch relative to the all-to-all's, balanced uniform routing.

    The EP group spans ``N = ep / g`` nodes (``g`` of its ranks per node), each holding ``E/N``
    experts; a token reaches ``N * (1 - miss)`` distinct nodes on average (:func:`distinct_share`)
    while the all-to-all sends ``k`` copies; the remote share is (N-1)/N of both. DeepEP sends one
    copy per node over RDMA and fans out over NVLink (DeepSeek-V3 report, Sec. 3.2.2), so the
    network carries ``N * (1 - miss) / k`` of the all-to-all's inter-node bytes. Group-limited
    routing lowers it further (:func:`group_limited_nodes`: DeepSeek-V3 sends a token to at most
    M = 4 of its nodes).
    """
    ep = np.asarray(ep, dtype=np.float64)
    g = ranks_per_node(ep, etp, devices_per_node)
    nodes = np.maximum(ep / g, 1.0)
    free = distinct_share(model, nodes)
    limited = group_limited_nodes(model, nodes) / max(int(model.moe_topk), 1)
    return np.where(nodes > 1, np.minimum(free, limited), 1.0)  # one node: nothing leaves


def _miss(total, per, draws: int):
    """Probability that ``draws`` picks without replacement from ``total`` items all miss a given
    ``per`` of them: ``C(total - per, draws) / C(total, draws)``."""
    out = np.ones_like(np.asarray(total, dtype=np.float64) * np.asarray(per, dtype=np.float64))
    for i in range(draws):
        out = out * np.maximum(total - per - i, 0.0) / np.maximum(total - i, 1.0)
    return out


def group_limited_nodes(model, nodes) -> np.ndarray:
    """Distinct nodes a token reaches under group-limited routing (DeepSeek-V2/V3 ``n_group`` /
    ``topk_group``), balanced routing; ``inf`` where the routing is not group-limited or the groups do
    not tile the nodes.

    The ``G`` expert groups are equal and contiguous, so EP places whole groups on nodes. A token's
    ``k`` experts come from ``M' = min(M, k)`` of the ``G`` groups (each chosen group gets one at
    least: DeepSeek-V3 picks 4 groups by their top-2 experts' scores, then 8 experts among them).
    With ``N`` dividing ``G`` (``G/N`` groups per node) the chosen groups land on
    ``N * (1 - C(G - G/N, M') / C(G, M'))`` distinct nodes; with ``G`` dividing ``N`` (a group spans
    ``N/G`` nodes) the ``k`` experts are drawn from the ``M' E / G`` experts of the chosen groups on
    their ``M' N / G`` nodes. DeepSeek-V3 on 8 nodes: 4 nodes per token, not the 5.3 of free
    routing (its report, Sec. 2.1.2: node-limited routing, M = 4)."""
    nodes = np.maximum(np.asarray(nodes, dtype=np.float64), 1.0)
    G, M, k, E = (
        int(model.moe_router_groups),
        int(model.moe_router_topk_groups),
        int(model.moe_topk),
        float(model.num_experts),
    )
    if G <= 1 or not 0 < M < G or k < 1 or E % G:
        return np.full(nodes.shape, np.inf)
    m = min(M, k)
    n_int = nodes.astype(np.int64)
    whole = (nodes == n_int) & (n_int > 0)
    tiles = whole & (G % np.maximum(n_int, 1) == 0)  # N | G: G/N groups per node
    spans = whole & (n_int % G == 0)  # G | N: a group spans N/G nodes
    per_node_groups = G / nodes
    d_tiles = nodes * (1.0 - _miss(float(G), per_node_groups, m))
    span_nodes = m * nodes / G
    chosen = m * E / G
    d_spans = span_nodes * (1.0 - _miss(chosen, E / nodes, k))
    return np.where(tiles, d_tiles, np.where(spans, d_spans, np.inf))


def permutation_bytes(model, T, sp_div, ep, etp, elem) -> np.ndarray:
    """HBM bytes of the forward permutations and unpermutations of one MoE layer per rank.

    Fused permutation 1 reads the rank's ``T_r`` tokens once and writes their ``T_r * k`` copies;
    the fused unpermutation 2 (probability-weighted combine) reads the copies and writes ``T_r``
    rows. With more than one local expert, permutation 2 and unpermutation 1 sort the
    ``T_r * k * etp`` received rows by expert and back, each a read and a write. Rows are ``h``
    wide (a latent MoE's: its latent width); the backward moves the same bytes once more (the gradient of a gather is a scatter).
    """
    h = float(model.moe_dim)
    t_r = routed_tokens(T, sp_div)
    copies = t_r * model.moe_topk
    sort = np.where(model.num_experts / np.asarray(ep, dtype=np.float64) > 1, 1.0, 0.0)
    rows = 2.0 * (t_r + copies) + sort * 4.0 * copies * np.asarray(etp, dtype=np.float64)
    return rows * h * np.asarray(elem)


def router_bytes(model, T, sp_div) -> np.ndarray:
    """HBM bytes of the router's softmax/sigmoid, top-k and aux-loss over fp32 logits per rank, fwd."""
    return routed_tokens(T, sp_div) * model.num_experts * 4.0 * 3.0  # write, read for top-k, read for loss


def routed_activation_parts(model, sb_local, sp_div, etp) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """What the routed experts keep for backward per rank: (rows, fc1 input, fc1 output, fc2
    input) elements per row.

    Per rank the grouped GEMMs see ``T_r * k * etp`` rows: the fc1 input (``h``, saved after the
    ETP all-gather), the fc1 output (``2F`` gated / ``F``) and the fc2 input (``F``), both sharded
    by etp (Korthikanti et al. 2022's MLP terms applied to the routed copies).
    """
    etp = np.asarray(etp, dtype=np.float64)
    rows = expert_rows_per_rank(model, sb_local, sp_div, etp)
    f_e = float(model.moe_ffn_hidden)
    return rows, float(model.moe_dim), (2.0 if model.gated_mlp else 1.0) * f_e / etp, f_e / etp


def paired_fraction(pp, grad_accum) -> np.ndarray:
    """Share of micro-batches whose forward runs merged with another micro-batch's backward.

    Megatron's EP-overlap schedule merges the forward of one micro-batch with the backward of an
    earlier one in the 1F1B steady state; the ``min(p, m)`` warm-up forwards of the first stage (one
    without pipelining) and as many cool-down backwards have no partner.
    """
    p = np.asarray(pp, dtype=np.float64)
    m = np.asarray(grad_accum, dtype=np.float64)
    return np.maximum(m - np.minimum(p, m), 0.0) / np.maximum(m, 1.0)
