"""mxfp8 and nvfp4 as training precisions: peaks, legality, block-scaling traffic, weight copy."""

from __future__ import annotations

import numpy as np
import pytest

from autopar import collectives as C
from autopar import precision as P
from autopar.coefficients import coefficients_for
from autopar.export import Job, export, parse
from autopar.export.base import ExportError
from autopar.latency import stage_slot
from autopar.layout import PRECISION_CODES, Layout, LayoutTable
from autopar.legality import Context, legality_mask, reasons_for_row
from autopar.memory import memory_breakdown
from autopar.prediction import training_job

T_TOK = 2 * 4096  # micro_batch 2 x seq 4096, tp = cp = 1


def _job(device: str, n: int = 8):
    return training_job(model="llama-3.1-8b", device=device, num_devices=n, seq_len=4096, global_batch=16)


def _lays(n: int, precisions) -> LayoutTable:
    return LayoutTable.from_layouts(
        [Layout(dp=n, zero=1, micro_batch=2, grad_accum=1, precision=p) for p in precisions]
    )


def _slot(job, lay):
    co, lc = coefficients_for(job.device)
    links = C.Links.from_cluster(job.device, job.devices_per_node, lc)
    k = len(lay)
    layers = np.full(k, float(job.model.layers))
    return stage_slot(
        job.model, lay, seq_len=job.seq_len, links=links, co=co,
        n_dense=layers, n_moe=np.zeros(k), head=np.zeros(k, dtype=bool),
    ), co  # fmt: skip


def test_codes_of_the_earlier_precisions_are_unchanged() -> None:
    assert PRECISION_CODES[:4] == ("bf16", "fp8", "fp16", "fp32")
    assert PRECISION_CODES[4:] == ("mxfp8", "nvfp4")


def test_gemms_run_at_the_fp8_and_fp4_peaks_with_their_own_measured_rates() -> None:
    from dataclasses import replace

    job = _job("gb200-nvl72")
    lays = _lays(8, ["bf16", "mxfp8", "nvfp4"])
    s, co = _slot(job, lays)
    pk = job.device.peak_tflops
    assert (pk["fp8"], pk["fp4"]) == (5000.0, 10000.0)
    # Each block-scaled format has its own measured efficiency and half-dimension (studies/gemm_rates.py)
    # at its peak's rate: mxfp8 at the fp8 peak, nvfp4 at the fp4 peak. llama-3.1-8b's GEMMs at 8192
    # tokens are compute bound on GB200, so doubling a format's efficiency or its peak halves its GEMMs.
    assert co.gemm_eff["mxfp8"] != co.gemm_eff["fp8"] and co.gemm_eff["nvfp4"] != co.gemm_eff["fp8"]
    assert co.gemm_half_dim_by["nvfp4"] > co.gemm_half_dim_by["mxfp8"] > co.gemm_half_dim
    links = C.Links.from_cluster(job.device, job.devices_per_node, coefficients_for(job.device)[1])

    def gemm(c):
        return stage_slot(
            job.model, lays, seq_len=job.seq_len, links=links, co=c,
            n_dense=np.full(3, float(job.model.layers)), n_moe=np.zeros(3), head=np.zeros(3, dtype=bool),
        )["gemm"]  # fmt: skip

    g = s["gemm"]
    eff2 = gemm(replace(co, gemm_eff={**co.gemm_eff, "mxfp8": 2 * co.gemm_eff["mxfp8"]}))
    assert eff2[1] == pytest.approx(g[1] / 2, rel=1e-9) and eff2[[0, 2]] == pytest.approx(g[[0, 2]])
    fp4x2 = gemm(replace(co, peak_flops={**co.peak_flops, "fp4": 2 * co.peak_flops["fp4"]}))
    assert fp4x2[2] == pytest.approx(g[2] / 2, rel=1e-9) and fp4x2[1] == pytest.approx(g[1])
    # without its own half-dimension a format falls back to bf16's, which makes its GEMMs faster
    flat = gemm(replace(co, gemm_half_dim_by={}))
    assert flat[0] == pytest.approx(g[0]) and flat[1] < g[1] and flat[2] < g[2]


def test_scaling_bytes_of_one_gemm_by_hand() -> None:
    # nvfp4, M=8192 tokens, N=K=4096, 4 micro-batches per step. Per element: global-amax read (2 B)
    # + quantize read (2 B) + rowwise and columnwise E2M1 values (2 x 0.5 B) + E4M3 scales (2 x 1/16 B).
    q = 2 + 2 + 2 * 0.5 + 2 / 16
    assert P.QUANT_BYTES_PER_ELEMENT["nvfp4"] == q == 5.125
    fwd, bwd = P.scaling_bytes(q, 8192, 4096, 4096, 4)
    assert fwd == 5.125 * (8192 * 4096 + 4096 * 4096 / 4) == 193_462_272
    assert bwd == 5.125 * 8192 * 4096 == 171_966_464
    # mxfp8: read 2 B, write two E4M3 copies with one E8M0 scale per 32 values.
    assert P.QUANT_BYTES_PER_ELEMENT["mxfp8"] == 2 + 2 * (1 + 1 / 32)


