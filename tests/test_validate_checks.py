"""`autopar validate` checks before it launches: the device, what the runner supports on it, one rank
per GPU, memory per rank against this machine's free memory; refusals name flags that exist."""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

import pytest

from autopar.calibration.validate import Item, preflight, resolve_run_device
from autopar.cli.main import build_parser, main
from autopar.errors import RunError
from autopar.layout import resolve_layout
from autopar.runner import RunnerModelConfig
from autopar.runner.resources import GIB, RUNTIME_BYTES_PER_RANK, _cgroup_free, cuda_device_count, host_memory

ROOT = Path(__file__).resolve().parents[1]
TINY = {"name": "tiny", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 128}
TINY_CFG = RunnerModelConfig(**{k: v for k, v in TINY.items() if k != "name"})


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> list[list]:
    """Launching fails the test unless a layout reaches it: those are recorded, and reported failed."""
    import autopar.runner.launch as launch

    launched: list[list] = []

    def run_layouts(lays, *a, **k):
        launched.append(list(lays))
        return [{"status": "failed", "error": "not launched in this test"} for _ in lays]

    def run_layout(lay, *a, **k):
        return run_layouts([lay])[0]

    monkeypatch.setattr(launch, "run_layouts", run_layouts)
    monkeypatch.setattr(launch, "run_layout", run_layout)
    return launched


def _layouts(tmp_path: Path, job: dict, layouts: list[dict]) -> str:
    p = tmp_path / "layouts.json"
    p.write_text(json.dumps({"job": job, "layouts": layouts}))
    return str(p)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_70b_layout_on_the_cpu_is_refused_for_memory_before_launching(
    tmp_path: Path, no_launch: list, capsys: pytest.CaptureFixture[str]
) -> None:
    job = {"model": "llama-3.1-70b", "device": "h100-sxm-80gb", "seq_len": 4096, "global_batch": 8}
    src = _layouts(tmp_path, job, [{"tp": 4, "pp": 2, "dp": 1, "micro_batch": 1}])
    out = tmp_path / "out.json"
    assert main(["validate", "--layouts", src, "--run-device", "cpu", "--json", str(out)]) == 2
    line = _one_line(capsys)
    free = host_memory().available / GIB
    assert "GiB of host memory" in line and f"{free:.0f}" in line or f"{free:.1f}" in line
    assert "nothing was launched" in line and not no_launch and not out.exists()


