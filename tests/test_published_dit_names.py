"""studies/published_dit.py reads model and GPU names as sources write them (issue 23 item 6)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "studies"))

import published_dit as pd  # noqa: E402

SRC = ROOT / "studies" / "data" / "dit_runs_dev.csv"


@pytest.mark.parametrize(
    ("name", "preset"),
    [
        ("FLUX.1 [dev]", "flux.1-dev"),
        ("black-forest-labs/FLUX.1-dev", "flux.1-dev"),
        ("Wan2.1-I2V-14B-720P", "wan2.1-t2v-14b"),
        ("Wan2.1-T2V-1.3B", "wan2.1-t2v-1.3b"),
        ("Wan 2.1 (14B)", "wan2.1-t2v-14b"),
        ("HunyuanVideo-I2V", "hunyuanvideo"),
        ("hunyuanvideo-t2v-720p", "hunyuanvideo"),
        ("Mochi 1 (10B AsymmDiT)", "mochi-1"),
        ("mochi-1-preview", "mochi-1"),
        ("stepfun-ai/Step-Video-T2V", "step-video-t2v"),
        ("OPEN-SORA 2.0", "open-sora-2.0"),
        ("Open-Sora 1.1 STDiT-XL/2", "open-sora-1.1-stdit"),
        ("Open-Sora v1.x DiT (GC)", "open-sora-1.1-dit"),
        ("CogVideoX-5B-I2V", "cogvideox-5b"),
        ("Sana_1600M_4Kpx_BF16_diffusers", "sana-1600m"),
        ("stable-diffusion-3.5-large", "sd3.5-large"),
    ],
)
def test_spellings_resolve_against_preset_names(name: str, preset: str) -> None:
    assert pd.resolve_preset(name) == preset


def test_no_or_ambiguous_preset_is_none() -> None:
    assert pd.resolve_preset("FLUX.1-schnell") is None  # same blocks as dev, but not a preset
    assert pd.resolve_preset("Open-Sora") is None  # 1.x and 2.0 fit equally well


@pytest.mark.parametrize(
    ("gpu", "device"),
    [("NVIDIA H200 141GB", "h200-sxm-141gb"), ("H20 (96GB)", "h20"), ("A100-SXM4-40GB", "a100-40gb"),
     ("a100 80gb", "a100-80gb"), ("H100 SXM5", "h100-sxm-80gb"), ("8x L40S", "l40s")],
)  # fmt: skip
def test_gpu_names_resolve(gpu: str, device: str) -> None:
    assert pd.resolve_device(gpu) == device


def _rows() -> tuple[list[str], list[dict[str, str]]]:
    with SRC.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return list(rows[0]), rows


def _run(tmp_path: Path, rows: list[dict[str, str]], fields: list[str], tag: str) -> dict[str, dict]:
    src = tmp_path / f"{tag}.csv"
    with src.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / f"{tag}.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "studies" / "published_dit.py"), "--csv", str(src), "--json", str(out), "--no-lomo"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return {x["row_id"]: x for x in json.loads(out.read_text())["records"]}


def test_rows_spelled_otherwise_or_unknown_are_predicted_not_skipped(tmp_path: Path) -> None:
    fields, rows = _rows()
    keep = [dict(r) for r in rows if r["row_id"] in ("D017", "D018", "D043", "D044")]
    base = _run(tmp_path, keep, fields, "base")
    respelled = [dict(r) for r in keep]
    for r in respelled:
        r["model"] = {"HunyuanVideo": "hunyuanvideo-t2v-720p", "FLUX": "FLUX.1 [dev]"}[
            "HunyuanVideo" if "Hunyuan" in r["model"] else "FLUX"
        ]
        r["gpu_type"] = "NVIDIA " + r["gpu_type"] + " 80GB HBM3"
    # an unknown name with its architecture columns: built from them (FLUX.1-dev's dimensions here)
    unknown = [dict(r, row_id=r["row_id"] + "u", model="MyMMDiT-12B") for r in keep if "FLUX" in r["model"]]
    bare = [dict(unknown[0], row_id="Dbare", arch_layers="", arch_hidden="", arch_heads="")]
    # The study fits its coefficients on the rows it reads: the same rows spelled otherwise give the
    # same fit and the same predictions; rows added to them may move the fit, so they run apart.
    respelled_got = _run(tmp_path, respelled, fields, "respelled")
    for rid, rec in base.items():
        got_rec = respelled_got[rid]
        assert "skipped" not in got_rec and got_rec["predicted_value"] == pytest.approx(
            rec["predicted_value"]
        )
    got = _run(tmp_path, keep + unknown + bare, fields, "unknown")
    for r in unknown:
        rec = got[r["row_id"]]
        assert "skipped" not in rec, rec
        # same blocks as FLUX.1-dev (19 double + 38 single, 3072 wide): within a few percent of it
        assert rec["predicted_value"] == pytest.approx(base[r["row_id"][:-1]]["predicted_value"], rel=0.05)
    assert "architecture columns" in got["Dbare"]["skipped"]
