"""Enumeration: exactly the legal layouts of a space, reasons counted exactly, grid scoring == flat scoring."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from autopar.coefficients import load_calibration
from autopar.engine import evaluate
from autopar.errors import SearchSpaceError
from autopar.layout import COLUMNS, LayoutTable
from autopar.legality import Context, legality_mask
from autopar.prediction import training_job
from autopar.search.enumerate import STAGE_RULES, _violated, axis_values, enumerate_space
from autopar.search.space import load_space

CASES = [
    ("llama-3.1-8b", "a100-80gb", 16, 4096, 64, []),
    (
        "mixtral-8x7b",
        "h100-sxm-80gb",
        32,
        4096,
        64,
        ["shard_group=0,2,4,8", "sp=both", "precision=bf16,fp8", "pp.max=8", "micro_batch=1,2", "vpp.max=4"],
    ),
    (
        "qwen3-30b-a3b",
        "a100-80gb",
        64,
        8192,
        128,
        ["precision=bf16,fp8", "cp.max=16", "ep.max=128", "pp.max=8", "micro_batch=1,4", "zero=0,1,3"],
    ),
    (
        "llama-3.1-8b",
        "h100-sxm-80gb",
        64,
        8192,
        64,
        ["pipeline_ends=even,minus_one", "tp=1,2", "zero=1", "recompute=none", "offload=false"],
    ),
]
# Axes each generation stage binds: its rules see these, later axes at neutral values.
BOUND = [
    ("tp", "pp", "cp", "dp"),
    ("ep", "etp"),
    ("micro_batch", "grad_accum"),
    ("vpp", "first_stage_layers", "last_stage_layers"),
    ("sp",),
    ("zero", "shard_group", "offload"),
    ("precision",),
]
NEUTRAL = dict(
    tp=1,
    pp=1,
    cp=1,
    dp=1,
    ep=1,
    etp=1,
    micro_batch=1,
    grad_accum=1,
    vpp=1,
    first_stage_layers=0,
    last_stage_layers=0,
    sp=0,
    zero=0,
    shard_group=0,
    offload=0,
    precision=0,
    recompute=0,
)


def brute_force(job, space):
    """The full candidate product, first broken rule of each candidate (Python loops, no cleverness)."""
    av = axis_values(space, job)
    m = job.model
    ctx = Context.for_job(job)
    N, B = job.num_devices, job.global_batch
    rows = []
    for tp, pp, cp in itertools.product(av.tp, av.pp, av.cp):
        etps = sorted({1 if e == 1 else tp for e in av.etp}) if m.is_moe else [tp]
        sps = [int(tp > 1)] if av.sp == "auto" else {"on": [1], "off": [0], "both": [0, 1]}[av.sp]
        for ep, etp, mb, vpp, ends, sp, z, sg, off, rec, prec in itertools.product(
            av.ep,
            etps,
            av.micro_batch,
            av.vpp,
            av.pipeline_ends,
            sps,
            av.zero,
            av.shard_group,
            av.offload,
            av.recompute,
            av.precision,
        ):
            dp = N // (tp * pp * cp) if N % (tp * pp * cp) == 0 else 0
            ga = B // (mb * dp) if dp and B % (mb * dp) == 0 else 0
            # minus_one: (L + 2)/pp - 1 layers on each end; a non-divisor pp gets an impossible count
            e = (m.layers + 2) // pp - 1 if (m.layers + 2) % pp == 0 else m.layers + 1
            f = e if ends == 1 else 0
            rows.append((tp, pp, vpp, f, f, dp, cp, ep, etp, z, sg, sp, mb, ga, rec, off, prec))
    arr = np.array(rows)
    alive = np.ones(len(arr), bool)
    counts: Counter = Counter()
    for si, (_, codes) in enumerate(STAGE_RULES):
        have = set(sum(BOUND[: si + 1], ()))
        cols = {c: (arr[:, i] if c in have else np.full(len(arr), NEUTRAL[c])) for i, c in enumerate(COLUMNS)}
        for code in codes:
            if code == "duplicate" and 0 not in av.shard_group:
                continue
            bad = np.broadcast_to(_violated(code, m, cols, ctx), alive.shape) & alive
            counts[code] += int(bad.sum())
            alive &= ~bad
    return arr, alive, {k: v for k, v in counts.items() if v}


def _job(model, device, n, seq, gb):
    return training_job(
        model=model, device=device, num_devices=n, devices_per_node=None, seq_len=seq, global_batch=gb
    )


@pytest.mark.parametrize(("model", "device", "n", "seq", "gb", "sets"), CASES)
def test_enumeration_equals_brute_force(model, device, n, seq, gb, sets) -> None:
    job = _job(model, device, n, seq, gb)
    space = load_space("default", sets)
    en = enumerate_space(job, space)
    arr, alive, counts = brute_force(job, space)
    legal_bf = {tuple(r) for r in arr[alive].tolist()}
    cols = en.decode(en.legal_ids())
    legal_en = {tuple(r) for r in np.stack([cols[c] for c in COLUMNS], axis=1).tolist()}
    assert legal_en == legal_bf
    assert en.size == len(legal_bf) == len(en.legal_ids())
    assert en.excluded == counts
    assert en.candidates_total == len(arr) == en.size + sum(en.excluded.values())


@pytest.mark.parametrize(("model", "device", "n", "seq", "gb", "sets"), CASES)
def test_every_enumerated_layout_is_legal(model, device, n, seq, gb, sets) -> None:
    job = _job(model, device, n, seq, gb)
    en = enumerate_space(job, load_space("default", sets))
    ctx = Context.for_job(job)
    for _, table in en.iter_tables(200_000):
        legal, bad = legality_mask(job.model, table, ctx)
        assert legal.all(), {k: int(v.sum()) for k, v in bad.items()}


@pytest.mark.parametrize(
    ("model", "device", "n", "seq", "gb", "sets"),
    CASES[:2]
    + [
        ("deepseek-v3", "h100-sxm-80gb", 256, 4096, 512, ["precision=bf16,fp8", "shard_group=0,8,16"]),
    ],
)
def test_grid_scoring_equals_flat_scoring(model, device, n, seq, gb, sets) -> None:
    """The broadcast grid is the engine on the same numbers: bit-identical to a flat table.

    This guards the grid path against engine changes that would stop it broadcasting.
    """
    job = _job(model, device, n, seq, gb)
    en = enumerate_space(job, load_space("default", sets))
    cal = load_calibration()
    rng = np.random.default_rng(0)
    for p, s0, s1 in en.chunks(20_000)[:4]:
        table, shape = en.grid_table(p, s0, s1)
        grid = evaluate(job, table, calibration=cal, check_legal=False)
        mask = en.grid_mask(s0, s1).reshape(-1)
        ids = (p * en.n_structural + s0) * en.cells_per_row + np.flatnonzero(mask)
        pick = rng.choice(len(ids), size=min(len(ids), 3000), replace=False)
        flat = evaluate(job, en.table(ids[pick]), calibration=cal)
        assert flat["legal"].all()
        for key in (
            "step_time_s",
            "memory_bytes",
            "fits",
            "energy_j_per_step",
            "mfu",
            "exposed_comm_fraction",
            "mem_activations",
            "time_dp_comm",
            "time_pipeline_bubble",
        ):
            g = np.broadcast_to(grid[key], shape).reshape(-1)[mask][pick]
            assert np.array_equal(g, flat[key]), key


def test_limits_and_uneven_refused() -> None:
    job = _job("llama-3.1-8b", "a100-80gb", 16, 4096, 64)
    with pytest.raises(SearchSpaceError, match="above limits.max_layouts=10"):
        enumerate_space(
            job,
            load_space("default", ["tp=1"]).model_copy(
                update={"limits": load_space("default").limits.model_copy(update={"max_layouts": 10})}
            ),
        )
    with pytest.raises(SearchSpaceError, match="autopar study"):
        enumerate_space(job, load_space("uneven_pipeline"))
    with pytest.raises(SearchSpaceError, match="axes.tp has no candidate values"):
        enumerate_space(job, load_space("default", ["tp.min=16"]))


def test_chunks_cover_the_grid_once() -> None:
    job = _job("qwen3-30b-a3b", "a100-80gb", 64, 8192, 128)
    en = enumerate_space(job, load_space("default", ["precision=bf16,fp16"]))
    seen = np.zeros(en.grid_size, dtype=int)
    for p, s0, s1 in en.chunks(5_000):
        a = (p * en.n_structural + s0) * en.cells_per_row
        seen[a : a + (s1 - s0) * en.cells_per_row] += 1
    assert (seen == 1).all()
    assert len(en.precision) == 2


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(["llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "llama-2-13b"]),
    n=st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64]),
    gb=st.sampled_from([1, 3, 8, 12, 32, 96]),
    seq=st.sampled_from([2048, 4096, 6144]),
    sets=st.sampled_from([[], ["sp=both"], ["shard_group=0,2,4"], ["precision=bf16,fp8"], ["etp=1"]]),
)
def test_enumeration_invariants(model, n, gb, seq, sets) -> None:
    """Counts add up, every layout is legal, none is listed twice (any job, any space)."""
    from autopar.errors import AutoparError

    try:
        job = _job(model, "a100-80gb", n, seq, gb)
    except AutoparError:
        return  # e.g. devices that do not fill whole nodes
    en = enumerate_space(job, load_space("default", sets))
    assert en.candidates_total == en.size + sum(en.excluded.values())
    if en.size == 0:
        return
    ids = en.legal_ids()
    cols = en.decode(ids)
    rows = np.stack([cols[c] for c in COLUMNS], axis=1)
    assert len(np.unique(rows, axis=0)) == len(rows)
    ctx = Context.for_job(job)
    legal, _ = legality_mask(job.model, LayoutTable(cols), ctx)
    assert legal.all()


def test_space_rules_do_not_shadow_legality_rules() -> None:
    """A space rule with a legality rule's code would never run (legality is looked up first)."""
    from autopar.legality import RULES
    from autopar.search.enumerate import SPACE_RULES

    assert not set(SPACE_RULES) & {r.code for r in RULES}
