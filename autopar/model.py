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

from autopar.errors import ModelConfigError, UnsupportedArchitecture

__all__ = ["ModelSpec", "load_model", "list_presets", "SUPPORTED_MODEL_TYPES"]


class ModelSpec(BaseModel):
    """Normalized architecture of a decoder-only transformer (dense, MoE, GQA or MLA)."""

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
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"  # layernorm has weight+bias (2h), rmsnorm h
    num_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden: int = 0  # per routed expert
    shared_expert_ffn: int = 0  # total intermediate size of always-active shared experts per MoE layer
    moe_layers: int = 0  # number of MoE layers; dense layers = layers - moe_layers
    first_dense_layers: int = 0  # leading dense layers (DeepSeek first_k_dense_replace)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0  # MLA when > 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    sliding_window_layers: int = 0
    mtp_layers: int = 0
    max_position: int = 0

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        def bad(msg: str, hint: str | None = None) -> ModelConfigError:
            return ModelConfigError(f"model {self.name!r}: {msg}", hint)

        for f in ("hidden", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            if getattr(self, f) <= 0:
                raise bad(f"{f} must be positive, got {getattr(self, f)}")
        for f in ModelSpec.model_fields:
            v = getattr(self, f)
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                raise bad(f"{f} must be >= 0, got {v}")
        if self.heads % self.kv_heads:
            raise bad(f"heads ({self.heads}) is not a multiple of kv_heads ({self.kv_heads})")
        if self.moe_layers > self.layers:
            raise bad(f"moe_layers ({self.moe_layers}) exceeds layers ({self.layers})")
        if self.num_experts:
            if not 1 <= self.moe_topk <= self.num_experts:
                raise bad(f"moe_topk must be in 1..num_experts ({self.num_experts}), got {self.moe_topk}")
            if self.moe_ffn_hidden <= 0:
                raise bad("moe_ffn_hidden must be positive for a MoE model")
            if self.moe_layers == 0:
                raise bad(
                    "num_experts > 0 but moe_layers is 0", "set moe_layers (= layers if every layer is MoE)"
                )
        elif self.moe_layers or self.moe_topk or self.moe_ffn_hidden or self.shared_expert_ffn:
            raise bad("MoE fields are set but num_experts is 0")
        if self.dense_layers and self.ffn_hidden <= 0:
            raise bad(f"{self.dense_layers} dense layers but ffn_hidden is {self.ffn_hidden}")
        if self.first_dense_layers > self.dense_layers:
            raise bad(
                f"first_dense_layers ({self.first_dense_layers}) exceeds dense layers ({self.dense_layers})"
            )
        if self.sliding_window_layers > self.layers:
            raise bad(f"sliding_window_layers ({self.sliding_window_layers}) exceeds layers ({self.layers})")
        if self.sliding_window_layers and self.sliding_window <= 0:
            raise bad("sliding_window_layers > 0 but sliding_window is 0")
        if self.kv_lora_rank and not (self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim):
            raise bad("MLA (kv_lora_rank > 0) needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
        if self.kv_lora_rank and self.qkv_bias:
            raise bad("qkv_bias is not modeled for MLA attention")
        return self

    # ----------------------------------------------------------------------------------- shape
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def v_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

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
            return q + kv + a * self.v_head_dim * h
        d = self.head_dim
        return h * a * d + 2 * h * self.kv_heads * d + a * d * h  # Q, K, V, O

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V, O projections, MLA down/up projections with their norms, and QKV biases.

        Excludes the pre-attention norm (it is in :attr:`norm_params_per_layer`).
        """
        p = self.attn_matmul_params_per_layer
        if self.is_mla:
            p += self._norm(self.q_lora_rank) + self._norm(self.kv_lora_rank)  # q_a / kv_a layernorms
        if self.qkv_bias and not self.is_mla:
            p += (self.heads + 2 * self.kv_heads) * self.head_dim
        return p

    def _mlp(self, ffn: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * ffn  # gate+up+down, or fc1+fc2

    @property
    def dense_mlp_params(self) -> int:
        return self._mlp(self.ffn_hidden)

    @property
    def expert_params(self) -> int:
        return self._mlp(self.moe_ffn_hidden) if self.is_moe else 0

    @property
    def shared_expert_params(self) -> int:
        return self._mlp(self.shared_expert_ffn) if self.is_moe else 0

    @property
    def router_params(self) -> int:
        return self.hidden * self.num_experts

    @property
    def norm_params_per_layer(self) -> int:
        """Pre-attention and pre-MLP norms (MoE layers add none)."""
        return 2 * self._norm(self.hidden)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    @property
    def final_norm_params(self) -> int:
        return self._norm(self.hidden)

    @property
    def dense_layer_params(self) -> int:
        return self.attn_params_per_layer + self.dense_mlp_params + self.norm_params_per_layer

    @property
    def moe_layer_params(self) -> int:
        if not self.is_moe:
            return 0
        return (
            self.attn_params_per_layer
            + self.num_experts * self.expert_params
            + self.shared_expert_params
            + self.router_params
            + self.norm_params_per_layer
        )

    @property
    def moe_layer_active_params(self) -> int:
        if not self.is_moe:
            return 0
        return self.moe_layer_params - (self.num_experts - self.moe_topk) * self.expert_params

    @property
    def total_params(self) -> int:
        """All parameters excluding MTP modules (embedding + layers + final norm + untied head)."""
        return (
            self.dense_layers * self.dense_layer_params
            + self.moe_layers * self.moe_layer_params
            + self.embedding_params
            + self.head_params
            + self.final_norm_params
        )

    @property
    def active_params(self) -> int:
        """Parameters touched per token: top-k routed experts, shared experts and every dense part."""
        return (
            self.dense_layers * self.dense_layer_params
            + self.moe_layers * self.moe_layer_active_params
            + self.embedding_params
            + self.head_params
            + self.final_norm_params
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
        dense = self.attn_matmul_params_per_layer + self.dense_mlp_params
        moe = (
            (
                self.attn_matmul_params_per_layer
                + self.moe_topk * self.expert_params
                + self.shared_expert_params
                + self.router_params
            )
            if self.is_moe
            else 0
        )
        # The logits GEMM runs whether or not the head is tied; the embedding lookup is not a GEMM.
        return self.dense_layers * dense + self.moe_layers * moe + self.vocab * self.hidden

    def _context(self, seq_len: int, window: int, causal: bool) -> float:
        """Mean number of keys one query attends to."""
        if window <= 0 or window >= seq_len:
            return seq_len / 2 if causal else float(seq_len)
        if not causal:
            return float(window)
        # causal sliding window: mean over positions of min(i, w) ~= w - w^2 / (2 s); equals s/2 at w = s.
        return window - window * window / (2 * seq_len)

    def flops_per_token(self, seq_len: int, *, attention: bool = True, causal: bool = False) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), model FLOPs without recompute.

        ``6 * N_active_matmul`` (Kaplan et al. 2020, arXiv 2001.08361, Sec. 2.1) counts every weight
        GEMM of the active parameters, including the output-logits GEMM and excluding the embedding
        lookup, norms and biases. The attention term follows PaLM (arXiv 2204.02311, App. B,
        ``6N + 12 L H Q T``) and Megatron-LM ``num_floating_point_operations``: per layer and token the
        forward pass costs ``2 * ctx * heads * qk_head_dim`` (QK^T) plus ``2 * ctx * heads * v_dim``
        (PV), times 3 for training. ``ctx`` is ``seq_len`` (the convention of PaLM and Megatron),
        ``seq_len / 2`` with ``causal=True``, and at most the window on sliding-window layers.
        """
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        flops = 6.0 * self._active_matmul_params()
        if attention:
            per_ctx = 6.0 * self.heads * (self.qk_head_dim + self.v_dim)
            full = self.layers - self.sliding_window_layers
            flops += per_ctx * full * self._context(seq_len, 0, causal)
            flops += (
                per_ctx * self.sliding_window_layers * self._context(seq_len, self.sliding_window, causal)
            )
        return flops

    # -------------------------------------------------------------------------------- KV cache
    @property
    def kv_cache_elems_per_token_per_layer(self) -> int:
        # MLA caches the compressed latent plus the shared rope key (DeepSeek-V2 Sec. 2.1.3).
        return self.kv_lora_rank + self.qk_rope_head_dim if self.is_mla else 2 * self.kv_heads * self.head_dim

    def kv_cache_bytes_per_token(self, bytes_per_elem: float = 2) -> float:
        """KV-cache bytes per cached token summed over all layers (MTP layers excluded).

        Sliding-window layers are counted per token like the others: the window caps only the total
        a sequence holds, see :meth:`kv_cache_bytes`.
        """
        return float(self.layers * self.kv_cache_elems_per_token_per_layer * bytes_per_elem)

    def kv_cache_bytes(self, seq_len: int, bytes_per_elem: float = 2) -> float:
        """KV-cache bytes of one sequence of ``seq_len`` tokens; sliding layers hold at most the window."""
        full = self.layers - self.sliding_window_layers
        tokens = full * seq_len + self.sliding_window_layers * min(seq_len, self.sliding_window or seq_len)
        return float(tokens * self.kv_cache_elems_per_token_per_layer * bytes_per_elem)

    def to_dict(self) -> dict[str, Any]:
        d = self.model_dump()
        d["total_params"] = self.total_params
        d["active_params"] = self.active_params
        return d


# =========================================================================== HF normalization
# model_type -> family. Every family below is handled explicitly by _normalize_hf.
_FAMILY = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "nemotron": "llama",
    "mixtral": "mixtral",
    "grok-1": "mixtral",
    "grok1": "mixtral",
    "qwen2_moe": "qwen_moe",
    "qwen3_moe": "qwen_moe",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "kimi_k2": "deepseek",
    "gpt_oss": "gpt_oss",
    "llama4_text": "llama4",
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
}
SUPPORTED_MODEL_TYPES = tuple(sorted(_FAMILY))
# multimodal wrappers whose text_config is one of the above
_TEXT_ALIASES = {
    "llama4": "llama4_text",
    "qwen2_5_vl_text": "qwen2",
    "qwen2_vl_text": "qwen2",
    "qwen3_vl_text": "qwen3",
    "qwen3_vl_moe_text": "qwen3_moe",
}
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "Llama4ForCausalLM": "llama4_text",
    "Grok1ModelForCausalLM": "grok-1",
    "Grok1ForCausalLM": "grok-1",
    "NemotronForCausalLM": "nemotron",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
}
# transformers' class default for tie_word_embeddings when the config omits it
_TIE_DEFAULT = {"gpt2": True, "grok-1": True, "grok1": True}
# 3-matrix gated MLP unless listed (GPT-2/NeoX: GELU fc1/fc2; Nemotron: squared-ReLU fc1/fc2)
_UNGATED = {"gpt2", "gpt_neox", "nemotron"}
_LAYERNORM = {"gpt2", "gpt_neox", "nemotron"}  # Nemotron's LayerNorm1P has weight and bias


