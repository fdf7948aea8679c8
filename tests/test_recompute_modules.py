"""Megatron-Core recompute modules (norm_act, norm_act_mlp) and 8-bit GEMM-input caching, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.engine import evaluate
from autopar.export import base as xb
from autopar.export.base import ExportError
from autopar.layout import RECOMPUTE_CODES, LayoutTable, resolve_layout
from autopar.memory import activation_bytes_per_layer
from autopar.model import load_model
from autopar.prediction import training_job


def _act(model, rec: str, *, tp=8, sp=1, moe=False, low=False, s=8192, b=1):
    one = np.array([1])
    return float(
        activation_bytes_per_layer(
            model,
            seq_len=s,
            micro_batch=one * b,
            tp=one * tp,
            cp=one,
            sp=one * sp,
            recompute=one * RECOMPUTE_CODES.index(rec),
            moe=moe,
            etp=one * tp,
            low_precision=np.array([low]),
        )[0]
    )


def test_dense_terms_by_hand() -> None:
    """Llama 3.1 405B layer, TP8 + SP, s=8192, b=1 (bytes per rank; Korthikanti's terms)."""
    m = load_model("llama-3.1-405b")
    sb, h, t, F = 8192.0, 16384.0, 8.0, 53248.0
    a, g, d = 128, 8, 128
    norm_in = 4 * sb * h / t
    gemm_in = 4 * sb * h / t  # QKV input + MLP input
    qkv = 2 * sb * (a * d + 2 * g * d) / t
    attn_out = 2 * sb * a * d / t
    lse = 4 * sb * a / t
    mlp = 6 * sb * F / t  # gate/up outputs 4F + SwiGLU output 2F
    assert _act(m, "none") == pytest.approx(norm_in + gemm_in + qkv + attn_out + lse + mlp)
    assert _act(m, "selective") == pytest.approx(norm_in + gemm_in + qkv + attn_out + mlp)
    assert _act(m, "norm_act") == pytest.approx(norm_in + qkv + attn_out + mlp)
    assert _act(m, "norm_act_mlp") == pytest.approx(norm_in + qkv + attn_out)
    assert _act(m, "full") == pytest.approx(2 * sb * h / t)
    # fp8 through TE: GEMM inputs at 1 byte, the SwiGLU output (fc2 input) too, O kept 16-bit plus
    # the output projection's 8-bit copy.
    low = norm_in + gemm_in / 2 + qkv + attn_out * 1.5 + lse + (4 + 1) * sb * F / t
    assert _act(m, "none", low=True) == pytest.approx(low)


def test_mla_and_moe_terms_by_hand() -> None:
    """DeepSeek-V3 MoE layer, TP1: norm_act drops the up-projected Q/K/V and the experts' act output."""
    m = load_model("deepseek-v3")
    sb, h = 4096.0, float(m.hidden)
    up = 2 * sb * (m.heads * m.qk_head_dim + m.heads * (m.qk_head_dim + m.v_dim))
    rows = sb * m.moe_topk  # etp = tp = 1, no SP: every rank routes its T tokens, k copies each
    act_out = 2 * rows * m.moe_ffn_hidden
    gemm_in = 4 * sb * h  # QKV input + pre-MLP norm output (router input)
    drop = _act(m, "selective", tp=1, sp=0, moe=True, s=4096) - _act(
        m, "norm_act", tp=1, sp=0, moe=True, s=4096
    )
    assert drop == pytest.approx(up + act_out + gemm_in)
    # norm_act_mlp also drops the shared expert's intermediates (6 F_s per token)
    drop2 = _act(m, "norm_act", tp=1, sp=0, moe=True, s=4096) - _act(
        m, "norm_act_mlp", tp=1, sp=0, moe=True, s=4096
    )
    assert drop2 == pytest.approx(6 * sb * m.shared_expert_ffn)


def _eval(job, **kw):
    lay = resolve_layout(num_devices=job.num_devices, global_batch=job.global_batch, **kw)
    return evaluate(job, LayoutTable.from_layouts([lay]))


def test_recompute_time_orders_with_what_is_dropped() -> None:
    job = training_job(
        model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=64, seq_len=8192, global_batch=64
    )
    t = {r: float(_eval(job, tp=8, pp=4, recompute=r)["time_recompute"][0]) for r in RECOMPUTE_CODES}
    assert 0.0 == t["none"] < t["selective"] < t["norm_act"] < t["norm_act_mlp"] < t["full"]
    # norms are memory-bound: norm_act costs a few percent of the forward, the MLP most of it
    assert t["norm_act"] - t["selective"] < 0.1 * (t["full"] - t["selective"])
    assert t["norm_act_mlp"] - t["norm_act"] > 0.5 * (t["full"] - t["norm_act"])
    mem = {r: float(_eval(job, tp=8, pp=4, recompute=r)["mem_activations"][0]) for r in RECOMPUTE_CODES}
    assert mem["none"] > mem["selective"] > mem["norm_act"] > mem["norm_act_mlp"] > mem["full"]


def test_mla_up_projection_recompute_costs_gemm_time() -> None:
    job = training_job(
        model="deepseek-v3", device="h800-sxm-80gb", num_devices=256, seq_len=4096, global_batch=256
    )
    sel = _eval(job, tp=1, pp=16, ep=16, recompute="selective")
    na = _eval(job, tp=1, pp=16, ep=16, recompute="norm_act")
    extra = float(na["time_recompute"][0] - sel["time_recompute"][0])
    assert extra > 0.0
    assert float(na["mem_activations"][0]) < 0.75 * float(sel["mem_activations"][0])


def _xjob(model: str, n: int = 64) -> xb.Job:
    return xb.Job(model=model, num_devices=n, devices_per_node=8, seq_len=4096, global_batch=64)


@pytest.mark.parametrize(
    ("model", "mode", "modules"),
    [
        ("llama-3.1-70b", "norm_act", ["core_attn", "layernorm"]),
        ("llama-3.1-70b", "norm_act_mlp", ["core_attn", "layernorm", "mlp"]),
        ("mixtral-8x7b", "norm_act", ["core_attn", "layernorm", "moe_act"]),
        ("deepseek-v3", "norm_act", ["core_attn", "layernorm", "moe_act", "mla_up_proj"]),
        (
            "deepseek-v3",
            "norm_act_mlp",
            ["core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts"],
        ),
    ],
)
@pytest.mark.parametrize("fmt", ["megatron", "megatron_bridge"])
def test_megatron_formats_name_the_modules_the_model_has(model, mode, modules, fmt) -> None:
    lay = resolve_layout(num_devices=64, global_batch=64, tp=8, pp=2, recompute=mode)
    job = _xjob(model)
    text = xb.export(lay, fmt, job)
    want = " ".join(["--recompute-modules", *modules]) if fmt == "megatron" else "[" + ",".join(modules) + "]"
    assert want in text
    assert xb.parse(text, fmt) == (lay, job)


@pytest.mark.parametrize("fmt", ["torchtitan", "torchrun", "deepspeed", "accelerate"])
def test_other_formats_refuse_module_recompute(fmt) -> None:
    lay = resolve_layout(num_devices=8, global_batch=64, tp=8, recompute="norm_act")
    with pytest.raises(ExportError, match="recompute modules"):
        xb.export(lay, fmt, _xjob("llama-3.1-8b", 8))


def test_parsing_an_unmodelled_module_set_is_refused() -> None:
    lay = resolve_layout(num_devices=64, global_batch=64, tp=8, pp=2, recompute="norm_act")
    text = xb.export(lay, "megatron", _xjob("llama-3.1-70b")).replace(
        "--recompute-modules core_attn layernorm", "--recompute-modules core_attn moe"
    )
    with pytest.raises(ExportError, match="recompute modules"):
        xb.parse(text, "megatron")
