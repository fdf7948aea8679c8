"""Encoders and encoder-decoder models costed as what they are (issue 22, item 4): BERT-style
encoders (bidirectional attention, no KV cache, not served) and Whisper / SeamlessM4T's text
encoder-decoder (an encoder stack, cross-attending decoder blocks, pp = cp = 1). Block FLOPs are
checked by hand in tests/test_blocks.py, parameter counts against transformers in
tests/test_real_configs.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autopar import predict
from autopar.errors import LayoutError, UnsupportedArchitecture
from autopar.model import load_model

REAL = Path(__file__).parent / "configs" / "real"
BERT = REAL / "bert" / "config.json"
WHISPER = REAL / "whisper" / "config.json"
SEAMLESS = REAL / "seamless-m4t-v2" / "config.json"
JOB = dict(device="h100-sxm-80gb", num_devices=8, global_batch=256)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=300
    )


def test_predict_runs_on_a_bert_config_with_a_layout() -> None:
    r = _run(
        "predict", "--model", str(BERT), "--device", "h100-sxm-80gb", "--num-devices", "8",
        "--seq-len", "512", "--global-batch", "256", "--tp", "2", "--dp", "4", "--micro-batch", "8", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["fits"] and d["step_time_s"] > 0 and 0 < d["mfu"] < 1
    assert any("bidirectional encoder" in a for a in d["assumptions"])


@pytest.mark.parametrize("cfg, words", [(BERT, "encoder-only"), (WHISPER, "encoder-decoder")])
def test_serve_refuses_encoders_by_name(cfg: Path, words: str) -> None:
    r = _run(
        "serve",
        "--model",
        str(cfg),
        "--device",
        "h100-sxm-80gb",
        "--num-devices",
        "8",
        "--isl",
        "512",
        "--osl",
        "64",
    )
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr
    assert r.stdout == ""


def test_bidirectional_core_costs_the_full_square() -> None:
    """The same BERT stack as a causal decoder: the encoder's core does twice the FLOPs, at the
    unmasked kernel's rate (1.10x per FLOP), so its attention time is 2/1.10 of the causal one."""
    enc = load_model(BERT)
    causal = enc.model_copy(update=dict(arch="decoder", post_norm=False))
    kw = dict(JOB, seq_len=512, tp=1, dp=8, micro_batch=4)
    a, b = predict(model=enc, **kw), predict(model=causal, **kw)
    assert a.time_breakdown["attention"] / b.time_breakdown["attention"] == pytest.approx(2 / 1.10, rel=1e-6)
    assert a.time_breakdown["gemm"] == pytest.approx(b.time_breakdown["gemm"], rel=1e-9)
    assert a.mfu > 0 and enc.flops_per_token(512) > causal.flops_per_token(512, causal=True)


def test_encoder_decoder_is_its_two_stacks_and_the_cross_attention() -> None:
    """Whisper's step time and memory are more than its decoder stack's alone by the encoder stack
    (1500 positions), the cross-attention and the front-end; recompute trades memory for time."""
    m = load_model(WHISPER)
    kw = dict(JOB, seq_len=448, tp=2, dp=4, micro_batch=8)
    whole = predict(model=m, **kw)
    dec = predict(model=m.decoder_view(), **kw)
    assert whole.step_time_s > 1.5 * dec.step_time_s
    assert whole.memory_breakdown["activations"] > 1.5 * dec.memory_breakdown["activations"]
    assert whole.memory_breakdown["weights"] == pytest.approx(
        dec.memory_breakdown["weights"] * m.total_params / m.decoder_view().total_params, rel=0.02
    )
    full = predict(model=m, **kw, recompute="full")
    assert full.memory_breakdown["activations"] < whole.memory_breakdown["activations"] / 4
    assert full.step_time_s > whole.step_time_s
    assert any("1,500 positions" in a for a in whole.assumptions)


