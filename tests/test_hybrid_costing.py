"""Hybrid blocks priced (issue 11 item 5): Mamba2 / Gated DeltaNet terms by hand, activation memory,
parameters of the real mix, the serving state in place of KV, end-to-end runs, the CP refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autopar import collectives as C
from autopar import hybrid, predict, serve
from autopar.coefficients import coefficients_for
from autopar.errors import LayoutError, UnsupportedArchitecture
from autopar.hardware import load_device
from autopar.latency import gemm_time, stage_slot
from autopar.layout import Layout, LayoutTable
from autopar.memory import activation_bytes_per_layer, stage_params_at
from autopar.model import check_costed, load_model
from autopar.prediction import training_job
from autopar.serving.estimate import (
    ServingTable,
    _kv_seq_bytes_per_device,
    iteration,
    make_context,
    make_workload,
    recurrent_state_bytes_per_device,
)

CFG = Path(__file__).parent / "configs"
NANO = "nemotron-3-nano-30b-a3b"  # 23 Mamba2 + 23 MoE-only + 6 attention blocks of 52
QNEXT = "qwen3-next-80b-a3b"  # 36 Gated DeltaNet + 12 gated-attention blocks, all MoE
TP = np.array([1.0, 2.0])


def flops(M, N, K):
    return 2.0 * M * N * K


def test_mamba2_block_terms_by_hand() -> None:
    m = load_model(NANO)
    share = 23 / 52  # the mix: Mamba2 blocks per block
    h, di, nh, N, G = 2688, 4096, 64, 128, 8
    # GEMMs: in_proj h -> 2 di + 2 G N + nh (column-parallel), out_proj di -> h (row-parallel)
    gemm = 2.0 * (h * (2 * di + 2 * G * N + nh) + di * h)
    assert gemm == 2.0 * (2688 * 10304 + 4096 * 2688)
    np.testing.assert_allclose(hybrid.mixer_gemms(m, flops, 1.0, TP), share * gemm / TP)
    # SSD with chunk 128: C B^T per group, (L o CB) X, chunk states, C h
    Q = 128
    scan = 2 * Q * N * G + 2 * Q * di + 4 * N * di
    assert scan == 3407872
    np.testing.assert_allclose(hybrid.scan_flops_per_token(m, TP), share * scan / TP)
    # the timed chunk matmuls do exactly those FLOPs (T tokens = whole chunks)
    T = 4096.0
    np.testing.assert_allclose(hybrid.scan_time(m, flops, T, TP), T * share * scan / TP)
    # elementwise: conv over x, B, C (read + write), dt (read + write), gated norm (y, z -> out)
    conv_dim = di + 2 * G * N
    elems = 2 * conv_dim + 2 * nh + 3 * di
    assert elems == 24704
    np.testing.assert_allclose(hybrid.mixer_elementwise_elems(m, TP), share * elems / TP)
    # fp32 chunk states, 4 passes per chunk of 128 tokens
    np.testing.assert_allclose(hybrid.state_pass_bytes(m, TP), share * 4 * 4 * di * N / Q / TP)


def test_gated_deltanet_block_terms_by_hand() -> None:
    m = load_model(QNEXT)
    share = 36 / 48
    h, kh, vh, dk, dv = 2048, 16, 32, 128, 128
    kd, vd = kh * dk, vh * dv
    gemm = 2.0 * (h * (2 * kd + 2 * vd) + h * 2 * vh + vd * h)
    assert gemm == 2.0 * (2048 * 12288 + 2048 * 64 + 4096 * 2048)
    np.testing.assert_allclose(hybrid.mixer_gemms(m, flops, 1.0, TP), share * gemm / TP)
    C = 64  # fla chunk_gated_delta_rule
    scan = vh * (6 * C * dk + 4 * C * dv + 6 * dk * dv)
    assert scan == 5767168
    np.testing.assert_allclose(hybrid.scan_flops_per_token(m, TP), share * scan / TP)
    np.testing.assert_allclose(hybrid.scan_time(m, flops, 4096.0, TP), 4096.0 * share * scan / TP)
    elems = 2 * (2 * kd + vd) + 2 * 2 * kd + 2 * 2 * vh + 3 * vd
    assert elems == 36992
    np.testing.assert_allclose(hybrid.mixer_elementwise_elems(m, TP), share * elems / TP)
    np.testing.assert_allclose(hybrid.state_pass_bytes(m, TP), share * 2 * 4 * vh * dk * dv / C / TP)


def test_stage_slot_prices_the_mamba2_projections_and_scan_by_hand() -> None:
    job = training_job(model=NANO, device="h100-sxm-80gb", num_devices=8, seq_len=4096, global_batch=8)
    m = job.model
    co, lc = coefficients_for(job.device)
    links = C.Links.from_cluster(job.device, job.devices_per_node, lc)
    lay = LayoutTable.from_layouts([Layout(tp=1, dp=8, ep=8), Layout(tp=2, dp=4, ep=4)])
    s = stage_slot(
        m, lay, seq_len=4096, links=links, co=co,
        n_dense=np.zeros(2), n_moe=np.full(2, 23.0), head=np.zeros(2, dtype=bool),
    )  # fmt: skip
    peak, eff = co.peak("bf16"), co.gemm_eff["bf16"]
    T, h, di, nh, N, G, Q = 4096.0, 2688, 4096, 64, 128, 8, 128
    for i, tp in enumerate((1, 2)):

        def gt(M, Nn, K):
            return float(gemm_time(co, peak, eff, M, Nn, K))

        # 23 Mamba2 mixers: in_proj + out_proj, forward + dgrad + wgrad (3x)
        proj = 23 * 3 * (gt(T, (2 * di + 2 * G * N + nh) / tp, h) + gt(T, h, di / tp))
        assert s["mixer_gemm"][i] == pytest.approx(proj, rel=1e-9)
        # chunked SSD: T/Q chunks; per group C B^T, per head (L o CB) X, B^T X and C h; fwd + 2x bwd
        P = di / nh
        ch = T / Q
        ssd = ch * (G / tp) * gt(Q, Q, N) + ch * (nh / tp) * (gt(Q, P, Q) + gt(N, P, Q) + gt(Q, P, N))
        assert s["scan"][i] == pytest.approx(23 * 3 * ssd, rel=1e-9)
        assert s["attention"][i] > s["scan"][i]  # plus the 6 attention blocks' cores
    assert s["scan"][1] < s["scan"][0] and s["mixer_gemm"][1] < s["mixer_gemm"][0]


def test_activation_memory_of_the_blocks_by_hand() -> None:
    m = load_model(str(CFG / "nemotron-h-8b.json"))  # 24 Mamba2, 4 attention, 24 MLP-only blocks
    s, b, h = 4096, 1, 4096
    one = np.array([1])
    kw = dict(seq_len=s, micro_batch=one, tp=one, cp=one, sp=one * 0, moe=False)
    per_ffn_block = activation_bytes_per_layer(m, recompute=one * 0, **kw)[0]
    sb = s * b
    di, N, G, nh = 8192, 128, 8, 128
    mamba = 2 * sb * ((2 * di + 2 * G * N + nh) + (di + 2 * G * N) + di + di + 4 * nh)
    attn = 2 * sb * (32 * 128 + 2 * 8 * 128) + 2 * sb * 32 * 128 + 4 * sb * 32
    mixer_sublayer = 2 * sb * h + 2 * sb * h  # norm input + the norm output the in_proj / QKV reads
    mlp = 2 * sb * h + 2 * sb * h + (2 + 2) * sb * 21504  # relu^2 MLP: fc1 output + fc2 input
    whole_model = 28 * mixer_sublayer + 4 * attn + 24 * mamba + 24 * mlp
    # the engine carries every block on the 24 blocks with an MLP (n_dense = 24 at pp = 1)
    assert 24 * per_ffn_block == pytest.approx(whole_model, rel=1e-12)
    full = activation_bytes_per_layer(m, recompute=one * 2, **kw)[0]  # RECOMPUTE_CODES "full"
    assert 24 * full == pytest.approx(52 * 2 * sb * h, rel=1e-12)


@pytest.mark.parametrize(
    "name", [NANO, QNEXT, str(CFG / "jamba-v0.1.json"), str(CFG / "falcon-h1-0.5b.json")]
)
def test_parameters_per_rank_hold_the_real_mix(name: str) -> None:
    m = load_model(name)
    lay = LayoutTable.from_layouts([Layout(dp=1)])
    n_dense = np.array([float(m.dense_layers)])
    n_moe = np.array([float(m.moe_layers)])
    nonexp, exp = stage_params_at(m, lay, np.array([0]), n_dense, n_moe)
    assert nonexp[0] + exp[0] == pytest.approx(m.total_params, rel=1e-12)


def test_serving_state_replaces_kv_for_recurrent_layers() -> None:
    m = load_model(NANO)
    ctx = make_context(m, load_device("h100-sxm-80gb"), make_workload(isl=1024, osl=256), devices_per_node=8)
    tab = ServingTable({"tp": [1, 2]})
    seq = 4096  # whole pages
    kv = 6 * (2 * 2 * 128) * 2 * seq  # 6 attention layers: K and V of 2 heads x 128, 16-bit
    conv_dim = 4096 + 2 * 8 * 128
    state = 23 * ((4 - 1) * conv_dim + 4096 * 128) * 2  # 23 Mamba2 layers: conv + SSM state
    got = _kv_seq_bytes_per_device(ctx, tab, seq)
    assert got[0] == pytest.approx(kv + state, rel=1e-12)
    # tp=2: the 2 KV heads split, and the state splits by Mamba heads
    assert got[1] == pytest.approx(kv / 2 + state / 2, rel=1e-12)
    np.testing.assert_allclose(recurrent_state_bytes_per_device(ctx, tab), [state, state / 2])
    # the state does not grow with the context, the KV does, only on the attention layers
    longer = _kv_seq_bytes_per_device(ctx, tab, 2 * seq)[0]
    assert longer - got[0] == pytest.approx(kv, rel=1e-12)


@pytest.mark.parametrize("name", [NANO, QNEXT])
def test_predict_and_serve_end_to_end(name: str) -> None:
    p = predict(model=name, device="h100-sxm-80gb", num_devices=16, seq_len=4096, global_batch=64, tp=2, ep=8)
    assert p.step_time_s > 0 and p.memory_gib_per_device > 0
    assert sum(p.memory_breakdown.values()) == pytest.approx(p.memory_gib_per_device, rel=1e-9)
    r = serve(model=name, device="h100-sxm-80gb", num_devices=8, isl=1024, osl=256, concurrency=32)
    assert r.layouts_feasible > 0
    assert all(x["tpot_ms"] > 0 and x["ttft_ms"] > 0 for x in r.results)


def test_cp_refused_for_recurrent_blocks_with_a_reason() -> None:
    with pytest.raises(LayoutError, match="context parallelism .* not modeled for Mamba / Gated DeltaNet"):
        predict(
            model=QNEXT, device="h100-sxm-80gb", num_devices=16, seq_len=8192, global_batch=64, cp=2, ep=8
        )


def test_tp_must_divide_the_mixer_heads() -> None:
    # Falcon-H1 0.5B: one B/C group, so Megatron's MambaMixer cannot split it over tp = 2
    with pytest.raises(LayoutError, match="Mamba / Gated DeltaNet mixers"):
        predict(
            model=str(CFG / "falcon-h1-0.5b.json"),
            device="h100-sxm-80gb",
            num_devices=2,
            seq_len=4096,
            global_batch=8,
            tp=2,
        )


def test_still_refused_what_is_not_priced() -> None:
    m = load_model(NANO)
    bare = m.model_copy(update={"no_ffn_layers": m.layers, "moe_layers": 0, "num_experts": 0})
    with pytest.raises(UnsupportedArchitecture, match="without any feed-forward part"):
        check_costed(bare, "training step time and memory")


def test_decode_reads_kv_of_attention_layers_and_the_whole_state() -> None:
    m = load_model(NANO)
    ctx = make_context(m, load_device("h100-sxm-80gb"), make_workload(isl=1024, osl=256), devices_per_node=8)
    tab = ServingTable({"tp": [1]})
    B = 16.0

    def dec(n_dec, c):
        return iteration(
            ctx, tab, n_dec=n_dec, n_pre=0.0, dec_ctx=c, pre_ctx=0.0, pre_len=1.0, logit_rows=n_dec
        )

    kv_tok = 6 * (2 * 2 * 128) * 2  # bytes per cached token: the 6 attention layers only
    grow = dec(B, 2000.0)["bytes_per_device"][0] - dec(B, 1000.0)["bytes_per_device"][0]
    assert grow == pytest.approx(B * 1000 * kv_tok, rel=1e-9)
    # each decoding sequence reads and rewrites its whole recurrent state (23 Mamba2 layers)
    state = 23 * (3 * (4096 + 2 * 8 * 128) + 4096 * 128) * 2
    st_fl, st_el = hybrid.decode_state_step(m, np.array([1.0]))
    assert 52 * st_el[0] * 2 == pytest.approx(2 * state, rel=1e-12)
    # prefill runs the chunked scan: its FLOPs are in the iteration's count
    pre = iteration(
        ctx, tab, n_dec=0.0, n_pre=4096.0, dec_ctx=0.0, pre_ctx=2048.0, pre_len=4096.0, logit_rows=1.0
    )
    scan = 52 * hybrid.scan_flops_per_token(m, 1.0) * 4096
    assert pre["flops_per_device"][0] > scan > 0
