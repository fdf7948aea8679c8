"""Golden tests of the memory model (Korthikanti 2022 Table 2, ZeRO per stage) and its invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.frameworks import DEEPSPEED
from autopar.layout import Layout, LayoutTable
from autopar.memory import (
    MEMORY_COMPONENTS,
    activation_bytes_per_layer,
    memory_breakdown,
)
from autopar.model import load_model

# GPT-3 175B-like layer, as in Korthikanti et al. 2022 (h=12288, a=96, s=2048, F=4h, GELU, MHA).
GPT = load_model(
    dict(
        name="gpt",
        hidden=12288,
        layers=96,
        heads=96,
        kv_heads=96,
        head_dim=128,
        ffn_hidden=4 * 12288,
        vocab=51200,
        gated_mlp=False,
        norm="layernorm",
    )
)


def _act(t: int, sp: bool, rec: int, s: int = 2048, b: int = 1) -> float:
    one = lambda v: np.array([v])  # noqa: E731
    return float(
        activation_bytes_per_layer(
            GPT,
            seq_len=s,
            micro_batch=one(b),
            tp=one(t),
            cp=one(1),
            sp=one(int(sp)),
            recompute=one(rec),
            moe=False,
            flash_attention=False,
            dropout=True,
        )[0]
    )


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table2(t: int) -> None:
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    # Table 2 rows: TP only; TP+SP; TP+selective; TP+SP+selective; full recompute (with SP).
    assert _act(t, False, 0) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    if t > 1:
        assert _act(t, True, 0) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
        assert _act(t, True, 1) == pytest.approx(34 * sbh / t)
        assert _act(t, True, 2) == pytest.approx(2 * sbh / t)
    assert _act(t, False, 1) == pytest.approx(sbh * (10 + 24 / t))
    assert _act(t, False, 2) == pytest.approx(2 * sbh)


def test_no_parallelism_row() -> None:
    s, h, a = 2048, 12288, 96
    assert _act(1, False, 0) == pytest.approx(s * h * (34 + 5 * a * s / h))


def _table(**kw) -> LayoutTable:
    return LayoutTable.from_layouts([Layout(**kw)])


# The ZeRO paper's 2-byte gradients are DeepSpeed's (the default Megatron profile keeps fp32 main
# gradients: 6 + 12/d with the distributed optimizer, tests/test_frameworks.py), so these goldens
# now name the DeepSpeed profile; until the per-stack profiles every stack was costed this way.
@pytest.mark.parametrize(
    "zero,expected_per_param",
    [
        (0, 2 + 2 + 12),  # 16 Psi
        (1, 2 + 2 + 12 / 64),  # 4 Psi + K Psi / Nd
        (2, 2 + (2 + 12) / 64),  # 2 Psi + (2+K) Psi / Nd
        (3, (2 + 2 + 12) / 64),  # (4+K) Psi / Nd
    ],
)
def test_zero_stages_match_rajbhandari(zero: int, expected_per_param: float) -> None:
    spec = load_model("llama-3.1-8b")
    mem = memory_breakdown(spec, _table(dp=64, zero=zero, grad_accum=1), seq_len=4096, profile=DEEPSPEED)
    model_state = mem["weights"][0] + mem["gradients"][0] + mem["optimizer"][0]
    assert model_state == pytest.approx(expected_per_param * spec.total_params, rel=1e-6)


def test_breakdown_sums_to_total() -> None:
    spec = load_model("mixtral-8x7b")
    lay = LayoutTable.from_layouts(
        [
            Layout(
                tp=2,
                pp=4,
                vpp=2,
                dp=4,
                ep=4,
                etp=1,
                zero=1,
                sp=True,
                micro_batch=2,
                grad_accum=8,
                recompute="selective",
            ),
            Layout(tp=1, pp=1, dp=32, zero=3, micro_batch=1, grad_accum=4, recompute="full"),
        ]
    )
    mem = memory_breakdown(spec, lay, seq_len=4096)
    assert np.allclose(sum(mem[k] for k in MEMORY_COMPONENTS), mem["total"])


def test_offload_removes_optimizer_state() -> None:
    spec = load_model("llama-3.1-8b")
    on = memory_breakdown(spec, _table(dp=8, zero=1, offload=True), seq_len=2048)
    off = memory_breakdown(spec, _table(dp=8, zero=1), seq_len=2048)
    assert on["optimizer"][0] == 0 and off["optimizer"][0] > 0


@settings(max_examples=60, deadline=None)
@given(
    preset=st.sampled_from(["llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt3-175b"]),
    zero=st.integers(0, 3),
    pp=st.sampled_from([1, 2, 4]),
    mb=st.sampled_from([1, 2, 4]),
    rec=st.sampled_from(["none", "selective", "full"]),
    tps=st.sampled_from([(1, 2), (2, 4), (4, 8), (1, 8)]),
)
def test_more_tp_never_raises_parameter_memory(preset, zero, pp, mb, rec, tps) -> None:
    spec = load_model(preset)
    t1, t2 = tps
    lay = LayoutTable.from_layouts(
        [
            Layout(tp=t, pp=pp, dp=8, zero=zero, micro_batch=mb, grad_accum=8, recompute=rec, sp=t > 1)
            for t in (t1, t2)
        ]
    )
    mem = memory_breakdown(spec, lay, seq_len=4096)
    for stage in ("state_first", "state_last"):
        assert mem[stage][1] <= mem[stage][0] * (1 + 1e-9)
    assert mem["activations"][1] <= mem["activations"][0] * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(zero=st.integers(1, 3), dp=st.sampled_from([2, 4, 8]), k=st.sampled_from([2, 4]))
def test_fitting_layout_keeps_fitting_with_more_replicas(zero, dp, k) -> None:
    """Same per-replica shape (tp, pp, micro-batch, accumulation) with more data-parallel replicas
    never needs more memory per device: sharded state only shrinks."""
    spec = load_model("llama-3.1-70b")
    lay = LayoutTable.from_layouts(
        [
            Layout(tp=8, pp=4, dp=d, zero=zero, sp=True, micro_batch=1, grad_accum=16, recompute="selective")
            for d in (dp, dp * k)
        ]
    )
    mem = memory_breakdown(spec, lay, seq_len=4096)
    assert mem["total"][1] <= mem["total"][0]
