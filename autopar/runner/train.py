"""Reference training run of one (or several) layouts; launched by torchrun, one process per rank.

    python -m torch.distributed.run --standalone --nproc-per-node N -m autopar.runner.train \\
        --layout-json '<Layout json>' --model-json '<RunnerModelConfig json>' --seq-len S \\
        --global-batch B --steps N --warmup W --seed 0 --out result.json [--dump-grads PATH]

``--layout-json`` may also be a JSON list of layouts with the same ``num_devices`` (an item may be
``{"layout": {...}, "model": {...}}`` to train another model): they run one after another in the
same process group (one launch, much cheaper than one per layout); ``--out`` then holds
``{"status": "ok", "results": [...]}`` and ``--dump-grads`` a list of gradient dicts.

Every layout trains the same model (same seed) on the same synthetic global batches, so losses and
gradients are comparable across layouts and with :func:`reference_run` (one process, no
parallelism). Rank 0 writes the result JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import traceback
import warnings
from typing import Any

import torch
import torch.distributed as dist

from autopar.errors import AutoparError, RunError
from autopar.layout import Layout
from autopar.runner.activation_checkpoint import clean_fqn
from autopar.runner.checks import check_device_support, check_layout, mesh_shape
from autopar.runner.config import RunnerModelConfig
from autopar.runner.data_parallel import set_gradient_sync
from autopar.runner.memory import cpu_step_peak, live_state_bytes, rss_peak_bytes
from autopar.runner.model import Transformer, lm_loss
from autopar.runner.parallel_dims import ParallelDims

ERROR_MARKER = "autopar-runner-error: "
ADAMW_BETAS, ADAMW_EPS, ADAMW_WEIGHT_DECAY = (0.9, 0.95), 1e-8, 0.1


# ---------------------------------------------------------------- data and reference


def synthetic_batch(vocab: int, seq_len: int, global_batch: int, step: int, seed: int) -> torch.Tensor:
    """Tokens (global_batch, seq_len + 1) of step ``step``: arithmetic sequences mod vocab with a
    random start and stride, so the loss visibly falls within a few steps. Identical on every rank
    and every layout; each data-parallel rank takes its rows."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(vocab, (global_batch, 1), generator=g)
    stride = torch.randint(1, 8, (global_batch, 1), generator=g)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """AdamW as torchtitan configures it (no gradient clipping, no LR schedule)."""
    return torch.optim.AdamW(params, lr=lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, weight_decay=ADAMW_WEIGHT_DECAY)


def reference_run(
    cfg: RunnerModelConfig, *, seq_len: int, global_batch: int, steps: int, seed: int = 0, lr: float = 1e-3
) -> dict[str, Any]:
    """The single-process ground truth: losses of ``steps`` AdamW steps on the whole global batch
    and the full gradients of the first step (fp32, no parallelism, no micro-batching)."""
    torch.manual_seed(seed)
    model = Transformer(cfg, seq_len)
    opt = make_optimizer(model.parameters(), lr)
    losses, grads = [], {}
    for step in range(steps):
        tokens = synthetic_batch(cfg.vocab, seq_len, global_batch, step, seed)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads}


# ---------------------------------------------------------------- one step


