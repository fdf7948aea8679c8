"""Per-device memory of training layouts, vectorized over a :class:`LayoutTable`.

Model state follows ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054): 2-byte weights, 2-byte
gradients and K = 12 bytes of fp32 Adam state (master weights, momentum, variance) per parameter,
sharded by stage. Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, Table 2),
generalized to GQA, gated MLPs, MoE, MLA, FlashAttention, sequence and context parallelism and each
recompute mode. The reported device is the most loaded pipeline stage (first or last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.layout import PRECISION_CODES, RECOMPUTE_CODES, LayoutTable
from autopar.moe import routed_activation_elems

GIB = float(1 << 30)
WEIGHT_BYTES = 2.0  # bf16/fp16 working weights (FP8 recipes keep bf16 weights plus transient casts)
GRAD_BYTES = 2.0
OPTIM_BYTES = 12.0  # fp32 master + Adam m + v
# Per process-group communication buffers (NCCL channels, ~0.35-0.4 GB per group: AIConfigurator,
# REFERENCE Part D) and the allocator/framework reserve (CUDA context, cuBLAS/TE workspaces).
COMM_BUFFER_BYTES = 0.4e9
FRAMEWORK_RESERVE_BYTES = 2.0 * GIB
# Caching-allocator fragmentation on activations (fraction); measured 5-15% in PyTorch traces.
FRAGMENTATION = 0.10
# Bytes per stored logit: bf16 logits plus the fp32 copy the cross-entropy keeps for backward.
LOGIT_BYTES = 6.0
# Pure fp32 training (no mixed precision; e.g. the CPU reference runs): 4-byte weights and
# gradients, AdamW's two fp32 moments (no separate master copy), 4-byte activations, and fp32
# logits plus the fp32 log-probabilities the cross-entropy keeps.
FP32_WEIGHT_BYTES, FP32_GRAD_BYTES, FP32_OPTIM_BYTES, FP32_LOGIT_BYTES = 4.0, 4.0, 8.0, 8.0

REC_NONE, REC_SELECTIVE, REC_FULL = (RECOMPUTE_CODES.index(x) for x in ("none", "selective", "full"))

MEMORY_COMPONENTS = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "embeddings_logits",
    "zero3_buffers",
    "comm_buffers",
    "framework_reserve",
)


@dataclass(frozen=True)
class StageShape:
    """How many dense and MoE layers the first and the last pipeline stage hold (arrays)."""

    first_dense: np.ndarray
    first_moe: np.ndarray
    last_dense: np.ndarray
    last_moe: np.ndarray
    layers_per_stage: np.ndarray


def stage_shape(model, lay: LayoutTable) -> StageShape:
    """Layers per stage with ceil division (the slowest/heaviest stage decides)."""
    lps = lay.dims.layers_per_stage(model)
    if model.moe_layers == 0:
        zero = np.zeros_like(lps)
        return StageShape(lps, zero, lps, zero, lps)
    if model.first_dense_layers or model.moe_layers == model.layers:
        first_dense = np.minimum(model.first_dense_layers, lps)
        first_moe = lps - first_dense
        last_moe = np.minimum(model.moe_layers, lps)
        last_dense = lps - last_moe
    else:  # interleaved MoE layers (e.g. every other layer): spread evenly
        first_moe = np.rint(lps * model.moe_layers / model.layers).astype(np.int64)
        first_dense = lps - first_moe
        last_moe, last_dense = first_moe, first_dense
    return StageShape(first_dense, first_moe, last_dense, last_moe, lps)


def layer_params_per_rank(model, lay: LayoutTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense layer, MoE layer non-expert part, MoE layer routed-expert part) parameters per rank."""
    tp = lay["tp"].astype(np.float64)
    attn = model.attn_params_per_layer / tp + model.norm_params_per_layer
    dense = attn + model.dense_mlp_params / tp
    moe_shared = (
        attn
        + (model.shared_expert_params / tp if model.is_moe else 0.0)
        + (model.router_params if model.is_moe else 0.0)
    )
    experts = (
        (model.num_experts * model.expert_params / (lay["ep"] * lay["etp"])) if model.is_moe else 0.0 * tp
    )
    return dense, moe_shared, np.broadcast_to(experts, tp.shape).astype(np.float64)


