"""Golden tests of the per-stack TIME settings (autopar.frameworks -> autopar.latency.stage_slot):
the unfused attention core (time and activation memory), the host floor and the TP overlap."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autopar import collectives as C
from autopar import predict
from autopar.frameworks import DEEPSPEED, MEGATRON, PROFILES, TORCHTITAN
from autopar.latency import Coefficients, stage_slot
from autopar.layout import Layout, LayoutTable
from autopar.memory import memory_breakdown
from autopar.model import load_model

# Round coefficients so that every golden below is a hand computation.
CO = Coefficients(
    peak_flops={"bf16": 100e12, "fp32": 50e12},
    gemm_eff={"bf16": 0.5},
    gemm_half_dim=64.0,
    attention_eff=0.4,
    hbm_bw=1e12,
    overlap_contention=0.5,
    tp_overlap=0.8,
    kernel_overhead_s=0.0,
)


def _model(h: int, layers: int, heads: int, d: int = 64):
    return load_model(
        dict(
            name=f"gpt-{h}",
            hidden=h,
            layers=layers,
            heads=heads,
            kv_heads=heads,
            head_dim=d,
            ffn_hidden=4 * h,
            vocab=1024,
            gated_mlp=False,
            norm="layernorm",
        )
    )


def _slot(model, profile, *, seq: int, tp: int = 1, co: Coefficients = CO):
    lay = LayoutTable.from_layouts([Layout(tp=tp, micro_batch=1)])
    n = np.array([float(model.layers)])
    return stage_slot(
        model,
        lay,
        seq_len=seq,
        links=_links(),
        co=co,
        n_dense=n,
        n_moe=np.zeros(1),
        head=np.zeros(1, dtype=bool),
        profile=profile,
    )


def _links() -> C.Links:
    from autopar.coefficients import coefficients_for
    from autopar.hardware import load_device

    dev = load_device("h100-sxm-80gb")
    _, lc = coefficients_for(dev)
    return C.Links.from_cluster(dev, 8, lc)


def _gemm(M: float, N: float, K: float, hd: float = 64.0) -> float:
    """CO's roofline by hand: 2MNK at 0.5 x 100 TFLOP/s x the tile factor, or 2(MK+KN+MN) bytes at 1 TB/s."""
    shape = (1 + 3 * hd / 16384) / (1 + hd / M + hd / N + hd / K)
    return max(2 * M * N * K / (100e12 * 0.5 * shape), 2 * (M * K + K * N + M * N) / 1e12)


def test_unfused_attention_time_is_the_hand_computation() -> None:
    # h=1024, 16 heads of 64, s=2048, mb=1, tp=1, two layers, bf16.
    s, a, d, L = 2048, 16, 64, 2
    model = _model(1024, L, a, d)
    got = _slot(model, DEEPSPEED, seq=s)["attention"][0]
    # Per head: QK^T (s x s, K=d) and PV (s x d, K=s) batched GEMMs, then masked fill (r+w 2 B each),
    # softmax (r+w) and dropout (r+w + 1-byte mask): 13 B per score at 1 TB/s.
    per_head = _gemm(s, s, d) + _gemm(s, d, s) + s * s * 13 / 1e12
    fwd = a * per_head
    assert got == pytest.approx(L * 3.0 * fwd, rel=1e-12)  # fwd + 2x bwd
    # FlashAttention on the same shape: causal 2·s²·(d+d)/2 per head at 0.4 x peak x s/(s+64), bwd 2.5x.
    flash = a * 2 * s * s * (d + d) * 0.5 / (100e12 * 0.4 * s / (s + 64.0))
    assert _slot(model, MEGATRON, seq=s)["attention"][0] == pytest.approx(L * 3.5 * flash, rel=1e-12)
    assert got > 3 * L * 3.5 * flash  # memory-bound over s² scores: several times the flash core


