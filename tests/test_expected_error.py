"""Honest uncertainty: the leave-one-device-out folds of studies/accuracy.py, the extrapolation
kinds a prediction makes, the widening factors calibrated on held-out rows, and the round trip of
the expected-error table (cost_models/calibration/expected_error.yaml, schema v2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))

import accuracy  # noqa: E402
from fit_published import SAME_SILICON  # noqa: E402
from published import DEV2_CSV  # noqa: E402

from autopar.coefficients import (  # noqa: E402
    EXTRAPOLATIONS,
    Calibration,
    _expected_error_table,
    expected_error,
    expected_error_path,
    extrapolations,
    lookup_expected_error,
    model_class,
)
from autopar.model import load_model  # noqa: E402


def _row(device: str, source: str = "s") -> SimpleNamespace:
    return SimpleNamespace(job=SimpleNamespace(device=SimpleNamespace(id=device)), row={"source_id": source})


def test_lodo_folds_hold_out_each_device_then_each_die():
    counts = {"a100-40gb": 12, "a100-80gb": 15, "a100-pcie-80gb": 10, "h100-sxm-80gb": 11, "b200": 3}
    rows = [_row(d) for d, n in counts.items() for _ in range(n)]
    folds = accuracy.lodo_folds(rows, SAME_SILICON)  # type: ignore[arg-type]
    # b200 has < 10 rows: no fold; the A100 40GB/80GB die (same_silicon) gets one more fold; the
    # H100's die has only the H100 in the data (H200/H800 map to it but have no rows): no die fold
    assert folds == [
        ("device", "a100-40gb"),
        ("device", "a100-80gb"),
        ("device", "a100-pcie-80gb"),
        ("device", "h100-sxm-80gb"),
        ("die", ("a100-40gb", "a100-80gb")),
    ]
    held = {accuracy.fold_label(f): [c.job.device.id for c in rows if accuracy.in_fold(c, f)] for f in folds}
    assert held["a100-40gb"] == ["a100-40gb"] * 12  # its 80GB twin stays in the fit
    assert sorted(set(held["a100-40gb+a100-80gb"])) == ["a100-40gb", "a100-80gb"]
    assert len(held["a100-40gb+a100-80gb"]) == 27
    assert not accuracy.in_fold(rows[0], None)
    assert accuracy.in_fold(_row("b200", "x"), ("source", "x"))


def test_die_groups_connect_through_devices_not_in_the_data():
    groups = accuracy.die_groups(["h200-sxm-141gb", "h800-sxm-80gb", "b200"], SAME_SILICON)
    assert groups == [("b200",), ("h200-sxm-141gb", "h800-sxm-80gb")]


def test_lodo_refit_holds_out_the_device_and_marks_it_unmeasured():
    rows = accuracy._fit_rows([str(DEV2_CSV)])
    pcie = [i for i, c in enumerate(rows) if c.job.device.id == "a100-pcie-80gb"]
    assert len(pcie) >= 10
    fits = accuracy.refits(rows, [("device", "a100-pcie-80gb")], max_nfev=1)
    full, f = fits
    assert full["held"] == [] and full["train_rows"] == len(rows)
    assert f["held"] == pcie and f["train_rows"] == len(rows) - len(pcie)
    # no rates of its own and no same-silicon twin in the fit: every held-out row extrapolates
    assert all(k[0] == "device" for k in f["kinds"])
    entries = accuracy.held_out_entries(rows, fits)
    assert [e["case"] for e in entries] == [rows[i] for i in pcie]
    assert [e["error"] for e in entries] == [f["errors"][i] for i in pcie]


CAL = Calibration.model_validate(
    {
        "transfer": {"same_silicon": {"h200-sxm-141gb": "h100-sxm-80gb"}},
        "devices": {"h100-sxm-80gb": {"gemm": {"bf16": 0.7, "fp16": 0.7, "fp8": 0.6}}},
    }
)
DOMAIN = {
    "min_rows": 10,
    "stacks": {
        "megatron": {"rows": 120, "max_devices": 1024, "classes": {"dense": 115, "moe": 5}},
        "deepspeed": {"rows": 6, "max_devices": 64, "classes": {"dense": 6}},
    },
}


@pytest.mark.parametrize(
    "device, kw, kinds",
    [
        ("h100-sxm-80gb", {}, ()),
        ("h200-sxm-141gb", {}, ()),  # same silicon as a fitted device
        ("b200", {}, ("device",)),
        ("b200", {"precision": "mxfp8"}, ("device",)),  # precision judged only on a measured device
        ("h100-sxm-80gb", {"precision": "mxfp8"}, ("precision",)),
        ("h100-sxm-80gb", {"precision": "fp16"}, ()),
        ("h100-sxm-80gb", {"stack": "fsdp"}, ("stack",)),
        ("h100-sxm-80gb", {"stack": "deepspeed"}, ("stack",)),  # 6 < min_rows
        ("h100-sxm-80gb", {"model_cls": "moe"}, ("model_class",)),
        ("h100-sxm-80gb", {"model_cls": "moe-fine"}, ("model_class",)),
        ("h100-sxm-80gb", {"num_devices": 2048}, ("scale",)),
        ("b200", {"model_cls": "moe-fine", "num_devices": 4096}, ("device", "model_class", "scale")),
    ],
)
def test_extrapolation_kinds(device, kw, kinds):
    args = {"stack": "megatron", "precision": "bf16", "model_cls": "dense", "num_devices": 64, **kw}
    assert extrapolations(device, CAL, DOMAIN, **args) == kinds


def test_model_class_counts_many_small_experts_apart():
    assert model_class(load_model("llama-3.1-8b")) == "dense"
    assert model_class(load_model("deepseek-v3")) == "moe-fine"  # 256 routed experts
    assert model_class(SimpleNamespace(num_experts=8)) == "moe"


def test_model_class_puts_recurrent_hybrids_apart_from_moe():
    # Mamba or linear-attention blocks make a hybrid, MoE or not: its held-out error is its own.
    assert model_class(load_model("nemotron-3-super-120b-a12b")) == "hybrid"  # Mamba2 + 512 experts
    assert model_class(load_model("nemotron-3-nano-30b-a3b")) == "hybrid"
    assert model_class(load_model("qwen3-next-80b-a3b")) == "hybrid"  # Gated DeltaNet
    assert (
        model_class(SimpleNamespace(layers=8, num_experts=0, mamba_layers=4, linear_attn_layers=0))
        == "hybrid"
    )


def test_shipped_band_gives_hybrids_their_own_base_and_narrows_plain_moe():
    """The shipped table has a megatron/hybrid base from held-out hybrid rows; a fine-grained MoE
    without recurrent blocks is priced against the other MoE rows, not the hybrids' wider misses."""
    table = _expected_error_table(str(expected_error_path()))
    base = table["base"]["stack_class"]
    assert base["megatron/hybrid"]["rows"] >= 10
    assert base["megatron/hybrid"]["p90_ape"] > base["megatron/moe-fine"]["p90_ape"]
    hyb = expected_error(
        "b200",
        stack="megatron",
        precision="bf16",
        model=load_model("nemotron-3-super-120b-a12b"),
        num_devices=64,
    )
    moe = expected_error(
        "b200", stack="megatron", precision="bf16", model=load_model("deepseek-v3"), num_devices=64
    )
    assert hyb is not None and moe is not None
    assert "hybrid" in hyb.group and "moe-fine" in moe.group
    assert hyb.p90 == pytest.approx(base["megatron/hybrid"]["p90_ape"], rel=1e-3)
    assert moe.p90 == pytest.approx(base["megatron/moe-fine"]["p90_ape"], rel=1e-3)


