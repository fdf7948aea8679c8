"""The documentation site builds with warnings as errors, and the README's links land on it.

``mkdocs build --strict`` (mkdocs.yml: broken links, missing anchors and pages left out of the nav
are warnings, so errors here) builds into a temporary directory; nothing is written into the
checkout. The README is not a page of the site (GitHub shows it): its links into ``docs/`` are
checked against the built pages' anchors.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    before = sorted(p.name for p in ROOT.iterdir())
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert sorted(p.name for p in ROOT.iterdir()) == before  # nothing written into the checkout
    return out


def test_every_page_is_built(site: Path) -> None:
    pages = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert "index" in pages and len(pages) >= 8
    for stem in pages:
        html = site / ("index.html" if stem == "index" else f"{stem}/index.html")
        assert html.is_file(), stem


def test_the_readme_links_land_on_pages_and_anchors(site: Path) -> None:
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", (ROOT / "README.md").read_text())
    assert len(links) >= 8
    for path, anchor in links:
        page = ROOT / path
        assert page.is_file(), path
        stem = page.stem
        html = (site / ("index.html" if stem == "index" else f"{stem}/index.html")).read_text()
        if anchor:
            assert f'id="{anchor}"' in html, f"{path}#{anchor}: no such anchor on the built page"
