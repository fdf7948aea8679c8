"""Serving MoE layers run at the measured rates of cost_models/backends/moe_kernels.yaml
(autopar.moe_kernels), which studies/moe_rates.py fits to AIConfigurator's measured MoE tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from autopar import moe_kernels as K
from autopar.coefficients import load_calibration
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import make_context, make_workload, moe_rate

SHIPPED = yaml.safe_load(K.rates_path().read_text())


def test_a_measured_device_takes_its_own_backend_table() -> None:
    r = K.rate_for("h200-sxm-141gb", "trtllm", "fp8", dense_eff=0.6)
    row = SHIPPED["devices"]["h200-sxm-141gb"]["trtllm"]["fp8"]
    assert r.measured and "h200_sxm/moe/trtllm" in r.source
    assert (r.compute, r.bandwidth, r.fixed_us, r.per_token_ns) == (
        row["compute"],
        row["bandwidth"],
        row["fixed_us"],
        row["per_token_ns"],
    )
    v = K.rate_for("h200-sxm-141gb", "vllm", "fp8-block", dense_eff=0.6)
    assert (
        "moe/vllm" in v.source
        and v.compute == SHIPPED["devices"]["h200-sxm-141gb"]["vllm"]["fp8_block"]["compute"]
    )


def test_a_missing_backend_falls_back_to_the_same_gpus_tables_then_to_the_medians() -> None:
    # A100 has no TensorRT-LLM MoE table that fits: its SGLang one (the same GPU) is used
    a = K.rate_for("a100-80gb", "trtllm", "bf16", dense_eff=0.7)
    assert a.measured and "a100_sxm/moe/sglang" in a.source
    # MI300X has none: the measured devices' medians, the compute share scaled to its own GEMMs
    tr = SHIPPED["transfer"]
    m = K.rate_for("mi300x", "vllm", "bf16", dense_eff=0.5)
    assert not m.measured and "transferred" in m.source
    assert m.compute == pytest.approx(0.5 * tr["compute_over_dense"])
    assert (m.bandwidth, m.fixed_us, m.per_token_ns) == (tr["bandwidth"], tr["fixed_us"], tr["per_token_ns"])
    # weight-only int4 dequantizes into 16-bit GEMMs: the bf16 kernel
    assert K.rate_for("h100-sxm-80gb", "trtllm", "int4", 0.7) == K.rate_for(
        "h100-sxm-80gb", "trtllm", "bf16", 0.7
    )


def test_the_law_is_fixed_plus_the_slower_of_compute_and_weights_plus_the_permutation() -> None:
    rate = K.MoeRate(compute=0.5, bandwidth=0.8, fixed_us=30.0, per_token_ns=10.0, source="t", measured=True)
    common = dict(local_experts=16.0, flops_per_row=1e8, weight_bytes_per_expert=1e7, row_width=4096.0)
    common |= dict(peak=1e15, hbm_bw=4e12)
    t0, f0, b0, _, _ = K.layer_time(rate, tokens=0.0, rows=0.0, activated=0.0, **common)
    assert t0 == pytest.approx(30e-6) and f0 == 0 and b0 == 0  # nothing routed: the kernel chain alone
    t, f, b, tc, tm = K.layer_time(rate, tokens=8192.0, rows=65536.0, activated=1.0, **common)
    compute = 65536 * 1e8 / (1e15 * 0.5)
    weights = 16 * 1e7 / (4e12 * 0.8)
    moved = 65536 * 4096 * 2 * 4 / (4e12 * 0.8)
    assert compute > weights
    assert t == pytest.approx(compute + moved + 30e-6 + 8192 * 10e-9)
    assert (
        f == pytest.approx(65536 * 1e8)
        and tc == pytest.approx(compute)
        and tm == pytest.approx(weights + moved)
    )
    few = K.layer_time(rate, tokens=8.0, rows=64.0, activated=0.5, **common)[0]
    assert few == pytest.approx(
        max(64 * 1e8 / 5e14, 8 * 1e7 / 3.2e12) + 64 * 4096 * 8 / 3.2e12 + 30e-6 + 80e-9
    )


def _decode(model: str, device: str, backend: str = "trtllm", precision: str = "fp8"):
    from autopar.serving.estimate import ServingTable, evaluate_serving

    w = make_workload(isl=1000, osl=1000, weight_precision=precision, backend=backend, offline=True)
    ctx = make_context(
        load_model(model), load_device(device), w, devices_per_node=8, calibration=load_calibration(None)
    )
    return ctx, evaluate_serving(ctx, ServingTable({"tp": [1], "pp": [1], "ep": [1], "adp": [1]}))


def test_serving_moe_layers_follow_the_rates_and_dense_models_do_not(monkeypatch) -> None:
    ctx, base = _decode("qwen3-30b-a3b", "h200-sxm-141gb")
    rate = moe_rate(ctx)
    assert rate is not None and rate.measured
    _, dense = _decode("llama-3.1-8b", "h200-sxm-141gb")
    fast = {**SHIPPED, "devices": {}, "transfer": {**SHIPPED["transfer"], "compute_over_dense": 50.0}}
    fast["transfer"]["fixed_us"] = 0.0
    fast["transfer"]["per_token_ns"] = 0.0
    fast["transfer"]["bandwidth"] = 1.0
    monkeypatch.setattr(K, "_table", lambda: fast)
    ctx2, quick = _decode("qwen3-30b-a3b", "h200-sxm-141gb")
    assert not moe_rate(ctx2).measured
    # the rates decide the MoE model's throughput, not the dense model's
    assert quick["output_tps_instance"][0] > 1.05 * base["output_tps_instance"][0]
    _, dense2 = _decode("llama-3.1-8b", "h200-sxm-141gb")
    assert dense2["output_tps_instance"][0] == dense["output_tps_instance"][0]


def test_serve_states_where_the_moe_rates_come_from() -> None:
    from autopar.serving.search import serve

    def notes(model: str) -> list[str]:
        res = serve(model=model, device="h200-sxm-141gb", num_devices=8, isl=1000, osl=1000, top=1)
        return res.costing["backend"]["assumptions"]

    assert any(
        "MoE layers" in n and "measured (aiconfigurator-core h200_sxm" in n for n in notes("qwen3-30b-a3b")
    )
    assert not any("MoE layers" in n for n in notes("llama-3.1-8b"))


pytest.importorskip("aiconfigurator_core", reason="the aiconfigurator extra is not installed")
pytest.importorskip("pyarrow", reason="pyarrow (the aiconfigurator extra) is not installed")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "studies"))
import moe_rates  # noqa: E402


@pytest.mark.parametrize("device_id", ["h200-sxm-141gb", "b200"])
def test_the_shipped_rates_are_the_measured_tables_fit(device_id: str) -> None:
    now = moe_rates.rates(device_id)
    shipped = SHIPPED["devices"][device_id]
    assert set(now) == set(shipped)
    for backend, per in now.items():
        for dtype, row in per.items():
            want = shipped[backend][dtype]
            for key in ("compute", "bandwidth", "fixed_us", "per_token_ns"):
                assert row[key] == pytest.approx(want[key], rel=0.02, abs=0.05), (backend, dtype, key)
            assert row["shapes"] >= moe_rates.MIN_SHAPES
            assert row["median_ape"] < 0.30  # the law follows the measured kernels


def test_the_law_prices_a_measured_shape_near_its_measurement_where_dense_pricing_did_not() -> None:
    # Qwen3-235B-A22B's expert shape on H200, FP8, TensorRT-LLM, EP8, 4096 tokens (balanced)
    _, path = moe_rates.table("h200_sxm", "trtllm")
    d = moe_rates.shapes(path, "fp8")
    d = d[
        (d.hidden_size == 4096)
        & (d.inter_size == 1536)
        & (d.topk == 8)
        & (d.num_experts == 128)
        & (d.moe_tp_size == 1)
        & (d.moe_ep_size == 8)
        & (d.num_tokens == 4096)
    ]
    assert len(d) == 1
    dev = load_device("h200-sxm-141gb")
    ctx, _ = _decode("qwen3-30b-a3b", "h200-sxm-141gb")
    rate = K.rate_for(dev.id, "trtllm", "fp8", 0.6)
    x = moe_rates.law_inputs(d, 1.0)
    t = K.layer_time(rate, peak=dev.peak_tflops["fp8"] * 1e12, hbm_bw=ctx.co.hbm_bw, **x)[0][0]
    measured = float(d.latency.iloc[0]) * 1e-3
    assert abs(t / measured - 1.0) < 0.25
    eff = ctx.co.gemm_eff["fp8"]
    assert moe_rates.dense_pricing_ratio(d, 1.0, ctx.co, dev.peak_tflops["fp8"] * 1e12, eff) > 1.4
