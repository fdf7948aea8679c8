"""Peak memory of one training step per rank.

CUDA: ``torch.cuda.max_memory_allocated`` (the caching allocator's peak of live tensor bytes).

CPU has no allocator statistics, so the CPU equivalent of ``max_memory_allocated`` is assembled from
two exact parts:

* the bytes of the state that is live when a step starts: parameters (the local shard of DTensors),
  buffers and optimizer state, counted once per storage (grads are freed before the step starts);
* plus the peak of bytes allocated and not yet freed *during* the step, read from the CPU
  allocator's own running total, which ``torch.profiler`` (``profile_memory=True``) attaches to
  every allocation event (``total_allocated``). This covers activations, gradients, gathered FSDP
  parameters, communication buffers and temporaries made on the training thread; allocations made
  inside gloo's or other background threads are not seen.

RSS is deliberately not used: it includes the ~0.3-0.5 GB of the torch runtime, never shrinks,
and moves in allocator-page steps, so it cannot resolve the effect of a layout on a small model
(``rss_peak_bytes`` is still reported, for reference). The profiled step is slower, so the runner
probes the last warm-up step, whose time is not counted (step 1 when step 0's gradients are dumped;
with ``warmup=0`` the probed step is a timed one). Probe at step >= 1 for the steady state: on step
0 the AdamW state is only created at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def live_state_bytes(modules: Iterable[nn.Module], optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of parameters, buffers, grads and optimizer state, each storage counted once."""
    seen: dict[int, int] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            t = _local(t)
            if t.device.type == "meta" or t.numel() == 0:
                return
            st = t.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())

    for m in modules:
        for p in m.parameters():
            add(p)
            if p.grad is not None:
                add(p.grad)
        for b in m.buffers():
            add(b)
    if optimizer is not None:
        for state in optimizer.state.values():
            for v in state.values():
                add(v)
    return sum(seen.values())


def cpu_step_peak(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """Run ``fn(*args)`` under the profiler; return its result and the peak of bytes allocated (and
    not freed) during the call, from the CPU allocator's running total."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(*args)
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    allocs = []
    while stack:
        ev = stack.pop()
        if ev.tag == _EventType.Allocation and ev.extra_fields.device.type == "cpu":
            allocs.append((ev.start_time_ns, ev.extra_fields))
        stack.extend(ev.children)
    if not allocs:
        return out, 0
    allocs.sort(key=lambda a: a[0])
    first = allocs[0][1]
    start = first.total_allocated - first.alloc_size  # allocator total when the step began
    peak = max(f.total_allocated for _, f in allocs) - start
    return out, max(0, int(peak))


def rss_peak_bytes() -> int:
    import resource
    import sys

    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(ru if sys.platform == "darwin" else ru * 1024)
