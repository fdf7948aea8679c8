"""The MoE feed-forward layer (Megatron-Core dropless MoE): a router, ``E`` routed experts of width
``F_e`` (top-k per token), optional shared experts; one block kind's costs in one place. The routing
arithmetic (balanced routing, dispatcher bytes) is :mod:`autopar.moe`.

Parameters: :attr:`ModelSpec.router_params`, :attr:`ModelSpec.shared_expert_params` (non-expert)
and ``E x`` :attr:`ModelSpec.expert_params` (routed). Forward FLOPs per token: the router GEMM
(2 h E) and k experts' and the shared experts' MLPs (:mod:`autopar.blocks.mlp`); a latent MoE
(Nemotron 3 Super) projects each token h -> l before the routed experts, which run on l-wide rows,
and back after (2 x 2 h l), so its dispatch, permutations and expert GEMMs move l, not h. Split: EP places
E/ep experts per rank and routes tokens by all-to-all (:func:`a2a_seconds`); expert-TP splits each
expert's width F_e over etp with an all-gather / reduce-scatter of the received copies
(:func:`etp_seconds`); the shared experts split over TP as a dense MLP; the router runs on the
sequence-parallel share. No serving state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autopar import collectives as C
from autopar import moe
from autopar.blocks import mlp
from autopar.blocks.context import SlotContext

KIND = "moe"
# Kernels a grouped expert MLP launches per local expert per micro-batch: fc1 and fc2 forward, and the
# data- and weight-gradient GEMMs of each backward (TE GroupedLinear runs one cuBLAS GEMM per expert).
MOE_LAUNCHES_PER_EXPERT = 6.0


def present(model) -> bool:
    return bool(model.is_moe)


def params(model) -> tuple[float, float]:
    """(non-expert parameters: router + shared experts + latent projections, routed-expert
    parameters) of one layer."""
    return float(model.router_params + model.shared_expert_params + model.latent_proj_params), float(
        model.num_experts * model.expert_params
    )


def flops_per_token(model) -> float:
    """Forward FLOPs per token of one MoE layer, unsharded: router, k routed experts, shared experts."""
    h = float(model.hidden)
    fl = 2.0 * h * model.num_experts + model.moe_topk * mlp.flops_per_token(
        model, model.moe_ffn_hidden, model.moe_dim
    )
    fl += 4.0 * h * model.moe_latent_size  # latent projections h -> l -> h (0 without)
    if model.shared_expert_ffn:
        fl += mlp.flops_per_token(model, model.shared_expert_ffn)
    return fl


def gemms(model, f, ctx: SlotContext, *, grouped: bool = True) -> tuple[Any, Any]:
    """(routed + shared expert GEMMs, the shared experts alone), ``f(M, N, K)`` summed. Grouped GEMM
    = one GEMM per local expert with M = its tokens (:mod:`autopar.moe`): small per-expert M pays the
    same tile/wave quantization as any small GEMM. Shared experts run on the rank's sequence-parallel
    share of the tokens, as do a latent MoE's two projections (before the dispatch and after the
    combine). ``grouped=False`` leaves the routed experts' grouped GEMMs out (the latent projections
    and shared experts stay): what is left outside a fused grouped MLP."""
    tok_e = moe.tokens_per_expert(model, ctx.T, ctx.sp_div, ctx.ep, ctx.etp)
    expert = (
        (model.num_experts / ctx.ep)
        * mlp.gemms(model, f, model.moe_ffn_hidden, tok_e, ctx.etp, model.moe_dim)
        if grouped
        else np.zeros(ctx.n)
    )
    if model.moe_latent_size:
        rows = moe.routed_tokens(ctx.T, ctx.sp_div)
        h, lat = float(model.hidden), float(model.moe_latent_size)
        expert = expert + f(rows, lat, h) + f(rows, h, lat)
    shared = (
        mlp.gemms(model, f, model.shared_expert_ffn, ctx.T, ctx.tp)
        if model.shared_expert_ffn
        else np.zeros(ctx.n)
    )
    return expert + shared, shared


def router_time(model, ctx: SlotContext) -> np.ndarray:
    """The router GEMM (not a TE module: never block-scaled) on the sequence-parallel share."""
    return ctx.gt(moe.routed_tokens(ctx.T, ctx.sp_div), model.num_experts, float(model.hidden))


def shuffle_time(model, ctx: SlotContext) -> np.ndarray:
    """Forward seconds of the memory-bound token shuffling (permutations/unpermutations, router top-k);
    the backward moves the same bytes once (not the 2x of the elementwise ops' recomputed reads)."""
    by = moe.permutation_bytes(model, ctx.T, ctx.sp_div, ctx.ep, ctx.etp, ctx.elem) + moe.router_bytes(
        model, ctx.T, ctx.sp_div
    )
    return by / ctx.co.hbm_bw


def act_width(model) -> float:
    """Activation-function width per token: k routed experts' F_e."""
    return float(model.moe_ffn_hidden * model.moe_topk)


def etp_seconds(model, ctx: SlotContext) -> np.ndarray:
    """Expert-TP collectives of one layer per micro-batch: the received copies all-gathered before the
    expert GEMMs and reduce-scattered after (fwd AG+RS, bwd RS+AG; a recomputed forward adds one more
    AG+RS; the routed experts are never partly recomputed)."""
    etp_bytes = moe.expert_rows_per_rank(model, ctx.T, ctx.sp_div, ctx.etp) * float(model.moe_dim) * ctx.elem
    etp_one = C.all_gather(ctx.links, etp_bytes, ctx.etp, np.ones(ctx.n))
    return (4.0 + np.where(ctx.full, 2.0, 0.0)) * etp_one


def a2a_seconds(model, ctx: SlotContext, dispatcher: str) -> tuple[np.ndarray, np.ndarray]:
    """(all EP all-to-alls of one layer per micro-batch, the forward's): dispatch + combine, fwd and
    bwd, again in a recomputed forward. Over the EP group (ep ranks placed etp apart, Megatron's expert
    order etp, ep, edp) each rank sends its T/sp * k copies of h (16-bit; fp32 when training in
    fp32); DeepEP / HybridEP send a token once per destination rank in the node and once per
    destination node across."""
    a2a_bytes = moe.dispatch_bytes(model, ctx.T, ctx.sp_div, ctx.elem)
    deepep = dispatcher == "deepep"
    share = moe.deepep_internode_share(model, ctx.ep, ctx.etp, ctx.links.devices_per_node) if deepep else 1.0
    share_in = moe.deepep_intranode_share(model, ctx.ep) if deepep else 1.0
    a2a_one = C.all_to_all(ctx.links, a2a_bytes, ctx.ep, ctx.etp, inter_share=share, intra_share=share_in)
    n_a2a = 4.0 + np.where(ctx.full, 2.0, 0.0)  # recomputed forward dispatches again
    return n_a2a * a2a_one, 2.0 * a2a_one


def host_launch_seconds(model, ctx: SlotContext, relaunch) -> np.ndarray:
    """Host seconds of one layer's per-expert launches the device waits for (before the fitted factor).

    A dropless MoE layer is host-bound where it has many local experts: the grouped expert GEMMs
    launch one GEMM per local expert (TE GroupedLinear: fc1 and fc2 forward, their data and weight
    gradients backward: 6 per expert), and the host learns the tokens per expert only through a
    device-to-host copy in the layer (the dispatcher's tokens_per_expert), so it cannot run ahead and
    the GPU waits for those launches (NVIDIA, DeepSeek-V3 training on GB200 NVL72: MoE layers
    CPU-bound). (A fused grouped MLP under a full-iteration CUDA graph, e.g. Megatron-Bridge's
    cutedsl_fused_grouped_mlp, has none: not modelled.)
    """
    local_experts = model.num_experts / ctx.ep
    return MOE_LAUNCHES_PER_EXPERT * local_experts * relaunch * ctx.profile.launch_latency_us * 1e-6


def routed_activation_elems(model, sb, sp_div, etp, gi, drop_norm) -> Any:
    """Elements the routed experts keep for backward per rank: per received row (balanced: T/sp * k *
    etp rows after the ETP all-gather) the fc1 input (8-bit under low precision), the fc1 output and
    the fc2 input (dropped by ``norm_act``'s moe_act)."""
    rows, fc1_in, fc1_out, act_out = moe.routed_activation_parts(model, sb, sp_div, etp)
    return 2.0 * (rows * fc1_in * gi + rows * fc1_out + np.where(drop_norm, 0.0, rows * act_out * gi))
