"""Deployment knobs of `autopar serve` that change costs (issue 23 item 4)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import ServingTable, make_context, make_workload, steady_state
from autopar.serving.search import serve

ROOT = Path(__file__).resolve().parent.parent
KW = dict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=2, isl=8000, osl=200, top=1)


def state(h: float, batch: float = 32.0):
    w = make_workload(isl=8000, osl=200, prefix_cache_hit_rate=h)
    ctx = make_context(load_model("llama-3.1-8b"), load_device("h100-sxm-80gb"), w, devices_per_node=8)
    tab = ServingTable({"tp": 1.0, "pp": 1.0, "ep": 1.0, "conc": batch, "cap_w": 0.0})
    return steady_state(ctx, tab, np.array([batch]), budget=np.array([16384.0]))


def test_prefix_cache_hits_are_not_prefilled_again() -> None:
    cold, half, warm = state(0.0), state(0.5), state(0.9)
    # the prefill tokens each iteration computes shrink with the share of the prompt cached
    assert half["prefill_tokens_per_iter"][0] == pytest.approx(cold["prefill_tokens_per_iter"][0] * 0.5)
    assert warm["prefill_tokens_per_iter"][0] == pytest.approx(cold["prefill_tokens_per_iter"][0] * 0.1)
    assert cold["ttft"][0] > half["ttft"][0] > warm["ttft"][0]
    assert cold["tpot"][0] > half["tpot"][0] > warm["tpot"][0]  # fewer prefill tokens ride along
    # ...but the cached tokens are still attended to: more than a prompt of 10% the length costs
    w = make_workload(isl=800, osl=200)
    ctx = make_context(load_model("llama-3.1-8b"), load_device("h100-sxm-80gb"), w, devices_per_node=8)
    tab = ServingTable({"tp": 1.0, "pp": 1.0, "ep": 1.0, "conc": 32.0, "cap_w": 0.0})
    short = steady_state(ctx, tab, np.array([32.0]), budget=np.array([16384.0]))
    assert warm["ttft"][0] > short["ttft"][0]


def test_prefix_cache_hit_rate_raises_what_serve_finds() -> None:
    cold = serve(**KW)
    warm = serve(**KW, prefix_cache_hit_rate=0.8)
    assert warm.best["output_tokens_per_s"] > cold.best["output_tokens_per_s"] * 1.2
    assert warm.to_dict()["workload"]["prefix_cache_hit_rate"] == 0.8
    assert serve(**KW, prefix_cache_hit_rate=0.0).best == cold.best


@pytest.mark.parametrize("value", ["1", "-0.1", "nan"])
def test_bad_prefix_cache_hit_rate_exits_2(value: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb",
         "--num-devices", "1", "--isl", "100", "--osl", "10", "--prefix-cache-hit-rate", value],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "prefix" in p.stderr


def test_speculation_tokens_per_step() -> None:
    from autopar.serving.estimate import speculation

    assert speculation(make_workload(isl=10, osl=10)) == (1.0, 1.0)
    q, tau = speculation(make_workload(isl=10, osl=10, speculative_tokens=3, acceptance_rate=0.5))
    assert q == 4.0 and tau == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def _spec(k: int, a: float | None, conc: int) -> dict:
    extra = dict(speculative_tokens=k, acceptance_rate=a) if k else {}
    r = serve(model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=8, isl=1000, osl=1000,
              concurrency=conc, tp=8, top=1, **extra)  # fmt: skip
    return r.best


def test_speculative_decoding_is_costed_not_just_accepted() -> None:
    plain, good, poor = _spec(0, None, 16), _spec(3, 0.7, 16), _spec(3, 0.05, 16)
    # memory-bound decode at low concurrency: verifying 4 tokens costs little more than 1
    assert good["output_tokens_per_s_per_user"] > 1.8 * plain["output_tokens_per_s_per_user"]
    # ...but the draft layers and the verification are paid for: a poor acceptance loses
    assert poor["output_tokens_per_s_per_user"] < plain["output_tokens_per_s_per_user"]
    # at a large batch decode turns compute-bound and the gain shrinks
    big_plain, big_good = _spec(0, None, 256), _spec(3, 0.7, 256)
    gain_small = good["output_tokens_per_s"] / plain["output_tokens_per_s"]
    assert big_good["output_tokens_per_s"] / big_plain["output_tokens_per_s"] < gain_small


def test_speculative_tokens_need_an_acceptance_rate() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb",
         "--num-devices", "1", "--isl", "100", "--osl", "10", "--speculative-tokens", "2"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 2 and p.stdout == "" and "acceptance_rate" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("device", "wp", "gemms"),
    [
        ("b200", "nvfp4", "nvfp4"),  # FP4 tensor cores: W4A4 GEMMs
        ("b200", "mxfp4", "mxfp4"),
        ("h100-sxm-80gb", "nvfp4", "bf16"),  # no FP4 on Hopper: dequantized 16-bit GEMMs
        ("h100-sxm-80gb", "fp8-block", "fp8-block"),
        ("h100-sxm-80gb", "int8", "bf16"),  # weight-only
    ],
)
def test_weight_formats_set_the_gemms_and_the_bytes(device: str, wp: str, gemms: str) -> None:
    from autopar.serving.estimate import WEIGHT_BYTES

    r = serve(model="llama-3.1-8b", device=device, num_devices=1, isl=1000, osl=200, concurrency=8,
              weight_precision=wp, top=1)  # fmt: skip
    assert r.costing["compute_precision"] == gemms
    bf16 = serve(model="llama-3.1-8b", device=device, num_devices=1, isl=1000, osl=200, concurrency=8, top=1)
    w, w16 = r.best["memory_gib_per_device"]["weights"], bf16.best["memory_gib_per_device"]["weights"]
    assert WEIGHT_BYTES[wp] < 1.1 and w < w16 * 0.6
    # small-batch decode reads the weights: fewer bytes per weight, faster per user
    assert r.best["output_tokens_per_s_per_user"] > bf16.best["output_tokens_per_s_per_user"]


def test_fp4_gemms_beat_dequantized_ones_at_a_compute_bound_batch() -> None:
    kw = dict(
        model="llama-3.1-70b",
        device="b200",
        num_devices=1,
        isl=4000,
        osl=100,
        offline=True,
        top=1,
        kv_precision="fp8",
    )
    nv = serve(**kw, weight_precision="nvfp4").best
    w4 = serve(**kw, weight_precision="int4").best  # about the same 4-bit weights, 16-bit GEMMs
    assert nv["output_tokens_per_s"] > 1.3 * w4["output_tokens_per_s"]


def _moe_state(imbalance: float, ep: float, model: str = "qwen3-30b-a3b") -> dict:
    w = make_workload(isl=1024, osl=256, expert_imbalance=imbalance)
    ctx = make_context(load_model(model), load_device("h100-sxm-80gb"), w, devices_per_node=8)
    tab = ServingTable({"tp": 8.0, "pp": 1.0, "ep": ep, "adp": 8.0, "conc": 256.0, "cap_w": 0.0})
    return steady_state(ctx, tab, np.array([256.0]), budget=np.array([8192.0]))


def test_expert_imbalance_slows_the_busiest_expert_parallel_rank() -> None:
    """With EP the MoE layer waits for the rank that routed tokens load most: its expert GEMMs run
    imbalance x the balanced rows and it receives imbalance x the balanced all-to-all share."""
    even, skewed = _moe_state(1.0, 8.0), _moe_state(1.5, 8.0)
    assert skewed["tpot"][0] > even["tpot"][0] and skewed["ttft"][0] > even["ttft"][0]
    assert make_workload(isl=10, osl=10).expert_imbalance == 1.0  # balanced unless stated
    # every rank holding every expert (ep = 1): no rank is busier than another
    assert _moe_state(1.5, 1.0)["tpot"][0] == pytest.approx(_moe_state(1.0, 1.0)["tpot"][0], rel=1e-12)
    # a dense model has no experts to imbalance
    w1, w2 = make_workload(isl=1024, osl=256), make_workload(isl=1024, osl=256, expert_imbalance=2.0)
    dense = [
        steady_state(
            make_context(load_model("llama-3.1-8b"), load_device("h100-sxm-80gb"), w, devices_per_node=8),
            ServingTable({"tp": 8.0, "pp": 1.0, "ep": 1.0, "conc": 64.0, "cap_w": 0.0}),
            np.array([64.0]),
            budget=np.array([8192.0]),
        )["tpot"][0]
        for w in (w1, w2)
    ]
    assert dense[0] == pytest.approx(dense[1], rel=1e-12)


@pytest.mark.parametrize("value", ["0.9", "nan"])
def test_bad_expert_imbalance_exits_2(value: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "serve", "--model", "qwen3-30b-a3b", "--device", "h100-sxm-80gb",
         "--num-devices", "8", "--isl", "100", "--osl", "10", "--expert-imbalance", value],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "imbalance" in p.stderr
