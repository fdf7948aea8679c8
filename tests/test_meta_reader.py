"""A language model read by its own code (autopar/own_code.py): ModelSpec from module shapes on meta.

Needs the optional extra ``autopar[models]`` (transformers); skipped without it.

* Agreement: on every real, unedited config under tests/configs/real (and tests/configs/, and the
  presets) that both the field reader and the own-code reader read, the two give the same costs:
  total and active parameters, training FLOPs per token at 4,096 tokens and KV-cache bytes per token.
* The configs only the own-code reader reads load within 1 % of the class's own count (the truth
  studies/model_configs.py scores), and say in their source and warnings how they were read.
* A module ModelSpec cannot cost is refused by name, with exit status 2 and one line via the CLI.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

if importlib.util.find_spec("transformers") is None:  # found, not imported: collection stays fast
    pytest.skip("transformers is not installed", allow_module_level=True)

from autopar.errors import AutoparError, UnsupportedArchitecture  # noqa: E402
from autopar.hf_meta import meta_count  # noqa: E402
from autopar.model import (  # noqa: E402
    ModelSpec,
    list_presets,
    load_model,
    raw_config,
    read_by_own_code,
    read_config_file,
)
from autopar.own_code import OWN_CODE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "configs" / "real"
CONFIGS = ROOT / "tests" / "configs"
# Refused by the field reader for an unknown model_type, read by their own class (issue 22).
OWN_CODE_ONLY = ("llava-v1.5", "mpt", "muse-glimmer", "step-3.7")
# This published config has no tie_word_embeddings field: transformers 5 ties the LM head of
# Mistral3ForConditionalGeneration (the wrapper's default) while the checkpoint ships an untied one,
# which the field reader counts (see tests/test_hf_meta.py). The own-code reader reads what the
# class builds, so the two differ by the head alone.
HEAD_TIED_BY_LIBRARY = {"mistral-small-3.1-24b"}
SEQ = 4096


def _items() -> list[tuple[str, str]]:
    real = [(f"real/{p.parent.name}", str(p)) for p in sorted(REAL.glob("*/config.json"))]
    flat = [(p.stem, str(p)) for p in sorted(CONFIGS.glob("*.json"))]
    return real + flat + [(f"preset/{n}", n) for n in list_presets()]


@cache
def _both(key: str, where: str) -> tuple[ModelSpec | None, ModelSpec | None, str]:
    """(field reader's spec, own-code reader's spec, why one is missing)."""
    raw = raw_config(where)
    if raw is None or "_class_name" in raw:
        return None, None, "not a language-model config"
    why = []
    try:
        fields = load_model(where, own_code=False)
    except AutoparError as e:
        fields = None
        why.append(f"field reader: {e.message}")
    try:
        own = read_by_own_code(raw, name=key, source=where)
        if own is None:
            why.append("no transformers class")
    except AutoparError as e:
        own = None
        why.append(f"own code: {e.message}")
    return fields, own, "; ".join(why)


def _costs(spec: ModelSpec) -> dict[str, float]:
    return {
        "total_params": spec.total_params,
        "active_params": spec.active_params,
        "flops_per_token": spec.flops_per_token(SEQ),
        "flops_per_token_causal": spec.flops_per_token(SEQ, causal=True),
        "kv_bytes_per_token": spec.kv_cache_bytes_per_token(),
        "kv_bytes_at_4096": spec.kv_cache_bytes(SEQ),
        "block_pattern": spec.block_pattern,  # the order pipeline stages are costed in
    }


@pytest.mark.parametrize("key,where", _items(), ids=[k for k, _ in _items()])
def test_both_readers_give_the_same_costs(key: str, where: str) -> None:
    fields, own, why = _both(key, where)
    if fields is None or own is None:
        pytest.skip(f"not read by both: {why}")
    if key.split("/")[-1] in HEAD_TIED_BY_LIBRARY:
        assert own.tie_embeddings and not fields.tie_embeddings
        assert fields.total_params - own.total_params == fields.vocab * fields.hidden
        return
    assert _costs(own) == _costs(fields), {
        k: (v, getattr(own, k)) for k, v in fields.model_dump().items() if getattr(own, k) != v
    }
    assert OWN_CODE in own.source and OWN_CODE not in fields.source


def test_the_agreement_covers_most_configs() -> None:
    """The agreement test is not vacuous: most language-model configs are read by both readers."""
    both = [k for k, w in _items() if all(x is not None for x in _both(k, w)[:2])]
    assert len(both) >= 60, both
    assert any("deepseek" in k for k in both) and any("gpt-oss" in k for k in both)  # MLA, sinks
    assert any("llama-4" in k for k in both) and any("gemma-3" in k for k in both)  # chunked, sliding
    assert any("phi-3" in k for k in both) and any("gpt2" in k for k in both)  # fused qkv, Conv1D
    assert any("nemotron-h" in k for k in both) and any("jamba" in k for k in both)  # Mamba2, Mamba1
    assert any("qwen3-next" in k for k in both) and any("qwen3.5" in k for k in both)  # Gated DeltaNet


@pytest.mark.parametrize("arch", OWN_CODE_ONLY)
def test_configs_only_the_own_code_reads(arch: str) -> None:
    path = REAL / arch / "config.json"
    raw = read_config_file(path)
    with pytest.raises(UnsupportedArchitecture, match="is not one autopar knows"):
        load_model(path, own_code=False)
    spec = load_model(path)  # the field reader refuses; its own class reads it
    truth, how = meta_count(raw)
    assert truth is not None, how
    assert truth.text_active is not None
    assert abs(spec.total_params / truth.text_total - 1) <= 0.01, (spec.total_params, truth.text_total)
    assert abs(spec.active_params / truth.text_active - 1) <= 0.01, (spec.active_params, truth.text_active)
    assert OWN_CODE in spec.source and str(path) in spec.source
    assert spec.warnings[0].startswith(f"{OWN_CODE}: transformers ")


def test_shapes_read_per_kind() -> None:
    """What the module shapes say, field by field, on four real configs no field reader knows."""
    mpt = load_model(REAL / "mpt" / "config.json")  # fused Wqkv, plain GELU MLP, LayerNorm without bias
    assert (mpt.heads, mpt.kv_heads, mpt.head_dim, mpt.ffn_hidden) == (32, 32, 128, 16384)
    assert (mpt.gated_mlp, mpt.norm, mpt.tie_embeddings, mpt.max_position) == (
        False,
        "layernorm_nobias",
        True,
        2048,
    )
    muse = load_model(REAL / "muse-glimmer" / "config.json")  # a separate per-channel gate, sandwich norms
    assert muse.attn_output_gate and muse.norms_per_layer == 4 and muse.sliding_window_layers > 0
    step = load_model(REAL / "step-3.7" / "config.json")  # fused 3-D experts, shared expert, 3 dense layers
    assert (step.num_experts, step.moe_ffn_hidden, step.shared_expert_ffn) == (288, 1280, 1280)
    assert (step.moe_layers, step.first_dense_layers, step.ffn_hidden) == (42, 3, 11264)
    assert step.moe_topk == json.loads((REAL / "step-3.7" / "config.json").read_text())["num_experts_per_tok"]
    assert any("g_proj" in w and "not costed" in w for w in step.warnings)  # a per-head gate: named
    llava = load_model(REAL / "llava-v1.5" / "config.json")  # the tower counted apart, not in the totals
    assert llava.vision_params > 0.3e9 and llava.total_params == load_model("llama-2-7b").total_params


@pytest.mark.parametrize(
    "arch,module",
    [
        ("deepseek-v4-flash", "model.layers.0.attn_hc (DeepseekV4HyperConnection)"),
    ],
)
def test_what_modelspec_cannot_cost_is_refused_by_name(arch: str, module: str) -> None:
    with pytest.raises(UnsupportedArchitecture) as e:
        load_model(REAL / arch / "config.json")
    assert module in e.value.message and "\n" not in str(e.value)
    assert "the field reader refused it too" in (e.value.hint or "")


@pytest.mark.parametrize(
    "arch,module",
    [
        ("laguna", "attention shapes differ between layers"),
        ("mimo-v2-flash", "a V head size other than the Q/K head size"),
        ("gemma-4-dense", "no v projection"),
    ],
)
def test_per_layer_attention_shapes_read_by_fields_not_by_module_shapes(arch: str, module: str) -> None:
    """The module-shape reader maps one attention shape per model and still refuses these by name;
    the field reader reads each layer's shape (ModelSpec.attn_views), so they load."""
    from autopar.model import read_by_own_code

    cfg = json.loads((REAL / arch / "config.json").read_text())
    with pytest.raises(UnsupportedArchitecture) as e:
        read_by_own_code(cfg)
    assert module in e.value.message and "\n" not in str(e.value)
    spec = load_model(REAL / arch / "config.json")
    assert spec.per_layer_attention and not any(OWN_CODE in w for w in spec.warnings)


