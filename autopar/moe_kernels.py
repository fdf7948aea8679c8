"""Measured MoE-layer kernel rates: how fast a serving stack's fused MoE runs on a device.

A serving MoE layer is one fused operator (TensorRT-LLM's CUTLASS/TRTLLM-gen fused MoE, vLLM's and
SGLang's fused-MoE kernels): routing, the token permutation, the grouped expert GEMMs of the local
experts and the weighted un-permutation. Priced as dense GEMMs over each expert's rows, it came out
1.4-6.7x faster than the kernels measured on the same GPUs (median per device, backend and dtype:
``studies/moe_rates.py``), and the TensorRT-LLM 1.0 MoE serving runs 1.2-3.4x too fast. So each (device, backend, weight precision) with
a measured table gets four rates fitted to it, one law for all of them (:func:`layer_time`)::

    t = max(F / (peak * compute), W / (hbm * bandwidth)) + moved / (hbm * bandwidth)
        + fixed_us + per_token_ns * T

* ``F``: the FLOPs of the rows this rank's experts run (``T * k / ep`` rows, each the expert MLP's
  GEMMs); ``peak``: the precision's dense peak of the device; ``compute``: the share of it the grouped
  GEMMs reach.
* ``W``: the weights of the local experts that receive any token (balanced routing: a share
  ``1 - (1 - k/E)^T`` of them); ``hbm``: the device's HBM bandwidth; ``bandwidth``: the share of it
  the kernels stream weights and token rows at.
* ``moved``: the permuted token rows written and read around the GEMMs (16-bit rows of the expert
  input width, four passes: permute out and in, un-permute out and in).
* ``fixed_us``: the layer's kernel chain that no work hides (launches, the routing sort, the
  grouped-GEMM problem setup); ``per_token_ns``: routing and bookkeeping per token entering the layer.

The rates are fitted by ``studies/moe_rates.py --write`` (soft-L1 least squares on log latency) to
aiconfigurator-core's measured MoE tables (NVIDIA, Apache-2.0: per GPU, framework, version, dtype,
shape and token count; balanced routing) and shipped in ``cost_models/backends/moe_kernels.yaml``, each
with its table and fit error. Skewed routing is the workload's ``expert_imbalance``, not a rate.

A device without a measured table takes the measured devices' median rates with its compute share
scaled by its own dense GEMM efficiency (``transfer`` in the file), and says so (:func:`rate_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from autopar.errors import AutoparError

ACT_BYTES = 2.0  # token rows between the MoE's kernels are 16-bit
MOVED_PASSES = 4.0  # permute: write + read; un-permute: write + read
# autopar serving weight precision -> the measured table's MoE dtype. Weight-only int8/int4 dequantize
# into 16-bit GEMMs; MXFP4 takes the NVFP4 kernels (both FP4 E2M1 with block scales).
TABLE_DTYPE: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "bfloat16",
    "fp8": "fp8",
    "fp8-block": "fp8_block",
    "nvfp4": "nvfp4",
    "mxfp4": "nvfp4",
    "int8": "bfloat16",
    "int4": "bfloat16",
}


@dataclass(frozen=True)
class MoeRate:
    """The four rates of :func:`layer_time` and where they come from (``measured``: a table of this
    device; ``transferred``: the measured devices' medians)."""

    compute: float
    bandwidth: float
    fixed_us: float
    per_token_ns: float
    source: str
    measured: bool


def rates_path() -> Path:
    return Path(str(resources.files("autopar.cost_models") / "backends" / "moe_kernels.yaml"))


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    import yaml

    path = rates_path()
    try:
        data = yaml.safe_load(path.read_text())
        data["devices"], data["transfer"]  # noqa: B018 (both sections must be there)
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise AutoparError(f"MoE kernel rates {path} are unreadable: {str(exc).splitlines()[0]}") from None
    return data


def rate_for(device_id: str, backend: str, precision: str, dense_eff: float) -> MoeRate:
    """The MoE rates of ``device_id`` for ``backend`` at weight ``precision``: the device's measured
    table of that backend, else its TensorRT-LLM table (the same GPU, NVIDIA's fused MoE), else the
    device's table of another backend, else the transferred medians with the compute share scaled to
    ``dense_eff`` (the device's dense GEMM efficiency at that precision)."""
    t = _table()
    dtype = TABLE_DTYPE.get(precision, "bfloat16")
    per_dev = t["devices"].get(device_id, {})
    for b in dict.fromkeys((backend, "trtllm", *per_dev)):
        row = per_dev.get(b, {}).get(dtype)
        if row:
            return MoeRate(
                compute=float(row["compute"]),
                bandwidth=float(row["bandwidth"]),
                fixed_us=float(row["fixed_us"]),
                per_token_ns=float(row["per_token_ns"]),
                source=f"measured ({row['table']}, {dtype}, {row['shapes']} shapes, "
                f"rms log error {row['rms_log_error']})",
                measured=True,
            )
    tr = t["transfer"]
    return MoeRate(
        compute=float(dense_eff) * float(tr["compute_over_dense"]),
        bandwidth=float(tr["bandwidth"]),
        fixed_us=float(tr["fixed_us"]),
        per_token_ns=float(tr["per_token_ns"]),
        source=f"transferred (no measured MoE table for {device_id}: the measured devices' medians)",
        measured=False,
    )


def layer_time(
    rate: MoeRate,
    *,
    tokens,
    rows,
    local_experts,
    activated,
    flops_per_row,
    weight_bytes_per_expert,
    row_width,
    peak,
    hbm_bw,
) -> tuple[Any, Any, Any, Any, Any]:
    """(seconds, FLOPs, HBM bytes, compute seconds, memory seconds) of one fused MoE layer's routed
    experts on one rank (arrays broadcast): ``tokens`` enter its routing, ``rows`` routed copies reach
    its ``local_experts`` (``activated``: the share of them that get any), each row costing
    ``flops_per_row``; an expert's weights are ``weight_bytes_per_expert``; the permuted rows are
    ``row_width`` wide. The law is the module docstring's."""
    rows = np.asarray(rows, dtype=np.float64)
    flops = rows * flops_per_row
    w_bytes = np.asarray(local_experts, dtype=np.float64) * activated * weight_bytes_per_expert
    moved = rows * row_width * ACT_BYTES * MOVED_PASSES
    bw = hbm_bw * rate.bandwidth
    t_c = flops / (peak * rate.compute)
    t_w = w_bytes / bw
    t_m = moved / bw
    fixed = rate.fixed_us * 1e-6 + rate.per_token_ns * 1e-9 * np.asarray(tokens, dtype=np.float64)
    t = np.maximum(t_c, t_w) + t_m + fixed
    return t, flops, w_bytes + moved, t_c, t_w + t_m