def test_unfused_attention_memory_adds_korthikanti_5as2b() -> None:
    s, a, b = 2048, 16, 2
    model = _model(1024, 4, a)
    lay = LayoutTable.from_layouts([Layout(micro_batch=b)])
    flash = memory_breakdown(model, lay, seq_len=s, profile=MEGATRON)["activations"][0]
    unfused = memory_breakdown(model, lay, seq_len=s, profile=DEEPSPEED)["activations"][0]
    # Per layer: 5·a·s²·b bytes (softmax output, dropout mask, dropout output) instead of flash's
    # fp32 log-sum-exp 4·s·b·a; 4 layers, one micro-batch in flight (pp=1).
    assert unfused - flash == pytest.approx(4 * (5 * a * s * s * b - 4 * s * b * a))


def test_host_floor_binds_for_a_tiny_layer_only() -> None:
    tiny = _model(256, 4, 4)
    sl = _slot(tiny, TORCHTITAN, seq=128)
    floor = 4 * TORCHTITAN.kernels_per_layer * TORCHTITAN.launch_latency_us * 1e-6
    assert sl["slot"][0] == pytest.approx(floor, rel=1e-12)  # 4 layers x 99 launches x 10 us
    no_floor = TORCHTITAN.model_copy(update={"launch_latency_us": 0.0})
    assert _slot(tiny, no_floor, seq=128)["slot"][0] < 0.2 * floor  # the GPU work alone is far less
    big = _model(4096, 4, 32, 128)
    assert _slot(big, TORCHTITAN, seq=4096)["slot"][0] == _slot(big, no_floor, seq=4096)["slot"][0]
    # Full recompute relaunches the forward third of the kernels.
    lay = LayoutTable.from_layouts([Layout(micro_batch=1, recompute="full")])
    full = stage_slot(
        tiny,
        lay,
        seq_len=128,
        links=_links(),
        co=CO,
        n_dense=np.array([4.0]),
        n_moe=np.zeros(1),
        head=np.zeros(1, dtype=bool),
        profile=TORCHTITAN,
    )
    assert full["slot"][0] == pytest.approx(floor * 4 / 3, rel=1e-12)


def test_tp_overlap_only_where_the_stack_overlaps() -> None:
    model = _model(4096, 2, 32, 128)
    meg = _slot(model, MEGATRON, seq=4096, tp=2)
    sync = _slot(model, MEGATRON.model_copy(update={"tp_comm_overlap": False}), seq=4096, tp=2)
    raw = meg["tp_raw"][0]
    assert raw > 0 and sync["tp_raw"][0] == raw
    assert sync["tp_comm"][0] == pytest.approx(raw)  # all exposed
    assert meg["tp_comm"][0] == pytest.approx(raw * (1 - 0.8) + 0.5 * 0.8 * raw)
    assert sync["tp_exposed"][0] == pytest.approx(raw) and meg["tp_exposed"][0] == pytest.approx(0.2 * raw)


KW = dict(device="h100-sxm-80gb", num_devices=8, seq_len=2048, global_batch=8, tp=1, dp=8, zero=1)


def test_stack_moves_small_model_not_large_gemm_bound_one() -> None:
    small = _model(256, 4, 4)
    t_meg = predict(model=small, **{**KW, "seq_len": 128}, framework="megatron").step_time_s
    t_tt = predict(model=small, **{**KW, "seq_len": 128}, framework="torchtitan").step_time_s
    assert t_tt > 1.5 * t_meg  # 99 vs 36 launches per layer bind the tiny layers
    # Llama-3.1-8B at s=2048: every layer is milliseconds of GEMMs, neither floor binds, tp=1 has no
    # TP overlap to differ, and on A100 both run FlashAttention-2 (TE picks cuDNN only on sm90+):
    # the same compute; only the data-parallel term differs, by each stack's fitted overlap
    # contention (torchtitan's hidden collectives cost more than Megatron's). Memory differs.
    a100 = {**KW, "device": "a100-80gb"}
    big_meg = predict(model="llama-3.1-8b", **a100, framework="megatron")
    big_tt = predict(model="llama-3.1-8b", **a100, framework="torchtitan")
    for part in ("gemm", "attention", "elementwise", "recompute", "tp_comm", "pipeline_bubble"):
        assert big_meg.time_breakdown[part] == big_tt.time_breakdown[part], part
    extra = big_tt.step_time_s - big_meg.step_time_s
    assert extra == pytest.approx(big_tt.time_breakdown["dp_comm"] - big_meg.time_breakdown["dp_comm"])
    assert extra >= 0.0
    assert big_meg.memory_breakdown != big_tt.memory_breakdown
    h100_meg = predict(model="llama-3.1-8b", **KW, framework="megatron").step_time_s
    assert h100_meg < predict(model="llama-3.1-8b", **KW, framework="torchtitan").step_time_s


