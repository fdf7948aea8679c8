"""Launch reference runs: ``torchrun`` in a subprocess, with a timeout, returning the parsed result.

A run that crashes, hangs or is refused by the workers comes back as ``{"status": "failed", ...}``
with the error and the tail of its log; only bad arguments raise :class:`RunError`. Torch is not
imported here (the workers import it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autopar.errors import RunError
from autopar.layout import Layout
from autopar.runner.checks import check_layout
from autopar.runner.config import RunnerModelConfig

ERROR_MARKER = "autopar-runner-error: "  # printed by autopar.runner.train on failure
LOG_TAIL_CHARS = 4000


def _as_layout(layout: Layout | Mapping[str, Any]) -> Layout:
    if isinstance(layout, Layout):
        return layout
    try:
        return Layout(**dict(layout))
    except (TypeError, ValidationError) as exc:
        raise RunError(f"not a valid Layout: {exc}", "pass an autopar.layout.Layout") from exc


def _as_model(model: Any) -> RunnerModelConfig:
    if isinstance(model, RunnerModelConfig):
        return model
    if isinstance(model, Mapping):
        return RunnerModelConfig.from_json(model)
    return RunnerModelConfig.from_model_spec(model)


def run_layout(
    layout: Layout | Mapping[str, Any],
    model_cfg: Any,
    *,
    seq_len: int,
    global_batch: int,
    steps: int = 5,
    warmup: int = 2,
    timeout_s: float = 300,
    nproc: int | None = None,
    seed: int = 0,
    lr: float = 1e-3,
    device: str = "auto",
    dump_grads: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Train ``model_cfg`` under ``layout`` for ``steps`` steps on ``layout.num_devices`` local ranks.

    Returns rank 0's result (``status: "ok"``, step times, median step time, losses, peak memory per
    rank, ...; see :mod:`autopar.runner.train`) or ``{"status": "failed", "error", "log_tail", ...}``.
    ``model_cfg`` is a RunnerModelConfig, its dict, or a ModelSpec-like object.
    """
    lay = _as_layout(layout)
    return _launch(
        [lay],
        _as_model(model_cfg),
        single=True,
        seq_len=seq_len,
        global_batch=global_batch,
        steps=steps,
        warmup=warmup,
        timeout_s=timeout_s,
        nproc=nproc,
        seed=seed,
        lr=lr,
        device=device,
        dump_grads=dump_grads,
    )[0]


def run_layouts(
    layouts: Sequence[Layout | Mapping[str, Any]],
    model_cfg: Any,
    *,
    seq_len: int,
    global_batch: int,
    steps: int = 5,
    warmup: int = 2,
    timeout_s: float = 600,
    nproc: int | None = None,
    seed: int = 0,
    lr: float = 1e-3,
    device: str = "auto",
    dump_grads: str | os.PathLike | None = None,
    models: Sequence[Any | None] | None = None,
) -> list[dict[str, Any]]:
    """Run several layouts of the same ``num_devices`` one after another in one torchrun launch.

    ``models`` optionally gives a model per layout (``None`` = ``model_cfg``). Returns one result per
    layout, in order; if the launch itself fails every entry is the same failure. ``dump_grads``
    receives a list of first-step gradient dicts (rank 0's ``torch.save``).
    """
    lays = [_as_layout(lay) for lay in layouts]
    if not lays:
        raise RunError("no layouts to run", "pass at least one layout")
    base = _as_model(model_cfg)
    per_model = [base if m is None else _as_model(m) for m in (models or [None] * len(lays))]
    if len(per_model) != len(lays):
        raise RunError(f"{len(per_model)} models for {len(lays)} layouts", "pass one model per layout")
    return _launch(
        lays,
        base,
        single=False,
        seq_len=seq_len,
        global_batch=global_batch,
        steps=steps,
        warmup=warmup,
        timeout_s=timeout_s,
        nproc=nproc,
        seed=seed,
        lr=lr,
        device=device,
        dump_grads=dump_grads,
        models=per_model,
    )


