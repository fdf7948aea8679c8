"""Read BERT-style encoders and encoder-decoder configs as what they are (issue 22, item 4).

:func:`read` turns a ``config.json`` of a supported encoder (``bert``, ``roberta``, ``xlm-roberta``,
``camembert``, ``layoutlm``) or encoder-decoder (``whisper``, ``seamless_m4t_v2``) into the fields of
a :class:`~autopar.model.ModelSpec` with ``arch`` "encoder" or "encoder_decoder"; every other encoder
or encoder-decoder model type stays refused by name (:func:`autopar.model._refuse_by_name`). The
counts are those of the class the config's ``architectures`` names, as transformers builds it
(:mod:`autopar.hf_meta` builds that class for these models):

* BERT family: word, learned absolute position and token-type embeddings with their LayerNorm
  (LayoutLM adds four 2-D position tables), ``L`` post-norm layers of biased MHA + GELU MLP, and
  the head of the class: the pooler (``h x h + h``) where the class has one, the MLM transform
  (``h x h + h``, LayerNorm) with the decoder tied to the word embedding and its vocabulary bias,
  the NSP or classification layers.
* Whisper: the conv front-end (:mod:`autopar.blocks.encoder`), encoder positions (a table of
  ``max_source_positions``), pre-norm encoder layers (k_proj without bias) and a final norm, the
  decoder's learned positions, pre-norm decoder layers with cross-attention, a final norm, and the
  output projection tied to the token embedding.
* SeamlessM4T v2: the text encoder and text decoder (pre-norm, ReLU, biases, sinusoidal positions,
  one shared embedding tied to the LM head). The speech encoder (conformer), the text-to-unit model
  and the vocoder are other towers: not counted, named in the spec's warnings.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import UnsupportedArchitecture

BERT_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "layoutlm"})
ENCDEC_TYPES = frozenset({"whisper", "seamless_m4t_v2"})
_GELU = ("gelu", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "relu", "quick_gelu")

# head class suffix -> (pooler in the class, extra head parameters (h, V, labels), vocab head)
_BERT_HEADS: dict[str, tuple[bool, Any, bool]] = {
    "Model": (True, lambda h, V, n: 0, False),
    "ForMaskedLM": (False, lambda h, V, n: h * h + h + 2 * h, True),
    "LMHeadModel": (False, lambda h, V, n: h * h + h + 2 * h, True),
    "ForCausalLM": (False, lambda h, V, n: h * h + h + 2 * h, True),
    "ForPreTraining": (True, lambda h, V, n: h * h + h + 2 * h + 2 * h + 2, True),
    "ForNextSentencePrediction": (True, lambda h, V, n: 2 * h + 2, False),
    "ForSequenceClassification": (True, lambda h, V, n: h * n + n, False),
    "ForMultipleChoice": (True, lambda h, V, n: h + 1, False),
    "ForTokenClassification": (False, lambda h, V, n: h * n + n, False),
    "ForQuestionAnswering": (False, lambda h, V, n: h * n + n, False),
}


# The head classes transformers has per family (RobertaForPreTraining or LayoutLMForCausalLM do not exist).
_ROBERTA_HEADS = (
    "Model",
    "ForMaskedLM",
    "ForCausalLM",
    "ForSequenceClassification",
    "ForMultipleChoice",
    "ForTokenClassification",
    "ForQuestionAnswering",
)
_FAMILY_HEADS: dict[str, tuple[str, ...]] = {
    "bert": (
        "Model",
        "ForMaskedLM",
        "LMHeadModel",
        "ForPreTraining",
        "ForNextSentencePrediction",
        "ForSequenceClassification",
        "ForMultipleChoice",
        "ForTokenClassification",
        "ForQuestionAnswering",
    ),
    "roberta": _ROBERTA_HEADS,
    "xlm-roberta": _ROBERTA_HEADS,
    "camembert": _ROBERTA_HEADS,
    "layoutlm": (
        "Model",
        "ForMaskedLM",
        "ForSequenceClassification",
        "ForTokenClassification",
        "ForQuestionAnswering",
    ),
}


def handles(mt: str) -> bool:
    return mt in BERT_TYPES or mt in ENCDEC_TYPES


def _head_class(cfg: dict, mt: str, prefixes: tuple[str, ...], ctx: str) -> str:
    """The suffix of the config's architectures class (``Model`` when it names none)."""
    archs = cfg.get("architectures")
    if not archs:
        return "Model"
    if not isinstance(archs, list) or not isinstance(archs[0], str):
        raise UnsupportedArchitecture(f"{ctx}architectures {archs!r} is not a list of class names")
    cls = archs[0]
    for p in sorted(prefixes, key=len, reverse=True):
        if cls.startswith(p):
            return cls[len(p) :]
    raise UnsupportedArchitecture(
        f"{ctx}architectures class {cls!r} is not a {mt} class autopar knows",
        "name the base class (e.g. BertModel) or drop `architectures`",
    )


