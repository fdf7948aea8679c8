"""Issue 22's shape rule for the cost model: no function over 150 lines.

The cost model is the code that turns a model, a layout and a device into seconds, bytes and joules:
the block kinds (autopar/blocks), the stage/step assembly and the memory, communication, energy,
precision and schedule models, and the serving and DiT cost models. Searches, readers, exporters and
the CLI are not part of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "autopar"
MAX_LINES = 150
COST_MODEL = sorted(
    [*(ROOT / "blocks").glob("*.py")]
    + [
        ROOT / name
        for name in (
            "latency.py",
            "memory.py",
            "moe.py",
            "hybrid.py",
            "collectives.py",
            "engine.py",
            "energy.py",
            "precision.py",
            "schedules.py",
            "coefficients.py",
            "encoders.py",
            "serving/estimate.py",
            "serving/tiers.py",
            "serving/backends.py",
            "dit/costs.py",
            "dit/inference.py",
            "dit/training.py",
        )
    ]
)


def _long_functions(path: Path, base: Path = ROOT.parent) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if n > MAX_LINES:
                out.append(f"{path.relative_to(base)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_the_list_names_real_modules() -> None:
    missing = [str(p) for p in COST_MODEL if not p.is_file()]
    assert not missing, missing
    assert len(COST_MODEL) >= 25  # the blocks package alone has a dozen modules


@pytest.mark.parametrize("path", COST_MODEL, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_cost_model_function_over_150_lines(path: Path) -> None:
    assert _long_functions(path) == []


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def too_long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert _long_functions(tmp_path / "m.py", tmp_path) == [f"m.py:1 too_long ({MAX_LINES + 1} lines)"]
