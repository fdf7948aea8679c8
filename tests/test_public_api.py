"""The public surface: names listed by dir(), real types for type checkers, a light import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