def _aliases_agree(cfg: dict, pairs: tuple[tuple[str, str], ...], ctx: str) -> None:
    """transformers maps an alias onto a field (WhisperConfig: num_hidden_layers is encoder_layers;
    SeamlessM4Tv2Config: it is decoder_layers); a config giving both with different values is
    read differently depending on their order, so it is refused."""
    for alias, key in pairs:
        a, k = cfg.get(alias), cfg.get(key)
        if a is not None and k is not None and a != k:
            raise UnsupportedArchitecture(
                f"{ctx}{alias} ({a!r}) and {key} ({k!r}) disagree; transformers reads {alias} as {key}",
                f"make them equal or drop {alias}",
            )


def _labels(cfg: dict, ctx: str, _int: Any) -> int:
    id2label = cfg.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    return _int(cfg, "num_labels", 2, ctx=ctx)


def _bert(cfg: dict, mt: str, ctx: str, _int: Any, _bool: Any) -> dict[str, Any]:
    h = _int(cfg, "hidden_size", ctx=ctx)
    L = _int(cfg, "num_hidden_layers", ctx=ctx)
    a = _int(cfg, "num_attention_heads", ctx=ctx)
    V = _int(cfg, "vocab_size", ctx=ctx)
    F = _int(cfg, "intermediate_size", ctx=ctx)
    if h % a:
        raise UnsupportedArchitecture(f"{ctx}hidden_size {h} is not a multiple of num_attention_heads {a}")
    pos_type = cfg.get("position_embedding_type", "absolute")
    if pos_type not in (None, "absolute"):
        raise UnsupportedArchitecture(
            f"{ctx}position_embedding_type {pos_type!r} (per-layer relative-distance tables) is not modeled",
            "only absolute learned positions are read",
        )
    if _bool(cfg, "is_decoder", False, ctx=ctx) or _bool(cfg, "add_cross_attention", False, ctx=ctx):
        raise UnsupportedArchitecture(f"{ctx}a BERT used as a cross-attending decoder is not modeled")
    act = cfg.get("hidden_act", "gelu")
    if act not in _GELU:
        raise UnsupportedArchitecture(f"{ctx}hidden_act {act!r} of a BERT-style encoder is not modeled")
    prefixes = {
        "bert": ("Bert",),
        "roberta": ("Roberta",),
        "xlm-roberta": ("XLMRoberta",),
        "camembert": ("Camembert",),
        "layoutlm": ("LayoutLM",),
    }[mt]
    suffix = _head_class(cfg, mt, prefixes, ctx)
    if suffix not in _FAMILY_HEADS[mt]:
        raise UnsupportedArchitecture(
            f"{ctx}the {prefixes[0]}{suffix} head is not modeled",
            f"heads read: {', '.join(prefixes[0] + s for s in _FAMILY_HEADS[mt])}",
        )
    pooler, head_extra, vocab_head = _BERT_HEADS[suffix]
    if mt == "layoutlm":
        pooler = True  # every LayoutLM head class builds LayoutLMModel with its pooler
    n_labels = _labels(cfg, ctx, _int)
    max_pos = _int(cfg, "max_position_embeddings", ctx=ctx)
    embeddings = max_pos * h + _int(cfg, "type_vocab_size", 2, ctx=ctx) * h + 2 * h
    if mt == "layoutlm":  # x, y, h and w position tables (LayoutLMEmbeddings)
        embeddings += 4 * _int(cfg, "max_2d_position_embeddings", 1024, ctx=ctx) * h
    extra = embeddings + (h * h + h if pooler else 0) + head_extra(h, V, n_labels)
    fields: dict[str, Any] = dict(
        arch="encoder",
        hidden=h,
        layers=L,
        heads=a,
        kv_heads=a,
        head_dim=h // a,
        ffn_hidden=F,
        gated_mlp=False,
        vocab=V,
        tie_embeddings=_bool(cfg, "tie_word_embeddings", True, ctx=ctx),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        head_bias=vocab_head,  # the MLM decoder's vocabulary bias
        norm="layernorm",
        norms_per_layer=2,
        post_norm=True,
        lm_head=vocab_head,
        final_norm=False,
        extra_params=extra,
        max_position=max_pos,
    )
    warnings = [
        f"{prefixes[0]}{suffix}: a bidirectional post-norm encoder (no causal mask, no KV cache); "
        + (
            "the MLM head's vocabulary GEMM is costed on the last stage"
            if vocab_head
            else "no vocabulary head"
        )
    ]
    return fields | {"warnings": warnings}


