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

if TYPE_CHECKING:
    from autopar.errors import AutoparError as AutoparError
    from autopar.export.base import export as export
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
