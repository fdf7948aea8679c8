"""Energy per step from device power: each phase draws between idle power and TDP.

P_phase = P_idle + (TDP - P_idle) · f(u) (REFERENCE Part D §3.3): compute phases scale with the
achieved utilization u (dense GEMM-heavy work draws near TDP), communication stalls and pipeline
bubbles draw little above idle, and the node overhead (CPU, NICs, fans) is paid all the time.
"""

from __future__ import annotations

import numpy as np

# f(u) for compute: 0.55 at zero utilization (clocks up, memory busy) to 1.0 at full peak.
COMPUTE_POWER_FLOOR = 0.55
# f for exposed communication and bubbles: links and HBM busy, tensor cores idle.
STALL_POWER_FRACTION = 0.20
# Device profiles give the node overhead at its maximum (system max power minus the GPUs' TDP, per
# GPU); under training load host CPUs, NICs and fans draw about half of it (estimate).
NODE_OVERHEAD_LOAD = 0.5


def energy_per_step(
    device, t: dict[str, np.ndarray], *, num_devices: int, peak_flops, model_flops_per_device
) -> dict[str, np.ndarray]:
    p = device.power
    step = t["step_time"]
    busy = np.minimum(t["compute_busy"], step)
    util = np.clip(model_flops_per_device / np.maximum(busy * peak_flops, 1e-30), 0.0, 1.0)
    span = p.tdp_w - p.idle_w
    p_compute = p.idle_w + span * (COMPUTE_POWER_FLOOR + (1.0 - COMPUTE_POWER_FLOOR) * util)
    p_stall = p.idle_w + span * STALL_POWER_FRACTION
    per_device = busy * p_compute + (step - busy) * p_stall + step * p.node_overhead_w * NODE_OVERHEAD_LOAD
    energy = per_device * num_devices
    return {"energy_j": energy, "avg_power_w": per_device / step}