def forward_backward(pm, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """Run the ``grad_accum`` micro-batches of this rank. Returns (loss, 1) on ranks that see the
    loss (the last pipeline stage) and (0.0, 0) elsewhere."""
    layout = pm.layout
    if pm.schedule is not None:
        losses: list[torch.Tensor] = []
        with pm.autocast():
            if pm.has_first_stage:
                pm.schedule.step(inputs, target=labels, losses=losses)
            else:
                pm.schedule.step(target=labels, losses=losses)
        if pm.has_last_stage:
            return float(torch.stack([loss.detach().float() for loss in losses]).mean().item()), 1
        return 0.0, 0
    model, mb, ga = pm.parts[0], layout.micro_batch, layout.grad_accum
    total = torch.zeros((), device=inputs.device)
    for i in range(ga):
        if not pm.sync_each_microbatch:
            set_gradient_sync(model, i == ga - 1)
        with pm.autocast():
            logits = model(inputs[i * mb : (i + 1) * mb])
        loss = lm_loss(logits, labels[i * mb : (i + 1) * mb]) / ga
        loss.backward()
        total += loss.detach()
    return float(total.item()), 1


def train_step(
    pm, opt: torch.optim.Optimizer, inputs: torch.Tensor, labels: torch.Tensor, grads_out: dict | None = None
) -> tuple[float, int]:
    """One optimizer step; fills ``grads_out`` with the full gradients before the update."""
    res = forward_backward(pm, inputs, labels)
    if grads_out is not None:
        grads_out.update(gather_full_grads(pm))
    opt.step()
    return res


def gather_full_grads(pm) -> dict[str, torch.Tensor]:
    """Full (unsharded, fp32) gradients of this rank's parts, keyed by the unwrapped model's names.
    Collective over each part's mesh: every rank must call it."""
    out = {}
    for part in pm.parts:
        for name, p in part.named_parameters():
            g = p.grad
            if g is None:
                continue
            if hasattr(g, "full_tensor"):
                g = g.full_tensor()
            out[clean_fqn(name)] = g.detach().float().cpu().clone()
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- one layout


def run_one(
    layout: Layout,
    cfg: RunnerModelConfig,
    *,
    seq_len: int,
    global_batch: int,
    steps: int,
    warmup: int,
    seed: int,
    lr: float,
    device: torch.device,
    want_grads: bool,
) -> tuple[dict, dict]:
    from autopar.runner.parallelize import parallelize

    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    check_layout(layout, cfg, seq_len=seq_len, global_batch=global_batch)
    check_device_support(layout, device.type)
    if layout.num_devices != world:
        raise RunError(
            f"layout needs {layout.num_devices} ranks ({layout.short()}), the job has {world}",
            "launch with --nproc-per-node equal to tp*pp*cp*dp",
        )
    if steps <= warmup:
        raise RunError(f"steps={steps} must exceed warmup={warmup}", "raise --steps")

    dims = ParallelDims.from_layout(layout, rank)
    dims.build_mesh(device.type)
    torch.manual_seed(seed)
    if device.type == "cuda":  # built and initialised on the GPU: on one CPU thread a 1.2B model took 25-70 s
        with torch.device(device):
            full = Transformer(cfg, seq_len)
    else:  # the CPU build is the one reference_run() makes: same weights, comparable gradients
        full = Transformer(cfg, seq_len)
    pm = parallelize(full, layout, dims, device)
    del full
    opt = make_optimizer(pm.parameters(), lr)

    rows = layout.micro_batch * layout.grad_accum
    dp_rank = dims.dp_rank
    # CPU memory is probed on the last warm-up step (the profiler slows the step it watches); never
    # on step 0 when its gradients are gathered for --dump-grads, which would inflate the peak.
    probe_step = max(warmup - 1, 0)
    if want_grads and probe_step == 0 and steps > 1:
        probe_step = 1
    step_times: list[float] = []
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    peak_mem = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(steps):
        tokens = synthetic_batch(cfg.vocab, seq_len, global_batch, step, seed)
        tokens = tokens[dp_rank * rows : (dp_rank + 1) * rows].to(device)
        inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        opt.zero_grad(set_to_none=True)
        probe = step == probe_step and device.type == "cpu"
        if probe:
            base = live_state_bytes(pm.parts, opt)
        grads_out = grads if step == 0 and want_grads else None
        _barrier(device)
        t0 = time.perf_counter()
        if probe:
            (loss_sum, holds), during = cpu_step_peak(train_step, pm, opt, inputs, labels, grads_out)
            peak_mem = base + during
        else:
            loss_sum, holds = train_step(pm, opt, inputs, labels, grads_out)
        _sync(device)
        _barrier(device)
        step_times.append(time.perf_counter() - t0)
        losses.append(_global_loss(loss_sum, holds))
    if device.type == "cuda":
        peak_mem = int(torch.cuda.max_memory_allocated(device))

    per_rank = _all_gather_ints([peak_mem, rss_peak_bytes()])
    timed = step_times[warmup:]
    result = {
        "status": "ok",
        "layout": layout.model_dump(),
        "layout_short": layout.short(),
        "mesh": mesh_shape(layout),
        "model": json.loads(cfg.to_json()),
        "seq_len": seq_len,
        "global_batch": global_batch,
        "tokens_per_step": global_batch * seq_len,
        "steps": steps,
        "warmup": warmup,
        "seed": seed,
        "lr": lr,
        "world_size": world,
        "device": device.type,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "torch_version": torch.__version__,
        "step_times_s": step_times,
        "median_step_time_s": statistics.median(timed),
        "tokens_per_s": global_batch * seq_len / statistics.median(timed),
        "losses": losses,
        "peak_memory_bytes": [r[0] for r in per_rank],
        "peak_memory_method": (
            "torch.cuda.max_memory_allocated over all steps"
            if device.type == "cuda"
            else f"live state (params, buffers, optimizer state) + profiler allocator peak of "
            f"step {probe_step} (see autopar.runner.memory)"
        ),
        "rss_peak_bytes": [r[1] for r in per_rank],
    }
    if layout.offload and device.type == "cpu":
        result["note"] = "offload is a no-op on CPU (the optimizer state is already in host memory)"
    return result, (_gather_grads(grads, world) if want_grads else {})


def _barrier(device: torch.device) -> None:
    if dist.is_initialized():
        if device.type == "cuda":
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()


def _global_loss(loss_sum: float, holds: int) -> float:
    if not dist.is_initialized():
        return loss_sum
    t = torch.tensor([loss_sum * holds, float(holds)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0] / t[1])


def _all_gather_ints(values: list[int]) -> list[list[int]]:
    if not dist.is_initialized():
        return [values]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, values)
    return out