def _int(cfg: dict, key: str, default: Any = ..., *, ctx: str = "") -> int:
    """Read an integer field; a missing (or null) required field raises ModelConfigError naming it."""
    v = cfg.get(key)
    if v is None:
        if default is ...:
            raise ModelConfigError(
                f"{ctx}missing required field {key!r}",
                "add it to the config (see REFERENCE.md Part C(d) for the aliases read)",
            )
        return default
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ModelConfigError(f"{ctx}field {key!r} must be an integer, got {v!r}")
    try:
        f = float(v)
    except ValueError:
        raise ModelConfigError(f"{ctx}field {key!r} must be an integer, got {v!r}") from None
    if not f.is_integer():
        raise ModelConfigError(f"{ctx}field {key!r} must be an integer, got {v!r}")
    return int(f)


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
    mt = _TEXT_ALIASES.get(mt, mt) if isinstance(mt, str) else mt
    if mt in _FAMILY:
        return mt
    for arch in cfg.get("architectures") or []:
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
    what = f"model_type {mt!r}" if mt else f"architectures {cfg.get('architectures')!r}"
    raise UnsupportedArchitecture(
        f"unsupported architecture: {what}",
        f"autopar models only these model_type values: {', '.join(SUPPORTED_MODEL_TYPES)}; "
        "pass raw dimensions (ModelSpec field names) to describe another model",
    )


