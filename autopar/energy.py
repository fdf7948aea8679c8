"""One model of device power, used by training, serving and the accelerator landscape.

Every phase draws between idle power and TDP (REFERENCE Part D §3.3):

* **kernels running** (serving's prefill and decode iterations): ``P = idle + (TDP - idle) ·
  min(1, F_BASE + F_COMPUTE·u_c + F_MEMORY·u_m)`` with ``u_c`` the achieved fraction of the
  achievable math rate and ``u_m`` of the achievable memory bandwidth (:func:`phase_power`).
  GEMM-heavy prefill (u_c ~ 0.9) lands at ~0.9 TDP, bandwidth-bound decode (u_m ~ 1, u_c ~ 0.05)
  at ~0.5 TDP: the 0.85-1.0 and 0.2-0.55 of TDP measured by [S21] and [S27].
* **training compute**: ``f(u) = COMPUTE_POWER_FLOOR + (1 - floor)·u`` with ``u`` the model-FLOPs
  utilization of the busy time: the same idle..TDP span and stall share, with the training step's
  own floor (its busy time mixes GEMMs, attention and memory-bound kernels that keep HBM and clocks
  up; the serving form needs per-kernel utilizations the training engine does not split).
* **communication stalls and bubbles**: ``STALL_POWER_FRACTION`` of the span (links and memory busy,
  math idle), plus the link energy per byte moved (:func:`comm_energy_j`, per link tier).
* **idle** between requests: ``idle_w``; at utilization (duty cycle) ``d`` a device spends ``1 - d``
  of the wall time there (:func:`idle_share`): SRAM/dataflow parts with high idle power lose most.
* **system overhead** (hosts, NICs, fans, PSU loss): ``node_overhead_w`` per chip at its maximum,
  drawn at ``NODE_OVERHEAD_LOAD`` of it all the time.

Energy figures per token, per kWh and per dollar (:func:`tokens_per_kwh`, :func:`usd_per_mtok`)
are computed per chip, per system (``chips_per_system``) and per rack by the callers.
"""

from __future__ import annotations

import numpy as np

# f(u) for training compute: 0.55 at zero utilization (clocks up, memory busy) to 1.0 at full peak.
COMPUTE_POWER_FLOOR = 0.55
# f for exposed communication and bubbles: links and HBM busy, tensor cores idle.
STALL_POWER_FRACTION = 0.20
# Device profiles give the node overhead at its maximum (system max power minus the GPUs' TDP, per
# GPU); under load host CPUs, NICs and fans draw about half of it (estimate).
NODE_OVERHEAD_LOAD = 0.5
# Kernel-phase power (serving): base, math and memory shares of the idle..TDP span.
F_BASE = 0.10
F_COMPUTE = 0.85
F_MEMORY = 0.35
# Link energy per bit moved, per link tier (estimates: package-level links such as NVLink-C2C are
# quoted by NVIDIA at 1.3 pJ/bit; board-to-board SerDes links a few pJ/bit; a network hop through NIC,
# cables and switches 10-30 pJ/bit end to end). Not measured here.
LINK_PJ_PER_BIT: dict[str, float] = {"scale_up": 5.0, "scale_out": 20.0}

__all__ = [
    "COMPUTE_POWER_FLOOR",
    "STALL_POWER_FRACTION",
    "NODE_OVERHEAD_LOAD",
    "F_BASE",
    "F_COMPUTE",
    "F_MEMORY",
    "LINK_PJ_PER_BIT",
    "phase_power",
    "stall_power",
    "idle_share",
    "average_power",
    "comm_energy_j",
    "tokens_per_kwh",
    "usd_per_mtok",
    "energy_per_step",
]


def phase_power(device, u_compute, u_memory) -> np.ndarray:
    """Device power (W) while kernels run at utilizations ``u_compute`` and ``u_memory`` (0..1)."""
    p = device.power
    f = F_BASE + F_COMPUTE * np.clip(u_compute, 0.0, 1.0) + F_MEMORY * np.clip(u_memory, 0.0, 1.0)
    return p.idle_w + (p.tdp_w - p.idle_w) * np.minimum(1.0, f)


def stall_power(device) -> float:
    """Device power (W) during exposed communication, host gaps and pipeline bubbles."""
    p = device.power
    return p.idle_w + (p.tdp_w - p.idle_w) * STALL_POWER_FRACTION


def average_power(device, utilization, active_w=None, *, overhead: bool = True) -> np.ndarray:
    """Wall-clock average power per chip at a duty cycle ``utilization`` (share of time serving).

    ``active_w`` is the power while serving (default: TDP); the rest of the time the chip idles. With
    ``overhead`` the chip's share of the system overhead is added at its typical load.
    """
    p = device.power
    d = np.clip(np.asarray(utilization, dtype=np.float64), 0.0, 1.0)
    act = p.tdp_w if active_w is None else np.asarray(active_w, dtype=np.float64)
    avg = d * act + (1.0 - d) * p.idle_w
    return avg + (p.node_overhead_w * NODE_OVERHEAD_LOAD if overhead else 0.0)


def idle_share(device, utilization, active_w=None) -> np.ndarray:
    """Share of a chip's energy drawn while idle at duty cycle ``utilization`` (chip power only)."""
    p = device.power
    d = np.clip(np.asarray(utilization, dtype=np.float64), 0.0, 1.0)
    act = p.tdp_w if active_w is None else np.asarray(active_w, dtype=np.float64)
    idle = (1.0 - d) * p.idle_w
    return idle / np.maximum(idle + d * act, 1e-30)


def comm_energy_j(bytes_moved, tier: str = "scale_up", pj_per_bit: float | None = None) -> np.ndarray:
    """Link energy (J) of moving ``bytes_moved`` bytes over a link tier (``scale_up``/``scale_out``)."""
    e = LINK_PJ_PER_BIT[tier] if pj_per_bit is None else pj_per_bit
    return np.asarray(bytes_moved, dtype=np.float64) * 8.0 * e * 1e-12


def tokens_per_kwh(j_per_token) -> np.ndarray:
    return 3.6e6 / np.maximum(np.asarray(j_per_token, dtype=np.float64), 1e-30)


def usd_per_mtok(price_per_hour, tokens_per_s) -> np.ndarray:
    """Dollars per million tokens of a unit (chip, system or rack) rented at ``price_per_hour``."""
    return np.asarray(price_per_hour, dtype=np.float64) / 3600.0 / np.maximum(tokens_per_s, 1e-30) * 1e6


def energy_per_step(
    device, t: dict[str, np.ndarray], *, num_devices: int, peak_flops, model_flops_per_device
) -> dict[str, np.ndarray]:
    p = device.power
    step = t["step_time"]
    busy = np.minimum(t["compute_busy"], step)
    util = np.clip(model_flops_per_device / np.maximum(busy * peak_flops, 1e-30), 0.0, 1.0)
    span = p.tdp_w - p.idle_w
    p_compute = p.idle_w + span * (COMPUTE_POWER_FLOOR + (1.0 - COMPUTE_POWER_FLOOR) * util)
    p_stall = stall_power(device)
    per_device = busy * p_compute + (step - busy) * p_stall + step * p.node_overhead_w * NODE_OVERHEAD_LOAD
    energy = per_device * num_devices
    return {"energy_j": energy, "avg_power_w": per_device / step}