def _gather_grads(grads: dict[str, torch.Tensor], world: int) -> dict[str, torch.Tensor]:
    if not dist.is_initialized():
        return grads
    out: list[Any] = [None] * world
    dist.gather_object(grads, out if dist.get_rank() == 0 else None, dst=0)
    merged: dict[str, torch.Tensor] = {}
    if dist.get_rank() == 0:
        for d in out:
            for k, v in d.items():
                merged.setdefault(k, v)
    return merged


# ---------------------------------------------------------------- entry point


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m autopar.runner.train", description=__doc__.split("\n")[0])
    p.add_argument("--layout-json", required=True, help="a Layout as JSON, or a JSON list of them")
    p.add_argument("--model-json", required=True, help="a RunnerModelConfig as JSON")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=5, help="optimizer steps in total, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median step time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--out", required=True, help="result JSON written by rank 0")
    p.add_argument(
        "--dump-grads", default=None, help="torch.save the full first-step gradients here (rank 0)"
    )
    return p.parse_args(argv)


def _pick_device(choice: str, local_rank: int) -> torch.device:
    use_cuda = choice == "cuda" or (choice == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise RunError(
                "--device cuda but torch sees no GPU",
                "use --device cpu (`autopar validate --run-device cpu`)",
            )
        if local_rank >= torch.cuda.device_count():
            raise RunError(
                f"local rank {local_rank} but only {torch.cuda.device_count()} GPUs on this host",
                "use at most one rank per GPU (or --device cpu: `autopar validate --run-device cpu`)",
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    # The model never modifies a module output in place, which is what this FSDP2 warning is about;
    # full_tensor() of a 2-D (FSDP x TP) gradient warns that it takes two all-gathers.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    rank = int(os.environ.get("RANK", "0"))
    results: list[dict] = []
    grads: list[dict] = []
    single = True
    code = 0
    try:
        raw = json.loads(args.layout_json)
        single = not isinstance(raw, list)
        cfg = RunnerModelConfig.from_json(args.model_json)
        jobs = [_job(d, cfg) for d in ([raw] if single else raw)]
        device = _pick_device(args.device, int(os.environ.get("LOCAL_RANK", "0")))
        if "WORLD_SIZE" in os.environ and not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend)
        for layout, job_cfg in jobs:
            try:
                res, g = run_one(
                    layout,
                    job_cfg,
                    seq_len=args.seq_len,
                    global_batch=args.global_batch,
                    steps=args.steps,
                    warmup=args.warmup,
                    seed=args.seed,
                    lr=args.lr,
                    device=device,
                    want_grads=args.dump_grads is not None,
                )
            except Exception as exc:  # noqa: BLE001 - reported in the result, the launcher decides
                if single:
                    raise
                res, g = _failure(exc, layout), {}
                print(f"{ERROR_MARKER}{layout.short()}: {res['error']}", file=sys.stderr, flush=True)
            results.append(res)
            grads.append(g)
    except Exception as exc:  # noqa: BLE001
        code = 1
        fail = _failure(exc, None)
        results = [fail]
        print(f"{ERROR_MARKER}{fail['error']}", file=sys.stderr, flush=True)
        if not isinstance(exc, AutoparError):
            traceback.print_exc()
    if rank == 0:
        payload = results[0] if single else {"status": "ok", "results": results}
        with open(args.out, "w") as fh:
            json.dump(payload, fh, indent=1)
        if args.dump_grads and code == 0:
            torch.save(grads[0] if single else grads, args.dump_grads)
    grads.clear()
    _teardown(ok=code == 0)
    return code


def _teardown(*, ok: bool) -> None:
    """Shut the process group down in an order that cannot abort the process.

    The last layout's FSDP2 modules, optimizer and gloo async work can sit in reference cycles
    (hooks point back at their modules); left to the interpreter's shutdown they are destroyed after
    the process group, and gloo work freed then takes the GIL of a finalizing interpreter: "terminate
    called without an active exception", SIGABRT (the single-launch ZeRO-3 aborts of issue 12; in a
    batched launch the next layout's allocations collect the cycles first). So: collect now, while
    the group is alive; wait for every rank (no rank destroys the group while a peer still
    talks to it); then destroy the group. After a failure the group is left alone, as before: a peer
    may be blocked in a collective, and destroying under it can hang (torchtitan #1342); the exit
    status says the run failed either way.
    """
    import gc

    gc.collect()
    if not dist.is_initialized() or not ok:
        return
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()


def _job(item: dict[str, Any], cfg: RunnerModelConfig) -> tuple[Layout, RunnerModelConfig]:
    """A list item is a Layout dict, or ``{"layout": {...}, "model": {...}}`` to change the model."""
    if set(item) <= {"layout", "model"} and "layout" in item:
        model = RunnerModelConfig.from_json(item["model"]) if "model" in item else cfg
        return Layout(**item["layout"]), model
    return Layout(**item), cfg


def _failure(exc: BaseException, layout: Layout | None) -> dict[str, Any]:
    out: dict[str, Any] = {"status": "failed", "error": str(exc), "error_type": type(exc).__name__}
    if layout is not None:
        out["layout"] = layout.model_dump()
        out["layout_short"] = layout.short()
    return out


if __name__ == "__main__":
    sys.exit(main())
