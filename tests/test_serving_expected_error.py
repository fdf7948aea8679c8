"""Serving predictions quote expected_error_p90: held-out serving error, widened off its domain."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autopar.coefficients import default_calibration_path, load_calibration
from autopar.model import load_model
from autopar.serving.accuracy import _table, expected_error, table_path
from autopar.serving.search import serve

ROOT = Path(__file__).resolve().parent.parent
TABLE = _table(str(table_path()))
BASE = TABLE["base"]["p90_ape"]
W = {k: v["factor"] for k, v in TABLE["widening"].items()}


@pytest.mark.parametrize(
    ("device", "model", "kinds"),
    [
        ("h100-sxm-80gb", "llama-3.1-70b", []),  # the measured domain
        ("h200-sxm-141gb", "llama-3.1-8b", []),  # same silicon as a measured device
        ("a100-80gb", "llama-3.1-70b", ["device"]),  # fitted for training, never served
        ("mi300x", "llama-3.1-70b", ["device", "datasheet"]),  # datasheet efficiencies only
        ("h100-sxm-80gb", "qwen3-30b-a3b", ["model_class"]),  # MoE never served
    ],
)
def test_expected_error_widens_off_the_measured_domain(device: str, model: str, kinds: list[str]) -> None:
    ee = expected_error(device, load_calibration(), load_model(model))
    assert ee is not None and ee["widened_by"] == kinds and ee["basis"] == "out_of_sample"
    factor = 1.0
    for k in kinds:
        factor *= W[k]
    assert ee["p90"] == pytest.approx(BASE * factor, abs=1e-4)
    assert f"±{ee['p90']:.0%}" in ee["text"]


def test_serve_results_carry_expected_error_p90() -> None:
    r = serve(model="llama-3.1-8b", device="a100-80gb", num_devices=2, isl=1000, osl=200, top=3)
    assert r.expected_error_p90 == pytest.approx(BASE * W["device"], abs=1e-4)
    d = r.to_dict()
    assert d["expected_error_p90"] == r.expected_error_p90
    assert all(x["expected_error_p90"] == r.expected_error_p90 for x in d["results"] + d["pareto"])


def test_another_calibration_quotes_no_figure(tmp_path: Path) -> None:
    doc = yaml.safe_load(default_calibration_path().read_text())
    doc["global"]["kernel_overhead_us"] = 10.0
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = serve(
        model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=1, isl=100, osl=10, calibration=str(path)
    )
    assert r.expected_error_p90 is None and r.results[0]["expected_error_p90"] is None
    p = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb",
         "--num-devices", "1", "--isl", "100", "--osl", "10", "--calibration", str(path)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 0 and "expected error of tokens/s: not quoted" in p.stdout


def test_study_writes_the_table_from_held_out_rows(tmp_path: Path) -> None:
    """The study's held-out p90 over a small two-model subset, written and read back."""
    src = ROOT / "studies" / "data" / "published_runs_dev.csv"
    with src.open(newline="") as f:
        rows = list(csv.DictReader(f))
    keep = [r for r in rows if r["run_id"] in {"1062", "1068", "1077", "1105", "1110", "1119"}]
    assert len(keep) == 6
    sub = tmp_path / "rows.csv"
    with sub.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    out = tmp_path / "ee.yaml"
    p = subprocess.run(
        [sys.executable, "studies/published_serving.py", "--csv", str(sub), "--write-expected-error", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    t = yaml.safe_load(out.read_text())
    assert t["schema"] == TABLE["schema"] and t["base"]["rows"] == 6
    assert "held out" in p.stdout and "coverage" in p.stdout
    assert 0 < t["base"]["p90_ape"] < 1 and t["coverage"]["model"]["rows"] == 6
