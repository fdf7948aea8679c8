"""Deployment knobs of `autopar serve` that change costs (issue 23 item 4)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving.estimate import ServingTable, make_context, make_workload, steady_state
from autopar.serving.search import serve

ROOT = Path(__file__).resolve().parent.parent
KW = dict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=2, isl=8000, osl=200, top=1)


def state(h: float, batch: float = 32.0):
    w = make_workload(isl=8000, osl=200, prefix_cache_hit_rate=h)
    ctx = make_context(load_model("llama-3.1-8b"), load_device("h100-sxm-80gb"), w, devices_per_node=8)
    tab = ServingTable({"tp": 1.0, "pp": 1.0, "ep": 1.0, "conc": batch, "cap_w": 0.0})
    return steady_state(ctx, tab, np.array([batch]), budget=np.array([16384.0]))


def test_prefix_cache_hits_are_not_prefilled_again() -> None:
    cold, half, warm = state(0.0), state(0.5), state(0.9)
    # the prefill tokens each iteration computes shrink with the share of the prompt cached
    assert half["prefill_tokens_per_iter"][0] == pytest.approx(cold["prefill_tokens_per_iter"][0] * 0.5)
    assert warm["prefill_tokens_per_iter"][0] == pytest.approx(cold["prefill_tokens_per_iter"][0] * 0.1)
    assert cold["ttft"][0] > half["ttft"][0] > warm["ttft"][0]
    assert cold["tpot"][0] > half["tpot"][0] > warm["tpot"][0]  # fewer prefill tokens ride along
    # ...but the cached tokens are still attended to: more than a prompt of 10% the length costs
    w = make_workload(isl=800, osl=200)
    ctx = make_context(load_model("llama-3.1-8b"), load_device("h100-sxm-80gb"), w, devices_per_node=8)
    tab = ServingTable({"tp": 1.0, "pp": 1.0, "ep": 1.0, "conc": 32.0, "cap_w": 0.0})
    short = steady_state(ctx, tab, np.array([32.0]), budget=np.array([16384.0]))
    assert warm["ttft"][0] > short["ttft"][0]


def test_prefix_cache_hit_rate_raises_what_serve_finds() -> None:
    cold = serve(**KW)
    warm = serve(**KW, prefix_cache_hit_rate=0.8)
    assert warm.best["output_tokens_per_s"] > cold.best["output_tokens_per_s"] * 1.2
    assert warm.to_dict()["workload"]["prefix_cache_hit_rate"] == 0.8
    assert serve(**KW, prefix_cache_hit_rate=0.0).best == cold.best


@pytest.mark.parametrize("value", ["1", "-0.1", "nan"])
def test_bad_prefix_cache_hit_rate_exits_2(value: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb",
         "--num-devices", "1", "--isl", "100", "--osl", "10", "--prefix-cache-hit-rate", value],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "prefix" in p.stderr
