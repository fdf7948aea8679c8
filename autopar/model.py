"""Model descriptions: a normalized :class:`ModelSpec` and a loader for presets and HF ``config.json``.

``load_model`` accepts a preset id (``list_presets()``), a path to a Hugging Face ``config.json`` (or a
directory holding one), or a dict (an HF config, or raw dimensions keyed by :class:`ModelSpec` field
names, e.g. one row of ``published_runs_dev.csv``). Every preset is itself a verbatim subset of a
published ``config.json`` run through the same normalizer, so the presets exercise the HF path.

Parameter-count conventions (they reproduce the published totals of Llama, Mixtral, DeepSeek-V3, Qwen3,
gpt-oss and others to well under 1 %; see ``tests/test_model.py``):

* Linear weights, QKV biases (when the config has them) and norm weights are counted. Other biases
  (output-projection, MLP, expert and router biases of gpt-oss or GPT-2), QK-norm weights (Qwen3),
  attention sinks (gpt-oss), Grok-1's extra post-sublayer norms and learned absolute position
  embeddings (GPT-2/3) are not: each is below 0.1 % of the total of the models shipped here.
* ``total_params`` and ``active_params`` include the input embedding and the output head (once if
  tied) and exclude multi-token-prediction (MTP) modules, as DeepSeek and Mistral publish them.
  OpenAI's 5.1 B "active" for gpt-oss-120b counts the unembedding only, i.e.
  ``active_params - embedding_params``.
* The model's arithmetic is what the config describes; quantization and storage dtype are ignored.

Refuses rather than guesses: an unknown architecture raises
:class:`~autopar.errors.UnsupportedArchitecture`, a missing or malformed field
:class:`~autopar.errors.ModelConfigError`.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from autopar.block_order import block_pattern
from autopar.errors import ModelConfigError, UnsupportedArchitecture
from autopar.files import read_text
from autopar.limits import MAX_CONFIG_BYTES, json_int

__all__ = [
    "ModelSpec",
    "load_model",
    "list_presets",
    "read_config_file",
    "check_context",
    "check_costed",
    "SUPPORTED_MODEL_TYPES",
    "raw_config",
    "classic_decoder",
    "read_by_own_code",
]


class ModelSpec(BaseModel):
    """Normalized architecture of a decoder-only model: dense, MoE, GQA/MLA, and hybrid stacks.

    A model is ``layers`` blocks. Each block has a *mixer* (self-attention by default; Gated DeltaNet
    linear attention on ``linear_attn_layers`` blocks; a Mamba SSM on ``mamba_layers`` blocks, beside
    the attention of every block when ``mamba_parallel``; none on ``no_mixer_layers`` blocks) and a
    *feed-forward* part (dense MLP, routed MoE on ``moe_layers`` blocks, none on ``no_ffn_layers``
    blocks), plus ``norms_per_layer`` hidden-size norms.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    source: str = ""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int  # intermediate size of dense-layer MLPs (0 if every layer is MoE)
    gated_mlp: bool = True  # SwiGLU/GeGLU: 3 matrices; plain GELU/ReLU^2 MLP: 2 matrices
    vocab: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False  # attention output-projection bias
    mlp_bias: bool = False  # biases of the dense MLP's matrices
    head_bias: bool = False  # LM-head bias (Phi-3.5-MoE, Phi-2)
    norm: Literal["rmsnorm", "layernorm", "layernorm_nobias"] = "rmsnorm"  # h, 2h (weight+bias), h
    norms_per_layer: int = 2  # hidden-size norms per block: 2 pre-norms; 4 sandwich (Gemma 2/3, GLM-4); 1
    qk_norm: Literal["none", "head", "full"] = "none"  # per-head-shared (Qwen3) or per-head weights (OLMo 2)
    parallel_block: bool = False  # attention and MLP read the same input (GPT-J, Falcon, Cohere)
    attn_output_gate: bool = False  # gated attention: q projection also emits a per-channel gate (Qwen3-Next)
    attn_head_gate: bool = False  # a per-head output gate, its own projection h -> heads (Laguna g_proj)
    num_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden: int = 0  # per routed expert
    # Group-limited routing (DeepSeek-V2/V3 n_group / topk_group): the experts form moe_router_groups
    # equal groups and a token's k experts come from at most moe_router_topk_groups of them (DeepSeek-V3
    # puts one group per node: M = 4 nodes per token). 1 / 0: unlimited.
    moe_router_groups: int = 1
    moe_router_topk_groups: int = 0
    # Latent MoE (Nemotron 3 Super, NemotronHMoE): a token is projected h -> moe_latent_size before the
    # routed experts, which work in that width, and back after; the router and the shared experts read h.
    moe_latent_size: int = 0
    shared_expert_ffn: int = 0  # total intermediate size of always-active shared experts per MoE layer
    moe_layers: int = 0  # number of MoE layers; dense layers = layers - moe_layers - no_ffn_layers
    first_dense_layers: int = 0  # leading dense layers (DeepSeek first_k_dense_replace)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0  # MLA when > 0
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): a lightning indexer (index_heads x index_head_dim
    # queries from the q latent, one shared key from h) scores every earlier key; the MLA core attends
    # to the index_topk best. 0: dense attention.
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    sliding_window_layers: int = 0
    # ---- per-layer attention shapes. heads, kv_heads, head_dim (Q and K) and v_head_dim (V; 0: as
    # head_dim) are the full-attention layers'; sliding-window layers may have their own (Gemma 4,
    # MiMo-V2-Flash, Laguna), 0 meaning "as the full-attention layers". Each layer is costed by its own
    # shape (:meth:`attn_views`).
    swa_heads: int = 0
    swa_kv_heads: int = 0
    swa_head_dim: int = 0
    swa_v_head_dim: int = 0
    # full-attention layers without a V projection: V is K's projection (Gemma 4 attention_k_eq_v)
    full_k_eq_v: bool = False
    mtp_layers: int = 0
    max_position: int = 0  # longest sequence the config supports (rope-scaled limit where it says so)
    # ---- hybrid blocks
    no_mixer_layers: int = 0  # blocks with a feed-forward part only (Nemotron-H '-' and 'E')
    no_ffn_layers: int = 0  # blocks with a mixer only (Nemotron-H 'M' and '*')
    linear_attn_layers: int = 0  # Gated DeltaNet blocks (Qwen3-Next linear_attention)
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_head_dim: int = 0
    linear_v_head_dim: int = 0
    linear_conv: int = 0  # short causal depthwise convolution width
    mamba_layers: int = 0
    mamba_version: int = 0  # 1: Mamba (selective scan, Jamba); 2: Mamba2 (SSD: Nemotron-H, Falcon-H1)
    mamba_parallel: bool = False  # Mamba beside attention in every block (Falcon-H1)
    mamba_inner: int = 0  # d_inner (= mamba heads x head dim for Mamba2)
    mamba_heads: int = 0  # Mamba2 heads
    mamba_state: int = 0  # d_state
    mamba_groups: int = 0  # Mamba2 B/C groups
    mamba_conv: int = 0
    mamba_dt_rank: int = 0  # Mamba1 dt projection rank
    mamba_conv_bias: bool = True
    mamba_gated_norm: bool = True  # Mamba2 gated RMSNorm before out_proj
    # ---- block order: two characters per block, its mixer ('a' attention, 'l' Gated DeltaNet,
    # 'm' Mamba, '-' none) and its feed-forward part ('d' dense MLP, 'e' MoE, '-' none), in the
    # model's order. Set by the config reader where the kinds are not uniform over the stack (hybrid
    # models, interleaved MoE); pipeline stages are then costed by the blocks they really hold
    # (:func:`autopar.blocks.stage.window`). Empty: a stage holds the model's mix in proportion.
    block_pattern: str = ""
    # ---- towers of a multimodal wrapper: counted and reported apart, not part of the totals
    vision_params: int = 0
    audio_params: int = 0
    # ---- encoders and encoder-decoder models (read by autopar.encoders; costed by
    # autopar.blocks.encoder and autopar.blocks.cross_attention). A "decoder" is causal; an
    # "encoder" (BERT) attends bidirectionally; an "encoder_decoder" (Whisper, SeamlessM4T text) is
    # an encoder stack of ``encoder_layers`` blocks and a decoder stack of ``layers`` blocks whose
    # every block adds cross-attention to the encoder output.
    arch: Literal["decoder", "encoder", "encoder_decoder"] = "decoder"
    post_norm: bool = False  # BERT: the norm after each residual add (same parameters and FLOPs)
    lm_head: bool = True  # a vocabulary projection and loss after the last block (BertModel: none)
    final_norm: bool = True  # a norm after the last block (a post-norm encoder has none)
    k_bias: bool = True  # with qkv_bias: the key projection has a bias too (Whisper's has none)
    # counted once, outside blocks, embedding and head: learned position and token-type tables,
    # embedding and encoder-final norms, pooler, MLM transform, classifier, conv front-end
    extra_params: int = 0
    encoder_layers: int = 0
    encoder_heads: int = 0  # head_dim = hidden / encoder_heads
    encoder_ffn_hidden: int = 0
    encoder_seq: int = 0  # encoder positions per sample (Whisper: 1500 frames); 0: the job's seq_len
    frontend_mels: int = 0  # Whisper's conv front-end input channels (mel bins); 0: none
    warnings: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        def bad(msg: str, hint: str | None = None) -> ModelConfigError:
            return ModelConfigError(f"model {self.name!r}: {msg}", hint)

        for f in ("hidden", "layers", "heads", "kv_heads", "head_dim", "vocab", "norms_per_layer"):
            if getattr(self, f) <= 0:
                raise bad(f"{f} must be positive, got {getattr(self, f)}")
        for f in ModelSpec.model_fields:
            v = getattr(self, f)
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                raise bad(f"{f} must be >= 0, got {v}")
        if self.heads % self.kv_heads:
            raise bad(f"heads ({self.heads}) is not a multiple of kv_heads ({self.kv_heads})")
        if self.moe_layers + self.no_ffn_layers > self.layers:
            raise bad(
                f"moe_layers ({self.moe_layers}) + no_ffn_layers ({self.no_ffn_layers}) exceed layers ({self.layers})"
            )
        if self.attn_layers < 0:
            raise bad(f"linear_attn_layers, mamba_layers and no_mixer_layers exceed layers ({self.layers})")
        if self.num_experts:
            if not 1 <= self.moe_topk <= self.num_experts:
                raise bad(f"moe_topk must be in 1..num_experts ({self.num_experts}), got {self.moe_topk}")
            if self.moe_ffn_hidden <= 0:
                raise bad("moe_ffn_hidden must be positive for a MoE model")
            if not 0 <= self.moe_latent_size < self.hidden:
                raise bad(
                    f"moe_latent_size must be in 0..hidden-1 ({self.hidden - 1}), got {self.moe_latent_size}"
                )
            if self.moe_layers == 0:
                raise bad(
                    "num_experts > 0 but moe_layers is 0", "set moe_layers (= layers if every layer is MoE)"
                )
        elif (
            self.moe_layers
            or self.moe_topk
            or self.moe_ffn_hidden
            or self.shared_expert_ffn
            or self.moe_latent_size
        ):
            raise bad("MoE fields are set but num_experts is 0")
        if self.dense_layers and self.ffn_hidden <= 0:
            raise bad(f"{self.dense_layers} dense layers but ffn_hidden is {self.ffn_hidden}")
        if self.first_dense_layers > self.dense_layers:
            raise bad(
                f"first_dense_layers ({self.first_dense_layers}) exceeds dense layers ({self.dense_layers})"
            )
        if self.sliding_window_layers > self.attn_layers:
            raise bad(
                f"sliding_window_layers ({self.sliding_window_layers}) exceeds attention layers ({self.attn_layers})"
            )
        if self.sliding_window_layers and self.sliding_window <= 0:
            raise bad("sliding_window_layers > 0 but sliding_window is 0")
        if self.kv_lora_rank and not (self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim):
            raise bad("MLA (kv_lora_rank > 0) needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
        if self.index_topk or self.index_heads or self.index_head_dim:
            if not (self.kv_lora_rank and self.q_lora_rank):
                raise bad(
                    "a sparse-attention indexer (index_*) reads the MLA q latent: set kv_lora_rank and q_lora_rank"
                )
            if min(self.index_topk, self.index_heads, self.index_head_dim) <= 0:
                raise bad("index_topk, index_heads and index_head_dim must all be positive together")
        if self.kv_lora_rank and (self.qkv_bias or self.o_bias or self.qk_norm != "none"):
            raise bad("attention biases and QK-norm are not modeled for MLA attention")
        self._check_attention_shapes(bad)
        if self.linear_attn_layers and not (
            self.linear_k_heads and self.linear_v_heads and self.linear_k_head_dim and self.linear_v_head_dim
        ):
            raise bad("linear_attn_layers > 0 needs linear_k/v_heads and linear_k/v_head_dim")
        if self.linear_attn_layers and self.linear_v_heads % self.linear_k_heads:
            raise bad(f"linear_v_heads ({self.linear_v_heads}) is not a multiple of linear_k_heads")
        self._check_encoder(bad)
        if self.mamba_layers:
            if self.mamba_version not in (1, 2):
                raise bad("mamba_layers > 0 needs mamba_version 1 or 2")
            if not (self.mamba_inner and self.mamba_state and self.mamba_conv):
                raise bad("mamba_layers > 0 needs mamba_inner, mamba_state and mamba_conv")
            if self.mamba_version == 2 and not (self.mamba_heads and self.mamba_groups):
                raise bad("Mamba2 layers need mamba_heads and mamba_groups")
            if self.mamba_version == 2 and self.mamba_inner % self.mamba_heads:
                raise bad(f"mamba_inner ({self.mamba_inner}) is not a multiple of mamba_heads")
            if self.mamba_version == 1 and not self.mamba_dt_rank:
                raise bad("Mamba1 layers need mamba_dt_rank")
            if self.mamba_parallel and self.mamba_layers != self.layers:
                raise bad("mamba_parallel needs a Mamba mixer in every block (mamba_layers = layers)")
        if self.block_pattern:
            self._check_block_pattern(bad)
        return self

    def _check_block_pattern(self, bad: Any) -> None:
        """The block order agrees with the counts it orders."""
        p = self.block_pattern
        if len(p) != 2 * self.layers or set(p[0::2]) - set("alm-") or set(p[1::2]) - set("de-"):
            raise bad(
                f"block_pattern must be two characters per block ({2 * self.layers}): a mixer of "
                "a/l/m/- then a feed-forward part of d/e/-"
            )
        mixers, ffns = p[0::2], p[1::2]
        own_mamba = 0 if self.mamba_parallel else self.mamba_layers
        want = {
            "Gated DeltaNet mixers": (mixers.count("l"), self.linear_attn_layers),
            "Mamba mixers": (mixers.count("m"), own_mamba),
            "blocks without a mixer": (mixers.count("-"), self.no_mixer_layers),
            "MoE layers": (ffns.count("e"), self.moe_layers),
            "blocks without a feed-forward part": (ffns.count("-"), self.no_ffn_layers),
        }
        for what, (got, n) in want.items():
            if got != n:
                raise bad(f"block_pattern holds {got} {what}, the model {n}")

    def _check_attention_shapes(self, bad: Any) -> None:
        """Per-layer attention shapes: sliding layers' own heads need sliding layers, GQA and no MLA."""
        swa = (self.swa_heads, self.swa_kv_heads, self.swa_head_dim, self.swa_v_head_dim)
        if any(swa) and not self.sliding_window_layers:
            raise bad(
                "swa_heads / swa_kv_heads / swa_head_dim / swa_v_head_dim shape sliding layers, but none"
            )
        if (any(swa) or self.full_k_eq_v) and (self.is_mla or self.arch != "decoder"):
            raise bad("per-layer attention shapes are modeled for decoder GQA/MHA attention only")
        if self.full_k_eq_v and self.v_head_dim not in (0, self.head_dim):
            raise bad(f"full_k_eq_v: V is K's projection, so v_head_dim must be head_dim ({self.head_dim})")
        if self.full_k_eq_v and self.qkv_bias:
            raise bad("full_k_eq_v with attention biases is not modeled")
        a, g = self.swa_heads or self.heads, self.swa_kv_heads or self.kv_heads
        if a % g:
            raise bad(f"sliding layers' heads ({a}) are not a multiple of their KV heads ({g})")

    def _check_encoder(self, bad: Any) -> None:
        """Encoder and encoder-decoder fields: dense, non-hybrid stacks of standard attention."""
        if self.arch == "decoder":
            if self.encoder_layers or self.encoder_heads or self.encoder_ffn_hidden or self.encoder_seq:
                raise bad("encoder_* fields are set but arch is 'decoder'")
            return
        if self.is_moe or self.is_mla or self.is_hybrid or self.mtp_layers or self.sliding_window_layers:
            raise bad(f"an {self.arch} model is costed with dense attention + MLP blocks only")
        if self.arch == "encoder_decoder":
            if not (self.encoder_layers and self.encoder_heads and self.encoder_ffn_hidden):
                raise bad(
                    "an encoder_decoder model needs encoder_layers, encoder_heads and encoder_ffn_hidden"
                )
            if self.hidden % self.encoder_heads:
                raise bad(f"hidden ({self.hidden}) is not a multiple of encoder_heads ({self.encoder_heads})")
        elif self.encoder_layers or self.encoder_heads or self.encoder_ffn_hidden or self.encoder_seq:
            raise bad("encoder_* fields describe the encoder stack of an encoder_decoder model")

    # ----------------------------------------------------------------------------------- shape
    @property
    def is_encoder(self) -> bool:
        """A bidirectional encoder only (BERT): no causal mask, no KV cache, not served."""
        return self.arch == "encoder"

    @property
    def is_encoder_decoder(self) -> bool:
        return self.arch == "encoder_decoder"

    @property
    def causal(self) -> bool:
        """Self-attention under a causal mask (decoders and a decoder stack), else bidirectional."""
        return self.arch != "encoder"

    def encoder_view(self) -> ModelSpec:
        """The encoder stack of an encoder-decoder model as an encoder-only spec (no embedding,
        head or extras: those are the whole model's)."""
        h, a = self.hidden, self.encoder_heads
        return self.model_copy(
            update=dict(
                name=f"{self.name} encoder",
                arch="encoder",
                layers=self.encoder_layers,
                heads=a,
                kv_heads=a,
                head_dim=h // a,
                ffn_hidden=self.encoder_ffn_hidden,
                lm_head=False,
                final_norm=False,
                extra_params=0,
                encoder_layers=0,
                encoder_heads=0,
                encoder_ffn_hidden=0,
                encoder_seq=0,
                frontend_mels=0,
            )
        )

    def decoder_view(self) -> ModelSpec:
        """The decoder stack of an encoder-decoder model as a decoder spec (self-attention and MLP;
        the cross-attention is :mod:`autopar.blocks.cross_attention`'s)."""
        return self.model_copy(
            update=dict(
                arch="decoder",
                extra_params=0,
                encoder_layers=0,
                encoder_heads=0,
                encoder_ffn_hidden=0,
                encoder_seq=0,
                frontend_mels=0,
            )
        )

    def encoder_tokens(self, seq_len: float) -> float:
        """Encoder positions per sample for a job of ``seq_len`` decoder tokens."""
        return float(self.encoder_seq or seq_len)

    @property
    def cross_attn_params_per_layer(self) -> int:
        """One decoder block's cross-attention (Q, K, V, O as its self-attention) and its norm."""
        if not self.is_encoder_decoder:
            return 0
        return self.attn_params_per_layer + self._norm(self.hidden)

    def _encdec_params(self) -> int:
        """The encoder stack and the decoder's cross-attention of an encoder-decoder model."""
        if not self.is_encoder_decoder:
            return 0
        enc = self.encoder_view()
        return enc._stack_params(active=False) + self.layers * self.cross_attn_params_per_layer

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_hybrid(self) -> bool:
        """Blocks other than attention + MLP/MoE (linear attention, Mamba, mixer- or FFN-less blocks)."""
        return bool(
            self.linear_attn_layers or self.mamba_layers or self.no_mixer_layers or self.no_ffn_layers
        )

    @property
    def attn_layers(self) -> int:
        """Blocks with a self-attention mixer (full or sliding-window)."""
        own_mamba = 0 if self.mamba_parallel else self.mamba_layers
        return self.layers - self.linear_attn_layers - own_mamba - self.no_mixer_layers

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers - self.no_ffn_layers

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def v_dim(self) -> int:
        """The V head dimension (MLA's v_head_dim; otherwise v_head_dim where given, else head_dim)."""
        return self.v_head_dim or self.head_dim

    @property
    def per_layer_attention(self) -> bool:
        """Attention layers of more than one shape: sliding layers shaped apart from the full ones, or
        K=V full layers beside sliding layers with their own V (a view is never per-layer)."""
        return bool(self.sliding_window_layers) and bool(
            self.swa_heads
            or self.swa_kv_heads
            or self.swa_head_dim
            or self.swa_v_head_dim
            or self.full_k_eq_v
        )

    def attn_views(self) -> tuple[tuple[int, ModelSpec], ...]:
        """(attention layers, a spec of that one shape) per attention shape of the model.

        One entry, the model itself, when every attention layer has the same shape. Otherwise the
        full-attention layers (a view without sliding layers) and the sliding-window layers (a view
        whose every attention layer is sliding, with the ``swa_*`` shape); a view's per-layer figures
        (``attn_params_per_layer``, :mod:`autopar.blocks.attention`'s functions) are that shape's.
        """
        if not self.per_layer_attention:
            return ((self.attn_layers, self),)
        n_sw = self.sliding_window_layers
        plain = dict(swa_heads=0, swa_kv_heads=0, swa_head_dim=0, swa_v_head_dim=0)
        full = self.model_copy(update=dict(plain, sliding_window_layers=0))
        d_sw = self.swa_head_dim or self.head_dim
        v_sw = self.swa_v_head_dim or (0 if self.swa_head_dim else self.v_head_dim)
        sliding = self.model_copy(
            update=dict(
                plain,
                heads=self.swa_heads or self.heads,
                kv_heads=self.swa_kv_heads or self.kv_heads,
                head_dim=d_sw,
                v_head_dim=0 if v_sw == d_sw else v_sw,
                full_k_eq_v=False,
                sliding_window_layers=self.attn_layers,
            )
        )
        views = ((self.attn_layers - n_sw, full), (n_sw, sliding))
        return tuple((n, v) for n, v in views if n > 0)

    @property
    def tp_head_units(self) -> tuple[int, int]:
        """(query heads, KV heads) that tensor parallelism must divide: the gcd over every layer's
        shape (MLA: the heads for both)."""
        import math

        views = [v for _, v in self.attn_views()] or [self]
        heads = math.gcd(*(v.heads for v in views))
        kv = heads if self.is_mla else math.gcd(*(v.kv_heads for v in views))
        return heads, kv

    def _norm(self, n: int) -> int:
        return 2 * n if self.norm == "layernorm" else n

    # ------------------------------------------------------------------------------ parameters
    @property
    def attn_matmul_params_per_layer(self) -> int:
        """Weight-matrix parameters of one attention block (no norms, no biases)."""
        h, a = self.hidden, self.heads
        if self.is_mla:
            # DeepSeek-V2 (arXiv 2405.04434) Sec. 2.1.2 / HF DeepseekV3Attention: q_a_proj, q_b_proj
            # (or q_proj when q_lora_rank is 0), kv_a_proj_with_mqa (latent + shared rope key),
            # kv_b_proj (latent -> per-head nope key and value), o_proj.
            q = (
                h * self.q_lora_rank + self.q_lora_rank * a * self.qk_head_dim
                if self.q_lora_rank
                else (h * a * self.qk_head_dim)
            )
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * a * (
                self.qk_nope_head_dim + self.v_head_dim
            )
            return q + kv + a * self.v_head_dim * h + self.indexer_matmul_params
        d, dv, g = self.head_dim, self.v_dim, self.kv_heads
        q = h * a * d * (2 if self.attn_output_gate else 1)  # Qwen3NextAttention: q_proj -> 2 * a * d
        v = 0 if self.full_k_eq_v else h * g * dv  # Gemma 4 full layers: V is K's projection
        gate = h * a if self.attn_head_gate else 0  # LagunaAttention.g_proj: one gate per head
        return q + h * g * d + v + a * dv * h + gate  # Q(+gate), K, V, O

    @property
    def indexer_matmul_params(self) -> int:
        """A DSA lightning indexer's projections (HF ``DeepseekV32Indexer``): ``wq_b`` q_lora_rank ->
        index_heads x index_head_dim, ``wk`` h -> index_head_dim, ``weights_proj`` h -> index_heads."""
        if not self.index_topk:
            return 0
        ih, idim = self.index_heads, self.index_head_dim
        return self.q_lora_rank * ih * idim + self.hidden * idim + self.hidden * ih

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V, O projections, MLA down/up projections with their norms, biases and QK-norms.

        Excludes the block's hidden-size norms (they are in :attr:`norm_params_per_layer`).
        """
        p = self.attn_matmul_params_per_layer
        if self.is_mla:
            p += self._norm(self.q_lora_rank) + self._norm(self.kv_lora_rank)  # q_a / kv_a layernorms
            return p + (2 * self.index_head_dim if self.index_topk else 0)  # the indexer's k_norm (LayerNorm)
        d = self.head_dim
        if self.qkv_bias:
            p += (
                self.heads * (2 if self.attn_output_gate else 1) + (1 if self.k_bias else 0) * self.kv_heads
            ) * d
            p += self.kv_heads * self.v_dim
        if self.o_bias:
            p += self.hidden
        if self.qk_norm == "head":  # one head_dim-sized weight shared by all heads, for q and for k
            p += 2 * self._norm(d)
        elif self.qk_norm == "full":  # a weight per head (OLMo 2 q_norm over heads*head_dim; Cohere)
            p += self._norm((self.heads + self.kv_heads) * d)
        return p

    @property
    def linear_attn_params_per_layer(self) -> int:
        """One Gated DeltaNet mixer (transformers Qwen3NextGatedDeltaNet).

        in_proj_qkvz (h -> 2 key_dim + 2 value_dim), in_proj_ba (h -> 2 v_heads), the depthwise causal
        conv over q, k, v (no bias), dt_bias and A_log (v_heads each), the gated RMSNorm
        (v_head_dim) and out_proj (value_dim -> h).
        """
        if not self.linear_attn_layers:
            return 0
        h = self.hidden
        kd = self.linear_k_heads * self.linear_k_head_dim
        vd = self.linear_v_heads * self.linear_v_head_dim
        return (
            h * (2 * kd + 2 * vd)
            + h * 2 * self.linear_v_heads
            + (2 * kd + vd) * self.linear_conv
            + 2 * self.linear_v_heads
            + self.linear_v_head_dim
            + vd * h
        )

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the Mamba causal conv: x, B and C for Mamba2, x for Mamba1."""
        if self.mamba_version == 2:
            return self.mamba_inner + 2 * self.mamba_groups * self.mamba_state
        return self.mamba_inner

    @property
    def mamba_params_per_layer(self) -> int:
        """One Mamba mixer.

        Mamba2 (transformers NemotronHMamba2Mixer / FalconH1Mixer): in_proj h -> (2 d_inner +
        2 groups d_state + heads) [z, x, B, C, dt], conv1d (conv_dim x width, + bias), dt_bias, A_log and
        D (heads each), the gated RMSNorm (d_inner, when present) and out_proj d_inner -> h.
        Mamba1 (JambaMambaMixer): in_proj h -> 2 d_inner, conv1d (+ bias), x_proj d_inner -> (dt_rank +
        2 d_state), dt_proj dt_rank -> d_inner with bias, A_log (d_inner x d_state), D (d_inner), out_proj;
        Jamba adds RMSNorms over dt (dt_rank), B and C (d_state each).
        """
        if not self.mamba_layers:
            return 0
        h, di, n = self.hidden, self.mamba_inner, self.mamba_state
        conv = self.mamba_conv_dim * self.mamba_conv + (self.mamba_conv_dim if self.mamba_conv_bias else 0)
        if self.mamba_version == 2:
            nh = self.mamba_heads
            return (
                h * (2 * di + 2 * self.mamba_groups * n + nh)
                + conv
                + 3 * nh
                + (di if self.mamba_gated_norm else 0)
                + di * h
            )
        r = self.mamba_dt_rank
        return h * 2 * di + conv + di * (r + 2 * n) + r * di + di + di * n + di + di * h + (r + 2 * n)

    def _mlp(self, ffn: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * ffn  # gate+up+down, or fc1+fc2

    @property
    def dense_mlp_params(self) -> int:
        if not self.ffn_hidden:
            return 0
        bias = ((2 if self.gated_mlp else 1) * self.ffn_hidden + self.hidden) if self.mlp_bias else 0
        return self._mlp(self.ffn_hidden) + bias

    @property
    def moe_dim(self) -> int:
        """The width routed experts read and write: the latent width of a latent MoE, else hidden."""
        return self.moe_latent_size or self.hidden

    @property
    def expert_params(self) -> int:
        return (3 if self.gated_mlp else 2) * self.moe_dim * self.moe_ffn_hidden if self.is_moe else 0

    @property
    def latent_proj_params(self) -> int:
        """A latent MoE's two projections h -> latent -> h (with biases where the MLP has them)."""
        if not (self.is_moe and self.moe_latent_size):
            return 0
        return 2 * self.hidden * self.moe_latent_size + (
            self.moe_latent_size + self.hidden if self.mlp_bias else 0
        )

    @property
    def shared_expert_params(self) -> int:
        return self._mlp(self.shared_expert_ffn) if self.is_moe else 0

    @property
    def router_params(self) -> int:
        return self.hidden * self.num_experts

    @property
    def norm_params_per_layer(self) -> int:
        """The block's hidden-size norms (pre-attention and pre-MLP in a standard block)."""
        return self.norms_per_layer * self._norm(self.hidden)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        if not self.lm_head:
            return 0
        return (0 if self.tie_embeddings else self.vocab * self.hidden) + (
            self.vocab if self.head_bias else 0
        )

    @property
    def final_norm_params(self) -> int:
        return self._norm(self.hidden) if self.final_norm else 0

    @property
    def dense_layer_params(self) -> int:
        """A standard attention + dense-MLP block (the uniform-stack view of memory and latency)."""
        return self.attn_params_per_layer + self.dense_mlp_params + self.norm_params_per_layer

    @property
    def moe_ffn_params(self) -> int:
        """Routed experts, shared experts and router of one MoE block."""
        if not self.is_moe:
            return 0
        return (
            self.num_experts * self.expert_params
            + self.shared_expert_params
            + self.router_params
            + self.latent_proj_params
        )

    @property
    def moe_layer_params(self) -> int:
        if not self.is_moe:
            return 0
        return self.attn_params_per_layer + self.moe_ffn_params + self.norm_params_per_layer

    @property
    def moe_layer_active_params(self) -> int:
        if not self.is_moe:
            return 0
        return self.moe_layer_params - (self.num_experts - self.moe_topk) * self.expert_params

    def _stack_params(self, *, active: bool) -> int:
        mixers = (
            sum(n * v.attn_params_per_layer for n, v in self.attn_views())
            + self.linear_attn_layers * self.linear_attn_params_per_layer
            + self.mamba_layers * self.mamba_params_per_layer
        )
        moe = self.moe_ffn_params
        if active and self.is_moe:
            moe -= (self.num_experts - self.moe_topk) * self.expert_params
        return (
            mixers
            + self.dense_layers * self.dense_mlp_params
            + self.moe_layers * moe
            + self.layers * self.norm_params_per_layer
        )

    @property
    def total_params(self) -> int:
        """All parameters excluding MTP modules (embedding + blocks + final norm + untied head)."""
        return (
            self._stack_params(active=False)
            + self.embedding_params
            + self.head_params
            + self.final_norm_params
            + self._encdec_params()
            + self.extra_params
        )

    @property
    def active_params(self) -> int:
        """Parameters touched per token: top-k routed experts, shared experts and every dense part."""
        return (
            self._stack_params(active=True)
            + self.embedding_params
            + self.head_params
            + self.final_norm_params
            + self._encdec_params()
            + self.extra_params
        )

    @property
    def mtp_params(self) -> int:
        """Multi-token-prediction modules, excluded from the totals.

        Per depth (DeepSeek-V3, arXiv 2412.19437 Sec. 2.2): two input norms, the 2h->h projection, one
        transformer block (a MoE block if the model has MoE layers) and the output norm. Embedding and
        output head are shared with the main model and not counted again (the published 685 B
        DeepSeek-V3 checkpoint stores them a second time).
        """
        if not self.mtp_layers:
            return 0
        block = self.moe_layer_params if self.moe_layers else self.dense_layer_params
        return self.mtp_layers * (3 * self._norm(self.hidden) + 2 * self.hidden * self.hidden + block)

    # ----------------------------------------------------------------------------------- FLOPs
    def _active_matmul_params(self) -> int:
        lin = self.linear_attn_layers and (
            self.linear_attn_params_per_layer
            - 2 * self.linear_v_heads
            - self.linear_v_head_dim  # dt_bias, A_log and the norm are not GEMM weights
        )
        mamba = 0
        if self.mamba_layers:
            nh = self.mamba_heads
            # GEMM and conv weights: each is one multiply-add per token (the depthwise conv included).
            mamba = self.mamba_params_per_layer - (
                (self.mamba_conv_dim if self.mamba_conv_bias else 0)
                + (
                    3 * nh + (self.mamba_inner if self.mamba_gated_norm else 0)
                    if self.mamba_version == 2
                    else self.mamba_inner * (self.mamba_state + 2) + self.mamba_dt_rank + 2 * self.mamba_state
                )
            )
        moe = (
            self.moe_topk * self.expert_params
            + self.shared_expert_params
            + self.router_params
            + 2 * self.hidden * self.moe_latent_size
            if self.is_moe
            else 0
        )
        # The logits GEMM runs whether or not the head is tied; the embedding lookup is not a GEMM.
        return (
            sum(n * v.attn_matmul_params_per_layer for n, v in self.attn_views())
            + self.linear_attn_layers * lin
            + self.mamba_layers * mamba
            + self.dense_layers * self._mlp(self.ffn_hidden)
            + self.moe_layers * moe
            + (self.vocab * self.hidden if self.lm_head else 0)
        )

    def _context(self, seq_len: int, window: int, causal: bool) -> float:
        """Mean number of keys one query attends to."""
        if window <= 0 or window >= seq_len:
            return seq_len / 2 if causal else float(seq_len)
        if not causal:
            return float(window)
        # causal sliding window: mean over positions of min(i, w) ~= w - w^2 / (2 s); equals s/2 at w = s.
        return window - window * window / (2 * seq_len)

    @property
    def linear_attn_core_flops_per_token(self) -> float:
        """Forward FLOPs of one Gated DeltaNet core per token (no weights; independent of context).

        The recurrent form of the gated delta rule (Yang et al. 2024, arXiv 2412.06464, Eq. 10) per
        value head with a ``d_k x d_v`` state: read ``S^T k``, rank-1 update ``k (beta (v - S^T k))^T``
        and output ``S^T q``, three ``d_k d_v`` multiply-adds = ``6 d_k d_v`` FLOPs. The chunked
        training kernel does extra intra-chunk work, not counted (as FlashAttention's recompute is not).
        """
        return 6.0 * self.linear_v_heads * self.linear_k_head_dim * self.linear_v_head_dim

    @property
    def ssm_core_flops_per_token(self) -> float:
        """Forward FLOPs of one Mamba scan per token (no weights; independent of context).

        State ``d_inner x d_state``: the update ``h = a h + x B^T`` and the read-out ``y = h C`` are two
        multiply-adds per state element, ``4 d_inner d_state`` FLOPs (Mamba2 SSD, Dao & Gu 2024, arXiv
        2405.21060, Sec. 6, recurrent form; the same count for Mamba1's selective scan); the ``D``
        skip and the discretization are elementwise and not counted.
        """
        return 4.0 * self.mamba_inner * self.mamba_state

    def flops_per_token(self, seq_len: int, *, attention: bool = True, causal: bool = False) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), model FLOPs without recompute.

        ``6 * N_active_matmul`` (Kaplan et al. 2020, arXiv 2001.08361, Sec. 2.1) counts every weight
        GEMM of the active parameters, including the output-logits GEMM and the depthwise convs of
        linear-attention and Mamba mixers, and excluding the embedding lookup, norms and biases. The
        attention term follows PaLM (arXiv 2204.02311, App. B, ``6N + 12 L H Q T``) and Megatron-LM
        ``num_floating_point_operations``: per attention layer and token the forward pass costs
        ``2 * ctx * heads * qk_head_dim`` (QK^T) plus ``2 * ctx * heads * v_dim`` (PV), times 3 for
        training. ``ctx`` is ``seq_len`` (the convention of PaLM and Megatron), ``seq_len / 2`` with
        ``causal=True``, and at most the window on sliding-window layers. Linear-attention and Mamba
        layers add ``3x`` their recurrent core (:attr:`linear_attn_core_flops_per_token`,
        :attr:`ssm_core_flops_per_token`), which does not grow with the context.
        """
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if self.arch != "decoder":
            return self._encoder_flops_per_token(seq_len, attention=attention)
        flops = 6.0 * self._active_matmul_params()
        if attention:
            for n, v in self.attn_views():  # each attention shape on its own layers
                per_ctx = 6.0 * v.heads * (v.qk_head_dim + v.v_dim)
                sw = min(n, v.sliding_window_layers)
                full = n - sw
                if self.index_topk:  # DSA: the core attends to the top-k keys; the indexer scores them all
                    flops += per_ctx * full * self._context(seq_len, self.index_topk, causal)
                    flops += (
                        6.0
                        * self.index_heads
                        * self.index_head_dim
                        * full
                        * self._context(seq_len, 0, causal)
                    )
                    full = 0
                flops += per_ctx * full * self._context(seq_len, 0, causal)
                flops += per_ctx * sw * self._context(seq_len, self.sliding_window, causal)
            flops += 3.0 * self.linear_attn_layers * self.linear_attn_core_flops_per_token
            flops += 3.0 * self.mamba_layers * self.ssm_core_flops_per_token
        return flops

    def _encoder_flops_per_token(self, seq_len: int, *, attention: bool) -> float:
        """Training FLOPs (3x forward) per token of an encoder, or per decoder token of an
        encoder-decoder model, by the block modules (:mod:`autopar.blocks.encoder`,
        :mod:`autopar.blocks.cross_attention`).

        Encoder: ``L`` encoder layers with the unmasked core against all ``seq_len`` keys (whatever
        ``causal`` asks: an encoder has no mask) and the vocabulary GEMM where the model has an LM
        head. Encoder-decoder: the decoder stack as a decoder (causal self-attention at the PaLM
        convention, LM head), each decoder block's cross-attention per decoder token (Q, O, and the
        core against ``s_enc`` positions), and per encoder position the encoder stack, the K/V
        projections of every decoder block and the conv front-end, times ``s_enc / seq_len``
        encoder positions per decoder token. Pooler, MLM transform and classifiers are not counted
        (one ``h x h`` GEMM per sequence or token, under 1 %).
        """
        from autopar.blocks import cross_attention, embedding, encoder

        s = float(seq_len)
        if self.is_encoder:
            per = encoder.flops_per_token(self, s if attention else 0.0)
            head = embedding.head_flops_per_token(self) if self.lm_head else 0.0
            return 3.0 * (self.layers * per + head)
        enc = self.encoder_view()
        s_enc = self.encoder_tokens(s)
        dec = self.decoder_view().flops_per_token(seq_len, attention=attention)
        cross = self.layers * cross_attention.flops_per_token(self, s_enc if attention else 0.0)
        per_enc = (
            enc.layers * encoder.flops_per_token(enc, s_enc if attention else 0.0)
            + self.layers * cross_attention.kv_flops_per_token(self)
            + encoder.frontend_flops_per_token(self)
        )
        return dec + 3.0 * (cross + per_enc * s_enc / s)

    # -------------------------------------------------------------------------------- KV cache
    @property
    def kv_cache_elems_per_token_per_layer(self) -> int:
        # MLA caches the compressed latent plus the shared rope key (DeepSeek-V2 Sec. 2.1.3).
        if self.is_encoder:
            return 0  # an encoder is run once over its input: nothing is cached
        if self.is_mla:  # a DSA indexer also caches its key (index_head_dim) for every token
            return self.kv_lora_rank + self.qk_rope_head_dim + (self.index_head_dim if self.index_topk else 0)
        # K and V of each KV head (V at its own head size; a K=V layer caches both too: K is normed
        # and rotated, V normed apart, as transformers' Gemma4TextAttention does)
        return self.kv_heads * (self.head_dim + self.v_dim)

    def kv_cache_bytes_per_token(self, bytes_per_elem: float = 2) -> float:
        """KV-cache bytes per cached token summed over the attention layers (MTP layers excluded).

        Sliding-window layers are counted per token like the others: the window caps only the total
        a sequence holds, see :meth:`kv_cache_bytes`. Linear-attention and Mamba layers hold a
        fixed-size state instead (:meth:`recurrent_state_bytes`).
        """
        elems = sum(n * v.kv_cache_elems_per_token_per_layer for n, v in self.attn_views())
        return float(elems * bytes_per_elem)

    def kv_cache_bytes(self, seq_len: int, bytes_per_elem: float = 2) -> float:
        """KV-cache bytes of one sequence of ``seq_len`` tokens; sliding layers hold at most the window.
        Each attention shape caches its own K and V heads (:meth:`attn_views`)."""
        elems = 0
        for n, v in self.attn_views():
            sw = min(n, v.sliding_window_layers)
            tokens = (n - sw) * seq_len + sw * min(seq_len, self.sliding_window or seq_len)
            elems += tokens * v.kv_cache_elems_per_token_per_layer
        return float(elems * bytes_per_elem)

    def recurrent_state_bytes(self, bytes_per_elem: float = 2) -> float:
        """Per-sequence state of the linear-attention and Mamba layers (does not grow with the context).

        Gated DeltaNet (vLLM/transformers Qwen3-Next cache): the conv state, ``(width - 1)`` past
        inputs of q, k and v, and a ``d_k x d_v`` state per value head. Mamba: the conv state,
        ``(width - 1) x conv_dim``, and the SSM state ``d_inner x d_state``. Both at ``bytes_per_elem``
        (runtimes that keep the SSM state in fp32 hold twice the SSM part).
        """
        lin = 0
        if self.linear_attn_layers:
            kd = self.linear_k_heads * self.linear_k_head_dim
            vd = self.linear_v_heads * self.linear_v_head_dim
            lin = (self.linear_conv - 1) * (2 * kd + vd) + self.linear_v_heads * (
                self.linear_k_head_dim * self.linear_v_head_dim
            )
        mamba = 0
        if self.mamba_layers:
            mamba = (self.mamba_conv - 1) * self.mamba_conv_dim + self.mamba_inner * self.mamba_state
        return float((self.linear_attn_layers * lin + self.mamba_layers * mamba) * bytes_per_elem)

    def to_dict(self) -> dict[str, Any]:
        d = self.model_dump()
        d["warnings"] = list(self.warnings)
        d["total_params"] = self.total_params
        d["active_params"] = self.active_params
        return d


# =========================================================================== HF normalization
# The normalizer reads a config by the fields that change parameters, FLOPs, memory or communication,
# not by model name. model_type only picks the semantics a field has in its transformers class (is
# ``intermediate_size`` the dense or the per-expert width? which layers are sliding?) and the class
# defaults for absent fields. A model_type not in _ARCH is read as a plain decoder (Llama semantics)
# when every one of its fields is understood; a field that is not is named in the refusal.

# Aliases: other spellings of the canonical (Llama) names. Canonical wins; a conflict is refused.
_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("d_model", "n_embd", "n_embed", "dim", "model_dim"),
    "num_hidden_layers": ("n_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("n_heads", "n_head", "num_heads"),
    "num_key_value_heads": ("num_kv_heads", "n_head_kv", "kv_n_heads", "multi_query_group_num"),
    "intermediate_size": ("ffn_hidden_size", "n_inner", "ffn_dim"),
    "max_position_embeddings": ("n_positions", "max_seq_len", "seq_length", "max_sequence_length"),
    "head_dim": ("attention_head_dim", "kv_channels"),
    "num_local_experts": ("moe_num_experts",),
    "num_experts_per_tok": ("moe_top_k", "experts_per_token"),
}
# Nested sub-configs whose keys belong to the decoder (DBRX attn_config / ffn_config).
_NESTED = ("attn_config", "ffn_config")
# Wrapper keys holding the text decoder of a multimodal (or thinker) config, first found wins.
_TEXT_KEYS = ("text_config", "llm_config", "language_config", "text_model", "language_model_config")
_TOWER_KEYS = {
    "vision_config": "vision",
    "vision_tower_config": "vision",
    "visual": "vision",
    "audio_config": "audio",
    "speech_config": "audio",
}

# Keys that change neither parameters nor FLOPs nor memory (token ids, dropout, init, epsilons,
# position-encoding details, scalar multipliers, logit soft-capping, runtime flags, storage dtype).
# rope_theta / rope_scaling (transformers < 5) and rope_parameters (>= 5) only set max_position.
_NO_COST = frozenset(
    """
    _name_or_path architectures auto_map model_type transformers_version torch_dtype dtype use_cache
    bos_token_id eos_token_id pad_token_id sep_token_id decoder_start_token_id initializer_range
    rms_norm_eps layer_norm_eps layer_norm_epsilon norm_eps norm_epsilon attention_dropout hidden_dropout
    embd_pdrop resid_pdrop attn_pdrop emb_pdrop summary_activation summary_first_dropout
    summary_proj_to_labels summary_type summary_use_proj output_attentions output_hidden_states
    rope_theta rope_scaling rope_parameters rope_type partial_rotary_factor rotary_pct rotary_emb_base
    rotary_dim pretraining_tp tie_word_embeddings quantization_config quantization
    id2label label2id task_specific_params problem_type tokenizer_class prefix return_dict
    torchscript pruned_heads chunk_size_feed_forward is_encoder_decoder is_decoder add_cross_attention
    tie_encoder_decoder cross_attention_hidden_size finetuning_task max_length min_length do_sample
    early_stopping num_beams temperature top_k top_p typical_p repetition_penalty length_penalty
    no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids num_return_sequences
    output_scores return_dict_in_generate forced_bos_token_id forced_eos_token_id
    remove_invalid_values exponential_decay_length_penalty suppress_tokens begin_suppress_tokens
    num_beam_groups diversity_penalty use_bfloat16 tf_legacy_loss output_router_logits
    router_aux_loss_coef router_z_loss_coef norm_topk_prob routed_scaling_factor scoring_func
    topk_method aux_loss_alpha seq_aux ep_size router_jitter_noise
    attn_logit_softcapping final_logit_softcapping query_pre_attn_scalar logit_scale
    embedding_multiplier residual_multiplier attention_multiplier logits_scaling
    hidden_act hidden_activation mlp_hidden_act max_window_layers use_sliding_window
    original_max_position_embeddings use_flash_attn attn_implementation _attn_implementation
    initializer_factor use_return_dict gradient_checkpointing cache_implementation
    add_classification_head classifier_dropout num_labels eod_token_id time_step_limit time_step_min
    time_step_max time_step_floor mamba_chunk_size chunk_size use_mamba_kernels
    """.split()
)


def _no_cost(key: str) -> bool:
    """Token ids (``image_token_id``, ``boi_token_index``, ...) and the fields above cost nothing."""
    return key in _NO_COST or key.endswith(("_token_id", "_token_index", "_token_ids"))


# The fields a plain decoder (Llama semantics) understands.
_PLAIN = frozenset(
    """
    hidden_size num_hidden_layers num_attention_heads num_key_value_heads head_dim intermediate_size
    vocab_size max_position_embeddings attention_bias mlp_bias sliding_window layer_types
    """.split()
)


# Fields that some model_type's semantics read (beyond a plain decoder's).
_READ_BY_SOME_CLASS = frozenset(
    """
    num_local_experts num_experts n_routed_experts num_experts_per_tok moe_intermediate_size
    shared_expert_intermediate_size n_shared_experts moe_shared_expert_intermediate_size
    first_k_dense_replace moe_layer_freq decoder_sparse_step mlp_only_layers moe_layers
    interleave_moe_layer_step intermediate_size_mlp attention_chunk_size no_rope_layers
    no_rope_layer_interval q_lora_rank kv_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim
    num_nextn_predict_layers use_qk_norm full_attention_interval linear_conv_kernel_dim
    linear_key_head_dim linear_value_head_dim linear_num_key_heads linear_num_value_heads
    hybrid_override_pattern mamba_num_heads mamba_head_dim ssm_state_size n_groups conv_kernel
    use_conv_bias mamba_d_state mamba_d_conv mamba_expand mamba_dt_rank mamba_conv_bias
    attn_layer_period attn_layer_offset expert_layer_period expert_layer_offset mamba_n_heads
    mamba_d_head mamba_d_ssm mamba_n_groups mamba_rms_norm sliding_window_pattern bias use_bias
    new_decoder_architecture multi_query parallel_attn num_ln_in_parallel_attn lm_head_bias
    use_parallel_residual
    """.split()
)


# GPT-J's block, which CodeGen reuses: parallel attention + MLP after one LayerNorm, no attention
# biases, a GELU MLP with biases.
_GPTJ_BLOCK: dict[str, Any] = dict(
    norm="layernorm", norms=1, gated=False, parallel=True, qkv_bias=False, o_bias=False, mlp_bias=True
)


class _Arch:
    """Semantics and transformers-class defaults of one model_type."""

    def __init__(self, cls: str, *, defaults: dict | None = None, **traits: Any) -> None:
        self.cls = cls  # the configuration class whose defaults fill absent fields
        self.defaults = defaults or {}
        self.norm: str = traits.pop("norm", "rmsnorm")
        self.norms: int = traits.pop("norms", 2)
        self.gated: bool = traits.pop("gated", True)
        self.qkv_bias: Any = traits.pop("qkv_bias", "attention_bias")  # bool or the config field
        self.o_bias: Any = traits.pop("o_bias", "attention_bias")
        self.mlp_bias: Any = traits.pop("mlp_bias", "mlp_bias")
        self.qk_norm: str = traits.pop("qk_norm", "none")
        self.parallel: bool = traits.pop("parallel", False)
        self.moe: str = traits.pop("moe", "none")
        self.sliding: str = traits.pop("sliding", "layer_types")
        self.mixer: str = traits.pop("mixer", "attention")
        self.tie: bool = traits.pop("tie", False)
        self.shapes: str = traits.pop("shapes", "")  # per-layer attention shapes: _attention_shapes
        self.extra: frozenset = frozenset(traits.pop("extra", ()))  # further understood fields
        assert not traits, traits


_LLAMA = dict(defaults={"attention_bias": False, "mlp_bias": False})
_DSA: dict[str, Any] = dict(qkv_bias=False, o_bias=False, mlp_bias=False, moe="deepseek")
_INDEXER = ("index_n_heads", "index_head_dim", "index_topk")  # DeepSeek Sparse Attention's indexer
_ARCH: dict[str, _Arch] = {
    "llama": _Arch("LlamaConfig", **_LLAMA),
    "mistral": _Arch("MistralConfig", qkv_bias=False, o_bias=False, mlp_bias=False, sliding="all"),
    "mixtral": _Arch("MixtralConfig", qkv_bias=False, o_bias=False, mlp_bias=False, moe="all", sliding="all"),
    "grok-1": _Arch(
        "Grok1Config (xai-org remote code)", qkv_bias=False, o_bias=False, mlp_bias=False, moe="all", tie=True
    ),
    "qwen2": _Arch("Qwen2Config", qkv_bias=True, o_bias=False, mlp_bias=False, sliding="qwen"),
    "qwen2_moe": _Arch(
        "Qwen2MoeConfig", qkv_bias=True, o_bias=False, mlp_bias=False, moe="qwen", sliding="qwen"
    ),
    "qwen3": _Arch("Qwen3Config", qk_norm="head", mlp_bias=False, sliding="qwen", **_LLAMA),
    "qwen3_moe": _Arch(
        "Qwen3MoeConfig", qk_norm="head", mlp_bias=False, moe="qwen", sliding="qwen", **_LLAMA
    ),
    "qwen3_next": _Arch(
        "Qwen3NextConfig",
        defaults={
            "attention_bias": False,
            "full_attention_interval": 4,
            "linear_conv_kernel_dim": 4,
            "decoder_sparse_step": 1,
            "num_experts": 512,
            "num_experts_per_tok": 10,
        },
        qk_norm="head",
        mlp_bias=False,
        moe="qwen",
        mixer="qwen3_next",
        extra=(
            "full_attention_interval",
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
        ),
    ),
    "nemotron": _Arch("NemotronConfig", norm="layernorm", gated=False, **_LLAMA),
    "deepseek_v2": _Arch("DeepseekV2Config", qkv_bias=False, o_bias=False, mlp_bias=False, moe="deepseek"),
    "deepseek_v3": _Arch("DeepseekV3Config", qkv_bias=False, o_bias=False, mlp_bias=False, moe="deepseek"),
    # DeepSeek Sparse Attention: DeepSeek-V3's blocks with a lightning indexer (DeepseekV32Indexer);
    # GLM-5 (GlmMoeDsaForCausalLM) the same (GlmMoeDsaIndexer), its qk_head_dim restating
    # qk_nope + qk_rope and its rope layout costing nothing
    "deepseek_v32": _Arch("DeepseekV32Config", **_DSA, extra=_INDEXER),
    "glm_moe_dsa": _Arch(
        "GlmMoeDsaConfig", **_DSA, extra=(*_INDEXER, "indexer_rope_interleave", "qk_head_dim")
    ),
    "kimi_k2": _Arch(
        "DeepseekV3Config (Kimi K2)", qkv_bias=False, o_bias=False, mlp_bias=False, moe="deepseek"
    ),
    "glm4_moe": _Arch(
        "Glm4MoeConfig",
        defaults={"attention_bias": False, "use_qk_norm": False},
        o_bias=False,
        mlp_bias=False,
        qk_norm="field:use_qk_norm:head",
        moe="deepseek",
    ),
    "glm4": _Arch("Glm4Config", defaults={"attention_bias": True}, o_bias=False, mlp_bias=False, norms=4),
    "gpt_oss": _Arch("GptOssConfig", mlp_bias=False, moe="all", sliding="gpt_oss", **_LLAMA),
    # Attention layers of more than one shape (issue 22): sliding layers shaped apart from the full
    # ones, read by _attention_shapes. Laguna: per-layer query heads (num_attention_heads_per_layer)
    # and, with gating, a per-head output gate (g_proj, h -> heads).
    "laguna": _Arch(
        "LagunaConfig (poolside remote code; transformers LagunaForCausalLM)",
        defaults={"attention_bias": False},
        o_bias=False,
        mlp_bias=False,
        qk_norm="head",
        moe="mlp_layer_types",
        shapes="laguna",
        extra=(
            "num_attention_heads_per_layer",
            "gating",
            "mlp_layer_types",
            "shared_expert_intermediate_size",
        ),
    ),
    # Gemma 4: full layers of global_head_dim with num_global_key_value_heads and (attention_k_eq_v)
    # no v_proj; sliding layers of head_dim with num_key_value_heads; q/k norms per layer's head_dim
    # (v_norm has no weight); four sandwich norms, and with enable_moe_block a routed MoE (and three
    # more norms) beside the dense MLP of every layer (Gemma4TextDecoderLayer).
    "gemma4_text": _Arch(
        "Gemma4TextConfig",
        defaults={
            "head_dim": 256,
            "sliding_window": 512,
            "attention_bias": False,
            "max_position_embeddings": 131072,
            "vocab_size": 262144,
            "num_key_value_heads": 4,
        },
        mlp_bias=False,
        norms=4,
        qk_norm="head",
        sliding="gemma4",
        tie=True,
        moe="gemma4",
        shapes="gemma4",
    ),
    # MiMo-V2-Flash: hybrid_layer_pattern (1 = sliding) with swa_* shapes on the sliding layers,
    # v_head_dim apart from head_dim, moe_layer_freq (1 = MoE); attention sinks not counted (as gpt-oss)
    "mimo_v2_flash": _Arch(
        "MiMoV2FlashConfig",
        defaults={"attention_bias": False, "head_dim": 192, "v_head_dim": 128},
        o_bias=False,
        mlp_bias=False,
        moe="mimo",
        sliding="mimo",
        shapes="mimo",
    ),
    "llama4_text": _Arch(
        "Llama4TextConfig",
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        moe="llama4",
        sliding="llama4",
        defaults={"interleave_moe_layer_step": 1, "no_rope_layer_interval": 4},
    ),
    "gpt2": _Arch(
        "GPT2Config", norm="layernorm", gated=False, qkv_bias=True, o_bias=True, mlp_bias=True, tie=True
    ),
    "gpt_neox": _Arch(
        "GPTNeoXConfig",
        norm="layernorm",
        gated=False,
        defaults={"attention_bias": True},
        mlp_bias=True,
        parallel=False,
    ),
    "gemma": _Arch(
        "GemmaConfig", defaults={"head_dim": 256, "attention_bias": False}, mlp_bias=False, tie=True
    ),
    "gemma2": _Arch(
        "Gemma2Config",
        defaults={"head_dim": 256, "sliding_window": 4096, "attention_bias": False},
        mlp_bias=False,
        norms=4,
        sliding="gemma2",
        tie=True,
    ),
    "gemma3_text": _Arch(
        "Gemma3TextConfig",
        defaults={
            "head_dim": 256,
            "sliding_window": 4096,
            "sliding_window_pattern": 6,
            "attention_bias": False,
            "max_position_embeddings": 131072,
            "vocab_size": 262208,
        },
        mlp_bias=False,
        norms=4,
        qk_norm="head",
        sliding="gemma3",
        tie=True,
        extra=("sliding_window_pattern",),
    ),
    "cohere": _Arch(
        "CohereConfig",
        defaults={"use_qk_norm": False, "attention_bias": False},
        norm="layernorm_nobias",
        norms=1,
        parallel=True,
        mlp_bias=False,
        qk_norm="field:use_qk_norm:full",
        tie=True,
    ),
    "phi3": _Arch("Phi3Config", qkv_bias=False, o_bias=False, mlp_bias=False, sliding="all"),
    "phimoe": _Arch(
        "PhimoeConfig",
        norm="layernorm",
        defaults={"attention_bias": False, "lm_head_bias": False},
        mlp_bias=False,
        moe="all",
        sliding="all",
        extra=("lm_head_bias",),
    ),
    "olmo2": _Arch("Olmo2Config", qk_norm="full", **_LLAMA),
    "olmoe": _Arch("OlmoeConfig", qk_norm="full", moe="all", **_LLAMA),
    "granite": _Arch("GraniteConfig", **_LLAMA),
    "granitemoe": _Arch("GraniteMoeConfig", mlp_bias=False, moe="all", **_LLAMA),
    "internlm2": _Arch(
        "InternLM2Config (internlm remote code)",
        defaults={"bias": True},
        qkv_bias="bias",
        o_bias="bias",
        mlp_bias="bias",
    ),
    "falcon": _Arch(
        "FalconConfig",
        norm="layernorm",
        gated=False,
        parallel=True,
        tie=True,
        defaults={
            "bias": False,
            "multi_query": True,
            "new_decoder_architecture": False,
            "parallel_attn": True,
            "alibi": False,
            "num_ln_in_parallel_attn": None,
        },
        qkv_bias="bias",
        o_bias="bias",
        mlp_bias="bias",
    ),
    "dbrx": _Arch(
        "DbrxConfig",
        norm="layernorm_nobias",
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        moe="all",
        defaults={"num_key_value_heads": 1},  # DbrxAttentionConfig kv_n_heads default 1
    ),
    "starcoder2": _Arch(
        "Starcoder2Config",
        norm="layernorm",
        gated=False,
        defaults={"use_bias": True},
        qkv_bias="use_bias",
        o_bias="use_bias",
        mlp_bias="use_bias",
        sliding="all",
        tie=True,
    ),
    "jamba": _Arch(
        "JambaConfig",
        defaults={
            "attn_layer_period": 8,
            "attn_layer_offset": 4,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_dt_rank": "auto",
            "mamba_conv_bias": True,
            "mamba_proj_bias": False,
            "num_experts": 16,
            "num_experts_per_tok": 2,
        },
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        moe="jamba",
        mixer="jamba",
    ),
    "nemotron_h": _Arch(
        "NemotronHConfig",
        defaults={
            "attention_bias": False,
            "mlp_bias": False,
            "use_conv_bias": True,
            "mamba_proj_bias": False,
            "conv_kernel": 4,
            "n_groups": 8,
            "mlp_hidden_act": "relu2",
        },
        gated=False,
        norms=1,
        moe="nemotron_h",
        mixer="nemotron_h",
    ),
    "falcon_h1": _Arch(
        "FalconH1Config",
        defaults={
            "attention_bias": False,
            "mlp_bias": False,
            "mamba_conv_bias": True,
            "mamba_proj_bias": False,
            "mamba_rms_norm": False,
            "mamba_d_conv": 4,
            "mamba_n_groups": 1,
            "projectors_bias": False,
        },
        mixer="falcon_h1",
    ),
}
_ARCH["grok1"] = _ARCH["grok-1"]
_ARCH["mistral3_text"] = _ARCH["mistral"]
_MAMBA2_FIELDS = (
    "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv", "mamba_expand",
    "mamba_conv_bias", "mamba_proj_bias",
)  # fmt: skip
_MAMBA2_DEFAULTS = {
    "attention_bias": False,
    "mlp_bias": False,
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
}
# ---- 2025-2026 families, each checked against its transformers class on the meta device
# (tests/test_hf_meta.py): the class semantics below are read from that class's modeling code.
_ARCH.update(
    {
        # ApertusMLP: up_proj -> xIELU -> down_proj (not gated); per-head QK RMSNorm
        "apertus": _Arch("ApertusConfig", gated=False, qk_norm="head", **_LLAMA),
        "arcee": _Arch("ArceeConfig", gated=False, **_LLAMA),  # ArceeMLP: up -> ReLU^2 -> down
        "cohere2": _Arch(  # Cohere2: Cohere's parallel block, 3 local : 1 global attention
            "Cohere2Config",
            defaults={"attention_bias": False, "sliding_window_pattern": 4},
            norm="layernorm_nobias",
            norms=1,
            parallel=True,
            mlp_bias=False,
            sliding="gemma3",
            tie=True,
            extra=("sliding_window_pattern",),
        ),
        # Exaone4: post-attention and post-MLP RMSNorms only (2), per-head QK-norm, 3 local : 1 global
        "exaone4": _Arch(
            "Exaone4Config",
            defaults={"sliding_window_pattern": 4, "attention_bias": False, "mlp_bias": False},
            qk_norm="head",
            sliding="gemma3",
            extra=("sliding_window_pattern",),
        ),
        "seed_oss": _Arch(  # SeedOssAttention: q/k/v bias = attention_bias, o bias = attention_out_bias
            "SeedOssConfig",
            defaults={"attention_bias": True, "attention_out_bias": False, "mlp_bias": False},
            o_bias="attention_out_bias",
            extra=("attention_out_bias",),
        ),
        "smollm3": _Arch(  # NoPE layers change no cost
            "SmolLM3Config", sliding="qwen", extra=("no_rope_layers", "no_rope_layer_interval"), **_LLAMA
        ),
        "ernie4_5": _Arch(
            "Ernie4_5Config",
            defaults={"use_bias": False},
            qkv_bias="use_bias",
            o_bias="use_bias",
            mlp_bias="use_bias",
            tie=True,
        ),
        "minimax_m2": _Arch(  # MiniMaxM2: every layer MoE, q/k RMSNorm over all heads
            "MiniMaxM2Config",
            qkv_bias=False,
            o_bias=False,
            mlp_bias=False,
            moe="all",
            qk_norm="full",
            extra=("use_qk_norm", "qk_norm_type", "rotary_dim", "use_routing_bias"),
        ),
        "granitemoeshared": _Arch(  # GraniteMoeShared: GraniteMoE + a shared MLP
            "GraniteMoeSharedConfig", moe="all", extra=("shared_intermediate_size",), **_LLAMA
        ),
        "qwen3_5_text": _Arch(  # Qwen3.5 dense: Qwen3-Next's Gated DeltaNet + gated attention, dense MLPs
            "Qwen3_5TextConfig",
            defaults={"attention_bias": False, "linear_conv_kernel_dim": 4, "full_attention_interval": 4},
            qk_norm="head",
            mlp_bias=False,
            mixer="qwen3_next",
            extra=_ARCH["qwen3_next"].extra,
        ),
        "qwen3_5_moe_text": _Arch(
            "Qwen3_5MoeTextConfig",
            defaults={"attention_bias": False, "linear_conv_kernel_dim": 4, "full_attention_interval": 4},
            qk_norm="head",
            mlp_bias=False,
            moe="qwen",
            mixer="qwen3_next",
            extra=_ARCH["qwen3_next"].extra,
        ),
        "hunyuan_v1_dense": _Arch(  # HunYuanDenseV1Attention: per-head query/key layernorms
            "HunYuanDenseV1Config",
            defaults={"use_qk_norm": True, "attention_bias": False},
            qk_norm="field:use_qk_norm:head",
            mlp_bias=False,
            extra=("use_qk_norm",),
        ),
        # Granite 4 (GraniteMoeHybrid) and Bamba: Mamba2 or attention mixer per block (layer_types /
        # attn_layer_indices), each block with a feed-forward part
        "granitemoehybrid": _Arch(
            "GraniteMoeHybridConfig",
            defaults=_MAMBA2_DEFAULTS,
            moe="granite_hybrid",
            mixer="granite_hybrid",
            extra=("shared_intermediate_size", "position_embedding_type", *_MAMBA2_FIELDS),
            qkv_bias="attention_bias",
            o_bias="attention_bias",
            mlp_bias=False,
        ),
        "bamba": _Arch(
            "BambaConfig",
            defaults=_MAMBA2_DEFAULTS,
            mixer="granite_hybrid",
            extra=("attn_layer_indices", *_MAMBA2_FIELDS),
            qkv_bias="attention_bias",
            o_bias="attention_bias",
        ),
        # GPT-J / CodeGen: parallel attention+MLP after one LayerNorm, no attention biases, GELU MLP
        # with biases, untied LM head with bias, rotary positions
        "gptj": _Arch("GPTJConfig", **_GPTJ_BLOCK),
        "codegen": _Arch("CodeGenConfig", **_GPTJ_BLOCK),
        # StarCoder 1 / SantaCoder: GPT-2 with multi-query attention (learned positions not counted)
        "gpt_bigcode": _Arch(
            "GPTBigCodeConfig",
            norm="layernorm",
            gated=False,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            tie=True,
            extra=("multi_query",),
        ),
        # Hunyuan-A13B (HunYuanMoEV1Moe): every layer routed experts + a shared MLP, per-head QK-norm;
        # per-layer lists (moe_topk, moe_intermediate_size, num_shared_expert) of one value each
        "hunyuan_v1_moe": _Arch(
            "HunYuanMoEV1Config",
            defaults={"use_qk_norm": True, "attention_bias": False},
            qk_norm="field:use_qk_norm:head",
            mlp_bias=False,
            moe="hunyuan",
            extra=("use_qk_norm", "moe_topk", "num_shared_expert", "use_mixed_mlp_moe"),
        ),
        # Mistral 4 / Mistral Large 3: DeepSeek-V3 blocks (MLA attention, routed + shared experts)
        "mistral4": _Arch("Mistral4Config", qkv_bias=False, o_bias=False, mlp_bias=False, moe="deepseek"),
        # ERNIE 4.5 MoE: MoE on every moe_layer_interval-th layer in [moe_layer_start_index,
        # moe_layer_end_index], shared experts of moe_num_shared_experts x moe_intermediate_size
        "ernie4_5_moe": _Arch(
            "Ernie4_5_MoeConfig",
            defaults={
                "use_bias": False,
                "moe_layer_start_index": 0,
                "moe_layer_interval": 1,
                "moe_num_shared_experts": 0,
            },
            qkv_bias="use_bias",
            o_bias="use_bias",
            mlp_bias="use_bias",
            moe="ernie",
            tie=True,
            extra=(
                "moe_k",
                "moe_num_shared_experts",
                "moe_layer_start_index",
                "moe_layer_end_index",
                "moe_layer_interval",
            ),
        ),
        # EXAONE MoE: EXAONE 4 attention, mlp_layer_types dense / sparse, shared experts
        "exaone_moe": _Arch(
            "ExaoneMoeConfig",
            defaults={
                "sliding_window_pattern": 4,
                "attention_bias": False,
                "mlp_bias": False,
                "num_shared_experts": 0,
            },
            qk_norm="head",
            sliding="gemma3",
            moe="mlp_layer_types",
            extra=("sliding_window_pattern", "mlp_layer_types", "num_shared_experts"),
        ),
        # Phi-2 (PhiForCausalLM): parallel block after one LayerNorm, biases everywhere (LM head too),
        # GELU MLP; optional per-head QK LayerNorm
        "phi": _Arch(
            "PhiConfig",
            norm="layernorm",
            norms=1,
            gated=False,
            parallel=True,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            qk_norm="field:qk_layernorm:head",
            extra=("qk_layernorm",),
        ),
        # Persimmon / Fuyu: LayerNorm, ReLU^2 MLP with biases, QKV/dense biases, per-head QK LayerNorm
        "persimmon": _Arch(
            "PersimmonConfig",
            norm="layernorm",
            gated=False,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            qk_norm="field:qk_layernorm:head",
            defaults={"qk_layernorm": True},
            extra=("qk_layernorm",),
        ),
        # StableLM 2: LayerNorms, SwiGLU, QKV bias by use_qkv_bias
        "stablelm": _Arch(
            "StableLmConfig",
            norm="layernorm",
            qkv_bias="use_qkv_bias",
            o_bias=False,
            mlp_bias=False,
            defaults={"use_qkv_bias": False},
            extra=("use_qkv_bias", "qk_layernorm", "use_parallel_residual"),
        ),
        # BLOOM: LayerNorm, GELU MLP 4h, biases, ALiBi (no parameters), tied; its embedding LayerNorm
        # (2 x hidden) is not counted
        "bloom": _Arch(
            "BloomConfig",
            norm="layernorm",
            gated=False,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            tie=True,
            extra=("apply_residual_connection_post_layernorm", "slow_but_exact"),
        ),
        # GPT-Neo: GPT-2 blocks without q/k/v biases, global and local (window_size) attention layers
        "gpt_neo": _Arch(
            "GPTNeoConfig",
            norm="layernorm",
            gated=False,
            qkv_bias=False,
            o_bias=True,
            mlp_bias=True,
            tie=True,
            sliding="gpt_neo",
            extra=("attention_types", "attention_layers", "window_size"),
        ),
        # GLM-4.7-Flash (Glm4MoeLite): MLA attention, dense/sparse MLPs by mlp_layer_types
        "glm4_moe_lite": _Arch(
            "Glm4MoeLiteConfig",
            qkv_bias=False,
            o_bias=False,
            mlp_bias=False,
            moe="mlp_layer_types",
            extra=("mlp_layer_types", "qk_head_dim", "rope_interleave"),
        ),
        "dots1": _Arch(  # Dots1: DeepSeek-V3-style MoE (no MLA) with per-head QK-norm
            "Dots1Config",
            qkv_bias="attention_bias",
            o_bias=False,
            mlp_bias=False,
            qk_norm="head",
            moe="deepseek",
            sliding="qwen",
        ),
    }
)
SUPPORTED_MODEL_TYPES = tuple(sorted(_ARCH))
# multimodal wrappers whose text_config is one of the above, and older spellings
_TEXT_ALIASES = {
    "llama4": "llama4_text",
    "qwen2_5_vl_text": "qwen2",
    "qwen2_vl_text": "qwen2",
    "qwen2_vl": "qwen2",  # Qwen2-VL's original config: the text fields at the top, beside vision_config
    "qwen2_5_vl": "qwen2",
    "qwen3_vl_text": "qwen3",
    "qwen3_vl_moe_text": "qwen3_moe",
    "gemma3": "gemma3_text",
    "gemma4": "gemma4_text",
    "RefinedWeb": "falcon",
    "RefinedWebModel": "falcon",
    "internlm2_5": "internlm2",
    "apertus1p5_text": "apertus",
    "glm4v_moe_text": "glm4_moe",  # GLM-4.5V: its text model is GLM-4.5-Air
    "glm4v_text": "glm4",
    "mimo": "qwen2",
    "flex_olmo": "olmoe",  # FlexOlmo: OLMoE blocks
    "mistral_large4_text": "mistral4",
    "mistral_large4": "mistral4",  # Xiaomi MiMo: Qwen2 blocks + num_nextn_predict_layers MTP (remote code)
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
}
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "Llama4ForCausalLM": "llama4_text",
    "Grok1ModelForCausalLM": "grok-1",
    "Grok1ForCausalLM": "grok-1",
    "NemotronForCausalLM": "nemotron",
    "NemotronHForCausalLM": "nemotron_h",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "InternLM2ForCausalLM": "internlm2",
    "DbrxForCausalLM": "dbrx",
    "FalconForCausalLM": "falcon",
    "RWForCausalLM": "falcon",
    "JambaForCausalLM": "jamba",
    "FalconH1ForCausalLM": "falcon_h1",
}
_UNGATED_ACTS = {"gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "relu2", "gelu_fast"}


def _int(cfg: dict, key: str, default: Any = ..., *, ctx: str = "", lenient: bool = False) -> int:
    """Read an integer field; a missing (or null) required field raises ModelConfigError naming it.

    A config.json holds JSON numbers: a string there is refused. ``lenient`` (raw dimensions, e.g.
    CSV cells) accepts numeric strings.
    """
    v = cfg.get(key)
    if isinstance(v, list) and v and not lenient:  # a per-layer list of sizes: one shape if all equal
        if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            if len(set(v)) == 1:
                return int(v[0])
            raise UnsupportedArchitecture(
                f"{ctx}per-layer {key!r} ({len(set(v))} different sizes over {len(v)} layers) is not modeled",
                "autopar models one size for every layer of a kind; describe the model with raw dimensions",
            )
    if v is None:
        if default is ...:
            raise ModelConfigError(
                f"{ctx}missing required field {key!r}",
                "add it to the config (see docs/model.md for the fields and aliases read)",
            )
        return default
    if isinstance(v, str) and not lenient:
        raise ModelConfigError(
            f"{ctx}field {key!r} must be a JSON number, got the string {v!r}", "remove the quotes"
        )
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ModelConfigError(f"{ctx}field {key!r} must be an integer, got {v!r}", "write a JSON integer")
    try:
        f = float(v)
    except ValueError:
        raise ModelConfigError(
            f"{ctx}field {key!r} must be an integer, got {v!r}", "write a JSON integer"
        ) from None
    if not f.is_integer():  # NaN and infinities are not integers either
        raise ModelConfigError(f"{ctx}field {key!r} must be an integer, got {v!r}", "write a JSON integer")
    return int(f)


def _bool(cfg: dict, key: str, default: bool, *, ctx: str) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ModelConfigError(f"{ctx}field {key!r} must be true or false, got {v!r}", "write true or false")
    return v


def _first_int(cfg: dict, keys: tuple[str, ...], *, ctx: str) -> int:
    for k in keys:
        if cfg.get(k) is not None:
            return _int(cfg, k, ctx=ctx)
    raise ModelConfigError(
        f"{ctx}missing required field {keys[0]!r}"
        + (f" (or {', '.join(map(repr, keys[1:]))})" if len(keys) > 1 else "")
    )


def _resolve_model_type(cfg: dict) -> str:
    mt = cfg.get("model_type")
    if mt is not None and not isinstance(mt, str):
        raise ModelConfigError(f"field 'model_type' must be a string, got {mt!r}")
    mt = _TEXT_ALIASES.get(mt, mt) if mt else mt
    if mt:
        return mt
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise ModelConfigError(f"field 'architectures' must be a list, got {archs!r}")
    for arch in archs:
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
    raise UnsupportedArchitecture(
        f"no model_type and unknown architectures {archs!r}",
        "add model_type to the config, or pass raw dimensions (ModelSpec field names)",
    )


def _tower_params(kind: str, t: Any, ctx: str) -> tuple[int, str]:
    """(parameters, note) of a vision/audio tower; 0 with a note when its shape is not readable.

    Counted as a standard ViT encoder (CLIP / SigLIP): per layer Q, K, V, O with biases, a
    two-matrix MLP with biases and two LayerNorms; plus the patch embedding (conv with bias) and one
    learned position embedding per patch when ``image_size`` is given. Towers of another shape
    (gated MLP, window attention, merger) differ by a few percent: the figure is approximate.
    """
    if not isinstance(t, dict):
        return 0, f"{kind} tower present but not an object: not counted"
    try:
        return _vit_params(kind, t, ctx)
    except (ModelConfigError, UnsupportedArchitecture) as e:  # a tower never sinks the text model
        return 0, f"{kind} tower present but its shape is not readable ({e.message}): not counted"


def _vit_params(kind: str, t: dict, ctx: str) -> tuple[int, str]:
    try:
        h = _first_int(t, ("hidden_size", "embed_dim", "width", "d_model"), ctx=ctx)
        L = _first_int(t, ("num_hidden_layers", "depth", "num_layers", "encoder_layers"), ctx=ctx)
    except ModelConfigError:
        return 0, f"{kind} tower present but its width/depth fields are not given: not counted"
    ffn = _int(t, "intermediate_size", 4 * h, ctx=ctx)
    layer = 4 * h * h + 4 * h + 2 * h * ffn + ffn + h + 4 * h
    p = L * layer + 2 * h
    patch, img = _side(t, "patch_size", ctx), _side(t, "image_size", ctx)
    if patch:
        ch = _int(t, "num_channels", 3, ctx=ctx)
        p += ch * patch[0] * patch[1] * h + h
        if img:
            p += (img[0] // patch[0]) * (img[1] // patch[1]) * h
    return p, f"{kind} tower ~{p / 1e9:.2f} B parameters (standard ViT count), reported apart, not costed"


def _side(t: dict, key: str, ctx: str) -> tuple[int, int] | None:
    """A square size (``14``) or a (height, width) pair (``[14, 14]``) of a vision tower."""
    v = t.get(key)
    if isinstance(v, list | tuple) and len(v) == 2:
        return _int({key: v[0]}, key, ctx=ctx), _int({key: v[1]}, key, ctx=ctx)
    n = _int(t, key, 0, ctx=ctx)
    return (n, n) if n else None


def _split_wrapper(cfg: dict, ctx: str) -> tuple[dict, dict[str, int], list[str]]:
    """The text decoder of a (multimodal) wrapper, its towers' parameters and the warnings."""
    towers: dict[str, int] = {"vision": 0, "audio": 0}
    warnings: list[str] = []
    dec = cfg
    key = next((k for k in _TEXT_KEYS if cfg.get(k) is not None), None)
    if key is not None:
        text = cfg[key]
        if not isinstance(text, dict):
            raise ModelConfigError(f"{ctx}{key} must be an object, got {type(text).__name__}")
        skip = {key, *_TOWER_KEYS, "model_type", "architectures"}
        dec = {k: v for k, v in cfg.items() if k not in skip}
        dec.update(text)
        if "model_type" not in text and "model_type" in cfg:
            dec["model_type"] = cfg["model_type"]
        if "architectures" in cfg and "architectures" not in text:
            dec["architectures"] = cfg["architectures"]
    for tk, kind in _TOWER_KEYS.items():
        if cfg.get(tk) is not None:
            p, note = _tower_params(kind, cfg[tk], ctx)
            towers[kind] += p
            warnings.append(f"{note}; the text decoder alone is costed")
    return dec, towers, warnings


def _canonical(dec: dict, arch: _Arch | None, mt: str, ctx: str) -> dict:
    """Aliases and nesting resolved to the canonical names; class defaults for absent fields."""
    cfg = dict(dec)
    if mt == "falcon" and dec.get("model_type") != "RefinedWeb" and not cfg.get("new_decoder_architecture"):
        # FalconConfig (transformers >= 5.25 to_dict) writes its num_kv_heads field beside the
        # num_key_value_heads it derives; the old architecture reads neither (FalconAttention: one KV
        # head with multi_query, else a 3 x hidden QKV): _falcon sets the KV heads from multi_query.
        cfg.pop("num_kv_heads", None)
        cfg.pop("num_key_value_heads", None)
    for nk in _NESTED:
        sub = cfg.pop(nk, None)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise ModelConfigError(f"{ctx}{nk} must be an object, got {type(sub).__name__}")
        for k, v in sub.items():
            if k == "ffn_act_fn":
                name = v.get("name") if isinstance(v, dict) else v
                if name not in ("silu", "swiglu"):
                    raise UnsupportedArchitecture(
                        f"{ctx}{nk}.ffn_act_fn {v!r}", "only SiLU-gated experts are modeled"
                    )
                continue
            if k in (
                "clip_qkv",
                "rope_theta",
                "moe_jitter_eps",
                "moe_loss_weight",
                "moe_normalize_expert_weights",
                "uniform_expert_assignment",
                "attn_pdrop",
                "model_type",  # a nested config's own (empty) model_type in transformers >= 5 to_dict()
            ):
                continue  # DbrxAttentionConfig / DbrxFFNConfig fields without a cost
            if k in cfg and cfg[k] != v:
                raise ModelConfigError(f"{ctx}{nk}.{k}={v!r} conflicts with top-level {k}={cfg[k]!r}")
            cfg[k] = v
    for canon, aliases in _ALIASES.items():
        for al in aliases:
            if al in cfg and cfg[al] is not None:
                if canon in cfg and cfg[canon] is not None and cfg[canon] != cfg[al]:
                    raise ModelConfigError(
                        f"{ctx}{al}={cfg[al]!r} and {canon}={cfg[canon]!r} disagree",
                        "keep one of the two spellings",
                    )
                cfg[canon] = cfg[al]
            cfg.pop(al, None)
    if arch is not None:
        for k, v in arch.defaults.items():
            if cfg.get(k) is None:
                cfg[k] = v
    return cfg


def _check_understood(cfg: dict, mt: str, ctx: str) -> None:
    """A model_type without known semantics loads only when every field of its config is understood."""
    # fields no known model_type reads first: they are the likely new cost (e.g. a sparse-attention
    # indexer); then fields whose meaning is specific to another model_type's class
    unknown = sorted(
        (k for k in cfg if k not in _PLAIN and not _no_cost(k) and cfg[k] is not None),
        key=lambda k: (k in _READ_BY_SOME_CLASS, k),
    )
    if unknown:
        raise UnsupportedArchitecture(
            f"{ctx}model_type {mt!r} is not one autopar knows, and its field {unknown[0]!r} is not understood"
            + (f" (nor {len(unknown) - 1} more)" if len(unknown) > 1 else ""),
            "if that field changes no parameter, FLOP or cache size, remove it and load again; otherwise "
            "describe the model with raw dimensions (ModelSpec field names). Known model_types: "
            + ", ".join(SUPPORTED_MODEL_TYPES),
        )


def _flag(arch: _Arch, rule: Any, cfg: dict, ctx: str) -> bool:
    if isinstance(rule, bool):
        return rule
    return _bool(cfg, rule, False, ctx=ctx)


def _mixers(cfg: dict, arch: _Arch, mt: str, L: int, ctx: str) -> tuple[list[str], list[str]]:
    """Per block: mixer ('attention', 'linear', 'mamba', 'none') and feed-forward ('mlp', 'moe', 'none')."""
    mix = ["attention"] * L
    ffn = ["mlp"] * L
    if arch.mixer == "qwen3_next":  # Qwen3NextConfig: linear except every full_attention_interval-th
        types = cfg.get("layer_types")
        if types is None:
            k = _int(cfg, "full_attention_interval", ctx=ctx)
            types = ["linear_attention" if (i + 1) % k else "full_attention" for i in range(L)]
        if not isinstance(types, list) or len(types) != L:
            raise ModelConfigError(f"{ctx}layer_types must list {L} entries")
        for i, t in enumerate(types):
            if t not in ("linear_attention", "full_attention"):
                raise UnsupportedArchitecture(
                    f"{ctx}layer type {t!r} in layer_types", "qwen3_next: linear_attention or full_attention"
                )
            mix[i] = "linear" if t == "linear_attention" else "attention"
    elif arch.mixer == "jamba":  # JambaConfig.layers_block_type
        p, o = _int(cfg, "attn_layer_period", ctx=ctx), _int(cfg, "attn_layer_offset", ctx=ctx)
        mix = ["attention" if i % p == o else "mamba" for i in range(L)]
    elif arch.mixer == "nemotron_h":  # NemotronHConfig.hybrid_override_pattern, one char per block
        pat = cfg.get("hybrid_override_pattern")
        if pat is None and cfg.get("layers_block_type") is not None:
            pat = _nemotron_pattern(cfg["layers_block_type"], ctx)
        if not isinstance(pat, str):
            raise ModelConfigError(
                f"{ctx}missing required field 'hybrid_override_pattern' (a string) or 'layers_block_type' (a list)"
            )
        if len(pat) != L:
            raise ModelConfigError(f"{ctx}hybrid_override_pattern has {len(pat)} characters for {L} layers")
        table = {
            "M": ("mamba", "none"),
            "*": ("attention", "none"),
            "-": ("none", "mlp"),
            "E": ("none", "moe"),
        }
        for i, c in enumerate(pat):
            if c not in table:
                raise UnsupportedArchitecture(
                    f"{ctx}block {c!r} in hybrid_override_pattern",
                    "known blocks: M (Mamba2), * (attention), - (MLP), E (MoE)",
                )
            mix[i], ffn[i] = table[c]
    elif arch.mixer == "granite_hybrid":  # GraniteMoeHybrid layer_types / Bamba attn_layer_indices
        types = cfg.get("layer_types")
        if types is None:
            idx = cfg.get("attn_layer_indices") or []
            if not isinstance(idx, list):
                raise ModelConfigError(f"{ctx}attn_layer_indices must be a list of layer indices")
            types = ["attention" if i in idx else "mamba" for i in range(L)]
        if not isinstance(types, list) or len(types) != L:
            raise ModelConfigError(f"{ctx}layer_types must list {L} entries")
        kinds = {
            "mamba": "mamba",
            "linear_attention": "mamba",
            "attention": "attention",
            "full_attention": "attention",
        }
        for i, t in enumerate(types):
            if t not in kinds:
                raise UnsupportedArchitecture(f"{ctx}layer type {t!r} in layer_types", "mamba or attention")
            mix[i] = kinds[t]
    elif arch.mixer == "falcon_h1":
        if cfg.get("attn_layer_indices") not in (None, []):
            raise UnsupportedArchitecture(
                f"{ctx}attn_layer_indices", "only Falcon-H1 with attention in every block is modeled"
            )
    return mix, ffn


# NemotronHConfig.layers_block_type (transformers >= 5, Nemotron 3 Ultra): one name per block
_NEMOTRON_BLOCKS = {
    "mamba": "M",
    "linear_attention": "M",
    "attention": "*",
    "full_attention": "*",
    "mlp": "-",
    "moe": "E",
}


def _nemotron_pattern(types: Any, ctx: str) -> str:
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ModelConfigError(f"{ctx}layers_block_type must be a list of block names")
    bad = next((t for t in types if t not in _NEMOTRON_BLOCKS), None)
    if bad is not None:
        raise UnsupportedArchitecture(
            f"{ctx}block {bad!r} in layers_block_type", f"known blocks: {', '.join(_NEMOTRON_BLOCKS)}"
        )
    return "".join(_NEMOTRON_BLOCKS[t] for t in types)


def _moe_layers(cfg: dict, arch: _Arch, L: int, ffn: list[str], ctx: str) -> list[bool]:
    """Per block: True where the feed-forward part is a routed MoE (transformers' modeling code)."""
    rule = arch.moe
    if rule == "all":
        return [True] * L
    if rule == "nemotron_h":
        return [f == "moe" for f in ffn]
    if rule == "hunyuan":
        return [True] * L
    if rule == "ernie":  # Ernie4_5_MoeDecoderLayer
        step = _int(cfg, "moe_layer_interval", ctx=ctx)
        lo, hi = _int(cfg, "moe_layer_start_index", ctx=ctx), _int(cfg, "moe_layer_end_index", L - 1, ctx=ctx)
        if _int(cfg, "num_local_experts", 0, ctx=ctx) == 0:
            return [False] * L
        return [step > 0 and (i + 1) % step == 0 and lo <= i <= hi for i in range(L)]
    if rule == "mlp_layer_types":  # ExaoneMoeDecoderLayer / Glm4MoeLiteDecoderLayer: "sparse" layers are MoE
        types = cfg.get("mlp_layer_types")
        if types is None:  # class defaults: ExaoneMoe by first_k_dense_replace, Glm4MoeLite one dense
            k = 1 if arch.cls == "Glm4MoeLiteConfig" else _int(cfg, "first_k_dense_replace", 0, ctx=ctx)
            types = ["dense" if i < k else "sparse" for i in range(L)]
        if not isinstance(types, list) or len(types) != L or any(t not in ("dense", "sparse") for t in types):
            raise ModelConfigError(f"{ctx}mlp_layer_types must list {L} entries of 'dense' or 'sparse'")
        return [t == "sparse" for t in types]
    if rule == "gemma4":  # Gemma4TextDecoderLayer: the MoE block beside the MLP on every layer
        return [_bool(cfg, "enable_moe_block", False, ctx=ctx)] * L
    if rule == "mimo":  # MiMoV2FlashConfig.mlp_layer_types, or the published moe_layer_freq list (1 = MoE)
        freq = cfg.get("moe_layer_freq")
        if cfg.get("mlp_layer_types") is None and isinstance(freq, list):
            if len(freq) != L or any(x not in (0, 1) for x in freq):
                raise ModelConfigError(f"{ctx}moe_layer_freq must list {L} entries of 0 or 1")
            return [x == 1 for x in freq]
        types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (L - 1)
        if not isinstance(types, list) or len(types) != L or any(t not in ("dense", "sparse") for t in types):
            raise ModelConfigError(f"{ctx}mlp_layer_types must list {L} entries of 'dense' or 'sparse'")
        return [t == "sparse" for t in types]
    if rule == "granite_hybrid":  # GraniteMoeHybridDecoderLayer: block_sparse_moe when experts > 0
        return [_int(cfg, "num_local_experts", 0, ctx=ctx) > 0] * L
    if rule == "qwen":  # Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer / Qwen3NextDecoderLayer
        # num_experts (published configs) is num_local_experts in transformers >= 5 to_dict()
        if _int(cfg, "num_experts", 0, ctx=ctx) == 0 and _int(cfg, "num_local_experts", 0, ctx=ctx) == 0:
            return [False] * L
        step = _int(cfg, "decoder_sparse_step", 1, ctx=ctx)
        only = set(cfg.get("mlp_only_layers") or [])
        return [i not in only and step > 0 and (i + 1) % step == 0 for i in range(L)]
    if rule == "deepseek":  # DeepseekV3DecoderLayer / Glm4MoeDecoderLayer: MoE only with routed experts
        if cfg.get("n_routed_experts") is None:
            return [False] * L
        k = _int(cfg, "first_k_dense_replace", 0, ctx=ctx)
        freq = _int(cfg, "moe_layer_freq", 1, ctx=ctx)
        return [i >= k and i % freq == 0 for i in range(L)]
    if rule == "llama4":  # Llama4TextConfig: moe_layers, else every interleave_moe_layer_step-th layer
        if cfg.get("moe_layers") is not None:
            ids = set(cfg["moe_layers"])
        else:
            step = _int(cfg, "interleave_moe_layer_step", ctx=ctx)
            ids = set(range(step - 1, L, step))
        return [i in ids for i in range(L)]
    if rule == "jamba":  # JambaConfig.layers_num_experts
        if _int(cfg, "num_experts", ctx=ctx) <= 1:
            return [False] * L
        p, o = _int(cfg, "expert_layer_period", ctx=ctx), _int(cfg, "expert_layer_offset", ctx=ctx)
        return [i % p == o for i in range(L)]
    return [False] * L


def _sliding_layers(
    cfg: dict, arch: _Arch, mt: str, mix: list[str], max_pos: int, ctx: str
) -> tuple[int, int]:
    """(window, number of sliding-window or chunked attention layers)."""
    L = len(mix)
    window = _int(cfg, "sliding_window", 0, ctx=ctx)
    types = cfg.get("layer_types") if arch.mixer not in ("qwen3_next", "granite_hybrid") else None
    if arch.sliding == "gpt_oss" and types is None and window > 0:  # GptOssConfig: sliding on even layers
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
    if arch.sliding == "gpt_neo":  # GPTNeoConfig.attention_layers, else expand attention_types
        layers = cfg.get("attention_layers")
        if layers is None:
            layers = []
            for pat, n in cfg.get("attention_types") or [[["global"], L]]:
                layers += list(pat) * int(n)
        if (
            not isinstance(layers, list)
            or len(layers) != L
            or any(t not in ("global", "local") for t in layers)
        ):
            raise ModelConfigError(f"{ctx}attention_layers must list {L} entries of 'global' or 'local'")
        n = sum(t == "local" for t in layers)
        return (_int(cfg, "window_size", 256, ctx=ctx), n) if n else (0, 0)
    if arch.sliding == "gemma2" and types is None:  # Gemma2Config: sliding on even layers
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
    if arch.sliding == "gemma3" and types is None:  # Gemma3TextConfig: 5 local : 1 global by default
        k = _int(cfg, "sliding_window_pattern", ctx=ctx)
        types = ["sliding_attention" if (i + 1) % k else "full_attention" for i in range(L)]
    if arch.sliding in ("gemma4", "mimo"):
        types = _layer_types(cfg, arch, L, ctx)
        if arch.sliding == "mimo" and cfg.get("sliding_window_size") is not None:
            # MiMoV2FlashConfig: the window is sliding_window_size previous tokens plus the query
            window = _int(cfg, "sliding_window_size", ctx=ctx) + 1
    if arch.sliding == "llama4" and types is None and cfg.get("attention_chunk_size"):
        # Llama4TextConfig: chunked (local) attention on the RoPE layers, global on the NoPE layers.
        # Modeled as a sliding window of attention_chunk_size: exact for the KV-cache cap, an upper
        # bound on attention FLOPs.
        window = _int(cfg, "attention_chunk_size", ctx=ctx)
        rope = cfg.get("no_rope_layers") or [
            int((i + 1) % _int(cfg, "no_rope_layer_interval", ctx=ctx) != 0) for i in range(L)
        ]
        return window, sum(1 for r in rope[:L] if r)
    if types is not None:
        if not isinstance(types, list) or len(types) != L:
            raise ModelConfigError(f"{ctx}layer_types must list {L} entries")
        known = {"full_attention", "sliding_attention", "chunked_attention"}
        for t in types:
            if t not in known:
                raise UnsupportedArchitecture(
                    f"{ctx}unsupported layer type {t!r} in layer_types",
                    f"supported for {mt}: {', '.join(sorted(known))}",
                )
        n = sum(t != "full_attention" for t in types)
        if any(t == "chunked_attention" for t in types):
            window = _int(cfg, "attention_chunk_size", ctx=ctx)
        if n and window <= 0:
            raise ModelConfigError(
                f"{ctx}missing required field 'sliding_window' for sliding layers in layer_types"
            )
        return (window, n) if n else (0, 0)
    n_attn = sum(m == "attention" for m in mix)
    if window <= 0 or (max_pos and window >= max_pos):  # a window as long as the context is no window
        return 0, 0
    if arch.sliding == "all":  # MistralAttention / Phi3Attention: the window applies to every layer when set
        return window, n_attn
    if arch.sliding == "qwen":
        # Qwen2Config: sliding only with use_sliding_window, on layers >= max_window_layers.
        if not cfg.get("use_sliding_window", False):
            return 0, 0
        n = max(0, L - _int(cfg, "max_window_layers", L, ctx=ctx))
        return (window, n) if n else (0, 0)
    raise ModelConfigError(
        f"{ctx}sliding_window={window} without layer_types is not understood for {mt!r}",
        "give layer_types explicitly",
    )


def _layer_types(cfg: dict, arch: _Arch, L: int, ctx: str) -> list[str]:
    """Per layer 'full_attention' or 'sliding_attention' as the model's class sets them."""
    types = cfg.get("layer_types")
    if arch.sliding == "gemma4" and types is None:  # Gemma4TextConfig: 5 sliding : 1 full by default
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(L)]
    if arch.sliding == "mimo" and types is None:
        pattern = cfg.get("hybrid_layer_pattern")  # the published config's spelling: 1 = sliding
        if pattern is None:  # MiMoV2FlashConfig: full on the first and every 6th layer
            pattern = [0 if i == 0 or not (i + 1) % 6 else 1 for i in range(L)]
        if not isinstance(pattern, list) or len(pattern) != L or any(x not in (0, 1) for x in pattern):
            raise ModelConfigError(
                f"{ctx}hybrid_layer_pattern must list {L} entries of 0 (full) or 1 (sliding)"
            )
        types = ["sliding_attention" if x else "full_attention" for x in pattern]
    if not isinstance(types, list) or len(types) != L:
        raise ModelConfigError(f"{ctx}layer_types must list {L} entries")
    types = list(types)
    if arch.sliding == "gemma4" and types and types[-1] != "full_attention":
        types[-1] = "full_attention"  # Gemma4TextConfig forces the last layer to full attention
    return types


