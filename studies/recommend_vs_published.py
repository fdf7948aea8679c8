"""What autopar recommends next to what practitioners ran, for every group of published training runs.

    python studies/recommend_vs_published.py [--csv studies/data/published_runs_dev.csv] [--json OUT]

Rows of the published-runs CSV are grouped by model x device x device count x global batch (and
sequence length, which a job needs). For each group, ``recommend`` searches the default space at
the precision the practitioners used; the table compares autopar's top-1 (predicted tokens/s per
device) with the practitioners' best run of the group: its measured tokens/s and what autopar
predicts for that exact layout. "gain" = autopar top-1 / predicted practitioners' layout - 1 (the
same model on both sides, so it isolates the layout choice); "top-1/measured" compares autopar's
prediction with reality; "same-feat" is the gain when autopar may only choose the parallel degrees and the
micro-batch (the practitioners' recompute mode, ZeRO stage and sequence parallelism). The largest gaps are explained from the two layouts' time breakdowns,
with a flag when the practitioners' layout does not fit by autopar's memory model (then the gain
is against a layout the model thinks cannot run: a memory-model miss, not a better layout) or lies
outside the searched space.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from published import DEV_CSV


def _key(c) -> tuple:
    r = c.row
    return (
        (r.get("model") or "").strip(),
        (r.get("device") or "").strip(),
        int(float(r["num_devices"])),
        int(float(r["global_batch"])),
        int(float(r["seq_len"])),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEV_CSV, help="default: the shipped studies/data copy")
    ap.add_argument("--json", type=Path, default=None, help="write one record per group")
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--space", default="default")
    ap.add_argument("--explain", type=int, default=8, help="how many of the largest gaps to explain")
    a = ap.parse_args(argv)
    if not a.csv.is_file():
        print(f"error: {a.csv} does not exist (pass --csv PATH to a published-runs CSV)", file=sys.stderr)
        return 2

    from published import load_cases, run_case

    from autopar.coefficients import load_calibration
    from autopar.errors import AutoparError
    from autopar.layout import PRECISION_CODES, RECOMPUTE_CODES
    from autopar.search.enumerate import enumerate_space
    from autopar.search.recommend import Objectives, explain_choice, predict_layout, search_layouts
    from autopar.search.space import load_space

    cal = load_calibration(a.calibration)
    cases = load_cases(a.csv)
    for c in cases:
        run_case(c, cal)
    usable = [
        c
        for c in cases
        if c.prediction is not None
        and c.job is not None
        and c.measured_tps
        and "predicted_tokens_per_s_per_device" in c.prediction
    ]
    # Rows whose source states no layout are predicted (by published) with autopar's own top-1:
    # they say nothing about what practitioners chose, so they are left out here.
    unstated = [c for c in usable if any(x.startswith("layout not stated") for x in c.assumptions)]
    usable = [c for c in usable if c not in unstated]
    groups: dict[tuple, list] = defaultdict(list)
    for c in usable:
        groups[_key(c)].append(c)
    print(
        f"{len(cases)} rows, {len(usable)} training rows with a stated layout and a throughput target "
        f"({len(unstated)} more state no layout and are left out), {len(groups)} groups "
        f"(model x device x devices x global batch x seq)"
    )
    t0 = time.perf_counter()
    out: list[dict[str, Any]] = []
    for key, cs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        model, device, n, gb, seq = key
        theirs = max(cs, key=lambda c: c.measured_tps)
        job = theirs.job
        lay = theirs.table.row(0)
        precisions = sorted({c.table.row(0).precision for c in cs})
        space = load_space(a.space, (f"precision={','.join(precisions)}",))
        rec: dict[str, Any] = {
            "model": model,
            "device": device,
            "num_devices": n,
            "global_batch": gb,
            "seq_len": seq,
            "runs": len(cs),
            "their_layout": lay.short(),
            "their_measured": theirs.measured_tps,
            "target_kind": theirs.target_kind,
            "their_predicted": theirs.prediction["predicted_tokens_per_s_per_device"],
            "their_fits": theirs.prediction["fits"],
            "source": theirs.row.get("source_id", ""),
        }
        try:
            res = search_layouts(
                job, space, top=1, objectives=Objectives(), calibration=cal, explain_infeasible=False
            )
        except AutoparError as exc:
            rec.update(
                status="nothing fits" if "fits" in str(exc) else "error", message=str(exc).splitlines()[0]
            )
            out.append(rec)
            continue
        best = res.results[0]
        en = enumerate_space(job, space, enforce_limit=False)
        ids = en.legal_ids()
        cols = en.decode(ids)
        lt = best.layout
        d = lay.model_dump()  # is their layout in the searched space?
        match = None
        for k, v in d.items():
            v = (
                RECOMPUTE_CODES.index(v)
                if k == "recompute"
                else PRECISION_CODES.index(v)
                if k == "precision"
                else int(v)
            )
            m = cols[k] == v
            match = m if match is None else (match & m)
        rec.update(
            status="ok",
            autopar_layout=lt.short(),
            autopar_predicted=best.tokens_per_s_per_device,
            gain=best.tokens_per_s_per_device / rec["their_predicted"] - 1.0,
            top1_over_measured=best.tokens_per_s_per_device / theirs.measured_tps,
            their_in_space=bool(match.any()) if match is not None else False,
            layouts_enumerated=res.layouts_enumerated,
            layouts_feasible=res.layouts_feasible,
        )
        # The same features the practitioners used (their recompute mode, ZeRO stage, SP, no offload):
        # what choosing the parallel degrees and micro-batch alone is worth.
        same = load_space(
            a.space,
            (
                f"precision={lay.precision}",
                f"recompute={lay.recompute}",
                f"zero={lay.zero}",
                f"sp={'on' if lay.sp else 'off'}",
                "offload=false",
            ),
        )
        try:
            r2 = search_layouts(
                job, same, top=1, objectives=Objectives(), calibration=cal, explain_infeasible=False
            )
            rec["same_features_layout"] = r2.results[0].layout.short()
            rec["gain_same_features"] = r2.results[0].tokens_per_s_per_device / rec["their_predicted"] - 1.0
        except AutoparError:
            rec["same_features_layout"], rec["gain_same_features"] = None, None
        their_pred = predict_layout(job, lay, cal)
        rec["why"] = (
            explain_choice(best, their_pred, "throughput", "the practitioners'")
            if best.layout != lay
            else "same layout"
        )
        out.append(rec)
    elapsed = time.perf_counter() - t0

    hdr = (
        f"{'model':<34} {'device':<14} {'dev':>5} {'batch':>6} {'seq':>6} | {'practitioners (best measured)':<44} "
        f"{'meas':>8} {'pred':>8} | {'autopar top-1':<44} {'pred':>8} {'gain':>7} {'top1/meas':>9} {'same-feat':>9}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in out:
        head = (
            f"{r['model'][:34]:<34} {r['device'][:14]:<14} {r['num_devices']:>5} {r['global_batch']:>6} "
            f"{r['seq_len']:>6} | {r['their_layout'][:43] + ('' if r['their_fits'] else '*'):<44} "
            f"{r['their_measured']:>8.0f} {r['their_predicted']:>8.0f} | "
        )
        if r["status"] != "ok":
            print(head + f"{r['status']}: {r.get('message', '')[:60]}")
            continue
        print(
            head + f"{r['autopar_layout'][:43] + ('' if r['their_in_space'] else ' ^'):<44} "
            f"{r['autopar_predicted']:>8.0f} {r['gain']:>+7.1%} {r['top1_over_measured']:>9.2f} "
            + (
                f"{r['gain_same_features']:>+9.1%}"
                if r.get("gain_same_features") is not None
                else f"{'-':>9}"
            )
        )
    ok = [r for r in out if r["status"] == "ok"]
    print(
        "* = the practitioners' layout does not fit by autopar's memory model; ^ = their layout is outside the "
        "searched space (default space at their precision); same-feat = gain when autopar may only choose the "
        "degrees and micro-batch (their recompute, ZeRO stage and SP, no offload)"
    )
    if ok:
        gains = sorted(r["gain"] for r in ok)
        fit_ok = [r for r in ok if r["their_fits"]]
        print(
            f"\n{len(ok)} groups searched in {elapsed:.1f} s; gain of autopar's top-1 over the practitioners' "
            f"layout (both predicted): median {gains[len(gains) // 2]:+.1%}, max {gains[-1]:+.1%}; "
            f"{sum(g > 0.01 for g in gains)} groups > +1%, {sum(abs(g) <= 0.01 for g in gains)} within 1%"
        )
        if fit_ok:
            g2 = sorted(r["gain"] for r in fit_ok)
            print(
                f"  where the practitioners' layout fits by the model ({len(fit_ok)} groups): median "
                f"{g2[len(g2) // 2]:+.1%}, max {g2[-1]:+.1%}"
            )
        sf = sorted(r["gain_same_features"] for r in ok if r.get("gain_same_features") is not None)
        if sf:
            print(
                f"  with the practitioners' features (degrees and micro-batch only, {len(sf)} groups): median "
                f"{sf[len(sf) // 2]:+.1%}, max {sf[-1]:+.1%}; {sum(g > 0.01 for g in sf)} groups > +1%"
            )
        ratios = sorted(r["top1_over_measured"] for r in ok)
        print(
            f"  autopar top-1 predicted / practitioners' measured: median {ratios[len(ratios) // 2]:.2f}, "
            f"min {ratios[0]:.2f}, max {ratios[-1]:.2f}"
        )
        print("\nlargest gaps (autopar's pick vs the practitioners' layout, from the time breakdowns):")
        for r in sorted(ok, key=lambda r: -r["gain"])[: a.explain]:
            flag = [] if r["their_fits"] else ["their layout does not fit by the memory model"]
            if not r["their_in_space"]:
                flag.append("their layout is outside the searched space")
            print(
                f"- {r['model']} on {r['num_devices']} x {r['device']} ({r['source']}), gain {r['gain']:+.1%}"
                f"{' [' + '; '.join(flag) + ']' if flag else ''}: {r['why']}"
            )
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=float))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
