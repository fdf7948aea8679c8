"""GPU check: autopar's CUDA/NCCL path run on a real GPU, and the device profile's rates measured there.

    python studies/cuda_check.py --out DIR [--profile h200-sxm-141gb] [--skip kernels,calibrate,validate]

Three parts, each written to DIR as soon as it ends (a failing part is recorded and the next runs):

1. **kernels** (``kernels.json``): what the GPU reaches through PyTorch, timed with CUDA events
   (median of 10 after 3 warm-ups), beside what the shipped device profile says for the same shape:
   bf16 and fp8 (per-tensor scaled, ``torch._scaled_mm``) GEMMs at training shapes against the
   profile's shape law ``efficiency.gemm x (1 + 3d/R) / (1 + d/M + d/N + d/K)``; causal bf16
   ``scaled_dot_product_attention`` forward per head dimension and sequence (FlashAttention-2 and
   cuDNN backends, 16k tokens per call) against ``efficiency.attention_fwd``, and forward + backward
   over forward; a device-to-device copy against ``memory_bw_gbps x efficiency.hbm``.
2. **calibrate** (``calibrate.json``, ``raw.json``, ``cuda-check{,.device}.yaml``): ``autopar
   calibrate --run-device cuda`` on every local GPU (the GPU sweep: training-size shapes).
3. **validate** (``validate.json``, every record): ``autopar validate --run-device cuda`` runs layouts of two
   Llama-shaped models (1.5B and 3.6B parameters; seq 2048, global batch 8, bf16; micro-batch x
   recompute, plus TP/ZeRO-3 layouts when there are 2+ GPUs) with the reference runner (eager
   PyTorch, NCCL) and compares step time and peak memory with the shipped profile's predictions;
   the same layouts are then predicted with part 2's fresh calibration.

Needs autopar importable by the GPU machine's Python: ``pip install -e .``, or with no package index
there (as on the lent H200) pydantic carried as wheels and ``PYTHONPATH`` at the checkout (the run on
2026-12-04 also linked ``autopar/cost_models`` and ``autopar/search_spaces``, which a checkout now
maps itself). The model keys name Llama 3.2 1B and 3B shapes, with an untied head.

``summary.txt`` holds the printed figures. Seven files in all; the models and layouts files the
commands read live in a temporary directory. Nothing else is written.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

R = 16384.0  # the shape law's reference dimension (autopar.blocks.context.MAMF_REFERENCE_DIM)
GEMM_SHAPES = [  # (tokens of a micro-batch, N, K): Llama 8B/70B projections and a square reference
    (m, n, k)
    for m in (2048, 8192, 16384)
    for n, k in ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192))
] + [(16384, 16384, 16384)]
ATTN = [(d, s) for d in (64, 128) for s in (1024, 2048, 4096, 8192, 16384)]
MODELS = {
    "llama-1b": {
        "hidden": 2048,
        "layers": 16,
        "heads": 32,
        "kv_heads": 8,
        "ffn_hidden": 8192,
        "vocab": 128256,
    },
    "llama-3b": {
        "hidden": 3072,
        "layers": 28,
        "heads": 24,
        "kv_heads": 8,
        "ffn_hidden": 8192,
        "vocab": 128256,
    },
}
LINES: list[str] = []


def say(text: str = "") -> None:
    LINES.append(text)
    print(text, flush=True)


def timed(torch, fn, reps: int = 10, warm: int = 3) -> float:
    """Median seconds of ``fn`` by CUDA events."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(ts)


def shape_law(e16k: float, d: float, m: float, n: float, k: float) -> float:
    return e16k * (1 + 3 * d / R) / (1 + d / m + d / n + d / k)


def interp_log(curve: list[tuple[float, float]], s: float) -> float:
    xs = [math.log(x) for x, _ in curve]
    ys = [y for _, y in curve]
    x = min(max(math.log(s), xs[0]), xs[-1])
    for i in range(len(xs) - 1):
        if x <= xs[i + 1]:
            t = (x - xs[i]) / (xs[i + 1] - xs[i])
            return ys[i] + t * (ys[i + 1] - ys[i])
    return ys[-1]