def _one_per_kind(values: list[int], types: list[str], what: str, ctx: str) -> dict[str, int]:
    """The one value ``values`` has on each layer kind (full / sliding); a refusal where it varies."""
    out: dict[str, int] = {}
    for v, t in zip(values, types, strict=True):
        if out.setdefault(t, v) != v:
            raise UnsupportedArchitecture(
                f"{ctx}{what} differ between {t.replace('_', ' ')} layers ({out[t]} and {v})",
                "autopar models one attention shape for full and one for sliding layers",
            )
    return out


def _attention_shapes(c: dict, arch: _Arch, L: int, f: dict[str, Any], ctx: str) -> None:
    """Per-layer attention shapes into ``f``: the full layers' heads / kv_heads / head_dim /
    v_head_dim, the sliding layers' swa_* (where they differ) and full_k_eq_v."""
    types = _layer_types(c, arch, L, ctx)
    if arch.shapes == "laguna":  # LagunaAttention: num_attention_heads_per_layer[i] query heads
        f["attn_head_gate"] = _bool(c, "gating", False, ctx=ctx)
        per = c.get("num_attention_heads_per_layer")
        if per is not None:
            if not isinstance(per, list) or len(per) != L:
                raise ModelConfigError(f"{ctx}num_attention_heads_per_layer must list {L} head counts")
            heads = [_int({"heads": x}, "heads", ctx=ctx) for x in per]
            by = _one_per_kind(heads, types, "query heads", ctx)
            f["heads"] = by.get("full_attention", f["heads"])
            if by.get("sliding_attention", f["heads"]) != f["heads"]:
                f["swa_heads"] = by["sliding_attention"]
    elif arch.shapes == "gemma4":
        for k, why in (
            (
                "num_kv_shared_layers",
                "layers reusing an earlier layer's K and V (no K/V projections or cache)",
            ),
            ("hidden_size_per_layer_input", "per-layer input embeddings (embed_tokens_per_layer)"),
        ):
            if _int(c, k, 256 if k == "hidden_size_per_layer_input" else 0, ctx=ctx):
                raise UnsupportedArchitecture(f"{ctx}Gemma 4 {k} > 0: {why} not modeled yet")
        if c.get("use_bidirectional_attention") == "all":
            raise UnsupportedArchitecture(f"{ctx}Gemma 4 with bidirectional attention on text is not modeled")
        d_sw, g_sw = f["head_dim"], f["kv_heads"]
        k_eq_v = _bool(c, "attention_k_eq_v", False, ctx=ctx)
        f["head_dim"] = _int(c, "global_head_dim", 512, ctx=ctx)
        if k_eq_v and c.get("num_global_key_value_heads") is not None:
            f["kv_heads"] = _int(c, "num_global_key_value_heads", ctx=ctx)
        f["full_k_eq_v"] = k_eq_v
        if "sliding_attention" in types:
            if d_sw != f["head_dim"]:
                f["swa_head_dim"] = d_sw
            if g_sw != f["kv_heads"]:
                f["swa_kv_heads"] = g_sw
    elif arch.shapes == "mimo":
        f["v_head_dim"] = _int(c, "v_head_dim", ctx=ctx)
        if "sliding_attention" in types:
            for field, key, full in (
                ("swa_heads", "swa_num_attention_heads", f["heads"]),
                ("swa_kv_heads", "swa_num_key_value_heads", 2 * f["kv_heads"]),  # the class's default: 2x
                ("swa_head_dim", "swa_head_dim", f["head_dim"]),
                ("swa_v_head_dim", "swa_v_head_dim", f["v_head_dim"]),
            ):
                v = _int(c, key, full, ctx=ctx)
                base = {"swa_heads": f["heads"], "swa_kv_heads": f["kv_heads"]}.get(field)
                base = (
                    base
                    if base is not None
                    else (f["head_dim"] if field == "swa_head_dim" else f["v_head_dim"])
                )
                if v != base:
                    f[field] = v
        if f["v_head_dim"] == f["head_dim"]:
            f["v_head_dim"] = 0
    if not any(t == "sliding_attention" for t in types):
        for k in ("swa_heads", "swa_kv_heads", "swa_head_dim", "swa_v_head_dim"):
            f.pop(k, None)


