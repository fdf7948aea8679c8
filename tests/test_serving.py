"""Serving model: golden KV-cache and weight bytes, invariants (hypothesis), energy and power caps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import (
    KV_PAGE_TOKENS,
    ServingTable,
    _kv_seq_bytes_per_device,
    evaluate_serving,
    instance_memory,
    iteration,
    kv_bytes_per_token_per_device,
    make_context,
    make_workload,
    power_demand,
    steady_state,
    trtllm_max_num_tokens,
    weights_per_device,
)

H100 = load_device("h100-sxm-80gb")


def ctx_for(model: str, device=H100, **kw):
    w = make_workload(**{"isl": 1024, "osl": 256, **kw})
    return make_context(load_model(model), device, w, devices_per_node=8)


# ============================================================================ golden KV-cache bytes
# Hand computations from the models' config.json (bytes per cached token, all layers):
#   GQA   Llama 3.1 8B : 32 layers * 2 (K,V) * 8 KV heads * 128 head_dim * 2 B (bf16) = 131072
#   GQA   Llama 3.1 70B: 80 * 2 * 8 * 128 * 2 = 327680
#   MLA   DeepSeek-V3  : 61 layers * (kv_lora_rank 512 + qk_rope_head_dim 64) * 2 B = 70272
#   SWA   gpt-oss-120b : 36 layers * 2 * 8 KV heads * 64 head_dim * 2 B = 73728 per token; 18 of the
#                        36 layers use a 128-token sliding window, so a sequence holds at most 128
#                        tokens in those layers.
@pytest.mark.parametrize(
    "model,expected",
    [("llama-3.1-8b", 131072), ("llama-3.1-70b", 327680), ("deepseek-v3", 70272), ("gpt-oss-120b", 73728)],
)
def test_kv_bytes_per_token_golden(model: str, expected: int) -> None:
    assert load_model(model).kv_cache_bytes_per_token(2) == expected
    ctx = ctx_for(model)
    assert kv_bytes_per_token_per_device(ctx, ServingTable({"tp": 1}))[0] == expected


def test_kv_per_device_gqa_shards_then_replicates() -> None:
    ctx = ctx_for("llama-3.1-70b")
    tab = ServingTable({"tp": [1, 2, 8, 16, 32]})
    # 8 KV heads: 8, 4, 1 per device; beyond tp=8 each device keeps (a replica of) one head.
    assert list(kv_bytes_per_token_per_device(ctx, tab)) == [327680, 163840, 40960, 40960, 40960]
    fp8 = ctx_for("llama-3.1-70b", weight_precision="fp8")  # fp8 weights imply an fp8 KV cache
    assert kv_bytes_per_token_per_device(fp8, ServingTable({"tp": 8}))[0] == 80 * 2 * 1 * 128 * 1


def test_kv_per_device_mla_is_replicated_across_tp_and_split_by_pp() -> None:
    ctx = ctx_for("deepseek-v3")
    per = kv_bytes_per_token_per_device(ctx, ServingTable({"tp": [1, 8, 8], "pp": [1, 1, 2]}))
    assert list(per) == [70272, 70272, 31 * 576 * 2]  # pp=2: the heaviest stage holds ceil(61/2)=31 layers


def test_kv_sliding_window_sequence_golden() -> None:
    m = load_model("gpt-oss-120b")
    per_layer_token = 2 * 8 * 64 * 2
    assert m.kv_cache_bytes(4096, 2) == (18 * 4096 + 18 * 128) * per_layer_token
    ctx = ctx_for("gpt-oss-120b")
    # Paged (64-token blocks): sliding layers keep the window plus one block being written.
    paged = _kv_seq_bytes_per_device(ctx, ServingTable({"tp": 1}), 4096)[0]
    assert paged == (18 * 4096 + 18 * (128 + KV_PAGE_TOKENS)) * per_layer_token
    short = _kv_seq_bytes_per_device(ctx, ServingTable({"tp": 1}), 100)[0]
    assert short == 36 * 128 * per_layer_token  # 100 tokens occupy two 64-token pages in every layer


# ===================================================================================== weights
def test_weights_bf16_are_two_bytes_per_parameter() -> None:
    for name in ("llama-3.1-8b", "mixtral-8x7b", "deepseek-v3"):
        m = load_model(name)
        ctx = ctx_for(name)
        assert weights_per_device(ctx, ServingTable({"tp": 1}))[0] == pytest.approx(
            2 * m.total_params, rel=1e-9
        )


def test_weights_fp8_keep_embedding_and_head_16bit() -> None:
    m = load_model("llama-3.1-70b")
    ctx = ctx_for("llama-3.1-70b", weight_precision="fp8")
    w = weights_per_device(ctx, ServingTable({"tp": 1}))[0]
    sixteen = m.embedding_params + m.head_params + m.final_norm_params + m.layers * m.norm_params_per_layer
    assert w == pytest.approx((m.total_params - sixteen) * 1 + sixteen * 2, rel=1e-9)


PRESETS = ["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b"]


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(PRESETS),
    t1=st.integers(0, 6),
    t2=st.integers(0, 6),
    pp=st.sampled_from([1, 2, 4]),
    prec=st.sampled_from(["bf16", "fp8", "int4"]),
)
def test_more_tp_never_raises_weight_memory(model: str, t1: int, t2: int, pp: int, prec: str) -> None:
    lo, hi = sorted((2**t1, 2**t2))
    ctx = ctx_for(model, weight_precision=prec)
    w = weights_per_device(ctx, ServingTable({"tp": [lo, hi], "pp": pp}))
    assert w[1] <= w[0] * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(
    isl=st.integers(1, 30000),
    extra=st.integers(1, 30000),
    osl=st.integers(1, 4000),
    conc=st.integers(1, 512),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2]),
    model=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "gpt-oss-120b"]),
    chunked=st.booleans(),
)
def test_longer_prompts_never_lower_ttft(
    isl: int, extra: int, osl: int, conc: int, tp: int, pp: int, model: str, chunked: bool
) -> None:
    """Same engine (token budget) and concurrency: a longer prompt never gets its first token sooner."""
    budget = 65536
    ttft = []
    for L in (isl, isl + extra):
        ctx = ctx_for(
            model,
            isl=L,
            osl=osl,
            concurrency=conc,
            max_num_tokens=budget,
            chunked_prefill=chunked,
            weight_precision="fp8",
        )
        tab = ServingTable({"tp": tp, "pp": pp, "conc": conc})
        ss = steady_state(ctx, tab, conc, budget=np.array([float(budget)]))
        ttft.append(float(ss["ttft"][0]))
    assert ttft[1] >= ttft[0] * (1 - 1e-12)


# ========================================================================= memory and throughput
def test_max_concurrency_shrinks_with_sequence_length_and_fits_memory() -> None:
    short = instance_memory(ctx_for("llama-3.1-70b", isl=128, osl=128), ServingTable({"tp": 4}))
    long = instance_memory(ctx_for("llama-3.1-70b", isl=8192, osl=1024), ServingTable({"tp": 4}))
    assert long["max_conc"][0] < short["max_conc"][0]
    m = short
    used = m["weights"] + m["workspace"] + m["reserve"] + m["kv_per_seq"] * m["max_conc"]
    assert used[0] <= m["capacity"][0]


def test_offline_batch_is_capped_by_max_batch_and_memory() -> None:
    res = evaluate_serving(
        ctx_for("llama-3.1-8b", isl=128, osl=128, offline=True, max_batch=512, weight_precision="fp8"),
        ServingTable({"tp": 1}),
    )
    assert res["batch"][0] == 512
    res = evaluate_serving(
        ctx_for("llama-3.1-70b", isl=4096, osl=4096, offline=True, weight_precision="fp8"),
        ServingTable({"tp": 2}),
    )
    assert 1 <= res["batch"][0] == res["max_conc"][0] < 4096


def test_weights_that_do_not_fit_are_reported() -> None:
    res = evaluate_serving(ctx_for("llama-3.1-405b", offline=True), ServingTable({"tp": [1, 8]}))
    assert res["bad"]["weights_do_not_fit"][0] and not res["valid"][0]
    assert res["bad"]["weights_do_not_fit"][1]  # 810 GB bf16 on 8 x 80 GB does not fit either


def test_throughput_rises_and_tpot_grows_with_batch() -> None:
    ctx = ctx_for("llama-3.1-70b", concurrency=1, weight_precision="fp8")
    b = np.array([1, 8, 64, 256], dtype=float)
    tab = ServingTable({"tp": 4, "conc": b})
    ss = steady_state(ctx, tab, b, budget=trtllm_max_num_tokens(b, 1024, 256))
    assert np.all(np.diff(ss["output_tps_instance"]) > 0)
    assert np.all(np.diff(ss["tpot"]) > 0)
    # Batch 1 decode is bound by streaming the weights: TPOT is at least weights / peak HBM bandwidth.
    w = weights_per_device(ctx, ServingTable({"tp": 4}))[0]
    assert ss["tpot"][0] > w / (H100.memory_bw_gbps * 1e9)


def test_tp_all_reduce_costs_time_in_decode() -> None:
    ctx = ctx_for("llama-3.1-70b", weight_precision="fp8")
    it = iteration(
        ctx,
        ServingTable({"tp": [1, 8]}),
        n_dec=1.0,
        n_pre=0.0,
        dec_ctx=1000.0,
        pre_ctx=0.0,
        pre_len=1.0,
        logit_rows=1.0,
    )
    assert it["comm"][0] == 0 and it["comm"][1] > 0


# ================================================================================= energy, caps
def test_prefill_draws_near_tdp_and_decode_far_below() -> None:
    ctx = ctx_for("llama-3.1-70b", weight_precision="fp8")
    tab = ServingTable({"tp": 8})
    pre = iteration(
        ctx, tab, n_dec=0.0, n_pre=8192.0, dec_ctx=0.0, pre_ctx=4096.0, pre_len=8192.0, logit_rows=1.0
    )
    dec = iteration(ctx, tab, n_dec=8.0, n_pre=0.0, dec_ctx=2048.0, pre_ctx=0.0, pre_len=1.0, logit_rows=8.0)
    tdp = H100.power.tdp_w
    p_pre = power_demand(ctx, pre)["active_w"][0]
    p_dec = power_demand(ctx, dec)["active_w"][0]
    assert 0.8 * tdp <= p_pre <= tdp
    assert H100.power.idle_w < p_dec <= 0.6 * tdp


def test_power_cap_slows_compute_and_lowers_power() -> None:
    ctx = ctx_for("llama-3.1-8b", isl=2048, osl=128, offline=True, weight_precision="fp8")
    res = evaluate_serving(ctx, ServingTable({"tp": 1, "cap_w": [0.0, 600.0, 400.0]}))
    assert res["valid"].all()
    assert res["clock"][0] == 1.0 and 1.0 > res["clock"][1] > res["clock"][2]
    assert res["active_power_w"][2] <= 400.0 + 1e-9
    assert res["output_tps_instance"][0] >= res["output_tps_instance"][1] >= res["output_tps_instance"][2]
    bad = evaluate_serving(ctx, ServingTable({"tp": 1, "cap_w": [100.0, 900.0]}))
    assert bad["bad"]["power_cap_range"].all()


def test_request_rate_mode_finds_the_batch_and_flags_saturation() -> None:
    ctx = ctx_for("llama-3.1-8b", isl=512, osl=256, request_rate=1.0, weight_precision="fp8")
    tab = ServingTable({"tp": [1, 1, 1]})
    res = evaluate_serving(ctx, tab, rate_per_instance=np.array([1.0, 20.0, 1e6]))
    assert res["request_rate_instance"][0] == pytest.approx(1.0, rel=1e-3)
    assert res["request_rate_instance"][1] == pytest.approx(20.0, rel=1e-3)
    assert res["batch"][1] > res["batch"][0]
    assert res["ttft_s"][1] >= res["ttft_service_s"][1]
    assert res["bad"]["saturated"][2] and not res["bad"]["saturated"][0]
    assert res["j_per_token"][0] > res["j_per_token"][1]  # idle power over unused time


# ===================================================================================== workload
@pytest.mark.parametrize(
    "kw,fragment",
    [
        (dict(concurrency=4, request_rate=1.0), "at most one of"),
        (dict(offline=True, concurrency=4), "at most one of"),
        (dict(goodput=0.9), "goodput needs"),
        (dict(isl=0), "isl"),
        (dict(weight_precision="int3"), "weight_precision"),
        (dict(tpot_ms=-1), "tpot_ms"),
        (dict(typo_field=1), "typo_field"),
    ],
)
def test_bad_workloads_are_one_line_errors(kw: dict, fragment: str) -> None:
    with pytest.raises(AutoparError) as exc:
        make_workload(**{"isl": 100, "osl": 10, **kw})
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_kv_precision_defaults_follow_weights() -> None:
    assert make_workload(isl=1, osl=1, weight_precision="fp8").kv_dtype == "fp8"
    assert make_workload(isl=1, osl=1, weight_precision="int4").kv_dtype == "bf16"
    assert make_workload(isl=1, osl=1, weight_precision="fp8", kv_precision="bf16").kv_dtype == "bf16"


def test_devices_without_fp8_run_fp8_weights_in_bf16_gemms() -> None:
    a100 = make_context(
        load_model("llama-3.1-8b"),
        load_device("a100-80gb"),
        make_workload(isl=10, osl=10, weight_precision="fp8"),
        devices_per_node=8,
    )
    assert a100.compute_precision == "bf16" and a100.weight_bytes == 1.0