def _launch(
    lays: list[Layout],
    cfg: RunnerModelConfig,
    *,
    single: bool,
    seq_len: int,
    global_batch: int,
    steps: int,
    warmup: int,
    timeout_s: float,
    nproc: int | None,
    seed: int,
    lr: float,
    device: str,
    dump_grads: str | os.PathLike | None,
    models: list[RunnerModelConfig] | None = None,
) -> list[dict[str, Any]]:
    models = models or [cfg] * len(lays)
    for name, v, lo in (
        ("seq_len", seq_len, 1),
        ("global_batch", global_batch, 1),
        ("steps", steps, 1),
        ("warmup", warmup, 0),
    ):
        if not isinstance(v, int) or v < lo:
            raise RunError(f"{name}={v!r} must be an integer >= {lo}", f"pass {name} >= {lo}")
    if steps <= warmup:
        raise RunError(
            f"steps={steps} must exceed warmup={warmup}", "the median needs at least one timed step"
        )
    if timeout_s is None or timeout_s <= 0:
        raise RunError(f"timeout_s={timeout_s!r} must be positive", "pass a timeout in seconds")
    if device not in ("auto", "cpu", "cuda"):
        raise RunError(f"device={device!r} is not one of auto, cpu, cuda", "pass device='cpu' or 'cuda'")
    world = {lay.num_devices for lay in lays}
    if len(world) != 1:
        raise RunError(
            f"layouts of one launch need the same num_devices, got {sorted(world)}",
            "group layouts by tp*pp*cp*dp",
        )
    n = world.pop()
    if nproc is not None and nproc != n:
        raise RunError(
            f"nproc={nproc} but the layout needs tp*pp*cp*dp = {n} ranks",
            "leave nproc out or pass the layout's num_devices",
        )
    for lay, m in zip(lays, models, strict=True):
        check_layout(lay, m, seq_len=seq_len, global_batch=global_batch)

    if single:
        layout_arg = lays[0].model_dump_json()
    else:
        layout_arg = json.dumps(
            [
                lay.model_dump()
                if m is cfg
                else {"layout": lay.model_dump(), "model": json.loads(m.to_json())}
                for lay, m in zip(lays, models, strict=True)
            ]
        )
    with tempfile.TemporaryDirectory(prefix="autopar-run-") as tmp:
        out = Path(tmp) / "result.json"
        args = [
            "--layout-json",
            layout_arg,
            "--model-json",
            cfg.to_json(),
            "--seq-len",
            str(seq_len),
            "--global-batch",
            str(global_batch),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--seed",
            str(seed),
            "--lr",
            repr(lr),
            "--device",
            device,
            "--out",
            str(out),
        ]
        if dump_grads is not None:
            args += ["--dump-grads", os.fspath(dump_grads)]
        t0 = time.perf_counter()
        rc, log, timed_out = torchrun("autopar.runner.train", args, nproc=n, timeout_s=timeout_s)
        wall = time.perf_counter() - t0
        payload: dict[str, Any] | None = None
        if out.exists():
            try:
                payload = json.loads(out.read_text())
            except json.JSONDecodeError:
                payload = None

    def failed(error: str) -> dict[str, Any]:
        return {
            "status": "failed",
            "error": error,
            "returncode": rc,
            "timed_out": timed_out,
            "wall_s": wall,
            "log_tail": log[-LOG_TAIL_CHARS:],
        }

    if timed_out:
        fail = failed(f"timed out after {timeout_s:g} s")
    elif rc != 0 or payload is None or payload.get("status") != "ok":
        fail = failed(_error_of(payload, log, rc))
    else:
        results = [payload] if single else list(payload["results"])
        for r in results:
            r["wall_s"] = wall
        return results
    return [dict(fail, layout=lay.model_dump(), layout_short=lay.short()) for lay in lays]


def _error_of(payload: dict[str, Any] | None, log: str, rc: int) -> str:
    if payload and payload.get("error"):
        return str(payload["error"])
    for line in reversed(log.splitlines()):
        if ERROR_MARKER in line:
            return line.split(ERROR_MARKER, 1)[1].strip()
    return f"torchrun exited with status {rc} and no result"


def torchrun(module: str, args: Sequence[str], *, nproc: int, timeout_s: float) -> tuple[int, str, bool]:
    """``python -m torch.distributed.run --standalone --nproc-per-node NPROC -m MODULE ARGS``.

    The one torchrun launcher of autopar (reference runs here, microbenchmarks in
    ``autopar.calibration.microbench``): its own session with one intra-op thread per process, the
    workers importing this very autopar, and on timeout the whole session stopped. Returns
    (returncode, log, timed_out).
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        module,
        *args,
    ]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # profiler "unknown block" notices on every free
    root = str(Path(__file__).resolve().parents[2])  # so the workers import this very autopar
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        log, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, log, False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        log, _ = proc.communicate()
        return proc.returncode, log or "", True


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop torchrun and its workers (the session this launcher started)."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
