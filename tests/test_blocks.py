"""Golden tests of the block modules (``autopar/blocks``): each kind's forward FLOPs per token against
a hand computation from the paper or the model code, on a real config, and the registry convention
(adding a layer kind is one module in ``autopar/blocks`` plus its golden test here)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

from autopar import blocks
from autopar.blocks import (
    attention,
    cross_attention,
    embedding,
    encoder,
    gated_deltanet,
    mamba,
    mla,
    mlp,
    moe_ffn,
)
from autopar.model import load_model

CONFIGS = Path(__file__).parent / "configs"


def _model(name: str):
    return load_model(str(CONFIGS / f"{name}.json") if (CONFIGS / f"{name}.json").exists() else name)


def test_gqa_attention_llama31_8b():
    # HF LlamaAttention: q_proj h -> a d, k_proj / v_proj h -> g d, o_proj a d -> h (no biases);
    # Llama-3.1-8B: h 4096, 32 heads, 8 KV heads, head dim 128.
    m = _model("llama-3.1-8b")
    weights = 4096 * 32 * 128 + 2 * 4096 * 8 * 128 + 32 * 128 * 4096
    assert weights == 41_943_040
    assert attention.flops_per_token(m) == 2 * weights
    assert attention.params(m) == weights
    # causal core at 8192 keys: QK^T and PV, 2 * s * a * d each, half of them under the mask
    assert attention.flops_per_token(m, 8192) == 2 * weights + 0.5 * (2 * 8192 * 32 * 128 * 2)
    assert attention.kv_cache_elems(m) == m.kv_cache_elems_per_token_per_layer == 2 * 8 * 128


def test_mha_attention_gpt2():
    # GPT-2 (HF GPT2Attention): c_attn 768 -> 3 x 768, c_proj 768 -> 768.
    m = _model("gpt2")
    assert attention.flops_per_token(m) == 2 * (768 * 2304 + 768 * 768)


def test_mqa_attention_falcon_7b():
    # Falcon-7B (multi_query): query_key_value 4544 -> 71 x 64 + 2 x 64, dense 4544 -> 4544.
    m = _model("falcon-7b")
    assert attention.flops_per_token(m) == 2 * (4544 * (71 * 64 + 2 * 64) + 71 * 64 * 4544)


def test_gated_attention_qwen3_next():
    # Qwen3-Next (HF Qwen3NextAttention, attn_output_gate): q_proj h -> 2 a d (query and gate),
    # k_proj / v_proj h -> g d, o_proj a d -> h; h 2048, 16 heads, 2 KV heads, head dim 256.
    m = _model("qwen3-next-80b-a3b")
    assert attention.flops_per_token(m) == 2 * (2048 * 2 * 16 * 256 + 2 * 2048 * 2 * 256 + 16 * 256 * 2048)


def test_per_layer_attention_shapes_mimo_v2_flash():
    # MiMo-V2-Flash (MiMoV2FlashAttention): h 4096, 64 heads with Q/K heads of 192 and V heads of 128;
    # 9 full layers with 4 KV heads, 39 sliding layers (window 129) with 8. The block's per-layer
    # figures are the mean over the attention layers of each shape's own.
    m = load_model(str(CONFIGS / "real" / "mimo-v2-flash" / "config.json"))
    h, a, n_full, n_slide = 4096, 64, 9, 39

    def proj(g):  # q, k, v, o weights of one layer
        return h * a * 192 + h * g * 192 + h * g * 128 + a * 128 * h

    full, slide = n_full / 48, n_slide / 48
    assert attention.params(m) == pytest.approx(full * proj(4) + slide * proj(8), rel=1e-12)
    assert m.layers * attention.params(m) == n_full * proj(4) + n_slide * proj(8)
    # causal core against s_kv keys: QK^T over the 192-wide heads, PV over the 128-wide V heads
    s = 8192
    core = 0.5 * 2 * s * a * (192 + 128)
    expect = 2 * (full * proj(4) + slide * proj(8)) + core
    assert attention.flops_per_token(m, s) == pytest.approx(expect, rel=1e-12)
    (_, fv), (_, sv) = m.attn_views()
    assert (fv.kv_heads, sv.kv_heads, fv.sliding_window_layers, sv.sliding_window_layers) == (4, 8, 0, 48)
    assert attention.flops_per_token(fv, s) == 2 * proj(4) + core
    assert attention.flops_per_token(sv, 129) == 2 * proj(8) + 0.5 * 2 * 129 * a * 320
    # the KV cache: K (192) and V (128) of each KV head
    assert attention.kv_cache_elems(m) == pytest.approx(full * 4 * 320 + slide * 8 * 320, rel=1e-12)
    with pytest.raises(ValueError, match="per attention shape"):
        attention.gemm_shapes(m, 1)
    assert attention.gemm_shapes(fv, 2) == [((a * 192 + 4 * 320) / 2, h), (h, a * 128 / 2)]
    assert attention.gemm_shapes(sv, 2) == [((a * 192 + 8 * 320) / 2, h), (h, a * 128 / 2)]


def test_mla_deepseek_v3():
    # DeepSeek-V2 (arXiv 2405.04434) Sec. 2.1 with V3's sizes: q_a_proj 7168 -> 1536, q_b_proj
    # 1536 -> 128 x (128 + 64), kv_a_proj_with_mqa 7168 -> 512 + 64, kv_b_proj 512 -> 128 x (128 + 128),
    # o_proj 128 x 128 -> 7168.
    m = _model("deepseek-v3")
    weights = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert mla.flops_per_token(m) == 2 * weights
    # the core: QK^T over d_nope + d_rope = 192, PV over d_v = 128, causal half, 4096 keys
    assert mla.flops_per_token(m, 4096) == 2 * weights + 0.5 * 2 * 4096 * 128 * (192 + 128)
    assert mla.kv_cache_elems(m) == 512 + 64


def test_gated_and_plain_mlp():
    # SwiGLU (HF LlamaMLP): gate_proj, up_proj h -> F, down_proj F -> h; Llama-3.1-8B F = 14336.
    assert mlp.flops_per_token(_model("llama-3.1-8b")) == 2 * 3 * 4096 * 14336
    assert mlp.params(_model("llama-3.1-8b")) == 3 * 4096 * 14336
    # GELU MLP (GPT-2): c_fc 768 -> 3072, c_proj 3072 -> 768.
    assert mlp.flops_per_token(_model("gpt2")) == 2 * 2 * 768 * 3072


def test_moe_mixtral_and_deepseek_v3():
    # Mixtral (HF MixtralSparseMoeBlock): gate 4096 -> 8 experts, top-2 SwiGLU experts of 14336.
    assert moe_ffn.flops_per_token(_model("mixtral-8x7b")) == 2 * 4096 * 8 + 2 * (2 * 3 * 4096 * 14336)
    # DeepSeek-V3 (HF DeepseekV3MoE): 256 routed experts of 2048, top-8, one shared expert of 2048.
    want = 2 * 7168 * 256 + 8 * (2 * 3 * 7168 * 2048) + 2 * 3 * 7168 * 2048
    assert moe_ffn.flops_per_token(_model("deepseek-v3")) == want


def test_mamba2_nemotron_h_8b():
    # Nemotron-H-8B: h 4096, 128 Mamba heads of 64 (d_inner 8192), 8 groups, d_state 128, chunk 128.
    m = _model("nemotron-h-8b")
    d_in, G, N, H, Q = 8192, 8, 128, 128, 128
    proj = 4096 * (2 * d_in + 2 * G * N + H) + d_in * 4096  # in_proj [z, x, B, C, dt], out_proj
    # mamba_ssm's chunked SSD per chunk of Q tokens: C B^T per group (Q x N by N x Q), (L o C B^T) X
    # per head (Q x Q by Q x P), chunk states B^T X (N x Q by Q x P), read-out C h (Q x N by N x P).
    P = d_in // H
    per_chunk = G * 2 * Q * N * Q + H * (2 * Q * Q * P + 2 * N * Q * P + 2 * Q * N * P)
    assert mamba.flops_per_token(m) == pytest.approx(2 * proj + per_chunk / Q, rel=1e-12)
    assert mamba.state_elems(m) == (4 - 1) * (d_in + 2 * G * N) + d_in * N


def test_mamba1_jamba():
    # Jamba (HF JambaMambaMixer): in_proj 4096 -> 2 x 8192, x_proj 8192 -> 256 + 2 x 16, dt_proj
    # 256 -> 8192, out_proj 8192 -> 4096; the selective scan is memory-bound (no GEMM-class FLOPs).
    m = _model("jamba-v0.1")
    assert mamba.flops_per_token(m) == 2 * (4096 * 16384 + 8192 * 288 + 256 * 8192 + 8192 * 4096)


def test_gated_deltanet_qwen3_next():
    # Qwen3-Next GatedDeltaNet: 16 key heads and 32 value heads of 128; in_proj_qkvz 2048 -> 2 x 2048 +
    # 2 x 4096, in_proj_ba 2048 -> 2 x 32, out_proj 4096 -> 2048. fla's chunked gated delta rule per
    # chunk of C = 64 tokens and value head: K K^T, Q K^T and W = A K (C x C by d_k), U = A V and the
    # intra-chunk output (C x C by d_v), W S, Q S and the state update K^T U (d_k by d_v).
    m = _model("qwen3-next-80b-a3b")
    proj = 2048 * (2 * 2048 + 2 * 4096) + 2048 * 64 + 4096 * 2048
    C, dk, dv = 64, 128, 128
    per_chunk = 32 * (3 * 2 * C * C * dk + 2 * 2 * C * C * dv + 3 * 2 * C * dk * dv)
    assert gated_deltanet.flops_per_token(m) == pytest.approx(2 * proj + per_chunk / C, rel=1e-12)


def test_lm_head_llama31_8b():
    # lm_head 4096 -> 128256.
    assert embedding.head_flops_per_token(_model("llama-3.1-8b")) == 2 * 4096 * 128256
    assert embedding.params(_model("llama-3.1-8b")) == 4096 * 128256


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b", "gpt2"])
def test_blocks_sum_to_the_readers_matmul_flops(name):
    """The blocks of a plain transformer add up to the model's 6 N_active (the reader's count)."""
    m = _model(name)
    fl = attention.flops_per_token(m) + embedding.head_flops_per_token(m)
    per_ffn = moe_ffn.flops_per_token(m) if m.is_moe else mlp.flops_per_token(m)
    fl_model = m.layers * (attention.flops_per_token(m) + per_ffn) + embedding.head_flops_per_token(m)
    assert fl < fl_model
    assert 3 * fl_model == pytest.approx(m.flops_per_token(4096, attention=False), rel=2e-3)


def test_encoder_bert_large():
    # BERT-large (tests/configs/real/bert: BAAI/bge-large-zh-v1.5, BertModel): h 1024, 16 heads of 64,
    # F 4096. HF BertLayer: query / key / value / attention.output.dense 1024 -> 1024 with biases,
    # intermediate.dense 1024 -> 4096 and output.dense 4096 -> 1024 with biases, two LayerNorms.
    m = load_model(CONFIGS / "real" / "bert" / "config.json")
    assert m.arch == "encoder" and not m.causal and not m.lm_head
    proj = 2 * 4 * 1024 * 1024
    core = 2 * 512 * 16 * 64 * 2  # QK^T and PV against all 512 keys: no causal half
    ffn = 2 * (1024 * 4096 + 4096 * 1024)
    assert encoder.flops_per_token(m, 512) == proj + core + ffn == 27_262_976
    # the same layer under a causal mask does half the core
    assert attention.core_flops_per_token(m, 512, causal=True) == core / 2
    assert attention.flops_per_token(m, 512) == proj + core  # the spec is non-causal
    weights = 4 * 1024 * 1024 + 4 * 1024 + 2 * 1024 * 4096 + 4096 + 1024
    assert encoder.params(m) == weights + 2 * 2 * 1024 == 12_596_224  # + two LayerNorms (weight, bias)
    # training FLOPs per token: 3x the 24 layers' forward (BertModel has no vocabulary head)
    assert m.flops_per_token(512) == 3 * 24 * 27_262_976
    assert encoder.frontend_params(m) == encoder.frontend_flops_per_token(m) == 0


def test_cross_attention_whisper_small():
    # Whisper-small (tests/configs/real/whisper): d_model 768, 12 heads of 64, 1500 encoder positions.
    # HF WhisperDecoderLayer.encoder_attn: q_proj (bias), k_proj (no bias), v_proj (bias), out_proj
    # (bias), 768 -> 768 each, and encoder_attn_layer_norm.
    m = load_model(CONFIGS / "real" / "whisper" / "config.json")
    assert m.arch == "encoder_decoder" and m.encoder_tokens(448) == 1500
    q_o = 2 * 2 * 768 * 768
    core = 2 * 1500 * 12 * 64 * 2  # QK^T and PV of each decoder token against all 1500 positions
    assert cross_attention.flops_per_token(m, 1500) == q_o + core == 6_967_296
    assert cross_attention.kv_flops_per_token(m) == 2 * 2 * 768 * 768  # per encoder position
    assert cross_attention.params(m) == 4 * 768 * 768 + 3 * 768 + 2 * 768 == 2_363_136
    # the conv front-end (WhisperEncoder conv1 80 -> 768 and conv2 768 -> 768, kernel 3, conv2
    # stride 2): per encoder position conv1 runs on two log-mel frames
    assert encoder.frontend_params(m) == (3 * 80 * 768 + 768) + (3 * 768 * 768 + 768) == 1_955_328
    assert encoder.frontend_flops_per_token(m) == 2 * 2 * 3 * 80 * 768 + 2 * 3 * 768 * 768
    # the whole model per decoder token: the decoder stack (causal, PaLM's full-context convention)
    # with its head, 12 cross-attentions, and 1500/448 encoder positions' worth of encoder stack,
    # K/V projections of the 12 decoder blocks and front-end
    enc_layer = 2 * 4 * 768 * 768 + 2 * 1500 * 12 * 64 * 2 + 2 * 2 * 768 * 3072
    dec = 6 * (12 * (4 * 768 * 768 + 2 * 768 * 3072) + 51865 * 768) + 6 * 12 * 12 * 128 * 448
    per_enc = 12 * enc_layer + 12 * 2 * 2 * 768 * 768 + encoder.frontend_flops_per_token(m)
    want = dec + 3 * (12 * 6_967_296 + per_enc * 1500 / 448)
    assert m.flops_per_token(448) == pytest.approx(want, rel=1e-12)


GOLDEN = {
    "attention": test_gqa_attention_llama31_8b,
    "mla": test_mla_deepseek_v3,
    "mlp": test_gated_and_plain_mlp,
    "moe": test_moe_mixtral_and_deepseek_v3,
    "mamba": test_mamba2_nemotron_h_8b,
    "gated_deltanet": test_gated_deltanet_qwen3_next,
    "embedding": test_lm_head_llama31_8b,
    "encoder": test_encoder_bert_large,
    "cross_attention": test_cross_attention_whisper_small,
}


def test_every_block_module_is_registered_and_has_a_golden_test():
    """A layer kind is one module: it is in ``blocks.KINDS``, declares its parameters and FLOPs per
    token, and has its golden test above."""
    support = {"context", "stage"}
    found = {
        importlib.import_module(f"autopar.blocks.{i.name}")
        for i in pkgutil.iter_modules(blocks.__path__)
        if i.name not in support
    }
    assert found == set(blocks.KINDS)
    for kind in blocks.KINDS:
        assert kind.KIND in GOLDEN, f"{kind.__name__}: no golden FLOPs test"
        assert callable(kind.params)
        assert callable(getattr(kind, "flops_per_token", None) or getattr(kind, "head_flops_per_token", None))
