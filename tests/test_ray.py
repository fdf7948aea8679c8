"""Ray for real: one local instance for the session; results identical with and without Ray."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
if importlib.util.find_spec("ray") is None:  # found, not imported: collection stays fast
    pytest.skip("ray is not installed", allow_module_level=True)

from autopar.search import ray_backend  # noqa: E402
from autopar.search.recommend import recommend  # noqa: E402
from autopar.search.sweep import SweepFile, read_table, run_sweep, write_table  # noqa: E402

pytestmark = pytest.mark.slow

_JOB_ARGS = [
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

MOE = dict(model="qwen3-30b-a3b", device="h100-sxm-80gb", num_devices=32, seq_len=4096, global_batch=64)


@pytest.fixture(scope="session")
def ray_local():
    started = ray_backend.connect("local")
    import ray

    yield ray
    if started:
        ray_backend.shutdown()


def test_local_instance_is_small(ray_local) -> None:
    res = ray_local.cluster_resources()
    assert res["CPU"] == ray_backend.local_cpus()
    assert res.get("object_store_memory", 0) <= 1.1 * ray_backend.OBJECT_STORE_BYTES


def test_recommend_on_ray_is_identical(ray_local) -> None:
    a = recommend(
        **MOE, top=5, overrides=["precision=bf16,fp8"], objective="throughput,memory", progress=False
    )
    b = recommend(
        **MOE,
        top=5,
        overrides=["precision=bf16,fp8"],
        objective="throughput,memory",
        progress=False,
        ray="local",
    )
    assert b.backend == "ray" and a.backend == "numpy"
    assert [p.to_dict() for p in a.results] == [p.to_dict() for p in b.results]
    assert [p.to_dict() for p in a.pareto] == [p.to_dict() for p in b.pareto]
    assert (a.layouts_enumerated, a.layouts_feasible, a.infeasible_by_reason) == (
        b.layouts_enumerated,
        b.layouts_feasible,
        b.infeasible_by_reason,
    )


def test_sweep_on_ray_is_identical(ray_local, tmp_path: Path) -> None:
    sw = SweepFile(
        name="t",
        models=["llama-3.1-8b", "qwen3-30b-a3b"],
        devices=["h100-sxm-80gb"],
        num_devices=[16, 12],
        seq_len=[4096],
        global_batch=[64, 32],
    )
    local = run_sweep(sw)
    remote = run_sweep(sw, ray="local")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]  # noqa: E731
    assert strip(local) == strip(remote)
    assert {r["status"] for r in local} == {"ok", "error"}  # 12 H100s do not fill nodes of 8
    assert "whole nodes" in next(r["message"] for r in local if r["status"] == "error")
    path = write_table(remote, tmp_path / "t.csv")
    rows = read_table(path)
    assert len(rows) == 8 and rows[0]["model"] == "llama-3.1-8b" and rows[0]["status"] == "ok"


def test_cli_connects_to_an_existing_cluster(ray_local) -> None:
    """``--ray ADDRESS``: a separate process joins the session's instance instead of starting one."""
    addr = ray_local.get_runtime_context().gcs_address
    args = [
        "recommend",
        *_JOB_ARGS,
        "--json",
        "--top",
        "2",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "autopar.cli", *args, "--ray", addr],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    plain = subprocess.run(
        [sys.executable, "-m", "autopar.cli", *args], capture_output=True, text=True, timeout=120
    )
    a, b = json.loads(r.stdout), json.loads(plain.stdout)
    assert a["results"] == b["results"] and a["infeasible_by_reason"] == b["infeasible_by_reason"]


def test_cli_sweep(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(
        "name: s\nmodels: [llama-3.1-8b]\ndevices: [a100-80gb]\nnum_devices: [8, 16]\nseq_len: [4096]\n"
        "global_batch: [32]\n"
    )
    out = tmp_path / "s.csv"
    r = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "sweep", str(f), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 points (2 ok" in r.stdout and out.is_file()
    assert [row["num_devices"] for row in read_table(out)] == ["8", "16"]
    f.write_text("name: s\nmodels: [llama-3.1-8b]\ndevice: [a100-80gb]\n")
    r = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "sweep", str(f)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "device: unknown key" in r.stderr and "Traceback" not in r.stderr


def _listeners(pid: int) -> set[tuple[str, int, str]]:
    """(ip, port, process name) of the TCP/UDP listening sockets of ``pid`` and its descendants."""
    psutil = pytest.importorskip("psutil")
    try:
        root = psutil.Process(pid)
        tree = {root.pid: root.name()} | {c.pid: c.name() for c in root.children(recursive=True)}
    except psutil.Error:
        return set()
    out = set()
    for c in psutil.net_connections(kind="inet"):
        if c.pid in tree and (c.status == psutil.CONN_LISTEN or (c.type == 2 and c.laddr)):
            out.add((c.laddr.ip, c.laddr.port, tree[c.pid]))
    return out


def _loopback(ip: str) -> bool:
    import ipaddress

    a = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(a, "ipv4_mapped", None)
    return a.is_loopback or (mapped is not None and mapped.is_loopback)


def test_embedded_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    """``recommend --ray`` (embedded instance): every socket its GCS, raylet, workers and driver
    listen on is a loopback address (watched with psutil while the command runs), and the JSON says
    how Ray ran."""
    import time

    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "autopar.cli", "recommend", *_JOB_ARGS, "--json", "--top", "2", "--ray"]
    with out.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.PIPE, text=True)
        seen: set[tuple[str, int, str]] = set()
        deadline = time.time() + 240
        while proc.poll() is None and time.time() < deadline:
            seen |= _listeners(proc.pid)
            time.sleep(0.2)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    names = {n for _, _, n in seen}
    assert any("gcs_server" in n for n in names) and any("raylet" in n for n in names), seen  # it did look
    exposed = sorted((ip, port, n) for ip, port, n in seen if not _loopback(ip))
    assert not exposed, f"listening beyond loopback: {exposed}"
    d = json.loads(out.read_text())
    assert d["backend"] == "ray" and d["ray"] == {
        "mode": "embedded",
        "node_ip": "127.0.0.1",
        "dashboard": False,
    }


def test_study_scored_on_ray_is_identical(ray_local, tmp_path: Path) -> None:
    """``study run --ray``: each batch's proposals are scored as Ray tasks; with the same sampler and
    seed the study holds the same trials, values and best layouts as one scored in-process."""
    from autopar.objectives import Objectives
    from autopar.prediction import training_job
    from autopar.search.space import load_space
    from autopar.search.study import StudyConfig, load_report, run_study

    job = training_job(devices_per_node=None, **{k: v for k, v in MOE.items()})
    reps = {}
    for mode in (None, "local"):
        cfg = StudyConfig(
            name="r",
            job=job,
            space=load_space("default"),
            objectives=Objectives.parse("throughput"),
            sampler="random",
            seed=5,
            storage=str(tmp_path / f"{mode}.log"),
            seed_top_k=0,
            ray=mode,
        )
        rep = run_study(cfg, n_trials=24)
        assert rep.n_complete == 24 and rep.new_trials == 24
        reps[mode] = load_report("r", str(tmp_path / f"{mode}.log"), top=5)
    assert reps[None].history == reps["local"].history
    assert reps[None].best == reps["local"].best