def test_every_profile_states_its_time_settings() -> None:
    for p in PROFILES.values():
        assert (
            p.attention in ("flash", "te", "unfused") and p.kernels_per_layer > 0 and p.launch_latency_us > 0
        )
    assert MEGATRON.attention == "te" and MEGATRON.flash_attention and MEGATRON.tp_comm_overlap
    assert not PROFILES["megatron-deepspeed"].flash_attention
    assert not PROFILES["megatron-deepspeed"].tp_comm_overlap


def test_te_attention_runs_cudnn_where_the_device_has_it() -> None:
    # Transformer Engine (Megatron) runs cuDNN fused attention on sm90+, at the device's
    # fused_attention_speedup over the FlashAttention-2 rate attention_eff describes; torchtitan's
    # SDPA flash backend does not get it.
    s, a, d, L = 4096, 32, 128, 2
    model = _model(4096, L, a, d)
    flash = L * 3.5 * a * 2 * s * s * (d + d) * 0.5 / (100e12 * 0.4 * s / (s + 64.0))
    co = replace(CO, fused_attention_speedup=1.6)
    meg = _slot(model, MEGATRON, seq=s, co=co)["attention"][0]
    assert meg == pytest.approx(flash / 1.6, rel=1e-12)
    assert _slot(model, TORCHTITAN, seq=s, co=co)["attention"][0] == pytest.approx(flash, rel=1e-12)
    # The shipped devices: 1.6 on Hopper (FA3 paper's cuDNN / FA2 ratio), 1 on Ampere.
    from autopar.coefficients import coefficients_for
    from autopar.hardware import load_device

    assert coefficients_for(load_device("h100-sxm-80gb"))[0].fused_attention_speedup == 1.6
    assert coefficients_for(load_device("a100-80gb"))[0].fused_attention_speedup == 1.0


def test_ring_cp_step_by_hand() -> None:
    # cp=4 inside one 8-GPU NVLink node, tp=1, s=32768: each rank holds s/4 queries (chunks i and
    # 7-i). Attention: the rank's causal share s_loc·s/2 per head, its first ring step causal, the
    # other three unmasked (1.10x faster). Ring: 3 x (c-1) KV chunks of s_loc·2·g·d bf16 per layer
    # (KV fwd, KV + dKV bwd) at the NVLink bus rate, hidden behind that attention; the hidden
    # transfer costs the compute its HBM traffic (read to send, write on receipt), 2 x bytes / HBM.
    s, c, a, d, L = 32768, 4, 16, 64, 2
    model = _model(1024, L, a, d)
    links = _links()
    lay = LayoutTable.from_layouts([Layout(cp=c, micro_batch=1)])
    sl = stage_slot(
        model,
        lay,
        seq_len=s,
        links=links,
        co=CO,
        n_dense=np.array([float(L)]),
        n_moe=np.zeros(1),
        head=np.zeros(1, dtype=bool),
        profile=MEGATRON,
    )
    s_loc = s / c
    causal = a * 2 * s_loc * s * (d + d) * 0.5 / (100e12 * 0.4 * s / (s + 64.0))
    attn = L * 3.5 * causal * (1 / c + (1 - 1 / c) / 1.10)
    assert sl["attention"][0] == pytest.approx(attn, rel=1e-12)
    ring_bytes = L * 3 * (c - 1) * s_loc * 2 * a * d * 2.0
    assert sl["cp_raw"][0] == pytest.approx(ring_bytes / links.up_agg, rel=1e-12)
    assert sl["cp_raw"][0] < attn and sl["cp_comm"][0] == 0.0  # fully hidden
    # Same tokens per rank without CP (seq s/4, cp=1): the same elementwise work, no ring.
    lay1 = LayoutTable.from_layouts([Layout(cp=1, micro_batch=1)])
    base = stage_slot(
        model,
        lay1,
        seq_len=int(s_loc),
        links=links,
        co=CO,
        n_dense=np.array([float(L)]),
        n_moe=np.zeros(1),
        head=np.zeros(1, dtype=bool),
        profile=MEGATRON,
    )
    contention = sl["elementwise"][0] - base["elementwise"][0]
    assert contention == pytest.approx(2 * ring_bytes / 1e12, rel=1e-9)
    # Not the collectives' calibrated overlap_contention x hidden time: that coefficient plays no part.
    other = stage_slot(
        model,
        lay,
        seq_len=s,
        links=links,
        co=replace(CO, overlap_contention=0.9),
        n_dense=np.array([float(L)]),
        n_moe=np.zeros(1),
        head=np.zeros(1, dtype=bool),
        profile=MEGATRON,
    )
    assert other["slot"][0] == sl["slot"][0]


