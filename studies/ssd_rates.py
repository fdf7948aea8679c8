"""Mamba-2 SSD scan on a GPU, timed, beside what autopar prices for it (a GPU study; not run yet).

    python studies/ssd_rates.py [--device h200-sxm-141gb] [--json OUT]

Why: the Nemotron 3 Nano rows of the Megatron-Bridge archive are predicted 1.11-1.26x too fast on
every device they ran on (H100, B200, B300, GB200, GB300), including H100 (see docs/accuracy.md).
Nano is 23 Mamba-2 layers of 52. autopar prices the chunked SSD scan as its four chunk-local
matmuls at the device's GEMM shape law, plus the fp32 chunk-state passes. Forward + backward is
three times the forward (``autopar.blocks.mamba.scan_time``). The Triton kernels that Megatron's
``MambaMixer`` runs (``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``: chunk cumsum,
chunk state, state passing, bmm, chunk scan, and about ten backward kernels) have no measured rate
in the profiles. This study measures them, at Nano and Super shapes, seq 8192, so that the price
can be set from a measurement instead of a fit.

Needs a CUDA GPU and ``mamba_ssm``'s Triton ops. ``pip install mamba-ssm`` works, or its pure-Python
``mamba_ssm/ops/triton`` and ``mamba_ssm/utils`` sources on ``PYTHONPATH``: the SSD path needs no
compiled extension. Prints measured and priced forward and forward + backward milliseconds and their
ratio. Triton's autotuning makes the first call slow, so allow a few minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (name, preset, batch, seq): Megatron-Bridge's Nano and Super runs use micro-batch 1-2 at seq 8192
CASES = [
    ("nano", "nemotron-3-nano-30b-a3b", 1, 8192),
    ("nano-mb2", "nemotron-3-nano-30b-a3b", 2, 8192),
    ("super", "nemotron-3-super-120b-a12b", 1, 8192),
]


def priced_ms(preset: str, device: str, tokens: int) -> tuple[float, float]:
    """autopar's (forward, forward + backward) milliseconds of one layer's SSD scan and chunk-state
    passes at ``tokens`` tokens, tp 1, with the device profile and the shipped calibration."""
    import numpy as np

    from autopar.blocks import mamba
    from autopar.blocks.context import gemm_time
    from autopar.coefficients import coefficients_for, load_calibration
    from autopar.hardware import load_device
    from autopar.model import load_model

    m = load_model(preset)
    co, _ = coefficients_for(load_device(device), load_calibration())
    peak, eff = np.array(co.peak_flops["bf16"]), np.array(co.gemm_eff["bf16"])

    def gt16(M, N, K):
        return gemm_time(co, peak, eff, M, N, K, 2.0)

    fwd = float(mamba.scan_time(m, gt16, float(tokens), 1.0)) + tokens * mamba.state_pass_bytes(m) / co.hbm_bw
    return 1e3 * fwd, 3e3 * fwd  # the engine: backward 2x the forward (latency.stage_slot)


def measure_ms(preset: str, batch: int, seq: int) -> tuple[float, float]:
    import torch
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    from autopar.model import load_model

    m = load_model(preset)
    nh, hd, G, N = m.mamba_heads, m.mamba_inner // m.mamba_heads, m.mamba_groups, m.mamba_state
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(batch, seq, nh, hd, device=dev, dtype=bf, requires_grad=True)
    dt = torch.randn(batch, seq, nh, device=dev, dtype=bf, requires_grad=True)
    A = (-torch.exp(torch.rand(nh, device=dev))).requires_grad_()
    B = torch.randn(batch, seq, G, N, device=dev, dtype=bf, requires_grad=True)
    C = torch.randn(batch, seq, G, N, device=dev, dtype=bf, requires_grad=True)
    D = torch.randn(nh, device=dev, requires_grad=True)
    dt_bias = torch.randn(nh, device=dev, requires_grad=True)

    def fwd():
        return mamba_chunk_scan_combined(
            x, dt, A, B, C, chunk_size=128, D=D, dt_bias=dt_bias, dt_softplus=True
        )

    gy = torch.randn_like(fwd())

    def fwd_bwd():
        fwd().backward(gy)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return statistics.median(ts)

    return timed(fwd), timed(fwd_bwd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="h200-sxm-141gb", help="the device profile to price with")
    ap.add_argument("--json", default=None, help="write the rows as JSON")
    a = ap.parse_args(argv)
    try:
        import torch
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined  # noqa: F401
    except ImportError as exc:
        print(
            f"error: this study needs torch and mamba_ssm's Triton ops ({exc}); see its docstring",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print("error: no CUDA GPU here; run this study on a GPU machine", file=sys.stderr)
        return 2
    rows = []
    print(
        f"{'case':<10} {'tokens':>7} {'fwd ms':>8} {'priced':>8} {'ratio':>6} {'f+b ms':>8} {'priced':>8} {'ratio':>6}"
    )
    for name, preset, batch, seq in CASES:
        mf, mfb = measure_ms(preset, batch, seq)
        pf, pfb = priced_ms(preset, a.device, batch * seq)
        rows.append(
            dict(
                case=name,
                preset=preset,
                batch=batch,
                seq=seq,
                fwd_ms=mf,
                fwd_bwd_ms=mfb,
                priced_fwd_ms=pf,
                priced_fwd_bwd_ms=pfb,
            )
        )
        print(
            f"{name:<10} {batch * seq:>7} {mf:>8.3f} {pf:>8.3f} {mf / pf:>6.2f} {mfb:>8.3f} {pfb:>8.3f} {mfb / pfb:>6.2f}"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
