"""How far a serving prediction should be trusted: the held-out error of the serving model.

The table (``cost_models/calibration/serving_expected_error.yaml``, written by
``python studies/published_serving.py --write-expected-error ...``) holds the 90th percentile of
|relative error| of output tokens/s over published runs each predicted by serving coefficients
refitted without its device or model, the devices and model classes those runs cover, and a
widening factor for each way a prediction leaves that domain. Under a calibration other than the
shipped one the table does not describe the predictions, and no figure is quoted.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

SCHEMA = "autopar.serving_expected_error/v1"


def table_path() -> Path:
    return Path(str(resources.files("autopar.cost_models") / "calibration" / "serving_expected_error.yaml"))


@lru_cache(maxsize=2)
def _table(path: str) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        return {}
    d = yaml.safe_load(p.read_text()) or {}
    return d if d.get("schema") == SCHEMA else {}


def extrapolations(device_id: str, cal: Any, model: Any, table: dict[str, Any]) -> tuple[str, ...]:
    """The widening kinds a prediction makes: a device (or its same-silicon twin) with no serving
    run measured, a device whose coefficients are datasheet figures, a model class never served."""
    dom = table.get("domain") or {}
    kinds = []
    measured = set(dom.get("devices") or ())
    if device_id not in measured and cal.transfer.same_silicon.get(device_id) not in measured:
        kinds.append("device")
    if not cal.device(device_id).gemm and cal.transfer.same_silicon.get(device_id) not in cal.devices:
        kinds.append("datasheet")
    cls = "moe" if getattr(model, "is_moe", False) else "mla" if getattr(model, "is_mla", False) else "dense"
    if cls not in set(dom.get("model_classes") or ()):
        kinds.append("model_class")
    return tuple(kinds)


def stacks(table: dict[str, Any]) -> tuple[str, ...]:
    """The serving stacks the table's runs measured (``domain.stacks``; tables written before that
    key existed measured TensorRT-LLM only, as their provenance says)."""
    dom = table.get("domain") or {}
    return tuple(dom.get("stacks") or ("trtllm",))


def backend_widening(table: dict[str, Any], backend: str) -> dict[str, Any]:
    """The widening of a prediction for a stack no held-out run measured. The table has no row of
    that stack to fit a factor from, so it takes the largest held-out factor it has for any way of
    leaving its domain (as studies/accuracy.py does for training kinds without rows)."""
    widening = table.get("widening") or {}
    if "backend" in widening:
        return dict(widening["backend"])
    kinds = {k: float((v or {}).get("factor", 1.0)) for k, v in widening.items()}
    k_max = max(kinds, key=lambda k: kinds[k]) if kinds else None
    f = kinds[k_max] if k_max else 1.0
    return {
        "factor": f,
        "from": f"the largest held-out factor of the table (widening.{k_max}): no run of this stack to fit one",
        "text": f"no serving run of {backend} measured (the stacks measured: {', '.join(stacks(table))}); "
        f"the largest held-out factor of the table, x{f:.2f}",
    }


def expected_error(device_id: str, cal: Any, model: Any, backend: str = "trtllm") -> dict[str, Any] | None:
    """``{"p90", "basis", "rows", "widened_by", "factor", "text"}`` for a serving prediction, or
    None (no table, or a calibration the table does not describe). ``backend``: the serving stack
    predicted; one the table's runs never measured widens the figure (:func:`backend_widening`)."""
    from autopar.coefficients import load_calibration

    if cal != load_calibration():
        return None
    table = _table(str(table_path()))
    base = table.get("base") or {}
    if "p90_ape" not in base:
        return None
    kinds = extrapolations(device_id, cal, model, table)
    widening = dict(table.get("widening") or {})
    if backend not in stacks(table):
        kinds = (*kinds, "backend")
        widening["backend"] = backend_widening(table, backend)
    factor = 1.0
    for k in kinds:
        factor *= float((widening.get(k) or {}).get("factor", 1.0))
    p90 = round(float(base["p90_ape"]) * factor, 4)
    text = (
        f"within ±{p90:.0%} on 90% of held-out serving runs (out-of-sample, {int(base['rows'])} runs, "
        f"{', '.join((table.get('domain') or {}).get('devices') or ())})"
    )
    if kinds:
        text += f"; widened x{factor:.2f} for: " + ", ".join(
            str((widening.get(k) or {}).get("text", k)) for k in kinds
        )
    return {
        "p90": p90,
        "basis": "out_of_sample",
        "rows": int(base["rows"]),
        "widened_by": list(kinds),
        "factor": round(factor, 4),
        "text": text,
    }