def test_an_unknown_module_kind_is_refused_by_name() -> None:
    """A layer holding a module no ModelSpec part maps (beyond 0.5 % of it) is named, not dropped."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from autopar.model import _build_own
    from autopar.own_code import _read_model

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000)  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    kw = dict(name="tiny", source="", how="test", build=_build_own, max_position=0)
    spec = _read_model(model, cfg, **kw)  # as built: a plain Llama
    assert (spec.layers, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn_hidden) == (2, 4, 2, 64, 512)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    with torch.device("meta"):
        model.model.layers[1].adapter = torch.nn.Linear(256, 64)  # a module kind of no ModelSpec part
    with pytest.raises(
        UnsupportedArchitecture, match=r"model\.layers\.1\.adapter \(Linear, 16,448 parameters\)"
    ):
        _read_model(model, cfg, **kw)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_refuses_an_unknown_module_kind_with_exit_2() -> None:
    cfg = str(REAL / "deepseek-v4-flash" / "config.json")
    for args in (
        ("model", cfg),
        (
            "predict",
            "--model",
            cfg,
            "--device",
            "h100-sxm-80gb",
            "--num-devices",
            "8",
            "--seq-len",
            "4096",
            "--global-batch",
            "8",
        ),
    ):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert "model.layers.0.attn_hc (DeepseekV4HyperConnection)" in lines[0]


def test_cli_reads_by_own_code_and_says_so() -> None:
    cfg = str(REAL / "mpt" / "config.json")
    r = _cli("model", cfg, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["reader"] == "own-code" and OWN_CODE in d["source"]
    assert d["total_params"] == d["meta"]["text_total_params"]
    r = _cli("model", cfg, "--reader", "fields")  # the field reader alone refuses it, as before
    assert r.returncode == 2 and "'mpt' is not one autopar knows" in r.stderr


def test_import_autopar_stays_light() -> None:
    code = (
        "import sys, autopar, autopar.model as m; m.load_model('llama-3.1-8b'); "
        "print(sorted(k for k in ('torch', 'transformers') if k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_no_long_build_before_a_refusal(tmp_path: Path) -> None:
    """A config deeper than any published one is not built on meta (time grows with the modules)."""
    import time

    raw = json.loads((REAL / "mpt" / "config.json").read_text())
    raw["n_layers"] = 5000
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    t0 = time.perf_counter()
    with pytest.raises(UnsupportedArchitecture) as e:
        load_model(path)
    assert time.perf_counter() - t0 < 30
    assert "'mpt' is not one autopar knows" in e.value.message
    assert "5,000 layers x 1 experts is more than is built on the meta device" in (e.value.hint or "")


def _refused_kind_defaults() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from autopar.model import _REFUSED_KINDS

    return sorted(mt for mt in _REFUSED_KINDS if mt in CONFIG_MAPPING)


@pytest.mark.parametrize("mt", _refused_kind_defaults())
def test_a_kind_refused_by_name_stays_refused(mt: str) -> None:
    """A block the field reader refuses by name for what shapes do not show (sparse key selection,
    lightning or delta-rule attention, weight sharing, short convolutions) is never read from shapes:
    on the class's own default config (2 layers), whatever the own-code reader makes of it."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        raw = CONFIG_MAPPING[mt](num_hidden_layers=2).to_dict()
    except Exception as e:  # noqa: BLE001 - a class whose defaults do not validate
        pytest.skip(f"{mt}: the class's default config does not build ({type(e).__name__})")
    with pytest.raises(UnsupportedArchitecture):
        load_model(raw)
