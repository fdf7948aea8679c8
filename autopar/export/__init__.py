"""Export a chosen layout to launchers: Megatron-LM, Megatron Bridge, DeepSpeed, torchtitan,
Accelerate, torchrun (autopar's runner), vLLM, SGLang and shell env files.

``export(layout, fmt, job)`` renders; ``parse(text, fmt)`` reads the text back; a layout feature a
format cannot express raises :class:`ExportError`. :data:`EXPORTERS` maps format names to
exporters (see :class:`Exporter` for the contract).
"""

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
    "layout_and_job_from_json",
    "parse",
]
