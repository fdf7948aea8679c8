"""How fast and how exact ``autopar whatif`` is: hardware points x layouts per second, vs recommend.

    python studies/whatif_speed.py [--points 10000] [--check 20] [--recommend-points 5]

The issue's benchmark: Llama-3.1-405B on 16,384 h100-sxm-80gb (seq 8192, global batch 2048), the
full default layout space, 10,000 hardware points (memory bandwidth x scale-up bandwidth, 100 x 100).
Prints, in one run:

* the what-if sweep (:func:`autopar.whatif.sweep.sweep`, decomposition included): wall time and
  evaluations/s (hardware points x legal layouts / wall);
* the current recommend path on the same job: ``run_scoring`` over the whole space for a few of
  the hardware points (a device profile per point), evaluations/s, and the ratio of the two rates;
* accuracy: for ``--check`` random points (every resource scaled at random in 0.5x..2x), the
  sweep's answer (demand-model screening, engine re-scoring of the best few) against the full
  engine over every layout (:func:`autopar.engine.step_breakdown`), and the demand model's own error.

The machine's load average is printed: other processes share its cores, so compare the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=10_000, help="hardware points (a square grid)")
    ap.add_argument("--check", type=int, default=20, help="random points checked against the full engine")
    ap.add_argument("--recommend-points", type=int, default=5, help="hardware points run through recommend")
    a = ap.parse_args(argv)
    if a.points < 1 or a.check < 0 or a.recommend_points < 1:
        print("error: --points and --recommend-points must be >= 1, --check >= 0", file=sys.stderr)
        return 2

    from autopar.coefficients import load_calibration
    from autopar.engine import step_breakdown, time_model
    from autopar.objectives import Objectives
    from autopar.prediction import training_job
    from autopar.search.enumerate import enumerate_space
    from autopar.search.recommend import ScoringState, run_scoring
    from autopar.search.space import load_space
    from autopar.whatif.sweep import (
        RATES,
        REFINE_K,
        RESOURCES,
        _best,
        _scaled,
        decompose,
        parse_vary,
        step_times,
        sweep,
    )

    job = training_job(
        device="h100-sxm-80gb", model="llama-3.1-405b", num_devices=16384, seq_len=8192, global_batch=2048
    )
    cal = load_calibration()
    space = load_space("default")
    side = max(1, int(round(a.points**0.5)))
    axes = [parse_vary(f"memory_bw_gbps=1000:8000:{side}"), parse_vary(f"scale_up.agg_gbps=100:1800:{side}")]
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (shared)")
    print("job: llama-3.1-405b on 16,384 h100-sxm-80gb, seq 8192, global batch 2048, default space")

    t0 = time.perf_counter()
    res = sweep(job, axes, space=space, calibration=cal)
    wall = time.perf_counter() - t0
    rate = res["evaluations"] / wall
    print(
        f"whatif sweep:   {res['n_points']:,} points x {res['n_layouts']:,} layouts = {res['evaluations']:,} "
        f"evaluations in {wall:.2f} s = {rate:,.0f} evaluations/s (1 process)"
    )

    en = enumerate_space(job, space)
    dev = job.device
    rng = np.random.default_rng(0)
    t_rec = 0.0
    n_rec = 0
    for _ in range(a.recommend_points):
        bw, up = rng.uniform(1000, 8000), rng.uniform(100, 1800)
        d = dev.model_copy(
            update={
                "memory_bw_gbps": bw,
                "scale_up": dev.scale_up.model_copy(
                    update={
                        "agg_gbps": up,
                        "per_peer_gbps": up * dev.scale_up.per_peer_gbps / dev.scale_up.agg_gbps,
                    }
                ),
            }
        )
        from dataclasses import replace

        j = replace(job, device=d)
        t1 = time.perf_counter()
        state = ScoringState(enumerate_space(j, space), cal, Objectives(), 5)
        summary, _, _ = run_scoring(state, workers=1)
        t_rec += time.perf_counter() - t1
        n_rec += summary.n_legal
    rec_rate = n_rec / t_rec
    print(
        f"recommend path: {a.recommend_points} points x {en.size:,} layouts in {t_rec:.2f} s = {rec_rate:,.0f} "
        f"evaluations/s (1 process); {res['n_points']:,} points would take {res['evaluations'] / rec_rate:,.0f} s"
    )
    print(
        f"ratio whatif / recommend: {rate / rec_rate:,.0f}x; target: 10,000 points in <= 60 s (>= 1e7 evaluations/s)"
    )

    if a.check:
        dec = decompose(job, space=space, calibration=cal)
        tab = en.table(dec.ids)
        co, links = time_model(job, cal)
        fit = dec.memory <= dec.base["memory_gb"] * 1e9 * (1 - job.memory_headroom)
        scales = rng.uniform(0.5, 2.0, (a.check, len(RESOURCES)))
        factors = np.where(np.array([r in RATES for r in RESOURCES])[None, :], 1.0 / scales, scales)
        idx, got = _best(dec, factors, np.full(a.check, dec.base["memory_gb"] * 1e9))
        regret, screen_err, same = [], [], 0
        for i in range(a.check):
            c2, l2 = co, links
            for r, f in zip(RESOURCES, scales[i], strict=True):
                c2, l2 = _scaled(c2, l2, r, f)
            exact = step_breakdown(job, tab, co=c2, links=l2)["step_time"]
            e_best = float(np.min(np.where(fit, exact, np.inf)))
            regret.append(got[i] / e_best - 1.0)
            same += int(got[i] <= e_best * (1 + 1e-12))
            model = step_times(dec, factors[i : i + 1])[0]
            m_idx = int(np.argmin(np.where(fit, model, np.inf)))
            screen_err.append(abs(model[m_idx] / exact[m_idx] - 1.0))
        rg, se = 100 * np.array(regret), 100 * np.array(screen_err)
        print(
            f"accuracy at {a.check} random points (every resource 0.5x..2x), against the full engine over all "
            f"{len(dec.ids):,} layouts: the sweep's answer is the engine's best at {same}/{a.check} points, "
            f"slower than it by at most {rg.max():.2f}% (its step time is the engine's own); the demand model "
            f"alone (before re-scoring its {REFINE_K} best) is off by median {np.median(se):.2f}%, max {se.max():.2f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
