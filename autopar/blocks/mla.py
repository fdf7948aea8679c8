"""Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 Sec. 2.1): one block kind's costs.

Parameters: :attr:`ModelSpec.attn_params_per_layer` (the reader's count). Forward GEMMs per token
(HF ``DeepseekV3Attention``): the down-projections ``q_a_proj`` h -> q_lora_rank (absent when
q_lora_rank is 0) and ``kv_a_proj_with_mqa`` h -> kv_lora_rank + d_rope, the up-projections
``q_b_proj`` (or ``q_proj``) -> a d_qk and ``kv_b_proj`` kv_lora_rank -> a (d_nope + d_v), and
``o_proj`` a d_v -> h. The core is softmax attention with d_qk = d_nope + d_rope and d_v
(:func:`autopar.blocks.attention.core_time`). TP splits the heads (up-projections and o_proj; the
down-projections and latents are replicated), CP passes the compressed latent and rope key
(:func:`cp_chunk_elems`), unsharded by TP. Serving state: the latent cache, kv_lora_rank + d_rope
elements per token and layer. DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5; HF
``DeepseekV32Indexer``) adds a lightning indexer: ``wq_b`` q_lora_rank -> index_heads x index_dim,
``wk`` h -> index_dim and ``weights_proj`` h -> index_heads (replicated, as the down-projections), a
score of every earlier key per query and index head (an MQA-shaped GEMM, :func:`indexer_time`), and
the core attends to the ``index_topk`` best keys only (``core_time`` prices it as a window of that
many keys); its key is cached beside the latent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autopar.blocks import attention
from autopar.blocks.attention import core_time, rope_elems  # noqa: F401  (MLA's core is attention's)

KIND = "mla"


def present(model) -> bool:
    return bool(model.is_mla)


def params(model) -> float:
    """Parameters of one MLA mixer (the model reader's count, with the latent norms)."""
    return float(model.attn_params_per_layer)


def gemm_shapes(model, tp) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
    """(up-projection, other) (N, K) forward GEMM shapes per rank, M = tokens."""
    h = float(model.hidden)
    a = model.heads
    qd = a * model.qk_head_dim
    q_up = (qd / tp, model.q_lora_rank) if model.q_lora_rank else (qd / tp, h)
    up = [q_up, (a * (model.qk_nope_head_dim + model.v_dim) / tp, model.kv_lora_rank)]
    down = [(model.kv_lora_rank + model.qk_rope_head_dim, h), (h, a * model.v_dim / tp)]
    if model.q_lora_rank:
        down.append((model.q_lora_rank, h))
    if model.index_topk:  # the DSA indexer's wq_b, wk and weights_proj
        ih, idim = model.index_heads, model.index_head_dim
        down += [(ih * idim, model.q_lora_rank), (idim, h), (ih, h)]
    return up, down


def gemms(model, f, T, tp) -> tuple[Any, Any]:
    """(all linear GEMMs, the up-projections that ``mla_up_proj`` recompute repeats)."""
    up_s, down_s = gemm_shapes(model, tp)
    up = f(T, *up_s[0]) + f(T, *up_s[1])
    down = f(T, *down_s[0]) + f(T, *down_s[1])
    for shape in down_s[2:]:
        down = down + f(T, *shape)
    return up + down, up


def indexer_flops_per_token(model, s_kv: float) -> float:
    """Forward FLOPs per token of a DSA indexer's causal scores over a ``s_kv``-token sequence: q_h . k
    for every index head and earlier key (2 index_heads index_dim per key, s_kv / 2 keys on average;
    the per-head weighting is not counted)."""
    return 2.0 * model.index_heads * model.index_head_dim * s_kv * 0.5 if model.index_topk else 0.0


def flops_per_token(model, s_kv: float = 0.0) -> float:
    """Forward FLOPs per token of one block's mixer, unsharded: projections and the causal core."""
    up, down = gemm_shapes(model, 1.0)
    if model.index_topk and s_kv > 0:  # each query attends min(i, top-k) keys: a causal window's count
        core = attention.core_flops_per_token(model, model._context(int(s_kv), model.index_topk, True), False)
    else:
        core = attention.core_flops_per_token(model, s_kv)
    return sum(2.0 * N * K for N, K in up + down) + core + indexer_flops_per_token(model, s_kv)


def cp_chunk_elems(model, tp) -> Any:
    """Elements per token one ring-CP step sends: the compressed latent and the shared rope key."""
    return (model.kv_lora_rank + model.qk_rope_head_dim) + 0.0 * np.asarray(tp)


def qkv_dgrad_k(model, tp) -> Any:
    """K of the attention input's data-gradient GEMM (the SP re-gather's cover), as for attention."""
    return attention.qkv_dgrad_k(model, tp)


def activation_elems(model, sb, t, gi, drop_norm, sp_div) -> tuple[Any, Any]:
    """(Q, K, V elements kept for backward, attention output elements) per rank: the up-projected
    Q, K, V (dropped by ``norm_act``'s mla_up_proj) and the compressed inputs (latents, kept)."""
    q_elems = model.heads * model.qk_head_dim
    kv_elems = model.heads * (model.qk_head_dim + model.v_dim)  # up-projected K and V
    latent = model.kv_lora_rank + model.qk_rope_head_dim + model.q_lora_rank  # compressed inputs
    up = 2.0 * sb * (q_elems + kv_elems) / t
    qkv = np.where(drop_norm, 0.0, up) + 2.0 * sb * latent / sp_div * gi
    if model.index_topk:  # the indexer's queries, key and head weights, and the top-k indices (int32)
        ih, idim = model.index_heads, model.index_head_dim
        qkv = qkv + 2.0 * sb * (ih * idim + idim + ih + 2.0 * model.index_topk) / sp_div
    return qkv, attention._attn_out(model, sb, t, gi)


def kv_cache_elems(model) -> float:
    """Serving state: latent-cache elements per token of one layer (and a DSA indexer's key)."""
    return float(model.kv_cache_elems_per_token_per_layer)
