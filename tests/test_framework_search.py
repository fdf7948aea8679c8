"""`recommend --framework X` searches only what X's launcher runs (issue 21 item 5 / issue 24 item 3).

For every framework and a dense, a large dense and an MoE job: every returned layout renders with
the framework's export format and parses back to itself (what `recommend --framework X --export`
writes), the space's cut is said in one line, and a pinned axis X cannot launch is refused.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from autopar.errors import SearchSpaceError
from autopar.export import get_exporter, parse
from autopar.export.base import Job as ExportJob
from autopar.job import FRAMEWORK_EXPORT_FORMAT
from autopar.search.recommend import recommend
from autopar.search.space import load_space, restrict_axes

JOBS = {
    "dense-8b": dict(
        model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=64, seq_len=8192, global_batch=512
    ),
    "dense-70b": dict(
        model="llama-3.1-70b", device="h100-sxm-80gb", num_devices=256, seq_len=2048, global_batch=1024
    ),
    "moe": dict(model="mixtral-8x7b", device="h100-sxm-80gb", num_devices=64, seq_len=2048, global_batch=512),
}


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("framework", sorted(FRAMEWORK_EXPORT_FORMAT))
def test_every_returned_layout_launches_on_the_framework(framework: str, job: str) -> None:
    from autopar.cli.export import render_record

    fmt = FRAMEWORK_EXPORT_FORMAT[framework]
    res = recommend(**JOBS[job], framework=framework, top=5, progress=False)
    assert res.launcher == fmt and res.results
    for pred in res.results:
        record = pred.to_dict()
        text = render_record(record, fmt)  # what `recommend --framework X --export` writes
        layout, xjob = parse(text, fmt)
        assert layout == pred.layout
        assert xjob.framework == framework and xjob.num_devices == JOBS[job]["num_devices"]
    # the cut is one line naming the framework, and only what the launcher cannot run is cut
    assert "\n" not in res.launch_note
    limits = get_exporter(fmt).search_limits(
        ExportJob(
            **{k: JOBS[job][k] for k in ("model", "num_devices", "seq_len", "global_batch")},
            device=JOBS[job]["device"],
            framework=framework,
        )
    )
    assert bool(res.launch_note) == bool(restrict_axes(load_space("default"), limits, "x")[1])
    if res.launch_note:
        assert res.launch_note.startswith(f"--framework {framework} ({fmt} export) cannot launch")


def test_deepspeed_space_keeps_only_what_ds_config_expresses() -> None:
    limits = get_exporter("deepspeed").search_limits(
        ExportJob(model="llama-3.1-8b", num_devices=8, seq_len=4096, global_batch=64, framework="deepspeed")
    )
    space, note = restrict_axes(load_space("default"), limits, "--framework deepspeed")
    a = space.axes
    assert a.pp.values == [1] and a.cp.values == [1] and a.vpp.values == [1]
    assert a.recompute == ["none"] and a.sp == "off" and a.pipeline_ends == ["even"]
    assert note.startswith("--framework deepspeed cannot launch, so the search leaves out: pp other than 1")
    # a pinned value the launcher cannot run at all is refused, naming it
    with pytest.raises(SearchSpaceError, match="--framework deepspeed cannot launch pp=4"):
        restrict_axes(load_space("default", ["pp=4"]), limits, "--framework deepspeed")
    # a value list keeps the launchable part
    space, note = restrict_axes(load_space("default", ["recompute=none,full"]), limits, "ds")
    assert space.axes.recompute == ["none"] and "recompute=full" in note


def test_megatron_searches_sequence_parallel_where_its_tp_overlap_is_priced() -> None:
    kw = dict(model="llama-3.1-8b", num_devices=64, seq_len=8192, global_batch=512)
    h100 = recommend(**kw, device="h100-sxm-80gb", overrides=["sp=both", "tp=2,4"], progress=False)
    assert "sp=both (now auto)" in h100.launch_note
    assert all(p.layout.sp for p in h100.results)
    # on a PCIe node nothing is priced with TP overlap: both SP settings stay in the space
    pcie = recommend(**kw, device="l40s", overrides=["sp=both", "tp=2,4"], progress=False)
    assert pcie.launch_note == ""


def test_cli_says_what_it_cut_and_refuses_an_unlaunchable_pin(tmp_path) -> None:
    job = ["--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "64"]
    job += ["--seq-len", "8192", "--global-batch", "512", "--framework", "deepspeed"]
    out = tmp_path / "ds.json"
    ok = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "recommend", *job, "--export", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    lines = [ln for ln in ok.stdout.splitlines() if "cannot launch" in ln]
    assert len(lines) == 1 and "deepspeed" in lines[0]
    assert parse(out.read_text(), "deepspeed")[0].pp == 1
    bad = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "recommend", *job, "--set", "pp=4", "--export"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "cannot launch pp=4" in bad.stderr


def test_study_searches_only_what_the_framework_launches(tmp_path) -> None:
    # autopar study runs the same restriction as recommend: every trial of a deepspeed study is a
    # layout the ds_config export renders (no PP, CP or recompute), and the cut is said on stderr.
    import json

    from autopar.job import Job

    base = [sys.executable, "-m", "autopar"]
    args = ["--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "16", "--seq-len", "4096",
            "--global-batch", "64", "--framework", "deepspeed"]  # fmt: skip
    store = str(tmp_path / "ds.log")
    run = subprocess.run(
        [*base, "study", "run", "--name", "ds", *args, "--n-trials", "6", "--storage", store, "--quiet"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "deepspeed export) cannot launch, so the search leaves out: pp other than 1" in run.stderr
    show = subprocess.run(
        [*base, "study", "show", "--name", "ds", "--storage", store, "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert show.returncode == 0, show.stderr
    rep = json.loads(show.stdout)
    trials = rep.get("best") or rep.get("trials") or []
    assert trials, rep.keys()
    job = Job.from_flat(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=16, seq_len=4096,
                        global_batch=64, framework="deepspeed")  # fmt: skip
    xjob = ExportJob.from_core(job, num_layers=32)
    from autopar.layout import Layout

    fields = set(Layout.model_fields)
    for t in trials:
        lay = Layout.model_validate({k: v for k, v in t.items() if k in fields})
        assert lay.pp == 1 and lay.cp == 1 and lay.recompute == "none"
        get_exporter("deepspeed").render(lay, xjob)  # raises if ds_config cannot express it
