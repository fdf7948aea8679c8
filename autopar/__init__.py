"""autopar: find, predict, validate and export parallel layouts for large transformer training and serving.

The public surface is small and lazily imported so that ``import autopar`` stays fast and never
imports torch or ray.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "predict": "autopar.prediction",
    "Prediction": "autopar.prediction",
    "load_model": "autopar.model",
    "ModelSpec": "autopar.model",
    "load_device": "autopar.hardware",
    "DeviceProfile": "autopar.hardware",
    "Layout": "autopar.layout",
    "AutoparError": "autopar.errors",
    "recommend": "autopar.search.recommend",
    "SearchResult": "autopar.search.recommend",
    "serve": "autopar.serving.search",
    "ServingResult": "autopar.serving.search",
    "compare": "autopar.whatif.compare",
    "export": "autopar.export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autopar' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    # Cache it: importing a submodule of the same name (autopar.export) binds the module here.
    globals()[name] = value
    return value