def test_encoder_decoder_refuses_pipeline_and_context_splits() -> None:
    m = load_model(WHISPER)
    for split in (dict(pp=2, dp=2), dict(cp=2, dp=2)):
        with pytest.raises(LayoutError, match="not modeled for an encoder-decoder model") as e:
            predict(model=m, **JOB, seq_len=448, tp=2, micro_batch=8, **split)
        assert [r.code for r in e.value.reasons] == ["encdec_split"]
    assert predict(model=m, **JOB, seq_len=448, tp=2, dp=4, micro_batch=8).reasons == []
    # an encoder alone splits over pipeline stages like a decoder
    assert predict(model=load_model(BERT), **JOB, seq_len=512, pp=2, dp=4, micro_batch=8).reasons == []


def test_encoder_stack_tp_must_divide_its_heads() -> None:
    m = load_model(WHISPER).model_copy(update=dict(encoder_heads=6))
    with pytest.raises(LayoutError, match="encoder stack's attention heads") as e:
        predict(model=m, **JOB, seq_len=448, tp=4, dp=2, micro_batch=8)
    assert e.value.reasons[0].allowed == [1, 2, 3, 6]


def test_seamless_text_encoder_decoder_and_its_towers() -> None:
    m = load_model(SEAMLESS)
    assert m.arch == "encoder_decoder" and m.encoder_seq == 0 and m.encoder_tokens(1024) == 1024
    assert any("speech encoder" in w and "not counted" in w for w in m.warnings)
    raw = json.loads(SEAMLESS.read_text())
    with pytest.raises(UnsupportedArchitecture, match="speech encoder or the text-to-unit"):
        load_model(dict(raw, architectures=["SeamlessM4Tv2ForSpeechToText"]))


def test_encoder_activations_follow_its_positions() -> None:
    """The encoder's activations scale with its positions: Seamless's encoder reads seq_len tokens
    (all activations double with it, FlashAttention keeps no s^2 term); Whisper's encoder always
    runs 1500 positions, so halving the decoder's tokens saves far less than half."""
    kw = dict(JOB, tp=2, dp=4, micro_batch=4)

    def act(cfg: Path, s: int) -> float:
        return predict(model=load_model(cfg), seq_len=s, **kw).memory_breakdown["activations"]

    assert act(SEAMLESS, 1024) / act(SEAMLESS, 512) == pytest.approx(2.0, rel=1e-9)
    assert 1.05 < act(WHISPER, 448) / act(WHISPER, 224) < 1.5
    assert np.isfinite(act(WHISPER, 448))


def test_encoder_decoder_activations_by_hand() -> None:
    """One decoder block's share of Whisper's activations (tp 1, no SP, one sample, no recompute):
    the decoder block at 448 tokens, 12/12 of an encoder layer at 1500 positions, the cross-attention
    (Q and output over the decoder tokens, K and V over the 1500 positions, the fp32 log-sum-exp, the
    norm's input and output) and a 12th of the encoder output and of the conv front-end's three
    saved tensors, 2 bytes each."""
    from autopar.layout import RECOMPUTE_CODES
    from autopar.memory import _encdec_activation_bytes, activation_bytes_per_layer

    m = load_model(WHISPER)
    one = np.ones(1, dtype=np.int64)
    common = dict(
        micro_batch=one, tp=one, cp=one, sp=0 * one, recompute=0 * one, low_precision=np.zeros(1, bool)
    )
    dec = activation_bytes_per_layer(m.decoder_view(), moe=False, seq_len=448, **common)
    enc = activation_bytes_per_layer(m.encoder_view(), moe=False, seq_len=1500, **common)
    h = 768
    cross = 2 * 448 * h + 2 * 2 * 1500 * h + 2 * 448 * h + 4 * 448 * 12 + 2 * 2 * 448 * h
    shared = 2 * 1500 * h + 2 * (2 * 2 * 1500 * h + 1500 * h)
    got = _encdec_activation_bytes(m, seq_len=448, **common)
    assert got == pytest.approx(dec + enc + cross + shared / 12, rel=1e-12)
    # full recompute keeps each block's input, the encoder output and the front-end's tensors
    full = _encdec_activation_bytes(
        m, seq_len=448, **{**common, "recompute": one * RECOMPUTE_CODES.index("full")}
    )
    assert full < got / 10


def test_an_encoder_caches_nothing() -> None:
    assert load_model(BERT).kv_cache_bytes_per_token() == 0
    assert load_model(WHISPER).decoder_view().kv_cache_bytes_per_token() > 0


