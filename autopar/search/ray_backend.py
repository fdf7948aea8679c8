"""Ray scale-out: scoring chunks and whole sweep points as Ray tasks (``--ray`` / ``--ray ADDRESS``).

``connect("local")`` starts an embedded single-node Ray sized for this machine (no dashboard, a
small object store, usage stats off) that listens on the loopback interface only: its node IP is
127.0.0.1 (``_node_ip_address``; Ray would otherwise swap a loopback address for the machine's
reachable one, and its GCS, raylet and workers would listen on every interface). Any other value
is the address of an existing cluster, whose network exposure is the cluster's. Ray is an optional
extra (``pip install 'autopar[ray]'``) imported only here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from autopar.errors import AutoparError
from autopar.search.scoring import ScoringState, Summary, score_chunks

LOCAL = ("local", "True", "true", "1")
OBJECT_STORE_BYTES = 200 * 1024 * 1024
LOOPBACK = "127.0.0.1"
_started_here = False
_info: dict[str, Any] = {}


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
    if not (address is True or str(address) in LOCAL):
        _probe(str(address))  # before importing Ray: an unreachable address is refused at once
    ray = _ray()
    if ray.is_initialized():
        return False
    try:
        if address is True or str(address) in LOCAL:
            with _loopback_node(ray):
                ray.init(
                    num_cpus=local_cpus(),
                    include_dashboard=False,
                    object_store_memory=OBJECT_STORE_BYTES,
                    log_to_driver=False,
                    configure_logging=False,
                    _node_ip_address=LOOPBACK,
                )
            _info.clear()
            _info.update(mode="embedded", node_ip=_node_ip(ray), dashboard=False)
        elif _is_loopback_address(str(address)):  # an instance on this machine bound to 127.0.0.1
            with _loopback_node(ray):
                ray.init(
                    address=str(address),
                    log_to_driver=False,
                    configure_logging=False,
                    _node_ip_address=LOOPBACK,
                )
        else:
            ray.init(address=str(address), log_to_driver=False, configure_logging=False)
            _info.clear()
            _info.update(mode="cluster", address=str(address), node_ip=_node_ip(ray))
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise AutoparError(
            f"cannot start or reach Ray at {address!r}: {str(exc).splitlines()[0]}",
            "use --ray for a local instance or --ray HOST:PORT / ray://HOST:PORT",
        ) from None
    _started_here = True
    return True


def _probe(address: str) -> None:
    """Refuse a ``HOST:PORT`` or ``ray://HOST:PORT`` where nothing accepts a TCP connection within
    :data:`~autopar.limits.RAY_CONNECT_TIMEOUT_S` (``ray.init`` would retry for minutes: a hang).
    Other forms (``auto``) are left to Ray."""
    import socket

    from autopar.limits import RAY_CONNECT_TIMEOUT_S, terminal_safe

    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rstrip("/").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    host = host.strip("[]")
    hint = "start the cluster (ray start --head) or pass --ray for a local instance"
    if not 0 < int(port) < 65536:
        raise AutoparError(f"Ray address {terminal_safe(address)!r}: port {port} is out of range", hint)
    try:
        with socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise AutoparError(
            f"cannot reach Ray at {terminal_safe(address)!r}: {why} "
            f"(waited at most {RAY_CONNECT_TIMEOUT_S:g} s)",
            hint,
        ) from None


@contextlib.contextmanager
def _loopback_node(ray: Any) -> Iterator[None]:
    """Keep ``_node_ip_address="127.0.0.1"`` as given while the embedded instance starts.

    Ray replaces a loopback node address by the machine's reachable IP unless
    ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` is off (its single-machine mode on macOS and
    Windows; read when ``ray.init`` resolves the address). With it off, the GCS, the raylet and every
    worker bind 127.0.0.1.
    """
    try:
        from ray._private import ray_constants
    except ImportError:  # pragma: no cover - a Ray without it binds as it binds
        yield
        return
    old = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old


def _is_loopback_address(address: str) -> bool:
    """``127.0.0.1:6379`` or ``localhost:6379``: a cluster whose GCS is on loopback (a Ray Client
    ``ray://`` address needs no local raylet and is left alone).

    Its driver must say it is on 127.0.0.1 too, or Ray looks for a raylet on the machine's
    reachable address, where none listens, and the connection hangs.
    """
    import ipaddress

    if "://" in address:
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _node_ip(ray: Any) -> str | None:
    try:
        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - informational only
        return None


def describe() -> dict[str, Any]:
    """How Ray runs (recorded in --json): embedded on 127.0.0.1 without a dashboard, or a cluster."""
    return dict(_info) if _info else {"mode": "not started"}


def shutdown() -> None:
    global _started_here
    if _started_here:
        _ray().shutdown()
        _started_here = False


def cluster_cpus(address: Any = "local") -> int:
    """The CPUs of the Ray cluster at ``address`` (connecting to it first), at least 1."""
    ray = _ray()
    connect(address)
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


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