def _unwrap_text_config(cfg: dict) -> dict:
    """Multimodal wrappers nest the decoder under ``text_config``; its keys win over the wrapper's."""
    text = cfg.get("text_config")
    if text is None:
        return cfg
    if not isinstance(text, dict):
        raise ModelConfigError(f"text_config must be an object, got {type(text).__name__}")
    skip = {"text_config", "vision_config", "audio_config", "model_type", "architectures"}
    merged = {k: v for k, v in cfg.items() if k not in skip}
    merged.update(text)
    if "model_type" not in text and "model_type" in cfg:
        merged["model_type"] = cfg["model_type"]
    if "architectures" in cfg and "architectures" not in text:
        merged["architectures"] = cfg["architectures"]
    return merged


def _layer_kinds(cfg: dict, mt: str, L: int, ctx: str) -> list[bool]:
    """Per-layer flag: True where the layer's MLP is a routed MoE (transformers' modeling code)."""
    fam = _FAMILY[mt]
    if fam in ("mixtral", "gpt_oss"):
        return [True] * L
    if fam == "qwen_moe":  # Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer
        if _int(cfg, "num_experts", ctx=ctx) == 0:
            return [False] * L
        step = _int(cfg, "decoder_sparse_step", 1, ctx=ctx)
        only = set(cfg.get("mlp_only_layers") or [])
        return [i not in only and step > 0 and (i + 1) % step == 0 for i in range(L)]
    if fam == "deepseek":  # DeepseekV3DecoderLayer: MoE only when n_routed_experts is set
        if cfg.get("n_routed_experts") is None:
            return [False] * L
        k = _int(cfg, "first_k_dense_replace", 0, ctx=ctx)
        freq = _int(cfg, "moe_layer_freq", 1, ctx=ctx)
        return [i >= k and i % freq == 0 for i in range(L)]
    if fam == "llama4":  # Llama4TextConfig: moe_layers, else every interleave_moe_layer_step-th layer
        if cfg.get("moe_layers") is not None:
            ids = set(cfg["moe_layers"])
        else:
            step = _int(cfg, "interleave_moe_layer_step", 1, ctx=ctx)
            ids = set(range(step - 1, L, step))
        return [i in ids for i in range(L)]
    return [False] * L