def test_the_reference_runner_refuses_encoders() -> None:
    from autopar.runner.config import RunError, RunnerModelConfig

    for cfg in (BERT, WHISPER):
        with pytest.raises(RunError, match="trains causal decoders only"):
            RunnerModelConfig.from_model_spec(load_model(cfg))
    assert RunnerModelConfig.from_model_spec(load_model(WHISPER).decoder_view()).layers == 12


@pytest.mark.slow
def test_every_bert_head_class_matches_transformers() -> None:
    """Each (family, head class) the reader accepts counts what transformers builds for that class,
    with one, two and three labels; a class the family does not have is refused by name."""
    pytest.importorskip("transformers")
    from autopar.encoders import _BERT_HEADS, _FAMILY_HEADS
    from autopar.hf_meta import meta_count

    prefix = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"}
    prefix["layoutlm"] = "LayoutLM"
    for mt, p in prefix.items():
        for suffix in _BERT_HEADS:
            cfg = dict(
                model_type=mt, architectures=[p + suffix], vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=256, max_position_embeddings=40, type_vocab_size=2,
                id2label={"0": "a", "1": "b", "2": "c"},
            )  # fmt: skip
            if suffix not in _FAMILY_HEADS[mt]:
                with pytest.raises(UnsupportedArchitecture, match="head is not modeled"):
                    load_model(cfg)
                continue
            mc, how = meta_count(cfg)
            assert mc is not None and p + suffix in how, how
            assert load_model(cfg).total_params == mc.total, (mt, suffix)


def _whisper_like(**kw: object) -> dict:
    return dict(json.loads(WHISPER.read_text()), **kw)


LARGE_V3 = dict(
    d_model=1280, encoder_layers=32, num_hidden_layers=32, encoder_attention_heads=20, decoder_attention_heads=20,
    encoder_ffn_dim=5120, decoder_ffn_dim=5120, num_mel_bins=128, vocab_size=51866,
)  # fmt: skip


def test_whisper_sizes_and_conflicting_aliases() -> None:
    # Whisper large-v3's dimensions (32 + 32 layers, 128 mel bins): OpenAI's 1550 M; large-v3-turbo
    # (4 decoder layers): 809 M
    assert load_model(_whisper_like(**LARGE_V3, decoder_layers=32)).total_params == 1_543_490_560
    assert load_model(_whisper_like(**LARGE_V3, decoder_layers=4)).total_params == 808_878_080
    untied = load_model(_whisper_like(tie_word_embeddings=False))
    assert untied.total_params == load_model(WHISPER).total_params + 51865 * 768
    # WhisperConfig reads num_hidden_layers as encoder_layers: a config where they differ is refused
    with pytest.raises(UnsupportedArchitecture, match="num_hidden_layers .* and encoder_layers .* disagree"):
        load_model(_whisper_like(encoder_layers=24))
    raw = json.loads(SEAMLESS.read_text())
    with pytest.raises(UnsupportedArchitecture, match="num_hidden_layers .* and decoder_layers .* disagree"):
        load_model(dict(raw, decoder_layers=12))


@pytest.mark.slow
def test_whisper_and_seamless_variants_match_transformers() -> None:
    pytest.importorskip("transformers")
    from autopar.hf_meta import meta_count

    raw = json.loads(SEAMLESS.read_text())
    small = dict(
        hidden_size=512, encoder_layers=6, decoder_layers=4, num_hidden_layers=4, encoder_ffn_dim=2048
    )
    small.update(
        decoder_ffn_dim=1024, encoder_attention_heads=8, decoder_attention_heads=8, num_attention_heads=8
    )
    for cfg in (
        _whisper_like(**LARGE_V3, decoder_layers=32),
        _whisper_like(**LARGE_V3, decoder_layers=4),
        _whisper_like(tie_word_embeddings=False),
        _whisper_like(architectures=["WhisperModel"]),
        dict(raw, **small),
        dict(raw, architectures=["SeamlessM4Tv2ForTextToText"]),
    ):
        mc, how = meta_count(cfg)
        assert mc is not None, how
        assert load_model(cfg).total_params == mc.text_total, how
