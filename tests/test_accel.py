"""Accelerators beyond GPUs: memory tiers, chips to hold a model, the one power model (issue 15)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autopar.energy import average_power, comm_energy_j, idle_share, phase_power, tokens_per_kwh, usd_per_mtok
from autopar.errors import AutoparError, DeviceError
from autopar.hardware import TIER_NAMES, list_devices, load_device
from autopar.model import load_model
from autopar.serving.tiers import placement, weight_bytes

NEW = ["cerebras-cs3", "gaudi2", "gh200", "groq-lpu", "l40s", "mi250-gcd", "mi355x", "sn40l", "tpu-v5e"]


def _llama3_70b_bytes_by_hand() -> float:
    """Llama-3-70B (config.json: hidden 8192, 80 layers, 64 heads, 8 KV heads, head dim 128,
    FFN 28672, vocab 128256, untied head), every weight 16-bit."""
    h, L, kv, hd, f, v = 8192, 80, 8, 128, 28672, 128256
    per_layer = h * h + 2 * h * kv * hd + h * h + 3 * h * f + 2 * h
    return 2.0 * (L * per_layer + 2 * v * h + h)


def test_every_gpu_profile_has_one_implied_hbm_tier():
    for d in list_devices():
        p = load_device(d)
        if d in NEW:
            continue
        assert list(p.tiers()) == ["hbm"]
        assert p.tiers()["hbm"].capacity_gb == p.memory_gb
        assert p.system_chips == p.scale_up.domain


def test_new_profiles_tiers_are_ordered_and_sourced():
    for d in NEW:
        p = load_device(d)
        names = list(p.tiers())
        assert names == [t for t in TIER_NAMES if t in names]
        assert p.memory_kind in names
        assert not p.missing_provenance()
    assert list(load_device("sn40l").tiers()) == ["sram", "hbm", "ddr"]
    assert list(load_device("groq-lpu").tiers()) == ["sram"]
    assert load_device("cerebras-cs3").tiers()["external"].per_system


def test_vendor_claims_are_marked():
    assert "vendor claim" in load_device("groq-lpu").provenance["memory_bw_gbps"]
    assert "vendor claim" in load_device("sn40l").provenance["peak_tflops.bf16"]
    assert "low confidence" in load_device("cerebras-cs3").provenance["power.tdp_w"]


def test_bad_tier_is_refused(tmp_path):
    text = _h100_yaml().read_text() + "\nmemory_tiers:\n  l3cache: {capacity_gb: 1, bw_gbps: 1}\n"
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(DeviceError, match="unknown memory tier"):
        load_device(str(f))


def _h100_yaml():
    from autopar.hardware import _devices_dir

    return _devices_dir() / "h100-sxm-80gb.yaml"


def test_golden_chips_to_hold_llama3_70b_on_groq():
    groq = load_device("groq-lpu")
    m = load_model("llama-3.1-70b")  # Llama-3-70B dimensions
    by_hand = _llama3_70b_bytes_by_hand()
    assert weight_bytes(m, "bf16") == pytest.approx(by_hand)
    sram_per_chip = 220 * 2**20  # 220 MiB per TSP (accel_specs S069) = 230.7 MB
    assert groq.memory_gb * 1e9 == pytest.approx(sram_per_chip, rel=1e-3)
    r = placement(m, groq, batch=1, seq_len=1)
    assert r["chips_to_hold_weights"] == math.ceil(by_hand / (groq.memory_gb * 1e9)) == 612
    assert r["weight_tier"] == "sram"
    # fp8 weights halve the linear layers: fewer chips
    assert placement(m, groq, weight_precision="fp8")["chips_to_hold_weights"] < 612


def test_tier_that_must_hold_the_weights():
    m = load_model("llama-3.1-70b")
    cs3 = placement(m, load_device("cerebras-cs3"), batch=1, seq_len=2048, chips=[1, 4])
    assert list(cs3["weight_tier"]) == ["external", "sram"]  # 141 GB > 44 GB: stream from MemoryX
    assert cs3["decode_step_s"][0] > 100 * cs3["decode_step_s"][1]
    sn = placement(m, load_device("sn40l"), batch=1, seq_len=2048, chips=[1, 3])
    assert list(sn["weight_tier"]) == ["ddr", "hbm"]
    assert list(sn["decode_bound"]) == ["ddr", "hbm"]
    h = placement(m, load_device("h100-sxm-80gb"), batch=1, seq_len=2048, chips=1)
    assert h["weight_tier"] == "none" and np.isinf(h["decode_step_s"])


def test_batch_limit_and_phase_bounds_vectorized():
    m = load_model("llama-3.1-8b")
    dev = load_device("h100-sxm-80gb")
    r = placement(m, dev, batch=np.array([[1], [512]]), seq_len=np.array([512, 8192]), chips=1)
    assert r["chips"].shape == (2, 2)
    usable = dev.memory_gb * 1e9 - 2 * 2**30
    kv_tok = m.kv_cache_bytes_per_token(2.0)
    assert r["max_batch"][0, 0] == math.floor((usable - weight_bytes(m)) / (kv_tok * 512))
    assert r["decode_bound"][0, 0] == "hbm"  # batch 1 decode streams the weights
    assert r["prefill_bound"][1, 0] == "compute"  # 512 prompts of 512 tokens
    assert r["weight_tier"][1, 1] == "none"  # 512 x 8192 tokens of KV do not fit one H100


def test_placement_rejects_bad_input():
    m = load_model("llama-3.1-8b")
    with pytest.raises(AutoparError):
        placement(m, load_device("h100-sxm-80gb"), batch=0)
    with pytest.raises(AutoparError):
        placement(m, load_device("h100-sxm-80gb"), kv_precision="fp3")


@pytest.mark.parametrize(
    "device_id", ["h100-sxm-80gb", "a100-80gb", "mi300x", "gaudi2", "sn40l", "groq-lpu", "cerebras-cs3"]
)
def test_golden_idle_share_at_30_percent_utilization(device_id):
    p = load_device(device_id).power
    by_hand = 0.7 * p.idle_w / (0.7 * p.idle_w + 0.3 * p.tdp_w)
    assert idle_share(load_device(device_id), 0.3) == pytest.approx(by_hand)


def test_idle_share_is_higher_on_dataflow_parts_than_on_gpus():
    gpu = max(float(idle_share(load_device(d), 0.3)) for d in ("h100-sxm-80gb", "a100-80gb", "mi300x"))
    for d in ("gaudi2", "sn40l", "cerebras-cs3"):
        assert idle_share(load_device(d), 0.3) > gpu


def test_phase_power_prefill_above_decode_and_within_idle_tdp():
    dev = load_device("h100-sxm-80gb")
    prefill = phase_power(dev, 0.9, 0.3)
    decode = phase_power(dev, 0.05, 1.0)
    assert dev.power.idle_w < decode < prefill <= dev.power.tdp_w
    assert average_power(dev, 0.0, overhead=False) == dev.power.idle_w
    assert average_power(dev, 1.0, overhead=False) == dev.power.tdp_w


def test_energy_units():
    assert comm_energy_j(1e9, "scale_up", pj_per_bit=5.0) == pytest.approx(0.04)
    assert tokens_per_kwh(3.6) == pytest.approx(1e6)
    assert usd_per_mtok(3.6, 1000.0) == pytest.approx(1.0)


def test_serve_names_the_chips_and_tiers():
    import autopar
    from autopar.errors import InfeasibleError

    res = autopar.serve(
        model="llama-3.1-70b", device="sn40l", num_devices=16, isl=1024, osl=256, concurrency=8
    )
    note = next(n for n in res.notes if n.startswith("memory hierarchy"))
    assert "need 3 sn40l chips in hbm" in note and "(sram, hbm, ddr)" in note
    with pytest.raises(InfeasibleError, match="the weights alone need 612 groq-lpu chips in its sram"):
        autopar.serve(
            model="llama-3.1-70b", device="groq-lpu", num_devices=16, isl=1024, osl=256, concurrency=8
        )


def test_link_energy_in_serving_power():
    from autopar.serving.estimate import ServingTable, evaluate_serving, make_context, make_workload

    m = load_model("llama-3.1-70b")
    ctx = make_context(m, load_device("h100-sxm-80gb"), make_workload(isl=2048, osl=256), devices_per_node=8)
    r = evaluate_serving(ctx, ServingTable({"tp": [1.0, 8.0, 16.0], "pp": [4.0, 1.0, 1.0], "conc": 16.0}))
    lp = r["link_power_w"]
    assert lp[1] > 0 and lp[2] > lp[1]  # TP over scale-out (20 pJ/bit) costs more than in the node
    assert 0 < lp[0] < lp[1]  # pipeline sends only
    assert np.all(lp < 0.05 * r["power_w"])  # a few watts beside hundreds
