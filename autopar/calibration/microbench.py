"""Microbenchmarks of the local machine and backend: what ``autopar calibrate`` fits.

Run by torchrun, one process per rank, exactly as the reference runner runs (same world size,
same backend, one intra-op thread per process on CPU), so every rate is the rate ONE rank gets
while all ranks of the job run at once (on a CPU host: the processes sharing its cores):

* ``gemm``: ``a @ b`` across shapes (M, N, K) and precisions (fp32, bf16; +fp16 on CUDA);
* ``attention``: causal ``scaled_dot_product_attention`` forward + backward across shapes;
* ``elementwise``: a memory-bound ``add`` across sizes, and a large copy (the bandwidth peak);
* ``collectives``: all-reduce, all-gather, reduce-scatter, all-to-all and send/recv across group
  sizes (every divisor of the world size > 1; groups of consecutive ranks, all groups at once, as
  TP groups run) and message sizes, in the byte conventions of :mod:`autopar.collectives`
  (all-reduce: the buffer; all-gather/reduce-scatter: the full gathered buffer; all-to-all: what
  one rank sends in total; send/recv: one message, one way);
* ``dispatch``: forward + backward of one reference-model layer at a tiny size (a 3-layer minus a
  1-layer model), i.e. the fixed per-layer cost of Python, dispatcher and autograd that no FLOP or
  byte count explains;
* ``tp_layer``: the same layer under the runner's DTensor TP + sequence-parallel plan per TP group
  size: what a layer's TP collectives cost as the runner issues them (launch and dispatch included);
* ``overlap``: GEMMs alone, an all-reduce alone, and the all-reduce running in the background of
  the GEMMs: how much overlapped communication slows compute on these ranks.

Each point is the median over repetitions of each rank's time, then the median over ranks.

    python -m torch.distributed.run --standalone --nproc-per-node 4 -m autopar.calibration.microbench --out mb.json

:func:`run_microbenchmarks` launches that (torch is not imported by the caller) with a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autopar.errors import RunError
from autopar.runner.launch import torchrun

SCHEMA = "autopar.microbench/v1"
ERROR_MARKER = "autopar-microbench-error: "

# Sizes of the full and the quick (CI) sweep. GEMM shapes bracket the reference runs' GEMMs
# (tokens per micro-batch x hidden x FFN width); bf16 on a CPU without bf16 units is ~50x slower
# than fp32, so it gets a few small shapes only.
SWEEPS: dict[str, dict[str, Any]] = {
    "full": {
        "gemm_fp32": [(m, n, k) for m in (64, 256, 1024) for n in (64, 256, 1024) for k in (64, 256, 1024)]
        + [(512, 512, 512), (2048, 1024, 1024)],
        "gemm_bf16": [(128, 128, 128), (256, 256, 256), (512, 512, 512)],
        "attention": [(b, h, s, 32) for b in (1, 2) for h in (2, 8) for s in (64, 128, 256)],
        "elementwise": [2**k for k in (12, 14, 16, 18, 20, 22)],
        "collective_bytes": [2**k for k in (12, 14, 16, 18, 20, 22, 24)],
        "overlap_bytes": [2**20, 2**22],
        "reps": 7,
        "min_time_s": 0.02,
    },
    # A GPU: training-size bf16 GEMMs (tokens of a micro-batch x hidden / FFN widths; the fastest
    # stands for the peak), bf16 causal attention at training sequences, streams well past L2 and
    # messages up to 256 MiB. The CPU sweep's 128-1024 GEMMs leave a GPU idle on launches. Run on
    # one H200 (studies/cuda_check.py, 2026-12-04): 18-22 s.
    "gpu": {
        "gemm_fp32": [(1024, 1024, 1024), (4096, 4096, 4096)],
        # >= 69 GFLOP each: smaller GEMMs ran at the host's launch rate on an H200 (a 512 x 1024 x
        # 1024 one took 18 us, 58 TFLOP/s), which says nothing about the GPU
        "gemm_bf16": [
            (m, n, k) for m in (2048, 8192, 16384) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))
        ]
        + [(8192, 8192, 8192), (16384, 8192, 8192)],
        "attention": [(8, 16, 1024, 128), (4, 16, 2048, 128), (2, 16, 4096, 128), (1, 16, 8192, 128)]
        + [(4, 32, 2048, 64), (1, 32, 8192, 64)],
        "attention_precision": "bf16",
        "elementwise": [2**k for k in (16, 20, 24, 26, 28)],
        "collective_bytes": [2**k for k in (12, 16, 20, 24, 26, 28)],
        "overlap_bytes": [2**24, 2**26],
        "reps": 7,
        "min_time_s": 0.01,
    },
    "quick": {
        "gemm_fp32": [(64, 64, 64), (256, 256, 256), (64, 256, 512), (512, 512, 512)],
        "gemm_bf16": [(64, 64, 64)],
        "attention": [(1, 2, 64, 16), (1, 2, 128, 16)],
        "elementwise": [2**k for k in (12, 16, 20)],
        "collective_bytes": [2**k for k in (12, 16, 20)],
        "overlap_bytes": [2**20],
        "reps": 3,
        "min_time_s": 0.005,
    },
}
DISPATCH_SHAPE = {"hidden": 64, "seq": 16}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


# ------------------------------------------------------------------------------------ worker side
class _Bench:
    def __init__(self, device: Any, sweep: dict[str, Any]) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.device, self.sweep = torch, dist, device, sweep
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _barrier(self) -> None:
        if self.dist.is_initialized():
            self.dist.barrier()

    def time_local(self, fn, *, collective: bool = False) -> float:
        """Median seconds of ``fn`` on this rank while every rank runs its own copy at the same time.

        ``collective``: ``fn`` communicates, so every rank must call it equally often.
        """
        fn()
        self._sync()
        self._barrier()
        t0 = time.perf_counter()
        fn()
        self._sync()
        once = max(time.perf_counter() - t0, 1e-7)
        inner = max(1, int(self.sweep["min_time_s"] / once))  # batch calls that are far below a timer tick
        if collective and self.dist.is_initialized():
            n = self.torch.tensor([inner], dtype=self.torch.int64, device=self.device)
            self.dist.all_reduce(n, op=self.dist.ReduceOp.MIN)
            inner = int(n.item())
        times = []
        for _ in range(self.sweep["reps"]):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            self._sync()
            times.append((time.perf_counter() - t0) / inner)
        return statistics.median(times)

    def across_ranks(self, t: float) -> float:
        if not self.dist.is_initialized():
            return t
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, t)
        return float(statistics.median(out))

    # ---------------------------------------------------------------------------------- compute
    def gemm(self) -> list[dict[str, Any]]:
        torch = self.torch
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        if self.device.type == "cuda":
            dtypes["fp16"] = torch.float16
        rows = []
        for prec, dt in dtypes.items():
            shapes = self.sweep["gemm_fp32"] if prec == "fp32" else self.sweep["gemm_bf16"]
            for m, n, k in shapes:
                a = torch.randn(m, k, device=self.device, dtype=dt)
                b = torch.randn(k, n, device=self.device, dtype=dt)
                t = self.across_ranks(self.time_local(lambda a=a, b=b: a @ b))
                rows.append({"precision": prec, "M": m, "N": n, "K": k, "time_s": t})
        return rows

    def attention(self) -> list[dict[str, Any]]:
        torch = self.torch
        F = torch.nn.functional
        rows = []
        prec = self.sweep.get("attention_precision", "fp32")
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[prec]
        for b, h, s, d in self.sweep["attention"]:
            q, k, v = (
                torch.randn(b, h, s, d, device=self.device, dtype=dt, requires_grad=True) for _ in range(3)
            )

            def step(q=q, k=k, v=v):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.sum().backward()

            t = self.across_ranks(self.time_local(step))
            rows.append(
                {
                    "precision": prec,
                    "batch": b,
                    "heads": h,
                    "seq": s,
                    "head_dim": d,
                    "causal": True,
                    "time_s": t,
                    "what": "forward+backward",
                }
            )
        return rows

    def elementwise(self) -> list[dict[str, Any]]:
        torch = self.torch
        rows = []
        for n in self.sweep["elementwise"]:
            x = torch.randn(n, device=self.device)
            y = torch.randn(n, device=self.device)
            t = self.across_ranks(self.time_local(lambda x=x, y=y: torch.add(x, y, out=x)))
            rows.append({"op": "add", "numel": n, "bytes": 3 * 4 * n, "time_s": t})
        big = max(self.sweep["elementwise"]) * 4
        src = torch.randn(big, device=self.device)
        dst = torch.empty_like(src)
        t = self.across_ranks(self.time_local(lambda: dst.copy_(src)))
        rows.append({"op": "copy", "numel": big, "bytes": 2 * 4 * big, "time_s": t})
        return rows

    def _per_layer(self, tp: int) -> float:
        """Seconds per transformer layer (forward + backward) of the reference model at a tiny size,
        as the difference of a 3-layer and a 1-layer model; ``tp > 1``: DTensor TP + sequence
        parallel over groups of ``tp`` consecutive ranks (the runner's own plan)."""
        torch = self.torch
        from autopar.runner.config import RunnerModelConfig
        from autopar.runner.model import Transformer

        seq = DISPATCH_SHAPE["seq"]
        times = []
        for layers in (1, 3):
            torch.manual_seed(0)
            cfg = RunnerModelConfig(
                hidden=DISPATCH_SHAPE["hidden"],
                layers=layers,
                heads=4,
                kv_heads=4,
                ffn_hidden=2 * DISPATCH_SHAPE["hidden"],
                vocab=64,
            )
            model = Transformer(cfg, seq).to(self.device)
            if tp > 1:
                from torch.distributed.device_mesh import init_device_mesh

                from autopar.runner.tensor_parallel import apply_tp

                mesh = init_device_mesh(
                    self.device.type, (self.world // tp, tp), mesh_dim_names=("rest", "tp")
                )
                apply_tp(model, mesh["tp"], sequence_parallel=True, expert_tp=False)
            tokens = torch.randint(cfg.vocab, (1, seq), device=self.device)

            def step(model=model, tokens=tokens):
                model(tokens).float().sum().backward()

            times.append(self.across_ranks(self.time_local(step, collective=tp > 1)))
        return max((times[1] - times[0]) / 2.0, 0.0)

    def dispatch(self) -> list[dict[str, Any]]:
        """The fixed per-layer cost (Python, dispatcher, autograd): a plain layer at a tiny size."""
        t = self._per_layer(1)
        return [{"what": "layer forward+backward", **DISPATCH_SHAPE, "group_size": 1, "time_s": t}]

    def tp_layer(self) -> list[dict[str, Any]]:
        """The same tiny layer under the runner's TP + SP plan, per TP group size: its extra time over
        the plain layer is what the layer's TP collectives cost as the runner issues them."""
        if not self.dist.is_initialized() or self.world < 2:
            return []
        rows = []
        for g in [d for d in range(2, self.world + 1) if self.world % d == 0]:
            rows.append(
                {
                    "what": "TP+SP layer forward+backward",
                    **DISPATCH_SHAPE,
                    "group_size": g,
                    "time_s": self._per_layer(g),
                }
            )
        return rows

    def overlap(self) -> list[dict[str, Any]]:
        """How much an all-reduce running in the background slows compute on the same ranks:
        GEMMs alone, the all-reduce alone, and the all-reduce issued async before the GEMMs."""
        torch, dist = self.torch, self.dist
        if not dist.is_initialized() or self.world < 2:
            return []
        a = torch.randn(256, 1024, device=self.device)
        b = torch.randn(1024, 1024, device=self.device)
        rows = []
        for nbytes in self.sweep["overlap_bytes"]:
            x = torch.zeros(nbytes // 4, device=self.device)

            def gemms(a=a, b=b):
                for _ in range(6):
                    a @ b

            def coll(x=x):
                dist.all_reduce(x)

            def both(x=x):
                work = dist.all_reduce(x, async_op=True)
                gemms()
                work.wait()

            t = {
                name: self.across_ranks(self.time_local(fn, collective=name != "gemm"))
                for name, fn in (("gemm", gemms), ("collective", coll), ("both", both))
            }
            rows.append(
                {
                    "op": "all_reduce",
                    "group_size": self.world,
                    "bytes": nbytes,
                    "gemm_s": t["gemm"],
                    "collective_s": t["collective"],
                    "both_s": t["both"],
                }
            )
        return rows

    # ------------------------------------------------------------------------------ collectives
    def collectives(self) -> list[dict[str, Any]]:
        torch, dist = self.torch, self.dist
        rows: list[dict[str, Any]] = []
        if not dist.is_initialized() or self.world < 2:
            return rows
        W = self.world
        for g in [d for d in range(2, W + 1) if W % d == 0]:
            # Groups of g consecutive ranks (stride 1, like TP groups); every rank must create every group.
            groups = [dist.new_group(list(range(i, i + g))) for i in range(0, W, g)] if g < W else [None]
            grp = groups[self.rank // g]
            for nbytes in self.sweep["collective_bytes"]:
                n = max(nbytes // 4, g)
                n -= n % g
                full = torch.zeros(n, device=self.device)
                shard = torch.zeros(n // g, device=self.device)
                cases = {
                    "all_reduce": lambda full=full, grp=grp: dist.all_reduce(full, group=grp),
                    "all_gather": lambda full=full, shard=shard, grp=grp: dist.all_gather_into_tensor(
                        full, shard, group=grp
                    ),
                    "reduce_scatter": lambda full=full, shard=shard, grp=grp: dist.reduce_scatter_tensor(
                        shard, full, group=grp
                    ),
                    "all_to_all": lambda full=full, grp=grp: dist.all_to_all_single(
                        torch.empty_like(full), full, group=grp
                    ),
                }
                for op, fn in cases.items():
                    try:
                        t = self.across_ranks(self.time_local(fn, collective=True))
                    except (RuntimeError, NotImplementedError) as exc:  # e.g. an op the backend lacks
                        rows.append(
                            {"op": op, "group_size": g, "bytes": 4 * n, "error": str(exc).splitlines()[0]}
                        )
                        continue
                    rows.append({"op": op, "group_size": g, "bytes": 4 * n, "time_s": t})
            self._barrier()
        # send/recv between rank pairs (2i, 2i+1), all pairs at once: one-way time = round trip / 2.
        if W % 2 == 0:
            peer = self.rank + 1 if self.rank % 2 == 0 else self.rank - 1
            for nbytes in self.sweep["collective_bytes"]:
                buf = torch.zeros(max(nbytes // 4, 1), device=self.device)

                def pingpong(buf=buf):
                    if self.rank % 2 == 0:
                        dist.send(buf, peer)
                        dist.recv(buf, peer)
                    else:
                        dist.recv(buf, peer)
                        dist.send(buf, peer)

                t = self.across_ranks(self.time_local(pingpong, collective=True)) / 2.0
                rows.append({"op": "send_recv", "group_size": 2, "bytes": 4 * buf.numel(), "time_s": t})
        return rows


def host_info() -> dict[str, Any]:
    import numpy

    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - the workers always have torch
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def worker_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m autopar.calibration.microbench", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", required=True)
    p.add_argument("--sweep", choices=sorted(SWEEPS), default="full")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--skip", default="", help="comma-separated sections to skip")
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    code = 0
    try:
        import torch
        import torch.distributed as dist

        use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        if use_cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
        else:
            device = torch.device("cpu")
        if "WORLD_SIZE" in os.environ and not dist.is_initialized():
            dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        torch.manual_seed(0)
        bench = _Bench(device, SWEEPS[args.sweep])
        skip = {s for s in args.skip.split(",") if s}
        t0 = time.perf_counter()
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "sweep": args.sweep,
            "world_size": bench.world,
            "device": device.type,
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "threads_per_rank": torch.get_num_threads(),
            **host_info(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        for section in ("gemm", "attention", "elementwise", "dispatch", "collectives", "tp_layer", "overlap"):
            out[section] = [] if section in skip else getattr(bench, section)()
        out["elapsed_s"] = time.perf_counter() - t0
        if rank == 0:
            Path(args.out).write_text(json.dumps(out, indent=1))
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported to the launcher
        code = 1
        print(f"{ERROR_MARKER}{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return code


# ------------------------------------------------------------------------------------ launcher side
def run_microbenchmarks(
    world_size: int,
    *,
    sweep: str = "full",
    device: str = "auto",
    timeout_s: float = 600,
    skip: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Launch the microbenchmarks on ``world_size`` local ranks; return rank 0's result dict.

    Raises :class:`RunError` when the launch fails or times out (with the reason and the log tail).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise RunError(f"world_size={world_size!r} must be a positive integer", "pass --world-size >= 1")
    if sweep not in SWEEPS:
        raise RunError(f"unknown sweep {sweep!r}", f"use one of {', '.join(SWEEPS)}")
    with tempfile.TemporaryDirectory(prefix="autopar-mb-") as tmp:
        out = Path(tmp) / "mb.json"
        args = ["--out", str(out), "--sweep", sweep, "--device", device]
        if skip:
            args += ["--skip", ",".join(skip)]
        rc, log, timed_out = torchrun(
            "autopar.calibration.microbench", args, nproc=world_size, timeout_s=timeout_s
        )
        if timed_out:
            raise RunError(
                f"microbenchmarks timed out after {timeout_s:g} s", "raise --timeout or use --quick"
            )
        if rc != 0 or not out.exists():
            err = next(
                (ln.split(ERROR_MARKER, 1)[1] for ln in reversed(log.splitlines()) if ERROR_MARKER in ln),
                f"torchrun exited with status {rc}",
            )
            raise RunError(
                f"microbenchmarks failed: {err}", "see the log: " + log[-400:].replace("\n", " | ")
            )
        return json.loads(out.read_text())


if __name__ == "__main__":
    sys.exit(worker_main())
