"""Sweeps: ``recommend`` over models x devices x device counts x sequence lengths x batches, one table out.

A sweep file (YAML, ``studies/sweeps/*.yaml``; unknown keys rejected) lists the values of each
job dimension and the search settings; every combination is one point, run in-process or as one
Ray task per point (``--ray``). The result is one row per point: the job, the winning layout and
its numbers, or why nothing fit.
"""

from __future__ import annotations

import csv
import itertools
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autopar.errors import AutoparError, SearchSpaceError
from autopar.layout import Layout
from autopar.limits import MAX_SWEEP_POINTS

MAX_POINTS = MAX_SWEEP_POINTS  # jobs in one sweep grid (autopar.limits)

# The layout columns of a sweep row: the Layout's own fields, in their declared order.
LAYOUT_FIELDS = tuple(Layout.model_fields)
COLUMNS = (
    "model",
    "device",
    "num_devices",
    "devices_per_node",
    "seq_len",
    "global_batch",
    "status",
    "message",
    "layouts_enumerated",
    "layouts_feasible",
    "layout",
    *LAYOUT_FIELDS,
    "step_time_s",
    "tokens_per_s_per_device",
    "mfu",
    "mfu_basis",
    "memory_gib_per_device",
    "exposed_comm_fraction",
    "energy_j_per_token",
    "cost_usd_per_million_tokens",
    "elapsed_s",
)


class SweepFile(BaseModel):
    """The sweep file schema: lists of job dimensions and the search settings shared by every point."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    name: str = Field("sweep", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
    description: str = ""
    models: list[str] = Field(min_length=1)
    devices: list[str] = Field(min_length=1)
    num_devices: list[int] = Field(min_length=1)
    seq_len: list[int] = Field(min_length=1)
    global_batch: list[int] = Field(min_length=1)
    devices_per_node: int | None = None
    space: str = "default"
    set_: list[str] = Field(default_factory=list, alias="set")
    objective: str = "throughput"
    top: int = Field(1, ge=1)
    price_per_device_hour: float | None = Field(None, ge=0)
    calibration: str | None = None

    @field_validator("num_devices", "seq_len", "global_batch")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        bad = [x for x in v if x < 1]
        if bad:
            raise ValueError(f"values must be >= 1, got {bad}")
        return v

    @model_validator(mode="after")
    def _bounded(self) -> SweepFile:
        n = len(self.models) * len(self.devices) * len(self.num_devices) * len(self.seq_len)
        n *= len(self.global_batch)
        if n > MAX_POINTS:
            raise ValueError(f"the grid has {n:,} points, more than {MAX_POINTS:,}")
        return self

    def points(self) -> list[dict[str, Any]]:
        return [
            dict(model=m, device=d, num_devices=n, seq_len=s, global_batch=b)
            for m, d, n, s, b in itertools.product(
                self.models, self.devices, self.num_devices, self.seq_len, self.global_batch
            )
        ]


def load_sweep(path: str | Path) -> SweepFile:
    from autopar.files import load_yaml, require_mapping

    hint = "pass a YAML file like studies/sweeps/example.yaml"
    raw = require_mapping(load_yaml(path, "sweep file", hint), f"sweep file {path}", hint)
    allowed = [f.alias or n for n, f in SweepFile.model_fields.items()]
    unknown = [k for k in raw if k not in allowed]
    if unknown:
        raise AutoparError(
            f"sweep file {path}: {unknown[0]}: unknown key", f"allowed keys: {', '.join(allowed)}"
        )
    try:
        sw = SweepFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        hint = (
            f"allowed keys: {', '.join(allowed)}"
            if err["type"] == "extra_forbidden"
            else "see studies/sweeps/example.yaml"
        )
        raise AutoparError(f"sweep file {path}: {key}: {msg}", hint) from None
    return sw


def run_point(args: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """One sweep point: recommend's top-1 as a row (never raises: failures become a status)."""
    point, settings = args
    from autopar.search.recommend import DEFAULT_PRICE_PER_DEVICE_HOUR, recommend

    row: dict[str, Any] = {k: None for k in COLUMNS}
    row.update(point)
    row["devices_per_node"] = settings.get("devices_per_node")
    t0 = time.perf_counter()
    try:
        price = settings.get("price_per_device_hour")
        res = recommend(
            **point,
            devices_per_node=settings.get("devices_per_node"),
            top=settings["top"],
            objective=settings["objective"],
            space=settings["space"],
            overrides=tuple(settings["set"]),
            calibration=settings.get("calibration"),
            price_per_device_hour=DEFAULT_PRICE_PER_DEVICE_HOUR if price is None else price,
            progress=False,
            workers=1,
        )
    except (AutoparError, SearchSpaceError) as exc:
        row["status"] = "infeasible" if type(exc).__name__ == "InfeasibleError" else "error"
        row["message"] = str(exc).splitlines()[0]
        row["elapsed_s"] = time.perf_counter() - t0
        return row
    best = res.results[0]
    lay = best.layout.model_dump()
    ob = res.objective_report(best)
    row.update({k: lay[k] for k in LAYOUT_FIELDS})
    row.update(
        status="ok",
        message="",
        devices_per_node=res.job["cluster"]["devices_per_node"],
        layouts_enumerated=res.layouts_enumerated,
        layouts_feasible=res.layouts_feasible,
        layout=best.layout.short(),
        step_time_s=best.step_time_s,
        tokens_per_s_per_device=best.tokens_per_s_per_device,
        mfu=best.mfu,
        mfu_basis=best.mfu_basis,
        job=res.job,  # with the layout fields: what `autopar export --from-json` reads
        memory_gib_per_device=best.memory_gib_per_device,
        exposed_comm_fraction=best.exposed_comm_fraction,
        energy_j_per_token=ob["energy_j_per_token"],
        cost_usd_per_million_tokens=ob["cost_usd_per_million_tokens"],
        elapsed_s=time.perf_counter() - t0,
    )
    return row


