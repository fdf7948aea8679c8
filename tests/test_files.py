"""autopar.files: the one input layer and the one output layer, and validate's nothing-is-lost writes."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from autopar.errors import AutoparError, FileError
from autopar.files import (
    atomic_path,
    check_output,
    load_json,
    load_structured,
    parse_yaml,
    read_text,
    validation_message,
    write_text,
)


# ------------------------------------------------------------------------------------------ output
def test_write_is_atomic_keeps_mode_and_honours_umask(tmp_path: Path) -> None:
    p = tmp_path / "out.txt"
    old = os.umask(0o027)
    try:
        write_text(p, "one\n", "test output", "--out")
    finally:
        os.umask(old)
    assert p.read_text() == "one\n" and stat.S_IMODE(p.stat().st_mode) == 0o640
    p.chmod(0o600)
    write_text(p, "two\n", "test output", "--out")  # replacing a file keeps its mode
    assert p.read_text() == "two\n" and stat.S_IMODE(p.stat().st_mode) == 0o600
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"]


def test_failed_write_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "out.txt"
    p.write_text("old\n")

    def veto(tmp: Path) -> None:
        assert tmp.parent == tmp_path and tmp.read_text() == "new\n"
        raise ValueError("refused by the check")

    with pytest.raises(ValueError):
        write_text(p, "new\n", "test output", "--out", check=veto)
    with pytest.raises(KeyboardInterrupt), atomic_path(p, "test output", "--out") as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert p.read_text() == "old\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"]


def test_symlink_is_followed_to_its_target(tmp_path: Path) -> None:
    target = tmp_path / "real.txt"
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to("real.txt")
    assert write_text(link, "new\n", "test output", "--out") == target
    assert link.is_symlink() and target.read_text() == "new\n"


@pytest.mark.parametrize(
    "kind", ["directory", "fifo", "chardev", "missing-parent", "link-to-dir", "parent-is-file"]
)
def test_non_regular_destinations_are_refused(tmp_path: Path, kind: str) -> None:
    p = tmp_path / "dest"
    if kind == "directory":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "chardev":
        try:
            os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            p.symlink_to("/dev/null")
    elif kind == "missing-parent":
        p = tmp_path / "missing" / "dest"
    elif kind == "link-to-dir":
        (tmp_path / "d").mkdir()
        p.symlink_to("d")
    else:
        (tmp_path / "afile").write_text("x")
        p = tmp_path / "afile" / "dest"
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(FileError) as exc:
        check_output(p, "test output", "--out")
    with pytest.raises(FileError):
        write_text(p, "x", "test output", "--out")
    assert exc.value.hint and "--out" in exc.value.message
    assert sorted(os.listdir(tmp_path)) == before
    if kind == "missing-parent":
        assert "mkdir -p" in exc.value.hint and not (tmp_path / "missing").exists()


# ------------------------------------------------------------------------------------------- input
@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x00\x01binary", "binary file"),
        (b"caf\xe9", "not UTF-8"),
        (b"x" * 2048, "limit"),
    ],
)
def test_read_text_refuses_binary_undecodable_and_large(tmp_path: Path, content: bytes, words: str) -> None:
    p = tmp_path / "in.json"
    p.write_bytes(content)
    with pytest.raises(FileError, match=words):
        read_text(p, "test input", "pass a text file", max_bytes=1024)


def test_read_text_refuses_non_regular_files_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "d").mkdir()
    for name, words in (("fifo", "FIFO"), ("d", "directory"), ("missing", "does not exist")):
        with pytest.raises(FileError, match=words):
            read_text(tmp_path / name, "test input", "pass a file")


def test_repeated_keys_and_nan_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"a": 1, "b": {"c": 1, "c": 2}}')
    with pytest.raises(FileError, match="'c' appears twice"):
        load_json(tmp_path / "a.json", "test input", "fix it")
    (tmp_path / "n.json").write_text('{"a": NaN}')
    with pytest.raises(FileError, match="NaN"):
        load_json(tmp_path / "n.json", "test input", "fix it")
    with pytest.raises(FileError, match="'x' appears twice"):
        parse_yaml("a:\n  x: 1\n  x: 2\n", "test yaml")
    assert parse_yaml("a: &anchor {x: 1}\nb:\n  <<: *anchor\n  y: 2\n", "merge") == {
        "a": {"x": 1},
        "b": {"x": 1, "y": 2},
    }
    (tmp_path / "t.toml").write_text("a = 1\na = 2\n")
    with pytest.raises(FileError, match="TOML"):
        load_structured(tmp_path / "t.toml", "test input", "fix it")


def test_validation_message_names_file_field_and_allowed_keys() -> None:
    from pydantic import ValidationError

    from autopar.coefficients import Calibration

    with pytest.raises(ValidationError) as exc:
        Calibration.model_validate({"devices": {"x": {"gemm": {"bf16": 0.5}, "atention": 0.3}}})
    msg = validation_message(exc.value, "calibration file c.yaml", Calibration)
    assert msg.startswith("calibration file c.yaml: unknown key 'devices.x.atention'")
    assert "allowed keys:" in msg and "attention" in msg and "gemm_half_dim" in msg


def test_calibration_ranges_and_required_blocks(tmp_path: Path) -> None:
    from autopar.coefficients import load_calibration

    base = (
        Path(__file__).resolve().parent.parent / "cost_models" / "calibration" / "default.yaml"
    ).read_text()
    good = tmp_path / "good.yaml"
    good.write_text(base)
    assert 0 < load_calibration(good).global_value("tp_overlap") <= 1

    def sub(key: str, value: str) -> str:  # the first `key: number` of the shipped file, replaced
        return re.sub(rf"(\b{key}: )[-0-9.e]+", rf"\g<1>{value}", base, count=1)

    for bad, words in (
        (sub("tp_overlap", "1.7"), "global.tp_overlap"),
        (sub("bf16", "5.0"), "gemm.bf16"),
        (sub("attention_scale", "-0.314"), "attention_scale"),
        (sub("bf16", ".nan"), "gemm.bf16"),
        (base.replace("global:", "globals:"), "required block 'global' is missing"),
        (base + "transfer: {}\n", "'transfer' appears twice"),
    ):
        p = tmp_path / f"bad{len(list(tmp_path.iterdir()))}.yaml"
        p.write_text(bad)
        with pytest.raises(AutoparError, match=words):
            load_calibration(p)


# ---------------------------------------------------------------------------------------- validate
def _layouts(tmp_path: Path, layouts: list[dict[str, Any]]) -> Path:
    repo = Path(__file__).resolve().parent.parent
    model = tmp_path / "tiny.json"
    model.write_text(
        json.dumps(
            {"name": "tiny", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16}
            | {"ffn_hidden": 128, "vocab": 128}
        )
    )
    job = {
        "model": str(model),
        "device": str(repo / "cost_models" / "calibration" / "cpu-gloo-w4.device.yaml"),
        "seq_len": 16,
        "global_batch": 8,
    }
    p = tmp_path / "layouts.json"
    p.write_text(json.dumps({"job": job, "layouts": layouts}))
    return p


def test_validate_saves_each_measurement_as_it_finishes(tmp_path: Path, monkeypatch, capsys) -> None:
    """A crash after the first launch loses nothing already measured; grad_accum is derived."""
    from autopar.cli.main import main
    from autopar.runner import launch

    src = _layouts(tmp_path, [{"dp": 4, "zero": 3}, {"dp": 4, "zero": 2}, {"dp": 2, "tp": 2, "zero": 1}])
    out = tmp_path / "out.json"
    seen: list[Any] = []

    def fake(lays: list[Any], *a: Any, **k: Any) -> list[dict[str, Any]]:
        seen.append(json.loads(out.read_text())["records"] if out.exists() else None)
        if len(seen) == 3:
            raise KeyboardInterrupt  # the machine goes away during the third launch
        assert all(lay.grad_accum == 8 // (lay.micro_batch * lay.dp) for lay in lays)
        return [
            {"status": "ok", "median_step_time_s": 0.5, "step_times_s": [0.5], "peak_memory_bytes": [1 << 20]}
            for _ in lays
        ]

    monkeypatch.setattr(launch, "run_layouts", fake)
    rc = main(["validate", "--layouts", str(src), "--json", str(out), "--batch-size", "1", "--no-progress"])
    assert rc == 130
    assert seen[0] is None and len(seen[1]) == 1  # the first record was on disk before launch 2
    saved = json.loads(out.read_text())
    assert saved["complete"] is False and [r["status"] for r in saved["records"]] == ["ok", "ok"]
    assert [r["layout"]["grad_accum"] for r in saved["records"]] == [2, 2]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["layouts.json", "out.json", "tiny.json"]
    capsys.readouterr()


def test_validate_refuses_a_bad_output_before_any_run(tmp_path: Path, monkeypatch, capsys) -> None:
    from autopar.cli.main import main
    from autopar.runner import launch

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("launched")

    monkeypatch.setattr(launch, "run_layouts", boom)
    src = _layouts(tmp_path, [{"dp": 4, "zero": 3}])
    assert main(["validate", "--layouts", str(src), "--json", str(tmp_path / "no" / "out.json")]) == 2
    err = capsys.readouterr().err
    assert "mkdir -p" in err and len(err.splitlines()) == 1
