"""The accelerator landscape: serving throughput per chip, per system, per watt and per dollar over
batch x sequence length x model, and where the winner changes.

For every (device, model, sequence length) the serving engine (:func:`autopar.serving.estimate.
evaluate_serving`, the model behind ``autopar serve``) scores one table holding every instance shape
(tensor-parallel degree up to the device's scale-up domain, pipeline stages up to the model's layers,
at most ``max_chips`` chips) times every batch (sequences in flight per instance) in one vectorized
call. Each shape holds weights and KV in the device's home memory tier (HBM on GPUs, SRAM on Groq and
Cerebras), so an SRAM-only system spreads a model over hundreds of chips and a batch is limited by
the KV room that leaves. Per batch, the best shape under each normalization:

* ``chip``: output tokens/s per chip;
* ``system``: output tokens/s per system (``chips_per_system`` chips: a DGX, a GroqNode, one CS-3);
* ``watt``: output tokens per joule at duty cycle ``utilization`` (share of wall time serving; the
  rest idles at ``idle_w``): chip power from the phase model of :mod:`autopar.energy` plus the
  system overhead share (:func:`autopar.energy.average_power`). At low utilization the devices that
  idle high (dataflow and wafer-scale parts) lose most;
* ``dollar``: output tokens per dollar at the given price per chip-hour (only devices with a price).

A cell's winner is the device with the highest value; :attr:`LandscapeResult.changes` lists every
place where it differs from its neighbour along batch, sequence length or model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopar.errors import AutoparError
from autopar.serving.search import pow2_upto

__all__ = ["NORMALIZATIONS", "LandscapeResult", "landscape"]

NORMALIZATIONS: dict[str, str] = {
    "chip": "output tokens/s per chip",
    "system": "output tokens/s per system",
    "watt": "output tokens per joule",
    "dollar": "output tokens per dollar",
}
MAX_TP = 64
# Token budget per iteration on SRAM-only devices (Groq, Cerebras): their activations stream through
# on-chip memory in small chunks, so the serving engine's activation workspace (sized for TRT-LLM's
# budget of thousands of tokens) would not be reserved in SRAM. Estimate, not measured.
SRAM_TOKEN_BUDGET = 256


@dataclass
class LandscapeResult:
    models: list[str]
    devices: list[str]
    seq_lens: list[int]
    batches: list[int]
    per: list[str]
    cells: list[dict[str, Any]]  # one per (model, seq, batch, device)
    winners: list[dict[str, Any]]  # one per (model, seq, batch, normalization)
    changes: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from autopar.job import SCHEMA_VERSION

        return {
            "schema_version": SCHEMA_VERSION,
            "models": self.models,
            "devices": self.devices,
            "seq_lens": self.seq_lens,
            "batches": self.batches,
            "per": self.per,
            "cells": self.cells,
            "winners": self.winners,
            "winner_changes": self.changes,
        }


def _shapes(model, device, max_chips: int) -> tuple[np.ndarray, np.ndarray]:
    tps = [t for t in pow2_upto(min(device.scale_up.domain, MAX_TP)) if model.tp_head_units[0] % t == 0]
    pps = sorted({p for p in pow2_upto(model.layers)} | {model.layers})
    tp, pp = np.meshgrid(np.array(tps, float), np.array(pps, float), indexing="ij")
    keep = tp * pp <= max_chips
    return tp[keep], pp[keep]


def _context(model, device, seq: int, osl: int, wprec: str, kvprec: str | None, cal):
    from autopar.serving.estimate import make_context, make_workload

    kw: dict[str, Any] = {"isl": seq, "osl": osl, "weight_precision": wprec}
    if device.memory_kind == "sram":
        kw["max_num_tokens"] = SRAM_TOKEN_BUDGET
    if kvprec:
        kw["kv_precision"] = kvprec
    return make_context(
        model, device, make_workload(**kw), devices_per_node=device.scale_up.domain, calibration=cal
    )


def landscape(
    models: list[str],
    devices: list[str],
    seq_lens: list[int],
    batches: list[int],
    *,
    osl: int = 256,
    per: list[str] | None = None,
    prices: dict[str, float] | None = None,
    max_chips: int = 2048,
    weight_precision: str = "bf16",
    kv_precision: str | None = None,
    calibration: str | None = None,
    utilization: float = 1.0,
) -> LandscapeResult:
    """Best serving layout per device, model, sequence length and batch; the winner per normalization."""
    from autopar.coefficients import load_calibration
    from autopar.energy import NODE_OVERHEAD_LOAD, average_power, idle_share, tokens_per_kwh, usd_per_mtok
    from autopar.hardware import load_device
    from autopar.job import check_context
    from autopar.model import check_costed, load_model
    from autopar.serving.estimate import ServingTable, evaluate_serving

    per = list(per or ["chip", "system", "watt"])
    bad = [p for p in per if p not in NORMALIZATIONS]
    if bad:
        raise AutoparError(f"unknown normalization(s) {bad}", f"use {', '.join(NORMALIZATIONS)}")
    prices = {k.lower(): v for k, v in (prices or {}).items()}
    if "dollar" in per and not prices:
        raise AutoparError("--per dollar needs prices", "give --prices DEVICE=USD_PER_CHIP_HOUR,...")
    if not 0 < utilization <= 1:
        raise AutoparError(f"utilization {utilization} is not in (0, 1]", "give the share of time serving")
    if max_chips < 1 or not batches or not seq_lens:
        raise AutoparError("the landscape needs batches, sequence lengths and max_chips >= 1", "see --help")
    cal = load_calibration(calibration) if calibration else load_calibration()
    devs = [load_device(d) for d in devices]
    specs = [load_model(m) for m in models]
    for spec in specs:  # encoders are not served; hybrid kinds the serving model does not price
        check_costed(spec, "serving memory and latency")
    B = np.array(batches, dtype=np.float64)
    cells: list[dict[str, Any]] = []
    for spec in specs:
        for seq in seq_lens:
            check_context(spec, seq + osl, allow_long_context=False, what="seq_len + osl")
            for dev in devs:
                ctx = _context(spec, dev, seq, osl, weight_precision, kv_precision, cal)
                tp, pp = _shapes(spec, dev, max_chips)
                nl, nb = len(tp), len(B)
                tab = ServingTable({"tp": np.repeat(tp, nb), "pp": np.repeat(pp, nb), "conc": np.tile(B, nl)})
                r = evaluate_serving(ctx, tab)
                ok = r["valid"].reshape(nl, nb)
                chips = tab.devices.reshape(nl, nb)
                per_chip = r["output_tps_per_device"].reshape(nl, nb)
                overhead = dev.power.node_overhead_w * NODE_OVERHEAD_LOAD
                chip_w = average_power(dev, utilization, r["power_w"] - overhead).reshape(nl, nb)
                vals = {
                    "chip": per_chip,
                    "system": per_chip * dev.system_chips,
                    "watt": utilization * per_chip / chip_w,
                }
                price = prices.get(dev.id)
                if price is not None:
                    vals["dollar"] = per_chip * 3600.0 / price
                for j, b in enumerate(batches):
                    cell: dict[str, Any] = {
                        "model": spec.name,
                        "seq_len": seq,
                        "batch": b,
                        "device": dev.id,
                        "feasible": bool(ok[:, j].any()),
                    }
                    if cell["feasible"]:
                        for p in per:
                            if p not in vals:
                                continue
                            v = np.where(ok[:, j], vals[p][:, j], -np.inf)
                            i = int(np.argmax(v))
                            cell[p] = float(v[i])
                            cell[f"{p}_layout"] = f"tp{int(tp[i])} pp{int(pp[i])}"
                            cell[f"{p}_chips"] = int(chips[i, j])
                        i = int(np.argmax(np.where(ok[:, j], vals["chip"][:, j], -np.inf)))
                        k = i * nb + j
                        cell["tokens_per_s_per_user"] = float(r["output_tps_per_user"][k])
                        cell["ttft_ms"] = float(r["ttft_s"][k] * 1e3)
                        cell["power_w_per_chip"] = float(chip_w.reshape(-1)[k])
                        cell["idle_share"] = float(idle_share(dev, utilization, r["power_w"][k] - overhead))
                        if "watt" in cell:
                            cell["tokens_per_kwh"] = float(tokens_per_kwh(1.0 / cell["watt"]))
                        if price is not None and "chip" in cell:
                            cell["usd_per_mtok"] = float(usd_per_mtok(price, utilization * cell["chip"]))
                    cells.append(cell)
    winners = []
    for spec in specs:
        for seq in seq_lens:
            for b in batches:
                here = [
                    c for c in cells if c["model"] == spec.name and c["seq_len"] == seq and c["batch"] == b
                ]
                for p in per:
                    ok_c = [c for c in here if c["feasible"] and p in c]
                    win = max(ok_c, key=lambda c: float(c[p])) if ok_c else None  # noqa: B023
                    winners.append(
                        {
                            "model": spec.name,
                            "seq_len": seq,
                            "batch": b,
                            "per": p,
                            "winner": win["device"] if win else None,
                            "value": win[p] if win else None,
                        }
                    )
    changes = {p: _changes([w for w in winners if w["per"] == p]) for p in per}
    return LandscapeResult(
        [s.name for s in specs], [d.id for d in devs], seq_lens, batches, per, cells, winners, changes
    )


def _changes(winners: list[dict[str, Any]]) -> list[str]:
    by = {(w["model"], w["seq_len"], w["batch"]): w["winner"] for w in winners}
    models = list(dict.fromkeys(w["model"] for w in winners))
    seqs = list(dict.fromkeys(w["seq_len"] for w in winners))
    batches = list(dict.fromkeys(w["batch"] for w in winners))
    out = []
    for m in models:
        for s in seqs:
            for b0, b1 in zip(batches, batches[1:], strict=False):
                a, c = by[(m, s, b0)], by[(m, s, b1)]
                if a != c:
                    out.append(f"{m}, seq {s}: batch {b0} -> {b1}: {a} -> {c}")
        for b in batches:
            for s0, s1 in zip(seqs, seqs[1:], strict=False):
                a, c = by[(m, s0, b)], by[(m, s1, b)]
                if a != c:
                    out.append(f"{m}, batch {b}: seq {s0} -> {s1}: {a} -> {c}")
    for s in seqs:
        for b in batches:
            for m0, m1 in zip(models, models[1:], strict=False):
                a, c = by[(m0, s, b)], by[(m1, s, b)]
                if a != c:
                    out.append(f"seq {s}, batch {b}: {m0} -> {m1}: {a} -> {c}")
    return out