def _whisper(cfg: dict, ctx: str, _int: Any, _bool: Any) -> dict[str, Any]:
    suffix = _head_class(cfg, "whisper", ("Whisper",), ctx)
    if suffix not in ("ForConditionalGeneration", "Model"):
        raise UnsupportedArchitecture(
            f"{ctx}Whisper{suffix} is not modeled",
            "WhisperForConditionalGeneration (encoder-decoder) is read",
        )
    _aliases_agree(
        cfg,
        (
            ("num_hidden_layers", "encoder_layers"),
            ("num_attention_heads", "encoder_attention_heads"),
            ("num_key_value_heads", "encoder_attention_heads"),
            ("hidden_size", "d_model"),
        ),
        ctx,
    )
    h = _int(cfg, "d_model", ctx=ctx)
    ea = _int(cfg, "encoder_attention_heads", ctx=ctx)
    da = _int(cfg, "decoder_attention_heads", ctx=ctx)
    for a in (ea, da):
        if h % a:
            raise UnsupportedArchitecture(f"{ctx}d_model {h} is not a multiple of the attention heads ({a})")
    act = cfg.get("activation_function", "gelu")
    if act not in _GELU:
        raise UnsupportedArchitecture(f"{ctx}activation_function {act!r} is not modeled")
    mels = _int(cfg, "num_mel_bins", 80, ctx=ctx)
    s_enc = _int(cfg, "max_source_positions", 1500, ctx=ctx)
    s_dec = _int(cfg, "max_target_positions", 448, ctx=ctx)
    k = 3  # conv1 / conv2 kernel
    frontend = k * mels * h + h + k * h * h + h
    extra = frontend + s_enc * h + 2 * h + s_dec * h  # encoder positions + final norm, decoder positions
    fields: dict[str, Any] = dict(
        arch="encoder_decoder",
        hidden=h,
        layers=_int(cfg, "decoder_layers", ctx=ctx),
        heads=da,
        kv_heads=da,
        head_dim=h // da,
        ffn_hidden=_int(cfg, "decoder_ffn_dim", ctx=ctx),
        gated_mlp=False,
        vocab=_int(cfg, "vocab_size", ctx=ctx),
        tie_embeddings=_bool(cfg, "tie_word_embeddings", True, ctx=ctx),  # proj_out shares embed_tokens
        qkv_bias=True,
        k_bias=False,  # WhisperAttention: k_proj has no bias
        o_bias=True,
        mlp_bias=True,
        norm="layernorm",
        norms_per_layer=2,
        extra_params=extra,
        encoder_layers=_int(cfg, "encoder_layers", ctx=ctx),
        encoder_heads=ea,
        encoder_ffn_hidden=_int(cfg, "encoder_ffn_dim", ctx=ctx),
        encoder_seq=s_enc,
        frontend_mels=mels,
        max_position=s_dec,
    )
    warnings = [
        f"Whisper{suffix}: encoder-decoder; the encoder runs on {s_enc} positions per sample "
        f"({2 * s_enc} log-mel frames through the conv front-end), seq_len is the decoder's tokens"
    ]
    return fields | {"warnings": warnings}


