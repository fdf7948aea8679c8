"""Tests for autopar.model: preset totals against published counts, the HF normalizer, FLOPs, KV cache."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path

import pytest

from autopar.errors import ModelConfigError, UnsupportedArchitecture
from autopar.model import ModelSpec, list_presets, load_model

DATA_VOCAB = [  # model_preset vocabulary of the data files (shared/data/README.md)
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "gpt3-175b",
    "nemotron-4-15b",
    "nemotron-4-340b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "grok-1",
    "deepseek-v3",
    "kimi-k2",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "gpt-oss-120b",
]


def hf(preset: str) -> dict:
    doc = json.loads((Path(__file__).parents[1] / "autopar" / "presets" / f"{preset}.json").read_text())
    return copy.deepcopy(doc["hf"])


# ------------------------------------------------------------------------------------------ presets
def test_every_data_preset_exists_and_is_well_formed():
    presets = list_presets()
    assert set(DATA_VOCAB) <= set(presets)
    pdir = Path(__file__).parents[1] / "autopar" / "presets"
    for pid in presets:
        doc = json.loads((pdir / f"{pid}.json").read_text())
        assert set(doc) - {"hf_id"} == {"id", "source", "hf", "notes"}
        assert doc["id"] == pid and doc["source"] and doc["notes"]
        if "hf_id" in doc:  # the loadable checkpoint a serving export names: the repo the config came from
            assert doc["source"].startswith(f"{doc['hf_id']} (config.json)"), pid
        m = load_model(pid)
        assert m.name == pid and m.source == doc["source"]


def test_pyproject_ships_the_presets():
    py = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "autopar.presets" in py["tool"]["setuptools"]["packages"]
    assert "*.json" in py["tool"]["setuptools"]["package-data"]["autopar.presets"]


# (preset, published total, published active or None, relative tolerance). Sources in each preset's notes.
GOLDEN = [
    ("llama-2-7b", 6.74e9, None, 0.01),
    ("llama-2-13b", 13.02e9, None, 0.01),
    ("llama-2-70b", 68.98e9, None, 0.01),
    ("llama-3.1-8b", 8.03e9, None, 0.005),
    ("llama-3.1-70b", 70.55e9, None, 0.005),
    ("llama-3.1-405b", 405.85e9, None, 0.005),
    ("gpt3-175b", 175e9, None, 0.01),
    ("nemotron-4-15b", 15.7e9, None, 0.01),  # 3.2B embedding + 12.5B non-embedding (arXiv 2402.16819)
    ("nemotron-4-340b", 341.0e9, None, 0.01),  # 9.4B + 331.6B (arXiv 2406.11704)
    ("mixtral-8x7b", 46.70e9, 12.88e9, 0.005),
    ("mixtral-8x22b", 140.6e9, 39.1e9, 0.005),
    ("grok-1", 314e9, None, 0.01),
    ("deepseek-v3", 671.0e9, 37.5e9, 0.005),
    ("qwen3-30b-a3b", 30.53e9, 3.35e9, 0.005),
    ("qwen3-235b-a22b", 235.09e9, 22.19e9, 0.005),
    ("qwen3-8b", 8.19e9, None, 0.005),
    ("qwen2.5-7b", 7.62e9, None, 0.005),
    ("qwen2.5-72b", 72.71e9, None, 0.005),
    ("gpt-oss-120b", 116.83e9, None, 0.005),
]


@pytest.mark.parametrize("pid,total,active,tol", GOLDEN)
def test_published_parameter_counts(pid, total, active, tol):
    m = load_model(pid)
    assert m.total_params == pytest.approx(total, rel=tol)
    if active is not None:
        assert m.active_params == pytest.approx(active, rel=tol)
    if not m.is_moe:
        assert m.active_params == m.total_params


def test_gpt_oss_active_counts_unembedding_only():
    # OpenAI's model card: 5.13B active = non-embedding active + unembedding.
    m = load_model("gpt-oss-120b")
    assert m.active_params - m.embedding_params == pytest.approx(5.13e9, rel=0.005)
    assert (m.num_experts, m.moe_topk, m.moe_ffn_hidden, m.head_dim) == (128, 4, 2880, 64)
    assert (m.sliding_window, m.sliding_window_layers) == (128, 18)


def test_kimi_k2_against_released_config_and_report():
    m = load_model("kimi-k2")
    assert (m.num_experts, m.heads, m.first_dense_layers, m.moe_layers, m.vocab) == (384, 64, 1, 60, 163840)
    assert m.active_params == pytest.approx(32.6e9, rel=0.01)
    # The K2 report's 1.04T is not reproducible from the released config.json, which gives 1.026T.
    assert m.total_params == pytest.approx(1.04e12, rel=0.015)


def test_deepseek_v3_structure_and_mtp():
    m = load_model("deepseek-v3")
    assert m.is_mla and m.is_moe
    assert (m.first_dense_layers, m.moe_layers, m.dense_layers, m.mtp_layers) == (3, 58, 3, 1)
    assert (m.qk_head_dim, m.v_dim) == (192, 128)
    assert m.shared_expert_ffn == 2048 and m.ffn_hidden == 18432
    # 685B checkpoint = main model + MTP module + a second copy of embedding and output head.
    assert m.total_params + m.mtp_params + 2 * m.vocab * m.hidden == pytest.approx(685e9, rel=0.005)


def test_nemotron_and_gpt3_shapes():
    n = load_model("nemotron-4-340b")
    assert (n.gated_mlp, n.norm, n.kv_heads, n.head_dim, n.tie_embeddings) == (
        False,
        "layernorm",
        8,
        192,
        False,
    )
    g = load_model("GPT3-175B")  # case-insensitive
    assert (g.gated_mlp, g.norm, g.kv_heads, g.ffn_hidden, g.tie_embeddings) == (
        False,
        "layernorm",
        96,
        49152,
        True,
    )
    assert g.head_params == 0


# -------------------------------------------------------------------------------------------- FLOPs
def test_flops_llama3_8b_by_hand_and_megatron():
    m = load_model("llama-3.1-8b")
    h, L, a, kv, d, F, V, s = 4096, 32, 32, 8, 128, 14336, 128256, 8192
    n_matmul = L * (2 * h * a * d + 2 * h * kv * d + 3 * h * F) + V * h  # logits GEMM in, embedding out
    attn = 6 * L * s * a * (d + d)  # 3 x (2 s a d for QK^T + 2 s a d for PV) per layer
    assert m.flops_per_token(s) == pytest.approx(6 * n_matmul + attn, rel=1e-12)
    assert m.flops_per_token(s, causal=True) == pytest.approx(6 * n_matmul + attn / 2, rel=1e-12)
    assert m.flops_per_token(s, attention=False) == pytest.approx(6 * n_matmul, rel=1e-12)
    assert attn == 12 * L * h * s  # PaLM App. B: 12 L H Q T with H*Q = h
    # Megatron-LM num_floating_point_operations (per token), SwiGLU multiplier 3/2.
    megatron = 12 * L * h**2 * ((1 + kv / a + s / h) + (F / h) * 1.5 + V / (2 * L * h))
    assert m.flops_per_token(s) == pytest.approx(megatron, rel=1e-12)


def test_flops_moe_mla_and_sliding():
    ds = load_model("deepseek-v3")
    s = 4096
    no_attn = ds.flops_per_token(s, attention=False)
    assert no_attn == pytest.approx(6 * (ds.active_params - ds.embedding_params), rel=0.001)
    assert ds.flops_per_token(s) - no_attn == pytest.approx(6 * 61 * s * 128 * (192 + 128))
    oss = load_model("gpt-oss-120b")
    per_ctx = 6 * 64 * (64 + 64)
    extra = oss.flops_per_token(s) - oss.flops_per_token(s, attention=False)
    assert extra == pytest.approx(per_ctx * (18 * s + 18 * 128))
    extra_c = oss.flops_per_token(s, causal=True) - oss.flops_per_token(s, attention=False)
    assert extra_c == pytest.approx(per_ctx * (18 * s / 2 + 18 * (128 - 128**2 / (2 * s))))


def test_tied_head_still_costs_a_logits_gemm():
    g = load_model("gpt3-175b")
    assert g.flops_per_token(2048, attention=False) == pytest.approx(
        6 * (g.total_params - g.embedding_params) + 6 * g.vocab * g.hidden, rel=1e-3
    )


# ----------------------------------------------------------------------------------------- KV cache
def test_kv_cache_goldens():
    assert load_model("llama-3.1-70b").kv_cache_bytes_per_token() == 80 * 2 * 8 * 128 * 2  # 320 KiB
    ds = load_model("deepseek-v3")
    assert ds.kv_cache_bytes_per_token() == 61 * (512 + 64) * 2
    assert ds.kv_cache_bytes_per_token(1) == 61 * 576
    oss = load_model("gpt-oss-120b")
    assert oss.kv_cache_bytes_per_token() == 36 * 2 * 8 * 64 * 2
    per_layer_tok = 2 * 8 * 64 * 2
    assert oss.kv_cache_bytes(131072) == (18 * 131072 + 18 * 128) * per_layer_tok
    assert oss.kv_cache_bytes(100) == 36 * 100 * per_layer_tok


# ------------------------------------------------------------------------------------ HF normalizer
def test_text_config_nesting_matches_flat_config():
    flat = hf("qwen3-8b")
    wrapped = {
        "model_type": "qwen3_vl",
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "text_config": dict(flat, model_type="qwen3_vl_text"),
        "vision_config": {"depth": 27},
    }
    assert load_model(wrapped).total_params == load_model("qwen3-8b").total_params


def test_llama4_scout_text_config():
    scout = {
        "model_type": "llama4",
        "architectures": ["Llama4ForConditionalGeneration"],
        "vision_config": {"hidden_size": 1408},
        "text_config": {
            "model_type": "llama4_text",
            "hidden_size": 5120,
            "num_hidden_layers": 48,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 8192,
            "intermediate_size_mlp": 16384,
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 1,
            "vocab_size": 202048,
            "attention_chunk_size": 8192,
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3"},
        },
    }
    m = load_model(scout)
    assert (m.moe_layers, m.ffn_hidden, m.shared_expert_ffn, m.moe_ffn_hidden) == (48, 0, 8192, 8192)
    assert (m.sliding_window, m.sliding_window_layers) == (8192, 36)  # chunked on 3 of every 4 layers
    assert m.active_params == pytest.approx(17e9, rel=0.02)  # "17B active" (text decoder)
    maverick = copy.deepcopy(scout)
    maverick["text_config"].update(num_local_experts=128, interleave_moe_layer_step=2)
    mv = load_model(maverick)
    assert (mv.moe_layers, mv.dense_layers, mv.first_dense_layers, mv.ffn_hidden) == (24, 24, 1, 16384)


def test_rope_theta_and_rope_parameters_forms_are_equivalent():
    cfg = hf("llama-3.1-8b")
    new = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = dict(cfg["rope_scaling"], rope_theta=cfg["rope_theta"])
    assert load_model(new).to_dict() == load_model(cfg).to_dict()


def test_mha_default_and_explicit_head_dim():
    cfg = hf("llama-2-7b")
    del cfg["num_key_value_heads"]
    m = load_model(cfg)
    assert m.kv_heads == 32 and m.head_dim == 128
    q = load_model("qwen3-30b-a3b")
    assert q.head_dim == 128 and q.hidden // q.heads == 64  # Qwen3 sets head_dim explicitly


def test_qkv_bias_detection():
    assert load_model("qwen2.5-7b").qkv_bias  # Qwen2: always
    assert not load_model("qwen3-8b").qkv_bias
    assert load_model("gpt-oss-120b").qkv_bias  # attention_bias: true
    q = load_model("qwen2.5-7b")
    no_bias = q.model_copy(update={"qkv_bias": False})
    assert q.attn_params_per_layer - no_bias.attn_params_per_layer == (28 + 2 * 4) * 128


def test_qwen2_moe_shared_expert_and_sparse_schedule():
    cfg = {
        "model_type": "qwen2_moe",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "moe_intermediate_size": 2560,
        "shared_expert_intermediate_size": 20480,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 151936,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }
    m = load_model(cfg)  # Qwen2-57B-A14B: "57B total, 14B activated"
    assert m.total_params == pytest.approx(57.4e9, rel=0.01)
    assert m.active_params == pytest.approx(14.2e9, rel=0.01)
    assert m.shared_expert_params == 3 * 3584 * 20480
    sparse = load_model(dict(cfg, decoder_sparse_step=2, mlp_only_layers=[1]))
    # MoE where (i+1) % 2 == 0 and i not in mlp_only_layers: layers 3, 5, ..., 27
    assert (sparse.moe_layers, sparse.first_dense_layers, sparse.ffn_hidden) == (13, 3, 18944)


def test_deepseek_schedule_and_mla_without_q_lora():
    cfg = hf("deepseek-v3")
    cfg.update(num_hidden_layers=8, first_k_dense_replace=2, moe_layer_freq=2, q_lora_rank=None)
    m = load_model(cfg)
    assert (m.moe_layers, m.first_dense_layers, m.q_lora_rank) == (3, 2, 0)  # layers 2, 4, 6
    h, a = 7168, 128
    assert m.attn_params_per_layer == (h * a * 192 + h * 576 + 512 + 512 * a * 256 + a * 128 * h)


def test_sliding_window_rules():
    mistral = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "sliding_window": 4096,
    }
    assert load_model(mistral).sliding_window_layers == 32
    assert load_model(dict(mistral, sliding_window=None)).sliding_window_layers == 0
    qwen = hf("qwen2.5-7b")
    assert load_model(qwen).sliding_window_layers == 0  # use_sliding_window false
    m = load_model(dict(qwen, use_sliding_window=True, max_window_layers=20, sliding_window=4096))
    assert (m.sliding_window, m.sliding_window_layers) == (4096, 8)
    bad = dict(hf("gpt-oss-120b"), layer_types=["linear_attention"] * 36)
    with pytest.raises(UnsupportedArchitecture, match="linear_attention"):
        load_model(bad)


def test_defaults_of_layer_types_and_dense_deepseek():
    oss = hf("gpt-oss-120b")
    del oss["layer_types"]  # GptOssConfig default: alternating, sliding first
    assert load_model(oss).sliding_window_layers == 18
    ds = hf("deepseek-v3")
    for k in ("n_routed_experts", "moe_intermediate_size", "n_shared_experts"):
        ds[k] = None
    m = load_model(ds)
    assert (m.is_moe, m.moe_layers, m.ffn_hidden) == (False, 0, 18432)


def test_architectures_fallback_and_gpt_neox():
    cfg = hf("llama-3.1-8b")
    del cfg["model_type"]
    assert load_model(cfg).total_params == load_model("llama-3.1-8b").total_params
    neox = {
        "model_type": "gpt_neox",
        "hidden_size": 6144,
        "num_hidden_layers": 44,
        "num_attention_heads": 64,
        "intermediate_size": 24576,
        "vocab_size": 50432,
    }
    m = load_model(neox)  # GPT-NeoX-20B: 20.55B with untied head (position embeddings are rotary)
    assert (m.gated_mlp, m.norm, m.tie_embeddings, m.qkv_bias) == (False, "layernorm", False, True)
    assert m.total_params == pytest.approx(20.55e9, rel=0.01)


# ------------------------------------------------------------------------------ files, dicts, errors
def test_load_from_file_and_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf("mixtral-8x7b")))
    a = load_model(tmp_path / "config.json")
    b = load_model(str(tmp_path))
    assert a.total_params == b.total_params == load_model("mixtral-8x7b").total_params
    assert a.source.endswith("config.json")


def test_raw_dims_from_csv_like_row_and_round_trip():
    row = {
        "name": "gpt-1.7b",
        "hidden": "2304",
        "layers": "24",
        "heads": "24",
        "kv_heads": "",
        "ffn_hidden": "9216.0",
        "vocab": "51200",
        "gated_mlp": "false",
        "norm": "layernorm",
        "tie_embeddings": "1",
        "num_experts": None,
    }
    m = load_model(row)
    assert (m.kv_heads, m.head_dim, m.ffn_hidden, m.gated_mlp, m.tie_embeddings) == (
        24,
        96,
        9216,
        False,
        True,
    )
    spec = load_model("deepseek-v3")
    assert load_model(spec.to_dict()) == spec
    with pytest.raises(ModelConfigError, match="total_params"):
        load_model(dict(spec.to_dict(), total_params=1))


def test_error_unknown_architecture():
    # An unknown model_type loads only when every field is understood; the first other one is named.
    cfg = dict(hf("llama-3.1-8b"), model_type="brand_new", ssm_cfg={"d_state": 16})
    with pytest.raises(UnsupportedArchitecture) as e:
        load_model(cfg)
    msg = str(e.value)
    assert "brand_new" in msg and "'ssm_cfg'" in msg and "llama" in msg and "deepseek_v3" in msg
    del cfg["ssm_cfg"]
    assert load_model(cfg).total_params == load_model("llama-3.1-8b").total_params
    with pytest.raises(UnsupportedArchitecture, match="hidden_act"):
        load_model(dict(cfg, hidden_act="gelu"))  # gated or plain MLP cannot be told apart


def test_error_missing_field():
    cfg = hf("llama-3.1-8b")
    del cfg["hidden_size"]
    with pytest.raises(ModelConfigError, match="hidden_size") as e:
        load_model(cfg)
    assert not isinstance(e.value, UnsupportedArchitecture)
    cfg = hf("deepseek-v3")
    del cfg["moe_intermediate_size"]
    with pytest.raises(ModelConfigError, match="moe_intermediate_size"):
        load_model(cfg)
    with pytest.raises(ModelConfigError, match="'hidden'"):
        load_model({"layers": 2, "heads": 2, "ffn_hidden": 8, "vocab": 10})


def test_error_malformed_json(tmp_path):
    p = tmp_path / "broken_config.json"
    p.write_text('{"model_type": "llama", "hidden_size": 4096,,}')
    with pytest.raises(ModelConfigError, match="broken_config.json"):
        load_model(p)


def test_error_unknown_raw_key_and_unknown_name():
    with pytest.raises(ModelConfigError, match="hiden"):
        load_model({"hiden": 4096, "layers": 2, "heads": 32, "ffn_hidden": 8, "vocab": 10})
    with pytest.raises(ModelConfigError, match="llama-9"):
        load_model("llama-9")


def test_error_bad_values():
    cfg = hf("llama-3.1-8b")
    cfg["num_hidden_layers"] = "thirty-two"
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        load_model(cfg)
    with pytest.raises(ModelConfigError, match="moe_layers"):
        ModelSpec(
            name="x",
            hidden=64,
            layers=2,
            heads=4,
            kv_heads=4,
            head_dim=16,
            ffn_hidden=0,
            vocab=10,
            num_experts=4,
            moe_topk=2,
            moe_ffn_hidden=32,
        )
    with pytest.raises(ModelConfigError, match="kv_heads"):
        load_model({"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 3, "ffn_hidden": 8, "vocab": 10})


def test_spec_is_frozen_and_strict():
    m = load_model("llama-3.1-8b")
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        m.hidden = 1  # type: ignore[misc]
    with pytest.raises(Exception):  # noqa: B017 - extra="forbid"
        ModelSpec(**m.model_dump(), bogus=1)
    d = m.to_dict()
    assert d["total_params"] == m.total_params and d["active_params"] == m.active_params
    assert all(
        isinstance(getattr(m, p), int)
        for p in (
            "attn_params_per_layer",
            "dense_mlp_params",
            "expert_params",
            "shared_expert_params",
            "router_params",
            "norm_params_per_layer",
            "embedding_params",
            "head_params",
            "final_norm_params",
            "total_params",
            "active_params",
            "mtp_params",
            "dense_layers",
            "qk_head_dim",
            "v_dim",
        )
    )


# Classic decoders published by dimensions only: each family's paper's conventions, against the
# published totals (PaLM Table 1: 540.35 B; BLOOM model card: 176,247,271,424; OPT and GPT-3: 175 B,
# learned positions not counted; MT-NLG 530 B).
@pytest.mark.parametrize(
    "name,h,L,a,published",
    [
        ("PaLM 540B", 18432, 118, 48, 540.35e9),
        ("BLOOM-176B", 14336, 70, 112, 176.247e9),
        ("OPT-175B", 12288, 96, 96, 175e9),
        ("MT-NLG 530B", 20480, 105, 128, 530e9),
        ("GPT-3 175B", 12288, 96, 96, 175e9),
    ],
)
def test_classic_decoders_by_dimensions(name: str, h: int, L: int, a: int, published: float) -> None:
    from autopar.model import classic_decoder

    spec, notes = classic_decoder(name, hidden=h, layers=L, heads=a)
    assert abs(spec.total_params / published - 1) < 0.01, spec.total_params
    assert not spec.gated_mlp or "PaLM" in name  # GELU/ReLU MLPs; PaLM's SwiGLU
    assert spec.norm.startswith("layernorm") and notes and "ffn_hidden=4*hidden" in " ".join(notes)
    given, _ = classic_decoder(name, hidden=h, layers=L, heads=a, ffn_hidden=3 * h, vocab=1000)
    assert given.ffn_hidden == 3 * h and given.vocab == 1000  # sizes given win over conventions
