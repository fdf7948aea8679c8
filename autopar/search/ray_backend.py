"""Ray scale-out: scoring chunks and whole sweep points as Ray tasks (``--ray`` / ``--ray ADDRESS``).

``connect("local")`` starts an embedded single-node Ray sized for this machine (no dashboard, a
small object store, usage stats off); any other value is the address of an existing cluster. Ray
is an optional extra (``pip install 'autopar[ray]'``) imported only here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from autopar.errors import AutoparError
from autopar.search.scoring import ScoringState, Summary, score_chunks

LOCAL = ("local", "True", "true", "1")
OBJECT_STORE_BYTES = 200 * 1024 * 1024
_started_here = False


def _ray() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        import ray
    except ImportError:
        raise AutoparError("--ray needs Ray, which is not installed", "pip install 'autopar[ray]'") from None
    return ray


def local_cpus() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, n)


def connect(address: Any = "local") -> bool:
    """Make sure Ray is initialized; returns True when this call started it (then :func:`shutdown`)."""
    global _started_here
    ray = _ray()
    if ray.is_initialized():
        return False
    try:
        if address is True or str(address) in LOCAL:
            ray.init(
                num_cpus=local_cpus(),
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                log_to_driver=False,
                configure_logging=False,
            )
        else:
            ray.init(address=str(address), log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise AutoparError(
            f"cannot start or reach Ray at {address!r}: {str(exc).splitlines()[0]}",
            "use --ray for a local instance or --ray HOST:PORT / ray://HOST:PORT",
        ) from None
    _started_here = True
    return True


def shutdown() -> None:
    global _started_here
    if _started_here:
        _ray().shutdown()
        _started_here = False


def _remote(fn: Callable[..., Any]) -> Any:
    ray = _ray()
    return ray.remote(num_cpus=1, max_retries=1)(fn)


def _score_batch(state: ScoringState, batch: list[tuple[int, int, int]]) -> Summary:
    return score_chunks(state, batch)


def score_batches(
    state: ScoringState,
    batches: Sequence[list[tuple[int, int, int]]],
    *,
    address: Any = "local",
    on_done: Callable[[int], None] | None = None,
) -> list[Summary]:
    """Score each batch of chunks as one Ray task; results in batch order (merge is order-independent)."""
    ray = _ray()
    connect(address)
    ref = ray.put(state)
    task = _remote(_score_batch)
    futures = [task.remote(ref, b) for b in batches]
    sizes = {
        f: sum(int(state.enum.vmask[s0:s1].sum()) for _, s0, s1 in b) * len(state.enum.recompute)
        for f, b in zip(futures, batches, strict=True)
    }
    pending = list(futures)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        if on_done is not None:
            on_done(sizes[done[0]])
    return ray.get(futures)


def map_tasks(
    fn: Callable[..., Any],
    items: Sequence[Any],
    *,
    address: Any = "local",
    on_done: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """Run ``fn(item)`` for each item as a Ray task; results in item order."""
    ray = _ray()
    connect(address)
    task = _remote(fn)
    futures = [task.remote(x) for x in items]
    index = {f: i for i, f in enumerate(futures)}
    pending = list(futures)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        if on_done is not None:
            on_done(index[done[0]], None)
    return ray.get(futures)
