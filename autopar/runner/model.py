"""The reference model: a Llama-style decoder written for torchtitan-style parallelization.

Module names follow torchtitan's llama3 (``tok_embeddings``, ``layers.<i>.attention.wq``, ...,
``norm``, ``output``) so that tensor-parallel plans and pipeline splits address them by name.
``tok_embeddings``, ``norm`` and ``output`` may be ``None``: a pipeline stage keeps only its part.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autopar.runner.config import RunnerModelConfig


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (max_seq_len, head_dim // 2) for rotate-half RoPE (Su et al. 2021)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); cos/sin: (seq, head_dim // 2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos = cos[None, :, None, :].to(x.dtype)
    sin = sin[None, :, None, :].to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    """Grouped-query causal self-attention. Head counts are read from the (possibly TP-local) shapes."""

    def __init__(self, cfg: RunnerModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seq = x.shape[0], x.shape[1]
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        q, k = apply_rope(q, cos[:seq], sin[:seq]), apply_rope(k, cos[:seq], sin[:seq])
        rep = q.shape[2] // k.shape[2]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x) (Shazeer 2020)."""

    def __init__(self, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w2 = nn.Linear(ffn_hidden, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """Token-choice top-k mixture of SwiGLU experts (Mixtral-style renormalised top-k softmax).

    No capacity limit, no token dropping, no auxiliary loss. Every expert runs every step, on an
    empty batch if no token chose it, so every rank sees the same parameters in its autograd graph
    (data-parallel reducers and FSDP never wait for a missing gradient). Each token is written once
    per expert, so the combine is deterministic.
    """

    def __init__(self, cfg: RunnerModelConfig) -> None:
        super().__init__()
        self.topk = cfg.moe_topk
        self.router = nn.Linear(cfg.hidden, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(
            FeedForward(cfg.hidden, cfg.expert_ffn_hidden) for _ in range(cfg.num_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = F.softmax(self.router(flat).float(), dim=-1)
        top_w, top_i = probs.topk(self.topk, dim=-1)
        top_w = (top_w / top_w.sum(dim=-1, keepdim=True)).to(flat.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (top_i == e).nonzero(as_tuple=True)
            y = expert(flat[token]) * top_w[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y)
        return out.view(shape)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: RunnerModelConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.feed_forward: nn.Module = MoE(cfg) if cfg.is_moe else FeedForward(cfg.hidden, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only LM: embeddings, ``layers`` blocks, final RMSNorm, untied LM head; returns logits."""

    def __init__(self, cfg: RunnerModelConfig, max_seq_len: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.output: nn.Linear | None = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg.head_dim, max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2/torchtitan-style init from the global RNG: N(0, 0.02), output projections scaled by
        1/sqrt(2 * layers). Call ``torch.manual_seed`` first for a reproducible model."""
        out_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, mod in self.named_modules():
            if isinstance(mod, nn.Linear):
                std = out_std if name.endswith((".wo", ".w2")) else 0.02
                nn.init.trunc_normal_(mod.weight, std=std, a=-3 * std, b=3 * std)
            elif isinstance(mod, nn.Embedding):
                nn.init.normal_(mod.weight, std=1.0)
            elif isinstance(mod, nn.RMSNorm):
                nn.init.ones_(mod.weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all tokens, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1))