def _max_position(cfg: dict, ctx: str) -> int:
    """max_position_embeddings, or the rope-scaled limit where the scaling says so (YaRN, linear,
    dynamic NTK: factor x the scaling's original_max_position_embeddings, when larger)."""
    base = _int(cfg, "max_position_embeddings", 0, ctx=ctx)
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rs, dict) and base:
        kind = rs.get("rope_type") or rs.get("type")
        factor = rs.get("factor")
        if (
            kind in ("yarn", "linear", "dynamic")
            and isinstance(factor, int | float)
            and not isinstance(factor, bool)
        ):
            # only with an explicit original length in the scaling: Gemma 3's linear factor 8 is how
            # it already reached its max_position_embeddings
            orig = rs.get("original_max_position_embeddings")
            if isinstance(orig, int) and not isinstance(orig, bool) and factor == factor:  # not NaN
                base = max(base, int(factor * orig))
    return base


def _normalize_hf(cfg: dict, *, name: str = "", source: str = "", own_code: bool = True) -> ModelSpec:
    """The field reader; where it refuses a decoder it does not know, the model's own code.

    With ``own_code`` and ``transformers`` installed with a class for the config, a refusal for an
    unknown model_type, fields not understood or a layer kind the field reader does not price is
    retried by :func:`autopar.own_code.spec_from_own_code` (module shapes on the meta device), which
    either reads a spec within 1 % of the class's own parameter count or refuses by name. Encoders
    and encoder-decoder models are refused as before.
    """
    try:
        return _normalize_fields(cfg, name=name, source=source)
    except UnsupportedArchitecture as refusal:
        if not own_code or _not_a_decoder(cfg):
            raise
        spec, how = _read_by_own_code(cfg, name, source, refusal)
        if spec is not None and _refused_kind(cfg):
            # a block refused by name for what its shapes do not show (sparse key selection, weight
            # sharing, lightning or delta-rule attention): the class's shapes never overrule that
            raise
        if spec is None:
            if how:  # the library is there but could not be used: say why, after the field reader's hint
                hint = "; ".join(x for x in (refusal.hint, f"its own code: {how}") if x)
                raise type(refusal)(refusal.message, hint) from None
            raise
        return spec


