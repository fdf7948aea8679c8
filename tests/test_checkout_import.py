"""autopar runs from a source checkout without ``pip install`` (PYTHONPATH at the checkout, as on a
machine with no package index): the data folders the install maps into the package are found."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import sys
sys.meta_path = [f for f in sys.meta_path if "Editable" not in repr(f)]  # no editable finder
sys.path.insert(0, {root!r})
import autopar
import autopar.cost_models.devices
import autopar.search_spaces
from autopar.coefficients import default_calibration_path
from autopar.hardware import load_device
assert autopar.cost_models.__file__.startswith({root!r}), autopar.cost_models.__file__
assert default_calibration_path().is_file()
print(load_device("h100-sxm-80gb").id)
from autopar.cli import main
sys.exit(main(["predict", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "8",
               "--seq-len", "4096", "--global-batch", "32", "--tp", "2", "--json"]))
"""


def test_predict_runs_from_a_checkout_without_install():
    r = subprocess.run(
        [sys.executable, "-c", CODE.format(root=str(ROOT))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("h100-sxm-80gb\n") and '"step_time_s"' in r.stdout
