"""vLLM's own `vllm serve` parser and validation, and SGLang's own ServerArgs parser and checks,
accept autopar's serving exports (issue 25), and the engine arguments they give are the ones the
plan was scored with (issue 21 item 3 for serving).

vLLM 0.34 pins torch 2.14 (a CUDA build) and CUDA kernel packages, none of which its argument parser
needs. The test installs the vLLM wheel without its dependencies, plus the handful of pure-Python
packages `vllm serve`'s parser imports (``tests/launchers/vllm-parser.txt``), into a cached virtual
environment that sees the project's own packages (``AUTOPAR_TEST_CACHE``, default
``~/.cache/autopar-tests``; 659 MB on disk, built once), and runs ``tests/launchers/vllm_parse.py``
there with ``VLLM_TARGET_DEVICE=cpu``: the parser is built as ``vllm serve`` builds it
(``ServeSubcommand``: ``make_arg_parser``, ``validate_parsed_serve_args``) and the engine arguments
come from ``EngineArgs.from_cli_args``. Marked ``slow`` (the first run downloads the 239 MB vLLM wheel and the 39 MB SGLang one); where
vLLM cannot be installed (no package index) the test skips and says why.

SGLang 0.5.23 the same way (``tests/launchers/sglang-parser.txt``, ``sglang_parse.py``:
``prepare_server_args``, then ``ServerArgs.check_server_args`` up to its first check that needs the
model's resolved configuration); its cases are the ``autopar export --format sglang`` commands of the
same jobs scored for SGLang. (The Dynamo/llm-d SGLang workers target Dynamo 1.5's SGLang 0.5.17,
which does not import beside transformers 5.25: not checked here.)

Cases: real ``serve`` results scored for the vLLM backend: Llama-3.1-70B fp8 on 8 H200 (aggregated
and disaggregated), DeepSeek-V3 fp8 on 32 H200 (attention DP with expert parallelism, across
nodes), Qwen3-30B-A3B on 8 H100 (EP), Llama-3.1-8B on 8 H100 with prefix caching and chunked
prefill off. Each pool's Dynamo/llm-d worker arguments (``autopar.serving.deploy.vllm_args``) and
each aggregated record's ``autopar export --format vllm`` command are parsed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import venv
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = ROOT / "tests" / "launchers"
# launcher -> (version, the pure-Python packages its parser imports); the wheel itself goes in
# with --no-deps (its CUDA/GPU dependencies are not what its parser needs)
ENVS = {
    "vllm": ("0.34.0", LAUNCHERS / "vllm-parser.txt"),
    "sglang": ("0.5.23", LAUNCHERS / "sglang-parser.txt"),
}


def _cache_dir(name: str) -> Path:
    version, reqs = ENVS[name]
    base = Path(os.environ.get("AUTOPAR_TEST_CACHE") or Path.home() / ".cache" / "autopar-tests")
    tag = hashlib.sha256(f"{version}\n{reqs.read_text()}\n{sys.version}".encode()).hexdigest()[:12]
    return base / f"{name}-{version}-{tag}"


def _pip(py: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _launcher_python(name: str) -> Path:
    """The Python of the cached parser environment of launcher ``name`` (built on first use)."""
    version, reqs = ENVS[name]
    env = _cache_dir(name)
    py = env / "bin" / "python"
    if (env / "ready").is_file():
        return py
    tmp = env.with_name(env.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    venv.create(tmp, system_site_packages=True, with_pip=True)
    tpy = tmp / "bin" / "python"
    for step in ((f"{name}=={version}", "--no-deps"), ("-r", str(reqs))):
        r = _pip(tpy, *step)
        if r.returncode:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["pip failed"]
            pytest.skip(f"{name} {version}'s parser could not be installed: {tail[0]}")
    # Only a complete build takes the final name. A moved venv's console scripts keep the old path
    # in their shebang; the interpreter finds its site-packages from pyvenv.cfg beside it, and pip
    # is run as `python -m pip`.
    shutil.rmtree(env, ignore_errors=True)
    tmp.rename(env)
    (env / "ready").write_text(version)
    return py


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return _launcher_python("vllm")


@pytest.fixture(scope="module")
def sglang_python() -> Path:
    return _launcher_python("sglang")


def _parse(py: Path, commands: list[list[str]], script: str = "vllm_parse.py") -> list[dict[str, Any]]:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR")
    r = subprocess.run(
        [str(py), str(LAUNCHERS / script)],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=str(LAUNCHERS),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@cache
def _records(backend: str = "vllm", **kw: Any) -> tuple[dict[str, Any], ...]:
    from autopar.cli.export import records_of
    from autopar.serving.search import serve

    res = serve(top=20, backend=backend, **kw).to_dict()
    return tuple(records_of(json.loads(json.dumps(res, default=float)), "serve"))


CASES = {
    "llama70b-fp8-h200": dict(
        model="llama-3.1-70b", device="h200-sxm-141gb", num_devices=8, isl=4000, osl=1000,
        weight_precision="fp8", ttft_ms=1000.0, tpot_ms=50.0,
    ),
    "dsv3-adp-ep-32xh200": dict(
        model="deepseek-v3", device="h200-sxm-141gb", num_devices=32, isl=1024, osl=1024,
        weight_precision="fp8", ttft_ms=2000.0, tpot_ms=80.0,
    ),
    "dsv3-deepep-tbo-32xh200": dict(
        model="deepseek-v3", device="h200-sxm-141gb", num_devices=32, isl=1024, osl=1024,
        weight_precision="fp8", ttft_ms=2000.0, tpot_ms=80.0, ep_dispatch="deepep", ep_overlap=True,
    ),
    "qwen3-30b-a3b-ep-h100": dict(
        model="qwen3-30b-a3b", device="h100-sxm-80gb", num_devices=8, isl=1024, osl=256, concurrency=256,
    ),
    "llama8b-prefix-nochunk-h100": dict(
        model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, isl=2000, osl=200, concurrency=64,
        prefix_cache_hit_rate=0.5, chunked_prefill=False,
    ),
}  # fmt: skip


def _worker_commands() -> list[tuple[str, list[str], dict[str, Any]]]:
    """(label, argv after `vllm serve`, the values the plan scored) of every pool of every case."""
    from autopar.serving.deploy import plan_from_record, vllm_args

    out = []
    for case, kw in CASES.items():
        recs = _records(**kw)
        assert recs, case
        seen_disagg = False
        for i, rec in enumerate(recs[:6]):
            plan = plan_from_record(rec)
            seen_disagg |= plan.disaggregated
            for pool in plan.pools:
                want = {
                    "tensor_parallel_size": pool.tp,
                    "pipeline_parallel_size": pool.pp,
                    "data_parallel_size": pool.dp,
                    "enable_expert_parallel": pool.expert_parallel,
                    "max_model_len": plan.max_model_len,
                    "max_num_seqs": pool.max_num_seqs,
                    "max_num_batched_tokens": pool.max_num_batched_tokens,
                    "dtype": plan.dtype,
                    "quantization": plan.quantization,
                    "kv_cache_dtype": plan.kv_cache_dtype,
                    "gpu_memory_utilization": pool.memory_fraction,
                    "enable_chunked_prefill": plan.chunked_prefill,
                    "compilation_config": pool.graph_limit,
                }
                if plan.prefix_caching:
                    want["enable_prefix_caching"] = True
                # the expert all-to-all runtime scored: DeepEP and two-batch overlap where EP runs
                # under attention DP, vLLM's defaults elsewhere
                wide = pool.dp > 1 and pool.expert_parallel
                want["all2all_backend"] = (
                    {"decode": "deepep_low_latency"}.get(pool.role, "deepep_high_throughput")
                    if wide and plan.ep_dispatch == "deepep"
                    else "allgather_reducescatter"
                )
                want["enable_dbo"] = wide and plan.ep_overlap
                out.append((f"{case}#{i} {pool.role}", [plan.checkpoint, *vllm_args(plan, pool)], want))
        if case == "llama70b-fp8-h200":
            assert seen_disagg, "the issue-23 case has disaggregated plans among its best"
        if case == "dsv3-deepep-tbo-32xh200":
            plans = [plan_from_record(r) for r in recs[:6]]
            assert any(p.dp > 1 and p.expert_parallel for pl in plans for p in pl.pools), "wide EP scored"
    return out


# the launch prefix of each serving export, and its address placeholder given a value
LAUNCH = {
    "vllm": (["vllm", "serve"], '"${MASTER_ADDR}"', "10.0.0.1"),
    "sglang": (["python", "-m", "sglang.launch_server"], '"${MASTER_ADDR}:${MASTER_PORT}"', "10.0.0.1:5000"),
}


def _aggregated_exports(fmt: str):
    """(label, job keywords, serve record, export record, argv after the launch prefix, launches per
    deployment) of ``autopar export --format fmt`` for every aggregated record of every case scored
    for that backend. A record's replicas are separate launches exactly where the launcher cannot run
    them as data parallelism: a MoE model on vLLM (its DP shares the experts), replicas over nodes on
    SGLang (it refuses multi-node DP); the export says so in a comment."""
    from autopar.cli.export import render_record, serving_export_record
    from autopar.export import layout_and_job_from_json

    prefix, placeholder, value = LAUNCH[fmt]
    for case, kw in CASES.items():
        for i, rec in enumerate(_records(backend=fmt, **kw)[:6]):
            if rec.get("mode") != "aggregated":
                continue
            ex = serving_export_record(rec)
            text = render_record(ex, fmt).replace(placeholder, value)
            body = " ".join(ln.rstrip("\\") for ln in text.splitlines() if not ln.lstrip().startswith("#"))
            toks = shlex.split(body)
            assert toks[: len(prefix)] == prefix, toks[: len(prefix) + 1]
            inst = ex.get("per_instance") or {}
            nodes = layout_and_job_from_json({k: v for k, v in ex.items() if k != "per_instance"})[1].nnodes
            split = bool(inst) and (inst["moe"] if fmt == "vllm" else nodes > 1)
            launches = inst["replicas"] if split else 1
            assert split == (f"# one of {launches} identical replicas" in text), (case, i)
            yield f"{fmt} export {case}#{i}", kw, rec, ex, toks[len(prefix) :], launches


def _export_commands() -> list[tuple[str, list[str], dict[str, Any]]]:
    """``autopar export --format vllm`` of every aggregated record: the command after `vllm serve`."""
    out = []
    for label, _, _, ex, argv, launches in _aggregated_exports("vllm"):
        want = {
            "tensor_parallel_size": ex["tp"],
            "pipeline_parallel_size": ex["pp"],
            "data_parallel_size": ex["dp"] // launches,
            "enable_expert_parallel": ex["ep"] > 1,
            "max_num_seqs": ex["micro_batch"],
            "all2all_backend": "deepep_high_throughput"
            if ex["job"]["workload"].get("moe_dispatcher") == "deepep"
            else "allgather_reducescatter",
            "enable_dbo": bool(ex["job"]["workload"].get("moe_a2a_overlap")),
        }
        out.append((label, argv, want))
    return out


def test_vllm_serve_parser_accepts_every_worker_and_export_command(vllm_python: Path) -> None:
    commands = _worker_commands() + _export_commands()
    assert len(commands) >= 20
    parsed = _parse(vllm_python, [argv for _, argv, _ in commands])
    assert len(parsed) == len(commands)
    for (label, argv, want), got in zip(commands, parsed, strict=True):
        assert "error" not in got, f"{label}: vllm serve refused {shlex.join(argv)}: {got['error']}"
        for k, v in want.items():
            if isinstance(v, float):
                assert got[k] == pytest.approx(v), (label, k)
            else:
                assert got[k] == v, (label, k, got[k], v)


def test_the_parser_is_real_it_refuses_what_vllm_does_not_know(vllm_python: Path) -> None:
    """The harness is not a rubber stamp: an unknown flag, values vLLM's config classes refuse, a
    token budget below the model length without chunked prefill; and a valid command passes."""
    got = _parse(
        vllm_python,
        [
            ["org/m", "--tensor-parallel-size", "2", "--expert-tensor-parallel-size", "2"],
            ["org/m", "--kv-cache-dtype", "fp7"],
            ["org/m", "--max-num-seqs", "0"],
            [
                "org/m",
                "--max-model-len",
                "4096",
                "--max-num-batched-tokens",
                "1024",
                "--no-enable-chunked-prefill",
            ],
            ["org/m", "--tensor-parallel-size", "2", "--max-num-seqs", "8", "--kv-cache-dtype", "fp8"],
        ],
    )
    assert "error" in got[0] and "expert-tensor-parallel-size" in got[0]["error"]
    assert "error" in got[1] and "CacheConfig" in got[1]["error"]
    assert "error" in got[2] and "SchedulerConfig" in got[2]["error"]
    assert "error" in got[3] and "SchedulerConfig" in got[3]["error"]
    assert "error" not in got[4] and (got[4]["tensor_parallel_size"], got[4]["max_num_seqs"]) == (2, 8)


def _sglang_export_commands() -> list[tuple[str, list[str], dict[str, Any]]]:
    """``autopar export --format sglang`` of every aggregated record scored for SGLang."""
    out = []
    for label, kw, rec, _, argv, launches in _aggregated_exports("sglang"):
        want = {
            "tp_size": int(rec["tp"]),
            "pp_size": int(rec["pp"]),
            "ep_size": int(rec.get("ep") or 1),
            "attn_dp_size": int(rec.get("adp") or 1),
            "dp_size": int(rec["devices"]) // (int(rec["tp"]) * int(rec["pp"])) // launches,
            "context_length": int(kw["isl"]) + int(kw["osl"]),
            # the expert all-to-all runtime scored (EP under attention DP only)
            "moe_a2a_backend": "deepep"
            if kw.get("ep_dispatch") == "deepep"
            and int(rec.get("adp") or 1) > 1
            and int(rec.get("ep") or 1) > 1
            else "none",
            "enable_two_batch_overlap": bool(kw.get("ep_overlap"))
            and int(rec.get("adp") or 1) > 1
            and int(rec.get("ep") or 1) > 1,
        }
        out.append((label, argv, want))
    return out


def test_sglang_parser_accepts_every_export(sglang_python: Path) -> None:
    commands = _sglang_export_commands()
    assert len(commands) >= 10
    parsed = _parse(sglang_python, [argv for _, argv, _ in commands], "sglang_parse.py")
    for (label, argv, want), got in zip(commands, parsed, strict=True):
        assert "error" not in got, f"{label}: SGLang refused {shlex.join(argv)}: {got['error']}"
        for k, v in want.items():
            assert got[k] == v, (label, k, got[k], v)
        # SGLang's checks ran past the parallel-size ones (they come before the model-config ones)
        assert got["checked_until"] == "end" or got["checked_until"].startswith("validation_hook.py:")


def test_sglang_harness_is_real(sglang_python: Path) -> None:
    """Unknown and ambiguous flags, a refused choice, and SGLang's own multi-node DP rule."""
    got = _parse(
        sglang_python,
        [
            ["--model-path", "org/m", "--tp-size", "8", "--expert-tensor-parallel-size", "2"],
            ["--model-path", "org/m", "--cuda-graph-max-bs", "256"],
            ["--model-path", "org/m", "--kv-cache-dtype", "fp7"],
            ["--model-path", "org/m", "--tp-size", "8", "--dp-size", "2", "--nnodes", "2"],
            ["--model-path", "org/m", "--tp-size", "8", "--ep-size", "8", "--max-running-requests", "64"],
        ],
        "sglang_parse.py",
    )
    assert "error" in got[0] and "expert-tensor-parallel-size" in got[0]["error"]
    assert "error" in got[1] and "ambiguous" in got[1]["error"]
    assert "error" in got[2] and "fp7" in got[2]["error"]
    assert "error" in got[3] and "multi-node data-parallel" in got[3]["error"]
    assert "error" not in got[4] and (got[4]["tp_size"], got[4]["ep_size"]) == (8, 8)
