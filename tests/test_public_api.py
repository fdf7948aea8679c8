"""The public surface: names listed by dir(), real types for type checkers, a light import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = {"predict", "recommend", "serve", "compare", "export", "load_model", "Layout", "AutoparError"}


def _py(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_dir_lists_the_public_names() -> None:
    import autopar

    names = set(dir(autopar))
    assert names >= PUBLIC
    assert set(autopar.__all__) <= names
    for name in autopar.__all__:
        assert getattr(autopar, name) is not None


def test_import_is_light() -> None:
    out = _py(
        "import sys, autopar; print(sorted(m for m in ('torch', 'ray', 'optuna', 'scipy') if m in sys.modules))"
    )
    assert out.strip() == "[]"


def test_export_stays_callable_whatever_is_imported_first() -> None:
    # Importing a submodule of autopar.export binds the package on autopar; it must stay the function too.
    code = (
        "from autopar.export import Job\n"
        "import autopar.export as ex\n"
        "import autopar\n"
        "from autopar import Layout\n"
        "job = Job(model='llama-3.1-8b', num_devices=8, seq_len=4096, global_batch=1)\n"
        "text = autopar.export(Layout(tp=8, dp=1), 'env', job)\n"
        "assert ex.Job is Job and 'AUTOPAR_TP=8' in text, text\n"
        "print('ok')\n"
    )
    assert _py(code).strip() == "ok"
    assert _py("import autopar; print(callable(autopar.export))").strip() == "True"


def test_type_checkers_see_real_signatures(tmp_path: Path) -> None:
    f = tmp_path / "use.py"
    f.write_text(
        "import autopar\n"
        "reveal_type(autopar.predict)\n"
        "reveal_type(autopar.export)\n"
        "reveal_type(autopar.serve)\n"
        "n: int = autopar.load_model('llama-3.1-8b')\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", str(f)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = r.stdout.splitlines()
    revealed = [ln for ln in lines if "Revealed type" in ln]
    assert len(revealed) == 3 and all('"Any"' not in ln and "def (" in ln for ln in revealed), r.stdout
    # a wrong use is caught: load_model returns a ModelSpec, not an int
    assert any("ModelSpec" in ln and "error" in ln for ln in lines), r.stdout


JOB = dict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=16, seq_len=4096, global_batch=64)


def test_export_takes_what_recommend_returns(tmp_path: Path) -> None:
    """autopar.export(result, fmt) renders what `autopar export --from-json` renders from the same
    result's JSON, for the best record and another one."""
    import json

    import autopar

    result = autopar.recommend(**JOB, top=3, progress=False)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(result.to_dict(), default=float))
    for record in (0, 2):
        cli = subprocess.run(
            [sys.executable, "-m", "autopar", "export", "--format", "megatron", "--from-json", str(plan)]
            + ["--record", str(record)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert autopar.export(result, "megatron", record=record).strip() == cli.strip()
    best = autopar.export(result, "megatron")
    assert autopar.export(result.best, "megatron") == best
    assert autopar.export(result.best.layout, "megatron", result.job) == best
    assert autopar.export(result.results[0].layout, "megatron", result.training_job.job) == best
    with pytest.raises(autopar.AutoparError, match="needs the job"):
        autopar.export(result.best.layout, "megatron")
    with pytest.raises(autopar.AutoparError, match="out of range"):
        autopar.export(result, "megatron", record=3)


def test_reprs_are_one_short_line() -> None:
    import autopar

    result = autopar.recommend(**JOB, progress=False)
    serving = autopar.serve(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, isl=1024, osl=256)
    cmp = autopar.compare(
        model="llama-3.1-8b",
        devices="h100-sxm-80gb,a100-80gb",
        num_devices=8,
        workload="training",
        seq_len=4096,
        global_batch=64,
    )
    assert result.best is not None
    for obj, must in (
        (result, result.best.layout.short()),
        (result.best, result.best.layout.short()),
        (serving, serving.results[0]["short"]),
        (cmp, cmp.winners[0]["winner"]),
    ):
        text = repr(obj)
        assert len(text) < 300 and "\n" not in text and must in text, text
