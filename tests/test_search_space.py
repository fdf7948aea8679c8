"""Search-space files: built-ins load, unknown keys and bad values are named, overrides, CLI exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autopar.errors import SearchSpaceError
from autopar.search.space import SearchSpace, builtin_spaces, int_candidates, load_space

JOB = [
    "--model",
    "llama-3.1-8b",
    "--device",
    "a100-80gb",
    "--num-devices",
    "16",
    "--seq-len",
    "4096",
    "--global-batch",
    "64",
]


def test_builtin_spaces_load_and_one_is_not_enumerable() -> None:
    names = builtin_spaces()
    assert {"default", "moe", "long_context", "uneven_pipeline"} <= set(names)
    spaces = {n: load_space(n) for n in names}
    assert all(isinstance(s, SearchSpace) for s in spaces.values())
    assert not spaces["uneven_pipeline"].enumerable
    assert spaces["default"].enumerable
    assert load_space(None).name == "default"
    assert len({s.fingerprint() for s in spaces.values()}) == len(spaces)


def _write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("axes:\n  tpp: {max: 4}\n", "axes.tpp: unknown key 'tpp' (allowed: tp, pp"),
        (
            "axes:\n  tp: {maxx: 4}\n",
            "axes.tp.maxx: unknown key 'maxx' (allowed: values, candidates, min, max)",
        ),
        ("axis: {}\n", "axis: unknown key 'axis'"),
        ("axes:\n  recompute: [sometimes]\n", "axes.recompute.0"),
        ("axes:\n  tp: {candidates: primes}\n", "axes.tp.candidates"),
        ("axes:\n  zero: [4]\n", "axes.zero.0"),
        ("axes:\n  tp: {values: []}\n", "axes.tp.values: values must not be empty"),
        ("axes:\n  tp: {values: [0, 2]}\n", "axes.tp.values must be >= 1"),
        (
            "axes:\n  vpp: {values: [1, 2]}\nuneven_pipeline: {max_shift: 2}\n",
            "uneven_pipeline needs axes.vpp",
        ),
        ("uneven_pipeline: {max_shift: 0}\naxes: {vpp: {values: [1]}}\n", "uneven_pipeline.max_shift"),
        ("limits: {max_layouts: 0}\n", "limits.max_layouts"),
        ("- 1\n- 2\n", "the top level must be a mapping"),
        ("axes: {tp: [1, 2\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(SearchSpaceError) as e:
        load_space(_write(tmp_path, text))
    assert needle in str(e.value)


def test_missing_file_and_unknown_name() -> None:
    with pytest.raises(SearchSpaceError, match="does not exist"):
        load_space("/nonexistent/space.yaml")
    with pytest.raises(SearchSpaceError, match="unknown search space 'nope'.*default"):
        load_space("nope")


def test_toml_file(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        'name = "t"\n[axes]\nzero = [1]\nrecompute = ["full"]\n[axes.tp]\nvalues = [2, 4]\n',
        "space.toml",
    )
    s = load_space(p)
    assert s.name == "t" and s.axes.zero == [1] and s.axes.tp.values == [2, 4]


def test_overrides() -> None:
    s = load_space(
        "default", ["tp=1,2,4", "cp.max=16", "sp=both", "recompute=full", "offload=false", "zero=1,3"]
    )
    assert s.axes.tp.values == [1, 2, 4]
    assert s.axes.cp.max == 16 and s.axes.cp.candidates == "pow2"
    assert s.axes.sp == "both"
    assert s.axes.recompute == ["full"] and s.axes.offload == [False] and s.axes.zero == [1, 3]
    assert load_space("default", ["tp=8"]).axes.tp.values == [8]  # one value pins the axis
    with pytest.raises(SearchSpaceError, match="unknown axis 'tq'"):
        load_space("default", ["tq=1"])
    with pytest.raises(SearchSpaceError, match="axes.zero.0"):
        load_space("default", ["zero=5"])
    with pytest.raises(SearchSpaceError, match="expected AXIS=VALUES"):
        load_space("default", ["tp"])
    with pytest.raises(SearchSpaceError, match="axes.tp.maxx: unknown key"):
        load_space("default", ["tp.maxx=3"])


def test_candidates_rules() -> None:
    ax = load_space("default", ["tp.max=node"]).axes.tp
    assert int_candidates(ax, base=64, node=8) == [1, 2, 4, 8]
    pp = load_space("default").axes.pp
    assert int_candidates(pp, base=126, node=8) == [1, 2, 3, 4, 6, 7, 8, 9, 14, 16, 18, 21, 32, 42, 63, 64]
    mb = load_space("default").axes.micro_batch
    assert int_candidates(mb, base=15360, node=8) == [1, 2, 3, 4, 5, 6, 8]
    allx = load_space("default", ["cp.candidates=all", "cp.max=5"]).axes.cp
    assert int_candidates(allx, base=4096, node=8) == [1, 2, 3, 4, 5]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autopar.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_bad_space_file_exit_2_names_key(tmp_path: Path) -> None:
    p = _write(tmp_path, "axes:\n  tp: {values: [1, 2]}\n  micro_bach: {values: [1]}\n")
    r = _cli("recommend", *JOB, "--space", str(p))
    assert r.returncode == 2
    assert "axes.micro_bach: unknown key" in r.stderr
    assert "Traceback" not in r.stderr
    r = _cli("recommend", *JOB, "--set", "pq=1")
    assert r.returncode == 2 and "unknown axis 'pq'" in r.stderr and "Traceback" not in r.stderr
