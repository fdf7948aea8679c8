"""Serving on SRAM-only, wafer-scale and dataflow machines: the vendor stack's own per-iteration costs,
the token's pipeline latency, weight streaming, and out-of-sample checks against published speeds."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from autopar.errors import DeviceError
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import ServingTable, iteration, make_context, make_workload
from autopar.serving.tiers import placement, weight_bytes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "studies"))


def _ctx(device: str, model: str, prec: str = "bf16", dpn: int = 1):
    w = make_workload(
        isl=1000, osl=256, offline=True, weight_precision=prec, kv_precision=prec, max_num_tokens=256
    )
    return make_context(load_model(model), load_device(device), w, devices_per_node=dpn)


def _decode(ctx, tp: int, pp: int):
    tab = ServingTable({"tp": [tp], "pp": [pp]})
    it = iteration(ctx, tab, n_dec=1.0, n_pre=0.0, dec_ctx=1128.0, pre_ctx=0.0, pre_len=1000, logit_rows=1.0)
    return {k: float(v[0]) for k, v in it.items()}


def test_gpu_profiles_keep_the_gpu_fitted_serving_coefficients():
    sc = _ctx("h100-sxm-80gb", "llama-3.1-8b").sc
    assert load_device("h100-sxm-80gb").serving is None
    assert sc.collective_sync_s == pytest.approx(53.3e-6)
    assert sc.layer_latency_s == 0.0
    assert sc.tile_rows == 64.0


@pytest.mark.parametrize("device", ["groq-lpu", "cerebras-cs3", "sn40l"])
def test_the_vendor_stack_replaces_the_gpu_coefficients(device):
    st = load_device(device).serving
    assert st is not None
    sc = _ctx(device, "llama-3.1-8b").sc
    assert sc.host_step_s == pytest.approx(st.host_step_us * 1e-6)
    assert sc.host_per_seq_s == pytest.approx(st.host_per_seq_us * 1e-6)
    assert sc.collective_sync_s == pytest.approx(st.collective_sync_us * 1e-6)
    assert sc.layer_latency_s == pytest.approx(st.layer_latency_us * 1e-6)
    assert sc.tile_rows == st.gemm_tile_rows
    prov = load_device(device).provenance
    for k in ("host_step_us", "collective_sync_us", "layer_latency_us", "gemm_tile_rows"):
        assert prov[f"serving.{k}"]  # every new figure is sourced


def test_golden_cerebras_llama_8b_batch1_decode_by_hand():
    """One wafer, batch 1: 32 layers x 17.3 us of pipeline latency plus a roofline of ~1.5 us
    (the 15.0 GB of weights a token reads, all but the 1.05 GB embedding table, at half of 21 PB/s =
    1.43 us; 16 GFLOP at half of 62.5 PFLOP/s = 0.5 us, overlapped)."""
    d = _decode(_ctx("cerebras-cs3", "llama-3.1-8b"), 1, 1)
    assert d["pipeline_latency"] == pytest.approx(32 * 17.3e-6)
    roof = d["t_iter"] - d["pipeline_latency"]
    read = weight_bytes(load_model("llama-3.1-8b")) - 2.0 * 128256 * 4096  # embedding rows are not read
    assert read / (21e15 * 0.5) < roof < 5e-6
    assert d["comm"] == 0.0 and d["host"] == 0.0


@pytest.mark.parametrize("pp", [1, 2, 4, 5, 8, 10])
def test_every_layer_adds_its_latency_once_whatever_the_pipeline_split(pp):
    d = _decode(_ctx("groq-lpu", "llama-3.1-70b", "fp8", dpn=64), 64, pp)
    assert d["pipeline_latency"] == pytest.approx(80 * 25.1e-6)  # 80 layers, pp divides them


def test_groq_tensor_collectives_pay_no_gpu_barrier():
    """Software-scheduled C2C: a batch-1 all-reduce over 64 chips is its tree latency (2 log2 64 hops of
    1 us), not the GPU-fitted 53 us on top."""
    d = _decode(_ctx("groq-lpu", "llama-3.1-70b", "fp8", dpn=64), 64, 10)
    per_collective = d["comm"] / (2 * 80)
    assert per_collective < 15e-6


def test_placement_adds_the_pipeline_latency_and_streams_weights_by_hand():
    m, cs3 = load_model("llama-3.1-70b"), load_device("cerebras-cs3")
    r = placement(m, cs3, batch=1, seq_len=2048, chips=[1, 4])
    assert list(r["weight_tier"]) == ["external", "sram"]
    lat = 80 * 17.3e-6
    assert r["pipeline_latency_s"][0] == pytest.approx(lat)
    assert r["pipeline_latency_s"][1] == pytest.approx(lat + 3 * 10e-6)  # 3 system-to-system hops
    w = weight_bytes(m)
    # one wafer: every step streams the 141 GB from MemoryX over the 150 GB/s system I/O
    assert r["decode_step_s"][0] == pytest.approx(w / 150e9 + lat, rel=1e-3)
    assert r["decode_step_s"][1] < 2e-3
    # GPUs: no serving section, no latency term
    g = placement(m, load_device("h100-sxm-80gb"), batch=1, seq_len=2048, chips=8)
    assert float(g["pipeline_latency_s"]) == 0.0


def test_vendor_speeds_are_out_of_sample_checks_within_2x():
    import sram_speed as S

    res = S.rows()
    for p, r in zip(S.VENDOR, res, strict=True):
        if p.role == "derive":  # the one figure the profile's latency comes from
            assert load_device(p.device).serving.layer_latency_us == pytest.approx(
                S.derived_layer_latency_us(p), abs=0.1
            )
            assert r["ratio"] == pytest.approx(1.0, abs=0.01)
    ratio = {(p.device, p.model, p.source[:20]): r["ratio"] for p, r in zip(S.VENDOR, res, strict=True)}
    checked = {k: v for k, v in ratio.items() if k[0] in ("groq-lpu",) or "cerebras.ai" in k[2]}
    derived_models = {(p.device, p.model) for p in S.VENDOR if p.role == "derive"}
    checked = {k: v for k, v in checked.items() if (k[0], k[1]) not in derived_models}
    assert len(checked) >= 4  # groq 70B, Llama-2-70B, Llama-2-7B; cerebras 70B
    for k, v in checked.items():
        assert 0.5 <= v <= 2.0, (k, v)


def test_other_platforms_predicted_out_of_sample(capsys):
    import published_accel as pa

    recs = [pa.prepare(r) for r in pa.load_rows(ROOT / "studies" / "data" / "accel_runs_other.csv")]
    fws, pb = pa.fit([pa.prepare(r) for r in pa.load_rows(pa.DEV_CSV)])
    pa.predict_all(recs, fws, pb)
    by: dict[str, list[float]] = {}
    for r in recs:
        assert "skipped" not in r, r.get("skipped")
        if r["measured_throughput"]:
            by.setdefault(r["device"].id, []).append(r["predicted_throughput"] / r["measured_throughput"])
    mape = {d: 100 * float(np.mean(np.abs(np.array(v) - 1))) for d, v in by.items()}
    assert set(mape) == {"gaudi2", "gh200", "sn40l"}
    assert mape["gaudi2"] < 30 and mape["gh200"] < 30
    assert all(0.5 <= x <= 2.0 for x in by["gaudi2"] + by["gh200"])
    # SN40L (SambaFlow, no fitted framework): batch-1 rows, HBM-bound, within 2x
    b1 = [r for r in recs if r["device"].id == "sn40l" and r["batch"] == 1]
    assert all(0.5 <= r["predicted_throughput"] / r["measured_throughput"] <= 2.0 for r in b1)
    assert all(r["framework"] == "deepspeed-habana" for r in recs if r["device"].id == "gaudi2")
    # GH200 prefill (16 prompts of 1,024 tokens) from the H100 GPU's measured GEMM efficiency: within 10%
    ttft = [
        r["predicted_ttft"] / r["measured_ttft"]
        for r in recs
        if r["measured_ttft"] and r["device"].id == "gh200"
    ]
    assert len(ttft) == 3 and all(0.9 <= x <= 1.1 for x in ttft)


def _with_serving(tmp_path, text: str) -> Path:
    src = (ROOT / "cost_models" / "devices" / "sn40l.yaml").read_text()
    start = src.index("serving:\n")
    end = src.index("scale_up:\n")
    f = tmp_path / "bad.yaml"
    f.write_text(src[:start] + text + src[end:])
    return f


def test_bad_serving_section_is_refused(tmp_path):
    neg = (
        "serving:\n  host_step_us: 0\n  host_per_seq_us: 0\n  collective_sync_us: 0\n  layer_latency_us: -1\n"
    )
    with pytest.raises(DeviceError):
        load_device(str(_with_serving(tmp_path, neg)))
    typo = "serving:\n  host_step_us: 0\n  host_per_seq_us: 0\n  collective_sync_us: 0\n  layer_latency: 1\n"
    with pytest.raises(DeviceError):
        load_device(str(_with_serving(tmp_path, typo)))
    assert math.isfinite(load_device("sn40l").serving.layer_latency_us)
