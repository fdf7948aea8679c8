"""Where a served model lives in a device's memory hierarchy, and which tier or unit bounds each phase.

For a model, a weight/KV precision and arrays of batch sizes and sequence lengths (broadcast
together), :func:`placement` answers, per cell:

* **chips to hold** the weights alone and the weights plus the KV cache of ``batch`` sequences of
  ``seq_len`` tokens in the *home* tier (``DeviceProfile.memory_kind``: HBM on GPUs, SRAM on Groq and
  on a Cerebras wafer), after the runtime reserve; and the systems (``chips_per_system``) that makes;
* on a deployment of ``chips`` chips: the **tier that must hold the weights** (the home tier when
  they fit, else the next tier down that does: SN40L's DDR, GH200's LPDDR5X, Cerebras' MemoryX, which
  the weights then stream from every step), the **batch limit** the home tier leaves for KV, and
* the **bound of each phase** on the roofline: prefill (all prompt tokens once) and one decode step
  (every sequence one token): ``compute`` when the GEMM FLOPs at the achievable rate take longer
  than reading the weights (and KV) at the achieved bandwidth of their tier, else that tier's name;
  each phase's time is that roofline maximum PLUS, on a machine with its own serving stack
  (``DeviceProfile.serving``: Groq, Cerebras, SambaNova), the token's pipeline latency: every layer's
  ``layer_latency_us``, one scale-out hop between consecutive systems and the stack's host time
  (weights streamed from MemoryX or DDR pay the roofline at that tier's bandwidth).

Weight bytes are the serving model's (:func:`autopar.serving.estimate.weights_per_device` at tp=pp=1:
linear layers at the weight precision, embeddings, head and norms 16-bit); KV bytes per token are
the model's (:meth:`ModelSpec.kv_cache_bytes_per_token`). Vectorized numpy over all cells.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autopar.coefficients import DEFAULT_MEMORY_CONSTANTS
from autopar.errors import AutoparError

__all__ = ["weight_bytes", "placement"]


def weight_bytes(model, weight_precision: str = "bf16") -> float:
    """Bytes of all weights as served (linear layers at ``weight_precision``, the rest 16-bit)."""
    from autopar.serving.estimate import (
        WEIGHT_BYTES,
        ServingContext,
        ServingTable,
        weights_per_device,
    )

    if weight_precision not in WEIGHT_BYTES:
        raise AutoparError(
            f"unknown weight precision {weight_precision!r}", f"use one of {', '.join(WEIGHT_BYTES)}"
        )
    wl = _Workload(weight_precision)
    ctx = ServingContext(model, None, wl, None, None, None, 1, "bf16")  # type: ignore[arg-type]
    return float(weights_per_device(ctx, ServingTable({"tp": 1, "pp": 1}))[0])


class _Workload:  # the one field weights_per_device reads
    def __init__(self, weight_precision: str) -> None:
        self.weight_precision = weight_precision


def _reserve_bytes(device) -> float:
    if device.runtime_reserve_gb is not None:
        return device.runtime_reserve_gb * 1e9
    return float(DEFAULT_MEMORY_CONSTANTS["framework_reserve_bytes"])


def placement(
    model,
    device,
    *,
    batch: Any = 1,
    seq_len: Any = 2048,
    chips: Any = None,
    weight_precision: str = "bf16",
    kv_precision: str = "bf16",
) -> dict[str, np.ndarray]:
    """Arrays (broadcast of ``batch``, ``seq_len`` and ``chips``) describing where the model lives.

    ``chips`` defaults to the chips needed to hold weights plus KV in the home tier.
    """
    from autopar.serving.estimate import KV_BYTES

    if kv_precision not in KV_BYTES:
        raise AutoparError(f"unknown KV precision {kv_precision!r}", f"use one of {', '.join(KV_BYTES)}")
    b = np.asarray(batch, dtype=np.float64)
    s = np.asarray(seq_len, dtype=np.float64)
    if np.any(b < 1) or np.any(s < 1):
        raise AutoparError("batch and sequence length must be at least 1", "give positive integers")
    W = weight_bytes(model, weight_precision)
    kv_tok = model.kv_cache_bytes_per_token(KV_BYTES[kv_precision])
    kv = kv_tok * b * s
    tiers = device.tiers()
    home = tiers[device.memory_kind]
    usable = home.capacity_gb * 1e9 - _reserve_bytes(device)
    if usable <= 0:
        raise AutoparError(
            f"{device.id}: the runtime reserve exceeds the {device.memory_kind} capacity",
            "set runtime_reserve_gb in the device profile",
        )
    chips_w = np.ceil(W / usable)
    chips_all = np.ceil((W + kv) / usable)
    n = chips_all if chips is None else np.asarray(chips, dtype=np.float64) + 0.0 * chips_all
    n = np.broadcast_to(n, np.broadcast_shapes(np.shape(n), np.shape(chips_all))).astype(np.float64)
    sysc = float(device.system_chips)
    systems = np.ceil(n / sysc)

    # The tier the weights are read from: home if weights + KV fit there, else the first slower tier
    # whose capacity (per chip, or per system for shared tiers) holds the weights.
    order = list(tiers)
    hi = order.index(device.memory_kind)
    weight_tier = np.where(n * usable >= W + kv, device.memory_kind, "none").astype(object)
    w_bw = np.where(n * usable >= W + kv, n * home.bw_gbps * 1e9, np.nan)
    for name in order[hi + 1 :]:
        t = tiers[name]
        units = systems if t.per_system else n
        fits = (weight_tier == "none") & (units * t.capacity_gb * 1e9 >= W)
        weight_tier = np.where(fits, name, weight_tier)
        w_bw = np.where(fits, units * t.bw_gbps * 1e9, w_bw)
    max_batch = np.floor(np.maximum(n * usable - W, 0.0) / np.maximum(kv_tok * s, 1e-30))

    eff = device.efficiency
    peak = device.peak_flops("bf16" if weight_precision != "fp8" else _fp8_or_bf16(device))
    flops_rate = n * peak * device.gemm_efficiency("bf16")
    act = 2.0 * model.active_params
    home_bw = n * home.bw_gbps * 1e9 * eff.hbm
    w_bw_eff = w_bw * np.where(weight_tier == device.memory_kind, eff.hbm, 1.0)
    # prefill: every prompt token through the weights once; the weights are read once
    t_pre_c = act * b * s / flops_rate
    t_pre_m = W / w_bw_eff
    # one decode step: one token per sequence; weights and the whole KV cache are read
    t_dec_c = act * b / flops_rate
    t_dec_m = W / w_bw_eff + kv / home_bw
    # The token's path on a machine with its own serving stack (SRAM, wafer, dataflow): every layer's
    # pipeline latency, one hop between consecutive systems, the stack's host time per step
    # (DeviceProfile.serving; the serving engine adds the same terms). GPUs: 0 here.
    st = device.serving
    if st is not None:
        lat = (
            model.layers * st.layer_latency_us * 1e-6
            + np.maximum(systems - 1.0, 0.0) * device.scale_out.latency_us * 1e-6
            + st.host_step_us * 1e-6
        )
        lat_dec = lat + st.host_per_seq_us * 1e-6 * b
    else:
        lat = lat_dec = np.zeros(np.shape(n))
    lat = lat + 0.0 * n
    lat_dec = lat_dec + 0.0 * n
    none = weight_tier == "none"
    return {
        "weight_bytes": np.full(np.shape(n), W),
        "kv_bytes": kv + 0.0 * n,
        "home_tier": np.full(np.shape(n), device.memory_kind, dtype=object),
        "chips_to_hold_weights": chips_w + 0.0 * n,
        "chips_to_hold": chips_all + 0.0 * n,
        "chips": n,
        "systems": systems,
        "weight_tier": weight_tier,
        "max_batch": max_batch,
        "prefill_bound": np.where(none, "none", np.where(t_pre_c >= t_pre_m, "compute", weight_tier)),
        "decode_bound": np.where(none, "none", np.where(t_dec_c >= t_dec_m, "compute", weight_tier)),
        "prefill_s": np.where(none, np.inf, np.maximum(t_pre_c, t_pre_m) + lat),
        "decode_step_s": np.where(none, np.inf, np.maximum(t_dec_c, t_dec_m) + lat_dec),
        "pipeline_latency_s": lat_dec,
    }


def _fp8_or_bf16(device) -> str:
    return "fp8" if "fp8" in device.peak_tflops else "bf16"


def placement_note(
    model, device, *, num_devices: int, batch: int, seq_len: int, weight_precision: str, kv_precision: str
) -> str:
    """One sentence for ``autopar serve``: chips that hold the model, the tier of the weights, bounds."""
    r = placement(
        model,
        device,
        batch=batch,
        seq_len=seq_len,
        chips=num_devices,
        weight_precision=weight_precision,
        kv_precision=kv_precision,
    )
    home = device.memory_kind
    w_gb = float(r["weight_bytes"]) / 1e9
    need = int(r["chips_to_hold_weights"])
    sysc = device.system_chips
    s = (
        f"memory hierarchy ({', '.join(device.tiers())}): {w_gb:,.1f} GB of weights need {need} "
        f"{device.id} chip{'s' if need != 1 else ''} in {home} ({-(-need // sysc)} system(s) of {sysc}); "
    )
    tier = str(r["weight_tier"])
    if tier == "none":
        return s + f"{num_devices} chips hold them in no tier"
    return s + (
        f"on all {num_devices} chips the weights are read from {tier}, {int(r['max_batch'])} sequences of "
        f"{seq_len} tokens fit beside them, decode is bound by {r['decode_bound']}, prefill by {r['prefill_bound']} "
        "(roofline, one batch)"
        + (
            f"; one decode step {float(r['decode_step_s']) * 1e3:.3g} ms of which {float(r['pipeline_latency_s']) * 1e3:.3g} ms "
            "is the layers' pipeline latency and system hops"
            if device.serving is not None
            else ""
        )
    )