def _refused_kind(cfg: dict) -> bool:
    """A model_type :data:`_REFUSED_KINDS` names (a block the field reader knows it does not price)."""
    try:
        return _resolve_model_type(_split_wrapper(cfg, "")[0]) in _REFUSED_KINDS
    except ModelConfigError:
        return True


def _not_a_decoder(cfg: dict) -> bool:
    """An encoder or encoder-decoder config (refused by name by the field reader, never retried)."""
    try:
        dec = _split_wrapper(cfg, "")[0]
        mt = _resolve_model_type(dec)
    except ModelConfigError:
        return True
    return (
        mt in _ENCODERS
        or mt in _ENCODER_DECODERS
        or dec.get("is_encoder_decoder") is True
        or ("type_vocab_size" in dec and "attention_probs_dropout_prob" in dec)
    )


def _read_by_own_code(
    cfg: dict, name: str, source: str, refusal: UnsupportedArchitecture
) -> tuple[ModelSpec | None, str]:
    """(the spec the config's own transformers class gives, "") or (None, why not; "" without
    transformers); its refusal names the module, and the field reader's refusal follows in the hint."""
    try:
        return _own_code_spec(cfg, name=name, source=source)
    except UnsupportedArchitecture as e:
        raise UnsupportedArchitecture(
            e.message, f"the field reader refused it too: {refusal.message}"
        ) from None


