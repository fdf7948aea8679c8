"""``autopar.recommend``: score every legal layout of a search space and return the best ones.

Enumeration (``autopar.search.enumerate``) yields the legal layouts as a broadcast grid; the engine's own
``evaluate`` scores it in chunks (in-process, over a process pool, or as Ray tasks; the chunking and
the merge are the same, so the answer is too); each chunk keeps only its top-k, its Pareto front and
its closest misses. The returned layouts are then re-predicted one by one exactly as ``predict``
does, so ``predict`` of a returned layout reproduces its numbers bit for bit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.coefficients import Calibration, load_calibration
from autopar.engine import evaluate
from autopar.errors import AutoparError, InfeasibleError
from autopar.job import SCHEMA_VERSION, Job, TrainingJob
from autopar.layout import Layout, LayoutTable
from autopar.objectives import DEFAULT_PRICE_PER_DEVICE_HOUR, GIB, OBJECTIVES, Objectives, pareto_mask
from autopar.prediction import Prediction, also_text, collapse_equivalent, prediction_from_row, training_job
from autopar.search.enumerate import STAGE_RULES, Enumeration, enumerate_space, rule_message
from autopar.search.ray_backend import score_batches
from autopar.search.scoring import (
    ScoringState,
    Summary,
    merge,
    score_chunk,
    score_chunks,
    score_ids,
)
from autopar.search.space import SearchSpace, load_space, restrict_axes

TARGET_CELLS = 100_000  # grid cells per engine call (fits the caches; see studies/search_speed.py)
POOL_MIN_LAYOUTS = 1_500_000
DUPLICATE_FETCH = 4  # layouts kept per returned one, room for collapsing near-duplicates...
DUPLICATE_EXTRA_MAX = 200  # ...but at most this many extra (each is re-predicted one by one)  # below this a process pool costs more than it saves on 2 cores
LAUNCH_EXTRA = 50  # best layouts kept beyond those, in case the launcher refuses some (search_layouts)


# ---------------------------------------------------------------------------------- executors
_POOL_STATE: ScoringState | None = None


def _pool_task(chunks: list[tuple[int, int, int]]) -> Summary:
    assert _POOL_STATE is not None
    return score_chunks(_POOL_STATE, chunks)


def _batches(chunks: list[tuple[int, int, int]], n: int) -> list[list[tuple[int, int, int]]]:
    """Split chunks into n contiguous batches (contiguous keeps every path's merge order the same)."""
    n = max(1, min(n, len(chunks)))
    edges = np.linspace(0, len(chunks), n + 1).astype(int)
    return [chunks[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


class _Progress:
    """A rich progress bar on stderr that appears only once the work has taken over ~1 s."""

    def __init__(self, total: int, enabled: bool, label: str) -> None:
        from autopar import progress

        self.total, self.enabled, self.label = total, enabled and progress.enabled(), label
        self.t0 = time.perf_counter()
        self.done = 0
        self.bar: Any = None
        self.task: Any = None

    def advance(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.bar is None and time.perf_counter() - self.t0 > 1.0 and self.done < self.total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn(self.label),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total)
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_scoring(
    state: ScoringState, *, workers: int | None = None, ray: Any = None, progress: bool = False
) -> tuple[Summary, str, int]:
    """Score every chunk of ``state.enum``; returns (summary, backend, workers used)."""
    chunks = state.enum.chunks(TARGET_CELLS)
    pareto = len(state.objectives.names) > 1
    bar = _Progress(state.enum.size, progress, "scoring layouts")
    try:
        if ray is not None and ray is not False:
            batches = _batches(chunks, max(1, 4 * _ray_cpus(ray)))
            parts = score_batches(state, batches, address=ray, on_done=lambda n: bar.advance(n))
            return merge(parts, k=state.k, pareto=pareto), "ray", len(batches)
        n_workers = _auto_workers(state.enum.size) if workers is None else max(1, int(workers))
        if n_workers > 1 and len(chunks) > 1:
            return _score_pool(state, chunks, n_workers, bar), "processes", n_workers
        parts = []
        for c in chunks:
            parts.append(score_chunk(state, *c))
            bar.advance(int(state.enum.vmask[c[1] : c[2]].sum()) * len(state.enum.recompute))
        return merge(parts, k=state.k, pareto=pareto), "numpy", 1
    finally:
        bar.close()


def _ray_cpus(address: Any) -> int:
    try:
        import ray

        if ray.is_initialized():
            return max(1, int(ray.cluster_resources().get("CPU", 1)))
    except Exception:  # pragma: no cover - ray missing or not started: the backend reports it
        pass
    return max(1, os.cpu_count() or 1)


def _auto_workers(size: int) -> int:
    if size < POOL_MIN_LAYOUTS:
        return 1
    return max(
        1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1), 8)
    )


def _score_pool(
    state: ScoringState, chunks: list[tuple[int, int, int]], n_workers: int, bar: _Progress
) -> Summary:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    global _POOL_STATE
    _POOL_STATE = state
    try:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        batches = _batches(chunks, 4 * n_workers)
        if ctx is None:  # pragma: no cover - platforms without fork score in-process
            return score_chunks(state, chunks)
        with ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx) as ex:
            futures = [ex.submit(_pool_task, b) for b in batches]
            parts = []
            for f, b in zip(futures, batches, strict=True):
                parts.append(f.result())
                bar.advance(
                    sum(int(state.enum.vmask[s0:s1].sum()) for _, s0, s1 in b) * len(state.enum.recompute)
                )
        return merge(parts, k=state.k, pareto=len(state.objectives.names) > 1)
    finally:
        _POOL_STATE = None


