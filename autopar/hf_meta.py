"""Exact parameter counts of a Hugging Face config, read by the model's own ``transformers`` class.

With the optional extra ``autopar[models]`` (``transformers``; ``diffusers`` for DiTs) installed, a
``config.json`` whose ``model_type`` has a class in ``transformers`` is instantiated on the ``meta``
device (shapes only: no weights, no download, no memory) and every parameter is counted by the
module that owns it. Remote code is never run unless the caller passes ``trust_remote_code=True``.
Where the library has a class, this count is the truth the field-driven reader
(:mod:`autopar.model`) is checked against; where it has none, or ``transformers`` is absent, the
field-driven reader stays the only one (:func:`meta_count` returns ``None`` with the reason).

Nothing here is imported by ``import autopar``: torch and transformers load on the first call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MetaCount", "meta_count", "build_on_meta", "count_model", "dit_meta_count", "KINDS"]

# Module kinds, in the order a parameter name is tested against them (first match wins).
KINDS = (
    "towers",
    "mtp",
    "head",
    "embeddings",
    "shared_experts",
    "experts",
    "router",
    "ssm",
    "attention",
    "mlp",
    "norms",
    "other",
)
_PATTERNS: dict[str, re.Pattern[str]] = {
    "towers": re.compile(
        r"(^|\.)(vision\w*|visual|audio\w*|speech\w*|image_newline|multi_modal_projector|mm_projector|"
        r"vision_tower|patch_embed\w*|mlp1|connector|embed_vision|embed_audio|t2u_model|vocoder)(\.|$)"
    ),
    "mtp": re.compile(r"(^|\.)(mtp\w*|nextn\w*)(\.|$)"),
    "head": re.compile(r"(^|\.)(lm_head|embed_out|output_layer)(\.|$)|^output\.weight$"),
    "embeddings": re.compile(
        r"(^|\.)(embed_tokens|embeddings|wte|wpe|word_embeddings|position_embeddings|token_type_embeddings|"
        r"embed_in|tok_embeddings|embed_positions|shared)(\.|$)"
    ),
    "shared_experts": re.compile(r"(^|\.)(shared_experts?(_gate)?|shared_mlp)(\.|$)"),
    "experts": re.compile(r"(^|\.)experts(\.|$)"),
    "router": re.compile(r"(^|\.)(router|gate|e_score_correction_bias)(\.|$)(weight|bias|e_score\w*)?"),
    "ssm": re.compile(
        r"(^|\.)(mamba|mixer|linear_attn|ssm|conv|short_conv|mamba_mixer|feed_forward_conv)(\.|$)"
    ),
    "attention": re.compile(r"(^|\.)(self_attn|attention|attn|self_attention|indexer)(\.|$)"),
    "mlp": re.compile(r"(^|\.)(mlp|feed_forward|ffn|block_sparse_moe|moe|dense|intermediate|output)(\.|$)"),
    "norms": re.compile(r"(norm|ln_\w+|ln\d*|layernorm)"),
}
# config attributes naming the routed experts per token and per MoE layer
_TOPK = ("num_experts_per_tok", "moe_topk", "top_k", "experts_per_token", "num_experts_per_token", "moe_k")
_NEXPERTS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")


@dataclass(frozen=True)
class MetaCount:
    """Parameters of one config as its ``transformers`` class builds them (``by_kind`` sums to ``total``)."""

    model_class: str
    library: str  # "transformers 5.x"
    total: int
    by_kind: dict[str, int]
    active: int | None  # total minus the routed experts not chosen per token; None when unknown
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def text_total(self) -> int:
        """Parameters of the language model: everything but vision/audio towers and MTP modules."""
        return self.total - self.by_kind.get("towers", 0) - self.by_kind.get("mtp", 0)

    @property
    def text_active(self) -> int | None:
        if self.active is None:
            return None
        return self.active - self.by_kind.get("towers", 0) - self.by_kind.get("mtp", 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_class": self.model_class,
            "library": self.library,
            "total_params": self.total,
            "text_total_params": self.text_total,
            "active_params": self.active,
            "text_active_params": self.text_active,
            "by_kind": dict(self.by_kind),
            "notes": list(self.notes),
        }


def kind_of(name: str) -> str:
    """The module kind of a parameter name (``model.layers.0.mlp.experts.gate_up_proj`` -> experts)."""
    for k, pat in _PATTERNS.items():
        if pat.search(name):
            return k
    return "other"


def _cfg_int(cfg: Any, names: tuple[str, ...]) -> int | None:
    for n in names:
        v = getattr(cfg, n, None)
        if isinstance(v, list) and v and len(set(v)) == 1:  # a per-layer list of one value
            v = v[0]
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _text_cfg(cfg: Any) -> Any:
    for getter in ("get_text_config",):
        if hasattr(cfg, getter):
            try:
                return getattr(cfg, getter)()
            except Exception:  # noqa: BLE001 - a wrapper whose text part cannot be resolved
                return cfg
    return cfg


def meta_count(raw: dict, *, trust_remote_code: bool = False) -> tuple[MetaCount | None, str]:
    """Build ``raw`` (a config.json as a dict) on the meta device and count its parameters.

    Returns ``(count, how)``: ``how`` names the class that read it, or why none could (library
    absent, no class for the model_type, remote code required, the class refused the config).
    """
    built, how = build_on_meta(raw, trust_remote_code=trust_remote_code)
    if built is None:
        return None, how
    model, cfg, cls, lib = built
    count = count_model(model, cfg, cls, lib)
    del model
    return count, how


def build_on_meta(
    raw: dict, *, trust_remote_code: bool = False
) -> tuple[tuple[Any, Any, str, str] | None, str]:
    """``((model, config, class name, library), how)``: ``raw`` built by its own class on the meta
    device; or ``(None, why)`` when the library is absent, has no class or refuses the config."""
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return None, "transformers is not installed (pip install 'autopar[models]')"
    import contextlib
    import io
    import logging
    import warnings

    mt = raw.get("model_type")
    if not isinstance(mt, str) or not mt:
        return None, "the config has no model_type"
    if mt not in CONFIG_MAPPING:
        if raw.get("auto_map") and not trust_remote_code:
            return None, f"model_type {mt!r} needs the publisher's remote code (not run unless trusted)"
        return None, f"transformers {transformers.__version__} has no class for model_type {mt!r}"
    lib = f"transformers {transformers.__version__}"
    d = {k: v for k, v in raw.items() if k not in ("auto_map", "quantization_config")}
    prev = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            try:
                cfg = CONFIG_MAPPING[mt].from_dict(d)
            except Exception as e:  # noqa: BLE001 - the library's own refusal, reported as such
                return None, f"{lib} refused the config: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            too_big = _too_big(cfg)
            if too_big:
                return None, f"{lib}: {too_big}"
            model, cls = _build(cfg, trust_remote_code)
            if model is None:
                return None, f"{lib}: {cls}"
    finally:
        logging.disable(logging.NOTSET)
        transformers.logging.set_verbosity(prev)
    return (model, cfg, cls, lib), f"{lib} {cls} on the meta device"


def count_model(model: Any, cfg: Any, cls: str, lib: str) -> MetaCount:
    """Parameters of a model built by :func:`build_on_meta`, by module kind (tied weights once)."""
    by_kind = dict.fromkeys(KINDS, 0)
    for name, p in model.named_parameters():  # tied weights once
        by_kind[kind_of(name)] += int(p.numel())
    by_kind = {k: v for k, v in by_kind.items() if v}
    total = sum(by_kind.values())
    notes: list[str] = []
    active: int | None = total
    ex = by_kind.get("experts", 0)
    if ex:
        tc = _text_cfg(cfg)
        k, n = _cfg_int(tc, _TOPK), _cfg_int(tc, _NEXPERTS)
        if k and n and k <= n:
            active = total - ex + ex * k // n
        else:
            active = None
            notes.append("routed experts present but top-k / expert count not found in the config")
    return MetaCount(cls, lib, total, by_kind, active, tuple(notes))


# Larger than any published decoder (the deepest has ~130 layers; 384 experts per layer): a config
# past these is not built on the meta device, which takes time in proportion to its modules.
MAX_META_LAYERS = 1024
MAX_META_EXPERT_MODULES = 200_000  # layers x routed experts


def _too_big(cfg: Any) -> str:
    """Why ``cfg`` is not built on the meta device (too many modules), or ""."""
    tc = _text_cfg(cfg)
    layers = _cfg_int(tc, ("num_hidden_layers", "n_layers", "n_layer", "num_layers")) or 0
    experts = _cfg_int(tc, _NEXPERTS) or 1
    if layers > MAX_META_LAYERS or layers * experts > MAX_META_EXPERT_MODULES:
        return (
            f"{layers:,} layers x {experts:,} experts is more than is built on the meta device "
            f"(at most {MAX_META_LAYERS:,} layers and {MAX_META_EXPERT_MODULES:,} layer-experts)"
        )
    return ""


def _build(cfg: Any, trust_remote_code: bool) -> tuple[Any, str]:
    """(model on the meta device, its class name), or (None, why): for an encoder or an
    encoder-decoder the class its ``architectures`` names (:func:`_named_class`); otherwise a
    causal LM, else an image-text-to-text model, else the base model."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    named = _named_class(cfg)
    if named is not None:
        try:
            with torch.device("meta"):
                m = named(cfg)
        except Exception as e:  # noqa: BLE001 - the class refused the config's shapes
            return (
                None,
                f"{type(cfg).__name__} could not be built: {type(e).__name__}: {str(e).splitlines()[0][:160]}",
            )
        return m, type(m).__name__
    autos: list[Any] = [AutoModelForCausalLM]
    try:
        from transformers import AutoModelForImageTextToText

        autos.append(AutoModelForImageTextToText)
    except ImportError:
        pass
    autos.append(AutoModel)
    last = ""
    for auto in autos:
        try:
            with torch.device("meta"):
                m = auto.from_config(cfg, trust_remote_code=trust_remote_code)
        except ValueError as e:  # no class of this kind for the config
            last = str(e).splitlines()[0][:160]
            continue
        except Exception as e:  # noqa: BLE001 - the class refused the config's shapes
            return (
                None,
                f"{type(cfg).__name__} could not be built: {type(e).__name__}: {str(e).splitlines()[0][:160]}",
            )
        return m, type(m).__name__
    return None, f"no model class for {type(cfg).__name__} ({last})"