def test_deepspeed_zero3_fetch_rate_adds_its_software_time_by_hand() -> None:
    """DeepSpeed's ZeRO-3 gathers (forward, backward) and gradient reduce-scatter each pay the
    parameter bytes at 24 GB/s on top of the wire; the same stack wire-bound pays the wire alone."""
    from autopar.latency import data_parallel_tail

    model = _model(1024, 4, 16)
    links = _links()
    lay = LayoutTable.from_layouts([Layout(dp=64, zero=3, micro_batch=1)])
    P = np.array([1e9])
    zero = np.zeros(1)
    big = np.array([1e6])  # a compute window far longer than any collective: nothing exposed

    def tail(profile, window):
        co = replace(CO, overlap_contention=1.0)  # hidden communication costs its full time
        return data_parallel_tail(
            model,
            lay,
            links=links,
            co=co,
            nonexpert_params=P,
            expert_params=zero,
            fwd=window,
            bwd=window,
            recompute=zero,
            profile=profile,
        )

    wire_bound = DEEPSPEED.model_copy(update={"zero3_fetch_gbps": None})
    ds, mg = tail(DEEPSPEED, big), tail(wire_bound, big)
    assert DEEPSPEED.zero3_fetch_gbps == 24.0 and MEGATRON.zero3_fetch_gbps is None
    # fp16/bf16 parameters: 2 B each; 2 gathers + 1 reduce-scatter per micro-batch, one micro-batch.
    sw = 3 * 1e9 * 2 / 24e9
    assert ds["dp_per_mb"][0] - mg["dp_per_mb"][0] == pytest.approx(sw, rel=1e-12)
    assert ds["dp_comm"][0] - mg["dp_comm"][0] == pytest.approx(sw, rel=1e-12)
    # ZeRO-1 keeps the stack's wire-bound once-per-step collectives.
    lay1 = LayoutTable.from_layouts([Layout(dp=64, zero=1, micro_batch=1)])
    t1 = [
        data_parallel_tail(
            model,
            lay1,
            links=links,
            co=CO,
            nonexpert_params=P,
            expert_params=zero,
            fwd=big,
            bwd=big,
            recompute=zero,
            profile=p,
        )["dp_per_step"][0]
        for p in (DEEPSPEED, wire_bound)
    ]
    assert t1[0] == t1[1]