def stage_params_at(
    model, lay: LayoutTable, stage: np.ndarray, n_dense: np.ndarray, n_moe: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(non-expert, routed-expert) parameters per rank of pipeline stage ``stage`` (one row per stage).

    The stage holds ``n_dense`` dense and ``n_moe`` MoE layers; stage 0 adds the input embedding,
    stage pp-1 the final norm and the LM head (its own copy of a tied matrix when pp > 1); with
    pp = 1 both are the same stage and hold both.
    """
    dense_p, moe_p, expert_p = layer_params_per_rank(model, lay)
    tp = lay["tp"].astype(np.float64)
    pp = lay["pp"]
    embed = model.embedding_params / tp
    head = (model.head_params / tp) + model.final_norm_params
    if model.tie_embeddings:
        head = head + np.where(pp > 1, embed, 0.0)
    nonexp = (
        n_dense * dense_p
        + n_moe * moe_p
        + np.where(stage == 0, embed, 0.0)
        + np.where(stage == pp - 1, head, 0.0)
    )
    return nonexp, n_moe * expert_p


def stage_params(model, lay: LayoutTable) -> dict[str, np.ndarray]:
    """Parameters per rank on the first and the last pipeline stage, non-expert and routed-expert."""
    st = stage_shape(model, lay)
    first_nonexp, first_exp = stage_params_at(model, lay, lay["pp"] * 0, st.first_dense, st.first_moe)
    last_nonexp, last_exp = stage_params_at(model, lay, lay["pp"] - 1, st.last_dense, st.last_moe)
    return {
        "first_nonexp": first_nonexp,
        "last_nonexp": last_nonexp,
        "first_exp": first_exp,
        "last_exp": last_exp,
    }


def activation_bytes_per_layer(
    model,
    *,
    seq_len: float | np.ndarray,
    micro_batch: np.ndarray,
    tp: np.ndarray,
    cp: np.ndarray,
    sp: np.ndarray,
    recompute: np.ndarray,
    moe: bool,
    flash_attention: bool = True,
    dropout: bool = False,
    ep: np.ndarray | None = None,
    etp: np.ndarray | None = None,
) -> np.ndarray:
    """Activation bytes one transformer layer keeps for backward, per rank, for one micro-batch.

    Korthikanti et al. 2022, Table 2, term by term (16-bit activations, s = local sequence s/cp):
    replicated across TP unless SP: two norm inputs 4sbh, QKV-GEMM input 2sbh, MLP input 2sbh,
    dropout masks 2sbh (when dropout is used); sharded by TP: Q, K, V (2sb per element of
    a*dq + 2*g*dk), attention output 2sb*a*dv, the MLP's intermediate tensors (GELU: 4sbF;
    gated: 6sbF), and without FlashAttention the 5*a*s^2*b softmax/dropout term.
    With F = 4h, MHA, dropout and no flash this is exactly s*b*h*(10 + 24/t + 5as/(ht)).
    """
    s = np.asarray(seq_len, dtype=np.float64) / cp
    b = micro_batch.astype(np.float64)
    t = tp.astype(np.float64)
    sb = s * b
    h = float(model.hidden)
    sp_div = np.where(sp > 0, t, 1.0)
    replicated = sb * h * (8.0 + (2.0 if dropout else 0.0)) / sp_div
    if model.is_mla:
        q_elems = model.heads * model.qk_head_dim
        kv_elems = model.heads * (model.qk_head_dim + model.v_dim)  # up-projected K and V
        latent = model.kv_lora_rank + model.qk_rope_head_dim + model.q_lora_rank  # compressed inputs
        qkv = 2.0 * sb * (q_elems + kv_elems) / t + 2.0 * sb * latent / sp_div
    else:
        qkv = 2.0 * sb * (model.heads * model.head_dim + 2 * model.kv_heads * model.head_dim) / t
    attn_out = 2.0 * sb * model.heads * model.v_dim / t
    if flash_attention:
        core = 4.0 * sb * model.heads / t  # fp32 log-sum-exp per row
    else:
        core = 5.0 * model.heads * s * sb / t
    if moe:
        mult = 6.0 if model.gated_mlp else 4.0
        # Routed copies arrive balanced: T/sp * k * etp rows per rank after the ETP all-gather.
        e_tp = t if etp is None else np.asarray(etp, dtype=np.float64)
        routed = 2.0 * routed_activation_elems(model, sb, sp_div, e_tp)
        shared = mult * sb * model.shared_expert_ffn / t
        mlp = routed + shared
    else:
        mult = 6.0 if model.gated_mlp else 4.0
        mlp = mult * sb * model.ffn_hidden / t
    full = replicated + qkv + attn_out + core + mlp
    selective = full - core
    checkpoint_only = 2.0 * sb * h / sp_div  # full recompute keeps the layer input only
    return np.select(
        [recompute == REC_FULL, recompute == REC_SELECTIVE], [checkpoint_only, selective], default=full
    )


def inflight_microbatches(lay: LayoutTable, num_microbatches: np.ndarray) -> np.ndarray:
    """Micro-batches whose activations the first stage holds at the 1F1B peak (Narayanan et al. 2021).

    1F1B: min(p, m); interleaved 1F1B with v chunks multiplies by 1 + (p-1)/(p*v) (Megatron estimator).
    """
    p = lay["pp"].astype(np.float64)
    v = lay["vpp"].astype(np.float64)
    m = num_microbatches.astype(np.float64)
    base = np.minimum(p, m)
    interleave = np.where(v > 1, 1.0 + (p - 1.0) / (p * v), 1.0)
    return base * interleave


def stage_inflight(lay: LayoutTable, stage: np.ndarray) -> np.ndarray:
    """Micro-batches whose activations stage ``stage`` holds at the 1F1B peak: min(p - i, m).

    Stage i has p - i forwards in flight before its first backward (Narayanan et al. 2021); the
    interleaved factor of :func:`inflight_microbatches` applies to every stage but the last, which
    runs each micro-batch's backward right after its forward.
    """
    p = lay["pp"].astype(np.float64)
    v = lay["vpp"].astype(np.float64)
    m = lay["grad_accum"].astype(np.float64)
    base = np.minimum(p - stage, m)
    interleave = np.where(v > 1, 1.0 + (p - 1.0) / (p * v), 1.0)
    return base * np.where(stage < p - 1, interleave, 1.0)


def stage_memory(
    model,
    lay: LayoutTable,
    *,
    seq_len: int,
    stage: np.ndarray,
    n_dense: np.ndarray,
    n_moe: np.ndarray,
    flash_attention: bool = True,
    dropout: bool = False,
    framework_reserve_bytes: float = FRAMEWORK_RESERVE_BYTES,
    comm_buffer_bytes: float = COMM_BUFFER_BYTES,
    fragmentation: float = FRAGMENTATION,
    frozen_weights: bool = False,
) -> dict[str, np.ndarray]:
    """Bytes per device of one pipeline stage per row, by component (sums to ``total``).

    Each row of ``lay`` is one stage of a layout: stage index ``stage``, ``n_dense`` dense and
    ``n_moe`` MoE layers, and the row's own recompute mode. Stage 0 adds the embedding output of its
    in-flight micro-batches, the last stage the logits. :func:`memory_breakdown` is this function on
    the first and the last stage of a uniform pipeline; ``autopar.search.uneven`` calls it on every
    stage of an uneven one. The reserve, buffer and fragmentation defaults are CUDA/NCCL figures; a
    calibration for another runtime (e.g. CPU/gloo validation runs) overrides them.
    """
    dense_p, moe_p, expert_p = layer_params_per_rank(model, lay)
    tp = lay["tp"].astype(np.float64)
    pp = lay["pp"]
    first, last = stage == 0, stage == pp - 1
    nonexp, exp = stage_params_at(model, lay, stage, n_dense, n_moe)

    dims = lay.dims
    shard = dims.shard_size.astype(np.float64)
    # Expert parameters are replicated over expert-data-parallel ranks only.
    eshard = dims.expert_shard
    zero = lay["zero"]
    offload = lay["offload"] > 0
    fp32 = lay["precision"] == PRECISION_CODES.index("fp32")
    w_bytes = np.where(fp32, FP32_WEIGHT_BYTES, WEIGHT_BYTES)
    g_bytes = np.where(fp32, FP32_GRAD_BYTES, GRAD_BYTES)
    o_bytes = np.where(fp32, FP32_OPTIM_BYTES, OPTIM_BYTES)
    act_scale = np.where(fp32, 2.0, 1.0)  # activation_bytes_per_layer counts 16-bit elements

    w = w_bytes * (np.where(zero >= 3, nonexp / shard, nonexp) + np.where(zero >= 3, exp / eshard, exp))
    g = g_bytes * (np.where(zero >= 2, nonexp / shard, nonexp) + np.where(zero >= 2, exp / eshard, exp))
    o = o_bytes * (np.where(zero >= 1, nonexp / shard, nonexp) + np.where(zero >= 1, exp / eshard, exp))
    o = np.where(offload, 0.0, o)
    if frozen_weights:  # LoRA-style: no gradients or optimizer state for the frozen base weights
        g, o = g * 0.0, o * 0.0

    common: dict[str, Any] = dict(
        seq_len=seq_len,
        micro_batch=lay["micro_batch"],
        tp=lay["tp"],
        cp=lay["cp"],
        sp=lay["sp"],
        recompute=lay["recompute"],
        flash_attention=flash_attention,
        dropout=dropout,
        etp=lay["etp"],
    )
    act_dense = activation_bytes_per_layer(model, moe=False, **common) * act_scale
    act_moe = (
        activation_bytes_per_layer(model, moe=True, **common) * act_scale if model.is_moe else act_dense * 0
    )
    per_mb = n_dense * act_dense + n_moe * act_moe
    inflight = stage_inflight(lay, stage)
    # Full recompute re-materializes one layer at a time during backward: add one layer's full set.
    full_layer = (
        activation_bytes_per_layer(model, moe=model.is_moe, **{**common, "recompute": lay["recompute"] * 0})
        * act_scale
    )
    working = np.where(lay["recompute"] == REC_FULL, full_layer, 0.0)
    act = per_mb * inflight + working

    s_local = seq_len / lay["cp"]
    sb = s_local * lay["micro_batch"]
    sp_div = dims.sp_divisor.astype(np.float64)
    embed_out = 2.0 * act_scale * sb * model.hidden / sp_div * inflight
    logits = np.where(fp32, FP32_LOGIT_BYTES, LOGIT_BYTES) * sb * model.vocab / tp
    emb = np.where(first, embed_out, 0.0) + np.where(last, logits, 0.0)

    max_layer = np.maximum(dense_p, moe_p + expert_p * (1 if model.is_moe else 0))
    z3 = np.where(zero >= 3, 2.0 * max_layer * w_bytes + max_layer * g_bytes * 2, 0.0)

    groups = dims.process_groups.astype(np.float64)
    out: dict[str, Any] = {
        "weights": w,
        "gradients": g,
        "optimizer": o,
        "activations": act * (1 + fragmentation),
        "embeddings_logits": emb,
        "zero3_buffers": z3,
        "comm_buffers": comm_buffer_bytes * groups,
        "framework_reserve": np.full(len(lay), float(framework_reserve_bytes)),
    }
    out["total"] = sum(out[k] for k in MEMORY_COMPONENTS)
    # What differs between stages (the buffers and the reserve do not): decides the loaded stage.
    out["stage_bytes"] = w + g + o + act * (1 + fragmentation) + emb + z3
    out["state"] = w + g + o
    return out


def memory_breakdown(
    model,
    lay: LayoutTable,
    *,
    seq_len: int,
    flash_attention: bool = True,
    dropout: bool = False,
    framework_reserve_bytes: float = FRAMEWORK_RESERVE_BYTES,
    comm_buffer_bytes: float = COMM_BUFFER_BYTES,
    fragmentation: float = FRAGMENTATION,
    frozen_weights: bool = False,
) -> dict[str, np.ndarray]:
    """Bytes per device for the most loaded pipeline stage (first or last), by component.

    :func:`stage_memory` on the first and on the last stage of the uniform split of
    :func:`stage_shape`; the heavier one is reported (``stage``).
    """
    st = stage_shape(model, lay)
    kw: dict[str, Any] = dict(
        seq_len=seq_len,
        flash_attention=flash_attention,
        dropout=dropout,
        framework_reserve_bytes=framework_reserve_bytes,
        comm_buffer_bytes=comm_buffer_bytes,
        fragmentation=fragmentation,
        frozen_weights=frozen_weights,
    )
    first = stage_memory(model, lay, stage=lay["pp"] * 0, n_dense=st.first_dense, n_moe=st.first_moe, **kw)
    last = stage_memory(model, lay, stage=lay["pp"] - 1, n_dense=st.last_dense, n_moe=st.last_moe, **kw)
    use_first = first["stage_bytes"] >= last["stage_bytes"]
    out = {k: np.where(use_first, first[k], last[k]) for k in MEMORY_COMPONENTS}
    out["total"] = sum((out[k] for k in MEMORY_COMPONENTS), np.zeros(len(lay)))
    out["stage"] = np.where(use_first, 0, lay["pp"] - 1)
    # Model state (weights + gradients + optimizer) of each end stage, for invariants and reports.
    out["state_first"] = first["state"]
    out["state_last"] = last["state"]
    return out
