"""Token embedding and the LM head with its loss: one block kind's costs in one place.

Parameters: ``vocab x h`` for the input embedding and again for an untied output layer
(:meth:`ModelSpec` counts them). Forward FLOPs per token of the head: 2 h V. TP splits the vocabulary
(Megatron's vocab-parallel embedding and ColumnParallelLinear output layer); the head sits on the last
pipeline stage (rank 0 under a V-shaped schedule). Training memory: the embedding output of the
first stage's in-flight micro-batches and the logits of the last (:mod:`autopar.memory`).
"""

from __future__ import annotations

import numpy as np

from autopar.blocks.context import SlotContext, gemm_time

KIND = "embedding"


def params(model) -> float:
    """Parameters of one vocab x h matrix (the input embedding; the head is another unless tied)."""
    return float(model.vocab * model.hidden)


def embed_output_elems(model, sb, sp_div) -> np.ndarray:
    """Elements of the embedding output one micro-batch keeps (the first block's input), per rank:
    ``sb h`` split by sequence parallelism, 16-bit counted as 2 per element."""
    return 2.0 * sb * model.hidden / sp_div


def logits_elems(model, sb, tp) -> np.ndarray:
    """Logits of one micro-batch per rank (vocab-parallel): ``sb V / tp``."""
    return sb * model.vocab / tp


def head_flops_per_token(model) -> float:
    """Forward FLOPs per token of the LM head GEMM, unsharded."""
    return 2.0 * model.hidden * model.vocab


def head_time(model, ctx: SlotContext) -> np.ndarray:
    """Forward seconds of the LM head GEMM and the loss per rank per micro-batch (vocab-parallel).

    Megatron's output layer is a tensor_parallel.ColumnParallelLinear, not a TE module, so it runs in
    bf16 under every FP8/FP4 recipe (the NVFP4 paper keeps the output head in bf16 too); the loss
    reads and writes the fp32 logits.
    """
    co, is_low = ctx.co, ctx.is_low
    head_peak = np.where(is_low, ctx.bf16_peak, ctx.peak)
    head_eff = np.where(is_low, co.gemm_eff["bf16"], ctx.geff)
    v_loc = model.vocab / ctx.tp
    t = gemm_time(
        co,
        head_peak,
        head_eff,
        ctx.T,
        v_loc,
        float(model.hidden),
        ctx.elem,
        np.where(is_low, co.gemm_half_dim, ctx.ghd),
    )
    return t + ctx.T * model.vocab / ctx.tp * 4.0 * 2 / co.hbm_bw
