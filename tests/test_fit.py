"""The coefficient fit (autopar/calibration/fit.py), its leave-one-source-out refits in
studies/accuracy.py, and the out-of-sample expected error that predictions quote."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))

import accuracy  # noqa: E402
from fit_published import BASE, samples  # noqa: E402
from published import DEV2_CSV, DEV3_CSV, DEV_CSV  # noqa: E402

import autopar  # noqa: E402
from autopar.calibration import fit as F  # noqa: E402
from autopar.coefficients import (  # noqa: E402
    _expected_error_table,
    base_entry,
    expected_error,
    expected_error_path,
    load_calibration,
    lookup_expected_error,
)
from autopar.engine import evaluate  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    """Every fit row of both shipped CSVs (run with BASE, as the fits are)."""
    return accuracy._fit_rows([str(DEV_CSV), str(DEV2_CSV)])


def _engine_residuals(ss, cal) -> np.ndarray:
    return np.array(
        [
            np.log(
                evaluate(s.job, s.table, calibration=cal, check_legal=False)["tokens_per_s_per_device"][0]
                / s.measured_tokens_per_s_per_device
            )
            for s in ss
        ]
    )


def _subset(rows, per_device: int) -> list:
    seen: dict[str, int] = defaultdict(int)
    out = []
    for c in rows:
        if seen[c.job.device.id] < per_device:
            seen[c.job.device.id] += 1
            out.append(c)
    return out


def test_stacked_residuals_equal_the_engine_row_by_row(rows):
    # FitRows stacks rows with equal step-time inputs into one table and calls the step-time model
    # directly: every row must still get exactly what engine.evaluate predicts for it alone.
    ss = samples(rows)
    fr = F.FitRows(ss)
    assert len(fr.groups) < len(ss)  # some rows really are stacked
    for cal in (load_calibration(), BASE):
        np.testing.assert_allclose(fr(cal), _engine_residuals(ss, cal), rtol=0, atol=1e-12)
    # a subset of groups leaves the other rows unset
    part = fr(BASE, fr.groups_of_device("a100-40gb"))
    on = np.array([s.job.device.id == "a100-40gb" for s in ss])
    assert np.isfinite(part[on]).all() and np.isnan(part[~on]).all()


def test_sparse_jacobian_fit_takes_scipy_dense_finite_difference_path(rows):
    # The per-device columns evaluated on their own device's rows only, the same forward steps:
    # the same iterates as least_squares with its own dense '2-point' Jacobian over engine calls.
    sub = samples(_subset(rows, 3))
    names, x0, lo, hi = F._parameter_space(sub, BASE)
    w = F.group_weights(sub)

    def f(x):
        return w * _engine_residuals(sub, F.calibration_from_vector(names, x, BASE))

    ref = least_squares(
        f,
        x0,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=0.1,
        max_nfev=3,
        ftol=F.FTOL,
        x_scale=np.maximum(np.abs(x0), 1e-3),
        diff_step=F.DIFF_STEP,
    )
    res = F.fit(sub, BASE, max_nfev=3, shrinkage_rows=0)  # the dies' prior: its own test below
    np.testing.assert_allclose(res.values, ref.x, rtol=1e-9, atol=0)
    assert res.nfev == ref.nfev and res.status == ref.status
    assert not res.converged and "NOT converged" in res.convergence()


def test_fd_steps_follow_scipy_at_the_bounds():
    lo, hi = np.array([0.0, 0.0, 0.0, 8.0]), np.array([1.0, 1.0, 1e-4, 2048.0])
    x = np.array([0.5, 1.0, 0.0, 2048.0])
    h = F.fd_steps(x, lo, hi, 1e-3)
    assert h[0] == pytest.approx(5e-4)
    assert h[1] == pytest.approx(-1e-3)  # at the upper bound: backwards
    assert h[2] == pytest.approx(np.finfo(float).eps ** 0.5)  # x = 0: sqrt(eps), inside the bound
    assert h[3] == pytest.approx(-2.048)


TABLE = {
    "schema": "autopar.expected_error/v2",
    "domain": {
        "min_rows": 10,
        "stacks": {"megatron": {"rows": 50, "max_devices": 512, "classes": {"dense": 50}}},
    },
    "base": {"stack": {"megatron": {"rows": 25, "p90_ape": 0.2}}, "all": {"rows": 100, "p90_ape": 0.25}},
    "widening": {"device": {"factor": 2.0}, "model_class": {"factor": 1.5}},
}


def test_lookup_base_per_stack_then_all_times_the_factors():
    e = lookup_expected_error(TABLE, "megatron")
    assert (e.p90, e.basis, e.group, e.rows, e.widened_by) == (0.2, "out_of_sample", "stack megatron", 25, ())
    e = lookup_expected_error(TABLE, "fsdp", ("device", "model_class"))
    assert (e.group, e.rows, e.factor) == ("all", 100, 3.0) and e.p90 == pytest.approx(0.75)
    assert "widened x3.00 for: device never measured, model class with too few measured runs" in e.describe()
    assert (
        lookup_expected_error(TABLE, "megatron", (), "moe-fine").group == "stack megatron"
    )  # no class entry
    by_class = {
        **TABLE,
        "base": {**TABLE["base"], "stack_class": {"megatron/moe-fine": {"rows": 12, "p90_ape": 0.4}}},
    }
    e = lookup_expected_error(by_class, "megatron", ("device",), "moe-fine")
    assert (e.group, e.rows) == ("stack megatron, moe-fine", 12) and e.p90 == pytest.approx(0.8)
    assert lookup_expected_error(by_class, "megatron", (), "dense").p90 == 0.2  # the stack's own figure
    assert lookup_expected_error({}, "megatron") is None  # no table (or a v1 one): nothing quoted
    assert lookup_expected_error({**TABLE, "schema": "autopar.expected_error/v1"}, "megatron") is None


def test_other_calibrations_quote_their_own_in_sample_residuals():
    shipped = load_calibration()
    own = shipped.model_copy(
        update={"provenance": {"residuals": {"h100-sxm-80gb": {"rows": 7, "p90_ape": 0.05}}}}
    )
    e = expected_error("h200-sxm-141gb", own, "megatron")
    assert (e.p90, e.basis, e.group, e.rows) == (0.05, "in_sample", "device h100-sxm-80gb (same silicon)", 7)
    assert "fitted runs (in-sample" in e.describe()
    assert expected_error("a100-80gb", own.model_copy(update={"provenance": {}})) is None


def _tiny(rows):
    """A tiny synthetic case set: 12 real rows relabelled into three sources of four."""
    picked = [c for c in rows if c.job.device.id in ("a100-40gb", "h100-sxm-80gb")][::9][:12]
    assert len(picked) == 12
    return [replace(c, row={**c.row, "source_id": f"synthetic-{i % 3}"}) for i, c in enumerate(picked)]


def test_held_out_errors_are_each_rows_error_under_the_fit_without_it(rows):
    tiny = _tiny(rows)
    sources = accuracy.loso_sources(tiny, min_rows=4)
    assert sources == ["synthetic-0", "synthetic-1", "synthetic-2"]
    fits = accuracy.loso_refits(tiny, sources, max_nfev=2)
    # each held-out row's error is its prediction under the fit that never saw its source
    for f in fits[1:]:
        held = [i for i, c in enumerate(tiny) if c.row["source_id"] == f["holdout"]]
        assert f["held"] == held and f["train_rows"] == len(tiny) - len(held)
        train = [c for c in tiny if c.row["source_id"] != f["holdout"]]
        ref = F.fit(samples(train), BASE, max_nfev=2, start=fits[0]["calibration"])
        got = np.asarray(f["errors"])[held]
        np.testing.assert_allclose(
            got, np.expm1(F.residuals(samples([tiny[i] for i in held]), ref.calibration))
        )
    held = accuracy.out_of_sample_errors(tiny, fits)
    assert len(held) == 12
    # the in-sample column of the table comes from the fit on every row
    t = accuracy.loso_table(tiny, fits)
    src = np.array([c.row["source_id"] for c in tiny])
    m = src == "synthetic-1"
    r = next(x for x in t if x["source_id"] == "synthetic-1")
    assert r["in_sample_mape"] == pytest.approx(np.abs(np.asarray(fits[0]["errors"])[m]).mean())
    assert r["out_of_sample_mape"] == pytest.approx(np.abs(np.asarray(fits[2]["errors"])[m]).mean())


def test_shipped_table_is_current():
    """The shipped table was computed from the current model, device profiles and data; if this
    fails, regenerate it: python studies/accuracy.py --lodo --write-expected-error
    cost_models/calibration/expected_error.yaml"""
    t = yaml.safe_load(expected_error_path().read_text())
    prov = t["provenance"]
    assert t["schema"] == "autopar.expected_error/v2"
    paths = (DEV_CSV, DEV2_CSV, DEV3_CSV)
    assert prov["data"] == {p.name: F.file_digest(p) for p in paths}
    every = accuracy._fit_rows([str(p) for p in paths])
    assert sorted(prov["held_out"]["source"]) == accuracy.loso_sources(every)
    assert sorted(prov["held_out"]["device"]) == accuracy.lodo_devices(every)
    assert prov["base_mape_of_fit_rows"] == pytest.approx(accuracy.base_fingerprint(every), abs=1e-6), (
        "the model moved: regenerate the table (" + prov["command"] + ")"
    )
    assert t["domain"] == accuracy.fit_domain(every)
    assert t["coverage"]["source"]["rows"] == sum(prov["held_out"]["source"].values())
    assert all(g["rows"] >= prov["min_group_rows"] for g in t["base"]["stack"].values())


def test_prediction_json_carries_the_basis():
    p = autopar.predict(
        model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, seq_len=4096, global_batch=64, tp=2
    )
    d = json.loads(json.dumps(p.to_dict()))
    shipped = _expected_error_table(str(expected_error_path()))
    entry, group = base_entry(shipped["base"], "megatron", "dense")
    assert (
        d["expected_error_p90"] == entry["p90_ape"] and d["expected_error_basis"]["group"] == group
    )  # measured device, precision, stack, class, scale
    assert d["expected_error_basis"]["basis"] == "out_of_sample"
    assert (
        d["expected_error_basis"]["widened_by"] == [] and d["expected_error_basis"]["rows"] == entry["rows"]
    )
    # H200 takes the H100's fitted rates (same silicon): not an unmeasured device
    h200 = autopar.predict(
        model="llama-3.1-8b", device="h200-sxm-141gb", num_devices=8, seq_len=4096, global_batch=64
    ).to_dict()
    assert "device" not in h200["expected_error_basis"]["widened_by"]
    # a device the shipped calibration has no rates for: widened by its factor
    mi = autopar.predict(
        model="llama-3.1-8b", device="mi300x", num_devices=8, seq_len=4096, global_batch=64
    ).to_dict()
    assert mi["expected_error_basis"]["widened_by"] == ["device"]
    factor = shipped["widening"]["device"]["factor"]
    assert mi["expected_error_p90"] == pytest.approx(entry["p90_ape"] * factor, abs=5e-5)


def test_stack_coefficients_route_to_their_stack_only(tmp_path):
    """A stack's own overlap contention reaches jobs of that stack; others take the global value;
    write_calibration keeps it; the fit gives a stack its own only with enough rows."""
    from types import SimpleNamespace

    from autopar.calibration.fit import fitted_stacks, write_calibration
    from autopar.coefficients import Calibration, coefficients_for, load_calibration
    from autopar.hardware import load_device

    cal = Calibration.model_validate(
        {"global": {"overlap_contention": 0.5}, "stacks": {"deepspeed": {"overlap_contention": 0.1}}}
    )
    dev = load_device("a100-80gb")
    assert coefficients_for(dev, cal, "deepspeed")[0].overlap_contention == 0.1
    assert coefficients_for(dev, cal, "megatron")[0].overlap_contention == 0.5  # the global value
    assert coefficients_for(dev, cal)[0].overlap_contention == 0.5
    # a stack never measured takes the most conservative contention measured (here the global)
    assert coefficients_for(dev, cal, "fsdp")[0].overlap_contention == 0.5
    cal2 = cal.model_copy(
        update={
            "stacks": {"deepspeed": cal.stacks["deepspeed"].model_copy(update={"overlap_contention": 0.9})}
        }
    )
    assert coefficients_for(dev, cal2, "fsdp")[0].overlap_contention == 0.9
    assert coefficients_for(dev, cal2, "megatron")[0].overlap_contention == 0.5
    path = tmp_path / "c.yaml"
    write_calibration(cal, path)
    assert load_calibration(path).stacks["deepspeed"].overlap_contention == 0.1

    def rows(stack: str, n: int):
        return [SimpleNamespace(job=SimpleNamespace(framework=SimpleNamespace(name=stack)))] * n

    fake = rows("megatron", 50) + rows("fsdp", 6) + rows("deepspeed", 5) + rows("torchtitan", 8)
    assert fitted_stacks(fake) == ["fsdp", "torchtitan"]  # megatron sets the global value


def test_one_die_one_coefficient(rows):
    # Die mode (BASE names the dies): one GEMM factor per die, applied to each member's own measured
    # rates; attention runs at each member's measured curve times ONE global factor (no die has its
    # own where every member has a curve); a member without rows of its own (H200) gets its die's
    # factor on its own profile.
    from autopar.coefficients import coefficients_for
    from autopar.hardware import load_device

    sub = samples(_subset(rows, 3))
    names, x0, lo, hi = F._parameter_space(sub, BASE)
    dies = {BASE.transfer.dies[s.job.device.id] for s in sub}
    assert sorted(n for n in names if n.endswith(".gemm_scale")) == sorted(
        f"die:{d}.gemm_scale" for d in dies
    )
    assert not any(n.startswith(("a100", "h100")) for n in names)  # nothing per device
    assert all(load_device(s.job.device.id).efficiency.attention_fwd for s in sub)
    assert not any(n.endswith(".attention_ratio") for n in names)  # measured curves: no die factor
    x = x0.copy()
    x[names.index("die:ga100.gemm_scale")] = 0.8
    x[names.index("global.attention_scale")] = 0.6
    cal = F.calibration_from_vector(names, x, BASE)
    for dev_id in ("a100-40gb", "a100-80gb", "a100-pcie-80gb"):
        prof = load_device(dev_id).efficiency
        dc = cal.device(dev_id)
        assert dc.gemm["bf16"] == pytest.approx(min(prof.gemm["bf16"] * 0.8, 0.95))
        co, _ = coefficients_for(load_device(dev_id), cal)
        assert co.attention_scale == pytest.approx(0.6) and co.attention_fwd == prof.attention_fwd
    assert cal.device("a100-40gb").gemm_half_dim == cal.device("a100-80gb").gemm_half_dim
    assert "die:gh100.gemm_scale" in names  # the subset has H100 rows: H200 (none) takes GH100's factor
    r = x[names.index("die:gh100.gemm_scale")]
    h200 = load_device("h200-sxm-141gb").efficiency
    assert cal.device("h200-sxm-141gb").gemm["fp8"] == pytest.approx(min(h200.gemm["fp8"] * r, 0.95))


def test_dies_share_one_gemm_scale_unless_the_rows_insist(rows):
    # The hierarchical prior's residuals: zero where every die has the same scale, its Jacobian the
    # analytic one of sqrt(rows) * (log s - mean log s), only on the die scales.
    names = ["die:a.gemm_scale", "global.tp_overlap", "die:b.gemm_scale", "die:c.gemm_scale"]
    sh = F._Shrinkage(names, 25.0)
    assert sh.n == 3 and np.allclose(sh(np.array([0.8, 0.3, 0.8, 0.8])), 0.0)
    x = np.array([0.9, 0.4, 0.7, 0.8])
    lg = np.log([0.9, 0.7, 0.8])
    np.testing.assert_allclose(sh(x), 5.0 * (lg - lg.mean()))
    num = np.column_stack(
        [(sh(x + 1e-7 * np.eye(4)[k]) - sh(x - 1e-7 * np.eye(4)[k])) / 2e-7 for k in range(4)]
    )
    np.testing.assert_allclose(sh.jacobian(x), num, rtol=1e-6, atol=1e-9)
    assert not sh.jacobian(x)[:, 1].any()
    assert F._Shrinkage(names, 0.0).n == 0 and F._Shrinkage(names[:2], 25.0).n == 0  # off / one die
    # On real rows: a free fit gives the dies different scales; a strong prior pulls them together
    # and the rows then fit worse (the prior is not free), the default lies in between.
    sub = samples(_subset(rows, 6))

    def spread(res):
        v = [x for n, x in zip(res.names, res.values, strict=True) if n.endswith(".gemm_scale")]
        return float(np.ptp(np.log(v)))

    free = F.fit(sub, BASE, max_nfev=8, shrinkage_rows=0)
    shared = F.fit(sub, BASE, max_nfev=8, shrinkage_rows=1e5)
    assert spread(free) > 0.02 and spread(shared) < 0.2 * spread(free)
    assert free.mape < shared.mape


def test_repeated_measurements_weigh_as_one_configuration(rows):
    # A recipe re-run in k container releases counts as one configuration in its source's weight.
    import fit_published

    dup = [rows[0], replace(rows[0], run_id="again"), rows[1]]
    ss = fit_published.samples(dup)
    assert [s.weight for s in ss][:2] == [0.5, 0.5] and ss[2].weight == 1.0
    w = F.group_weights(ss)
    assert w[0] == pytest.approx(w[1]) and w[0] + w[1] == pytest.approx(w[2])
