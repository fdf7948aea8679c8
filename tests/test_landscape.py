"""The accelerator landscape (autopar.whatif.landscape, ``autopar compare --per``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.whatif.landscape import _changes, landscape


@pytest.fixture(scope="module")
def res():
    return landscape(
        ["llama-3.1-8b"],
        ["h100-sxm-80gb", "cerebras-cs3", "groq-lpu"],
        [1024],
        [1, 64, 512],
        per=["chip", "system", "watt", "dollar"],
        prices={"h100-sxm-80gb": 2.0, "cerebras-cs3": 100.0, "groq-lpu": 0.5},
        max_chips=512,
    )


def test_normalizations_are_consistent(res):
    for c in res.cells:
        if not c["feasible"]:
            continue
        dev = load_device(c["device"])
        if c["chip_layout"] == c["system_layout"]:
            assert c["system"] == pytest.approx(c["chip"] * dev.system_chips)
        price = {"h100-sxm-80gb": 2.0, "cerebras-cs3": 100.0, "groq-lpu": 0.5}[c["device"]]
        assert c["dollar"] == pytest.approx(c["chip"] * 3600 / price)
        assert 0 < c["watt"] < c["chip"]  # tokens/J below tokens/s/chip: every chip draws > 1 W


def test_winner_is_the_best_feasible_cell(res):
    for w in res.winners:
        here = [
            c
            for c in res.cells
            if (c["model"], c["seq_len"], c["batch"]) == (w["model"], w["seq_len"], w["batch"])
            and c["feasible"]
        ]
        assert w["value"] == max(c[w["per"]] for c in here)


def test_sram_only_batch_limit(res):
    groq = {c["batch"]: c for c in res.cells if c["device"] == "groq-lpu"}
    assert groq[1]["feasible"] and groq[1]["chip_chips"] >= 64  # 16 GB of weights over 230 MB chips
    assert not groq[512]["feasible"]  # no SRAM left for 512 x 1280 tokens of KV within 512 chips


def test_changes_name_each_boundary():
    ws = [{"model": "m", "seq_len": 1, "batch": b, "winner": d} for b, d in ((1, "a"), (8, "a"), (64, "b"))]
    assert _changes(ws) == ["m, seq 1: batch 8 -> 64: a -> b"]


def test_bad_requests():
    with pytest.raises(AutoparError, match="normalization"):
        landscape(["llama-3.1-8b"], ["h100-sxm-80gb"], [1024], [1], per=["furlong"])
    with pytest.raises(AutoparError, match="prices"):
        landscape(["llama-3.1-8b"], ["h100-sxm-80gb"], [1024], [1], per=["dollar"])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "autopar",
            "compare",
            "--model",
            "llama-3.1-8b",
            "--devices",
            "h100-sxm-80gb,b200",
            "--num-devices",
            "8",
            "--seq-len",
            "1024",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_per():
    r = _cli("--batch", "1,64", "--per", "chip,watt", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["per"] == ["chip", "watt"] and len(d["winners"]) == 4
    r = _cli("--batch", "1,64", "--per", "chip")
    assert r.returncode == 0 and "winner per cell" in r.stdout
    r = _cli("--batch", "max", "--per", "chip")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = _cli("--batch", "1", "--per", "dollar")
    assert r.returncode == 2 and "prices" in r.stderr


def test_low_utilization_hurts_high_idle_devices_most():
    kw = dict(per=["watt"], max_chips=64)
    full = landscape(["llama-3.1-8b"], ["h100-sxm-80gb", "cerebras-cs3"], [1024], [8], **kw)
    low = landscape(["llama-3.1-8b"], ["h100-sxm-80gb", "cerebras-cs3"], [1024], [8], utilization=0.3, **kw)
    ratio = {a["device"]: b["watt"] / a["watt"] for a, b in zip(full.cells, low.cells, strict=True)}
    assert ratio["cerebras-cs3"] < ratio["h100-sxm-80gb"] < 1.0
    shares = {c["device"]: c["idle_share"] for c in low.cells}
    assert shares["cerebras-cs3"] > shares["h100-sxm-80gb"] > 0
    with pytest.raises(AutoparError, match="utilization"):
        landscape(["llama-3.1-8b"], ["h100-sxm-80gb"], [1024], [8], utilization=0.0)