def _sliding_layers(cfg: dict, mt: str, L: int, ctx: str) -> tuple[int, int]:
    """(window, number of sliding-window layers)."""
    window = _int(cfg, "sliding_window", 0, ctx=ctx)
    types = cfg.get("layer_types")
    if mt == "gpt_oss" and types is None and window > 0:  # GptOssConfig default: sliding on even layers
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
    if _FAMILY[mt] == "llama4" and types is None and cfg.get("attention_chunk_size"):
        # Llama4TextConfig: chunked (local) attention on the RoPE layers, global on the NoPE layers.
        # Modeled as a sliding window of attention_chunk_size: exact for the KV-cache cap, an upper
        # bound on attention FLOPs.
        window = _int(cfg, "attention_chunk_size", ctx=ctx)
        rope = cfg.get("no_rope_layers") or [
            int((i + 1) % _int(cfg, "no_rope_layer_interval", 4, ctx=ctx) != 0) for i in range(L)
        ]
        return window, sum(1 for r in rope[:L] if r)
    if types is not None:
        if len(types) != L:
            raise ModelConfigError(f"{ctx}layer_types has {len(types)} entries for {L} layers")
        known = {"full_attention", "sliding_attention", "chunked_attention"}
        for t in types:
            if t not in known:
                raise UnsupportedArchitecture(
                    f"{ctx}unsupported layer type {t!r} in layer_types",
                    f"supported: {', '.join(sorted(known))}",
                )
        n = sum(t != "full_attention" for t in types)
        if any(t == "chunked_attention" for t in types):
            window = _int(cfg, "attention_chunk_size", ctx=ctx)
        if n and window <= 0:
            raise ModelConfigError(
                f"{ctx}missing required field 'sliding_window' for sliding layers in layer_types"
            )
        return (window, n) if n else (0, 0)
    if window <= 0:
        return 0, 0
    if mt in ("mistral", "mixtral"):  # MistralAttention: the window applies to every layer when set
        return window, L
    if mt in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        # Qwen2Config: sliding only with use_sliding_window, on layers >= max_window_layers.
        if not cfg.get("use_sliding_window", False):
            return 0, 0
        n = max(0, L - _int(cfg, "max_window_layers", L, ctx=ctx))
        return (window, n) if n else (0, 0)
    raise ModelConfigError(
        f"{ctx}sliding_window={window} without layer_types is not understood for {mt!r}",
        "give layer_types explicitly",
    )


