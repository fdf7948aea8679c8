"""The device profiles' GEMM rates are the ones studies/gemm_rates.py derives from AIConfigurator's
measured kernel tables (the optional extra ``aiconfigurator``); skipped, saying why, without it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autopar.hardware import load_device

pytest.importorskip("aiconfigurator_core", reason="the aiconfigurator extra is not installed")
pytest.importorskip("pyarrow", reason="pyarrow (the aiconfigurator extra) is not installed")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "studies"))
import gemm_rates  # noqa: E402


@pytest.mark.parametrize("device_id", sorted(gemm_rates.SYSTEMS))
def test_profile_gemm_rates_are_the_measured_ones(device_id: str) -> None:
    measured = gemm_rates.rates(device_id)
    prof = load_device(device_id)
    assert measured, f"no GEMM table for {device_id}"
    for prec, row in measured.items():
        if prec == "mxfp8" and "fp4" not in prof.peak_tflops:
            continue  # Hopper cannot run MXFP8 (autopar.precision.REQUIRES): not in its profile
        assert prof.efficiency.gemm[prec] == pytest.approx(row["efficiency"], abs=5e-4), prec
        assert "studies/gemm_rates.py" in prof.provenance[f"efficiency.gemm.{prec}"]
        assert row["shapes"] >= 90  # the geometric mean runs over (most of) the 147-shape training grid


def test_blackwell_fp8_reaches_far_less_of_its_peak_than_bf16() -> None:
    # The measured tables, not a datasheet ratio: FP8 per-tensor GEMMs on B200 reach ~50% of the FP8
    # peak where bf16 reaches ~66% of its own, so FP8 speeds a GEMM up ~1.5x, not the 2x of the peaks.
    r = gemm_rates.rates("b200")
    assert r["fp8"]["efficiency"] < r["bf16"]["efficiency"] - 0.1
    assert 1.3 < 2 * r["fp8"]["efficiency"] / r["bf16"]["efficiency"] < 1.7
