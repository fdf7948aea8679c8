"""`autopar export` wiring: from predict/recommend JSON, from flags, errors, atomic output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

JOB = [
    "--model",
    "llama-3.1-8b",
    "--device",
    "h100-sxm-80gb",
    "--num-devices",
    "16",
    "--seq-len",
    "4096",
    "--global-batch",
    "64",
]


def _cli(*args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autopar.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        input=stdin,
        timeout=60,
    )


def test_export_from_predict_json_round_trips(tmp_path: Path) -> None:
    from autopar.export import parse

    pred = _cli("predict", *JOB, "--tp", "2", "--pp", "2", "--json")
    assert pred.returncode == 0, pred.stderr
    src = tmp_path / "p.json"
    src.write_text(pred.stdout)
    out = tmp_path / "args.sh"
    r = _cli("export", "--format", "megatron", "--from-json", str(src), "--out", str(out))
    assert r.returncode == 0, r.stderr
    layout, job = parse(out.read_text(), "megatron")
    rec = json.loads(pred.stdout)
    assert (layout.tp, layout.pp, layout.dp, layout.micro_batch) == (
        rec["tp"],
        rec["pp"],
        rec["dp"],
        rec["micro_batch"],
    )
    assert job.num_layers == 32 and job.num_devices == 16


def test_export_from_flags_and_stdin() -> None:
    r = _cli("export", "--format", "env", *JOB, "--tp", "4")
    assert r.returncode == 0 and "export AUTOPAR_TP=4" in r.stdout
    pred = _cli("predict", *JOB, "--json").stdout
    r = _cli("export", "--format", "torchrun", "--from-json", "-", stdin=pred)
    assert r.returncode == 0 and "torch.distributed.run" in r.stdout


def test_unexpressible_feature_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "ds.json"
    r = _cli("export", "--format", "deepspeed", *JOB, "--pp", "2", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2 and "pipeline" in r.stderr and "deepspeed" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bad_json_and_missing_format(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{oops")
    r = _cli("export", "--format", "megatron", "--from-json", str(bad))
    assert r.returncode == 2 and "x.json" in r.stderr and "Traceback" not in r.stderr
    r = _cli("export", "--from-json", str(bad))  # no --format: the job's framework picks it
    assert r.returncode == 2 and "x.json" in r.stderr
    r = _cli("export", "--format", "nope", *JOB)
    assert r.returncode == 2 and "nope" in r.stderr


def test_recommend_export_writes_the_winner(tmp_path: Path) -> None:
    from autopar.export import parse

    out = tmp_path / "winner.toml"
    r = _cli("recommend", *JOB, "--set", "zero=2,3", "--export", "torchtitan", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["results"][0]
    layout, job = parse(out.read_text(), "torchtitan")
    assert (layout.tp, layout.pp, layout.dp, layout.zero) == (
        best["tp"],
        best["pp"],
        best["dp"],
        best["zero"],
    )
    r = _cli(
        "recommend", *JOB, "--set", "zero=1", "--export", "torchtitan", "--out", str(tmp_path / "x.toml")
    )
    assert r.returncode == 2 and "torchtitan" in r.stderr and not (tmp_path / "x.toml").exists()


def test_recommend_export_defaults_to_the_frameworks_launcher(tmp_path: Path) -> None:
    out = tmp_path / "plan.sh"
    r = _cli("recommend", *JOB, "--framework", "torchtitan", "--export", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "autopar-export" in text and "-m torchtitan.train" in text  # torchtitan 0.3's command


def test_recommend_refuses_an_unknown_format_before_searching(tmp_path: Path) -> None:
    r = _cli("recommend", *JOB, "--export", "bogus", cwd=tmp_path)
    assert r.returncode == 2 and "unknown export format 'bogus'" in r.stderr and "megatron" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir()) and not r.stdout


def test_launcher_version_picks_the_release_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    from autopar.export import parse

    flags = [*JOB, "--zero", "3", "--dp", "16", "--micro-batch", "1", "--format", "torchtitan"]
    out = tmp_path / "titan.sh"
    r = _cli("export", *flags, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "-m torchtitan.train" in out.read_text() and "--module llama3 --config llama3_8b" in " ".join(
        out.read_text().replace("\\\n", " ").split()
    )
    old = tmp_path / "titan.toml"
    r = _cli("export", *flags, "--launcher-version", "0.2", "--out", str(old))
    assert r.returncode == 0, r.stderr
    assert "[parallelism]" in old.read_text()
    assert parse(old.read_text(), "torchtitan") == parse(out.read_text(), "torchtitan")
    bad = tmp_path / "bad.sh"
    r = _cli("export", *flags, "--launcher-version", "0.1", "--out", str(bad))
    assert r.returncode == 2 and not bad.exists()
    assert len(r.stderr.strip().splitlines()) == 1 and "0.3.0, 0.2.2" in r.stderr