def test_softmax_exponentials_on_the_sfu_by_hand() -> None:
    # One exponential per causal score element per head forward and one more backward (FlashAttention
    # recomputes P), at the device's SFU rate, in series with the matmuls (whose time is unchanged).
    s, a, d, L = 4096, 32, 128, 2
    model = _model(4096, L, a, d)
    flash = L * 3.5 * a * 2 * s * s * (d + d) * 0.5 / (100e12 * 0.4 * s / (s + 64.0))
    exps = L * 2 * a * s * s * 0.5  # fwd + bwd, causal
    co = replace(CO, exp_rate=4e12)
    got = _slot(model, TORCHTITAN, seq=s, co=co)["attention"][0]
    assert got == pytest.approx(flash + exps / 4e12, rel=1e-12)
    # Head dim 64 halves the matmul FLOPs per exponential: the SFU share doubles.
    m64 = _model(4096, L, 2 * a, 64)
    flash64 = L * 3.5 * 2 * a * 2 * s * s * (64 + 64) * 0.5 / (100e12 * 0.4 * s / (s + 64.0))
    got64 = _slot(m64, TORCHTITAN, seq=s, co=co)["attention"][0]
    assert got64 == pytest.approx(flash64 + 2 * exps / 4e12, rel=1e-12)


def test_sfu_rates_of_the_shipped_devices() -> None:
    from autopar.coefficients import coefficients_for
    from autopar.hardware import load_device

    rate = {
        d: coefficients_for(load_device(d))[0].exp_rate
        for d in ("h100-sxm-80gb", "b200", "b300", "a100-80gb")
    }
    assert rate["h100-sxm-80gb"] == pytest.approx(67e12 / 16)  # FA3 paper: ~3.9 T exp/s
    assert rate["b200"] == pytest.approx(75e12 / 16)  # tensor cores 2.3x H100, SFU 1.1x
    assert rate["b300"] == pytest.approx(2 * 75e12 / 16)  # Blackwell Ultra doubles MUFU.EX2
    assert rate["a100-80gb"] == pytest.approx(19.5e12 / 8)  # GA100: 16 SFU per 64 FP32 lanes
    # No sourced transcendental rate for other vendors: not charged apart from the attention rate.
    assert coefficients_for(load_device("mi300x"))[0].exp_rate == 0.0


def test_torchtitan_fsdp_under_pp_reduces_once_per_step() -> None:
    # torch.distributed.pipelining turns FSDP's gradient sync off until the step's last backward: per
    # micro-batch the two all-gathers of ZeRO-3 (reshard after forward, as the export writes), per step
    # one reduce-scatter. Without PP (or with the flag off) FSDP's usual ZeRO-3 traffic.
    from autopar.latency import data_parallel_tail

    model = _model(2048, 8, 16, 128)
    links = _links()
    params = np.array([1e9])
    z = np.zeros(1)

    def lay(pp):
        return LayoutTable.from_layouts([Layout(pp=pp, dp=8, zero=3, micro_batch=1, grad_accum=4)])

    def tail(profile, pp):
        return data_parallel_tail(
            model, lay(pp), links=links, co=CO, nonexpert_params=params, expert_params=z,
            fwd=np.ones(1), bwd=np.ones(1), recompute=z, profile=profile,
        )  # fmt: skip

    plain = TORCHTITAN.model_copy(update={"fsdp_pp_defer": False})
    ag = C.all_gather(links, 1e9 * 2.0, np.array([8.0]), np.array([1.0]))[0]  # bf16 parameters
    rs = C.reduce_scatter(links, 1e9 * 4.0, np.array([8.0]), np.array([1.0]))[0]  # fp32 reduce dtype
    d, p = tail(TORCHTITAN, 2), tail(plain, 2)
    assert d["dp_per_mb"][0] == pytest.approx(2 * ag, rel=1e-9)
    assert p["dp_per_mb"][0] == pytest.approx(2 * ag + rs, rel=1e-9)
    assert d["dp_per_step"][0] - p["dp_per_step"][0] == pytest.approx(rs, rel=1e-9)
    assert tail(TORCHTITAN, 1)["dp_per_mb"][0] == pytest.approx(tail(plain, 1)["dp_per_mb"][0])
    # and the stage holds its unsharded fp32 gradients for the step
    mem = {
        name: memory_breakdown(model, lay(2), seq_len=2048, profile=prof)["zero3_buffers"][0]
        for name, prof in (("defer", TORCHTITAN), ("plain", plain.model_copy(update={"name": "plain"})))
    }
    assert mem["defer"] - mem["plain"] > 0
