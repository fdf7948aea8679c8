"""``autopar validate``: run layouts for real and compare them with their predictions.

Layouts come from ``autopar recommend --json`` output, an Optuna study made by ``autopar study``,
or a file (a JSON/YAML list of layouts, or ``{"job": {...}, "layouts": [...]}``). Each runs with
the reference runner (:mod:`autopar.runner`): several layouts of one world size per torchrun launch
(``run_layouts``, much cheaper than one launch each), with a timeout. A run that crashes, hangs or is
refused is recorded as ``failed`` with its error and the others still run: when a whole launch
fails (a hang or a crash takes the process group down), its layouts are retried one per launch so
that the failure is pinned on the layout that caused it.

Measured per layout: the median step time after the warm-up steps, the peak memory of every rank
(CUDA: ``torch.cuda.max_memory_allocated``; CPU: live state plus the training thread's allocator
peak, see :mod:`autopar.runner.memory`) and the losses. Compared with the prediction:
``predicted_step_time_s`` vs ``measured_step_time_s``, and ``predicted_peak_memory_gib`` (the engine's
per-device memory: its most loaded pipeline stage) vs ``measured_peak_memory_gib`` (the highest of
the ranks' peaks). The summary gives the step-time MAPE, Spearman's rank correlation, the top-1
regret (measured time of the predicted-fastest layout / fastest measured time) and the memory errors.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autopar.coefficients import Calibration
from autopar.engine import evaluate
from autopar.errors import AutoparError, RunError
from autopar.job import TrainingJob, flat_job_keys
from autopar.layout import COLUMNS, Layout, LayoutTable
from autopar.memory import GIB

LAYOUT_FIELDS = tuple(Layout.model_fields)
JOB_KEYS = ("model", "device", "num_devices", "devices_per_node", "seq_len", "global_batch")


@dataclass
class Item:
    """One layout to validate and where it came from."""

    layout: Layout
    source_prediction: dict[str, Any] = field(default_factory=dict)
    trial: int | None = None  # Optuna trial number, when the layout came from a study
    label: str = ""
    prediction: dict[str, float] = field(default_factory=dict)  # predicted_* fields, shown as runs finish
    derive_grad_accum: bool = False  # the source gave no grad_accum: derived from the global batch


@dataclass
class Source:
    items: list[Item]
    job: dict[str, Any]  # model, device, num_devices, ... as far as the source says
    kind: str  # "recommend", "study", "file"
    study: Any = None


# ------------------------------------------------------------------------------------- sources
# Keys a bare layout entry (a list item or an item of ``layouts:``) may carry besides the Layout fields.
ENTRY_EXTRAS = ("rank", "label", "step_time_s", "memory_gib_per_device")
# Top-level keys of the ``{job, layouts}`` form.
FILE_KEYS = ("schema_version", "job", "layouts")


def _layout_of(d: dict[str, Any], where: str, *, strict: bool) -> tuple[Layout, bool]:
    """The entry's Layout and whether its grad_accum is to be derived (the entry has none).

    ``strict``: a bare layout entry, whose unknown keys are refused (a typo would otherwise be
    dropped silently); a recommend/validate record keeps its extra keys, its ``layout`` is strict.
    """
    from pydantic import ValidationError

    from autopar.files import validation_message

    if "layout" in d and isinstance(d["layout"], dict):
        d, where = d["layout"], f"{where}.layout"
    elif strict:
        unknown = sorted(str(k) for k in d if k not in LAYOUT_FIELDS and k not in ENTRY_EXTRAS)
        if unknown:
            raise AutoparError(
                f"{where}: unknown key {unknown[0]!r}",
                f"allowed keys: {', '.join((*LAYOUT_FIELDS, *ENTRY_EXTRAS))}",
            )
        d = {k: v for k, v in d.items() if k in LAYOUT_FIELDS}
    else:  # a flat predict/recommend record: its other keys are the prediction and the job
        d = {k: v for k, v in d.items() if k in LAYOUT_FIELDS}
    if not any(k in d for k in LAYOUT_FIELDS):
        raise AutoparError(
            f"{where}: no layout fields ({', '.join(LAYOUT_FIELDS[:6])}, ...)",
            "give layouts as dicts of Layout fields",
        )
    try:
        return Layout.model_validate(d), "grad_accum" not in d
    except ValidationError as exc:
        raise AutoparError(validation_message(exc, where, Layout), "fix the layout fields") from None


def _read_structured(path: Path) -> Any:
    from autopar.files import load_structured

    return load_structured(path, "layouts file", "pass an existing --layouts FILE", default="json")


def derive_grad_accum(items: Sequence[Item], global_batch: int) -> None:
    """Give every item whose source had no ``grad_accum`` the one the global batch implies."""
    for it in items:
        if not it.derive_grad_accum:
            continue
        lay = it.layout
        per = lay.micro_batch * lay.dp
        if global_batch % per:
            raise AutoparError(
                f"layout {lay.short()}: global batch {global_batch} is not divisible by "
                f"micro_batch*dp = {lay.micro_batch}*{lay.dp}",
                "give grad_accum, or a micro_batch and dp whose product divides the global batch",
            )
        it.layout = lay.model_copy(update={"grad_accum": global_batch // per})
        it.derive_grad_accum = False


def flat_job(d: Any) -> dict[str, Any]:
    """A source's job as flat keywords: a :class:`~autopar.job.Job` dump (``cluster``/``workload``)
    is flattened; a flat (possibly partial) dict is kept as it is."""
    from pydantic import ValidationError

    from autopar.files import validation_message
    from autopar.job import Job

    if d is None:
        return {}
    if not isinstance(d, dict):
        raise AutoparError(
            f"the source's job is a {type(d).__name__}, not a mapping", "give job: {model: ..., ...}"
        )
    if "cluster" in d or "workload" in d:
        try:
            return {k: v for k, v in Job.model_validate(d).flat().items() if v is not None}
        except ValidationError as exc:
            raise AutoparError(validation_message(exc, "the source's job", Job), "fix the job") from None
    allowed = FLAT_JOB_KEYS
    unknown = sorted(str(k) for k in d if k not in allowed)
    if unknown:
        raise AutoparError(
            f"the source's job: unknown key {unknown[0]!r}", f"allowed keys: {', '.join(allowed)}"
        )
    for k in ("num_devices", "devices_per_node", "seq_len", "global_batch"):
        v = d.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise AutoparError(f"the source's job: {k} must be a positive integer, got {v!r}", f"fix job.{k}")
    for k in ("model", "device", "calibration"):
        v = d.get(k)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            raise AutoparError(f"the source's job: {k} must be a non-empty string, got {v!r}", f"fix job.{k}")
    return dict(d)


# The flat job keys a layouts file may carry: the core Job's own flat keywords (Job.flat).
FLAT_JOB_KEYS = flat_job_keys()


def load_layouts_file(path: str | Path) -> Source:
    """Layouts from ``recommend --json`` output, a list of layouts, ``{"job", "layouts"}``, or a
    previous ``validate --json`` / ``cpu_validation --json`` output (its ``records``)."""
    p = Path(path)
    raw = _read_structured(p)
    job: dict[str, Any] = {}
    kind = "file"
    strict = True
    if raw is None:
        raise AutoparError(f"layouts file {p} is empty", "give a list of layouts or recommend --json output")
    if isinstance(raw, dict) and isinstance(raw.get("results"), list):  # recommend --json
        strict = False
        kind = "recommend"
        entries = raw["results"]
        first = entries[0] if entries else {}
        job = flat_job(raw.get("job") or first.get("job") or {k: first[k] for k in JOB_KEYS if k in first})
    elif isinstance(raw, dict) and isinstance(raw.get("layouts"), list):
        unknown = sorted(str(k) for k in raw if k not in FILE_KEYS)
        if unknown:
            raise AutoparError(
                f"layouts file {p}: unknown top-level key {unknown[0]!r}",
                f"allowed keys: {', '.join(FILE_KEYS)}",
            )
        entries = raw["layouts"]
        job = flat_job(raw.get("job"))
    elif isinstance(raw, dict) and isinstance(raw.get("records"), list):
        strict = False
        entries = raw["records"]
        job = flat_job(raw.get("job"))
    elif isinstance(raw, list):
        entries = raw
    else:
        raise AutoparError(
            f"layouts file {p}: expected a list of layouts, recommend --json output or {{job, layouts}}",
            "see `autopar validate --help`",
        )
    items = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise AutoparError(f"{p}: entry {i} is not a mapping", "give each layout as a dict")
        pred = {}
        if "step_time_s" in e:
            pred["step_time_s"] = e["step_time_s"]
        if "memory_gib_per_device" in e:
            pred["memory_gib_per_device"] = e["memory_gib_per_device"]
        lay, derive = _layout_of(e, f"layouts file {p}: entry {i}", strict=strict)
        items.append(Item(lay, pred, label=str(e.get("rank", i + 1)), derive_grad_accum=derive))
    if not items:
        raise AutoparError(f"layouts file {p} holds no layouts", "give at least one layout")
    return Source(items, job, kind)


def load_study_layouts(name: str, storage: Any = None, *, top: int = 5) -> Source:
    """The ``top`` best feasible trials of an ``autopar study`` (its job is recorded on the study)."""
    import optuna

    from autopar.search.study import resolve_storage

    st = (
        resolve_storage(storage, must_exist=True)
        if storage is None or isinstance(storage, str | Path)
        else storage
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=name, storage=st)
    except KeyError:
        raise AutoparError(
            f"no study named {name!r} in {storage or 'the default storage'}",
            "list studies with `autopar study list`",
        ) from None
    done = [t for t in study.trials if t.state.name == "COMPLETE" and t.user_attrs.get("fits", True)]
    if not done:
        raise AutoparError(f"study {name!r} has no complete feasible trials", "run the study first")

    def key(t: Any) -> float:
        r = t.user_attrs.get("result") or {}
        if "step_time_s" in r:
            return float(r["step_time_s"])
        v = t.values[0] if t.values else math.inf
        return -v if study.directions[0].name == "MAXIMIZE" else v

    seen: set[str] = set()
    items: list[Item] = []
    for t in sorted(done, key=key):
        raw = t.user_attrs.get("key")
        if not raw:
            continue
        d = json.loads(raw)
        if "stage_layers" in d:
            items.append(
                Item(
                    Layout(**{k: d[k] for k in LAYOUT_FIELDS if k in d}),
                    trial=t.number,
                    label="uneven",
                    source_prediction={"uneven_stages": d["stage_layers"]},
                )
            )
        else:
            lay = Layout(**{k: d[k] for k in LAYOUT_FIELDS if k in d})
            if lay.model_dump_json() in seen:
                continue
            seen.add(lay.model_dump_json())
            r = t.user_attrs.get("result") or {}
            items.append(
                Item(
                    lay, {k: r[k] for k in ("step_time_s", "memory_gib_per_device") if k in r}, trial=t.number
                )
            )
        if len(items) >= top:
            break
    job = flat_job(study.user_attrs.get("job"))
    cal = study.user_attrs.get("calibration")
    if cal and cal != "default":
        job["calibration"] = cal
    return Source(items, job, "study", study)


# ------------------------------------------------------------------------------------- running
def runner_model_for(spec: Any):
    from autopar.runner.config import RunnerModelConfig

    return RunnerModelConfig.from_model_spec(spec)


def predict_items(job: TrainingJob, layouts: Sequence[Layout], cal: Calibration) -> dict[str, np.ndarray]:
    table = LayoutTable.from_layouts(list(layouts))
    return evaluate(job, table, calibration=cal, check_legal=False)


class Progress:
    """One line per finished layout on stderr; a ticking line while a launch runs (on a terminal)."""

    def __init__(
        self,
        total: int,
        enabled: bool = True,
        stream: Any = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """``on_record(rec)`` is called as each layout's record is final (``validate --json`` saves it)."""
        self.total, self.enabled, self.done = total, enabled, 0
        self.on_record = on_record
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()

    def start_launch(self, what: str) -> None:
        self._write(f"validate: {what}\n")
        if self.enabled and getattr(self.stream, "isatty", lambda: False)():
            self._stop.clear()
            t_start = time.perf_counter()

            def tick() -> None:
                while not self._stop.wait(1.0):
                    self._write(f"\r  running ... {time.perf_counter() - t_start:5.0f} s")

            self._thread = threading.Thread(target=tick, daemon=True)
            self._thread.start()

    def end_launch(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._write("\r" + " " * 40 + "\r")

    def record(self, rec: dict[str, Any]) -> None:
        self.done += 1
        if self.on_record is not None:
            self.on_record(rec)
        if rec["status"] == "ok":
            pt, mt = rec.get("predicted_step_time_s"), rec["measured_step_time_s"]
            err = f" ({100 * (pt / mt - 1):+.0f}%)" if pt else ""
            pm, mm = rec.get("predicted_peak_memory_gib"), rec.get("measured_peak_memory_gib")
            mem = f"  mem {mm * 1024:.1f} MiB vs {pm * 1024:.1f}" if pm and mm else ""
            msg = f"ok  {mt:.3f} s vs predicted {pt:.3f} s{err}{mem}" if pt else f"ok  {mt:.3f} s"
        else:
            msg = f"FAILED: {rec.get('error', '')[:120]}"
        self._write(
            f"  [{self.done:>3}/{self.total}] {rec['layout_short']:<40} {msg}"
            f"  ({time.perf_counter() - self.t0:.0f} s)\n"
        )


def _record(item: Item, result: dict[str, Any]) -> dict[str, Any]:
    lay = item.layout
    rec: dict[str, Any] = {
        "layout": lay.model_dump(),
        "layout_short": lay.short(),
        "status": result.get("status"),
    }
    rec.update(item.prediction)
    if item.trial is not None:
        rec["trial"] = item.trial
    if item.source_prediction:
        rec["source_prediction"] = item.source_prediction
    if result.get("status") == "ok":
        peaks = [int(x) for x in result.get("peak_memory_bytes", [])]
        rec.update(
            measured_step_time_s=float(result["median_step_time_s"]),
            step_times_s=[float(x) for x in result.get("step_times_s", [])],
            measured_peak_memory_gib=(max(peaks) / GIB) if peaks and max(peaks) > 0 else None,
            measured_peak_memory_gib_per_rank=[x / GIB for x in peaks],
            peak_memory_method=result.get("peak_memory_method"),
            losses=result.get("losses"),
            final_loss=(result.get("losses") or [None])[-1],
            backend=result.get("backend"),
            device=result.get("device"),
        )
    else:
        rec["error"] = str(result.get("error", "unknown error"))
        for k in ("timed_out", "returncode", "log_tail"):
            if k in result:
                rec[k] = result[k]
    return rec


RunFn = Callable[..., list[dict[str, Any]]]


def resolve_run_device(choice: str, *, n_gpus: int | None = None) -> tuple[str, int]:
    """``(device, GPUs)`` the runs will use for ``--run-device choice``; refuses ``cuda`` without a GPU."""
    from autopar.runner.resources import cuda_device_count

    if choice == "cpu":
        return "cpu", 0
    n = cuda_device_count() if n_gpus is None else n_gpus
    if choice == "cuda" and n == 0:
        raise RunError(
            "--run-device cuda, but torch sees no CUDA GPU on this machine",
            "pass --run-device cpu, or auto (which picks the CPU here)",
        )
    return ("cuda", n) if n else ("cpu", 0)


def preflight(
    items: Sequence[Item],
    runner_model: Any,
    *,
    seq_len: int,
    global_batch: int,
    device: str,
    n_gpus: int = 0,
    host_available: int | None = None,
    gpu_free: Sequence[int] | None = None,
) -> dict[int, str]:
    """Why each item cannot run on this machine (index -> reason), found before anything is launched.

    The runner's own rules (:func:`autopar.runner.check_layout`; even pipeline splits only), what
    ``device`` supports (:func:`autopar.runner.checks.check_device_support`: no context parallelism,
    no fp8/fp16), one rank per GPU, and memory: every rank's predicted peak (the item's
    ``predicted_peak_memory_gib``) plus the torch runtime must fit in the free memory of its GPU
    (``gpu_free``), or, on the CPU, all ranks together in the host's free memory (``host_available``,
    default :func:`autopar.runner.resources.host_memory`, capped by the cgroup limit).
    """
    from autopar.runner import check_layout
    from autopar.runner.checks import check_device_support
    from autopar.runner.resources import GIB, RUNTIME_BYTES_PER_RANK, host_memory

    source = "free"
    if device == "cpu" and host_available is None:
        hm = host_memory()
        host_available, source = hm.available, f"free ({hm.source})"
    reasons: dict[int, str] = {}
    for i, it in enumerate(items):
        lay = it.layout
        if it.label == "uneven":
            reasons[i] = "uneven pipeline splits are not supported by the reference runner (even splits only)"
            continue
        try:
            check_layout(lay, runner_model, seq_len=seq_len, global_batch=global_batch)
            check_device_support(lay, device)
        except RunError as exc:
            reasons[i] = str(exc)
            continue
        world = lay.num_devices
        if device == "cuda" and world > n_gpus:
            reasons[i] = (
                f"it needs {world} ranks, one per GPU, and this machine has {n_gpus} GPU(s) "
                "(validate a smaller world size, or pass --run-device cpu)"
            )
            continue
        pred = it.prediction.get("predicted_peak_memory_gib")
        if pred is None:
            continue
        per_rank = float(pred) * GIB + RUNTIME_BYTES_PER_RANK
        if device == "cpu" and host_available is not None and world * per_rank > host_available:
            reasons[i] = (
                f"its {world} rank(s) need about {world} x ({float(pred):.1f} GiB predicted peak + "
                f"{RUNTIME_BYTES_PER_RANK / GIB:.1f} GiB torch runtime) = {world * per_rank / GIB:.1f} GiB of host "
                f"memory; {host_available / GIB:.1f} GiB is {source} on this machine "
                "(validate a smaller model or layout: --model, --layouts)"
            )
        elif device == "cuda" and gpu_free is not None:
            short = [g for g in range(min(world, len(gpu_free))) if per_rank > gpu_free[g]]
            if short:
                g = short[0]
                reasons[i] = (
                    f"a rank needs about {float(pred):.1f} GiB predicted peak + "
                    f"{RUNTIME_BYTES_PER_RANK / GIB:.1f} GiB CUDA context and GPU {g} has "
                    f"{gpu_free[g] / GIB:.1f} GiB free (validate a smaller model or layout: --model, --layouts)"
                )
    return reasons


def run_items(
    items: Sequence[Item],
    runner_model: Any,
    *,
    seq_len: int,
    global_batch: int,
    steps: int = 7,
    warmup: int = 2,
    timeout_s: float = 300,
    batch_size: int = 6,
    device: str = "auto",
    progress: Progress | None = None,
    run_batch: RunFn | None = None,
    run_single: Callable[..., dict[str, Any]] | None = None,
    refused: dict[int, str] | None = None,
) -> list[dict[str, Any]]:
    """Run every item (grouped by world size, ``batch_size`` per launch); one record per item, in order.

    ``timeout_s`` is per layout (a launch of k layouts gets k times it). Layouts the runner refuses
    (:func:`autopar.runner.check_layout`), uneven pipeline splits and the items in ``refused``
    (index -> reason, see :func:`preflight`) are failed without a launch.
    """
    from autopar.runner import check_layout
    from autopar.runner.launch import run_layout, run_layouts

    run_batch = run_batch or run_layouts
    run_single = run_single or run_layout
    if batch_size < 1:
        raise AutoparError(f"batch_size={batch_size} must be >= 1", "pass --batch-size >= 1")
    progress = progress or Progress(len(items), enabled=False)
    records: list[dict[str, Any] | None] = [None] * len(items)
    runnable: list[int] = []
    for i, it in enumerate(items):
        err = None
        if refused and i in refused:
            err = f"refused before launch: {refused[i]}"
        elif it.label == "uneven":
            err = "uneven pipeline splits are not supported by the reference runner (even splits only)"
        else:
            try:
                check_layout(it.layout, runner_model, seq_len=seq_len, global_batch=global_batch)
            except RunError as exc:
                err = f"refused by the runner: {exc}"
        if err is not None:
            rec = _record(it, {"status": "failed", "error": err})
            records[i] = rec
            progress.record(rec)
        else:
            runnable.append(i)
    by_world: dict[int, list[int]] = {}
    for i in runnable:
        by_world.setdefault(items[i].layout.num_devices, []).append(i)
    batches = [
        idx[k : k + batch_size] for _, idx in sorted(by_world.items()) for k in range(0, len(idx), batch_size)
    ]
    common: dict[str, Any] = dict(
        seq_len=seq_len, global_batch=global_batch, steps=steps, warmup=warmup, device=device
    )
    for b, idx in enumerate(batches):
        lays = [items[i].layout for i in idx]
        progress.start_launch(
            f"launch {b + 1}/{len(batches)}: {len(idx)} layout(s) on {lays[0].num_devices} ranks"
        )
        try:
            results = run_batch(
                lays, runner_model, timeout_s=timeout_s * len(idx) + min(30.0, timeout_s), **common
            )
        finally:
            progress.end_launch()
        launch_failed = len(idx) > 1 and all(r.get("status") != "ok" and "returncode" in r for r in results)
        if launch_failed:  # a hang or crash took the launch down: find the culprit, run the rest
            progress.start_launch(
                f"launch {b + 1} failed ({results[0].get('error', '')[:80]}); "
                "retrying its layouts one per launch"
            )
            progress.end_launch()
            results = []
            for i in idx:
                progress.start_launch(f"  retry {items[i].layout.short()}")
                try:
                    results.append(run_single(items[i].layout, runner_model, timeout_s=timeout_s, **common))
                finally:
                    progress.end_launch()
        for i, r in zip(idx, results, strict=True):
            rec = _record(items[i], r)
            records[i] = rec
            progress.record(rec)
    return [r for r in records if r is not None]


# ------------------------------------------------------------------------------------- comparing
def attach_predictions(
    records: list[dict[str, Any]], job: TrainingJob, cal: Calibration, prefix: str = "predicted"
) -> None:
    """Add ``<prefix>_step_time_s`` and ``<prefix>_peak_memory_gib`` to every record."""
    if not records:
        return
    res = predict_items(job, [Layout(**r["layout"]) for r in records], cal)
    for i, r in enumerate(records):
        r[f"{prefix}_step_time_s"] = float(res["step_time_s"][i])
        r[f"{prefix}_peak_memory_gib"] = float(res["memory_bytes"][i]) / GIB


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(a) < 2:
        return float("nan")
    return float(spearmanr(a, b)[0])


def summarize(records: Sequence[dict[str, Any]], prefix: str = "predicted") -> dict[str, Any]:
    """MAPE, Spearman, top-1 regret and memory errors over the successful records."""
    ok = [r for r in records if r.get("status") == "ok" and r.get(f"{prefix}_step_time_s") is not None]
    out: dict[str, Any] = {"n": len(records), "n_ok": len(ok), "n_failed": len(records) - len(ok)}
    if not ok:
        return out
    p = np.array([r[f"{prefix}_step_time_s"] for r in ok])
    m = np.array([r["measured_step_time_s"] for r in ok])
    out["step_time_mape"] = float(np.mean(np.abs(p / m - 1.0)))
    out["step_time_median_ape"] = float(np.median(np.abs(p / m - 1.0)))
    out["spearman"] = spearman(p, m)
    best_pred = int(np.argmin(p))
    out["top1_regret"] = float(m[best_pred] / m.min())
    out["predicted_best"] = ok[best_pred]["layout_short"]
    out["measured_best"] = ok[int(np.argmin(m))]["layout_short"]
    mem = [
        (r[f"{prefix}_peak_memory_gib"], r["measured_peak_memory_gib"])
        for r in ok
        if r.get("measured_peak_memory_gib") and r.get(f"{prefix}_peak_memory_gib") is not None
    ]
    if mem:
        e = np.array([pp / mm - 1.0 for pp, mm in mem])
        out["memory_mape"] = float(np.mean(np.abs(e)))
        out["memory_max_abs_error"] = float(np.max(np.abs(e)))
        out["memory_within_20pct"] = float(np.mean(np.abs(e) <= 0.2))
        out["memory_n"] = len(mem)
    return out


def format_summary(s: dict[str, Any], title: str = "") -> str:
    if not s.get("n_ok"):
        return f"{title}: no successful runs ({s.get('n_failed', 0)} failed)"
    parts = [
        f"MAPE {100 * s['step_time_mape']:.1f}%",
        f"Spearman {s['spearman']:.3f}",
        f"top-1 regret {s['top1_regret']:.3f}",
    ]
    if "memory_mape" in s:
        parts.append(
            f"memory MAPE {100 * s['memory_mape']:.1f}% (max {100 * s['memory_max_abs_error']:.1f}%, "
            f"{100 * s['memory_within_20pct']:.0f}% within 20%)"
        )
    fails = f", {s['n_failed']} failed" if s["n_failed"] else ""
    return f"{title}{': ' if title else ''}{', '.join(parts)}  [{s['n_ok']} runs{fails}]"


# ------------------------------------------------------------------------------------- studies
def attach_to_study(study: Any, records: Sequence[dict[str, Any]], summary: dict[str, Any]) -> int:
    """Record the measurements on the study; returns how many trials got them.

    A trial that is still running gets user attrs ``measured_step_time_s``, ``measured_peak_memory_gib``,
    ``validation_status`` (Optuna refuses to change finished trials); every measurement is also
    stored on the study as user attr ``validation.trial_<number>`` (and the summary as
    ``validation.summary``), which :func:`study_measurements` reads back.
    """
    n = 0
    for r in records:
        if r.get("trial") is None:
            continue
        compact = {
            k: r.get(k)
            for k in (
                "status",
                "layout_short",
                "measured_step_time_s",
                "measured_peak_memory_gib",
                "predicted_step_time_s",
                "predicted_peak_memory_gib",
                "final_loss",
                "error",
            )
            if r.get(k) is not None
        }
        compact["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        study.set_user_attr(f"validation.trial_{r['trial']}", compact)
        trial = next((t for t in study.get_trials(deepcopy=False) if t.number == r["trial"]), None)
        if trial is not None and not trial.state.is_finished():
            for k in ("measured_step_time_s", "measured_peak_memory_gib"):
                if k in compact:
                    study._storage.set_trial_user_attr(trial._trial_id, k, compact[k])
            study._storage.set_trial_user_attr(trial._trial_id, "validation_status", compact["status"])
        n += 1
    study.set_user_attr(
        "validation.summary", {k: v for k, v in summary.items() if isinstance(v, int | float | str)}
    )
    return n


def study_measurements(study: Any) -> dict[int, dict[str, Any]]:
    """Trial number -> the measurement :func:`attach_to_study` stored."""
    out = {}
    for k, v in study.user_attrs.items():
        if k.startswith("validation.trial_"):
            out[int(k.rsplit("_", 1)[1])] = v
    return out


# ------------------------------------------------------------------------------------- refit
def refit_groups(records: Sequence[dict[str, Any]], job: TrainingJob) -> tuple[list, list]:
    ok = [r for r in records if r.get("status") == "ok"]
    if not ok:
        return [], []
    table = LayoutTable.from_layouts([Layout(**r["layout"]) for r in ok])
    times = np.array([r["measured_step_time_s"] for r in ok])
    time_groups = [(job, table, times)]
    mem_ok = [i for i, r in enumerate(ok) if r.get("measured_peak_memory_gib")]
    mem_groups = []
    if mem_ok:
        mem_groups = [
            (
                job,
                table.take(np.array(mem_ok)),
                np.array([ok[i]["measured_peak_memory_gib"] * GIB for i in mem_ok]),
            )
        ]
    return time_groups, mem_groups


def refit_calibration(
    records: Sequence[dict[str, Any]],
    job: TrainingJob,
    base: Calibration,
    *,
    params: Sequence[str] | None = None,
    memory: bool = True,
    provenance: dict[str, Any] | None = None,
) -> tuple[Calibration, dict[str, Any]]:
    """A calibration refitted to the successful records (time, then memory constants)."""
    from autopar.calibration.calibrate import DEFAULT_TIME_PARAMS, refit_memory, refit_time

    tg, mg = refit_groups(records, job)
    if not tg:
        raise AutoparError("no successful runs to refit to", "fix the failed runs or validate other layouts")
    precs = sorted({r["layout"]["precision"] for r in records if r.get("status") == "ok"})
    precs = ["bf16" if p == "fp16" else p for p in precs]
    if params is None:  # no more coefficients than half the runs
        params = DEFAULT_TIME_PARAMS[: max(1, len(tg[0][2]) // 2)]
    rt = refit_time(tg, base, params=tuple(params), precisions=sorted(set(precs)), provenance=provenance)
    info = rt.summary()
    cal = rt.calibration
    if memory and mg:
        cal, info["memory"] = refit_memory(mg, cal)
    prov = dict(cal.provenance)
    prov["refit"] = {
        "runs": len(tg[0][2]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "time_residuals": info["time_after"],
        "memory": info.get("memory", {}).get("after"),
    }
    return cal.model_copy(update={"provenance": prov}), info


__all__ = [
    "Item",
    "Source",
    "load_layouts_file",
    "load_study_layouts",
    "run_items",
    "attach_predictions",
    "summarize",
    "format_summary",
    "attach_to_study",
    "study_measurements",
    "refit_calibration",
    "Progress",
    "COLUMNS",
]