def _normalize_hf(cfg: dict, *, name: str = "", source: str = "") -> ModelSpec:
    cfg = _unwrap_text_config(cfg)
    mt = _resolve_model_type(cfg)
    fam = _FAMILY[mt]
    ctx = f"{name or mt}: "
    f: dict[str, Any]
    if fam == "gpt2":  # GPT2Config names
        h = _int(cfg, "n_embd", ctx=ctx)
        L = _int(cfg, "n_layer", ctx=ctx)
        a = _int(cfg, "n_head", ctx=ctx)
        ffn = _int(cfg, "n_inner", 4 * h, ctx=ctx)  # GPT2MLP: n_inner or 4 * n_embd
        f = {
            "hidden": h,
            "layers": L,
            "heads": a,
            "kv_heads": a,
            "head_dim": h // a,
            "ffn_hidden": ffn,
            "vocab": _int(cfg, "vocab_size", ctx=ctx),
            "qkv_bias": True,
            "max_position": _int(cfg, "n_positions", 0, ctx=ctx),
        }
    else:
        h = _int(cfg, "hidden_size", ctx=ctx)
        L = _int(cfg, "num_hidden_layers", ctx=ctx)
        a = _int(cfg, "num_attention_heads", ctx=ctx)
        if h % a and cfg.get("head_dim") is None and not cfg.get("kv_lora_rank"):
            raise ModelConfigError(
                f"{ctx}hidden_size {h} is not a multiple of num_attention_heads {a} and head_dim is not given"
            )
        qkv_bias = bool(cfg.get("attention_bias", fam in ("gpt_neox",)))
        if mt in ("qwen2", "qwen2_moe"):  # Qwen2Attention: q/k/v always carry a bias
            qkv_bias = bool(cfg.get("qkv_bias", True))
        f = {
            "hidden": h,
            "layers": L,
            "heads": a,
            "kv_heads": _int(cfg, "num_key_value_heads", a, ctx=ctx),  # absent => MHA
            "head_dim": _int(cfg, "head_dim", h // a, ctx=ctx),  # Qwen3 / gpt-oss set it explicitly
            "vocab": _int(cfg, "vocab_size", ctx=ctx),
            "qkv_bias": qkv_bias,
            "max_position": _int(cfg, "max_position_embeddings", 0, ctx=ctx),
        }
        moe = _layer_kinds(cfg, mt, L, ctx)
        n_moe = sum(moe)
        dense_needed = n_moe < L
        if fam in ("mixtral", "gpt_oss"):
            # Mixtral / Grok-1 / gpt-oss: intermediate_size IS the per-expert size; no dense layers.
            f["ffn_hidden"] = 0
            f["moe_ffn_hidden"] = _int(cfg, "intermediate_size", ctx=ctx)
            f["num_experts"] = _first_int(cfg, ("num_local_experts", "num_experts"), ctx=ctx)
        elif fam == "llama4":
            f["ffn_hidden"] = _int(cfg, "intermediate_size_mlp", ctx=ctx) if dense_needed else 0
            f["moe_ffn_hidden"] = _int(cfg, "intermediate_size", ctx=ctx)
            f["shared_expert_ffn"] = f["moe_ffn_hidden"]  # Llama4TextMoe.shared_expert (not a config field)
            f["num_experts"] = _int(cfg, "num_local_experts", ctx=ctx)
        elif fam in ("qwen_moe", "deepseek") and n_moe:
            f["ffn_hidden"] = _int(cfg, "intermediate_size", ctx=ctx) if dense_needed else 0
            f["moe_ffn_hidden"] = _int(cfg, "moe_intermediate_size", ctx=ctx)
            if fam == "deepseek":
                f["num_experts"] = _int(cfg, "n_routed_experts", ctx=ctx)
                f["shared_expert_ffn"] = _int(cfg, "n_shared_experts", 0, ctx=ctx) * f["moe_ffn_hidden"]
            else:
                f["num_experts"] = _int(cfg, "num_experts", ctx=ctx)
                f["shared_expert_ffn"] = _int(cfg, "shared_expert_intermediate_size", 0, ctx=ctx)
        else:
            f["ffn_hidden"] = _int(cfg, "intermediate_size", ctx=ctx)
        if f.get("num_experts"):
            f["moe_topk"] = _first_int(cfg, ("num_experts_per_tok", "experts_per_token"), ctx=ctx)
            f["moe_layers"] = n_moe
            f["first_dense_layers"] = next((i for i, m in enumerate(moe) if m), L)
        else:
            for k in ("num_experts", "moe_ffn_hidden", "shared_expert_ffn"):
                f.pop(k, None)
        if fam == "deepseek" and cfg.get("kv_lora_rank"):
            f["q_lora_rank"] = _int(cfg, "q_lora_rank", 0, ctx=ctx)  # null in DeepSeek-V2-Lite
            for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                f[k] = _int(cfg, k, ctx=ctx)
            f["head_dim"] = f["qk_nope_head_dim"] + f["qk_rope_head_dim"]
            f["mtp_layers"] = _int(cfg, "num_nextn_predict_layers", 0, ctx=ctx)
        f["sliding_window"], f["sliding_window_layers"] = _sliding_layers(cfg, mt, L, ctx)
    f["gated_mlp"] = mt not in _UNGATED
    if mt == "nemotron" and cfg.get("hidden_act", "relu2") != "relu2":
        raise UnsupportedArchitecture(
            f"{ctx}nemotron with hidden_act {cfg.get('hidden_act')!r}",
            "only squared-ReLU (relu2) Nemotron MLPs are modeled",
        )
    f["norm"] = "layernorm" if mt in _LAYERNORM else "rmsnorm"
    f["tie_embeddings"] = bool(cfg.get("tie_word_embeddings", _TIE_DEFAULT.get(mt, False)))
    # rope_theta / rope_scaling (transformers < 5) and rope_parameters (>= 5) change neither the
    # parameter count nor the FLOPs; both forms are accepted and ignored.
    f["name"] = name or str(cfg.get("_name_or_path") or mt)
    f["source"] = source
    return _build(f, ctx)


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


# ================================================================================ raw dims
_DERIVED = ("total_params", "active_params")


def _from_raw(d: dict) -> ModelSpec:
    """Raw dimensions keyed by ModelSpec field names (blank/None cells mean "not given")."""
    fields = set(ModelSpec.model_fields)
    ctx = f"{d.get('name') or 'raw model'}: "
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
            f[k] = _int(f, k, ctx=ctx)
    f.setdefault("name", "custom")
    if "heads" in f:
        f.setdefault("kv_heads", f["heads"])  # HF and published_runs_dev.csv convention: absent => MHA
        if "hidden" in f:
            if f["hidden"] % f["heads"] and "head_dim" not in f:
                raise ModelConfigError(f"{ctx}hidden is not a multiple of heads and head_dim is not given")
            f.setdefault("head_dim", f["hidden"] // f["heads"])
    spec = _build(f, ctx)
    for k in _DERIVED:  # to_dict() output round-trips; a stale count is an error, not ignored
        if d.get(k) not in (None, "") and _int(d, k, ctx=ctx) != getattr(spec, k):
            raise ModelConfigError(f"{ctx}{k}={d[k]} does not match the dimensions ({getattr(spec, k)})")
    return spec


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
    except OSError as e:
        raise ModelConfigError(f"cannot read {what}: {e.strerror or e}") from None


def _load_preset(pid: str) -> ModelSpec:
    doc = _read_json(_preset_dir().joinpath(f"{pid}.json"), f"preset {pid!r}")
    if not isinstance(doc, dict) or not isinstance(doc.get("hf"), dict):
        raise ModelConfigError(f"preset {pid!r} has no 'hf' object")
    return _normalize_hf(doc["hf"], name=doc.get("id", pid), source=doc.get("source", ""))


def load_model(name_or_path: str | os.PathLike | dict | ModelSpec) -> ModelSpec:
    """Load a :class:`ModelSpec` from a preset id, an HF ``config.json`` (file or directory) or a dict."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    if isinstance(name_or_path, dict):
        d = name_or_path
        if any(k in d for k in ("model_type", "architectures", "text_config")):
            return _normalize_hf(d, source=str(d.get("_name_or_path") or ""))
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
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelConfigError(f"no config.json in directory {key!r}")
    if not path.is_file():
        raise ModelConfigError(
            f"unknown model {key!r}: not a preset and not a file", f"presets: {', '.join(presets)}"
        )
    cfg = _read_json(path, f"file {str(path)!r}")
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"file {str(path)!r} does not hold a JSON object")
    if not any(k in cfg for k in ("model_type", "architectures", "text_config")):
        return _from_raw(cfg)
    name = str(cfg.get("_name_or_path") or path.parent.name or path.stem)
    return _normalize_hf(cfg, name=name, source=str(path))
