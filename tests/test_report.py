"""Reports, plots and result views without a browser: escaping, self-containment, the --html
destination rules, near-duplicate collapsing, MFU's basis, DataFrames and notebook tables."""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path

import pytest

from autopar import plots
from autopar.cli.main import main
from autopar.errors import AutoparError
from autopar.report import Report, table_html

SMALL = ["--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "8"]
SMALL += ["--seq-len", "4096", "--global-batch", "8"]
# tp=8 leaves no data parallelism: ZeRO 1 and 2 shard nothing, so they change no figure
NO_DP = ["--set", "zero=0,1,2,3", "--set", "tp=8", "--set", "pp=1", "--set", "cp=1"]


def test_report_escapes_every_string() -> None:
    evil = '<script>alert("x")</script>&'
    rep = Report(evil, evil)
    rep.winner(evil, {evil: evil}, evil)
    rep.table([evil], [[evil]])
    rep.bullets([evil], evil)
    rep.code(evil, evil)
    text = rep.html()
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert table_html(["a"], [["<b>"]]).count("&lt;b&gt;") == 1


def test_plot_svg_is_inline_and_self_contained() -> None:
    svg = plots.pareto(
        [{"x": 1.0, "y": 2.0, "short": "a"}, {"x": 2.0, "y": 3.0, "short": "b"}],
        {"x": 2.0, "y": 3.0, "short": "$5 <b> -->"},
        ("y", "tokens/s ($2/h)"),
        [("x", "memory (GiB)")],
    )
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    for bad in ("http", "<!DOCTYPE", "<?xml", "<!--", "<b>"):
        assert bad not in svg
    other = plots.lines({"s": [(1, 1), (2, 2)]}, xlabel="x", ylabel="y", title="t")
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    assert ids and not ids & set(re.findall(r'\bid="([^"]+)"', other))


def test_recommend_html_writes_a_report_with_what_the_json_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.html"
    assert main(["recommend", *SMALL, "--html", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    text = out.read_text()
    w = d["results"][0]
    assert f"{w['tokens_per_s_per_device']:,.0f}" in text and w["mfu_basis"] == "bf16 dense peak"
    assert text.count("<svg") >= 4 and "http" not in text
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left


@pytest.mark.parametrize("kind", ["directory", "missing parent"])
def test_bad_html_destination_is_exit_2_before_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    dest = tmp_path if kind == "directory" else tmp_path / "nope" / "r.html"
    assert main(["recommend", *SMALL, "--html", str(dest)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1 and "--html" in cap.err
    assert list(tmp_path.iterdir()) == []


def test_near_duplicates_collapse_into_also(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", *SMALL, *NO_DP, "--top", "4", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["results"]
    assert len(res) == 4
    assert res[0]["dp"] == 1 and res[0]["also"] == {"zero": [1, 2]}
    assert main(["recommend", *SMALL, *NO_DP, "--top", "4"]) == 0
    assert "also (same figures)" in (table := capsys.readouterr().out) and "zero=1,2" in table
    figures = [(r["step_time_s"], r["memory_gib_per_device"], r["energy_j_per_step"]) for r in res]
    assert len(set(figures)) == len(figures)  # no two rows are the same layout in effect
    from autopar.prediction import predict

    for z in res[0]["also"]["zero"]:  # the collapsed ones really have the same figures
        p = predict(
            model="llama-3.1-8b",
            device="h100-sxm-80gb",
            num_devices=8,
            seq_len=4096,
            global_batch=8,
            **{k: res[0][k] for k in ("tp", "pp", "cp", "micro_batch", "recompute", "offload", "sp")},
            zero=z,
        )
        assert p.step_time_s == pytest.approx(res[0]["step_time_s"], rel=1e-9)
        assert p.memory_gib_per_device == pytest.approx(res[0]["memory_gib_per_device"], rel=1e-9)


def test_mfu_states_its_basis(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", *SMALL, "--tp", "8", "--precision", "fp8"]) == 0
    assert "(fp8 peak)" in capsys.readouterr().out
    assert main(["predict", *SMALL, "--tp", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mfu_basis"] == "bf16 dense peak"


def test_search_result_frame_and_notebook_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import autopar

    res = autopar.recommend(
        model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, seq_len=4096, global_batch=8, top=3
    )
    html = res._repr_html_()
    assert html.count("<tr") == 4 and res.results[0].layout.short() in html
    df = res.to_frame()
    assert len(df) == 3 and df["tokens_per_s_per_device"].iloc[0] == res.results[0].tokens_per_s_per_device
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(AutoparError, match=r"pip install 'autopar\[frame\]'"):
        res.to_frame()


SERVE = ["serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "8"]
SERVE += ["--isl", "1024", "--osl", "256"]
COMPARE = ["compare", "--model", "llama-3.1-8b", "--devices", "h100-sxm-80gb,a100-80gb", "--num-devices", "8"]


def _json_of(args: list[str], capsys: pytest.CaptureFixture[str], path: Path) -> dict:
    assert main([*args, "--json"]) == 0
    text = capsys.readouterr().out
    path.write_text(text)
    return json.loads(text)


def _export(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    rc = main(["export", "--from-json", str(path), *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_export_reads_every_commands_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # recommend and predict: the winner / the record
    rec = _json_of(["recommend", *SMALL], capsys, tmp_path / "r.json")
    rc, out, _ = _export(tmp_path / "r.json", capsys, "--format", "env")
    assert rc == 0 and f"AUTOPAR_TP={rec['results'][0]['tp']}" in out
    # serve: the best aggregated layout as vLLM engines
    sv = _json_of(SERVE, capsys, tmp_path / "s.json")
    best = sv["results"][0]
    rc, out, _ = _export(tmp_path / "s.json", capsys)
    assert rc == 0 and "vllm serve" in out and f"--tensor-parallel-size {best['tp']}" in out
    assert f"--max-num-seqs {round(best['concurrency_per_instance'] / (best.get('adp') or 1))}" in out
    dis = next((i for i, r in enumerate(sv["results"]) if r["mode"] != "aggregated"), None)
    if dis is not None:
        rc, out, err = _export(tmp_path / "s.json", capsys, "--record", str(dis))
        assert rc == 2 and out == "" and "disaggregated" in err and len(err.strip().splitlines()) == 1
    # compare: the winning cell first
    cmp = _json_of(
        [*COMPARE, "--workload", "training", "--seq-len", "4096", "--global-batch", "64"],
        capsys,
        tmp_path / "c.json",
    )
    win = next(c for c in cmp["cells"] if c["winner"])
    rc, out, _ = _export(tmp_path / "c.json", capsys, "--format", "env")
    assert rc == 0 and f"AUTOPAR_DEVICE={win['device']}" in out
    assert f"# autopar layout: {win['layout']}" in out
    # study show: the best trial, or the n-th
    store = str(tmp_path / "st.log")
    job = ["--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "16"]
    job += ["--seq-len", "4096", "--global-batch", "64"]
    assert main(["study", "run", "--name", "s", "--storage", store, *job, "--n-trials", "12", "--json"]) == 0
    capsys.readouterr()
    st = _json_of(["study", "show", "--name", "s", "--storage", store], capsys, tmp_path / "st.json")
    rc, out, _ = _export(tmp_path / "st.json", capsys, "--format", "env", "--record", "1")
    assert rc == 0 and f"# autopar layout: {st['best'][1]['layout']}" in out
    # sweep: the points that found a layout
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(
        "name: t\nmodels: [llama-3.1-8b]\ndevices: [h100-sxm-80gb]\nnum_devices: [8]\nseq_len: [4096]\n"
        "global_batch: [64]\ntop: 1\n"
    )
    sw = _json_of(["sweep", str(sweep), "--out", str(tmp_path / "t.csv")], capsys, tmp_path / "sw.json")
    rc, out, _ = _export(tmp_path / "sw.json", capsys, "--format", "env")
    assert rc == 0 and f"# autopar layout: {sw['rows'][0]['layout']}" in out


def test_export_of_a_json_without_a_layout_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for doc in ({"schema_version": 1, "cells": []}, {"rows": [{"status": "infeasible"}]}, {"best": []}):
        (tmp_path / "e.json").write_text(json.dumps(doc))
        rc, out, err = _export(tmp_path / "e.json", capsys)
        assert rc == 2 and out == "" and "no exportable layout" in err and len(err.strip().splitlines()) == 1


def test_compare_requires_the_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*COMPARE, "--seq-len", "4096", "--global-batch", "128"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "--workload" in cap.err and len(cap.err.strip().splitlines()) == 1


def test_serving_and_compare_frames_and_tables(capsys: pytest.CaptureFixture[str]) -> None:
    import autopar

    sv = autopar.serve(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, isl=1024, osl=256, top=4)
    df = sv.to_frame()
    assert (
        len(df) == 4
        and df["output_tokens_per_s_per_device"].iloc[0] == sv.results[0]["output_tokens_per_s_per_device"]
    )
    assert "time_ms_compute" in df.columns and sv.results[0]["short"] in sv._repr_html_()
    cmp = autopar.compare(
        model="llama-3.1-8b",
        devices=["h100-sxm-80gb", "a100-80gb"],
        num_devices=8,
        workload="training",
        seq_len=4096,
        global_batch=64,
    )
    cf = cmp.to_frame()
    assert len(cf) == 2 and set(cf["device"]) == {"h100-sxm-80gb", "a100-80gb"}
    assert cmp._repr_html_().count("<tr") == 3


def test_help_is_plain_text_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    from autopar.cli.main import build_parser

    parser, _ = build_parser()
    top = parser.format_help()
    assert "``" not in top and ":func:" not in top and "examples:" in top
    for cmd in ("recommend", "serve", "compare", "sweep", "validate", "predict", "export", "calibrate"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert "examples:\n  autopar " in out and "--quiet" in out, cmd


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts(shell: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "recommend" in script and "--html" in script and "--global-batch" in script
    if shell == "bash":
        import shutil
        import subprocess

        if shutil.which("bash") is None:
            pytest.skip("bash is not installed")
        (tmp_path / "c.bash").write_text(script)
        probe = (
            f"source {tmp_path / 'c.bash'}; COMP_WORDS=(autopar recommend --ht); COMP_CWORD=2; "
            '_shtab_autopar autopar --ht recommend; echo "${COMPREPLY[@]}"'
        )
        r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
        assert r.stdout.split() == ["--html"], r.stderr


@pytest.mark.slow  # a study run: 30-60 s on 2 cores (.ci/run's slow step)
def test_accuracy_study_writes_its_plot(tmp_path: Path) -> None:
    import subprocess

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "acc.svg"
    r = subprocess.run(
        [sys.executable, str(root / "studies" / "accuracy.py"), "--no-loso", "--plot", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert text.startswith("<?xml") and "<svg" in text and f"wrote {out}" in r.stdout
    n = int(re.search(r"n=(\d+)  MAPE", r.stdout).group(1))  # type: ignore[union-attr]
    assert text.count("<use") >= n  # one marker per predicted row (and the legend's)


@pytest.mark.parametrize(
    "args",
    [
        SERVE,
        [*COMPARE, "--workload", "training", "--seq-len", "4096", "--global-batch", "64"],
        ["study", "show", "--name", "nope"],
        ["validate", "--layouts", "nope.json"],
    ],
    ids=["serve", "compare", "study-show", "validate"],
)
def test_every_html_destination_is_checked_first(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    assert main([*args, "--html", "adir"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "--html" in cap.err and len(cap.err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"] and not any((tmp_path / "adir").iterdir())


@pytest.mark.parametrize("layout", [dict(tp=8), dict(tp=2, pp=2, cp=2), dict(tp=1, zero=3)])
def test_each_collectives_exposed_and_hidden_sum_to_the_totals(layout: dict) -> None:
    from autopar.prediction import predict

    p = predict(
        model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, seq_len=4096, global_batch=8, **layout
    )
    cb = p.comm_breakdown
    assert set(cb) == {"tp", "cp", "ep", "pp", "dp"}
    assert sum(v["exposed"] for v in cb.values()) == pytest.approx(p.comm_exposed_s, rel=1e-9, abs=1e-15)
    total = sum(v["exposed"] + v["hidden"] for v in cb.values())
    assert total == pytest.approx(p.comm_total_s, rel=1e-9, abs=1e-15)
    if layout.get("tp", 1) == 1:
        assert cb["tp"] == {"exposed": 0.0, "hidden": 0.0}
    else:
        assert cb["tp"]["exposed"] + cb["tp"]["hidden"] > 0


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_shows_on_a_terminal_and_never_under_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    from autopar import progress

    for quiet, shown in ((False, True), (True, False)):
        err = _Tty()
        monkeypatch.setattr(sys, "stderr", err)
        progress.set_quiet(quiet)
        try:
            with progress.Bar(3, "scoring things", delay_s=0.0) as bar:
                for _ in range(3):
                    bar.advance(1, "a note")
        finally:
            progress.set_quiet(False)
        assert ("scoring things" in err.getvalue()) is shown
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pipe: never a bar
    assert not progress.enabled()


def test_quiet_is_accepted_by_every_command() -> None:
    from autopar.cli.main import build_parser

    parser, _ = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    leaves = []
    for name, p in sub.choices.items():
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        leaves += [(f"{name} {n}", q) for s in subs for n, q in s.choices.items()] if subs else [(name, p)]
    missing = [n for n, p in leaves if "--quiet" not in p._option_string_actions]
    assert len(leaves) >= 12 and not missing, missing


def test_spinner_appears_only_after_its_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from autopar import progress

    for wait, shown in ((0.0, False), (0.6, True)):
        err = _Tty()
        monkeypatch.setattr(sys, "stderr", err)
        with progress.Spinner("searching things", delay_s=0.2):
            time.sleep(wait)
        assert ("searching things" in err.getvalue()) is shown
