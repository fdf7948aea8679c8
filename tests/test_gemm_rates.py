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
        hd = (
            prof.efficiency.gemm_half_dim
            if prec == "bf16"
            else prof.efficiency.gemm_half_dim_by_precision[prec]
        )
        assert hd == pytest.approx(row["half_dim"], abs=0.5), prec
        assert row["shapes"] >= 300  # the whole training-size grid (5 x 10 x 10 shapes, a few missing)
        assert row["rms_log_error"] < 0.35  # the shape law follows the measured rates


def test_blackwell_fp8_needs_far_larger_gemms_than_bf16() -> None:
    # The measured tables, not a datasheet ratio: FP8 per-tensor GEMMs on B200 reach their rate only at
    # shapes ~10x larger than bf16 ones (half-dimension ~2,250 against ~170), so at a training shape of
    # 8192^3 FP8 is ~1.6x bf16, not the 2x of the peaks.
    from autopar.latency import MAMF_REFERENCE_DIM as R

    r = gemm_rates.rates("b200")
    assert r["fp8"]["half_dim"] > 8 * r["bf16"]["half_dim"]

    def at(p, d=8192.0):
        e, h = r[p]["efficiency"], r[p]["half_dim"]
        return e * (1 + 3 * h / R) / (1 + 3 * h / d)

    assert 1.3 < 2 * at("fp8") / at("bf16") < 1.8