def read_by_own_code(cfg: dict, *, name: str = "", source: str = "") -> ModelSpec | None:
    """A HF config read by its own ``transformers`` class from module shapes on the meta device.

    ``None`` when transformers (the optional extra ``autopar[models]``) is absent or has no class for
    the config; :class:`UnsupportedArchitecture` naming the module when the class builds something
    ModelSpec cannot cost. :func:`load_model` uses it where the field reader refuses a decoder;
    called directly it reads any config, so the two readers can be compared.
    """
    return _own_code_spec(cfg, name=name, source=source)[0]


def _own_code_spec(cfg: dict, *, name: str = "", source: str = "") -> tuple[ModelSpec | None, str]:
    import importlib.util

    if importlib.util.find_spec("transformers") is None:  # the optional extra autopar[models]
        return None, ""
    from autopar.own_code import spec_from_own_code

    mt = cfg.get("model_type")
    label = name or str(cfg.get("_name_or_path") or mt or "model")
    try:  # the position limit as the field reader reads it (rope-scaled where the config says so)
        dec = dict(_split_wrapper(cfg, "")[0])
        for alias in _ALIASES["max_position_embeddings"]:
            if dec.get("max_position_embeddings") is None and dec.get(alias) is not None:
                dec["max_position_embeddings"] = dec[alias]
        max_pos = _max_position(dec, "")
    except ModelConfigError:
        max_pos = 0  # the class's own max_position_embeddings then
    spec, how = spec_from_own_code(cfg, name=label, source=source, build=_build_own, max_position=max_pos)
    return spec, "" if spec is not None else how


