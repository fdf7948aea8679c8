"""Per-layer attention shapes (issue 22): sliding layers with heads, KV heads or head sizes of their
own (Gemma 4, MiMo-V2-Flash, Laguna), a V head size apart from Q/K (MiMo) and full layers whose V is
K's projection (Gemma 4 attention_k_eq_v): the views each shape is costed by, the KV cache by hand
(whole model and per serving device), the TP rule over every layer's heads, training and serving."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autopar import predict
from autopar.cli.main import main
from autopar.errors import LayoutError, ModelConfigError
from autopar.hardware import load_device
from autopar.model import ModelSpec, check_costed, load_model
from autopar.serving.estimate import (
    KV_PAGE_TOKENS,
    ServingTable,
    _kv_seq_bytes_per_device,
    kv_bytes_per_token_per_device,
    legal,
    make_context,
    make_workload,
)

REAL = Path(__file__).with_name("configs") / "real"


def _m(arch: str) -> ModelSpec:
    return load_model(REAL / arch / "config.json")


def test_gemma4_views_are_each_layer_kinds_own_shape() -> None:
    m = _m("gemma-4-dense")
    assert m.per_layer_attention and m.full_k_eq_v
    (n_full, full), (n_slide, slide) = m.attn_views()
    assert (n_full, n_slide) == (10, 50)
    assert (full.heads, full.kv_heads, full.head_dim, full.v_dim, full.full_k_eq_v) == (32, 4, 512, 512, True)
    assert (slide.heads, slide.kv_heads, slide.head_dim, slide.v_dim, slide.full_k_eq_v) == (
        32,
        16,
        256,
        256,
        False,
    )
    assert not full.per_layer_attention and not slide.per_layer_attention
    h = 5376
    # full: q, k (no v_proj), o and the q/k norms of 512; sliding: q, k, v, o and norms of 256
    assert full.attn_params_per_layer == h * 32 * 512 + h * 4 * 512 + 32 * 512 * h + 2 * 512
    assert slide.attn_params_per_layer == h * 32 * 256 + 2 * h * 16 * 256 + 32 * 256 * h + 2 * 256
    # a model of one shape is its own only view
    llama = load_model("llama-3.1-8b")
    assert llama.attn_views() == ((32, llama),) and not llama.per_layer_attention


@pytest.mark.parametrize("seq", [512, 1024, 100_000])
def test_gemma4_kv_cache_bytes_by_hand(seq: int) -> None:
    # Full layers cache K and V of 4 heads x 512 for every token (K=V layers too: K is normed and
    # rotated, V normed apart); sliding layers K and V of 16 heads x 256 for at most 1024 tokens.
    m = _m("gemma-4-dense")
    full_tok, slide_tok = 4 * (512 + 512), 16 * (256 + 256)
    assert m.kv_cache_bytes_per_token(1) == 10 * full_tok + 50 * slide_tok
    assert m.kv_cache_bytes_per_token(2) == 2 * (10 * full_tok + 50 * slide_tok)
    expect = 10 * full_tok * seq + 50 * slide_tok * min(seq, 1024)
    assert m.kv_cache_bytes(seq, 1) == expect


def test_mimo_kv_cache_bytes_by_hand() -> None:
    # K heads of 192 and V heads of 128: full layers 4 KV heads, sliding layers 8 over a 129 window
    m = _m("mimo-v2-flash")
    assert m.kv_cache_elems_per_token_per_layer == 4 * (192 + 128)  # the full-attention shape
    per_tok = 9 * 4 * 320 + 39 * 8 * 320
    assert m.kv_cache_bytes_per_token(1) == per_tok
    assert m.kv_cache_bytes(32768, 0.5) == 0.5 * (9 * 4 * 320 * 32768 + 39 * 8 * 320 * 129)


def test_tp_must_divide_every_layers_heads() -> None:
    # Gemma 4 31B: 4 KV heads on full layers, 16 on sliding ones: tp 8 splits the sliding layers'
    # but not the full layers' KV heads
    assert _m("gemma-4-dense").tp_head_units == (32, 4)
    assert _m("laguna").tp_head_units == (16, 8)  # 48 and 64 query heads
    assert _m("mimo-v2-flash").tp_head_units == (64, 4)
    base = dict(
        model=str(REAL / "gemma-4-dense" / "config.json"),
        device="h100-sxm-80gb",
        num_devices=64,
        seq_len=4096,
        global_batch=64,
    )
    with pytest.raises(LayoutError) as e:
        predict(**base, tp=8)
    assert "tp_kv_heads" in [r.code for r in e.value.reasons]
    p = predict(**base, tp=4, recompute="full")
    assert p.step_time_s > 0 and sum(p.time_breakdown.values()) == pytest.approx(p.step_time_s, rel=1e-9)


def test_training_cost_follows_each_shape() -> None:
    """The same model with its sliding layers shaped as its full ones costs differently: the stage
    sums each shape's attention, not the full layers' shape everywhere."""
    m = _m("gemma-4-dense")
    uniform = m.model_copy(update=dict(swa_kv_heads=0, swa_head_dim=0, full_k_eq_v=False))
    assert not uniform.per_layer_attention
    kw = dict(device="h100-sxm-80gb", num_devices=8, seq_len=4096, global_batch=16, tp=4, recompute="full")
    mixed, one = predict(model=m, **kw), predict(model=uniform, **kw)
    assert mixed.time_breakdown["gemm"] < one.time_breakdown["gemm"]  # 256-wide sliding layers, no v_proj
    assert m.total_params < uniform.total_params


def test_serving_kv_bytes_per_device_by_hand() -> None:
    """Serving: each shape's KV heads split over the attention-TP ranks or replicate on their own."""
    ctx = make_context(_m("gemma-4-dense"), load_device("h100-sxm-80gb"), make_workload(isl=1024, osl=256),
                       devices_per_node=8)  # fmt: skip
    # bf16: full layers 4 KV heads x (512 + 512), sliding layers 16 x (256 + 256). At tp 8 the full
    # layers' 4 heads replicate (one per device), the sliding layers' 16 split (two per device).
    per = kv_bytes_per_token_per_device(ctx, ServingTable({"tp": [1, 8]}))
    assert list(per) == [2 * (10 * 4 * 1024 + 50 * 16 * 512), 2 * (10 * 1 * 1024 + 50 * 2 * 512)]
    # a sequence of 4096 tokens in pages: the full layers hold all of it, the sliding layers their
    # 1024-token window plus a page
    page = KV_PAGE_TOKENS
    paged, window = math.ceil(4096 / page) * page, (math.ceil(1024 / page) + 1) * page
    seq = _kv_seq_bytes_per_device(ctx, ServingTable({"tp": [8]}), 4096.0)
    assert seq[0] == 2 * (10 * 1 * 1024 * paged + 50 * 2 * 512 * min(paged, window))
    # legal at tp 8 for serving (KV heads replicate beyond their count), not at tp 3
    masks = legal(ctx, ServingTable({"tp": [8, 3], "pp": [1, 1], "ep": [1, 1], "adp": [1, 1]}))
    assert not masks["tp_kv_heads"][0] and masks["tp_kv_heads"][1] and masks["tp_heads"][1]


def test_serving_of_mixed_shapes_costed(capsys: pytest.CaptureFixture[str]) -> None:
    check_costed(_m("gemma-4-dense"), "serving memory and latency")
    args = ["serve", "--model", str(REAL / "mimo-v2-flash" / "config.json"), "--device", "h100-sxm-80gb"]
    assert main([*args, "--num-devices", "16", "--isl", "1024", "--osl", "256", "--concurrency", "8"]) == 0
    assert "mimo-v2-flash" in capsys.readouterr().out


def test_shape_fields_checked() -> None:
    base = dict(
        name="x", hidden=1024, layers=4, heads=16, kv_heads=4, head_dim=64, ffn_hidden=4096, vocab=1000
    )
    with pytest.raises(ModelConfigError, match="none"):
        ModelSpec(**base, swa_kv_heads=8)  # no sliding layers to shape
    with pytest.raises(ModelConfigError, match="not a multiple"):
        ModelSpec(**base, sliding_window=128, sliding_window_layers=2, swa_heads=12, swa_kv_heads=8)
    ModelSpec(**base, sliding_window=128, sliding_window_layers=2, swa_heads=32, swa_kv_heads=8)
