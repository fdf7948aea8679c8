"""FLOPs per token of block kinds read from real configs (tests/configs/real), against a hand count.

Covers what tests/test_model.py and tests/test_hf_configs.py do not count by hand: MLA projections
with a MoE of routed plus shared experts and dense first layers (DeepSeek-V3), top-k routing without
shared experts (Mixtral), a 5:1 sliding-window / global attention pattern (Gemma 3) and the parallel
attention + MLP block of Falcon-40B's own config. Training FLOPs = 3 x forward = 6 per weight per
token for every GEMM, plus the attention core (QK^T and PV: 2 FLOPs per key, head and dimension
each, times 3) over the context each layer sees; the public ``ModelSpec.flops_per_token`` is tested.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopar.model import load_model

REAL = Path(__file__).with_name("configs") / "real"


def _cfg(arch: str) -> dict:
    return json.loads((REAL / arch / "config.json").read_text())


@pytest.mark.parametrize("s", [4096, 32768])
def test_deepseek_v3_mla_and_moe_with_shared_experts(s: int) -> None:
    c = _cfg("deepseek-v3")
    h, L, a, V = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["vocab_size"]
    ql, kvl, nope, rope, v = (
        c["q_lora_rank"],
        c["kv_lora_rank"],
        c["qk_nope_head_dim"],
        c["qk_rope_head_dim"],
        c["v_head_dim"],
    )
    assert (h, L, a, ql, kvl, nope, rope, v) == (7168, 61, 128, 1536, 512, 128, 64, 128)
    # MLA: q down / up, the joint KV down (latent + shared rope key), KV up (k_nope and v), output
    mla = h * ql + ql * a * (nope + rope) + h * (kvl + rope) + kvl * a * (nope + v) + a * v * h
    E, k, mi, shared, dense_i = 256, 8, 2048, 1, 18432
    assert (c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]) == (E, k, mi)
    assert (c["n_shared_experts"], c["intermediate_size"], c["first_k_dense_replace"]) == (shared, dense_i, 3)
    moe = h * E + k * 3 * h * mi + shared * 3 * h * mi  # router, k routed SwiGLU experts, the shared one
    gemm = L * mla + 3 * (3 * h * dense_i) + (L - 3) * moe + V * h  # + the logits GEMM
    core = 6 * L * s * a * ((nope + rope) + v)  # QK^T over the 192-wide q/k heads, PV over v
    m = load_model(REAL / "deepseek-v3" / "config.json")
    assert m.flops_per_token(s, attention=False) == pytest.approx(6 * gemm, rel=1e-6)
    assert m.flops_per_token(s) == pytest.approx(6 * gemm + core, rel=1e-6)
    assert m.flops_per_token(s, causal=True) == pytest.approx(6 * gemm + core / 2, rel=1e-6)


def test_mixtral_top2_routing() -> None:
    c = _cfg("mixtral")
    h, L, a, kv, V = 4096, 32, 32, 8, 32000
    d, E, k, ffn = h // a, 8, 2, 14336
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_key_value_heads"], c["vocab_size"]) == (
        h,
        L,
        kv,
        V,
    )
    assert (c["num_local_experts"], c["num_experts_per_tok"], c["intermediate_size"]) == (E, k, ffn)
    gemm = L * (2 * h * a * d + 2 * h * kv * d + h * E + k * 3 * h * ffn) + V * h
    s = 8192
    m = load_model(REAL / "mixtral" / "config.json")
    assert m.flops_per_token(s) == pytest.approx(6 * gemm + 6 * L * s * a * 2 * d, rel=1e-9)
    # all 8 experts are parameters, 2 of them run per token
    assert m.total_params - m.active_params == L * (E - k) * 3 * h * ffn


@pytest.mark.parametrize("causal", [False, True])
def test_gemma3_sliding_window_pattern(causal: bool) -> None:
    c = _cfg("gemma-3")["text_config"]
    types = c["layer_types"]
    L, w = c["num_hidden_layers"], c["sliding_window"]
    n_slide = types.count("sliding_attention")
    assert (L, n_slide, w) == (62, 52, 1024)  # 5 local : 1 global, the last two local
    h, a, kv, d, ffn, V = 5376, 32, 16, 128, 21504, 262208
    assert (c["hidden_size"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]) == (
        h,
        kv,
        d,
        ffn,
    )
    gemm = L * (2 * h * a * d + 2 * h * kv * d + 3 * h * ffn) + V * h
    s = 32768
    per_key = 6 * a * (d + d)
    if causal:  # mean keys per query: s/2 globally, w - w^2/(2 s) under the window
        core = per_key * ((L - n_slide) * s / 2 + n_slide * (w - w * w / (2 * s)))
    else:
        core = per_key * ((L - n_slide) * s + n_slide * w)
    m = load_model(REAL / "gemma-3" / "config.json")
    assert m.flops_per_token(s, causal=causal) == pytest.approx(6 * gemm + core, rel=1e-9)


def test_falcon_40b_parallel_block_from_its_own_config() -> None:
    c = _cfg("falcon-refinedweb")
    h, L, a, kv, V = c["hidden_size"], c["n_layer"], c["n_head"], c["n_head_kv"], c["vocab_size"]
    d = h // a
    # modelling_RW.py: fused QKV of a query heads and n_head_kv K/V heads, dense out, 4h GELU MLP
    gemm = L * (h * (a + 2 * kv) * d + h * h + 2 * h * 4 * h) + V * h
    s = 2048
    m = load_model(REAL / "falcon-refinedweb" / "config.json")
    assert m.kv_heads == kv == 8 and m.parallel_block
    assert m.flops_per_token(s) == pytest.approx(6 * gemm + 6 * L * s * a * 2 * d, rel=1e-9)


@pytest.mark.parametrize("causal", [False, True])
def test_gemma4_full_and_sliding_layers_each_by_their_own_shape(causal: bool) -> None:
    # Gemma4TextAttention: full layers q_proj h -> a x 512, k_proj h -> 4 x 512 and no v_proj
    # (attention_k_eq_v: V is K's projection), o_proj a x 512 -> h; sliding layers q h -> a x 256,
    # k and v h -> 16 x 256, o a x 256 -> h. Gated GELU MLP; the tied embedding's logits GEMM.
    c = _cfg("gemma-4-dense")["text_config"]
    types = c["layer_types"]
    h, L, a, V, ffn, w = 5376, 60, 32, 262144, 21504, 1024
    n_full, n_slide = types.count("full_attention"), types.count("sliding_attention")
    assert (n_full, n_slide) == (10, 50)
    assert (c["hidden_size"], c["num_attention_heads"], c["intermediate_size"], c["sliding_window"]) == (
        h,
        a,
        ffn,
        w,
    )
    assert (c["global_head_dim"], c["num_global_key_value_heads"], c["attention_k_eq_v"]) == (512, 4, True)
    assert (c["head_dim"], c["num_key_value_heads"]) == (256, 16)
    full = h * a * 512 + h * 4 * 512 + a * 512 * h
    slide = h * a * 256 + 2 * h * 16 * 256 + a * 256 * h
    gemm = n_full * full + n_slide * slide + L * 3 * h * ffn + V * h
    s = 32768
    if causal:
        ctx_full, ctx_slide = s / 2, w - w * w / (2 * s)
    else:
        ctx_full, ctx_slide = s, w
    core = 6 * a * (512 + 512) * n_full * ctx_full + 6 * a * (256 + 256) * n_slide * ctx_slide
    m = load_model(REAL / "gemma-4-dense" / "config.json")
    assert m.flops_per_token(s, attention=False) == pytest.approx(6 * gemm, rel=1e-12)
    assert m.flops_per_token(s, causal=causal) == pytest.approx(6 * gemm + core, rel=1e-12)


def test_mimo_v2_flash_v_head_size_and_sliding_shape() -> None:
    # MiMoV2FlashAttention: Q and K heads of 192, V heads of 128 (o_proj a x 128 -> h); full layers
    # 4 KV heads, sliding layers (hybrid_layer_pattern 1) 8 KV heads; 256 routed experts (top 8,
    # sigmoid router h -> 256) on every layer but the first, which is a dense MLP.
    c = _cfg("mimo-v2-flash")
    h, L, a, V = 4096, 48, 64, 152576
    assert (c["head_dim"], c["v_head_dim"], c["swa_head_dim"], c["swa_v_head_dim"]) == (192, 128, 192, 128)
    assert (c["num_key_value_heads"], c["swa_num_key_value_heads"], c["swa_num_attention_heads"]) == (
        4,
        8,
        64,
    )
    n_slide = sum(c["hybrid_layer_pattern"])
    n_full = L - n_slide
    assert (n_full, n_slide) == (9, 39)
    E, k, mi, dense_i = 256, 8, 2048, 16384

    def attn(g: int) -> int:
        return h * a * 192 + h * g * 192 + h * g * 128 + a * 128 * h

    gemm = n_full * attn(4) + n_slide * attn(8) + 3 * h * dense_i + (L - 1) * (h * E + k * 3 * h * mi) + V * h
    s, w = 16384, c["sliding_window_size"] + 1  # the query and the 128 tokens before it
    core = 6 * a * (192 + 128) * (n_full * s + n_slide * w)
    m = load_model(REAL / "mimo-v2-flash" / "config.json")
    assert m.flops_per_token(s) == pytest.approx(6 * gemm + core, rel=1e-12)


def test_laguna_query_heads_per_layer() -> None:
    # LagunaAttention: num_attention_heads_per_layer query heads (48 on full layers, 64 on sliding),
    # 8 KV heads of 128, and the per-head output gate g_proj h -> heads.
    c = _cfg("laguna")
    h, L, g, d, V = 2048, 40, 8, 128, 100352
    per = c["num_attention_heads_per_layer"]
    assert sorted(set(per)) == [48, 64] and c["gating"] is True
    attn = sum(h * a * d + 2 * h * g * d + a * d * h + h * a for a in per)
    E, k, mi, shared, dense_i = 256, 8, 512, 512, 8192
    moe = h * E + k * 3 * h * mi + 3 * h * shared
    gemm = attn + 3 * h * dense_i + (L - 1) * moe + V * h
    s, w = 8192, c["sliding_window"]
    core = sum(6 * a * 2 * d * (s / 2 if a == 48 else w - w * w / (2 * s)) for a in per)
    m = load_model(REAL / "laguna" / "config.json")
    assert m.flops_per_token(s, causal=True) == pytest.approx(6 * gemm + core, rel=1e-12)
