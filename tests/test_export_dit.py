"""DiT launch exports checked by the launchers' own code.

diffusers: the ``ParallelConfig(...)`` expression of each exported script is evaluated with
diffusers' own config classes (their ``__post_init__`` checks run), and the transformer class it
loads must carry the plan diffusers needs (``_cp_plan`` / ``_tp_plan``; TP goes through diffusers'
``_check_tp_supported``). No GPU: nothing is loaded or sharded.

xfuser: the package does not import without a GPU (``xfuser/__init__`` raises "No Accelerators"), so
its files are read where pip installed them: ``xfuser/cli.py`` (stdlib only) is loaded as it ships
and splits the ``xdit`` argv; the runner's parser is xfuser's own ``xFuserArgs.add_runner_args``
source, executed on xfuser's ``FlexibleArgumentParser`` (both taken from ``config/args.py`` by AST,
without the GPU imports around them).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from autopar.dit import inference
from autopar.dit.spec import load_dit
from autopar.errors import AutoparError
from autopar.export.xdit import DIFFUSERS_CLASSES, XDIT_MODELS, diffusers_command, xfuser_command

diffusers = pytest.importorskip("diffusers")

IMAGE = inference.Generation(height=1024, width=1024, frames=1, steps=28)
VIDEO = inference.Generation(height=480, width=832, frames=81, steps=50)


def _parallel_config(script: str) -> Any:
    """Evaluate the script's ``parallel_config = ...`` with diffusers' classes, and check that every
    name the script imports from diffusers exists there."""
    tree = ast.parse(script)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "diffusers":
            for alias in node.names:
                assert hasattr(diffusers, alias.name), alias.name
    (value,) = [
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["parallel_config"]
    ]
    names = {
        k: getattr(diffusers, k) for k in ("ParallelConfig", "ContextParallelConfig", "TensorParallelConfig")
    }
    return eval(compile(ast.Expression(value), "<export>", "eval"), {"__builtins__": {}}, names)


def test_the_class_table_matches_diffusers() -> None:
    for pid, (cls, cp, tp) in DIFFUSERS_CLASSES.items():
        model = getattr(diffusers, cls)
        assert (getattr(model, "_cp_plan", None) is not None) == cp, (pid, cls)
        assert (getattr(model, "_tp_plan", None) is not None) == tp, (pid, cls)


@pytest.mark.parametrize(
    ("pid", "req", "layout"),
    [
        ("flux.1-dev", IMAGE, {"tp": 4}),
        ("flux.1-dev", IMAGE, {"tp": 8}),
        ("flux.1-dev", IMAGE, {"ulysses": 4}),
        ("flux.1-dev", IMAGE, {"ulysses": 2, "ring": 2}),
        ("wan2.1-t2v-14b", VIDEO, {"ring": 4}),
        ("wan2.1-t2v-1.3b", VIDEO, {"ulysses": 2, "ring": 4}),
    ],
)
def test_diffusers_export_builds_diffusers_own_config(
    pid: str, req: inference.Generation, layout: dict
) -> None:
    from diffusers.hooks.tensor_parallel import _check_tp_supported

    spec = load_dit(pid)
    n = 1
    for v in layout.values():
        n *= v
    inference.check_layout(spec, n, req, layout)
    script = diffusers_command(spec, req, layout, num_devices=n)
    compile(script, "<export>", "exec")
    cfg = _parallel_config(script)
    assert isinstance(cfg, diffusers.ParallelConfig)
    model = getattr(diffusers, DIFFUSERS_CLASSES[pid][0])
    assert f"{model.__name__}.from_pretrained(" in script and "parallel_config=parallel_config" in script
    if layout.get("tp", 1) > 1:
        tpc = cfg.tensor_parallel_config
        assert cfg.context_parallel_config is None and tpc.tp_degree == layout["tp"]
        _check_tp_supported(model.__name__, model._tp_plan, spec.heads, tpc)  # diffusers' own refusal rules
    else:
        cpc = cfg.context_parallel_config
        assert cfg.tensor_parallel_config is None and model._cp_plan is not None
        assert (cpc.ulysses_degree, cpc.ring_degree) == (layout.get("ulysses", 1), layout.get("ring", 1))
        assert (
            cpc.ulysses_degree * cpc.ring_degree == n
        )  # diffusers' ("ring", "ulysses") mesh spans the world


def test_diffusers_refuses_a_tp_degree_it_would_refuse() -> None:
    """The heads rule autopar applies is diffusers' own: tp 5 on FLUX's 24 heads fails both."""
    from diffusers.hooks.tensor_parallel import _check_tp_supported

    spec = load_dit("flux.1-dev")
    with pytest.raises(AutoparError, match="does not divide 24 heads"):
        diffusers_command(spec, IMAGE, {"tp": 5}, num_devices=5)
    model = diffusers.FluxTransformer2DModel
    with pytest.raises(ValueError, match="must divide the number of attention heads"):
        _check_tp_supported(
            model.__name__, model._tp_plan, spec.heads, diffusers.TensorParallelConfig(tp_degree=5)
        )


@pytest.mark.parametrize(
    ("pid", "req", "layout", "match"),
    [
        ("flux.1-dev", IMAGE, {"tp": 2, "ulysses": 2}, "not both"),
        ("flux.1-dev", IMAGE, {"pipefusion": 2}, "no pipefusion dimension"),
        ("flux.1-dev", IMAGE, {"dp": 2, "ulysses": 2}, "no dp dimension"),
        ("sd3.5-large", IMAGE, {"cfg": 2}, "no cfg dimension"),
        ("sd3.5-large", IMAGE, {"ulysses": 2}, "SD3Transformer2DModel has no context-parallel plan"),
        ("wan2.1-t2v-14b", VIDEO, {"tp": 4}, "WanTransformer3DModel has no tensor-parallel plan"),
        ("step-video-t2v", VIDEO, {"ulysses": 2}, "no parallel transformer class"),
        ("flux.1-dev", IMAGE, {}, "single-device"),
    ],
)
def test_diffusers_refuses_what_it_cannot_run(
    pid: str, req: inference.Generation, layout: dict, match: str
) -> None:
    n = 1
    for v in layout.values():
        n *= v
    with pytest.raises(AutoparError, match=match):
        diffusers_command(load_dit(pid), req, layout, num_devices=n)


# ------------------------------------------------------------------ xfuser 0.7's xdit entry point
def _xfuser_root() -> Path:
    spec = importlib.util.find_spec("xfuser")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("xfuser is not installed (the dev extra installs it)")
    return Path(next(iter(spec.submodule_search_locations)))


def _xfuser_cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("xfuser_cli_as_shipped", _xfuser_root() / "cli.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _xfuser_runner_parser() -> argparse.ArgumentParser:
    """xfuser's ``FlexibleArgumentParser`` with xfuser's ``xFuserArgs.add_runner_args``, both taken
    from its ``config/args.py`` source (with the module constants they read)."""
    root = _xfuser_root()
    tree = ast.parse((root / "config" / "args.py").read_text(encoding="utf-8"))
    consts = ast.parse((root / "config" / "config.py").read_text(encoding="utf-8"))
    gemm = importlib.util.spec_from_file_location("xfuser_gemm_as_shipped", root / "config" / "gemm.py")
    assert gemm is not None and gemm.loader is not None
    gemm_mod = importlib.util.module_from_spec(gemm)
    sys.modules[gemm.name] = gemm_mod  # its dataclasses look their module up
    gemm.loader.exec_module(gemm_mod)
    ns: dict[str, Any] = {"argparse": argparse, "sys": sys, "__name__": "xfuser_args_as_shipped"}
    ns.update({k: v for k, v in vars(gemm_mod).items() if not k.startswith("__")})
    for node in consts.body:  # DEFAULT_FP8_COMMS_SAFETY_FACTOR and its kin: literals in config.py
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            for t in node.targets:
                assert isinstance(t, ast.Name)
                ns[t.id] = value
    runner = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) or (
            isinstance(node, ast.ClassDef) and node.name == "FlexibleArgumentParser"
        ):
            exec(compile(ast.Module([node], []), "xfuser/config/args.py", "exec"), ns)
        if isinstance(node, ast.Assign):  # help texts and defaults; `logger = init_logger(...)` is left out
            try:
                exec(compile(ast.Module([node], []), "xfuser/config/args.py", "exec"), ns)
            except NameError:
                continue
        if isinstance(node, ast.ClassDef) and node.name == "xFuserArgs":
            (runner,) = [
                f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "add_runner_args"
            ]
    assert runner is not None
    runner.decorator_list = []
    exec(compile(ast.Module([runner], []), "xfuser/config/args.py", "exec"), ns)
    parser = ns["FlexibleArgumentParser"](prog="xfuser.runner", exit_on_error=False)
    ns["add_runner_args"](parser)
    return parser


@pytest.mark.parametrize(
    ("pid", "req", "layout", "n"),
    [
        ("flux.1-dev", IMAGE, {"pipefusion": 2, "tp": 2}, 4),
        ("flux.1-dev", IMAGE, {"ulysses": 4, "ring": 2}, 8),
        ("sd3.5-large", IMAGE, {"cfg": 2, "ulysses": 2, "pipefusion": 2}, 8),
        ("hunyuanvideo", inference.Generation(height=720, width=1280, frames=129, steps=50, cache_skip=0.3), {"ulysses": 8}, 8),
        ("wan2.1-t2v-14b", VIDEO, {"dp": 2, "ulysses": 4}, 8),
    ],
)  # fmt: skip
def test_xdit_entry_point_accepts_the_export(
    pid: str, req: inference.Generation, layout: dict, n: int
) -> None:
    cli, parser = _xfuser_cli(), _xfuser_runner_parser()
    spec = load_dit(pid)
    inference.check_layout(spec, n, req, layout)
    argv = shlex.split(xfuser_command(spec, req, layout, num_devices=n))
    assert argv[0] == "xdit"
    torchrun, runner_argv = cli.extract_torchrun_args(argv[1:])
    assert torchrun["--nproc_per_node"] == str(n)
    assert cli.get_nproc_from_args(runner_argv) == n  # what xdit infers agrees with the layout
    ns = parser.parse_args(runner_argv)  # an unknown flag exits 2 here
    assert ns.model == XDIT_MODELS[pid]
    assert (ns.ulysses_degree, ns.ring_degree) == (layout.get("ulysses", 1), layout.get("ring", 1))
    assert (ns.pipefusion_parallel_degree, ns.tensor_parallel_degree) == (
        layout.get("pipefusion", 1),
        layout.get("tp", 1),
    )
    assert ns.data_parallel_degree == layout.get("dp", 1)
    assert ns.use_cfg_parallel == (layout.get("cfg", 1) == 2)
    assert ns.cache_method == ("teacache" if req.cache_skip > 0 else None)
    assert (ns.height, ns.width, ns.num_inference_steps) == (req.height, req.width, req.steps)


def test_the_runner_parser_rejects_flags_it_lacks() -> None:
    """The check can fail: the example scripts' PipeFusion flags are not the runner's."""
    parser = _xfuser_runner_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "FLUX.1-dev", "--num_pipeline_patch", "2"])


def test_previous_version_keeps_torchrun_and_unregistered_models_are_refused() -> None:
    spec = load_dit("wan2.1-t2v-1.3b")
    with pytest.raises(AutoparError, match="registry"):
        xfuser_command(spec, VIDEO, {"ulysses": 4}, num_devices=4)
    old = shlex.split(xfuser_command(spec, VIDEO, {"ulysses": 4}, num_devices=4, launcher_version="0.6"))
    assert old[:3] == ["torchrun", "--nproc_per_node=4", "examples/wan_example.py"]
    with pytest.raises(AutoparError, match="unknown xDiT launcher version"):
        xfuser_command(spec, VIDEO, {"ulysses": 4}, num_devices=4, launcher_version="0.5")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autopar", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_exports_and_refusals() -> None:
    flux = ("dit", "generate", "--model", "flux.1-dev", "--device", "h100-sxm-80gb", "--height", "1024",
            "--width", "1024", "--steps", "28")  # fmt: skip
    r = _cli(*flux, "--num-devices", "4", "--tp", "4", "--export", "diffusers")
    assert r.returncode == 0, r.stderr
    assert "TensorParallelConfig(tp_degree=4)" in r.stdout
    r = _cli(*flux, "--num-devices", "4", "--tp", "4", "--export", "xdit", "--launcher-version", "0.6")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("torchrun --nproc_per_node=4 examples/flux_example.py")
    for bad in (
        (*flux, "--num-devices", "4", "--tp", "2", "--ulysses", "2", "--export", "diffusers"),
        (*flux, "--num-devices", "4", "--tp", "4", "--export", "xdit", "--launcher-version", "9"),
        (*flux, "--num-devices", "4", "--tp", "4", "--export", "diffusers", "--launcher-version", "0.7"),
    ):
        r = _cli(*bad)
        assert r.returncode == 2, (bad, r.stderr)
        assert r.stdout == "" or "diffusers" in bad, r.stdout
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error:"), r.stderr