# ------------------------------------------------------------------------------------- results
@dataclass
class SearchResult:
    """The answer of :func:`recommend`; ``to_dict()`` is what ``recommend --json`` prints."""

    job: dict[str, Any]
    space: str
    space_fingerprint: str
    objectives: Objectives
    layouts_enumerated: int
    layouts_feasible: int
    infeasible_by_reason: dict[str, int]
    candidates_total: int
    results: list[Prediction]
    pareto: list[Prediction]
    pareto_size: int
    elapsed_s: float
    scoring_s: float
    backend: str
    workers: int
    training_job: TrainingJob | None = None
    # what the launcher (the job's framework's export format) cannot run, left out of the space
    launch_note: str = ""
    launcher: str = ""
    # layouts among the best ones dropped because the launcher refused them (see search_layouts)
    not_launchable: int = 0

    def __repr__(self) -> str:  # one line: the full record is to_dict()
        c = self.job.get("cluster", {})
        head = f"{self.job.get('model')} on {c.get('num_devices')} x {c.get('device')}"
        if not self.results:
            return f"SearchResult({head}: no layout fits)"
        b = self.results[0]
        return (
            f"SearchResult({head}: best {b.layout.short()} at {b.tokens_per_s_per_device:,.0f} tokens/s/device; "
            f"{len(self.results)} results of {self.layouts_feasible:,} fitting layouts)"
        )

    @property
    def best(self) -> Prediction | None:
        """The best layout's prediction (``results[0]``), None when nothing fits."""
        return self.results[0] if self.results else None

    @property
    def layouts_per_s(self) -> float:
        return self.layouts_enumerated / self.scoring_s if self.scoring_s > 0 else float("inf")

    def objective_report(self, pred: Prediction) -> dict[str, float]:
        assert self.training_job is not None
        res = {
            "tokens_per_s_per_device": pred.tokens_per_s_per_device,
            "memory_bytes": pred.memory_gib_per_device * GIB,
            "energy_j_per_step": pred.energy_j_per_step,
        }
        return self.objectives.report(res, self.training_job.tokens_per_step)

    def to_dict(self) -> dict[str, Any]:
        def rec(i: int, p: Prediction) -> dict[str, Any]:
            d = p.to_dict()
            d["rank"] = i + 1
            d["objectives"] = self.objective_report(p)
            return d

        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "job": self.job,
            "layouts_enumerated": self.layouts_enumerated,
            "layouts_feasible": self.layouts_feasible,
            "infeasible_by_reason": dict(self.infeasible_by_reason),
            "results": [rec(i, p) for i, p in enumerate(self.results)],
            "objective": list(self.objectives.names),
            "price_per_device_hour": self.objectives.price_per_device_hour,
            "space": self.space,
            "space_fingerprint": self.space_fingerprint,
            "candidates_total": self.candidates_total,
            "elapsed_s": self.elapsed_s,
            "backend": self.backend,
            "workers": self.workers,
            "launcher": self.launcher,
            "launch_note": self.launch_note,
            "not_launchable": self.not_launchable,
        }
        if self.backend == "ray":
            from autopar.search.ray_backend import describe

            out["ray"] = describe()
        if len(self.objectives.names) > 1:
            out["pareto"] = [rec(i, p) for i, p in enumerate(self.pareto)]
            out["pareto_size"] = self.pareto_size
        return out

    def table(self, preds: list[Prediction] | None = None) -> tuple[list[str], list[list[str]]]:
        """The ranked table (columns, formatted rows) of ``preds`` (default: the top-k), as the
        HTML report and ``_repr_html_`` show it."""
        cols = [
            "#",
            "layout",
            "step time",
            "tokens/s/device",
            "MFU",
            "memory/device",
            "exposed comm",
            "energy J/token",
            "$/M tokens",
            "also (same figures)",
        ]
        rows = []
        for i, p in enumerate(self.results if preds is None else preds, 1):
            ob = self.objective_report(p)
            rows.append(
                [
                    str(i),
                    p.layout.short(),
                    _fmt_t(p.step_time_s),
                    f"{p.tokens_per_s_per_device:,.0f}",
                    p.mfu_text(),
                    f"{p.memory_gib_per_device:.1f} / {p.memory_capacity_gib:.0f} GiB",
                    f"{p.exposed_comm_fraction:.1%}",
                    f"{ob['energy_j_per_token']:.3f}",
                    f"{ob['cost_usd_per_million_tokens']:.3f}",
                    also_text(p.extra.get("also")),
                ]
            )
        return cols, rows

    def _repr_html_(self) -> str:
        from autopar.report import table_html

        cols, rows = self.table()
        return table_html(
            cols,
            rows,
            left=("layout", "also (same figures)"),
            highlight_first=True,
            caption=f"{self.job['model']}: top {len(rows)} of {self.layouts_feasible:,} layouts that fit",
        )

    def to_frame(self) -> Any:
        """The top-k as a pandas DataFrame: one row per layout, its fields and figures (needs pandas)."""
        from autopar.report import frame

        rows = []
        for p in self.results:
            d = p.layout.model_dump()
            d.update(self.objective_report(p))
            d.update(
                layout=p.layout.short(),
                step_time_s=p.step_time_s,
                tokens_per_s_per_device=p.tokens_per_s_per_device,
                mfu=p.mfu,
                mfu_basis=p.mfu_basis,
                memory_gib_per_device=p.memory_gib_per_device,
                exposed_comm_fraction=p.exposed_comm_fraction,
                energy_j_per_step=p.energy_j_per_step,
                also=also_text(p.extra.get("also")),
            )
            rows.append(d)
        return frame(rows)

    def why(self) -> str:
        """One sentence on why the winner beats the runner-up."""
        if not self.results:
            return ""
        if len(self.results) < 2:
            return f"{self.results[0].layout.short()} is the only layout that fits."
        a, b = self.results[0], self.results[1]
        predicted = explain_choice(a, b, self.objectives.primary)
        err = a.expected_error.p90 if a.expected_error is not None else None
        rel = (b.step_time_s - a.step_time_s) / b.step_time_s if b.step_time_s else 0.0
        if self.objectives.primary not in ("throughput", "cost") or err is None or rel >= err:
            return predicted
        # a lead smaller than the error the prediction states decides nothing: say so, and what does
        lighter = min((a, b), key=lambda p: p.memory_gib_per_device)
        return (
            f"a tie: {a.layout.short()} and the runner-up {b.layout.short()} are {rel:.1%} apart in "
            f"step time, within the +-{err:.0%} expected error of these predictions, so the model "
            "does not decide between them. Between ties, measure both (autopar validate) or take the "
            f"one with more memory headroom: {lighter.layout.short()} ({a.memory_gib_per_device:.1f} "
            f"vs {b.memory_gib_per_device:.1f} GiB per device). Predicted difference: {predicted}"
        )


