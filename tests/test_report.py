"""Reports, plots and result views without a browser: escaping, self-containment, the --html
destination rules, near-duplicate collapsing, MFU's basis, DataFrames and notebook tables."""

from __future__ import annotations

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