def run_sweep(sw: SweepFile, *, ray: Any = None, on_point=None) -> list[dict[str, Any]]:
    """Every point of the sweep, in the file's order (``ray``: None, "local" or an address)."""
    settings = {
        "devices_per_node": sw.devices_per_node,
        "top": sw.top,
        "objective": sw.objective,
        "space": sw.space,
        "set": list(sw.set_),
        "calibration": sw.calibration,
        "price_per_device_hour": sw.price_per_device_hour,
    }
    # Fail fast on a bad space or objective (every point would fail the same way).
    from autopar.objectives import Objectives
    from autopar.search.space import load_space

    load_space(sw.space, tuple(sw.set_))
    Objectives.parse(sw.objective)
    items = [(p, settings) for p in sw.points()]
    if ray is not None:
        from autopar.search.ray_backend import map_tasks

        return map_tasks(run_point, items, address=ray, on_done=on_point)
    rows = []
    for i, it in enumerate(items):
        rows.append(run_point(it))
        if on_point is not None:
            on_point(i, rows[-1])
    return rows


def has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def default_output(sw: SweepFile) -> Path:
    return Path(f"sweep-{sw.name}.{'parquet' if has_pyarrow() else 'csv'}")


def check_table_path(path: str | Path) -> Path:
    """Refuse a bad output table before the sweep runs (format, pyarrow, autopar.files rules)."""
    from autopar.files import check_output

    p = Path(path)
    if p.suffix == ".parquet" and not has_pyarrow():
        raise AutoparError(
            f"writing {p} needs pyarrow, which is not installed", "pip install pyarrow, or write a .csv"
        )
    check_output(p, "sweep table", "--out")
    return p


def write_table(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """One table: Parquet for a .parquet path (needs pyarrow), otherwise CSV; written atomically."""
    from autopar.files import atomic_path

    p = check_table_path(path)
    with atomic_path(p, "sweep table", "--out") as tmp:
        if p.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for r in rows])
            pq.write_table(table, tmp)
        else:
            with tmp.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(COLUMNS))
                w.writeheader()
                for r in rows:
                    w.writerow({k: r.get(k) for k in COLUMNS})
    return p


def read_table(path: str | Path) -> list[dict[str, str]]:
    """A sweep table written as CSV (read through autopar.files: a regular UTF-8 file)."""
    import io

    from autopar.files import read_text

    text = read_text(path, "sweep table", "pass a .csv written by `autopar sweep`")
    return list(csv.DictReader(io.StringIO(text, newline="")))


__all__ = ["SweepFile", "load_sweep", "run_sweep", "run_point", "write_table", "default_output", "COLUMNS"]
