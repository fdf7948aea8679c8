"""``autopar calibrate``: microbenchmark this machine and backend, fit a device profile and a calibration."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: Any) -> dict[str, Any]:
    from autopar.cli.args import MAX_LOCAL_RANKS, int_range, positive_float

    p = sub.add_parser(
        "calibrate",
        help="microbenchmark this machine; fit a device profile and a calibration file",
        description="Run GEMM, attention, elementwise, dispatch and collective microbenchmarks on N local "
        "ranks (torchrun; gloo on CPU, NCCL on GPU), fit the latency model's coefficients with "
        "scipy, and write <out-dir>/<name>.yaml (calibration) and <out-dir>/<name>.device.yaml "
        "(device profile). Use them with --device <name>.device.yaml --calibration <name>.yaml.",
    )
    p.add_argument(
        "--world-size",
        type=int_range(1, MAX_LOCAL_RANKS),
        default=2,
        help=f"ranks to measure with, 1..{MAX_LOCAL_RANKS}: the world size of the runs to predict (default: 2)",
    )
    p.add_argument("--name", default=None, help="device id and file stem (default: local-<cpu|cuda>-w<N>)")
    p.add_argument(
        "--out-dir",
        default=None,
        help="an existing directory to write into (default: ./autopar-calibration, created if missing; "
        "never the installed package)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small sweep (seconds; for CI and smoke tests); without it a GPU gets training-size shapes",
    )
    p.add_argument(
        "--run-device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="benchmark on the CPU or the GPUs (default: GPUs when present)",
    )
    p.add_argument(
        "--timeout", type=positive_float, default=900.0, help="seconds before the microbenchmarks are stopped"
    )
    p.add_argument(
        "--from-raw",
        default=None,
        metavar="FILE",
        help="fit saved microbenchmark results instead of measuring",
    )
    p.add_argument(
        "--save-raw", default=None, metavar="FILE", help="also save the raw microbenchmark results"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return {"calibrate": cmd_calibrate}


DEFAULT_OUT_DIR = "autopar-calibration"


def cmd_calibrate(a: argparse.Namespace) -> int:
    from autopar.calibration.calibrate import calibrate, check_name
    from autopar.errors import AutoparError
    from autopar.files import check_output, load_json, require_mapping

    if a.name is not None:  # before anything slow (importing torch to look for GPUs, measuring)
        check_name(a.name)
    raw = None
    if a.from_raw:
        hint = "pass a file written by --save-raw"
        raw = require_mapping(load_json(a.from_raw, "raw results", hint), f"raw results {a.from_raw}", hint)
        ws = raw.get("world_size")
        if "world_size" in raw and (not isinstance(ws, int) or isinstance(ws, bool) or ws < 1):
            raise AutoparError(
                f"raw results {a.from_raw}: world_size must be a positive integer, got {ws!r}", hint
            )
        if raw.get("device") not in (None, "cpu", "cuda"):
            raise AutoparError(
                f"raw results {a.from_raw}: device must be cpu or cuda, got {raw.get('device')!r}", hint
            )
    world = int(raw["world_size"]) if raw and "world_size" in raw else a.world_size
    kind = (raw or {}).get("device") or (
        "cuda" if a.run_device == "cuda" else "cpu" if a.run_device == "cpu" else None
    )
    if kind is None:
        kind = "cuda" if _has_cuda() else "cpu"
    name = check_name(a.name or f"local-{kind}-w{world}")
    if a.save_raw and raw is None:  # checked before anything is measured or created
        check_output(a.save_raw, "raw microbenchmark results", "--save-raw")
    out_dir = a.out_dir or DEFAULT_OUT_DIR  # the default is made if missing, once the fit succeeded

    from autopar.progress import Bar

    what = f"running {'quick ' if a.quick else ''}microbenchmarks on {world} rank(s) ({kind})"
    bar = Bar(None, f"calibrate: {what}")

    def announce() -> None:  # once every input and destination has been checked
        if not a.json and not a.quiet:
            sys.stderr.write(f"calibrate: {what} ...\n")
            bar.start()  # an elapsed-time bar: the microbenchmarks report nothing until they end

    try:
        fitted, cal_path, prof_path = calibrate(
            world_size=world,
            name=name,
            out_dir=out_dir,
            sweep="quick" if a.quick else "gpu" if kind == "cuda" else "full",
            device=a.run_device,
            timeout_s=a.timeout,
            raw=raw,
            save_raw=a.save_raw,
            create_out_dir=a.out_dir is None,
            announce=announce,
        )
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        if raw is None:
            raise
        raise AutoparError(
            f"raw results {a.from_raw} are not microbenchmark results autopar can fit "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'malformed entry'})",
            "pass a file written by `autopar calibrate --save-raw`",
        ) from None
    finally:
        bar.close()
    out = {
        "device_id": fitted.device_id,
        "calibration": str(cal_path),
        "device_profile": str(prof_path),
        "values": fitted.values,
        "residuals": fitted.residuals,
    }
    if a.json:
        sys.stdout.write(json.dumps(out, indent=2, default=float) + "\n")
        return 0
    v = fitted.values
    lines = [
        f"device {fitted.device_id}: peak fp32 {v.get('peak_tflops_fp32', float('nan')) * 1e3:.1f} GFLOP/s per rank, "
        f"GEMM efficiency "
        + ", ".join(f"{k[9:]} {x:.3f}" for k, x in v.items() if k.startswith("gemm_eff_"))
        + f", half-dim {v['gemm_half_dim']:.0f}",
        f"  attention efficiency {v['attention_eff']:.3f}, memory {v['memory_bw_gbps']:.1f} GB/s x {v['hbm_eff']:.2f}, "
        f"dispatch {v['kernel_overhead_us']:.0f} us per layer (fwd+bwd)",
        f"  links: bus {v['bus_gbps']:.3f} GB/s, peer {v['peer_gbps']:.3f} GB/s, latency {v['latency_us']:.0f} us per hop",
        "fit residuals (median / max |error|):",
    ]
    for sec, r in fitted.residuals.items():
        if r.get("n"):
            lines.append(f"  {sec:<28} n={r['n']:<3} {r['median_abs_pct']:6.1f}% / {r['max_abs_pct']:6.1f}%")
    lines += [
        f"wrote {cal_path}",
        f"wrote {prof_path}",
        f"use: autopar predict --device {prof_path} --calibration {cal_path} --num-devices {world} ...",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False
