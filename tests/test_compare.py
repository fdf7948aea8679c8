"""compare(): per-device best layouts, winners, where the winner changes, CSV and SVG outputs, CLI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from autopar.errors import AutoparError
from autopar.whatif.compare import _changes, compare, write_outputs

ROOT = Path(__file__).resolve().parent.parent


def test_serving_comparison_grid_and_outputs(tmp_path: Path) -> None:
    res = compare(
        model="llama-3.1-8b",
        devices=["h100-sxm-80gb", "h200-sxm-141gb"],
        num_devices=2,
        workload="serving",
        isl=[512, 4096],
        concurrency=[8, "max"],
        osl=128,
        prices={"h100-sxm-80gb": 2.0, "h200-sxm-141gb": 3.0},
        weight_precision="fp8",
    )
    assert len(res.cells) == 1 * 2 * 2 * 2 and len(res.winners) == 4
    for w in res.winners:
        cells = [
            c
            for c in res.cells
            if (c["model"], c["seq_len"], c["batch"]) == (w["model"], w["seq_len"], w["batch"])
        ]
        assert sum(c["winner"] for c in cells) == 1
        best = max(cells, key=lambda c: c["tokens_per_s_per_device"])
        assert best["device"] == w["winner"]
    for c in res.cells:
        assert c["feasible"] and c["tokens_per_joule"] > 0 and c["cost_per_mtok"] > 0
    paths = write_outputs(res, tmp_path / "cmp")
    rows = list(csv.DictReader(paths[0].read_text().splitlines()))
    assert len(rows) == len(res.cells) and {"device", "layout", "winner"} <= set(rows[0])
    root = ET.parse(paths[1]).getroot()  # well-formed SVG
    assert root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}circle")) > 0


def test_training_comparison_picks_a_fitting_layout() -> None:
    res = compare(
        model="llama-3.1-8b",
        devices="a100-80gb,h100-sxm-80gb",
        num_devices=8,
        workload="training",
        seq_len=4096,
        global_batch=64,
        metric="tokens_per_joule",
    )
    assert all(c["feasible"] for c in res.cells)
    h100 = next(c for c in res.cells if c["device"] == "h100-sxm-80gb")
    a100 = next(c for c in res.cells if c["device"] == "a100-80gb")
    assert h100["tokens_per_s_per_device"] > a100["tokens_per_s_per_device"]
    assert res.winners[0]["winner"] in ("a100-80gb", "h100-sxm-80gb")


def test_winner_changes_are_named() -> None:
    winners = [
        {"model": "m", "seq_len": 512, "batch": 1, "winner": "a"},
        {"model": "m", "seq_len": 512, "batch": 64, "winner": "b"},
        {"model": "m", "seq_len": 8192, "batch": 1, "winner": "b"},
        {"model": "m", "seq_len": 8192, "batch": 64, "winner": "b"},
    ]
    ch = _changes(winners)
    assert any("batch 1 -> 64" in s and "a -> b" in s for s in ch)
    assert any("seq 512 -> 8192" in s for s in ch)
    assert len(ch) == 2


@pytest.mark.parametrize(
    "kw",
    [
        dict(metric="speed"),
        dict(workload="inference"),
        dict(devices=["h100-sxm-80gb"] * 2),
        dict(metric="cost_per_mtok"),
        dict(devices=["nope"]),
        dict(workload=None),  # never defaults to serving: the CLI refuses the same
        dict(seq_len=None),
        dict(global_batch=8),  # isl/seq_len and concurrency/global_batch are one flag each
        dict(workload="training", concurrency=None),  # a training comparison needs a global batch
    ],
)
def test_bad_input(kw: dict) -> None:
    base = dict(
        model="llama-3.1-8b",
        devices=["h100-sxm-80gb"],
        num_devices=1,
        workload="serving",
        seq_len=[128],
        concurrency="max",
    )
    with pytest.raises(AutoparError):
        compare(**{**base, **kw})


def test_cli(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "autopar.cli",
            "compare",
            "--workload",
            "serving",
            "--model",
            "llama-3.1-8b",
            "--devices",
            "h100-sxm-80gb,mi300x",
            "--num-devices",
            "1",
            "--isl",
            "256",
            "--osl",
            "64",
            "--batch",
            "4,max",
            "--out",
            str(tmp_path / "c"),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["cells"]) == 4 and len(d["files"]) == 2
    assert (tmp_path / "c.svg").is_file() and (tmp_path / "c.csv").is_file()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "autopar.cli",
            "compare",
            "--workload",
            "serving",
            "--model",
            "llama-3.1-8b",
            "--devices",
            "h100-sxm-80gb",
            "--num-devices",
            "1",
            "--isl",
            "256",
            "--metric",
            "cost_per_mtok",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_training_comparison_picks_the_recommend_winner() -> None:
    """compare --workload training runs the search itself: its top-1 is recommend's for the same job."""
    from autopar.search.recommend import recommend

    job = dict(num_devices=64, seq_len=8192, global_batch=128)
    res = compare(
        model="llama-3.1-70b",
        devices=["h100-sxm-80gb", "a100-80gb"],
        workload="training",
        seq_len=job["seq_len"],
        global_batch=job["global_batch"],
        num_devices=job["num_devices"],
    )
    for c in res.cells:
        r = recommend(model="llama-3.1-70b", device=c["device"], top=1, progress=False, **job)
        best = r.results[0]
        assert c["layout"] == best.layout.short()
        assert c["tokens_per_s_per_device"] == best.tokens_per_s_per_device