def _fp8_time(torch, a8, b8) -> float:
    one = torch.tensor(1.0, device=a8.device)
    return timed(torch, lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


def _attention_times(torch, backend, q, k, v) -> tuple[float, float]:
    """(forward, forward + backward) seconds of causal SDPA on ``backend``."""
    from torch.nn.attention import sdpa_kernel

    F = torch.nn.functional

    def fb():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(torch.ones_like(o))

    with sdpa_kernel([backend]):
        return timed(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), timed(
            torch, fb, reps=5
        )


def kernels(profile_id: str) -> dict[str, Any]:
    import torch

    from autopar.hardware import load_device

    dev = load_device(profile_id)
    eff = dev.efficiency
    peak = {p: dev.peak_tflops[p] * 1e12 for p in ("bf16", "fp8")}
    out: dict[str, Any] = {"profile": profile_id, "gemm": [], "attention": [], "copy": {}}
    cuda = torch.device("cuda")
    say(f"kernels on {torch.cuda.get_device_name(0)} vs profile {profile_id}")
    say(
        f"{'GEMM M x N x K':<24} {'bf16 eff':>9} {'profile':>8} {'ratio':>6}   {'fp8 eff':>8} {'profile':>8} {'ratio':>6}"
    )
    hd8 = eff.gemm_half_dim_by_precision.get("fp8", eff.gemm_half_dim)
    for m, n, k in GEMM_SHAPES:
        flops = 2.0 * m * n * k
        a = torch.randn(m, k, device=cuda, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=cuda, dtype=torch.bfloat16)
        t16 = timed(torch, lambda a=a, b=b: a @ b)
        row = {"M": m, "N": n, "K": k, "bf16_s": t16, "bf16_eff": flops / t16 / peak["bf16"]}
        row["bf16_profile"] = shape_law(eff.gemm["bf16"], eff.gemm_half_dim, m, n, k)
        try:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = torch.randn(n, k, device=cuda, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()
            t8 = _fp8_time(torch, a8, b8)
            row.update(fp8_s=t8, fp8_eff=flops / t8 / peak["fp8"])
            row["fp8_profile"] = shape_law(eff.gemm["fp8"], hd8, m, n, k)
        except Exception as exc:  # noqa: BLE001 - recorded, the bf16 figure stands
            row["fp8_error"] = f"{type(exc).__name__}: {exc}"[:200]
        out["gemm"].append(row)
        f8 = (
            f"{row['fp8_eff']:>8.3f} {row['fp8_profile']:>8.3f} {row['fp8_eff'] / row['fp8_profile']:>6.2f}"
            if "fp8_eff" in row
            else "fp8 failed"
        )
        say(
            f"{m:>6} x {n:>5} x {k:>5}      {row['bf16_eff']:>9.3f} {row['bf16_profile']:>8.3f} "
            f"{row['bf16_eff'] / row['bf16_profile']:>6.2f}   {f8}"
        )
        del a, b
    torch.cuda.empty_cache()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gemm_rates import fit_shape  # the shape law fitted as for AIConfigurator's tables

    for prec in ("bf16", "fp8"):
        rows = [r for r in out["gemm"] if f"{prec}_eff" in r]
        if len(rows) >= 3:
            e16k, hd, rms = fit_shape(
                *(np.array([r[c] for r in rows], float) for c in ("M", "N", "K", f"{prec}_eff"))
            )
            hd_prof = eff.gemm_half_dim if prec == "bf16" else hd8
            out[f"{prec}_shape_law"] = {"efficiency": e16k, "half_dim": hd, "rms_log_error": rms}
            say(
                f"{prec} shape law fitted to these GEMMs: efficiency {e16k:.3f} at {R:.0f}^3, half-dim {hd:.0f} "
                f"(rms log error {rms:.3f}); profile {eff.gemm[prec]:.3f}, {hd_prof:.0f}"
            )

    from torch.nn.attention import SDPBackend

    say(f"{'attention d, seq':<18} {'backend':<7} {'fwd eff':>8} {'profile':>8} {'ratio':>6} {'(f+b)/f':>8}")
    for d, s in ATTN:
        h, bsz = 4096 // d, max(1, 16384 // s)
        q, k_, v = (
            torch.randn(bsz, h, s, d, device=cuda, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        flops = 2.0 * bsz * s * s * h * d  # causal forward: half of 4 b s^2 h d
        curve = eff.attention_fwd.get(d)
        prof = interp_log(curve, s) if curve else float("nan")
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                tf, tfb = _attention_times(torch, backend, q, k_, v)
            except Exception as exc:  # noqa: BLE001
                out["attention"].append({"head_dim": d, "seq": s, "backend": name, "error": str(exc)[:200]})
                say(f"{d:>4}, {s:>6}       {name:<7} failed: {type(exc).__name__}")
                continue
            e = flops / tf / peak["bf16"]
            out["attention"].append(
                {
                    "head_dim": d,
                    "seq": s,
                    "backend": name,
                    "fwd_s": tf,
                    "fwd_bwd_s": tfb,
                    "fwd_eff": e,
                    "profile": prof,
                }
            )
            say(f"{d:>4}, {s:>6}       {name:<7} {e:>8.3f} {prof:>8.3f} {e / prof:>6.2f} {tfb / tf:>8.2f}")
        del q, k_, v
    torch.cuda.empty_cache()

    n = 2**29  # 1 GiB of bf16 each way: far past L2
    src = torch.empty(n, device=cuda, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    t = timed(torch, lambda: dst.copy_(src))
    gbps = 2 * 2 * n / t / 1e9
    model = dev.memory_bw_gbps * eff.hbm
    out["copy"] = {
        "bytes": 4 * n,
        "time_s": t,
        "gbps": gbps,
        "datasheet_gbps": dev.memory_bw_gbps,
        "profile_gbps": model,
    }
    say(
        f"copy 1 GiB: {gbps:.0f} GB/s read+write = {gbps / dev.memory_bw_gbps:.3f} of the datasheet "
        f"{dev.memory_bw_gbps:.0f}; profile assumes {eff.hbm:.2f} ({gbps / model:.2f}x)"
    )
    return out


def autopar_cli(args: list[str], timeout: float) -> tuple[int, str]:
    p = subprocess.run(
        [sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    return p.returncode, p.stdout + p.stderr


def calibrate(out: Path, n_gpus: int) -> dict[str, Any]:
    rc, log = autopar_cli(
        [
            "calibrate",
            "--run-device",
            "cuda",
            "--world-size",
            str(n_gpus),
            "--name",
            "cuda-check",
            "--out-dir",
            str(out),
            "--save-raw",
            str(out / "raw.json"),
            "--timeout",
            "240",
        ],
        timeout=300,
    )
    say(f"autopar calibrate (exit {rc}):")
    for ln in log.strip().splitlines()[-16:]:
        say("  " + ln)
    return {"returncode": rc, "log": log[-6000:]}


def layouts(n_gpus: int, model: str) -> list[dict[str, Any]]:
    mbs = (1, 2, 4, 8) if model == "llama-1b" else (1, 2, 4)
    lays = [
        {"tp": 1, "pp": 1, "dp": 1, "micro_batch": mb, "recompute": rc, "precision": "bf16"}
        for mb in mbs
        for rc in ("none", "full")
    ]
    if n_gpus >= 2:  # the NCCL collectives of TP and ZeRO-3
        lays = [dict(lay, dp=n_gpus) for lay in lays if lay["micro_batch"] <= 8 // n_gpus]
        lays += [
            {
                "tp": 2,
                "pp": 1,
                "dp": n_gpus // 2,
                "sp": True,
                "micro_batch": 1,
                "recompute": "none",
                "precision": "bf16",
            },
            {
                "tp": 1,
                "pp": 1,
                "dp": n_gpus,
                "zero": 3,
                "micro_batch": 1,
                "recompute": "none",
                "precision": "bf16",
            },
        ]
    return lays


def validate(out: Path, n_gpus: int) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="autopar-cuda-check-") as tmp:
        return _validate(out, Path(tmp), n_gpus)


def _validate(out: Path, tmp: Path, n_gpus: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for model, dims in MODELS.items():
        mpath = tmp / f"{model}.json"
        mpath.write_text(json.dumps({"name": model, **dims}))
        lpath = tmp / f"layouts-{model}.json"
        job = {
            "model": str(mpath),
            "device": "h200-sxm-141gb" if "h200" in PROFILE else PROFILE,
            "num_devices": n_gpus,
            "seq_len": 2048,
            "global_batch": 8,
            "framework": "torchtitan",
        }
        lpath.write_text(json.dumps({"job": job, "layouts": layouts(n_gpus, model)}))
        vjson = tmp / f"validate-{model}.json"
        rc, log = autopar_cli(
            [
                "validate",
                "--layouts",
                str(lpath),
                "--run-device",
                "cuda",
                "--steps",
                "6",
                "--warmup",
                "2",
                "--timeout",
                "150",
                "--batch-size",
                "8",
                "--json",
                str(vjson),
            ],
            timeout=200,
        )
        say(f"autopar validate {model} (exit {rc}):")
        for ln in log.strip().splitlines()[-14:]:
            say("  " + ln)
        res[model] = {"returncode": rc, "log": log[-3000:]}
        if not vjson.exists():
            continue
        res[model]["validate"] = json.loads(vjson.read_text())
        recs = res[model]["validate"]["records"]
        if not (out / "cuda-check.yaml").exists():
            continue
        fresh = []
        for r in recs:
            if r.get("status") != "ok":
                continue
            lay = r["layout"]
            args = [
                "predict",
                "--model",
                str(mpath),
                "--device",
                str(out / "cuda-check.device.yaml"),
                "--calibration",
                str(out / "cuda-check.yaml"),
                "--num-devices",
                str(n_gpus),
                "--seq-len",
                "2048",
                "--global-batch",
                "8",
                "--framework",
                "torchtitan",
                "--json",
            ]
            for key in ("tp", "pp", "dp", "zero", "micro_batch", "recompute", "precision"):
                args += [f"--{key.replace('_', '-')}", str(lay[key])]
            args.append("--sp" if lay.get("sp") else "--no-sp")
            prc, plog = autopar_cli(args, timeout=60)
            if prc == 0:
                p = json.loads(plog[plog.index("{") :])
                fresh.append((r["layout_short"], r["measured_step_time_s"], p["step_time_s"]))
        if fresh:
            errs = [abs(p / m - 1) for _, m, p in fresh]
            say(
                f"  with the fresh calibration: step-time MAPE {100 * statistics.mean(errs):.1f}% over {len(fresh)} layouts"
            )
            for name, m, p in fresh:
                say(f"    {name:<40} measured {m:.3f} s, predicted {p:.3f} s ({100 * (p / m - 1):+.0f}%)")
        res[model]["fresh"] = fresh
    return res


PROFILE = "h200-sxm-141gb"


def main(argv: list[str] | None = None) -> int:
    global PROFILE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="an existing directory for the results")
    ap.add_argument("--profile", default=PROFILE, help="the device profile to compare with")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip")
    a = ap.parse_args(argv)
    PROFILE = a.profile
    out = Path(a.out)
    if not out.is_dir():
        print(f"error: --out {out} is not an existing directory; create it first", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU here; run this study on a GPU machine", file=sys.stderr)
        return 2
    n_gpus = torch.cuda.device_count()
    say(
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
        f"{n_gpus} x {torch.cuda.get_device_name(0)}"
    )
    skip = set(filter(None, a.skip.split(",")))
    for part, fn in (
        ("kernels", lambda: kernels(PROFILE)),
        ("calibrate", lambda: calibrate(out, n_gpus)),
        ("validate", lambda: validate(out, n_gpus)),
    ):
        if part in skip:
            continue
        t0 = time.perf_counter()
        try:
            res = fn()
        except Exception:  # noqa: BLE001 - one failing part must not lose the others
            res = {"error": traceback.format_exc()[-3000:]}
            say(f"{part} failed:\n{res['error']}")
        res["elapsed_s"] = time.perf_counter() - t0
        say(f"[{part}: {res['elapsed_s']:.0f} s]")
        (out / f"{part}.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "summary.txt").write_text("\n".join(LINES) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