_LABELS = {
    "gemm": "GEMM time",
    "attention": "attention time",
    "elementwise": "elementwise/launch time",
    "recompute": "recompute time",
    "tp_comm": "exposed TP communication",
    "cp_comm": "exposed CP communication",
    "ep_comm": "expert all-to-all time",
    "pp_comm": "pipeline send/recv time",
    "dp_comm": "data-parallel communication",
    "pipeline_bubble": "pipeline bubble",
    "optimizer": "optimizer step",
}


def _fmt_t(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if abs(x) < 1 else f"{x:.2f} s"


def explain_choice(a: Prediction, b: Prediction, objective: str, other: str = "the runner-up") -> str:
    """Why ``a`` ranks above ``b`` (called ``other``): the breakdown component that differs most in a's favour."""
    if objective == "memory":
        parts_a, parts_b, total_a, total_b = (
            a.memory_breakdown,
            b.memory_breakdown,
            a.memory_gib_per_device,
            b.memory_gib_per_device,
        )
        fmt = lambda x: f"{x:.1f} GiB"  # noqa: E731
        what = "memory per device"
        labels = {k: k.replace("_", " ") for k in parts_a}
    else:
        parts_a, parts_b, total_a, total_b = a.time_breakdown, b.time_breakdown, a.step_time_s, b.step_time_s
        fmt = _fmt_t
        what = {"throughput": "step time", "cost": "step time (cost)", "energy": "step time"}[objective]
        labels = _LABELS
    diffs = {k: parts_b.get(k, 0.0) - parts_a.get(k, 0.0) for k in set(parts_a) | set(parts_b)}
    if total_a == total_b and all(abs(d) < 1e-15 for d in diffs.values()):
        return (
            f"{a.layout.short()} ties with {other} {b.layout.short()} on {what}; it ranks first on "
            f"{'memory' if objective != 'memory' else 'step time'}."
        )
    best = max(diffs, key=lambda k: diffs[k])
    worst = min(diffs, key=lambda k: diffs[k])
    rel = (total_b - total_a) / total_b if total_b else 0.0
    if objective == "energy":
        head = (
            f"{a.layout.short()} beats {other} {b.layout.short()} on energy per token "
            f"({a.energy_j_per_step / 1e3:,.1f} vs {b.energy_j_per_step / 1e3:,.1f} kJ per step)"
        )
    else:
        head = (
            f"{a.layout.short()} beats {other} {b.layout.short()} by {rel:.1%} in {what} "
            f"({fmt(total_a)} vs {fmt(total_b)})"
        )
    if diffs[best] <= 0:
        return head + "."
    s = (
        f"{head}: its {labels.get(best, best)} is {fmt(diffs[best])} smaller "
        f"({fmt(parts_a.get(best, 0.0))} vs {fmt(parts_b.get(best, 0.0))})"
    )
    if diffs[worst] < 0 and -diffs[worst] > 0.1 * diffs[best]:
        s += f", which outweighs {fmt(-diffs[worst])} more {labels.get(worst, worst)}"
    return s + "."


def predict_layout(job: TrainingJob, layout: Layout, cal: Calibration) -> Prediction:
    """Exactly what ``predict`` computes for ``layout`` (a table of one row, same engine call)."""
    table = LayoutTable.from_layouts([layout])
    res = evaluate(job, table, calibration=cal)
    return prediction_from_row(job, table, res, 0, cal)


def _predictions(en: Enumeration, ids: np.ndarray, cal: Calibration) -> list[Prediction]:
    if not len(ids):
        return []
    table = en.table(ids)
    return [predict_layout(en.job, table.row(i), cal) for i in range(len(ids))]


def _resolve_calibration(calibration: str | Calibration | None) -> Calibration:
    return calibration if isinstance(calibration, Calibration) else load_calibration(calibration)


def launch_check(job: TrainingJob, fmt: str) -> tuple[dict[str, list[Any]], Callable[[Layout], str | None]]:
    """The search limits of launcher format ``fmt`` for ``job`` and a check that renders one
    layout with it (None: it renders; else the refusal)."""
    from autopar.export.base import ExportError, get_exporter
    from autopar.export.base import Job as ExportJob

    exporter = get_exporter(fmt)
    xjob = ExportJob.from_core(job.job, num_layers=job.model.layers)
    if xjob.moe_fused_graph and not exporter.fused_graph_option:
        # every layout would be refused: say so before any search
        raise AutoparError(
            f"--moe-fused-graph cannot be launched by {fmt}: no launcher writes the full-iteration "
            "CUDA graph with fused expert MLPs",
            "use `autopar predict --moe-fused-graph` for what such a run would reach, or recommend "
            "without it (--export env carries it)",
        )

    def check(layout: Layout) -> str | None:
        try:
            exporter.render(layout, xjob)
        except ExportError as exc:
            return exc.message
        return None

    return exporter.search_limits(xjob), check


def search_layouts(
    job: TrainingJob,
    space: SearchSpace,
    *,
    launcher: str | None = None,
    top: int = 5,
    objectives: Objectives | None = None,
    calibration: str | Calibration | None = None,
    ray: Any = None,
    workers: int | None = None,
    progress: bool = False,
    pareto_limit: int = 100,
    explain_infeasible: bool = True,
) -> SearchResult:
    """:func:`recommend` on an already-built job (used by sweeps and studies).

    Only what the launcher runs is searched: ``launcher`` (an export format; default the job's
    framework's, ``Job.export_format``) cuts the space's axes to its
    :meth:`~autopar.export.base.Exporter.search_limits` (``launch_note`` says what was cut), and
    every returned layout renders with it: the best layouts it refuses on a combination of axes
    are dropped (``not_launchable``) before the top ``top`` are taken.
    """
    objectives = objectives or Objectives()
    t0 = time.perf_counter()
    if not isinstance(top, int) or top < 1:
        raise AutoparError(f"top must be a positive integer, got {top!r}", "pass --top >= 1")
    cal = _resolve_calibration(calibration)
    fmt = launcher or job.job.export_format
    limits, launchable = launch_check(job, fmt)
    who = f"--framework {job.job.framework} ({fmt} export)"
    space, launch_note = restrict_axes(space, limits, who)
    en = enumerate_space(job, space)
    reasons = {code: n for _, codes in STAGE_RULES for code in codes if (n := en.excluded.get(code, 0))}
    if en.size == 0:
        raise InfeasibleError(_no_legal_message(en, reasons), "widen the search space or change the job")
    # Near-duplicates (layouts whose difference changes no figure) are collapsed into one row, so the
    # scoring keeps a few more than ``top`` to still return ``top`` distinct ones.
    fetch = max(top + min((DUPLICATE_FETCH - 1) * top, DUPLICATE_EXTRA_MAX), 2)
    # room for best layouts the launcher refuses on a combination of axes (re-predicted only if needed)
    state = ScoringState(en, cal, objectives, fetch + LAUNCH_EXTRA)
    t1 = time.perf_counter()
    summary, backend, n_workers = run_scoring(state, workers=workers, ray=ray, progress=progress)
    scoring_s = time.perf_counter() - t1
    reasons["out_of_memory"] = summary.n_legal - summary.n_fit
    if summary.n_fit == 0:
        msg, hint = (
            _infeasible_message(en, summary, cal, objectives)
            if explain_infeasible
            else (f"none of the {summary.n_legal:,} legal layouts fits in memory", "see recommend")
        )
        raise InfeasibleError(msg, hint)
    ok: list[Prediction] = []
    refusals: list[str] = []
    for i in range(0, len(summary.top_ids), fetch):
        for p in _predictions(en, summary.top_ids[i : i + fetch], cal):
            why = launchable(p.layout)
            if why is None:
                ok.append(p)
            else:
                refusals.append(why)
        if len(ok) >= fetch:
            break
    if not ok:
        raise InfeasibleError(
            f"none of the {len(refusals)} best fitting layouts can be launched by {fmt}: {refusals[0]}",
            "widen the search space, or pick a launcher that runs them (--framework / --export)",
        )
    results = collapse_equivalent(ok[:fetch], top)
    front: list[Prediction] = []
    if len(objectives.names) > 1:
        front = collapse_equivalent(
            [
                p
                for p in _predictions(en, summary.front_ids[:pareto_limit], cal)
                if launchable(p.layout) is None
            ]
        )
    return SearchResult(
        job=job.info(),
        space=space.name,
        space_fingerprint=space.fingerprint(),
        objectives=objectives,
        layouts_enumerated=summary.n_legal,
        layouts_feasible=summary.n_fit,
        infeasible_by_reason=reasons,
        candidates_total=en.candidates_total,
        results=results,
        pareto=front,
        pareto_size=len(summary.front_ids),
        elapsed_s=time.perf_counter() - t0,
        scoring_s=scoring_s,
        backend=backend,
        workers=n_workers,
        training_job=job,
        launch_note=launch_note,
        launcher=fmt,
        not_launchable=len(refusals),
    )


def recommend(
    *,
    job: Job | None = None,
    model: Any = None,
    device: str | None = None,
    num_devices: int | None = None,
    devices_per_node: int | None = None,
    seq_len: int | None = None,
    global_batch: int | None = None,
    lora: bool | None = None,
    moe_dispatcher: str | None = None,
    moe_a2a_overlap: bool | None = None,
    moe_fused_graph: bool | None = None,
    pipeline_schedule: str | None = None,
    attention_kernel: str | None = None,
    tp_comm_overlap: str | None = None,
    framework: str | None = None,
    memory_headroom: float | None = None,
    allow_long_context: bool | None = None,
    calibration: str | Calibration | None = None,
    top: int = 5,
    objective: str | Sequence[str] = "throughput",
    space: str | SearchSpace | dict | None = None,
    overrides: Sequence[str] = (),
    price_per_device_hour: float = DEFAULT_PRICE_PER_DEVICE_HOUR,
    price_per_kwh: float = 0.0,
    ray: Any = None,
    workers: int | None = None,
    progress: bool = True,
    launcher: str | None = None,
) -> SearchResult:
    """The best ``top`` layouts of a search space for one training job.

    The job: ``job=Job(...)`` or the flat keywords of :func:`autopar.predict` (the flag names).
    ``calibration`` may also be a loaded :class:`Calibration`. ``objective`` is one of
    ``throughput`` (default: highest tokens/s), ``memory`` (lowest memory per device), ``energy``
    (lowest energy per token), ``cost`` (lowest USD per token at ``price_per_device_hour``, plus
    ``price_per_kwh`` for the energy if your device price excludes power), or several of them
    (a list or "a,b"): then ``pareto`` holds their Pareto front. ``space`` is a built-in name,
    a YAML/TOML path, a mapping or a :class:`SearchSpace`; ``overrides`` are ``--set`` strings.
    ``ray``: None (no Ray), True or "local" (embedded local Ray), or a cluster address.
    ``launcher``: the export format the layouts must render in (default: the framework's own;
    :func:`search_layouts` searches only what it runs). Raises :class:`InfeasibleError` when
    nothing fits, naming the closest layouts and what would make them fit.
    """
    objectives = Objectives.parse(
        objective, price_per_device_hour=price_per_device_hour, price_per_kwh=price_per_kwh
    )
    sp = load_space(space, tuple(overrides))
    cal_path = calibration if isinstance(calibration, str) else None
    tj = training_job(
        job,
        model=model,
        device=device,
        num_devices=num_devices,
        devices_per_node=devices_per_node,
        seq_len=seq_len,
        global_batch=global_batch,
        lora=lora,
        moe_dispatcher=moe_dispatcher,
        moe_a2a_overlap=moe_a2a_overlap,
        moe_fused_graph=moe_fused_graph,
        pipeline_schedule=pipeline_schedule,
        attention_kernel=attention_kernel,
        tp_comm_overlap=tp_comm_overlap,
        framework=framework,
        memory_headroom=memory_headroom,
        allow_long_context=allow_long_context,
        calibration=cal_path,
    )
    return search_layouts(
        tj,
        sp,
        launcher=launcher,
        top=top,
        objectives=objectives,
        calibration=calibration if isinstance(calibration, Calibration) else tj.job.calibration,
        ray=ray,
        workers=workers,
        progress=progress,
    )


# ---------------------------------------------------------------------------- nothing fits
def _no_legal_message(en: Enumeration, reasons: dict[str, int]) -> str:
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
    why = "; ".join(f"{code} ({n:,}): {rule_message(code)}" for code, n in top)
    j = en.job
    return (
        f"no legal layout in search space {en.space.name} for {j.num_devices} devices, global batch "
        f"{j.global_batch}, seq {j.seq_len}: all {en.candidates_total:,} candidates break a rule. "
        f"Most common: {why}"
    )


def _describe_miss(pred: Prediction) -> str:
    parts = sorted(pred.memory_breakdown.items(), key=lambda kv: -kv[1])[:3]
    return (
        f"{pred.layout.short()} needs {pred.memory_gib_per_device:.1f} GiB of {pred.memory_capacity_gib:.1f} "
        f"({', '.join(f'{k} {v:.1f}' for k, v in parts)})"
    )


def _relaxations(layout: Layout, space: SearchSpace) -> list[str]:
    a = space.axes
    out = []
    if layout.recompute not in a.recompute:
        out.append(f"recompute={layout.recompute}")
    if layout.zero not in a.zero:
        out.append(f"zero={layout.zero}")
    if layout.offload and True not in a.offload:
        out.append("optimizer offload")
    for name in ("tp", "pp", "vpp", "cp", "ep", "micro_batch"):
        ax = getattr(a, name)
        if ax.values is not None and getattr(layout, name) not in ax.values:
            out.append(f"{name}={getattr(layout, name)}")
    return out


def _infeasible_message(
    en: Enumeration, summary: Summary, cal: Calibration, objectives: Objectives
) -> tuple[str, str]:
    job = en.job
    closest = _predictions(en, summary.close_ids, cal)
    lines = [
        f"none of the {summary.n_legal:,} legal layouts of search space {en.space.name} fits in "
        f"{job.device.memory_gb * 1e9 / GIB:.1f} GiB ({job.device.memory_gb:g} GB) per device. Closest: "
        + "; ".join(_describe_miss(p) for p in closest)
    ]
    fixes: list[str] = []
    # 1. the same cluster with every memory-saving option (all recompute modes, ZeRO, offload, micro-batch 1)
    relaxed = load_space(
        "default",
        (f"precision={','.join(en.space.axes.precision)}", "micro_batch=1", "cp.max=64", "pp.max=128"),
    )
    try:
        r = search_layouts(
            job, relaxed, top=1, objectives=objectives, calibration=cal, explain_infeasible=False
        )
        best = r.results[0]
        what = _relaxations(best.layout, en.space)
        fixes.append(
            f"allowing {', '.join(what) if what else 'the default space'} fits: {best.layout.short()} at "
            f"{best.memory_gib_per_device:.1f} GiB, {best.tokens_per_s_per_device:,.0f} tokens/s/device"
        )
    except AutoparError:
        # 2. more devices (same global batch)
        for factor in (2, 4, 8, 16):
            n = job.num_devices * factor
            try:
                bigger = job.job.model_copy(
                    update={"cluster": job.job.cluster.model_copy(update={"num_devices": n})}
                )
                job2 = bigger.resolve(model=job.model, device=job.device)
                r = search_layouts(
                    job2,
                    relaxed,
                    top=1,
                    objectives=objectives,
                    calibration=cal,
                    explain_infeasible=False,
                )
            except AutoparError:
                continue
            best = r.results[0]
            fixes.append(
                f"{n} devices ({factor}x) would fit: {best.layout.short()} at "
                f"{best.memory_gib_per_device:.1f} GiB"
            )
            break
        else:
            fixes.append(
                f"even {job.num_devices * 16} devices with full recompute, ZeRO-3, offload and micro-batch 1 "
                f"(those of them {job.job.export_format} launches for --framework {job.job.framework}) "
                "do not fit; shorten the sequence or use a device with more memory"
            )
    lines.append("What would fit: " + "; ".join(fixes))
    return "\n".join(lines), "see `autopar recommend --help` for --space/--set"


__all__ = [
    "recommend",
    "search_layouts",
    "SearchResult",
    "Objectives",
    "OBJECTIVES",
    "DEFAULT_PRICE_PER_DEVICE_HOUR",
    "explain_choice",
    "pareto_mask",
    "predict_layout",
    "GIB",
    "ScoringState",
    "Summary",
    "score_chunks",
    "score_ids",
    "run_scoring",
]