def _entries(rng: np.random.Generator) -> list[dict]:
    """Held-out rows with known error scales: inside the domain ~10%, unmeasured device ~3x."""
    out = []
    for _ in range(200):
        out.append({"mode": "source", "stack": "megatron", "kinds": (), "error": rng.normal(0, 0.1)})
    for _ in range(100):
        out.append({"mode": "device", "stack": "megatron", "kinds": ("device",), "error": rng.normal(0, 0.3)})
    for _ in range(60):
        out.append(
            {
                "mode": "device",
                "stack": "megatron",
                "kinds": ("device", "model_class"),
                "error": rng.normal(0, 0.6),
            }
        )
    out.append({"mode": "source", "stack": "megatron", "kinds": ("scale",), "error": 0.5})
    return out


def test_widening_covers_each_kind_and_wider_for_extrapolations():
    entries = _entries(np.random.default_rng(0))
    w = accuracy.calibrate_widening(entries)
    base = w["base"]["stack"]["megatron"]["p90_ape"]
    assert base == pytest.approx(np.percentile(np.abs([e["error"] for e in entries[:200]]), 90), abs=1e-4)
    f = {k: v["factor"] for k, v in w["widening"].items()}
    assert 2.0 < f["device"] < 4.0 and f["model_class"] > 1.5
    # kinds with too few held-out rows are not assumed better than the worst fitted one
    assert f["scale"] == f["stack"] == f["precision"] == max(f["device"], f["model_class"])
    table = {"schema": "autopar.expected_error/v2", "domain": DOMAIN, **w}
    for kinds in [(), ("device",), ("device", "model_class")]:
        sub = [e for e in entries if e["kinds"] == kinds]
        cov = accuracy.band_coverage(sub, table)
        assert 0.85 <= cov["coverage"] <= 0.95, (kinds, cov)
    dense = lookup_expected_error(table, "megatron", ())
    unmeasured = lookup_expected_error(table, "megatron", ("device",))
    moe = lookup_expected_error(table, "megatron", ("model_class",))
    assert unmeasured.p90 > dense.p90 and moe.p90 > dense.p90  # type: ignore[union-attr]