def _build_own(fields: dict) -> ModelSpec:
    """A ModelSpec from the fields :mod:`autopar.own_code` read off the module shapes."""
    return _build(fields, f"{fields.get('name')}: ")


def _normalize_fields(cfg: dict, *, name: str = "", source: str = "") -> ModelSpec:
    ctx0 = f"{name}: " if name else ""
    dec, towers, warnings = _split_wrapper(cfg, ctx0)
    mt = _resolve_model_type(dec)
    enc = _read_encoder(dec, mt, name, source, warnings)
    if enc is not None:
        return enc
    _refuse_by_name(dec, mt)
    arch = _ARCH.get(mt)
    ctx = f"{name} ({mt}): " if name and name != mt else f"{mt}: "
    c = _canonical(dec, arch, mt, ctx)
    if (
        mt == "nemotron_h"
        and c.get("num_hidden_layers") is None
        and isinstance(c.get("layers_block_type"), list)
    ):
        c["num_hidden_layers"] = len(c["layers_block_type"])  # NemotronHConfig: the list sets the depth
    if arch is None:
        _check_understood(c, mt, ctx)
        arch = _Arch(f"{mt} (read as a plain Llama-style decoder)", **_LLAMA)
    if mt == "falcon":
        rw = dec.get("model_type") == "RefinedWeb" and "new_decoder_architecture" not in dec
        c = _falcon(c, ctx, refined_web=rw)
    if (
        mt in ("gpt2", "gptj", "codegen", "gpt_bigcode", "gpt_neo", "bloom")
        and c.get("intermediate_size") is None
    ):
        c["intermediate_size"] = 4 * _int(c, "hidden_size", ctx=ctx)  # GPT2MLP: n_inner or 4 * n_embd
    if mt == "gpt_bigcode":  # GPTBigCodeAttention: one shared K/V head when multi_query
        c["num_key_value_heads"] = 1 if _bool(c, "multi_query", True, ctx=ctx) else c["num_attention_heads"]
    h = _int(c, "hidden_size", ctx=ctx)
    L = _int(c, "num_hidden_layers", ctx=ctx)
    a = _int(c, "num_attention_heads", ctx=ctx)
    for key, v in (("hidden_size", h), ("num_hidden_layers", L), ("num_attention_heads", a)):
        if v < 1:  # a count of zero would divide by zero below
            raise ModelConfigError(f"{ctx}{key} is {v}; it must be positive", f"fix {key} in the config")
    if h % a and c.get("head_dim") is None and not c.get("kv_lora_rank"):
        raise ModelConfigError(
            f"{ctx}hidden_size {h} is not a multiple of num_attention_heads {a} and head_dim is not given"
        )
    max_pos = _max_position(c, ctx)
    f: dict[str, Any] = {
        "hidden": h,
        "layers": L,
        "heads": a,
        "kv_heads": _int(c, "num_key_value_heads", a, ctx=ctx),  # absent => MHA
        "head_dim": _int(c, "head_dim", h // a, ctx=ctx),
        "vocab": _int(c, "vocab_size", ctx=ctx),
        "max_position": max_pos,
        "norm": arch.norm,
        "norms_per_layer": arch.norms,
        "parallel_block": arch.parallel,
        "qkv_bias": _flag(arch, arch.qkv_bias, c, ctx),
        "o_bias": _flag(arch, arch.o_bias, c, ctx),
        "mlp_bias": _flag(arch, arch.mlp_bias, c, ctx),
    }
    if arch.qk_norm.startswith("field:"):
        _, fld, kind = arch.qk_norm.split(":")
        f["qk_norm"] = kind if _bool(c, fld, False, ctx=ctx) else "none"
    else:
        f["qk_norm"] = arch.qk_norm
    if mt == "falcon":
        f["norms_per_layer"], f["parallel_block"] = c["_norms"], c["_parallel"]
    if mt == "phimoe":
        f["head_bias"] = _bool(c, "lm_head_bias", False, ctx=ctx)
    if mt in ("gptj", "codegen"):
        f["head_bias"] = True
    if mt == "phi":
        f["head_bias"] = True  # PhiForCausalLM: lm_head with bias
    if mt == "stablelm" and (
        _bool(c, "qk_layernorm", False, ctx=ctx) or _bool(c, "use_parallel_residual", False, ctx=ctx)
    ):
        raise UnsupportedArchitecture(
            f"{ctx}StableLM qk_layernorm / use_parallel_residual", "not modeled yet"
        )
    if mt == "ernie4_5_moe":
        f["head_bias"] = _bool(
            c, "use_bias", False, ctx=ctx
        )  # GPTJForCausalLM / CodeGenForCausalLM: lm_head with bias
    if arch.mixer == "qwen3_next":
        f["attn_output_gate"] = True  # Qwen3NextAttention: gated attention, q_proj -> 2 x heads x head_dim
    # ---- activation: a gated MLP has 3 matrices, a plain one 2
    act = c.get("mlp_hidden_act") if mt == "nemotron_h" else c.get("hidden_act", c.get("activation_function"))
    gated = arch.gated
    if mt not in _ARCH and act in _UNGATED_ACTS:
        raise UnsupportedArchitecture(
            f"{ctx}hidden_act {act!r} of an unknown model_type",
            "autopar cannot tell a gated from a plain MLP here",
        )
    if mt in ("nemotron", "nemotron_h") and act not in (None, "relu2"):
        raise UnsupportedArchitecture(
            f"{ctx}{mt} with hidden_act {act!r}", "only squared-ReLU (relu2) Nemotron MLPs are modeled"
        )
    f["gated_mlp"] = gated
    # ---- mixers and feed-forward kinds per block
    mix, ffn = _mixers(c, arch, mt, L, ctx)
    moe = _moe_layers(c, arch, L, ffn, ctx)
    n_moe = sum(moe)
    no_ffn = sum(x == "none" for x in ffn)
    dense_needed = L - n_moe - no_ffn > 0
    f["no_ffn_layers"] = no_ffn
    f["no_mixer_layers"] = sum(m == "none" for m in mix)
    f["block_pattern"] = block_pattern(mix, ffn, moe)
    f["linear_attn_layers"] = sum(m == "linear" for m in mix)
    f["mamba_layers"] = sum(m == "mamba" for m in mix)
    if arch.mixer == "falcon_h1":
        f["mamba_layers"], f["mamba_parallel"] = L, True
    if f["linear_attn_layers"]:
        f["linear_k_heads"] = _int(c, "linear_num_key_heads", ctx=ctx)
        f["linear_v_heads"] = _int(c, "linear_num_value_heads", ctx=ctx)
        f["linear_k_head_dim"] = _int(c, "linear_key_head_dim", ctx=ctx)
        f["linear_v_head_dim"] = _int(c, "linear_value_head_dim", ctx=ctx)
        f["linear_conv"] = _int(c, "linear_conv_kernel_dim", ctx=ctx)
    if f["mamba_layers"]:
        f.update(_mamba_fields(c, arch, h, ctx))
    # ---- feed-forward widths and experts
    if arch.moe == "all":
        # Mixtral / Grok-1 / gpt-oss / PhiMoE / GraniteMoE / OLMoE / DBRX: intermediate_size IS the
        # per-expert size; no dense layers.
        f["ffn_hidden"] = 0
        f["moe_ffn_hidden"] = _int(c, "intermediate_size", ctx=ctx)
        f["num_experts"] = _first_int(c, ("num_local_experts", "num_experts"), ctx=ctx)
        f["shared_expert_ffn"] = _int(c, "shared_intermediate_size", 0, ctx=ctx)  # GraniteMoeShared
    elif arch.moe in ("ernie", "mlp_layer_types") and n_moe:
        f["ffn_hidden"] = _int(c, "intermediate_size", ctx=ctx) if dense_needed else 0
        f["moe_ffn_hidden"] = _int(c, "moe_intermediate_size", ctx=ctx)
        f["num_experts"] = _first_int(c, ("n_routed_experts", "num_local_experts", "num_experts"), ctx=ctx)
        n_shared = (
            ("moe_num_shared_experts",) if arch.moe == "ernie" else ("num_shared_experts", "n_shared_experts")
        )
        f["shared_expert_ffn"] = f["moe_ffn_hidden"] * next(
            (_int(c, k, ctx=ctx) for k in n_shared if c.get(k) is not None), 0
        )
        if arch.shapes == "laguna":  # LagunaSparseMoeBlock.shared_experts: its own width
            f["shared_expert_ffn"] = _int(c, "shared_expert_intermediate_size", 0, ctx=ctx)
        if arch.moe == "ernie":
            c["num_experts_per_tok"] = _first_int(c, ("moe_k", "num_experts_per_tok"), ctx=ctx)
    elif arch.moe == "hunyuan":  # experts and shared MLP at moe_intermediate_size (= intermediate_size)
        width = _int(c, "moe_intermediate_size", _int(c, "intermediate_size", ctx=ctx), ctx=ctx)
        f["ffn_hidden"] = 0
        f["moe_ffn_hidden"] = width
        f["num_experts"] = _first_int(c, ("num_experts", "num_local_experts"), ctx=ctx)
        f["shared_expert_ffn"] = width * _int(c, "num_shared_expert", 1, ctx=ctx)
        c["num_experts_per_tok"] = _first_int(c, ("moe_topk", "num_experts_per_tok"), ctx=ctx)
    elif arch.moe == "granite_hybrid":  # experts of intermediate_size + the shared_mlp; else shared_mlp only
        shared = _int(c, "shared_intermediate_size", ctx=ctx)
        if n_moe:
            f["ffn_hidden"] = 0
            f["moe_ffn_hidden"] = _int(c, "intermediate_size", ctx=ctx)
            f["num_experts"] = _int(c, "num_local_experts", ctx=ctx)
            f["shared_expert_ffn"] = shared
        else:
            f["ffn_hidden"] = shared
    elif arch.moe == "gemma4" and n_moe:
        # Gemma4TextDecoderLayer: the dense MLP (intermediate_size) runs beside the routed experts on
        # every layer, an always-active shared expert; router proj h -> E (its h + E scales not counted)
        f["ffn_hidden"] = 0
        f["moe_ffn_hidden"] = _int(c, "moe_intermediate_size", ctx=ctx)
        f["num_experts"] = _int(c, "num_experts", ctx=ctx)
        f["shared_expert_ffn"] = _int(c, "intermediate_size", ctx=ctx)
        c["num_experts_per_tok"] = _int(c, "top_k_experts", ctx=ctx)
        f["norms_per_layer"] = 7  # + post_feedforward_layernorm_1/_2 and pre_feedforward_layernorm_2
    elif arch.moe == "mimo" and n_moe:
        f["ffn_hidden"] = _int(c, "intermediate_size", ctx=ctx) if dense_needed else 0
        f["moe_ffn_hidden"] = _int(c, "moe_intermediate_size", ctx=ctx)
        f["num_experts"] = _first_int(c, ("n_routed_experts", "num_local_experts"), ctx=ctx)
        f["shared_expert_ffn"] = _int(c, "n_shared_experts", 0, ctx=ctx) * f["moe_ffn_hidden"]
    elif arch.moe == "llama4":
        f["ffn_hidden"] = _int(c, "intermediate_size_mlp", ctx=ctx) if dense_needed else 0
        f["moe_ffn_hidden"] = _int(c, "intermediate_size", ctx=ctx)
        f["shared_expert_ffn"] = f["moe_ffn_hidden"]  # Llama4TextMoe.shared_expert (not a config field)
        f["num_experts"] = _int(c, "num_local_experts", ctx=ctx)
    elif arch.moe == "jamba" and n_moe:  # JambaSparseMoeBlock experts and the dense MLP share the width
        f["ffn_hidden"] = _int(c, "intermediate_size", ctx=ctx)
        f["moe_ffn_hidden"] = f["ffn_hidden"]
        f["num_experts"] = _int(c, "num_experts", ctx=ctx)
    elif arch.moe in ("qwen", "deepseek", "nemotron_h") and n_moe:
        f["ffn_hidden"] = _int(c, "intermediate_size", ctx=ctx) if dense_needed else 0
        f["moe_ffn_hidden"] = _int(c, "moe_intermediate_size", ctx=ctx)
        if arch.moe == "deepseek":
            f["num_experts"] = _int(c, "n_routed_experts", ctx=ctx)
            f["shared_expert_ffn"] = _int(c, "n_shared_experts", 0, ctx=ctx) * f["moe_ffn_hidden"]
        elif arch.moe == "nemotron_h":
            f["num_experts"] = _int(c, "n_routed_experts", ctx=ctx)
            f["shared_expert_ffn"] = _int(c, "moe_shared_expert_intermediate_size", 0, ctx=ctx) * _int(
                c, "n_shared_experts", 1, ctx=ctx
            )
            if c.get("moe_latent_size") is not None:  # NemotronHMoE.fc1/fc2_latent_proj
                f["moe_latent_size"] = _int(c, "moe_latent_size", ctx=ctx)
        else:
            f["num_experts"] = _first_int(c, ("num_experts", "num_local_experts"), ctx=ctx)
            f["shared_expert_ffn"] = _int(c, "shared_expert_intermediate_size", 0, ctx=ctx)
    else:
        f["ffn_hidden"] = _int(c, "intermediate_size", ctx=ctx) if dense_needed else 0
    if f.get("num_experts"):
        f["moe_topk"] = _first_int(c, ("num_experts_per_tok",), ctx=ctx)
        groups = _int(c, "n_group", 1, ctx=ctx) if c.get("n_group") else 1
        if groups > 1 and c.get("topk_method") != "greedy":  # DeepSeek-V2-Lite's greedy ignores groups
            f["moe_router_groups"] = groups
            f["moe_router_topk_groups"] = (
                _int(c, "topk_group", groups, ctx=ctx) if c.get("topk_group") else groups
            )
        f["moe_layers"] = n_moe
        f["first_dense_layers"] = (
            next((i for i, m in enumerate(moe) if m), L) if arch.moe != "nemotron_h" else 0
        )
        for k in ("zero_expert_num", "n_null_experts"):
            if c.get(k):
                raise UnsupportedArchitecture(
                    f"{ctx}{k}={c[k]!r} (zero-computation experts)", "not modeled yet"
                )
    else:
        for k in ("num_experts", "moe_ffn_hidden", "shared_expert_ffn"):
            f.pop(k, None)
    if arch.moe in ("deepseek", "mlp_layer_types") and c.get("kv_lora_rank"):
        f["q_lora_rank"] = _int(c, "q_lora_rank", 0, ctx=ctx)  # null in DeepSeek-V2-Lite
        for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            f[k] = _int(c, k, ctx=ctx)
        if c.get("index_topk") is not None:  # DeepSeek Sparse Attention's lightning indexer
            f["index_heads"] = _int(c, "index_n_heads", ctx=ctx)
            f["index_head_dim"] = _int(c, "index_head_dim", ctx=ctx)
            f["index_topk"] = _int(c, "index_topk", ctx=ctx)
            if (
                c.get("qk_head_dim") is not None
                and c["qk_head_dim"] != f["qk_nope_head_dim"] + f["qk_rope_head_dim"]
            ):
                raise ModelConfigError(
                    f"{ctx}qk_head_dim {c['qk_head_dim']} is not qk_nope_head_dim + qk_rope_head_dim",
                    "fix the config: the MLA query head is its no-rope and rope parts",
                )
        f["head_dim"] = f["qk_nope_head_dim"] + f["qk_rope_head_dim"]
    f["mtp_layers"] = _int(c, "num_nextn_predict_layers", 0, ctx=ctx)
    f["sliding_window"], f["sliding_window_layers"] = _sliding_layers(c, arch, mt, mix, max_pos, ctx)
    if arch.shapes:
        _attention_shapes(c, arch, L, f, ctx)
    f["tie_embeddings"] = _bool(c, "tie_word_embeddings", arch.tie, ctx=ctx)
    if mt == "gpt_neox":  # GPTNeoXConfig.use_parallel_residual (default True), two LayerNorms
        f["parallel_block"] = _bool(c, "use_parallel_residual", True, ctx=ctx)
    if f["parallel_block"]:
        warnings.append(
            "parallel attention+MLP block: parameters and FLOPs exact; TP communication costed as for "
            "sequential sub-layers (an upper bound: a parallel block needs one all-reduce, not two)"
        )
    f["vision_params"], f["audio_params"] = towers["vision"], towers["audio"]
    f["warnings"] = tuple(warnings)
    f["name"] = name or str(c.get("_name_or_path") or mt)
    f["source"] = source
    return _build(f, ctx)


# Not decoder-only: BERT-style encoders and encoder-decoder models. autopar costs decoder stacks;
# reading these as a gated RMSNorm decoder would be wrong (a BERT-base config gave 0.16 B, not 110 M).
_ENCODERS = frozenset(
    """
    bert roberta xlm-roberta xlm-roberta-xl camembert data2vec-text electra ernie megatron-bert
    roc_bert roformer rembert big_bird nezha mpnet deberta deberta-v2 distilbert albert modernbert
    xmod ibert layoutlm luke convbert funnel squeezebert mobilebert canine esm nomic_bert jina_bert
    bert-generation
    """.split()
)
_ENCODER_DECODERS = frozenset(
    """
    t5 mt5 umt5 t5gemma t5gemma2 bart mbart pegasus pegasus_x marian blenderbot blenderbot-small
    plbart prophetnet bigbird_pegasus led longt5 switch_transformers whisper mvp fsmt m2m_100 nllb_moe
    seamless_m4t encoder-decoder speech-encoder-decoder vision-encoder-decoder trocr
    """.split()
)
# Decoders with a block autopar does not price, refused by name with the reason (issue 22).
_REFUSED_KINDS: dict[str, str] = {
    "minimax": "MiniMax lightning (linear) attention blocks",
    "minimax_m3_vl_text": "MiniMax lightning attention and mixed dense/MoE widths",
    "gemma3n_text": "Gemma 3n (AltUp, Laurel blocks and per-layer input embeddings)",
    "gemma3n": "Gemma 3n (AltUp, Laurel blocks and per-layer input embeddings)",
    "falcon_mamba": "an attention-free, MLP-free Mamba1 stack (Falcon-Mamba)",
    "mamba": "an attention-free, MLP-free Mamba1 stack",
    "mamba2": "an attention-free, MLP-free Mamba2 stack",
    "lfm2": "LFM2 short-convolution blocks",
    "lfm2_moe": "LFM2 short-convolution blocks",
    "rwkv": "RWKV time-mix / channel-mix blocks",
    "xlstm": "xLSTM blocks",
    "recurrent_gemma": "RecurrentGemma RG-LRU blocks",
    "kimi_linear": "Kimi Delta Attention (KDA) blocks",
    "mllama_text_model": "cross-attention image layers (Llama 3.2 Vision)",
    "bitnet": "BitNet ternary layers with extra sub-layer norms",
    "zamba": "Zamba shared attention blocks",
    "mistral_large4_text": "Mistral Large 4 indexed (sparse) attention layers",
    "zamba2": "Zamba2 shared attention blocks with LoRA adapters",
}


def _read_encoder(cfg: dict, mt: str, name: str, source: str, warnings: list[str]) -> ModelSpec | None:
    """An encoder or encoder-decoder config autopar costs as what it is (:mod:`autopar.encoders`);
    None for every other model type."""
    from autopar import encoders

    if not encoders.handles(mt):
        return None
    ctx = f"{name} ({mt}): " if name and name != mt else f"{mt}: "
    f = encoders.read(cfg, mt, ctx, _int, _bool)
    f["warnings"] = tuple(warnings + f["warnings"])
    f["name"] = name or str(cfg.get("_name_or_path") or mt)
    f["source"] = source
    return _build(f, ctx)


def _refuse_by_name(cfg: dict, mt: str) -> None:
    if mt in _ENCODERS or (
        mt not in _ARCH and "type_vocab_size" in cfg and "attention_probs_dropout_prob" in cfg
    ):
        raise UnsupportedArchitecture(
            f"{mt}: a BERT-style encoder (bidirectional, post-norm, learned positions), not a decoder",
            "autopar costs decoder-only language models; describe it with raw dimensions only if a decoder is meant",
        )
    if mt in _ENCODER_DECODERS or cfg.get("is_encoder_decoder") is True:
        raise UnsupportedArchitecture(
            f"{mt}: an encoder-decoder model (separate encoder and cross-attending decoder stacks)",
            "autopar costs decoder-only language models",
        )
    if mt in _REFUSED_KINDS:
        raise UnsupportedArchitecture(
            f"{mt}: {_REFUSED_KINDS[mt]} not modeled yet",
            "`autopar model --reader transformers` still counts its parameters when transformers has its class",
        )


def _falcon(c: dict, ctx: str, *, refined_web: bool = False) -> dict:
    """FalconConfig semantics: KV heads, norms per block and the MLP width (FalconModel).

    ``refined_web``: the original Falcon-40B/180B config (model_type ``RefinedWeb``, its own
    modelling_RW.py) is the new decoder architecture (``n_head_kv`` KV heads, ln_attn + ln_mlp),
    as transformers' converted config of the same checkpoint states with new_decoder_architecture.
    """
    c = dict(c)
    new = refined_web or _bool(c, "new_decoder_architecture", False, ctx=ctx)
    a = _int(c, "num_attention_heads", ctx=ctx)
    if _bool(c, "alibi", False, ctx=ctx):
        pass  # ALiBi biases are computed, not stored: no parameters
    if new:
        c["num_key_value_heads"] = _int(c, "num_key_value_heads", a, ctx=ctx)
        c["_norms"] = _int(c, "num_ln_in_parallel_attn", 2, ctx=ctx)  # ln_attn + ln_mlp
        c["_parallel"] = True
    else:
        c["num_key_value_heads"] = 1 if _bool(c, "multi_query", True, ctx=ctx) else a
        par = _bool(c, "parallel_attn", True, ctx=ctx)
        c["_norms"] = 1 if par else 2
        c["_parallel"] = par
    if c.get("intermediate_size") is None:
        c["intermediate_size"] = 4 * _int(c, "hidden_size", ctx=ctx)  # FalconMLP: 4 * hidden
    return c


def _mamba_fields(c: dict, arch: _Arch, h: int, ctx: str) -> dict[str, Any]:
    if arch.mixer == "jamba":  # JambaMambaMixer (Mamba1)
        n = _int(c, "mamba_d_state", ctx=ctx)
        di = _int(c, "mamba_expand", ctx=ctx) * h
        r = c.get("mamba_dt_rank")
        rank = -(-h // 16) if r == "auto" else _int(c, "mamba_dt_rank", ctx=ctx)  # ceil(hidden / 16)
        return dict(
            mamba_version=1,
            mamba_inner=di,
            mamba_state=n,
            mamba_conv=_int(c, "mamba_d_conv", ctx=ctx),
            mamba_dt_rank=rank,
            mamba_conv_bias=_bool(c, "mamba_conv_bias", True, ctx=ctx),
            mamba_gated_norm=False,
        )
    if arch.mixer == "nemotron_h":  # NemotronHMamba2Mixer: d_inner = mamba_num_heads * mamba_head_dim
        nh = _int(c, "mamba_num_heads", ctx=ctx)
        return dict(
            mamba_version=2,
            mamba_heads=nh,
            mamba_inner=nh * _int(c, "mamba_head_dim", ctx=ctx),
            mamba_state=_int(c, "ssm_state_size", ctx=ctx),
            mamba_groups=_int(c, "n_groups", ctx=ctx),
            mamba_conv=_int(c, "conv_kernel", ctx=ctx),
            mamba_conv_bias=_bool(c, "use_conv_bias", True, ctx=ctx),
            mamba_gated_norm=True,
        )
    if arch.mixer == "granite_hybrid":  # GraniteMoeHybridMambaLayer / BambaMixer (Mamba2)
        nh = _int(c, "mamba_n_heads", ctx=ctx)
        di = _int(c, "mamba_expand", ctx=ctx) * h
        dh = c.get("mamba_d_head")
        if dh not in (None, "auto") and _int(c, "mamba_d_head", ctx=ctx) * nh != di:
            raise ModelConfigError(f"{ctx}mamba_n_heads x mamba_d_head != mamba_expand x hidden_size ({di})")
        if _bool(c, "mamba_proj_bias", False, ctx=ctx):
            raise UnsupportedArchitecture(f"{ctx}mamba_proj_bias", "Mamba projection biases are not modeled")
        return dict(
            mamba_version=2,
            mamba_heads=nh,
            mamba_inner=di,
            mamba_state=_int(c, "mamba_d_state", ctx=ctx),
            mamba_groups=_int(c, "mamba_n_groups", ctx=ctx),
            mamba_conv=_int(c, "mamba_d_conv", ctx=ctx),
            mamba_conv_bias=_bool(c, "mamba_conv_bias", True, ctx=ctx),
            mamba_gated_norm=True,
        )
    # FalconH1Mixer: d_inner = mamba_d_ssm, else mamba_n_heads * mamba_d_head
    nh = _int(c, "mamba_n_heads", ctx=ctx)
    dh = c.get("mamba_d_head")
    di = _int(c, "mamba_d_ssm", 0, ctx=ctx)
    if dh not in (None, "auto"):
        dh = _int(c, "mamba_d_head", ctx=ctx)
        if di and di != nh * dh:
            raise ModelConfigError(f"{ctx}mamba_d_ssm {di} != mamba_n_heads x mamba_d_head ({nh} x {dh})")
        di = nh * dh
    if not di:
        raise ModelConfigError(f"{ctx}missing required field 'mamba_d_ssm' (or mamba_d_head)")
    if _bool(c, "mamba_proj_bias", False, ctx=ctx) or _bool(c, "projectors_bias", False, ctx=ctx):
        raise UnsupportedArchitecture(
            f"{ctx}mamba_proj_bias / projectors_bias", "Falcon-H1 projection biases are not modeled"
        )
    return dict(
        mamba_version=2,
        mamba_heads=nh,
        mamba_inner=di,
        mamba_state=_int(c, "mamba_d_state", ctx=ctx),
        mamba_groups=_int(c, "mamba_n_groups", ctx=ctx),
        mamba_conv=_int(c, "mamba_d_conv", ctx=ctx),
        mamba_conv_bias=_bool(c, "mamba_conv_bias", True, ctx=ctx),
        mamba_gated_norm=_bool(c, "mamba_rms_norm", False, ctx=ctx),
    )


def _build(fields: dict, ctx: str) -> ModelSpec:
    try:
        return ModelSpec(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "?"
        if err["type"] == "missing":
            raise ModelConfigError(f"{ctx}missing required field {loc!r}") from None
        if err["type"] == "extra_forbidden":
            raise ModelConfigError(
                f"{ctx}unknown field {loc!r}", f"valid fields: {', '.join(ModelSpec.model_fields)}"
            ) from None
        raise ModelConfigError(
            f"{ctx}invalid value for {loc!r}: {err['msg']} (got {err.get('input')!r})"
        ) from None


def check_context(spec: ModelSpec, tokens: int, *, allow_long_context: bool, what: str) -> None:
    """Refuse a sequence beyond the model's position limit unless long-context work is declared."""
    if spec.max_position and tokens > spec.max_position and not allow_long_context:
        raise ModelConfigError(
            f"{what} of {tokens:,} tokens exceeds the position limit of {spec.name} "
            f"({spec.max_position:,} tokens: max_position_embeddings, rope-scaled where the config says so)",
            "shorten it, or pass --allow-long-context (allow_long_context=True) for long-context extension work",
        )


def check_costed(spec: ModelSpec, what: str) -> None:
    """Refuse step-time/memory costing of block kinds the latency and memory models do not price.

    Hybrid blocks (Gated DeltaNet, Mamba1/Mamba2, Falcon-H1's parallel Mamba, mixer-only and
    MLP-only blocks) are priced by :mod:`autopar.hybrid` in training and serving. Still refused:
    MLA attention in a hybrid stack, and a stack with no feed-forward part at all (the engine
    counts a stage's blocks from its dense and MoE ones).
    """
    if spec.is_encoder_decoder and "training" not in what:
        raise UnsupportedArchitecture(
            f"{spec.name}: {what} of an encoder-decoder model is not modeled",
            "`autopar model` reports its parameters; `autopar predict` costs its training",
        )
    if spec.is_encoder and "training" not in what:
        raise UnsupportedArchitecture(
            f"{spec.name}: an encoder-only model (bidirectional, no KV cache) is not served autoregressively; "
            f"{what} is for decoders",
            "`autopar predict` costs its training; `autopar model` reports its parameters",
        )
    if spec.index_topk and "training" not in what:
        raise UnsupportedArchitecture(
            f"{spec.name}: {what} of DeepSeek Sparse Attention (the decode step reads the indexer's keys "
            "of every cached token and the latents of its top-k only) is not modeled",
            "`autopar predict` costs its training; `autopar model` reports its parameters and KV cache",
        )
    if not spec.is_hybrid:
        return
    why = None
    if spec.is_mla:
        why = "MLA attention beside hybrid blocks"
    elif spec.no_ffn_layers >= spec.layers:
        why = f"{spec.layers} blocks without any feed-forward part"
    if why:
        raise UnsupportedArchitecture(
            f"{spec.name}: {what} of {why} is not modeled",
            "`autopar model` reports its parameters, FLOPs per token and recurrent state",
        )


# ================================================================================ raw dims
_DERIVED = ("total_params", "active_params")


def _from_raw(d: dict) -> ModelSpec:
    """Raw dimensions keyed by ModelSpec field names (blank/None cells mean "not given")."""
    fields = set(ModelSpec.model_fields)
    ctx = f"{d.get('name') or 'raw model'}: "
    if isinstance(d.get("_class_name"), str):
        raise UnsupportedArchitecture(
            f"a diffusers config ({d['_class_name']}), not a language model", "use `autopar dit model` for it"
        )
    for k in d:
        if k not in fields and k not in _DERIVED:
            raise ModelConfigError(
                f"{ctx}unknown key {k!r} in raw model dimensions",
                f"use ModelSpec field names ({', '.join(ModelSpec.model_fields)}); "
                "an HF config.json needs 'model_type' or 'architectures'",
            )
    f = {k: v for k, v in d.items() if k in fields and v is not None and v != ""}
    for k, info in ModelSpec.model_fields.items():
        if k in f and info.annotation is int:
            f[k] = _int(f, k, ctx=ctx, lenient=True)
    f.setdefault("name", "custom")
    if "heads" in f:
        f.setdefault("kv_heads", f["heads"])  # HF and published_runs_dev.csv convention: absent => MHA
        if f["heads"] < 1:  # checked before hidden % heads divides by it
            raise ModelConfigError(
                f"{ctx}heads must be positive, got {f['heads']}", "fix heads in the config"
            )
        if "hidden" in f:
            if f["hidden"] % f["heads"] and "head_dim" not in f:
                raise ModelConfigError(f"{ctx}hidden is not a multiple of heads and head_dim is not given")
            f.setdefault("head_dim", f["hidden"] // f["heads"])
    spec = _build(f, ctx)
    for k in _DERIVED:  # to_dict() output round-trips; a stale count is an error, not ignored
        if d.get(k) not in (None, "") and _int(d, k, ctx=ctx, lenient=True) != getattr(spec, k):
            raise ModelConfigError(f"{ctx}{k}={d[k]} does not match the dimensions ({getattr(spec, k)})")
    return spec


# ====================================================================== classic decoders
# Decoders published by their dimensions only (papers' tables, no config.json): each family's
# conventions as its paper states them. Learned absolute positions (GPT-3, OPT) are not counted,
# as for GPT-2 above; ALiBi (BLOOM) and RoPE (PaLM) have no parameters.
_CLASSIC: tuple[tuple[tuple[str, ...], dict[str, Any], str], ...] = (
    (
        ("palm",),
        dict(gated_mlp=True, norm="layernorm_nobias", parallel_block=True, tie_embeddings=True, vocab=256000),
        "PaLM (arXiv 2204.02311 Sec. 2): SwiGLU MLP, parallel attention+MLP block, multi-query attention "
        "(kv_heads=1 unless stated), no biases, shared input/output embedding, RoPE, 256k vocabulary",
    ),
    (
        ("bloom",),
        dict(qkv_bias=True, o_bias=True, mlp_bias=True, vocab=250880),
        "BLOOM (arXiv 2211.05100): GELU MLP 4h, LayerNorm, ALiBi positions, tied embeddings, biases, "
        "250,880-token vocabulary",
    ),
    (
        ("opt",),
        dict(qkv_bias=True, o_bias=True, mlp_bias=True, vocab=50272),
        "OPT (arXiv 2205.01068): ReLU MLP 4h, LayerNorm, learned positions (not counted), tied "
        "embeddings, biases, 50,272-token vocabulary",
    ),
)
_GPT = (
    dict(qkv_bias=True, o_bias=True, mlp_bias=True, vocab=50257),
    "GPT-style decoder (GPT-3, arXiv 2005.14165; Megatron-LM): GELU MLP 4h, LayerNorm, learned positions "
    "(not counted), tied embeddings, biases, 50,257-token vocabulary",
)


def classic_decoder(
    name: str,
    *,
    hidden: int,
    layers: int,
    heads: int,
    ffn_hidden: int | None = None,
    vocab: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> tuple[ModelSpec, list[str]]:
    """A classic (pre-2023) dense decoder known by its dimensions, with its family's conventions.

    PaLM, BLOOM and OPT by name, any other as a GPT-3-style decoder; the conventions used, and each
    default taken for a dimension not given, are returned as assumptions to state. Sizes given win.
    """
    low = name.lower()
    fields, note = next(((f, n) for keys, f, n in _CLASSIC if any(k in low for k in keys)), _GPT)
    fields = dict(fields)
    notes = [note]
    default_vocab = fields.pop("vocab")
    f: dict[str, Any] = dict(
        name=name, hidden=hidden, layers=layers, heads=heads, gated_mlp=False, norm="layernorm",
        tie_embeddings=True,
    )  # fmt: skip
    f.update(fields)
    if ffn_hidden is None:
        ffn_hidden = 4 * hidden
        notes.append(f"ffn_hidden=4*hidden={ffn_hidden} (the family's convention)")
    if vocab is None:
        vocab = default_vocab
        notes.append(f"vocab={vocab} (the family's tokenizer)")
    if kv_heads is None:
        kv_heads = 1 if "palm" in low else heads
    if head_dim is None:
        if "palm" in low and hidden // heads != 256:
            head_dim = 256  # PaLM Table 1: head size 256 for every model
            notes.append("head_dim=256 (PaLM Table 1)")
        elif hidden % heads:
            raise ModelConfigError(
                f"{name}: hidden {hidden} is not a multiple of heads {heads}; give head_dim"
            )
        else:
            head_dim = hidden // heads
    f.update(ffn_hidden=ffn_hidden, vocab=vocab, kv_heads=kv_heads, head_dim=head_dim)
    return _build(f, f"{name}: "), notes


# ================================================================================= presets
def _preset_dir():
    return resources.files("autopar").joinpath("presets")


def list_presets() -> list[str]:
    """Ids of the bundled model presets (the ``model_preset`` vocabulary of the data files)."""
    return sorted(p.name[:-5] for p in _preset_dir().iterdir() if p.name.endswith(".json"))


def _read_json(path: Path | Any, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelConfigError(
            f"malformed JSON in {what}: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except UnicodeDecodeError:
        raise ModelConfigError(f"{what} is not UTF-8 text") from None
    except OSError as e:
        raise ModelConfigError(f"cannot read {what}: {e.strerror or e}") from None


CONFIG_MAX_BYTES = MAX_CONFIG_BYTES  # autopar.limits: a config.json of ~30 KB is the largest seen


class _NonFinite:
    def __init__(self, token: str) -> None:
        self.token = token


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ModelConfigError(
                f"key {k!r} appears twice", "keep one: JSON readers silently keep the last"
            )
        out[k] = v
    return out


# Fields where a published config writes a non-finite bound: Mamba2's dt clamp of every Nemotron-H /
# Nemotron 3 config, ``"time_step_limit": [0.0, Infinity]`` (transformers' own default). Read as
# floats; they change no cost. NaN is refused everywhere.
_INFINITY_ALLOWED = frozenset({"time_step_limit"})


def _non_finite_path(obj: Any, path: str = "") -> str | None:
    if isinstance(obj, _NonFinite):
        return path or "(top level)"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        if k in _INFINITY_ALLOWED and isinstance(v, list):
            if all(not isinstance(x, _NonFinite) or x.token in ("Infinity", "-Infinity") for x in v):
                obj[k] = [float(x.token) if isinstance(x, _NonFinite) else x for x in v]
                continue
        hit = _non_finite_path(
            v, f"{path}.{k}" if path and isinstance(k, str) else f"{path}[{k}]" if path else str(k)
        )
        if hit:
            return hit
    return None


# The largest architecture sizes autopar accepts (far above any real model): a config is checked
# against them before anything is built from it (per-layer lists, arrays), so an absurd
# ``num_hidden_layers: 1e12`` is refused instead of exhausting memory.
MAX_MODEL_SIZES: dict[str, int] = {
    "layers": 10_000,
    "hidden": 1_000_000,
    "heads": 100_000,
    "kv_heads": 100_000,
    "head_dim": 100_000,
    "ffn_hidden": 10_000_000,
    "vocab": 10_000_000,
    "num_experts": 100_000,
    "moe_topk": 100_000,
    "moe_ffn_hidden": 10_000_000,
    "shared_expert_ffn": 10_000_000,
}
# HF keys (canonical spelling; their _ALIASES are added below) that set those sizes.
_HF_SIZES: dict[str, str] = {
    "num_hidden_layers": "layers",
    "hidden_size": "hidden",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "ffn_hidden",
    "vocab_size": "vocab",
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts": "num_experts",
    "num_experts_per_tok": "moe_topk",
    "moe_intermediate_size": "moe_ffn_hidden",
    "first_k_dense_replace": "layers",
    "num_nextn_predict_layers": "layers",
}
_HF_SIZES.update(
    {alias: _HF_SIZES[k] for k, aliases in _ALIASES.items() if k in _HF_SIZES for alias in aliases}
)


def check_sizes(cfg: Any, where: str, depth: int = 0) -> None:
    """Refuse a config (or raw dimensions) whose sizes exceed :data:`MAX_MODEL_SIZES`, nested too."""
    if depth > 4 or not isinstance(cfg, dict):
        return
    for k, v in cfg.items():
        if isinstance(v, dict):
            check_sizes(v, where, depth + 1)
            continue
        field = _HF_SIZES.get(k, k if k in MAX_MODEL_SIZES else None)
        if field is not None and isinstance(v, list):  # a per-layer list of sizes: each one checked
            for x in v:
                if not isinstance(x, list | dict):
                    check_sizes({k: x}, where, depth + 1)
            continue
        if field is not None and v is not None and not isinstance(v, bool | str):
            cap = MAX_MODEL_SIZES[field]
            if not isinstance(v, int | float) or v != v or not -cap <= v <= cap:
                raise ModelConfigError(
                    f"model config {where}: {k} = {v!r} is not a size autopar can model (at most {cap:,})",
                    f"fix {k} in the config",
                )


def read_config_file(path: Path) -> dict:
    """Read a config.json defensively: every problem is one ModelConfigError naming the file and the fix.

    A directory (read for its config.json), a missing file, a FIFO or device (not a regular file),
    one over :data:`CONFIG_MAX_BYTES`, binary
    or non-UTF-8 content, malformed JSON, NaN/Infinity (not JSON), a key given twice, and a top level
    that is not an object are all refused.
    """
    what = f"{str(path)!r}"
    if path.is_dir():
        inner = path / "config.json"
        if not inner.is_file():
            raise ModelConfigError(
                f"no config.json in directory {what}", "point at the config.json file or its folder"
            )
        path, what = inner, f"{str(inner)!r}"
    try:
        size = path.stat().st_size
        if size > CONFIG_MAX_BYTES:
            raise ModelConfigError(
                f"{what} is {size / 1e6:.1f} MB, too large for a config.json (limit {CONFIG_MAX_BYTES // 1024} KiB)",
                "pass the model's config.json, not a weights or tokenizer file",
            )
    except OSError as e:
        raise ModelConfigError(f"cannot read {what}: {e.strerror or e}") from None
    # autopar.files: a regular file (a FIFO or device would block), no NUL byte, UTF-8 text
    text = read_text(path, "model config", "pass the model's config.json", max_bytes=CONFIG_MAX_BYTES)
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_reject_duplicates,
            parse_constant=_NonFinite,
            parse_int=json_int("", ModelConfigError),  # autopar.limits: no 4,300-digit traceback
        )
    except json.JSONDecodeError as e:
        raise ModelConfigError(
            f"malformed JSON in {what}: {e.msg} at line {e.lineno} column {e.colno}", "fix the JSON syntax"
        ) from None
    except ModelConfigError as e:
        raise ModelConfigError(f"{what}: {e.message}", e.hint) from None
    except RecursionError:
        raise ModelConfigError(f"{what} is nested too deeply for a config.json") from None
    if not isinstance(doc, dict):
        raise ModelConfigError(
            f"{what} holds a JSON {type(doc).__name__}, not an object",
            "a config.json is one JSON object {...}",
        )
    bad = _non_finite_path(doc)
    if bad:
        raise ModelConfigError(
            f"{what}: field {bad!r} is NaN or Infinity, which JSON does not allow", "write a number"
        )
    return doc


def _load_preset(pid: str) -> ModelSpec:
    doc = _read_json(_preset_dir().joinpath(f"{pid}.json"), f"preset {pid!r}")
    if not isinstance(doc, dict) or not isinstance(doc.get("hf"), dict):
        raise ModelConfigError(f"preset {pid!r} has no 'hf' object")
    return _normalize_hf(doc["hf"], name=doc.get("id", pid), source=doc.get("source", ""))


def raw_config(name_or_path: str | os.PathLike) -> dict | None:
    """The HF config a preset id or config.json path holds (None for raw dimensions or an unknown name).

    What :mod:`autopar.hf_meta` builds with the model's own ``transformers`` class.
    """
    key = os.fspath(name_or_path)
    if key.strip().lower() in list_presets():
        doc = _read_json(_preset_dir().joinpath(f"{key.strip().lower()}.json"), f"preset {key!r}")
        hf = doc.get("hf") if isinstance(doc, dict) else None
        return dict(hf) if isinstance(hf, dict) else None
    path = Path(key).expanduser()
    if not path.exists():
        return None
    cfg = read_config_file(path)
    check_sizes(cfg, str(path))
    return cfg if any(k in cfg for k in ("model_type", "architectures", *_TEXT_KEYS)) else None


def load_model(name_or_path: str | os.PathLike | dict | ModelSpec, *, own_code: bool = True) -> ModelSpec:
    """Load a :class:`ModelSpec` from a preset id, an HF ``config.json`` (file or directory) or a dict.

    ``own_code``: where the field reader refuses a decoder and ``transformers`` has its class, read
    it from the class's module shapes on the meta device (:mod:`autopar.own_code`).
    """
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    if isinstance(name_or_path, dict):
        d = name_or_path
        check_sizes(d, "(dict)")
        if any(k in d for k in ("model_type", "architectures", *_TEXT_KEYS)):
            return _normalize_hf(d, source=str(d.get("_name_or_path") or ""), own_code=own_code)
        return _from_raw(d)
    if not isinstance(name_or_path, str | os.PathLike):
        raise ModelConfigError(
            f"cannot load a model from {type(name_or_path).__name__}",
            "pass a preset id, a path to config.json or a dict",
        )
    key = os.fspath(name_or_path)
    presets = list_presets()
    if isinstance(name_or_path, str) and key.strip().lower() in presets:
        return _load_preset(key.strip().lower())
    path = Path(key).expanduser()
    if not path.exists():
        raise ModelConfigError(
            f"unknown model {key!r}: not a preset and not a file", f"presets: {', '.join(presets)}"
        )
    cfg = read_config_file(path)
    if path.is_dir():
        path = path / "config.json"
    check_sizes(cfg, str(path))
    try:
        if not any(k in cfg for k in ("model_type", "architectures", *_TEXT_KEYS)):
            return _from_raw(cfg)
        # the publisher's id; else the file's own name, or its folder's for a plain config.json
        stem = path.parent.name if path.name == "config.json" else path.stem
        name = str(cfg.get("_name_or_path") or stem or path.stem)
        return _normalize_hf(cfg, name=name, source=str(path), own_code=own_code)
    except ModelConfigError as e:
        raise type(e)(f"{str(path)!r}: {e.message}", e.hint) from None
