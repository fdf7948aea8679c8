"""Diffusion transformers: golden tokens and parameter counts, legality, cost-model invariants, CLI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autopar.dit import inference, training
from autopar.dit.spec import from_diffusers_config, list_dit_presets, load_dit
from autopar.errors import AutoparError, ModelConfigError, UnsupportedArchitecture
from autopar.hardware import load_device

ROOT = Path(__file__).resolve().parent.parent
H100 = load_device("h100-sxm-80gb")


# ------------------------------------------------------------------ golden: tokens per sample
def test_tokens_wan_480p_81_frames() -> None:
    # Wan VAE: 4x time (causal: first frame kept), 8x space; patch (1, 2, 2)
    # frames (81 - 1) / 4 + 1 = 21; 480 / 8 / 2 = 30 rows; 832 / 8 / 2 = 52 columns
    spec = load_dit("wan2.1-t2v-14b")
    assert spec.latent_shape(480, 832, 81) == (21, 60, 104)
    assert spec.token_grid(480, 832, 81) == (21, 30, 52)
    assert spec.tokens(480, 832, 81) == 21 * 30 * 52 == 32760


def test_tokens_hunyuanvideo_720p_129_frames() -> None:
    # 3D VAE 4x time, 8x space; (129 - 1) / 4 + 1 = 33 frames; 720 / 16 = 45; 1280 / 16 = 80
    spec = load_dit("hunyuanvideo")
    assert spec.tokens(720, 1280, 129) == 33 * 45 * 80 == 118800
    assert spec.tokens(960, 960, 129) == 33 * 60 * 60


def test_tokens_flux_1024() -> None:
    # FLUX AE 8x, 2x2 packing: 1024 / 16 = 64 per side; 1360 x 768 -> 85 x 48
    spec = load_dit("flux.1-dev")
    assert spec.tokens(1024, 1024, 1) == 64 * 64 == 4096
    assert spec.tokens(768, 1360, 1) == 48 * 85


def test_resolution_not_divisible_is_one_line_error() -> None:
    with pytest.raises(ModelConfigError, match="divisible by 16"):
        load_dit("flux.1-dev").tokens(1000, 1024, 1)


# ------------------------------------------------------------------ golden: parameter counts
# (preset, published count, source): counts stated to 2+ significant digits
PUBLISHED = [
    ("flux.1-dev", 12.0e9, "FLUX.1 [dev] card: 12 billion parameters"),
    ("sd3.5-large", 8.1e9, "SD3.5 Large card: 8.1 billion parameters"),
    ("mochi-1", 10.0e9, "genmoai/models README: 10 billion parameters"),
    ("wan2.1-t2v-1.3b", 1.42e9, "bf16 backbone 2.84 GB (Wan-AI card via localmodel-run)"),
    ("sana-1600m", 1.6e9, "NVlabs/Sana: Sana-1600M"),
]
# round names: the block formulas land within a few percent (docs/dit.md: what the names round)
ROUND_NAMES = [
    ("wan2.1-t2v-14b", 14e9, 0.03),
    ("hunyuanvideo", 13e9, 0.02),
    ("step-video-t2v", 30e9, 0.025),
    ("pixart-alpha", 0.6e9, 0.03),
]


@pytest.mark.parametrize(("preset", "published", "source"), PUBLISHED)
def test_params_within_one_percent_of_published(preset: str, published: float, source: str) -> None:
    spec = load_dit(preset)
    assert spec.published_params == published, source
    assert abs(spec.params / published - 1) < 0.01, (spec.params, published, source)


@pytest.mark.parametrize(("preset", "name", "tol"), ROUND_NAMES)
def test_params_near_round_names(preset: str, name: float, tol: float) -> None:
    assert abs(load_dit(preset).params / name - 1) < tol


def test_flux_block_formulas_by_hand() -> None:
    d, f = 3072, 12288
    # double block: per stream qkv 3d^2+3d, out d^2+d, MLP 2df+d+f, adaLN d x 6d (+6d)
    per_stream = (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + (d * 6 * d + 6 * d)
    # single block: linear1 d -> 3d+f, linear2 d+f -> d, adaLN d x 3d
    single = (d * (3 * d + f) + 3 * d + f) + ((d + f) * d + d) + (d * 3 * d + 3 * d)
    spec = load_dit("flux.1-dev")
    b = spec.params_breakdown()
    assert b["blocks_linear"] + b["modulation"] == 19 * 2 * per_stream + 38 * single


def test_every_preset_loads_and_costs() -> None:
    for pid in list_dit_presets():
        spec = load_dit(pid)
        d = spec.defaults
        fl = spec.forward_flops(d["height"], d["width"], d["frames"])
        assert fl["gemm"] > 0 and fl["attention"] > 0
        assert spec.vae.decode_flops(d["frames"], d["height"], d["width"]) > 0
        assert spec.source


def test_stdit_attention_is_cheaper_than_full_3d() -> None:
    st, full = load_dit("open-sora-1.1-stdit"), load_dit("open-sora-1.1-dit")
    assert st.forward_flops(512, 512, 64)["attention"] < full.forward_flops(512, 512, 64)["attention"] / 10


# ------------------------------------------------------------------ diffusers config loader
def test_diffusers_flux_config_matches_preset(tmp_path: Path) -> None:
    cfg = {
        "_class_name": "FluxTransformer2DModel",
        "attention_head_dim": 128,
        "num_attention_heads": 24,
        "num_layers": 19,
        "num_single_layers": 38,
        "in_channels": 64,
        "joint_attention_dim": 4096,
        "pooled_projection_dim": 768,
        "guidance_embeds": True,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert load_dit(str(p)).params == load_dit("flux.1-dev").params


def test_diffusers_wan_config() -> None:
    cfg = {
        "_class_name": "WanTransformer3DModel",
        "attention_head_dim": 128,
        "num_attention_heads": 12,
        "ffn_dim": 8960,
        "num_layers": 30,
        "patch_size": [1, 2, 2],
        "in_channels": 16,
        "text_dim": 4096,
    }
    assert from_diffusers_config(cfg).params == load_dit("wan2.1-t2v-1.3b").params


# Wan2.1-I2V-14B-720P's transformer config (diffusers scripts/convert_wan_to_diffusers.py, "Wan-I2V-14B-720p")
WAN_I2V_14B = {
    "_class_name": "WanTransformer3DModel", "added_kv_proj_dim": 5120, "attention_head_dim": 128,
    "cross_attn_norm": True, "eps": 1e-06, "ffn_dim": 13824, "freq_dim": 256, "image_dim": 1280,
    "in_channels": 36, "num_attention_heads": 40, "num_layers": 40, "out_channels": 16,
    "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": 4096,
}  # fmt: skip


def test_diffusers_wan_i2v_image_conditioning() -> None:
    i2v = from_diffusers_config(WAN_I2V_14B)
    t2v = from_diffusers_config(
        {k: v for k, v in WAN_I2V_14B.items() if k not in ("image_dim", "added_kv_proj_dim")}
        | {"in_channels": 16}
    )
    d, L, e = 5120, 40, 1280
    embedder = 2 * e + e * e + e + e * d + d + 2 * d  # LayerNorm, Linear, Linear, LayerNorm
    per_block = 2 * (d * d + d) + d  # add_k_proj, add_v_proj (with biases), norm_added_k
    patch = 20 * 1 * 2 * 2 * d  # 36 - 16 more input channels
    assert i2v.params - t2v.params == embedder + L * per_block + patch
    # diffusers builds 16,394,878,784 parameters from this config (meta device, diffusers 0.42.1)
    assert i2v.params == pytest.approx(16_394_878_784, rel=0.01)
    # FLOPs: the 257 CLIP image tokens' K/V projections and the image cross-attention per block
    f_i, f_t = i2v.forward_flops(720, 1280, 81), t2v.forward_flops(720, 1280, 81)
    s = 21 * 45 * 80
    assert f_i["attention"] - f_t["attention"] == pytest.approx(L * 4.0 * s * 257 * d)
    assert f_i["gemm"] - f_t["gemm"] == pytest.approx(L * 2.0 * 257 * 5120 * 2 * d)
    with pytest.raises(ModelConfigError, match="together"):
        from_diffusers_config({k: v for k, v in WAN_I2V_14B.items() if k != "image_dim"})


def test_diffusers_wan_i2v_matches_diffusers_on_meta() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        m = WanTransformer3DModel(**{k: v for k, v in WAN_I2V_14B.items() if not k.startswith("_")})
    truth = sum(p.numel() for p in m.parameters())
    assert from_diffusers_config(WAN_I2V_14B).params == pytest.approx(truth, rel=0.01)


def test_diffusers_unknown_class_and_missing_key() -> None:
    with pytest.raises(UnsupportedArchitecture, match="not modelled"):
        from_diffusers_config({"_class_name": "UNet2DConditionModel"})
    with pytest.raises(ModelConfigError, match="missing key 'patch_size'"):
        from_diffusers_config(
            {"_class_name": "WanTransformer3DModel", "attention_head_dim": 128, "num_attention_heads": 12}
        )
    with pytest.raises(ModelConfigError, match="_class_name"):
        from_diffusers_config({"num_layers": 3})


# ------------------------------------------------------------------ inference layouts
def test_enumerated_layouts_obey_xdit_rules() -> None:
    spec = load_dit("wan2.1-t2v-14b")
    req = inference.Generation(height=720, width=1280, frames=81, steps=50)
    lays = inference.enumerate_layouts(spec, 16, req)
    prod = np.prod([lays[k] for k in inference.LAYOUT_KEYS], axis=0)
    assert (prod == 16).all()
    assert ((spec.heads // lays["tp"]) % lays["ulysses"] == 0).all()
    assert set(np.unique(lays["cfg"])) <= {1, 2}
    assert (lays["cfg"] == 2).any()
    # FLUX.1-dev is guidance-distilled: no CFG parallelism
    flux = inference.enumerate_layouts(
        load_dit("flux.1-dev"), 8, inference.Generation(height=1024, width=1024, frames=1, steps=28)
    )
    assert (flux["cfg"] == 1).all()


def test_illegal_layouts_refused() -> None:
    spec = load_dit("sana-1600m")  # 70 heads: Ulysses 4 cannot split them
    req = inference.Generation(height=4096, width=4096, frames=1, steps=20)
    with pytest.raises(AutoparError, match="heads"):
        inference.check_layout(spec, 4, req, {"ulysses": 4})
    with pytest.raises(AutoparError, match="not 8"):
        inference.check_layout(spec, 8, req, {"ulysses": 2})
    with pytest.raises(AutoparError, match="unknown layout key"):
        inference.check_layout(spec, 2, req, {"sp": 2})


def _pred(spec_id: str, n: int, req: inference.Generation, **lay: int) -> dict[str, float]:
    spec = load_dit(spec_id)
    p = inference.predict(spec, H100, n, req, inference.single_layout(lay))
    return {k: float(np.asarray(v).reshape(-1)[0]) for k, v in p.items()}


def test_cfg_doubles_denoising_and_cfg_parallel_halves_it() -> None:
    req_on = inference.Generation(height=480, width=832, frames=81, steps=10, cfg=True)
    req_off = inference.Generation(height=480, width=832, frames=81, steps=10, cfg=False)
    on, off = _pred("wan2.1-t2v-1.3b", 1, req_on), _pred("wan2.1-t2v-1.3b", 1, req_off)
    assert 1.8 < on["denoise_s"] / off["denoise_s"] < 2.2
    par = _pred("wan2.1-t2v-1.3b", 2, req_on, cfg=2)
    assert par["denoise_s"] < 0.55 * on["denoise_s"]


def test_step_cache_skips_forwards() -> None:
    base = inference.Generation(height=480, width=832, frames=81, steps=20)
    cached = inference.Generation(height=480, width=832, frames=81, steps=20, cache_skip=0.5)
    a, b = _pred("wan2.1-t2v-14b", 1, base), _pred("wan2.1-t2v-14b", 1, cached)
    assert b["denoise_s"] == pytest.approx(a["denoise_s"] / 2, rel=1e-6)


def test_pipefusion_warmup_and_memory() -> None:
    req = inference.Generation(height=1024, width=1024, frames=1, steps=20)
    one = _pred("pixart-alpha", 1, req)
    pf = _pred("pixart-alpha", 4, req, pipefusion=4)
    assert pf["weights_bytes"] == pytest.approx(one["weights_bytes"] / 4)
    all_warm = _pred(
        "pixart-alpha",
        4,
        inference.Generation(height=1024, width=1024, frames=1, steps=20, warmup_steps=20),
        pipefusion=4,
    )
    # synchronous steps run the stages in sequence: no faster than one device
    assert all_warm["denoise_s"] >= 0.95 * one["denoise_s"]
    assert pf["denoise_s"] < all_warm["denoise_s"]


def test_more_sequence_parallelism_less_activation_memory_and_tp_less_weights() -> None:
    req = inference.Generation(height=720, width=1280, frames=129, steps=2)
    m = [_pred("hunyuanvideo", u, req, ulysses=u)["activation_bytes"] for u in (1, 2, 4, 8)]
    assert m == sorted(m, reverse=True)
    w1 = _pred("step-video-t2v", 1, inference.Generation(height=544, width=992, frames=204, steps=1))[
        "weights_bytes"
    ]
    w4 = _pred("step-video-t2v", 4, inference.Generation(height=544, width=992, frames=204, steps=1), tp=4)[
        "weights_bytes"
    ]
    assert w4 == pytest.approx(w1 / 4)


def test_breakdown_sums_to_latency() -> None:
    p = _pred(
        "hunyuanvideo",
        4,
        inference.Generation(height=720, width=1280, frames=129, steps=5),
        ulysses=2,
        ring=2,
    )
    assert p["latency_s"] == pytest.approx(
        p["text_encode_s"] + p["denoise_s"] + p["cfg_comm_s"] + p["vae_decode_s"]
    )


def test_search_meets_latency_target_or_says_how_close() -> None:
    spec = load_dit("flux.1-dev")
    req = inference.Generation(height=1024, width=1024, frames=1, steps=28)
    rows = inference.search(spec, H100, 8, req, latency_target_s=10.0, top=3)
    assert rows and all(r["latency_s"] <= 10.0 and r["fits"] for r in rows)
    with pytest.raises(AutoparError, match="fastest is"):
        inference.search(spec, H100, 8, req, latency_target_s=0.01)


# ------------------------------------------------------------------ training
def test_training_recompute_trades_memory_for_time_and_buckets_mix() -> None:
    spec = load_dit("wan2.1-t2v-1.3b")
    big = training.Bucket(480, 832, 81)
    small = training.Bucket(256, 256, 17)
    work = training.DiTTraining(buckets=(big,), global_batch=8)
    lay = {k: np.array([v]) for k, v in {"dp": 8, "shard": 8, "ulysses": 1, "ring": 1, "tp": 1}.items()}
    p0 = training.predict(spec, H100, 8, work, {**lay, "recompute": np.array([0])})
    p1 = training.predict(spec, H100, 8, work, {**lay, "recompute": np.array([1])})
    assert p1["memory_bytes"][0] < p0["memory_bytes"][0]
    assert p1["step_time_s"][0] > p0["step_time_s"][0]
    mixed = training.DiTTraining(buckets=(big, small), global_batch=8)
    only_small = training.DiTTraining(buckets=(small,), global_batch=8)
    t = [
        training.predict(spec, H100, 8, w, {**lay, "recompute": np.array([0])})["step_time_s"][0]
        for w in (only_small, mixed, work)
    ]
    assert t[0] < t[1] < t[2]
    assert 0 < p0["mfu"][0] < 1


def test_training_search_layouts_legal() -> None:
    spec = load_dit("hunyuanvideo")
    work = training.DiTTraining(buckets=(training.Bucket(720, 1280, 129),), global_batch=16)
    lays = training.enumerate_layouts(spec, 32, work)
    assert ((lays["dp"] * lays["ulysses"] * lays["ring"] * lays["tp"]) == 32).all()
    assert ((spec.heads // lays["tp"]) % lays["ulysses"] == 0).all()
    rows = training.search(spec, H100, 32, work, top=2)
    assert rows[0]["tokens_per_s_per_device"] >= rows[-1]["tokens_per_s_per_device"]


# ------------------------------------------------------------------ export
def test_xfuser_args_and_diffusers_refusal() -> None:
    from autopar.export.xdit import diffusers_command, megatron_bridge_overrides, xfuser_args

    spec = load_dit("hunyuanvideo")
    req = inference.Generation(height=720, width=1280, frames=129, steps=50)
    args = xfuser_args(spec, req, {"ulysses": 4, "ring": 2}, num_devices=8)
    assert args[args.index("--ulysses_degree") + 1] == "4" and args[args.index("--ring_degree") + 1] == "2"
    assert "--use_cfg_parallel" not in args
    with pytest.raises(AutoparError, match="not 4"):
        xfuser_args(spec, req, {"ulysses": 8}, num_devices=4)
    with pytest.raises(AutoparError, match="xdit"):
        diffusers_command(spec, req, {"pipefusion": 2}, num_devices=2)
    ov = megatron_bridge_overrides({"ulysses": 2, "ring": 4, "tp": 1}, global_batch=32)
    assert "model.context_parallel_size=8" in ov and "model.cp_comm_type=a2a+p2p" in ov


# ------------------------------------------------------------------ CLI
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_generate_json_and_errors() -> None:
    r = _cli("dit", "generate", "--model", "flux.1-dev", "--device", "h100-sxm-80gb", "--num-devices", "4",
             "--height", "1024", "--width", "1024", "--steps", "28", "--top", "2", "--json", "--export", "xdit")  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["job"]["workload"]["kind"] == "generation" and len(out["results"]) == 2
    assert out["exports"][0].startswith("xdit --nproc_per_node=4 --model black-forest-labs/FLUX.1-dev")
    for bad in (
        ("dit", "model", "no-such-dit"),
        ("dit", "generate", "--model", "sana-1600m", "--device", "a100-80gb", "--num-devices", "4",
         "--height", "4096", "--width", "4096", "--ulysses", "4"),
        ("dit", "train", "--model", "wan2.1-t2v-1.3b", "--device", "h100-sxm-80gb", "--num-devices", "8",
         "--buckets", "480x832", "--global-batch", "8"),
    ):  # fmt: skip
        r = _cli(*bad)
        assert r.returncode == 2, (bad, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error:"), r.stderr


def test_cli_model_and_train() -> None:
    r = _cli("dit", "model", "hunyuanvideo", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["tokens_per_sample"] == 118800
    r = _cli("dit", "train", "--model", "wan2.1-t2v-1.3b", "--device", "h100-sxm-80gb", "--num-devices", "8",
             "--buckets", "480x832x81:0.5,256x256x17:0.5", "--global-batch", "8", "--top", "1", "--export", "megatron-bridge")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "run_recipe.py" in r.stdout


# ------------------------------------------------------------------ the accuracy study
def test_published_dit_study_json(tmp_path: Path) -> None:
    src = ROOT / "studies" / "data" / "dit_runs_dev.csv"
    with src.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    keep = [r for r in rows if r["row_id"] in ("D017", "D018", "D043", "D044", "D059")]
    sub = tmp_path / "rows.csv"
    with sub.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    out = tmp_path / "out.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "studies" / "published_dit.py"), "--csv", str(sub), "--json", str(out), "--no-lomo"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    recs = {x["row_id"]: x for x in json.loads(out.read_text())["records"]}
    assert set(recs) == {"D017", "D018", "D043", "D044", "D059"}
    assert "skipped" in recs["D059"]
    assert recs["D017"]["metric_unit"] == "s" and recs["D017"]["predicted_value"] > 0
    assert set(recs["D043"]) == {"row_id", "predicted_value", "measured_value", "metric_unit"}


# ------------------------------------------------------------------ DiT coefficients transfer across devices
def test_shipped_dit_coefficients_are_global_only() -> None:
    # no device, model or source has a coefficient of its own: a held-out GPU is predicted the same way
    from autopar.files import parse_yaml

    data = parse_yaml((ROOT / "cost_models" / "calibration" / "dit.yaml").read_text(), "dit.yaml")
    assert not data.get("devices")
    assert 0.2 < data["global"]["attention_llm_ratio"] < 8.0


@pytest.mark.parametrize("device_id", ["h100-sxm-80gb", "l20", "b200", "l40s", "mi300x"])
def test_dit_attention_scales_the_llm_path_efficiency(device_id: str) -> None:
    from autopar.coefficients import coefficients_for
    from autopar.dit.costs import _dit_yaml, dit_coefficients, sfu_rate

    dev = load_device(device_id)
    dc = dit_coefficients(dev)
    ratio = float(_dit_yaml(None)["global"]["attention_llm_ratio"])
    assert dc.attention_eff == pytest.approx(
        min(coefficients_for(dev)[0].forward_attention_eff * ratio, 0.95)
    )
    assert dc.sfu_flops == pytest.approx(sfu_rate(dev)) and dc.sfu_flops > 0


def test_sfu_rate_from_fp32_peak() -> None:
    from autopar.dit.costs import sfu_rate

    # FA3 paper: H100 SXM5 3.9 TFLOP/s of exponential; GA100 has 64 FP32 lanes per 16 SFU
    assert sfu_rate(H100) == pytest.approx(3.9e12, rel=0.1)
    assert sfu_rate(load_device("a100-80gb")) == pytest.approx(19.5e12 / 8)


def test_softmax_term_makes_export_capped_parts_run_nearer_their_peak() -> None:
    # the exponentials run on SFUs that the L20/H20 export caps do not slow down: at one matmul
    # efficiency the share of the datasheet peak reached is higher on them than on an H100
    from dataclasses import replace

    from autopar import collectives as C
    from autopar.coefficients import coefficients_for
    from autopar.dit.costs import dit_coefficients, forward_time

    spec = load_dit("hunyuanvideo")
    fl = spec.forward_flops(720, 1280, 129)["attention"]
    share = {}
    for d in ("h100-sxm-80gb", "l20", "h20"):
        dev = load_device(d)
        co, le = coefficients_for(dev)
        dc = replace(dit_coefficients(dev), attention_eff=0.6)
        one = np.ones(1)
        f = forward_time(spec, co, dc, C.Links.from_cluster(dev, 1, le), height=720, width=1280, frames=129,
                         batch=one, tp=one, ulysses=one, ring=one, layer_share=one, patches=one, compiled=False)  # fmt: skip
        share[d] = fl / float(f["attention"][0]) / co.peak("bf16")
        assert share[d] < 0.6  # the softmax term adds to the matmuls
    assert share["l20"] > share["h20"] > share["h100-sxm-80gb"]


def test_linear_attention_has_no_softmax_term() -> None:
    from dataclasses import replace

    from autopar import collectives as C
    from autopar.coefficients import coefficients_for
    from autopar.dit.costs import dit_coefficients, forward_time
    from autopar.dit.spec import attention_flops

    spec = load_dit("sana-1600m")
    dev = load_device("a100-80gb")
    co, le = coefficients_for(dev)
    one = np.ones(1)
    kw = dict(height=1024, width=1024, frames=1, batch=one, tp=one, ulysses=one, ring=one, layer_share=one,
              patches=one, compiled=False)  # fmt: skip
    links = C.Links.from_cluster(dev, 1, le)
    dc = dit_coefficients(dev)
    a = forward_time(spec, co, dc, links, **kw)["attention"]
    b = forward_time(spec, co, replace(dc, sfu_flops=dc.sfu_flops / 100), links, **kw)["attention"]
    # only SANA's cross-attention to the caption has exponentials: one per score element per head
    s_img = float(spec.tokens(1024, 1024, 1))
    exps = sum(
        x.count * attention_flops(x, s_img, float(spec.text_tokens), 1, s_img) / (4 * x.head_dim)
        for x in spec.attentions()
        if x.kind != "linear"
    )
    assert {x.kind for x in spec.attentions()} == {"linear", "cross"}
    assert float(b[0] - a[0]) == pytest.approx(99 * exps / dc.sfu_flops, rel=1e-9)


def test_bad_dit_calibration_is_one_line_error(tmp_path: Path) -> None:
    from autopar.dit.costs import dit_coefficients

    bad = tmp_path / "dit.yaml"
    bad.write_text("schema: 2\nglobal:\n  elementwise_passes_eager: 1.0\n")
    with pytest.raises(AutoparError, match="lacks 'attention_llm_ratio'"):
        dit_coefficients(H100, str(bad))


# ------------------------------------------------------------------ SD3.5 dual attention, bad inputs
# stabilityai/stable-diffusion-3.5-medium transformer/config.json (diffusers SD3Transformer2DModel)
SD35_MEDIUM = {
    "_class_name": "SD3Transformer2DModel",
    "attention_head_dim": 64,
    "caption_projection_dim": 1536,
    "dual_attention_layers": list(range(13)),
    "in_channels": 16,
    "joint_attention_dim": 4096,
    "num_attention_heads": 24,
    "num_layers": 24,
    "out_channels": 16,
    "patch_size": 2,
    "pooled_projection_dim": 2048,
    "pos_embed_max_size": 384,
    "qk_norm": "rms_norm",
    "sample_size": 128,
}


def test_sd35_medium_counts_its_dual_attention_blocks() -> None:
    spec = from_diffusers_config(SD35_MEDIUM)
    assert spec.dual_attention_layers == 13
    assert abs(spec.params / 2.5e9 - 1) < 0.02, spec.params  # model card: 2.5 billion parameters
    single = from_diffusers_config({**SD35_MEDIUM, "dual_attention_layers": []})
    d, hd = 1536, 64
    attn2 = 3 * (d * d + d) + (d * d + d)  # to_q/k/v and to_out of the image-only attention
    modulation = 3 * (d * d + d)  # SD35AdaLayerNormZeroX: 9 vectors instead of 6
    assert spec.params - single.params == 13 * (attn2 + modulation + 2 * hd)
    fl, fl1 = spec.forward_flops(1024, 1024, 1), single.forward_flops(1024, 1024, 1)
    assert fl["attention"] > fl1["attention"] and fl["gemm"] > fl1["gemm"]


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"attention_head_dim": 127.5}, "whole number"),
        ({"num_layers": 10**12}, "1,024"),
        ({"dual_attention_layers": [0, 30]}, "distinct blocks"),
        ({"num_attention_heads": 4096, "attention_head_dim": 4096}, "over the limit"),
    ],
)
def test_invalid_diffusers_sizes_are_refused(patch: dict, match: str) -> None:
    from autopar.errors import ModelConfigError

    with pytest.raises(ModelConfigError, match=match):
        from_diffusers_config({**SD35_MEDIUM, **patch})


def test_frames_a_causal_vae_cannot_take_are_refused() -> None:
    from autopar.errors import ModelConfigError

    spec = load_dit("wan2.1-t2v-1.3b")
    assert spec.tokens(480, 832, 81) == 21 * 30 * 52
    with pytest.raises(ModelConfigError, match="81 or 85"):
        spec.tokens(480, 832, 82)


def test_pipefusion_above_the_blocks_is_refused() -> None:
    from autopar.errors import AutoparError

    spec = load_dit("wan2.1-t2v-1.3b")  # 30 blocks
    req = inference.Generation(height=480, width=832, frames=81, steps=10)
    with pytest.raises(AutoparError, match="exceeds the 30 transformer blocks"):
        inference.check_layout(spec, 60, req, {"pipefusion": 60})


def test_the_sd3_position_table_is_stored_not_trained() -> None:
    spec = from_diffusers_config(SD35_MEDIUM)
    assert spec.buffer_params == 384**2 * 1536  # pos_embed_max_size^2 positions x hidden
    assert spec.trainable_params == spec.params - spec.buffer_params
    no_table = from_diffusers_config({k: v for k, v in SD35_MEDIUM.items() if k != "pos_embed_max_size"})
    assert no_table.params == spec.trainable_params and no_table.buffer_params == 0


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        ("FluxTransformer2DModel", {}),
        ("SD3Transformer2DModel", {}),
        ("HunyuanVideoTransformer3DModel", {}),
        ("WanTransformer3DModel", {}),
        ("PixArtTransformer2DModel", {"caption_channels": 4096}),  # the class leaves it None; T5-XXL width
        ("CogVideoXTransformer3DModel", {}),
        ("MochiTransformer3DModel", {}),
    ],
)
def test_diffusers_default_configs_match_diffusers_on_meta(cls: str, kwargs: dict) -> None:
    """Each diffusers class's own default config (diffusers' source is the config), built on the meta
    device: autopar's count within 1 %."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    with torch.device("meta"):
        m = getattr(diffusers, cls)(**kwargs)
    cfg = json.loads(json.dumps(dict(m.config), default=list)) | {"_class_name": cls}
    truth = sum(p.numel() for p in m.parameters())  # parameters only: SD3's position table is a buffer
    assert from_diffusers_config(cfg).trainable_params == pytest.approx(truth, rel=0.01)


def test_cli_dit_model_shows_the_diffusers_count(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(WAN_I2V_14B))
    r = subprocess.run(
        [sys.executable, "-m", "autopar", "dit", "model", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["meta_params"] == 16_394_878_784 and "WanTransformer3DModel" in d["meta_note"]
    assert d["params"] == pytest.approx(d["meta_params"], rel=0.01)
