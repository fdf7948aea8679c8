"""autopar: find, predict, validate and export parallel layouts for large transformer training and serving.

The public surface is small: the names in ``__all__``. They load on first use so that
``import autopar`` stays fast and never imports torch, ray, optuna or scipy; type checkers see
their real types through the ``TYPE_CHECKING`` block.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it (``export`` is the callable ``autopar.export`` package)
_EXPORTS = {
    "AutoparError": "autopar.errors",
    "CompareResult": "autopar.whatif.compare",
    "DeviceProfile": "autopar.hardware",
    "Layout": "autopar.layout",
    "ModelSpec": "autopar.model",
    "Prediction": "autopar.prediction",
    "SearchResult": "autopar.search.recommend",
    "ServingResult": "autopar.serving.search",
    "compare": "autopar.whatif.compare",
    "export": "autopar.export",
    "load_device": "autopar.hardware",
    "load_model": "autopar.model",
    "predict": "autopar.prediction",
    "recommend": "autopar.search.recommend",
    "serve": "autopar.serving.search",
}

__all__ = sorted(_EXPORTS)


def _map_checkout_data() -> None:
    """Run from a source checkout without ``pip install`` (``PYTHONPATH`` at the checkout, e.g. on a
    machine with no package index), ``autopar.cost_models`` and ``autopar.search_spaces`` are the
    top-level ``cost_models/`` and ``search_spaces/`` the install maps into the package
    (pyproject ``package-dir``): map them the same way. Installed or editable: nothing to do."""
    import sys
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec, spec_from_file_location
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for sub in ("cost_models", "search_spaces"):
        name, init = f"{__name__}.{sub}", root / sub / "__init__.py"
        if name in sys.modules or not init.is_file() or (Path(__file__).parent / sub).exists():
            continue
        if any(
            f.find_spec(name, __path__) is not None
            for f in sys.meta_path
            if f is not PathFinder and hasattr(f, "find_spec")
        ):
            continue  # an installed finder (editable install) maps it
        spec = spec_from_file_location(name, init, submodule_search_locations=[str(root / sub)])
        if spec is None or spec.loader is None:
            continue
        mod = module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        globals()[sub] = mod


_map_checkout_data()

if TYPE_CHECKING:
    from autopar.errors import AutoparError as AutoparError
    from autopar.hardware import DeviceProfile as DeviceProfile
    from autopar.hardware import load_device as load_device
    from autopar.layout import Layout as Layout
    from autopar.model import ModelSpec as ModelSpec
    from autopar.model import load_model as load_model
    from autopar.prediction import Prediction as Prediction
    from autopar.prediction import predict as predict
    from autopar.search.recommend import SearchResult as SearchResult
    from autopar.search.recommend import recommend as recommend
    from autopar.serving.search import ServingResult as ServingResult
    from autopar.serving.search import serve as serve
    from autopar.whatif.compare import CompareResult as CompareResult
    from autopar.whatif.compare import compare as compare


def _export(what: Any, fmt: str, job: Any = None, *, record: int = 0) -> str:
    """``autopar.export``: render a result for a launcher, as ``autopar export --format FMT`` does.

    ``what``: what :func:`recommend`, :func:`serve`, :func:`predict` or :func:`compare` returns
    (``record``: which of its layouts, 0 the best, as ``export --record N``), one of its
    predictions (``result.best``), a ``to_dict()``/``--json`` mapping, or a :class:`Layout` with
    ``job``. ``job`` (optional with a result, required with a bare layout): the result's
    ``.job``, a :class:`autopar.job.Job` or an exporter job (:class:`autopar.export.Job`).
    ``fmt`` ``dynamo`` or ``llm-d``: a :func:`serve` result's deployment manifest
    (:func:`autopar.serving.deploy.render_deploy` takes the options).
    Lives in the facade because it reads results the way the CLI does (``autopar.cli.export``).
    """
    from autopar.cli.export import _is_serving, records_of, render_record, serving_export_record
    from autopar.errors import AutoparError
    from autopar.export.base import Job as ExportJob
    from autopar.export.base import export as render
    from autopar.job import Job as CoreJob
    from autopar.layout import Layout

    if isinstance(job, CoreJob):
        job = job.model_dump(mode="json")
    if isinstance(what, Layout):
        if isinstance(job, ExportJob):
            return render(what, fmt, job)
        if not isinstance(job, dict):
            raise AutoparError(
                "autopar.export(layout, fmt, job) needs the job",
                "pass result.job (or a Job), or pass the result itself: autopar.export(result, fmt)",
            )
        return render_record({**what.model_dump(mode="json"), "job": job}, fmt)
    data = what.to_dict() if hasattr(what, "to_dict") else what
    if isinstance(job, dict) and isinstance(data, dict):
        data = {**data, "job": job}
    elif job is not None:
        raise AutoparError(f"autopar.export: job must be a result's .job or a Job, got {type(job).__name__}")
    records = records_of(data, "autopar.export")
    if not 0 <= record < len(records):
        raise AutoparError(f"autopar.export: record {record} is out of range (0..{len(records) - 1})")
    chosen = records[record]
    from autopar.serving.deploy import FORMATS as DEPLOY_FORMATS

    if fmt in DEPLOY_FORMATS:  # a serve plan's Dynamo / llm-d manifest (default DeployOptions)
        import json

        from autopar.serving.deploy import render_deploy

        return render_deploy(json.loads(json.dumps(chosen, default=float)), fmt)
    if _is_serving(chosen):
        chosen = serving_export_record(chosen)
    return render_record(chosen, fmt)


if TYPE_CHECKING:
    export = _export


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autopar' has no attribute {name!r}")
    mod = import_module(module)
    # ``autopar.export`` is both the exporters' package and, being callable, the export function.
    value = mod if name == "export" else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
