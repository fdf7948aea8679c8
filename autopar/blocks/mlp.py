"""The feed-forward MLP, gated (SwiGLU/GeGLU: fc1 emits gate and up) or plain (GELU/ReLU): one block
kind's costs in one place. :mod:`autopar.blocks.moe_ffn` runs the same MLP per expert.

Parameters: :attr:`ModelSpec.dense_mlp_params` (the reader's count; the weight matrices are
:func:`gemm_shapes` at tp = 1). Forward GEMMs per token: fc1 h -> 2F (gated) or F, fc2 F -> h.
Megatron splits F over TP (fc1 column-, fc2 row-parallel: 2 TP collectives per pass); CP and EP do
not split it. No serving state.
"""

from __future__ import annotations

from typing import Any

KIND = "mlp"


def present(model) -> bool:
    return bool(model.ffn_hidden)


def params(model) -> float:
    """Parameters of one dense MLP (the model reader's count, with biases)."""
    return float(model.dense_mlp_params)


def up_mult(model) -> float:
    return 2.0 if model.gated_mlp else 1.0


def gemm_shapes(model, F, width_div, dim: float | None = None) -> list[tuple[Any, Any]]:
    """(N, K) of fc1 and fc2 per rank at width ``F`` split ``width_div`` ways, M = tokens; the MLP
    reads and writes ``dim`` wide rows (default hidden; a latent MoE's experts: the latent width)."""
    h = float(model.hidden if dim is None else dim)
    return [(up_mult(model) * F / width_div, h), (h, F / width_div)]


def gemms(model, f, F, M, width_div, dim: float | None = None) -> Any:
    """fc1 + fc2 at width ``F`` over ``M`` rows, ``f(M, N, K)`` summed."""
    (n1, k1), (n2, k2) = gemm_shapes(model, F, width_div, dim)
    return f(M, n1, k1) + f(M, n2, k2)


def flops_per_token(model, F: float | None = None, dim: float | None = None) -> float:
    """Forward FLOPs per token of one MLP of width ``F`` (default the dense MLP's) on ``dim`` wide
    rows (default hidden), unsharded."""
    F = model.ffn_hidden if F is None else F
    return sum(2.0 * N * K for N, K in gemm_shapes(model, F, 1.0, dim))


def act_mult(model) -> float:
    """Activation-function traffic per intermediate element: reads (gate +) up, writes its output."""
    return 3.0 if model.gated_mlp else 2.0


def act_elems(model, F, tp) -> Any:
    """Forward memory-bound traffic per token per rank of the activation function at width ``F``."""
    return act_mult(model) * F / tp


def activation_elems(model, F, sb, t, gi) -> Any:
    """Elements kept for backward at width ``F`` per rank: the fc1 output(s) the activation's backward
    reads (2F gated / F, 16-bit) and the fc2 input (``gi``: its relative bytes), both 2 sb F / t each
    (Korthikanti et al. 2022's MLP terms)."""
    mult = 4.0 if model.gated_mlp else 2.0
    return (mult + 2.0 * gi) * sb * F / t