def test_scaling_traffic_is_the_elementwise_difference_of_the_stage() -> None:
    job = _job("gb200-nvl72")
    s, co = _slot(job, _lays(8, ["bf16", "mxfp8", "nvfp4"]))
    m = job.model
    h, a, g, d, F = m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden
    shapes = [(T_TOK, (a + 2 * g) * d, h), (T_TOK, h, a * d), (T_TOK, 2 * F, h), (T_TOK, h, F)]
    for i, name in ((1, "mxfp8"), (2, "nvfp4")):
        q = P.QUANT_BYTES_PER_ELEMENT[name]
        per_layer = sum(sum(P.scaling_bytes(q, *sh, 1.0)) for sh in shapes)
        want = m.layers * per_layer / co.hbm_bw
        assert s["elementwise"][i] - s["elementwise"][0] == pytest.approx(want, rel=1e-9)


def test_te_weight_copy_in_memory() -> None:
    job = _job("gb200-nvl72")
    lay = _lays(8, ["bf16", "mxfp8", "nvfp4"])
    w = memory_breakdown(job.model, lay, seq_len=job.seq_len)["weights"]
    bf16_bytes = w[0] / 2.0  # params per rank x 2 B (llama-3.1-8b, tp = pp = 1, zero = 1: weights whole)
    assert w[1] - w[0] == pytest.approx(2.0625 * bf16_bytes, rel=1e-9)
    assert w[2] - w[0] == pytest.approx(1.125 * bf16_bytes, rel=1e-9)


@pytest.mark.parametrize(
    "device,precision,missing",
    [
        ("h100-sxm-80gb", "nvfp4", "fp4"),
        ("h100-sxm-80gb", "mxfp8", "fp8 and fp4"),
        ("a100-80gb", "fp8", "fp8"),
        ("a100-80gb", "mxfp8", "fp8 and fp4"),
    ],
)
def test_devices_without_the_peak_refuse_with_their_precisions(device, precision, missing) -> None:
    job = _job(device)
    lay = _lays(8, [precision])
    ctx = Context.for_job(job)
    legal, bad = legality_mask(job.model, lay, ctx)
    assert not legal[0] and "precision_unsupported" in bad
    (reason,) = reasons_for_row(job.model, lay, ctx, 0)
    has = ", ".join(sorted(job.device.peak_tflops))
    assert (
        reason.message == f"precision {precision} needs {missing} tensor cores; {device} has {has} peaks only"
    )


@pytest.mark.parametrize("device", ["b200", "b300", "gb200-nvl72", "gb300-nvl72"])
def test_blackwell_runs_every_precision(device) -> None:
    job = _job(device)
    legal, _ = legality_mask(job.model, _lays(8, PRECISION_CODES), Context.for_job(job))
    assert legal.all()


def test_megatron_flags_and_refused_recipes() -> None:
    job = Job(
        model="llama3-8b", num_devices=8, seq_len=4096, global_batch=8, devices_per_node=8, num_layers=32
    )
    lay = Layout(dp=8, zero=1, micro_batch=1, grad_accum=1, precision="nvfp4")
    text = export(lay, "megatron", job)
    assert "--fp4-format e2m1" in text and "--fp4-recipe nvfp4" in text and "--fp8-format" not in text
    assert parse(text, "megatron")[0] == lay
    mx = export(lay.model_copy(update={"precision": "mxfp8"}), "megatron", job)
    assert "--fp8-format e4m3" in mx and "--fp8-recipe mxfp8" in mx
    for bad in (
        mx.replace("--fp8-recipe mxfp8", "--fp8-recipe blockwise"),  # FP8 blockwise: not costed
        mx.replace("--fp8-format e4m3", "--fp8-format hybrid"),  # MXFP8 is E4M3 in autopar
    ):
        with pytest.raises(ExportError, match="cannot be expressed"):
            parse(bad, "megatron")
    br = export(lay, "megatron_bridge", job)
    assert "mixed_precision=bf16_with_nvfp4_mixed" in br
    assert parse(br, "megatron_bridge")[0] == lay


def test_search_space_precision_axis_excludes_what_the_device_lacks() -> None:
    from autopar.search.enumerate import enumerate_space
    from autopar.search.space import load_space

    space = load_space("default", ["precision=bf16,mxfp8,nvfp4"])
    hop = enumerate_space(_job("h100-sxm-80gb"), space)
    bw = enumerate_space(_job("gb200-nvl72"), space)
    assert list(hop.precision) == [0]
    assert hop.excluded["precision_unsupported"] > 0
    assert list(bw.precision) == [0, 4, 5] and "precision_unsupported" not in bw.excluded