def test_base_per_stack_and_model_class_when_the_class_has_rows():
    """A stack's fine-grained MoE rows are held out with ~3x its dense rows' error: each class quotes
    its own p90 (and covers its own rows), where one per-stack figure would be too wide for dense
    and too narrow for MoE."""
    rng = np.random.default_rng(2)
    entries = (
        [
            {"mode": "source", "stack": "megatron", "cls": "dense", "kinds": (), "error": rng.normal(0, 0.1)}
            for _ in range(200)
        ]
        + [
            {
                "mode": "device",
                "stack": "megatron",
                "cls": "moe-fine",
                "kinds": (),
                "error": rng.normal(0, 0.3),
            }
            for _ in range(80)
        ]
        + [{"mode": "source", "stack": "megatron", "cls": "moe", "kinds": (), "error": 0.5}] * 3
    )
    w = accuracy.calibrate_widening(entries)
    sc = w["base"]["stack_class"]
    assert set(sc) == {"megatron/dense", "megatron/moe-fine"}  # moe: 3 rows, below min_rows
    assert sc["megatron/moe-fine"]["p90_ape"] > 2.0 * sc["megatron/dense"]["p90_ape"]
    table = {"schema": "autopar.expected_error/v2", "domain": DOMAIN, **w}
    for cls in ("dense", "moe-fine"):
        cov = accuracy.band_coverage([e for e in entries if e["cls"] == cls], table)
        assert 0.85 <= cov["coverage"] <= 0.95, (cls, cov)
    stack_wide = lookup_expected_error(table, "megatron", ())
    assert lookup_expected_error(table, "megatron", (), "moe").p90 == stack_wide.p90  # type: ignore[union-attr]
    assert accuracy.band_coverage(entries, table)["median_band"] < stack_wide.p90  # type: ignore[union-attr]


def test_table_round_trips_through_yaml(tmp_path: Path):
    entries = _entries(np.random.default_rng(1))
    table = accuracy.expected_error_table(entries, DOMAIN, {"command": "test"})
    path = tmp_path / "ee.yaml"
    accuracy.write_expected_error(path, table)
    back = _expected_error_table(str(path))
    assert back == yaml.safe_load(yaml.safe_dump(table)) and back["schema"] == "autopar.expected_error/v2"
    assert set(back["widening"]) == set(EXTRAPOLATIONS)
    assert back["coverage"]["all"] == accuracy.band_coverage(entries, back)
    assert back["coverage"]["source"]["rows"] == 201 and back["coverage"]["device"]["rows"] == 160
    e = lookup_expected_error(back, "megatron", ("device",))
    assert e is not None and e.widened_by == ("device",)
    want = back["base"]["stack"]["megatron"]["p90_ape"] * back["widening"]["device"]["factor"]
    assert e.p90 == pytest.approx(want, abs=5e-5)


@pytest.mark.parametrize(
    "args, text",
    [
        (["--write-expected-error", "x.yaml"], "add --lodo"),
        (["--no-loso", "--lodo"], "drop --no-loso"),
        (["--lodo", "--write-expected-error", "/no/such/dir/x.yaml"], "does not exist"),
        (["--workers", "0"], "at least 1"),
    ],
)
def test_refusals_are_one_line_exit_2(args, text, tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "studies/accuracy.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and text in r.stderr
