"""diffusers transformer classes read from their real config.json (issue 22 item 5).

Each class autopar reads is checked on the real, unedited config under tests/configs/real/ (its
source in SOURCES.yaml): the parameter count against the stored figure of diffusers' meta-device
build (and against the build itself where diffusers is installed), and the FLOPs of one forward,
block by block, against a hand computation written here from the class's module list (diffusers
``models/transformers/<file>.py``), not from autopar's spec. Then ``autopar dit generate`` and
``autopar dit train`` run on each config.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autopar.dit.spec import from_diffusers_config, load_dit
from autopar.errors import ModelConfigError, UnsupportedArchitecture
from autopar.model import read_config_file

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "configs" / "real"
SOURCES = yaml.safe_load((REAL / "SOURCES.yaml").read_text(encoding="utf-8"))
READ = ("easyanimate-v5.1", "z-image", "stable-audio")


def _cfg(name: str) -> dict:
    return read_config_file(REAL / name / "config.json")


@pytest.mark.parametrize("name", READ)
def test_params_match_the_stored_meta_device_count(name: str) -> None:
    spec = load_dit(REAL / name / "config.json")
    truth = int(SOURCES[name]["truth"]["total"])
    assert "meta device" in SOURCES[name]["truth"]["by"]
    assert abs(spec.params / truth - 1) < 1e-4, (spec.params, truth)


@pytest.mark.slow
@pytest.mark.parametrize("name", READ)
def test_params_match_diffusers_on_meta(name: str) -> None:
    pytest.importorskip("diffusers")
    from autopar.hf_meta import dit_meta_count

    n, how = dit_meta_count(_cfg(name))
    assert n is not None, how
    assert abs(load_dit(REAL / name / "config.json").params / n - 1) < 1e-4


def test_easyanimate_flops_by_hand() -> None:
    """EasyAnimateTransformerBlock (all 48 are MMDiT blocks): per stream to_q/k/v + to_out (or the
    add_* twins for the text) and a GELU FeedForward of 4 x inner; one joint attention over text +
    video. 512x512, 49 frames: Magvit VAE 8x space, 4x time -> 13 x 64 x 64 latents, patch 2 ->
    13 x 32 x 32 = 13,312 tokens; 256 caption tokens."""
    cfg = _cfg("easyanimate-v5.1")
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]  # 3072
    L = cfg["num_layers"]
    s_img, s_txt = 13 * 32 * 32, 256
    per_token = 2 * (3 * d * d + d * d + 2 * 4 * d * d)  # qkv, out, FFN up + down (biases: no FLOPs)
    gemm = (s_img + s_txt) * per_token * L
    attn = 4 * (s_img + s_txt) ** 2 * d * L  # QK^T and PV over the joint sequence
    spec = load_dit(REAL / "easyanimate-v5.1" / "config.json")
    assert spec.tokens(512, 512, 49) == s_img and spec.text_tokens == s_txt
    fl = spec.forward_flops(512, 512, 49)
    assert fl["gemm"] == pytest.approx(gemm, rel=1e-12)
    assert fl["attention"] == pytest.approx(attn, rel=1e-12)
    # modulation: two EasyAnimateLayerNormZero linears (time_embed_dim -> 6 x inner) per block, on
    # the conditioning vector only (no token FLOPs), counted in the parameters
    c = cfg["time_embed_dim"]
    assert spec.modulation_params() == L * 2 * (c * 6 * d + 6 * d)


def test_zimage_flops_by_hand() -> None:
    """ZImageTransformerBlock: to_q/k/v/out (dim x dim, no bias) and a SwiGLU FFN w1/w3 (dim ->
    int(dim/3*8)) + w2; 30 main blocks over image + caption tokens, 2 noise-refiner blocks over the
    image tokens, 2 context-refiner blocks over the caption tokens. 1024x1024: FLUX VAE 8x -> 128 x
    128 latents, patch 2 -> 4,096 tokens; 512 caption tokens."""
    cfg = _cfg("z-image")
    d, L, R = cfg["dim"], cfg["n_layers"], cfg["n_refiner_layers"]
    f = int(d / 3 * 8)
    assert f == 10240
    s_img, s_txt = 64 * 64, 512
    per_token = 2 * (4 * d * d + 3 * d * f)  # q, k, v, out; w1, w3, w2
    gemm = per_token * ((s_img + s_txt) * L + s_img * R + s_txt * R)
    attn = 4 * d * ((s_img + s_txt) ** 2 * L + s_img**2 * R + s_txt**2 * R)
    spec = load_dit(REAL / "z-image" / "config.json")
    assert spec.tokens(1024, 1024, 1) == s_img and spec.text_tokens == s_txt
    fl = spec.forward_flops(1024, 1024, 1)
    assert fl["gemm"] == pytest.approx(gemm, rel=1e-12)
    assert fl["attention"] == pytest.approx(attn, rel=1e-12)
    # adaLN: Linear(256 -> 4 x dim) in every main and noise-refiner block, none in the context refiner
    assert spec.modulation_params() == (L + R) * (256 * 4 * d + 4 * d)
    assert spec.blocks == L + 2 * R


def test_stable_audio_flops_by_hand() -> None:
    """StableAudioDiTBlock: self-attention to_q/k/v/out (inner x inner), cross-attention to_q/out
    (inner x inner) with to_k/to_v from 768-wide caption features into 12 of 24 heads x 64, a
    SwiGLU FeedForward (inner -> 2 x 4 inner, 4 inner -> inner). The sequence is the config's
    sample_size (1024) latents + 1 global token; 130 caption keys (128 T5 tokens + 2 seconds)."""
    cfg = _cfg("stable-audio")
    d, L = cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["num_layers"]
    kv = cfg["num_key_value_attention_heads"] * cfg["attention_head_dim"]
    s, t, f = int(cfg["sample_size"]) + 1, 130, 4 * d
    gemm = L * (s * 2 * (4 * d * d + 2 * d * d + 3 * d * f) + t * 2 * 2 * cfg["cross_attention_dim"] * kv)
    attn = L * 4 * d * (s * s + s * t)  # self over the sequence, cross: every query head over the caption
    spec = load_dit(REAL / "stable-audio" / "config.json")
    fl = spec.forward_flops(0, 0, 0)  # the request does not apply: one fixed window
    assert fl["gemm"] == pytest.approx(gemm, rel=1e-12)
    assert fl["attention"] == pytest.approx(attn, rel=1e-12)
    assert spec.modulation_params() == 0  # no adaLN: the conditioning is the prepended token


def test_stable_audio_generate_and_train_refuse_by_name() -> None:
    """An audio DiT denoises a fixed window (diffusers StableAudioPipeline: sample_size latents,
    whatever length is asked): an image/video request does not apply, said in one line."""
    path = str(REAL / "stable-audio" / "config.json")
    for args in (
        ("dit", "generate", "--model", path, "--device", "h100-sxm-80gb", "--num-devices", "1",
         "--height", "512", "--width", "512"),
        ("dit", "train", "--model", path, "--device", "h100-sxm-80gb", "--num-devices", "8",
         "--buckets", "512x512x1", "--global-batch", "8"),
        ("dit", "model", path, "--height", "512"),
    ):  # fmt: skip
        r = _cli(*args)
        assert r.returncode == 2 and r.stdout == "", (args, r.stdout)
        assert len(r.stderr.strip().splitlines()) == 1 and "is an audio DiT" in r.stderr, r.stderr
    r = _cli("dit", "model", path, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens_per_sample"] == 1025 and out["request"] is None and out["params"] == 1056939136


def test_refusals_name_what_is_not_modelled() -> None:
    ea = _cfg("easyanimate-v5.1")
    for bad, words in (
        (ea | {"mmdit_layers": 40}, "mmdit_layers 40 < num_layers 48"),
        (ea | {"text_embed_dim_t5": 4096}, "text_embed_dim_t5"),
        (_cfg("z-image") | {"siglip_feat_dim": 1152}, "SigLIP"),
        (_cfg("z-image") | {"all_patch_size": [2, 4], "all_f_patch_size": [1, 1]}, "several patch sizes"),
        ({"_class_name": "UNet3DConditionModel"}, "a UNet"),
    ):
        with pytest.raises(UnsupportedArchitecture, match=words):
            from_diffusers_config(bad)
    with pytest.raises(ModelConfigError, match="'dim'"):
        from_diffusers_config({k: v for k, v in _cfg("z-image").items() if k != "dim"})


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("name", "request_", "bucket", "batch"),
    [
        ("easyanimate-v5.1", ("--height", "512", "--width", "512", "--frames", "49"), "512x512x49", "8"),
        ("z-image", ("--height", "1024", "--width", "1024", "--steps", "8", "--no-cfg"), "1024x1024x1", "64"),
    ],
)
def test_generate_and_train_run_on_the_config(
    name: str, request_: tuple[str, ...], bucket: str, batch: str
) -> None:
    path = str(REAL / name / "config.json")
    r = _cli("dit", "generate", "--model", path, "--device", "h100-sxm-80gb", "--num-devices", "4", *request_,
             "--top", "2", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["results"]) == 2 and all(x["latency_s"] > 0 for x in out["results"])
    r = _cli("dit", "train", "--model", path, "--device", "h100-sxm-80gb", "--num-devices", "8",
             "--buckets", bucket, "--global-batch", batch, "--top", "1", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["tokens_per_s_per_device"] > 0


# Wan 2.1's blocks under other class names: the class's own __init__ defaults (diffusers 0.42.1
# models/transformers/transformer_skyreels_v2.py, transformer_chronoedit.py: the source) with the
# count diffusers builds from them on the meta device (checked against the build where installed).
_WAN_DEFAULTS = {
    "patch_size": [1, 2, 2], "in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256,
    "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-06, "image_dim": None,
    "added_kv_proj_dim": None, "rope_max_seq_len": 1024, "pos_embed_seq_len": None,
}  # fmt: skip
SKYREELS = _WAN_DEFAULTS | {"_class_name": "SkyReelsV2Transformer3DModel", "num_attention_heads": 16,
                            "attention_head_dim": 128, "ffn_dim": 8192, "num_layers": 32,
                            "inject_sample_info": False, "num_frame_per_block": 1}  # fmt: skip
CHRONOEDIT = _WAN_DEFAULTS | {"_class_name": "ChronoEditTransformer3DModel", "num_attention_heads": 40,
                              "attention_head_dim": 128, "ffn_dim": 13824, "num_layers": 40,
                              "rope_temporal_skip_len": 8}  # fmt: skip
WAN_LIKE = [
    ("skyreels-v2 defaults", SKYREELS, 2191878208),
    ("skyreels-v2 fps embedding", SKYREELS | {"inject_sample_info": True}, 2221256768),
    ("chronoedit defaults", CHRONOEDIT, 14288491584),
    (
        "chronoedit i2v",
        CHRONOEDIT | {"image_dim": 1280, "added_kv_proj_dim": 5120, "in_channels": 36},
        16394878784,
    ),
]


@pytest.mark.parametrize(("what", "cfg", "truth"), WAN_LIKE, ids=[w[0] for w in WAN_LIKE])
def test_wan_like_classes_within_a_tenth_of_a_percent(what: str, cfg: dict, truth: int) -> None:
    spec = from_diffusers_config(cfg)
    assert spec.arch == "cross" and spec.layers == cfg["num_layers"]
    assert abs(spec.params / truth - 1) < 1e-3, (what, spec.params, truth)
    # the same blocks as Wan: the FLOPs of one forward equal WanTransformer3DModel's on that config
    wan = from_diffusers_config(cfg | {"_class_name": "WanTransformer3DModel"})
    assert spec.forward_flops(480, 832, 81) == wan.forward_flops(480, 832, 81)


@pytest.mark.slow
@pytest.mark.parametrize(("what", "cfg", "truth"), WAN_LIKE, ids=[w[0] for w in WAN_LIKE])
def test_wan_like_stored_counts_are_diffusers(what: str, cfg: dict, truth: int) -> None:
    pytest.importorskip("diffusers")
    from autopar.hf_meta import dit_meta_count

    assert dit_meta_count(cfg)[0] == truth, what


# Qwen-Image's published transformer/config.json (Qwen/Qwen-Image; its values are the class's own
# __init__ defaults in diffusers 0.42.1 transformer_qwenimage.py) and SANA's (the class defaults
# are SANA 1600M's; SANA-Sprint adds guidance_embeds), with diffusers' meta-device counts.
QWEN_IMAGE = {
    "_class_name": "QwenImageTransformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56],
    "guidance_embeds": False, "in_channels": 64, "joint_attention_dim": 3584, "num_attention_heads": 24,
    "num_layers": 60, "out_channels": 16, "patch_size": 2,
}  # fmt: skip
SANA = {
    "_class_name": "SanaTransformer2DModel", "in_channels": 32, "out_channels": 32, "num_attention_heads": 70,
    "attention_head_dim": 32, "num_layers": 20, "num_cross_attention_heads": 20, "cross_attention_head_dim": 112,
    "cross_attention_dim": 2240, "caption_channels": 2304, "mlp_ratio": 2.5, "attention_bias": False,
    "sample_size": 32, "patch_size": 1, "guidance_embeds": False,
}  # fmt: skip
# Lumina-Image 2.0's checkpoint config (Alpha-VLLM/Lumina-Image-2.0 transformer/config.json, as
# sglang's tests quote it): grouped-query attention, 24 heads over 8 key/value heads
LUMINA2 = {
    "_class_name": "Lumina2Transformer2DModel", "axes_dim_rope": [32, 32, 32], "axes_lens": [300, 512, 512],
    "cap_feat_dim": 2304, "ffn_dim_multiplier": None, "hidden_size": 2304, "in_channels": 16, "multiple_of": 256,
    "norm_eps": 1e-05, "num_attention_heads": 24, "num_kv_heads": 8, "num_layers": 26, "num_refiner_layers": 2,
    "out_channels": None, "patch_size": 2, "sample_size": 128, "scaling_factor": 1.0,
}  # fmt: skip
# FLUX.2 [dev]: the class's __init__ defaults (diffusers 0.42.1 transformer_flux2.py; 32.2B, FLUX.2
# [dev]'s size); [klein] 4B: its published transformer/config.json (as quoted by OpenFlowLM's
# tools); [klein] 9B: the same with its published sizes (8 + 24 blocks, 32 heads, Qwen3-8B)
FLUX2 = {
    "_class_name": "Flux2Transformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [32, 32, 32, 32],
    "eps": 1e-06, "guidance_embeds": True, "in_channels": 128, "joint_attention_dim": 15360, "mlp_ratio": 3.0,
    "num_attention_heads": 48, "num_layers": 8, "num_single_layers": 48, "out_channels": None, "patch_size": 1,
    "rope_theta": 2000, "timestep_guidance_channels": 256,
}  # fmt: skip
KLEIN4 = FLUX2 | {"guidance_embeds": False, "joint_attention_dim": 7680, "num_attention_heads": 24,
                  "num_layers": 5, "num_single_layers": 20}  # fmt: skip
# LTX-Video 2B: the class's __init__ defaults (diffusers 0.42.1 transformer_ltx.py, Lightricks/LTX-Video's
# 0.9 transformer); 13B: its published sizes (48 blocks of 32 heads x 128, 4096-wide cross-attention)
LTX = {
    "_class_name": "LTXVideoTransformer3DModel", "in_channels": 128, "out_channels": 128, "patch_size": 1,
    "patch_size_t": 1, "num_attention_heads": 32, "attention_head_dim": 64, "cross_attention_dim": 2048,
    "num_layers": 28, "activation_fn": "gelu-approximate", "qk_norm": "rms_norm_across_heads",
    "norm_elementwise_affine": False, "norm_eps": 1e-06, "caption_channels": 4096, "attention_bias": True,
    "attention_out_bias": True,
}  # fmt: skip
OTHER = [
    ("qwen-image", QWEN_IMAGE, 20430401088, 1e-6),
    ("ltx-video-2b", LTX, 1923385472, 1e-6),
    (
        "ltx-video-13b",
        LTX | {"attention_head_dim": 128, "cross_attention_dim": 4096, "num_layers": 48},
        13042569344,
        1e-6,
    ),
    ("flux.2-dev", FLUX2, 32223281152, 1e-6),
    ("flux.2-klein-4b", KLEIN4, 3875544576, 1e-6),
    (
        "flux.2-klein-9b",
        FLUX2
        | {
            "guidance_embeds": False,
            "joint_attention_dim": 12288,
            "num_attention_heads": 32,
            "num_layers": 8,
            "num_single_layers": 24,
        },
        9078581248,
        1e-6,
    ),  # fmt: skip
    ("lumina-image-2.0", LUMINA2, 2609769152, 1e-6),
    (
        "lumina2 ffn multiplier",
        LUMINA2 | {"ffn_dim_multiplier": 0.6667, "num_kv_heads": 24},
        2185095872,
        1e-6,
    ),
    ("sana-1600m", SANA, 1604462752, 0.003),  # GLUMBConv's depthwise 3x3 and absent q/k/v biases: -0.13%
    ("sana-sprint", SANA | {"guidance_embeds": True}, 1610058272, 0.003),
]


@pytest.mark.parametrize(("what", "cfg", "truth", "tol"), OTHER, ids=[w[0] for w in OTHER])
def test_other_classes_params(what: str, cfg: dict, truth: int, tol: float) -> None:
    assert abs(from_diffusers_config(cfg).params / truth - 1) <= tol, what


@pytest.mark.slow
@pytest.mark.parametrize(("what", "cfg", "truth", "tol"), OTHER, ids=[w[0] for w in OTHER])
def test_other_classes_stored_counts_are_diffusers(what: str, cfg: dict, truth: int, tol: float) -> None:
    pytest.importorskip("diffusers")
    from autopar.hf_meta import dit_meta_count

    assert dit_meta_count(cfg)[0] == truth, what


def test_qwen_image_flops_by_hand() -> None:
    """QwenImageTransformerBlock: per stream to_q/k/v + to_out (add_* for the text) and a GELU
    FeedForward of 4 x inner, one joint attention; img_mod / txt_mod on the timestep vector only.
    1328x1328 (its README's 1:1 size): 8x VAE -> 166 x 166 latents, 2x2 patches -> 83 x 83 = 6,889
    tokens; 512 caption tokens."""
    d, L = 24 * 128, 60
    s_img, s_txt = 83 * 83, 512
    spec = from_diffusers_config(QWEN_IMAGE)
    assert spec.tokens(1328, 1328, 1) == s_img and spec.text_tokens == s_txt
    fl = spec.forward_flops(1328, 1328, 1)
    assert fl["gemm"] == pytest.approx((s_img + s_txt) * 2 * 12 * d * d * L, rel=1e-12)
    assert fl["attention"] == pytest.approx(4 * (s_img + s_txt) ** 2 * d * L, rel=1e-12)
    assert spec.modulation_params() == L * 2 * (d * 6 * d + 6 * d)


def test_sana_reads_as_the_preset() -> None:
    spec, preset = from_diffusers_config(SANA), load_dit("sana-1600m")
    assert spec.params == preset.params and spec.forward_flops(4096, 4096, 1) == preset.forward_flops(
        4096, 4096, 1
    )
    with pytest.raises(UnsupportedArchitecture, match="cross-attention width 2304"):
        from_diffusers_config(SANA | {"cross_attention_head_dim": 144, "num_cross_attention_heads": 16})


def test_lumina2_flops_by_hand() -> None:
    """Lumina2TransformerBlock: to_q (2304 -> 24 x 96), to_k / to_v (2304 -> 8 x 96 each), to_out,
    LuminaFeedForward SwiGLU of 4 x 2304 = 9216 (a multiple of 256); 26 blocks over image + caption,
    2 noise-refiner blocks on the image, 2 context-refiner blocks on the caption. 1024x1024: 4,096
    image tokens; 256 caption tokens. Grouped-query K/V narrow the projections, not the scores."""
    d, kv, f, L, R = 2304, 8 * 96, 9216, 26, 2  # head dim 2304 / 24 = 96
    s_img, s_txt = 64 * 64, 256
    per_token = 2 * (d * d + 2 * d * kv + d * d + 3 * d * f)
    spec = from_diffusers_config(LUMINA2)
    fl = spec.forward_flops(1024, 1024, 1)
    assert fl["gemm"] == pytest.approx(per_token * ((s_img + s_txt) * L + s_img * R + s_txt * R), rel=1e-12)
    attn = 4 * d * ((s_img + s_txt) ** 2 * L + s_img**2 * R + s_txt**2 * R)
    assert fl["attention"] == pytest.approx(attn, rel=1e-12)
    assert spec.modulation_params() == (L + R) * (1024 * 4 * d + 4 * d)


def test_flux2_flops_by_hand() -> None:
    """Flux2TransformerBlock: per stream to_q/k/v + to_out (add_* for the text), linear_in (inner ->
    2 x 3 inner, SwiGLU) + linear_out; Flux2SingleTransformerBlock: to_qkv_mlp_proj (inner -> 3 inner
    + 2 x 3 inner) and to_out (inner + 3 inner -> inner) over image + caption. 1024x1024: 8x VAE, 2x2
    packed -> 64 x 64 = 4,096 tokens; 512 caption tokens. Guidance-distilled [dev]: no CFG; the three
    shared modulations (6 + 6 + 3 x inner from inner) have no token FLOPs."""
    d, L, S = 48 * 128, 8, 48
    f = 3 * d
    n = 64 * 64 + 512
    double = 2 * (3 * d * d + d * d + d * 2 * f + f * d)  # per token, either stream
    single = 2 * (d * (3 * d + 2 * f) + (d + f) * d)
    spec = from_diffusers_config(FLUX2)
    fl = spec.forward_flops(1024, 1024, 1)
    assert spec.tokens(1024, 1024, 1) == 4096 and not spec.cfg
    assert fl["gemm"] == pytest.approx(n * (L * double + S * single), rel=1e-12)
    assert fl["attention"] == pytest.approx(4 * n * n * d * (L + S), rel=1e-12)
    assert spec.modulation_params() == d * 6 * d * 2 + d * 3 * d
    with pytest.raises(UnsupportedArchitecture, match="joint_attention_dim 4096 names no text encoder"):
        from_diffusers_config(FLUX2 | {"joint_attention_dim": 4096})


def test_ltx_video_flops_by_hand() -> None:
    """LTXVideoTransformerBlock: attn1 to_q/k/v/out, attn2 to_q/out on the video and to_k/to_v on the
    128 caption tokens, GELU FeedForward of 4 x inner. 512x704, 161 frames (its pipeline's default):
    VAE 32x space, 8x time (causal) -> 21 x 16 x 22 = 7,392 tokens, patch 1."""
    d, L = 32 * 64, 28
    s, t = 21 * 16 * 22, 128
    spec = from_diffusers_config(LTX)
    assert spec.tokens(512, 704, 161) == s
    fl = spec.forward_flops(512, 704, 161)
    gemm = L * (s * 2 * (4 * d * d + 2 * d * d + 8 * d * d) + t * 2 * 2 * d * d)
    assert fl["gemm"] == pytest.approx(gemm, rel=1e-12)
    assert fl["attention"] == pytest.approx(L * 4 * d * (s * s + s * t), rel=1e-12)
    assert spec.modulation_params() == L * 6 * d  # the per-block scale_shift_table


@pytest.mark.parametrize(
    ("what", "cfg"),
    [("qwen-image", QWEN_IMAGE), ("skyreels-v2", SKYREELS), ("flux.2-klein", KLEIN4), ("ltx-video", LTX)],
)
def test_generate_and_train_run_on_other_classes(what: str, cfg: dict, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    video = {"skyreels-v2": ("544", "960", "97"), "ltx-video": ("512", "704", "161")}.get(what)
    h, w, f = video or ("1328", "1328", "1")
    size = ("--height", h, "--width", w, "--frames", f)
    r = _cli("dit", "generate", "--model", str(path), "--device", "h100-sxm-80gb", "--num-devices", "8", *size,
             "--top", "1", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["latency_s"] > 0
    bucket = f"{h}x{w}x{f}"
    r = _cli("dit", "train", "--model", str(path), "--device", "h100-sxm-80gb", "--num-devices", "16",
             "--buckets", bucket, "--global-batch", "16", "--top", "1", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["tokens_per_s_per_device"] > 0
