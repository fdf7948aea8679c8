"""The model a reference run trains: :class:`RunnerModelConfig`, a small torch-free dataclass.

It is kept apart from ``model.py`` so that launching a run (``launch.py``) never imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from autopar.errors import RunError


@dataclass(frozen=True)
class RunnerModelConfig:
    """A Llama-style decoder: RMSNorm, RoPE, GQA attention, SwiGLU MLP or top-k MoE, untied head.

    ``num_experts > 0`` makes every layer's MLP a mixture of ``num_experts`` SwiGLU experts of width
    ``moe_ffn_hidden`` (``0`` means ``ffn_hidden``), each token routed to ``moe_topk`` of them.
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    num_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "ffn_hidden", "vocab"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise RunError(
                    f"RunnerModelConfig.{name} must be a positive integer, got {v!r}", "pass a value >= 1"
                )
        if self.hidden % self.heads:
            raise RunError(
                f"hidden={self.hidden} is not divisible by heads={self.heads}",
                "choose heads that divide hidden",
            )
        if self.heads % self.kv_heads:
            raise RunError(
                f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}",
                "GQA needs kv_heads to divide heads",
            )
        if self.head_dim % 2:
            raise RunError(f"head_dim = hidden/heads = {self.head_dim} is odd", "RoPE needs an even head_dim")
        if self.num_experts < 0 or self.moe_topk < 0 or self.moe_ffn_hidden < 0:
            raise RunError(
                "num_experts, moe_topk and moe_ffn_hidden must be >= 0",
                f"got {self.num_experts}, {self.moe_topk}, {self.moe_ffn_hidden}",
            )
        if self.num_experts and not 1 <= self.moe_topk <= self.num_experts:
            raise RunError(
                f"moe_topk={self.moe_topk} must be in 1..num_experts={self.num_experts}",
                "set moe_topk for an MoE model",
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_ffn_hidden(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden

    @classmethod
    def from_model_spec(cls, spec: Any) -> RunnerModelConfig:
        """Build from anything with attributes (or keys) hidden, layers, heads, kv_heads, ffn_hidden,
        vocab and optionally num_experts, moe_topk, moe_ffn_hidden (``autopar.model.ModelSpec``)."""

        def get(name: str, default: Any = None) -> Any:
            v = spec.get(name, default) if isinstance(spec, Mapping) else getattr(spec, name, default)
            return default if v is None else v

        arch = get("arch", "decoder")
        if arch != "decoder":  # the reference model is a causal decoder (autopar.runner.model)
            raise RunError(
                f"model spec {get('name', '?')!r} is an {arch.replace('_', '-')} model; the reference runner "
                "trains causal decoders only",
                "validate a decoder, or check the encoder's prediction against your own measured runs",
            )
        missing = [
            n for n in ("hidden", "layers", "heads", "kv_heads", "ffn_hidden", "vocab") if get(n) is None
        ]
        if missing:
            raise RunError(
                f"model spec {type(spec).__name__} lacks {', '.join(missing)}",
                "pass a ModelSpec or an object with those attributes",
            )
        return cls(
            hidden=int(get("hidden")),
            layers=int(get("layers")),
            heads=int(get("heads")),
            kv_heads=int(get("kv_heads")),
            ffn_hidden=int(get("ffn_hidden")),
            vocab=int(get("vocab")),
            num_experts=int(get("num_experts", 0)),
            moe_topk=int(get("moe_topk", 0)),
            moe_ffn_hidden=int(get("moe_ffn_hidden", 0)),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> RunnerModelConfig:
        data = json.loads(text) if isinstance(text, str) else dict(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RunError(
                f"unknown RunnerModelConfig keys: {', '.join(unknown)}",
                f"allowed: {', '.join(sorted(known))}",
            )
        return cls(**data)
