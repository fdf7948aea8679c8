"""Export a chosen layout to launchers: Megatron-LM, Megatron Bridge, DeepSpeed, torchtitan,
Accelerate, torchrun (autopar's runner), vLLM, SGLang and shell env files.

``export(layout, fmt, job)`` renders; ``parse(text, fmt)`` reads the text back; a layout feature a
format cannot express raises :class:`ExportError`. :data:`EXPORTERS` maps format names to
exporters (see :class:`Exporter` for the contract).
"""

import sys
import types
from typing import Any

from autopar.export import (  # noqa: F401  (each module registers its exporter)
    accelerate,
    deepspeed,
    env,
    megatron,
    megatron_bridge,
    sglang,
    torchrun,
    torchtitan,
    vllm,
)
from autopar.export.base import (
    EXPORTERS,
    Exporter,
    ExportError,
    Job,
    export,
    get_exporter,
    launcher_versions,
    layout_and_job_from_json,
    parse,
)

__all__ = [
    "EXPORTERS",
    "ExportError",
    "Exporter",
    "Job",
    "export",
    "get_exporter",
    "launcher_versions",
    "layout_and_job_from_json",
    "parse",
]


class _ExportModule(types.ModuleType):
    """``autopar.export`` is a package and the export function at once: ``autopar.export(result, fmt)``
    or ``autopar.export(layout, fmt, job)`` (see :func:`autopar._export`, which reads results the
    way ``autopar export --from-json`` does).

    A plain function of that name in ``autopar/__init__.py`` would be replaced by the package the
    first time anything imports ``autopar.export.<module>``; a callable package stays both.
    """

    def __call__(self, what: Any, fmt: str, job: Any = None, *, record: int = 0) -> str:
        import autopar

        return autopar._export(what, fmt, job, record=record)


sys.modules[__name__].__class__ = _ExportModule
