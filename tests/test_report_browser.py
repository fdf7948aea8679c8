"""Each ``--html`` report, opened in a real browser (headless Chromium): it renders (the screenshot is
not blank), the key numbers are in the DOM, and the file asks for nothing from the network."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from autopar.cli.main import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)",
)

RECOMMEND = [
    "recommend",
    "--model",
    "llama-3.1-70b",
    "--device",
    "h100-sxm-80gb",
    "--num-devices",
    "64",
    "--seq-len",
    "8192",
    "--global-batch",
    "128",
]
SERVE = ["serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "8"]
SERVE += ["--isl", "1024", "--osl", "256"]
COMPARE = ["compare", "--model", "llama-3.1-8b", "--devices", "h100-sxm-80gb,a100-80gb", "--num-devices", "8"]
COMPARE += ["--workload", "training", "--seq-len", "4096", "--global-batch", "64"]


class _Refs(HTMLParser):
    """Every attribute value and every <style>/<script> body: where a fetch could hide."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[str] = []
        self.style: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [v or "" for _, v in attrs]
        self._in = tag if tag in ("style", "script") else None

    def handle_data(self, data: str) -> None:
        if self._in:
            self.style.append(data)


def assert_offline(text: str) -> None:
    p = _Refs()
    p.feed(text)
    assert "script" not in p.tags and "link" not in p.tags and "iframe" not in p.tags
    for v in p.attrs + p.style:
        low = v.lower()
        assert not re.search(r"(https?|ftp|file):|^\s*//", low), v
        assert "url(" not in low.replace("url(#", ""), v
        assert "@import" not in low and "@font-face" not in low, v


def _run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _chromium(html: Path, tmp: Path) -> tuple[np.ndarray, str]:
    assert CHROMIUM is not None
    base = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp / 'profile'}",
        "--hide-scrollbars",
        "--window-size=1280,2400",
    ]
    png = tmp / "shot.png"
    subprocess.run(
        [*base, f"--screenshot={png}", html.as_uri()], check=True, capture_output=True, timeout=120
    )
    dom = subprocess.run(
        [*base, "--dump-dom", html.as_uri()], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    from matplotlib.image import imread

    return imread(str(png)), dom


def assert_not_blank(img: np.ndarray) -> None:
    rgb = img[..., :3]
    assert rgb.shape[0] > 500 and rgb.shape[1] > 500
    assert float(rgb.std()) > 0.05, "the screenshot is (nearly) one colour"
    colours = np.unique((rgb.reshape(-1, 3)[::7] * 255).astype(np.uint8), axis=0)
    assert len(colours) > 50, f"only {len(colours)} distinct colours: the plots did not render"


@needs_chromium
def test_recommend_report_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    d = _run_cli([*RECOMMEND, "--html", str(out)], capsys)
    text = out.read_text()
    assert_offline(text)
    img, dom = _chromium(out, tmp_path)
    assert_not_blank(img)
    w = d["results"][0]
    assert f"{w['tokens_per_s_per_device']:,.0f}" in dom
    assert f"{w['mfu']:.1%} (bf16 peak)" in dom
    assert f"{w['memory_gib_per_device']:.1f} / {w['memory_capacity_gib']:.0f} GiB" in dom
    for section in ("Top 5 by throughput", "Throughput against memory", "Where the step time goes"):
        assert section in dom
    assert "What fills memory" in dom and "--tensor-model-parallel-size" in dom
    assert dom.count("<svg") >= 4  # Pareto front, time, communication and memory breakdowns


@needs_chromium
def test_serve_report_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.html"
    d = _run_cli([*SERVE, "--html", str(out)], capsys)
    assert_offline(out.read_text())
    img, dom = _chromium(out, tmp_path)
    assert_not_blank(img)
    w = d["results"][0]
    assert w["short"] in dom and f"{w['output_tokens_per_s_per_device']:,.0f}" in dom
    assert f"{w['ttft_ms']:,.1f} ms" in dom
    assert dom.count("<svg") >= 3


@needs_chromium
def test_compare_report_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.html"
    d = _run_cli([*COMPARE, "--html", str(out)], capsys)
    assert_offline(out.read_text())
    img, dom = _chromium(out, tmp_path)
    assert_not_blank(img)
    win = next(c for c in d["cells"] if c["winner"])
    assert f"{win['tokens_per_s_per_device']:,.0f}" in dom and f"{win['mfu']:.1%}" in dom
    assert dom.count("<svg") >= 4


@needs_chromium
def test_sweep_report_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(
        "name: tiny\nmodels: [llama-3.1-8b]\ndevices: [h100-sxm-80gb]\nnum_devices: [8, 16]\n"
        "seq_len: [4096]\nglobal_batch: [64]\ntop: 1\n"
    )
    out = tmp_path / "sw.html"
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "t.csv"), "--html", str(out)]) == 0
    capsys.readouterr()
    assert_offline(out.read_text())
    img, dom = _chromium(out, tmp_path)
    assert_not_blank(img)
    import csv

    with (tmp_path / "t.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for r in rows:
        assert r["layout"] in dom and f"{float(r['tokens_per_s_per_device']):,.0f}" in dom
    assert "Scaling with the number of devices" in dom and dom.count("<svg") >= 2


@needs_chromium
def test_study_show_report_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s.log")
    job = ["--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "16"]
    job += ["--seq-len", "4096", "--global-batch", "64"]
    assert main(["study", "run", "--name", "s", "--storage", store, *job, "--n-trials", "15"]) == 0
    capsys.readouterr()
    out = tmp_path / "st.html"
    d = _run_cli(["study", "show", "--name", "s", "--storage", store, "--html", str(out)], capsys)
    assert_offline(out.read_text())
    img, dom = _chromium(out, tmp_path)
    assert_not_blank(img)
    assert d["best"][0]["layout"] in dom and f"{d['best'][0]['tokens_per_s_per_device']:,.0f}" in dom
    assert "History" in dom and dom.count("<svg") >= 2


@needs_chromium
def test_validate_report_in_chromium(tmp_path: Path) -> None:
    """The validate report of the CPU validation study's measurements (no runs needed here)."""
    from autopar.calibration.validate import summarize
    from autopar.cli.report import validate_report

    src = json.loads((Path(__file__).parent.parent / "studies/results/cpu_validation.json").read_text())
    res = {
        "job": {"model": "cpu-validation-llama", "cluster": {"device": "cpu", "num_devices": 4}},
        "summary": summarize(src["records"]),
        "records": src["records"],
    }
    out = tmp_path / "v.html"
    validate_report(res).write(out)
    assert_offline(out.read_text())
    img, dom = _chromium(out, tmp_path)
    assert_not_blank(img)
    assert f"{res['summary']['step_time_mape']:.1%}" in dom and res["summary"]["measured_best"] in dom
    assert dom.count("<svg") == 2
