"""The search studies run end to end (tiny budgets): recommend vs published, Optuna vs random, speed."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "studies" / "data" / "published_runs_dev.csv"  # shipped with the repo


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_recommend_vs_published_small(tmp_path: Path) -> None:
    with DATA.open(newline="") as f:
        rows = list(csv.DictReader(f))
    keep = [r for r in rows if r.get("model_preset") in ("llama-2-7b", "llama-2-13b")][:4]
    assert keep
    small = tmp_path / "small.csv"
    with small.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    out = tmp_path / "out.json"
    r = _run("studies/recommend_vs_published.py", "--csv", str(small), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "autopar top-1" in r.stdout and "largest gaps" in r.stdout
    import json

    recs = json.loads(out.read_text())
    ok = [x for x in recs if x["status"] == "ok"]
    # top-1 is never below a practitioners layout that fits and lies in the searched space
    assert ok and all(x["gain"] >= -1e-9 or not (x["their_fits"] and x["their_in_space"]) for x in ok)
    r = _run("studies/recommend_vs_published.py", "--csv", str(tmp_path / "missing.csv"))
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.slow
def test_optuna_vs_random_smoke() -> None:
    r = _run(
        "studies/optuna_vs_random.py",
        "--evaluations",
        "8",
        "--seeds",
        "1",
        "--samplers",
        "tpe,random",
        "--model",
        "llama-3.1-70b",
        "--num-devices",
        "32",
        "--global-batch",
        "64",
    )
    assert r.returncode == 0, r.stderr
    assert "best known" in r.stdout and "tpe cold" in r.stdout and "random seeded" in r.stdout


@pytest.mark.slow  # a study run: 30-60 s on 2 cores (.ci/run's slow step)
def test_search_speed_smoke() -> None:
    r = _run("studies/search_speed.py", "--reps", "1", "--no-cli")
    assert r.returncode == 0, r.stderr
    assert (
        "scored/s" in r.stdout
        and "heavy modules imported by `import autopar, autopar.search.recommend`: []" in r.stdout
    )
