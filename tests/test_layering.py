"""The package layering, enforced: the core imports nothing above it, and no module imports in a cycle.

Ranks (a module may import its own rank or lower ones):
0 core (flat modules in ``autopar/``), 1 ``export``/``runner``, 2 ``search``/``serving``,
3 ``whatif``/``calibration``, 4 ``cli``. Imports inside functions count: a lazy import is still a
dependency. The ``autopar`` facade (``__init__``, lazy re-exports) is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "autopar"
RANK = {
    "export": 1,
    "runner": 1,
    "search": 2,
    "serving": 2,
    "whatif": 3,
    "calibration": 3,
    "cli": 4,
    "__main__": 4,
}


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def _rank(mod: str) -> int:
    parts = mod.split(".")
    return RANK.get(parts[1], 0) if len(parts) > 2 or parts[1] in RANK else 0


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    g: dict[str, set[str]] = {m: set() for m in mods}
    for mod, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "autopar":
                    targets = [f"autopar.{a.name}" for a in node.names]
                elif node.module.startswith("autopar."):
                    targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("autopar.")]
            for t in targets:
                if t in mods and t != mod and t != "autopar":
                    g[mod].add(t)
    g.pop("autopar", None)
    for deps in g.values():
        deps.discard("autopar")
    return g


def test_no_module_imports_above_its_rank() -> None:
    bad = [
        f"{m} (rank {_rank(m)}) imports {d} (rank {_rank(d)})"
        for m, deps in _graph().items()
        for d in sorted(deps)
        if _rank(d) > _rank(m)
    ]
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    g = _graph()
    cycles: list[str] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g[m]):
            if d.startswith(m + "."):  # a package importing its own submodules is not a cycle
                continue
            if state.get(d) == 1:
                cycles.append(" -> ".join([*stack[stack.index(d) :], d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(cycles)


def test_the_graph_is_real() -> None:
    g = _graph()
    assert "autopar.memory" in g["autopar.engine"]
    assert _rank("autopar.cli.main") == 4 and _rank("autopar.engine") == 0 and _rank("autopar.search") == 2
