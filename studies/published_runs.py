"""Accuracy of autopar's training predictions against published runs.

    python studies/published_runs.py [--csv studies/data/published_runs_dev.csv] [--json OUT]

Predicts every training row of a published-runs CSV (columns documented in the data README) and
prints the error of tokens/s per device (MAPE, median, worst rows) overall and by source, device
and precision, plus every skipped row with its reason. ``--json`` writes one record per row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from published import DEV_CSV, Case, load_cases, records, run_case, summarize

from autopar.coefficients import Calibration, expected_error, load_calibration


def with_expected_error(
    recs: list[dict[str, Any]], cases: list[Case], cal: Calibration
) -> list[dict[str, Any]]:
    """``records(cases)`` with the expected error every throughput prediction quotes (as
    ``autopar predict`` does: widened for each way it extrapolates from the fitted runs)."""
    for r, c in zip(recs, cases, strict=True):
        if "predicted_tokens_per_s_per_device" not in r or c.job is None or c.table is None:
            continue
        e = expected_error(
            c.job.device.id,
            cal,
            c.job.framework.name,
            precision=c.table.row(0).precision,
            model=c.job.model,
            num_devices=c.job.num_devices,
        )
        r["expected_error_p90"] = e.p90 if e else None
        r["expected_error_basis"] = e.to_dict() if e else None
    return recs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEV_CSV, help="default: the shipped studies/data copy")
    ap.add_argument("--json", type=Path, default=None, help="write one record per row")
    ap.add_argument("--calibration", default=None, help="calibration YAML (default: the shipped one)")
    ap.add_argument("--worst", type=int, default=10, help="how many of the worst rows to list")
    a = ap.parse_args(argv)
    if not a.csv.is_file():
        print(f"error: {a.csv} does not exist (pass --csv PATH to a published-runs CSV)", file=sys.stderr)
        return 2
    cal = load_calibration(a.calibration)
    cases = load_cases(a.csv)
    for c in cases:
        run_case(c, cal)
    summarize(cases, worst=a.worst)
    if a.json:
        a.json.write_text(json.dumps(with_expected_error(records(cases), cases, cal), indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