def _named_class(cfg: Any) -> Any:
    """For an encoder (a model type with a masked-LM class) or an encoder-decoder config, the
    transformers class its ``architectures`` names: what the model is (BertModel, WhisperFor-
    ConditionalGeneration), not the causal-LM wrapper AutoModelForCausalLM would pick (BertLMHeadModel,
    WhisperForCausalLM: Whisper's decoder alone). None otherwise, or when the class is not there."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    encoder = getattr(cfg, "model_type", None) in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if not (encoder or getattr(cfg, "is_encoder_decoder", False)):
        return None
    archs = getattr(cfg, "architectures", None) or []
    cls = getattr(transformers, archs[0], None) if archs and isinstance(archs[0], str) else None
    return cls if isinstance(cls, type) and hasattr(cls, "config_class") else None


def dit_meta_count(raw: dict) -> tuple[int | None, str]:
    """Parameters of a diffusers transformer ``config.json`` built by its own class on the meta device.

    ``(count, how)``, or ``(None, why)`` when diffusers is absent or has no such class.
    """
    try:
        import diffusers
        import torch
    except ImportError:
        return None, "diffusers is not installed (pip install 'autopar[models]')"
    import contextlib
    import io
    import logging
    import warnings

    cls_name = raw.get("_class_name")
    cls = getattr(diffusers, cls_name, None) if isinstance(cls_name, str) else None
    if cls is None:
        return None, f"diffusers {diffusers.__version__} has no class {cls_name!r}"
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.device("meta"):
            warnings.simplefilter("ignore")
            # from_config keeps the class's own arguments: a re-save's quantization_config and
            # other fields the class does not take are dropped, as from_pretrained does
            model = cls.from_config(raw)
    except Exception as e:  # noqa: BLE001 - the library's own refusal, reported as such
        return None, f"diffusers {diffusers.__version__} could not build {cls_name}: {type(e).__name__}"
    finally:
        logging.disable(logging.NOTSET)
    n = sum(int(p.numel()) for p in model.parameters())
    return n, f"diffusers {diffusers.__version__} {cls_name} on the meta device"