def _seamless(cfg: dict, ctx: str, _int: Any, _bool: Any) -> dict[str, Any]:
    suffix = _head_class(cfg, "seamless_m4t_v2", ("SeamlessM4Tv2",), ctx)
    if suffix not in ("Model", "ForTextToText"):
        raise UnsupportedArchitecture(
            f"{ctx}SeamlessM4Tv2{suffix} runs the speech encoder or the text-to-unit towers, which are not modeled",
            "SeamlessM4Tv2Model and SeamlessM4Tv2ForTextToText are read as their text encoder-decoder",
        )
    _aliases_agree(
        cfg,
        (("num_hidden_layers", "decoder_layers"), ("num_attention_heads", "decoder_attention_heads")),
        ctx,
    )
    h = _int(cfg, "hidden_size", ctx=ctx)
    ea = _int(cfg, "encoder_attention_heads", ctx=ctx)
    da = _int(cfg, "decoder_attention_heads", ctx=ctx)
    for a in (ea, da):
        if h % a:
            raise UnsupportedArchitecture(
                f"{ctx}hidden_size {h} is not a multiple of the attention heads ({a})"
            )
    act = cfg.get("activation_function", "relu")
    if act not in _GELU:
        raise UnsupportedArchitecture(f"{ctx}activation_function {act!r} is not modeled")
    fields: dict[str, Any] = dict(
        arch="encoder_decoder",
        hidden=h,
        layers=_int(cfg, "decoder_layers", ctx=ctx),
        heads=da,
        kv_heads=da,
        head_dim=h // da,
        ffn_hidden=_int(cfg, "decoder_ffn_dim", ctx=ctx),
        gated_mlp=False,
        vocab=_int(cfg, "vocab_size", ctx=ctx),
        tie_embeddings=_bool(cfg, "tie_word_embeddings", True, ctx=ctx),  # lm_head shares `shared`
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        norm="layernorm",
        norms_per_layer=2,
        extra_params=2 * h,  # the text encoder's final LayerNorm (the decoder's is final_norm)
        encoder_layers=_int(cfg, "encoder_layers", ctx=ctx),
        encoder_heads=ea,
        encoder_ffn_hidden=_int(cfg, "encoder_ffn_dim", ctx=ctx),
        max_position=_int(cfg, "max_position_embeddings", ctx=ctx),
    )
    warnings = [
        f"SeamlessM4Tv2{suffix}: the text encoder-decoder is costed (encoder tokens = seq_len); the speech "
        "encoder, the text-to-unit model and the vocoder are other towers, not counted"
    ]
    return fields | {"warnings": warnings}


def read(cfg: dict, mt: str, ctx: str, _int: Any, _bool: Any) -> dict[str, Any]:
    """ModelSpec fields of a supported encoder or encoder-decoder config (``handles(mt)``)."""
    if mt in BERT_TYPES:
        return _bert(cfg, mt, ctx, _int, _bool)
    if mt == "whisper":
        return _whisper(cfg, ctx, _int, _bool)
    return _seamless(cfg, ctx, _int, _bool)