@pytest.mark.parametrize(
    "layout, needle",
    [
        ({"tp": 1, "pp": 1, "cp": 2, "dp": 1, "micro_batch": 1}, "context parallel (cp=2)"),
        (
            {"tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "precision": "fp8"},
            "precision=fp8 is not supported on cpu",
        ),
        ({"tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "precision": "fp16"}, "precision=fp16"),
    ],
)
def test_layouts_the_runner_cannot_run_on_this_device_are_refused_without_a_launch(
    tmp_path: Path, no_launch: list, layout: dict, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    job = {"model": str(model), "device": "h100-sxm-80gb", "seq_len": 16, "global_batch": 4}
    assert main(["validate", "--layouts", _layouts(tmp_path, job, [layout]), "--run-device", "cpu"]) == 2
    line = _one_line(capsys)
    assert needle in line and "no layout can run on this machine (cpu)" in line and not no_launch


@pytest.mark.skipif(cuda_device_count() > 0, reason="this machine has a CUDA GPU")
def test_run_device_cuda_without_a_gpu_is_one_line_naming_a_real_flag(
    tmp_path: Path, no_launch: list, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    job = {"model": str(model), "device": "h100-sxm-80gb", "seq_len": 16, "global_batch": 4}
    src = _layouts(tmp_path, job, [{"tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "precision": "fp32"}])
    assert main(["validate", "--layouts", src, "--run-device", "cuda"]) == 2
    line = _one_line(capsys)
    assert "--run-device cuda, but torch sees no CUDA GPU" in line and "--run-device cpu" in line
    assert not no_launch
    assert resolve_run_device("auto") == ("cpu", 0)


def test_with_some_layouts_runnable_only_those_are_launched(
    tmp_path: Path, no_launch: list, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    job = {"model": str(model), "device": "h100-sxm-80gb", "seq_len": 16, "global_batch": 4}
    ok = {"tp": 1, "pp": 1, "dp": 2, "micro_batch": 1, "precision": "fp32"}
    cp = {"tp": 1, "pp": 1, "cp": 2, "dp": 1, "micro_batch": 1, "precision": "fp32"}
    out = tmp_path / "out.json"
    main(
        [
            "validate",
            "--layouts",
            _layouts(tmp_path, job, [cp, ok]),
            "--run-device",
            "cpu",
            "--json",
            str(out),
        ]
    )
    assert [[lay.cp for lay in launch] for launch in no_launch] == [[1]]
    recs = json.loads(out.read_text())["records"]
    assert recs[0]["error"].startswith("refused before launch: context parallel (cp=2)")
    assert recs[1]["error"] == "not launched in this test"


def _item(**kw) -> Item:
    lay = resolve_layout(num_devices=kw.pop("num_devices", 2), global_batch=4, precision="fp32", **kw)
    return Item(lay)


def test_preflight_memory_and_gpu_rules() -> None:
    a, b = _item(dp=2, micro_batch=1), _item(dp=2, micro_batch=2)
    a.prediction = {"predicted_peak_memory_gib": 1.0}
    b.prediction = {"predicted_peak_memory_gib": 0.1}
    common = dict(seq_len=16, global_batch=4)
    need_a = 2 * (1.0 * GIB + RUNTIME_BYTES_PER_RANK)
    # host memory: all ranks together, each with the torch runtime on top of the predicted peak
    got = preflight([a, b], TINY_CFG, device="cpu", host_available=int(need_a) - 1, **common)
    assert list(got) == [0] and "2 x (1.0 GiB predicted peak + 0.3 GiB torch runtime) = 2.6 GiB" in got[0]
    assert preflight([a, b], TINY_CFG, device="cpu", host_available=int(need_a), **common) == {}
    # CUDA: one rank per GPU, and each rank's peak in its GPU's free memory
    got = preflight([a], TINY_CFG, device="cuda", n_gpus=1, gpu_free=[80 * GIB], **common)
    assert "needs 2 ranks, one per GPU, and this machine has 1 GPU(s)" in got[0]
    got = preflight([a, b], TINY_CFG, device="cuda", n_gpus=2, gpu_free=[80 * GIB, GIB], **common)
    assert list(got) == [0] and "GPU 1 has 1.0 GiB free" in got[0]
    # what the runner cannot do is refused on CUDA too (cp is not implemented there yet)
    cp = _item(cp=2, dp=1, micro_batch=1)
    assert "context parallel" in preflight([cp], TINY_CFG, device="cuda", n_gpus=2, **common)[0]
    with pytest.raises(RunError, match="--run-device cuda, but torch sees no CUDA GPU"):
        resolve_run_device("cuda", n_gpus=0)
    assert resolve_run_device("auto", n_gpus=2) == ("cuda", 2) and resolve_run_device("cpu", n_gpus=2) == (
        "cpu",
        0,
    )


@pytest.mark.parametrize(
    "proc, files, free",
    [
        ("0::/job\n", {"job/memory.max": "4294967296", "job/memory.current": "1073741824"}, 3 * GIB),
        ("0::/job\n", {"job/memory.max": "max", "job/memory.current": "1"}, None),
        ("0::/\n", {"memory.max": "2147483648", "memory.current": "0"}, 2 * GIB),
        (
            "4:memory:/a/b\n1:cpu:/\n",
            {
                "memory/a/b/memory.limit_in_bytes": "1073741824",
                "memory/a/b/memory.usage_in_bytes": "536870912",
            },
            GIB // 2,
        ),
        (
            "4:memory:/a/b\n",
            {"memory/memory.limit_in_bytes": "9223372036854771712", "memory/memory.usage_in_bytes": "5"},
            None,
        ),
    ],
)
def test_the_cgroup_limit_is_read_v1_and_v2(tmp_path: Path, proc: str, files: dict, free: int | None) -> None:
    (tmp_path / "cgroup").write_text(proc)
    for rel, text in files.items():
        f = tmp_path / "fs" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text + "\n")
    assert _cgroup_free(tmp_path / "cgroup", tmp_path / "fs") == free


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _options(parser: argparse.ArgumentParser, path: list[str]) -> set[str]:
    p = parser
    for name in path:
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.choices[name]
    return {o for a in p._actions for o in a.option_strings}


def _flags_ok(text: str, default: set[str], parser: argparse.ArgumentParser) -> list[str]:
    """Flags in ``text`` that do not exist: inside `autopar CMD ...` they belong to CMD's parser."""
    bad = []
    quoted = re.findall(r"`autopar ([a-z]+(?: [a-z]+)?)([^`]*)`", text)
    for cmd, rest in quoted:
        words = cmd.split()
        try:
            opts = _options(parser, words)
        except (StopIteration, KeyError):
            opts = _options(parser, words[:1])
        bad += [f for f in FLAG.findall(rest) if f not in opts]
    plain = re.sub(r"`autopar [^`]*`", "", text)
    bad += [f for f in FLAG.findall(plain) if f not in default]
    return bad


def _raise_strings(path: Path) -> list[str]:
    """The text of every message and hint a module raises (string constants and f-string parts)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            parts = [
                n.value
                for n in ast.walk(node.exc)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
            out.append(" ".join(parts))
    return out


def test_every_flag_named_in_a_refusal_exists_in_the_parser() -> None:
    parser, _ = build_parser()
    validate = _options(parser, ["validate"])
    import autopar.runner.train as train  # the worker's own parser (its --device)

    train_opts = set(re.findall(r'add_argument\("(--[a-z-]+)"', Path(train.__file__).read_text()))
    assert "--device" in train_opts
    from torch.distributed.run import get_args_parser  # the worker's messages may name torchrun's flags

    train_opts |= {o for a in get_args_parser()._actions for o in a.option_strings}
    modules = {
        ROOT / "autopar/cli/validate.py": validate,
        ROOT / "autopar/calibration/validate.py": validate,
        ROOT / "autopar/runner/checks.py": validate,
        ROOT / "autopar/runner/launch.py": validate,
        ROOT / "autopar/runner/train.py": train_opts,
    }
    bad = {}
    for path, opts in modules.items():
        for text in _raise_strings(path):
            missing = _flags_ok(text, opts, parser)
            if missing:
                bad[f"{path.name}: {text[:80]}"] = missing
    # and the refusals as printed, with their values filled in
    a = _item(dp=2, micro_batch=1)
    a.prediction = {"predicted_peak_memory_gib": 1.0}
    common = dict(seq_len=16, global_batch=4)
    messages = [
        *preflight([a], TINY_CFG, device="cpu", host_available=1, **common).values(),
        *preflight([a], TINY_CFG, device="cuda", n_gpus=1, **common).values(),
        *preflight([a], TINY_CFG, device="cuda", n_gpus=2, gpu_free=[1, 1], **common).values(),
        *preflight([_item(cp=2, dp=1, micro_batch=1)], TINY_CFG, device="cpu", **common).values(),
    ]
    with pytest.raises(RunError) as exc:
        resolve_run_device("cuda", n_gpus=0)
    messages.append(str(exc.value))
    assert len(messages) == 5
    for line in messages:
        missing = _flags_ok(line, validate, parser)
        if missing:
            bad[line[:80]] = missing
    assert not bad, bad
