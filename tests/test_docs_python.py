"""Every ```python block of the documentation pages (docs/*.md) runs as written.

Each block runs on its own in a fresh interpreter from an empty directory (a reader pastes one
block at a time), so a block that needs a name defined elsewhere fails here. A page without
python blocks adds no test; docs/api.md must have some.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    out = []
    for page in sorted(DOCS.glob("**/*.md")):
        for i, m in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8"))):
            out.append((f"{page.relative_to(ROOT)}#{i + 1}", m.group(1)))
    return out


BLOCKS = _blocks()


def test_api_page_has_examples() -> None:
    assert sum(name.startswith("docs/api.md#") for name, _ in BLOCKS) >= 5


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_python_block_runs(name: str, code: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, f"{name} failed:\n{code}\n--- stderr\n{r.stderr[-3000:]}"
    assert not list(tmp_path.iterdir()), f"{name} wrote files into the working directory"
