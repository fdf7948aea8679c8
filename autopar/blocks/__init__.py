"""Block kinds: each layer kind's costs in one module.

A block module declares, for one layer of its kind, its parameters (``params``), forward FLOPs per
token (``flops_per_token``, unsharded: the golden tests check it against the papers' formulas), its
forward GEMM shapes per rank (``gemm_shapes``/``gemms``, from which the GEMM time, the block-scaling
traffic and the recomputed GEMMs follow), its memory-bound traffic, the activations it keeps for
backward under each recompute mode, its serving state (KV cache or recurrent state) and how TP, CP and
EP split it (in each module's docstring and its communication functions):

- :mod:`~autopar.blocks.attention`: softmax attention, MHA/GQA/MQA, gated output, sliding window;
- :mod:`~autopar.blocks.mla`: multi-head latent attention;
- :mod:`~autopar.blocks.mlp`: the gated or plain MLP;
- :mod:`~autopar.blocks.moe_ffn`: the MoE layer (router, routed and shared experts, EP/ETP);
- :mod:`~autopar.blocks.mamba`: Mamba2 (SSD) and Mamba1 mixers;
- :mod:`~autopar.blocks.gated_deltanet`: Gated DeltaNet linear attention;
- :mod:`~autopar.blocks.embedding`: the embedding and the LM head with its loss;
- :mod:`~autopar.blocks.encoder`: the bidirectional encoder layer (BERT, an encoder-decoder's encoder
  stack) and Whisper's conv front-end;
- :mod:`~autopar.blocks.cross_attention`: an encoder-decoder's decoder blocks' cross-attention.

A pipeline stage is :class:`~autopar.blocks.stage.StageBlocks`: how many blocks of each kind it holds (per layout row).
:func:`autopar.latency.stage_slot` and :func:`autopar.memory.stage_memory` cost a stage as the sum
over its blocks of each block's cost. Placement: a stage holds the blocks of its window of the model's
stated block order (``ModelSpec.block_pattern``: hybrid stacks, interleaved MoE;
:func:`autopar.blocks.stage.window`); without one, dense and MoE layers sit where the model puts them
(a dense prefix exactly, interleaved MoE layers spread evenly) and a hybrid model's mixers are its mix
in proportion (:mod:`autopar.hybrid`); sliding and full attention layers are always the mix in
proportion;an encoder-decoder
model's stage is its decoder blocks, its share of the encoder blocks on the encoder positions and the
cross-attentions (``autopar.latency._encdec_slot``; pp = 1 only). Adding a layer kind
is one module here (and its golden test in ``tests/test_blocks.py``).
"""

from __future__ import annotations

from types import ModuleType

from autopar.blocks import (
    attention,
    cross_attention,
    embedding,
    encoder,
    gated_deltanet,
    mamba,
    mla,
    mlp,
    moe_ffn,
)
from autopar.blocks.stage import StageBlocks, StageMixers, stage_blocks

__all__ = ["KINDS", "StageBlocks", "StageMixers", "mixer", "stage_blocks"]

KINDS: tuple[ModuleType, ...] = (
    attention,
    mla,
    mlp,
    moe_ffn,
    mamba,
    gated_deltanet,
    embedding,
    encoder,
    cross_attention,
)


def mixer(model) -> ModuleType:
    """The softmax-attention block module of ``model``: MLA or MHA/GQA/MQA."""
    return mla if model.is_mla else attention
