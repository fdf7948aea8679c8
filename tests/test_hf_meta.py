"""The field-driven reader against the model's own transformers class, built on the meta device.

Needs the optional extra ``autopar[models]`` (transformers); skipped without it. Two sources of
configs, both real and unedited:

* every config under tests/configs/ and every preset (their sources are in test_hf_configs.py and
  in each preset's ``source``);
* the defaults of transformers' own configuration classes (``LlamaConfig()``, ...: the
  ``configuration_<type>.py`` of the installed transformers is the source), for the model_types
  listed in DEFAULT_CONFIG_TYPES.

On each, total and active parameters of autopar's field reader agree with the meta-device count
within 1 %.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("transformers") is None:  # found, not imported: collection stays fast
    pytest.skip("transformers is not installed", allow_module_level=True)

from autopar.hf_meta import kind_of, meta_count  # noqa: E402
from autopar.model import list_presets, load_model, raw_config, read_config_file  # noqa: E402

CONFIGS = Path(__file__).with_name("configs")
# (a transformers 5 validator refuses this published config: mamba_n_heads does not divide
# mamba_expand * hidden_size; the field reader reads it, checked against the published total)
LIBRARY_REFUSES = {"falcon-h1-0.5b"}
# This published config has no tie_word_embeddings field: transformers 5 then ties the LM head of
# Mistral3ForConditionalGeneration (the wrapper's default), while the checkpoint ships an untied one
# (the published 24 B needs it: 23.57 B text + 0.44 B tower). The two counts differ by the head alone.
HEAD_TIED_BY_LIBRARY = {"mistral-small-3.1-24b"}
NO_CLASS = {"internlm2_5-7b", "grok-1", "kimi-k2"}  # remote code only: no transformers class

# model_types whose transformers default config (``CONFIG_MAPPING[t]()``) the field reader reads
DEFAULT_CONFIG_TYPES = [
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next",
    "deepseek_v3", "gemma", "gemma2", "gemma3", "gemma3_text", "cohere", "glm", "glm4", "gpt2",
    "gpt_neox", "gpt_oss", "granite", "granitemoe", "helium", "internlm3", "exaone", "falcon",
    "falcon_h1", "jamba", "llama4", "llama4_text", "ministral3", "olmo", "olmo2", "olmo3", "olmoe",
    "phi3", "phimoe", "starcoder2", "vaultgemma", "cwm",
    # 2025-2026 families (issue 22)
    "apertus", "apertus1p5_text", "arcee", "cohere2", "exaone4", "seed_oss", "smollm3", "ernie4_5",
    "minimax_m2", "granitemoeshared", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe",
    "glm4v", "hunyuan_v1_dense", "dots1", "nemotron_h", "bamba", "granitemoehybrid", "gptj", "codegen",
    "gpt_bigcode", "hunyuan_v1_moe", "mistral4", "exaone4_5", "ernie4_5_moe", "exaone_moe", "phi", "persimmon",
    "stablelm", "fuyu", "bloom", "gpt_neo", "glm4_moe_lite", "flex_olmo",
]  # fmt: skip
# Where the class default cannot be built or leaves a part out, these arguments are passed to it
# (each the value of the family's published flagship config).
DEFAULT_OVERRIDES: dict[str, dict] = {
    "hunyuan_v1_dense": {"head_dim": 128},  # the default head_dim None does not build
    "dots1": {
        "n_routed_experts": 128,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "first_k_dense_replace": 1,
    },
    "granitemoeshared": {"shared_intermediate_size": 1024},
    "hunyuan_v1_moe": {
        "head_dim": 128,
        "num_experts": 64,
        "moe_topk": 8,
        "intermediate_size": 3072,
    },  # the default 0 has no shared expert
    # the defaults have no attention block at all: one, as Granite 4 / Bamba place them
    "bamba": {"attn_layer_indices": [9, 18, 27]},
    "granitemoehybrid": {"layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 26},
}


def test_granite4_dense_hybrid_uses_the_shared_mlp() -> None:
    from transformers import GraniteMoeHybridConfig

    raw = GraniteMoeHybridConfig(
        num_local_experts=0,
        shared_intermediate_size=8192,
        num_hidden_layers=4,
        layer_types=["mamba"] * 3 + ["attention"],
    ).to_dict()
    spec = load_model(dict(raw))
    assert (spec.num_experts, spec.ffn_hidden, spec.mamba_layers, spec.attn_layers) == (0, 8192, 3, 1)
    mc, _ = meta_count(raw)
    assert mc is not None and spec.total_params == mc.text_total


def _agree(name: str, raw: dict) -> tuple[float, float | None]:
    spec = load_model(dict(raw))
    mc, how = meta_count(raw)
    assert mc is not None, f"{name}: {how}"
    assert "other" not in mc.by_kind, f"{name}: unclassified parameters {mc.by_kind}"
    dt = spec.total_params / mc.text_total - 1
    da = None if mc.text_active is None else spec.active_params / mc.text_active - 1
    return dt, da


def _shipped() -> list[tuple[str, dict]]:
    out = [(p.stem, read_config_file(p)) for p in sorted(CONFIGS.glob("*.json"))]
    out += [(f"preset:{pid}", raw_config(pid) or {}) for pid in list_presets()]
    return out


@pytest.mark.parametrize("name,raw", _shipped(), ids=lambda x: x if isinstance(x, str) else "")
def test_shipped_configs_agree_with_meta_count(name: str, raw: dict) -> None:
    short = name.removeprefix("preset:")
    if short in NO_CLASS or short in LIBRARY_REFUSES:
        mc, how = meta_count(raw)
        assert mc is None and how, name  # the field reader stays the only one, and says why
        load_model(dict(raw))
        return
    if short in HEAD_TIED_BY_LIBRARY:
        spec, (mc, _) = load_model(dict(raw)), meta_count(raw)
        assert mc is not None and "head" not in mc.by_kind
        assert spec.total_params - mc.text_total == spec.vocab * spec.hidden
        return
    dt, da = _agree(name, raw)
    assert abs(dt) < 0.01, f"{name}: total {dt:+.3%} from the meta-device count"
    assert da is None or abs(da) < 0.01, f"{name}: active {da:+.3%} from the meta-device count"


@pytest.mark.parametrize("model_type", DEFAULT_CONFIG_TYPES)
def test_transformers_default_configs_agree(model_type: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = CONFIG_MAPPING[model_type](**DEFAULT_OVERRIDES.get(model_type, {})).to_dict()
    dt, da = _agree(model_type, raw)
    assert abs(dt) < 0.01, f"{model_type}: total {dt:+.3%} from the meta-device count"
    assert da is None or abs(da) < 0.01, f"{model_type}: active {da:+.3%}"


def test_kinds_of_parameter_names() -> None:
    assert kind_of("model.layers.3.mlp.experts.gate_up_proj") == "experts"
    assert kind_of("model.layers.3.mlp.shared_expert.up_proj.weight") == "shared_experts"
    assert kind_of("model.layers.3.shared_mlp.input_linear.weight") == "shared_experts"
    assert kind_of("model.layers.3.mlp.gate.weight") == "router"
    assert kind_of("model.layers.3.self_attn.q_norm.weight") == "attention"
    assert kind_of("model.layers.3.input_layernorm.weight") == "norms"
    assert kind_of("model.layers.0.mixer.A_log") == "ssm"
    assert kind_of("model.vision_tower.blocks.0.attn.qkv.weight") == "towers"
    assert kind_of("lm_head.weight") == "head" and kind_of("model.embed_tokens.weight") == "embeddings"


def test_moe_active_count_is_topk_of_experts() -> None:
    raw = read_config_file(CONFIGS / "qwen2-57b-a14b.json")
    mc, _ = meta_count(raw)
    assert mc is not None and mc.active is not None
    ex = mc.by_kind["experts"]
    assert mc.total - mc.active == ex - ex * raw["num_experts_per_tok"] // raw["num_experts"]


def test_without_the_library_the_field_reader_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    from autopar.hf_meta import dit_meta_count

    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "diffusers", None)
    raw = read_config_file(CONFIGS / "mistral-7b-v0.1.json")
    assert meta_count(raw) == (None, "transformers is not installed (pip install 'autopar[models]')")
    assert dit_meta_count({"_class_name": "FluxTransformer2DModel"})[0] is None
    assert load_model(dict(raw)).total_params > 0


def test_no_class_says_why() -> None:
    mc, how = meta_count({"model_type": "no_such_type", "hidden_size": 8})
    assert mc is None and "no class for model_type 'no_such_type'" in how
    mc, how = meta_count({"model_type": "no_such_type", "auto_map": {"AutoConfig": "x.Y"}})
    assert mc is None and "remote code" in how


def test_cli_model_config_shows_the_reader(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text((CONFIGS / "olmoe-1b-7b-0924.json").read_text())
    r = subprocess.run(
        [sys.executable, "-m", "autopar", "model", "--config", str(cfg), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["reader"] == "fields+transformers" and d["meta"]["model_class"] == "OlmoeForCausalLM"
    assert abs(d["total_params"] / d["meta"]["text_total_params"] - 1) < 0.01
    r = subprocess.run(
        [sys.executable, "-m", "autopar", "model", "--config", str(cfg), "--reader", "fields"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "read by: autopar's field reader" in r.stdout


def test_hunyuan_a13b_per_layer_lists() -> None:
    # Hunyuan-A13B's cost fields as a public test fixture transcribes tencent/Hunyuan-A13B's config.json
    # (per-layer lists of one value each; tie_word_embeddings not given); published: 80 B total, 13 B active
    c = {
        "architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe", "hidden_size": 4096,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 3072, "vocab_size": 128167, "num_experts": 64, "moe_intermediate_size": [3072] * 32,
        "moe_topk": [8] * 32, "num_shared_expert": [1] * 32, "use_qk_norm": True,
    }  # fmt: skip
    spec = load_model(dict(c))
    mc, _ = meta_count(c)
    assert mc is not None and mc.text_active is not None
    assert spec.total_params == mc.text_total and spec.active_params == mc.text_active
    assert abs(spec.total_params / 80e9 - 1) < 0.015 and abs(spec.active_params / 13e9 - 1) < 0.03


def test_cli_counts_what_it_refuses_to_cost_when_asked(tmp_path: Path) -> None:
    # A BERT-base-shaped ELECTRA discriminator (an encoder autopar does not read): refused as an
    # encoder, still counted
    bert = {
        "architectures": ["ElectraForPreTraining"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
        "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "electra", "num_attention_heads": 12,
        "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute", "type_vocab_size": 2,
        "vocab_size": 30522, "embedding_size": 768,
    }  # fmt: skip
    cfg = tmp_path / "electra-base.json"
    cfg.write_text(json.dumps(bert))
    cmd = [sys.executable, "-m", "autopar", "model", "--config", str(cfg)]
    r = subprocess.run(
        [*cmd, "--reader", "transformers", "--json"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and "not costed" in r.stderr and "encoder" in r.stderr
    d = json.loads(r.stdout)
    assert d["reader"] == "transformers" and d["spec"] is None
    assert abs(d["meta"]["total_params"] / 110e6 - 1) < 0.01  # BERT-base: 110 M
    for reader in ("fields", "auto"):  # refused alike with and without the optional extra
        r = subprocess.run([*cmd, "--reader", reader], capture_output=True, text=True, timeout=300)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "encoder" in lines[0]
