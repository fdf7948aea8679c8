"""Serving fidelity terms: the prefill attention efficiency from published forward-kernel figures."""

from __future__ import annotations

import pytest
import yaml

from autopar.coefficients import default_calibration_path, load_calibration
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import (
    PREFILL_ATTENTION_EFF,
    ServingTable,
    evaluate_serving,
    make_context,
    make_workload,
    prefill_attention_source,
)


def ttft_ms(device: str, cal=None, isl: int = 16000) -> float:
    w = make_workload(isl=isl, osl=100, concurrency=1, weight_precision="fp8")
    ctx = make_context(
        load_model("llama-3.1-8b"), load_device(device), w, devices_per_node=8, calibration=cal
    )
    res = evaluate_serving(ctx, ServingTable({"tp": 1.0, "pp": 1.0, "ep": 1.0, "conc": 1.0, "cap_w": 0.0}))
    return float(res["ttft_service_s"][0]) * 1e3


def test_hopper_and_ampere_prefill_attention_use_the_measured_or_published_kernel_figures() -> None:
    # A profile with a measured forward FMHA curve (efficiency.attention_fwd) prefills at that curve;
    # the same die without one takes the published kernel figure of the die.
    cal = load_calibration()
    for dev, die in (("h100-sxm-80gb", "gh100"), ("h200-sxm-141gb", "gh100"), ("a100-80gb", "ga100")):
        eff, src = prefill_attention_source(dev, cal)
        assert eff == PREFILL_ATTENTION_EFF[die][0] and "arXiv" in src
        w = make_workload(isl=1000, osl=100)
        prof = load_device(dev)
        ctx = make_context(load_model("llama-3.1-8b"), prof, w, devices_per_node=8, calibration=cal)
        assert prof.efficiency.attention_fwd and ctx.sc.prefill_attention_eff is None
        unmeasured = prof.model_copy(
            update={"efficiency": prof.efficiency.model_copy(update={"attention_fwd": {}})}
        )
        ctx = make_context(load_model("llama-3.1-8b"), unmeasured, w, devices_per_node=8, calibration=cal)
        assert ctx.sc.prefill_attention_eff == eff
    # a die without a published figure keeps the training-fitted efficiency, and says so
    eff, src = prefill_attention_source("mi300x", cal)
    assert eff is None and "training-fitted" in src


def test_prefill_attention_efficiency_sets_a_long_prompt_ttft(tmp_path) -> None:
    """A 16k prompt's TTFT scales with the attention efficiency; a calibration may override it."""
    doc = yaml.safe_load(default_calibration_path().read_text())
    doc["global"]["serving_prefill_attention_eff"] = 0.2
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(doc))
    slow = ttft_ms("h100-sxm-80gb", load_calibration(str(path)))
    fast = ttft_ms("h100-sxm-80gb")
    assert slow > fast * 1.3  # attention is a large share of a 16k prefill on an 8B model
    assert ttft_ms("h100-sxm-80gb", isl=1000) < fast / 10
    doc["global"]["serving_prefill_attention_eff"] = 2.0
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match="serving_prefill_attention_eff"):
        load_calibration(str(path))
