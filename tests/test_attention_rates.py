"""The device profiles' attention curves are the ones studies/attention_rates.py derives from
AIConfigurator's measured context-attention tables (the optional extra ``aiconfigurator``), and the
latency model charges attention at them; table checks skip, saying why, without the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from autopar.hardware import attention_fraction, load_device

STUDIES = Path(__file__).resolve().parent.parent / "studies"
# Profiles that carry a die-mate's measured curve (same die: the fraction of peak carries over).
CARRIED = {
    "a100-40gb": "a100-80gb",
    "a100-pcie-80gb": "a100-80gb",
    "h800-sxm-80gb": "h100-sxm-80gb",
    "h100-sxm-96gb": "h100-sxm-80gb",
    "gh200": "h100-sxm-80gb",
}


def _study():
    pytest.importorskip("aiconfigurator_core", reason="the aiconfigurator extra is not installed")
    pytest.importorskip("pyarrow", reason="pyarrow (the aiconfigurator extra) is not installed")
    sys.path.insert(0, str(STUDIES))
    import attention_rates

    return attention_rates


@pytest.mark.parametrize(
    "device_id",
    ["a100-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200", "gb200-nvl72", "b300", "gb300-nvl72", *CARRIED],
)
def test_profile_attention_curves_are_the_measured_ones(device_id: str) -> None:
    study = _study()
    measured = study.rates(CARRIED.get(device_id, device_id))
    prof = load_device(device_id)
    assert measured, f"no attention table for {device_id}"
    assert set(prof.efficiency.attention_fwd) == set(measured)
    for d, pts in measured.items():
        got = prof.efficiency.attention_fwd[d]
        assert [s for s, _ in got] == [s for s, _ in pts]
        assert [f for _, f in got] == pytest.approx([f for _, f in pts], abs=5e-4), d
        assert "studies/attention_rates.py" in prof.provenance[f"efficiency.attention_fwd.{d}"]


def test_blackwell_attention_is_not_the_peak_ratio() -> None:
    # FlashAttention-4's point, measured: B200's dense bf16 peak is 2.27x H100's, its causal attention
    # at head dim 128 and 8k tokens ~2.1x; B300 doubles the exponential rate and gains ~1.2x over B200.
    h, b, u = (load_device(d) for d in ("h100-sxm-80gb", "b200", "b300"))

    def rate(dev, d=128.0, s=8192.0):
        return float(attention_fraction(dev.efficiency.attention_fwd, d, s)) * dev.peak_tflops["bf16"]

    assert 1.8 < rate(b) / rate(h) < 2.2 < b.peak_tflops["bf16"] / h.peak_tflops["bf16"]
    assert 1.1 < rate(u) / rate(b) < 1.4


def test_flashattention2_stacks_on_blackwell_run_the_measured_fa2_rate() -> None:
    # torchtitan / FSDP run PyTorch SDPA's flash backend, FlashAttention-2, whose Ampere-style mma.sync
    # kernels do not use Blackwell's tcgen05 tensor cores: one benchmark script (flash-attention's
    # benchmark_flash_attention.py, batch 2, seq 8192, Azure's AI-benchmarking-guide) measured
    # 373.9 TFLOP/s on GB200 and 327.9 on H100, 1.14x, where the dense bf16 peaks differ 2.5x. The
    # profiles' FA2 rate (measured curve / fused_attention_speedup) at head dim 128, 8k must keep that
    # ratio (B200: GB200's rate x 2.25/2.5 PF; Blackwell Ultra not measured, carried), and H100's must
    # agree with Azure's own H100 figure.
    def fa2(dev_id: str) -> float:
        dev = load_device(dev_id)
        eff = dev.efficiency
        curve = float(attention_fraction(eff.attention_fwd, 128.0, 8192.0)) * dev.peak_tflops["bf16"]
        return curve / eff.fused_attention_speedup

    h = fa2("h100-sxm-80gb")
    assert h == pytest.approx(327.9, rel=0.01)
    assert fa2("gb200-nvl72") / h == pytest.approx(373.9 / 327.9, rel=0.01)
    assert fa2("b200") / h == pytest.approx(373.9 / 327.9 * 2.25 / 2.5, rel=0.01)
    assert fa2("gb300-nvl72") == pytest.approx(fa2("gb200-nvl72"), rel=0.01)
    assert fa2("b300") == pytest.approx(fa2("b200"), rel=0.01)
    for d in ("b200", "gb200-nvl72", "b300", "gb300-nvl72"):  # cuDNN (TE) keeps the measured curve
        assert load_device(d).efficiency.fused_attention_speedup > 3.0


def test_interpolation_is_log_linear_and_held_at_the_ends() -> None:
    curve = {64: [(1024.0, 0.2), (4096.0, 0.4)], 256: [(1024.0, 0.3), (4096.0, 0.6)]}
    assert float(attention_fraction(curve, 64, 2048)) == pytest.approx(0.3)  # midway in log sequence
    assert float(attention_fraction(curve, 128, 1024)) == pytest.approx(0.25)  # midway in log head dim
    assert float(attention_fraction(curve, 512, 1 << 20)) == pytest.approx(0.6)  # held beyond the ends
    assert float(attention_fraction(curve, 32, 16)) == pytest.approx(0.2)
    got = attention_fraction(curve, 64, np.array([1024.0, 4096.0]))
    assert got.tolist() == pytest.approx([0.2, 0.4])


def test_attention_is_charged_at_the_measured_rate_by_hand() -> None:
    # With a measured curve the attention core is its causal FLOPs at the curve's rate (exponentials
    # included: no SFU term), times the fitted scale; backward 2.5x forward; FlashAttention-2 stacks
    # run 1/fused_attention_speedup of it.
    from dataclasses import replace

    from test_stack_time import CO, TORCHTITAN, _model, _slot

    s, a, d, L = 4096, 32, 128, 2
    model = _model(4096, L, a, d)
    curve = {64: [(1024.0, 0.2), (16384.0, 0.4)], 128: [(1024.0, 0.3), (16384.0, 0.5)]}
    co = replace(CO, exp_rate=4e12, attention_fwd=curve, attention_scale=0.8, fused_attention_speedup=1.6)
    frac = 0.3 + 0.2 * np.log(s / 1024) / np.log(16)  # log-linear between the measured sequences
    fwd = a * 2 * s * s * (d + d) * 0.5  # causal: half the 4 s^2 a d of the full score matrix
    want = L * 3.5 * fwd / (100e12 * frac * 0.8 / 1.6)  # torchtitan: FlashAttention-2, not cuDNN
    assert _slot(model, TORCHTITAN, seq=s, co=co)["attention"][0] == pytest.approx(want, rel=1e-12)


def test_a_sliding_window_costs_the_keys_it_attends_to() -> None:
    # Query i of a causal window of w keys attends to min(i, w) of them: s*w - w^2/2 per head, the
    # count autopar.model uses for FLOPs; the attention core's time follows it (rate held constant).
    from dataclasses import replace

    from test_stack_time import CO, MEGATRON, _model, _slot

    from autopar.model import load_model

    s, w, L = 4096, 1024, 2
    co = replace(CO, gemm_half_dim=1e-9, exp_rate=0.0)  # the same rate at every length
    full = _model(1024, L, 16, 64)
    win = load_model({**full.model_dump(), "name": "win", "sliding_window": w, "sliding_window_layers": L})
    ratio = (
        _slot(win, MEGATRON, seq=s, co=co)["attention"][0]
        / _slot(full, MEGATRON, seq=s, co=co)["attention"][0]
    )
    assert ratio == pytest.approx((w - w * w / (2 * s)) / (s / 2), rel=1e-9)
    assert ratio == pytest.approx(win._context(s, w, True) / full._context(s, 0, True), rel=1e-9)


def test_curve_less_devices_take_the_measured_devices_attention_ratio() -> None:
    """A device with a measured kernel is charged the curve times the fitted attention_scale; the
    transfer ratio for devices without one is what that rate is over the estimate path's rate on the
    measured devices (hand computation at head dim 128, 8k keys, with the SFU exponentials in series),
    and a curve-less profile is charged its estimate times that ratio."""
    from autopar.calibration.fit import TRANSFER_ATTENTION_SHAPE, measured_attention_ratio
    from autopar.coefficients import coefficients_for, load_calibration

    cal = load_calibration()
    h100 = load_device("h100-sxm-80gb")
    co, _ = coefficients_for(h100, cal)
    hd, s = TRANSFER_ATTENTION_SHAPE
    achieved = float(attention_fraction(h100.efficiency.attention_fwd, hd, s)) * co.attention_scale
    peak = h100.peak_tflops["bf16"] * 1e12
    matmul = 1.0 / (h100.efficiency.attention * s / (s + co.gemm_half_dim))  # seconds x peak per flop
    exps = peak / (512.0 * co.exp_rate)  # one exponential per 2 (d_qk + d_v) = 512 flops
    assert measured_attention_ratio(h100, cal) == pytest.approx(achieved * (matmul + exps), rel=1e-12)
    assert 0.3 < measured_attention_ratio(h100, cal) < 1.0  # training runs below the estimate
    mi300x = load_device("mi300x")
    assert not mi300x.efficiency.attention_fwd and measured_attention_ratio(mi300x, cal) is None
    co_amd, _ = coefficients_for(mi300x, cal)
    assert co_amd.attention_eff == pytest.approx(mi300x.efficiency.attention * cal.transfer.attention_ratio)
