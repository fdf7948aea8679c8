"""studies/published_accel.py: acceptance on the dev rows, JSON schema, bad input (issue 15)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "studies" / "published_accel.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STUDY), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a study run: 30-60 s on 2 cores (.ci/run's slow step)
def test_dev_rows_meet_the_acceptance(tmp_path):
    out = tmp_path / "accel.json"
    r = _run("--json", str(out))
    assert r.returncode == 0, r.stderr
    recs = json.loads(out.read_text())["records"]
    done = [x for x in recs if "skipped" not in x]
    assert len(done) / len(recs) >= 0.9
    keys = {
        "row_id",
        "predicted_throughput_tok_s",
        "measured_throughput_tok_s",
        "predicted_power_w",
        "measured_power_w",
        "predicted_ttft_s",
        "measured_ttft_s",
    }
    assert all(set(x) == keys for x in done)

    def mape(p, m):
        e = [abs(x[p] / x[m] - 1) for x in done if x[m] is not None]
        return 100 * float(np.mean(e)), len(e)

    thr, n_thr = mape("predicted_throughput_tok_s", "measured_throughput_tok_s")
    pw, n_pw = mape("predicted_power_w", "measured_power_w")
    assert n_thr > 150 and n_pw > 30
    assert thr <= 20.0
    assert pw <= 15.0
    assert "leave-source-out" in r.stdout and "leave-framework-out" in r.stdout


def test_bad_csv_is_one_line_and_status_2(tmp_path):
    r = _run("--csv", str(tmp_path / "missing.csv"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.csv"
    bad.write_text("row_id,platform\nR1,NVIDIA H100\n")
    r = _run("--csv", str(bad), "--json", str(tmp_path / "o.json"))
    assert r.returncode == 2 and "missing column" in r.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.mark.slow  # a study run: 30-60 s on 2 cores (.ci/run's slow step)
def test_unknown_platform_is_skipped_with_reason(tmp_path):
    rows = (ROOT / "studies" / "data" / "accel_runs_dev.csv").read_text().splitlines()
    f = tmp_path / "few.csv"
    f.write_text("\n".join([rows[0], rows[1], rows[2].replace("NVIDIA A100", "Acme X1")]) + "\n")
    out = tmp_path / "o.json"
    r = _run("--csv", str(f), "--json", str(out))
    assert r.returncode == 0, r.stderr
    recs = json.loads(out.read_text())["records"]
    assert "no device profile" in recs[1]["skipped"]
    assert recs[0]["predicted_throughput_tok_s"] > 0


@pytest.mark.slow  # a study run: 30-60 s on 2 cores (.ci/run's slow step)
def test_other_csv_is_predicted_with_the_dev_fit(tmp_path):
    """Rows of another CSV never tune the coefficients: a duplicated dev row predicts the same."""
    rows = (ROOT / "studies" / "data" / "accel_runs_dev.csv").read_text().splitlines()
    f = tmp_path / "other.csv"
    f.write_text("\n".join([rows[0], rows[1].replace("NVIDIA A100", "AMD MI300X")]) + "\n")
    out = tmp_path / "o.json"
    r = _run("--csv", str(f), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "out of sample" in r.stdout
    rec = json.loads(out.read_text())["records"][0]
    assert rec["predicted_throughput_tok_s"] != pytest.approx(rec["measured_throughput_tok_s"], rel=1e-3)
