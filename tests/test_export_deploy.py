"""`autopar export --format dynamo|llm-d`: the deployment manifests of a `serve` plan.

* Each manifest validates against its project's published schema (tests/schemas, SOURCES.yaml):
  Dynamo's DynamoGraphDeployment CRD (v1beta1 openAPIV3Schema, checked with unknown fields
  refused, as ``kubectl apply --validate=strict`` does) and llm-d-modelservice's
  values.schema.json (what ``helm install`` checks), whose free-form containers are checked
  against the Kubernetes Container schema the CRD embeds.
* What is deployed is the layout scored: every pool's replicas, TP/PP/DP/EP, devices, max
  sequences, token budget, model, weight format and KV dtype are read back from the manifest and
  compared with the serve record; worker arguments outside autopar's vLLM flags (those of its
  `vllm serve` export plus the named EngineArgs/Dynamo ones) are refused by the reader.
  vLLM's own `vllm serve` parser and config classes check every pool's worker arguments in
  tests/test_serving_parsers.py (marked slow: it installs the vLLM wheel without its CUDA
  dependencies); SGLang needs GPU packages, so its parser does not run here.
* Refusals: exit 2, one line, nothing written; an existing --out only with --force.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from autopar.cli.main import main
from autopar.export.base import ExportError
from autopar.serving.deploy import DeployOptions, read_deploy, render_deploy

jsonschema = pytest.importorskip("jsonschema")

SCHEMAS = Path(__file__).parent / "schemas"
QUANTITY = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"


@functools.cache
def _serve(**kw: Any) -> dict[str, Any]:
    from autopar.cli.export import records_of
    from autopar.serving.search import serve

    kw.setdefault("backend", "vllm")  # the workers run vLLM: a plan scored for TensorRT-LLM is refused
    res = serve(top=100, **kw).to_dict()
    return {"doc": res, "records": records_of(json.loads(json.dumps(res, default=float)), "serve")}


LLAMA70B = dict(
    model="llama-3.1-70b",
    device="h200-sxm-141gb",
    num_devices=8,
    isl=4000,
    osl=1000,
    weight_precision="fp8",
    ttft_ms=1000.0,
    tpot_ms=50.0,
)


def llama70b(backend: str = "vllm", **kw: Any) -> list[dict[str, Any]]:
    """The issue-23 case: Llama-3.1-70B FP8 on 8 H200, aggregated and disaggregated results, scored
    for the runtime the workers run (``backend``); ``kw``: other serve settings."""
    return _serve(**{**LLAMA70B, **kw}, backend=backend)["records"]


def dsv3(backend: str = "vllm") -> list[dict[str, Any]]:
    """DeepSeek-V3 on 32 H200: attention DP + expert parallel pools, aggregated and disaggregated."""
    return _serve(
        model="deepseek-v3",
        device="h200-sxm-141gb",
        num_devices=32,
        isl=1024,
        osl=1024,
        weight_precision="fp8",
        ttft_ms=2000.0,
        tpot_ms=80.0,
        backend=backend,
    )["records"]


def llama405b_tp16() -> list[dict[str, Any]]:
    """Llama-3.1-405B at TP 16 on two 8-GPU H100 nodes: an instance spanning nodes."""
    return _serve(model="llama-3.1-405b", device="h100-sxm-80gb", num_devices=16, isl=2000, osl=500, tp=16)[
        "records"
    ]


def first(records: list[dict[str, Any]], mode: str, pred: Any = lambda r: True) -> dict[str, Any]:
    return next(r for r in records if r["mode"] == mode and pred(r))


# ------------------------------------------------------------------------------------- schemas
def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused: kube-apiserver prunes (or, with strict field
    validation, rejects) fields a structural schema does not declare; JSON Schema allows them."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def dynamo_validator() -> Any:
    schema = json.loads((SCHEMAS / "dynamo-dynamographdeployment-v1beta1.schema.json").read_text())
    return jsonschema.Draft7Validator(_strict(schema))


@functools.cache
def llmd_validator() -> Any:
    schema = json.loads((SCHEMAS / "llm-d-modelservice-values.schema.json").read_text())
    return jsonschema.Draft7Validator(schema)


@functools.cache
def container_validator() -> Any:
    """Kubernetes core/v1 Container, as Dynamo's CRD embeds it (podTemplate.spec.containers)."""
    schema = json.loads((SCHEMAS / "dynamo-dynamographdeployment-v1beta1.schema.json").read_text())
    comp = schema["properties"]["spec"]["properties"]["components"]["items"]
    c = comp["properties"]["podTemplate"]["properties"]["spec"]["properties"]["containers"]["items"]
    return jsonschema.Draft7Validator(_strict(c))


def _quantities(node: Any, path: str = "") -> None:
    """x-kubernetes-int-or-string resource quantities (GPU counts) are strings of the quantity grammar."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("limits", "requests") and isinstance(v, dict):
                for name, q in v.items():
                    assert isinstance(q, str) and jsonschema.Draft7Validator({"pattern": QUANTITY}).is_valid(
                        q
                    ), f"{path}.{k}.{name}={q!r}"
            _quantities(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _quantities(v, f"{path}[{i}]")


def check_dynamo(text: str) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    errors = sorted(dynamo_validator().iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    assert doc["apiVersion"] == "nvidia.com/v1beta1" and doc["kind"] == "DynamoGraphDeployment"
    _quantities(doc)
    return doc


CHART_KEYS = ("modelCommand", "mountModelVolume")  # the chart's own container keys (values.yaml)


def check_llmd(text: str) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    errors = list(llmd_validator().iter_errors(doc))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    for key in ("decode", "prefill"):
        for c in doc[key].get("containers", []):
            k8s = {k: v for k, v in c.items() if k not in CHART_KEYS}
            errs = list(container_validator().iter_errors(k8s))
            assert not errs, [f"{key} {list(e.path)}: {e.message}" for e in errs[:5]]
    _quantities(doc)
    return doc


def test_the_validators_can_fail() -> None:
    """A manifest with a wrong field, value or type is caught (so the passing checks mean something)."""
    rec = first(llama70b(), "disaggregated")
    doc = yaml.safe_load(render_deploy(rec, "dynamo"))
    bad = copy.deepcopy(doc)
    bad["spec"]["components"][1]["type"] = "prefil"
    assert not dynamo_validator().is_valid(bad)
    bad = copy.deepcopy(doc)
    bad["spec"]["components"][1]["replica"] = 2  # a misspelt field is refused, not pruned
    assert not dynamo_validator().is_valid(bad)
    bad = copy.deepcopy(doc)
    bad["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["args"] = ["--tp", 2]
    assert not dynamo_validator().is_valid(bad)
    values = yaml.safe_load(render_deploy(rec, "llm-d"))
    bad = copy.deepcopy(values)
    bad["decode"]["parallelism"]["tensor_parallel"] = 2
    assert not llmd_validator().is_valid(bad)
    bad = copy.deepcopy(values)
    bad["decode"]["replicas"] = "4"
    assert not llmd_validator().is_valid(bad)
    assert not container_validator().is_valid({"name": "vllm", "image": "x", "args": "--tp 2"})


# -------------------------------------------------------------------------- exactly as scored
def expected_pools(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """What the record scored, per pool, in vLLM's units (per data-parallel engine)."""
    w = rec["job"]["workload"]
    if rec["mode"] == "aggregated":
        pools = [("worker", rec, rec["replicas"], rec["concurrency_per_instance"], rec["max_num_tokens"])]
    else:
        p, d = rec["prefill"], rec["decode"]
        pools = [
            ("prefill", p, p["instances"], p["prompts_per_batch"], p["max_num_tokens"]),
            ("decode", d, d["instances"], d["concurrency_per_instance"], d["max_num_tokens"]),
        ]
    out = []
    for role, d, reps, batch, budget in pools:
        adp = d.get("adp", 1)
        out.append(
            {
                "role": role,
                "replicas": reps,
                "tp": d["tp"] // adp,
                "pp": d["pp"],
                "dp": adp,
                "expert_parallel": d.get("ep", 1) > 1,
                "max_num_seqs": max(1, math.ceil(batch / adp - 1e-9)),
                "max_num_batched_tokens": math.ceil(budget / adp - 1e-9),
                "max_model_len": w["isl"] + w["osl"],
                "devices": d["tp"] * d["pp"],
            }
        )
    return out


def check_scored(
    text: str, fmt: str, rec: dict[str, Any], *, model: str, quantization: str | None, kv: str
) -> None:
    got = read_deploy(text, fmt)
    want = expected_pools(rec)
    assert [p["role"] for p in got] == [p["role"] for p in want]
    for g, e in zip(got, want, strict=True):
        for k in ("replicas", "tp", "pp", "dp", "expert_parallel", "max_num_seqs", "max_num_batched_tokens"):
            assert g[k] == e[k], (g["role"], k, g[k], e[k])
        assert g["max_model_len"] == e["max_model_len"]
        assert g["devices_per_pod"] * g["nodes"] == e["devices"]  # every device of the instance requested
        assert g["tp"] * g["pp"] * g["dp"] == e["devices"]
        assert (g["model"], g["quantization"], g["kv_cache_dtype"]) == (model, quantization, kv)
        assert (g["kv_transfer_config"] is not None) == (g["role"] != "worker")
    # the pools hold the devices the plan uses
    assert sum(g["replicas"] * g["devices_per_pod"] * g["nodes"] for g in got) == rec["devices"]


@pytest.mark.parametrize("fmt", ["dynamo", "llm-d"])
@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_llama70b_plan_deploys_as_scored(fmt: str, mode: str) -> None:
    rec = first(llama70b(), mode)
    text = render_deploy(rec, fmt)
    (check_dynamo if fmt == "dynamo" else check_llmd)(text)
    check_scored(text, fmt, rec, model="meta-llama/Llama-3.1-70B", quantization="fp8", kv="fp8")


@pytest.mark.parametrize("fmt", ["dynamo", "llm-d"])
def test_every_listed_llama70b_layout_validates(fmt: str) -> None:
    """All of serve's results for the issue-23 case, not just the winners: pipeline stages too."""
    recs = llama70b()
    assert {r["mode"] for r in recs} == {"aggregated", "disaggregated"}
    assert any(r.get("pp", 1) > 1 or r.get("decode", {}).get("pp", 1) > 1 for r in recs)
    for rec in recs:
        text = render_deploy(rec, fmt)
        (check_dynamo if fmt == "dynamo" else check_llmd)(text)
        check_scored(text, fmt, rec, model="meta-llama/Llama-3.1-70B", quantization="fp8", kv="fp8")


@pytest.mark.parametrize("fmt", ["dynamo", "llm-d"])
def test_attention_dp_and_expert_parallel_pools(fmt: str) -> None:
    recs = dsv3()

    def wide(p: dict[str, Any]) -> bool:  # EP under attention DP over the whole instance
        return p["adp"] > 1 and p["ep"] == p["tp"]

    # one node (8 GPUs) per instance: what both manifests express in one pod
    dis = first(
        recs,
        "disaggregated",
        lambda r: wide(r["prefill"]) and r["prefill"]["tp"] == 8 and r["decode"]["tp"] == 8,
    )
    agg = first(recs, "aggregated", lambda r: wide(r) and r["tp"] == 8)
    for rec in (dis, agg):
        text = render_deploy(rec, fmt)
        (check_dynamo if fmt == "dynamo" else check_llmd)(text)
        check_scored(text, fmt, rec, model="deepseek-ai/DeepSeek-V3", quantization="fp8", kv="fp8")
        pools = {p["role"]: p for p in read_deploy(text, fmt)}
        scored = {"prefill": rec.get("prefill"), "decode": rec.get("decode"), "worker": rec}
        for role, pool in pools.items():
            want = scored[role]
            if wide(want):
                assert pool["tp"] == 1 and pool["dp"] == 8 and pool["expert_parallel"]
            else:
                assert pool["tp"] == 8 and pool["dp"] == 1
    # an attention-DP instance wider than a node: Dynamo spans nodes, llm-d's one-pod chart refuses it
    multi = first(recs, "disaggregated", lambda r: wide(r["decode"]) and r["decode"]["tp"] == 16)
    if fmt == "dynamo":
        check_dynamo(render_deploy(multi, fmt))
    else:
        with pytest.raises(ExportError, match="16 devices on nodes of 8"):
            render_deploy(multi, fmt)
    # EP narrower than the instance has no vLLM form (its EP is every rank or none): a search scored
    # for vLLM never proposes one (rule backend_ep), and a record edited to one is refused
    assert not any(r.get("mode") == "aggregated" and 1 < r["ep"] < r["tp"] for r in recs)
    narrow = dict(agg, ep=agg["tp"] // 2)
    with pytest.raises(ExportError, match="expert parallel ep=.* cannot be expressed in vLLM"):
        render_deploy(narrow, fmt)


def test_instance_over_two_nodes() -> None:
    rec = first(llama405b_tp16(), "aggregated", lambda r: r["tp"] == 16)
    doc = check_dynamo(render_deploy(rec, "dynamo"))
    worker = doc["spec"]["components"][1]
    assert worker["multinode"] == {"nodeCount": 2}
    assert worker["podTemplate"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    check_scored(
        render_deploy(rec, "dynamo"),
        "dynamo",
        rec,
        model="meta-llama/Llama-3.1-405B",
        quantization=None,
        kv="auto",
    )
    with pytest.raises(
        ExportError, match="instance of 16 devices on nodes of 8 cannot be expressed in llm-d"
    ):
        render_deploy(rec, "llm-d")
    # nodes of 16 devices (--gpus-per-node) hold it in one pod
    text = render_deploy(rec, "llm-d", DeployOptions(gpus_per_node=16))
    check_llmd(text)
    assert read_deploy(text, "llm-d")[0]["devices_per_pod"] == 16
    # and an instance that does not fill whole nodes is refused
    with pytest.raises(ExportError, match="instance of 16 devices on nodes of 6"):
        render_deploy(rec, "dynamo", DeployOptions(gpus_per_node=6))


def _with_workload(rec: dict[str, Any], **kw: Any) -> dict[str, Any]:
    r = copy.deepcopy(rec)
    r["job"]["workload"].update(kw)
    return r


def test_weight_and_kv_formats() -> None:
    rec = first(llama70b(), "disaggregated")
    bf16 = _with_workload(rec, weight_precision="bf16", kv_precision=None)
    check_scored(
        render_deploy(bf16, "dynamo"),
        "dynamo",
        bf16,
        model="meta-llama/Llama-3.1-70B",
        quantization=None,
        kv="auto",
    )
    fp8kv = _with_workload(rec, weight_precision="bf16", kv_precision="fp8")
    check_scored(
        render_deploy(fp8kv, "llm-d"),
        "llm-d",
        fp8kv,
        model="meta-llama/Llama-3.1-70B",
        quantization=None,
        kv="fp8",
    )
    # a checkpoint-quantized format needs the quantized checkpoint; vLLM reads its format from it
    nvfp4 = _with_workload(rec, weight_precision="nvfp4")
    with pytest.raises(ExportError, match="nvfp4 weights from the 16-bit checkpoint.*--checkpoint"):
        render_deploy(nvfp4, "dynamo")
    ckpt = "nvidia/Llama-3.1-70B-Instruct-FP4"
    text = render_deploy(nvfp4, "dynamo", DeployOptions(checkpoint=ckpt))
    check_dynamo(text)
    check_scored(text, "dynamo", nvfp4, model=ckpt, quantization=None, kv="fp8")
    with pytest.raises(ExportError, match="int8 KV cache"):
        render_deploy(_with_workload(rec, kv_precision="int8"), "llm-d")


def test_workload_knobs_reach_the_workers() -> None:
    rec = first(llama70b(), "aggregated")
    text = render_deploy(_with_workload(rec, prefix_cache_hit_rate=0.5), "dynamo")
    assert read_deploy(text, "dynamo")[0]["prefix_caching"]
    assert not read_deploy(render_deploy(rec, "dynamo"), "dynamo")[0]["prefix_caching"]
    # Plans scored without chunked prefill: a 4096-token budget holds a 4000-token prompt (serve
    # scores it) but not a 5000-token sequence, which vLLM requires of max-num-batched-tokens then.
    short = first(llama70b(chunked_prefill=False, max_num_tokens=4096), "aggregated")
    assert short["max_num_tokens"] == 4096
    with pytest.raises(ExportError, match="budget of 4096 below max-model-len 5000 without chunked prefill"):
        render_deploy(short, "dynamo")
    off = first(llama70b(chunked_prefill=False), "aggregated")  # vLLM's default budget on H200: 8192
    pool = read_deploy(render_deploy(off, "dynamo"), "dynamo")[0]
    assert not pool["chunked_prefill"] and pool["max_num_batched_tokens"] == off["max_num_tokens"] == 8192
    with pytest.raises(ExportError, match="speculative decoding"):
        render_deploy(_with_workload(rec, speculative_tokens=2, acceptance_rate=0.7), "llm-d")


def test_devices_the_targets_cannot_schedule() -> None:
    recs = _serve(
        model="llama-3.1-8b", device="mi300x", num_devices=8, isl=2000, osl=500, ttft_ms=1500.0, tpot_ms=40.0
    )["records"]
    rec = first(recs, "aggregated", lambda r: r["tp"] == 1)
    with pytest.raises(ExportError, match="amd device .* cannot be expressed in dynamo"):
        render_deploy(rec, "dynamo")
    values = check_llmd(render_deploy(rec, "llm-d"))
    assert values["accelerator"]["type"] == "amd"
    assert values["decode"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "1"}
    check_scored(
        render_deploy(rec, "llm-d"),
        "llm-d",
        rec,
        model="meta-llama/Llama-3.1-8B",
        quantization=None,
        kv="auto",
    )
    # serve refuses --backend vllm on a device with its vendor's own stack: an edited record is refused
    bad = copy.deepcopy(first(llama70b(), "aggregated"))
    bad["job"]["cluster"] = {"device": "groq-lpu", "num_devices": 8}
    with pytest.raises(ExportError, match="groq-lpu runs its vendor's own serving stack, not the vllm"):
        render_deploy(bad, "llm-d")


def test_reader_refuses_unknown_worker_flags() -> None:
    text = render_deploy(first(llama70b(), "aggregated"), "dynamo")
    with pytest.raises(ExportError, match="unknown argument '--max-num-seq'"):
        read_deploy(text.replace("--max-num-seqs", "--max-num-seq"), "dynamo")


# ---------------------------------------------------------------------------------------- CLI
def _serve_json(path: Path, backend: str) -> Path:
    path.write_text(json.dumps(_serve(**LLAMA70B, backend=backend)["doc"], default=float))
    return path


@pytest.fixture
def serve_json(tmp_path: Path) -> Path:
    """The issue-23 plan scored for vLLM (the docs' command)."""
    return _serve_json(tmp_path / "serve.json", "vllm")


@pytest.fixture
def serve_json_sglang(tmp_path: Path) -> Path:
    """The same plan scored for SGLang (serve --backend sglang)."""
    return _serve_json(tmp_path / "serve-sglang.json", "sglang")


def _dis_index(src: Path) -> int:
    return next(
        i for i, r in enumerate(json.loads(src.read_text())["results"]) if r["mode"] == "disaggregated"
    )


def test_cli_writes_whole_files_and_overwrites_only_with_force(
    tmp_path: Path, serve_json: Path, serve_json_sglang: Path, capsys
) -> None:
    out = tmp_path / "dgd.yaml"
    i = str(_dis_index(serve_json))
    argv = ["export", "--format", "dynamo", "--from-json", str(serve_json), "--record", i, "--out", str(out)]
    assert main([*argv, "--namespace", "serving", "--image", "registry.local/vllm-runtime:1.5.0"]) == 0
    doc = check_dynamo(out.read_text())
    assert doc["metadata"] == {"name": "autopar-serve", "namespace": "serving"}
    assert {c["podTemplate"]["spec"]["containers"][0]["image"] for c in doc["spec"]["components"]} == {
        "registry.local/vllm-runtime:1.5.0"
    }
    before = out.read_text()
    capsys.readouterr()
    assert main([*argv, "--name", "other"]) == 2  # exists: refused, untouched
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--force" in err and out.read_text() == before
    assert main([*argv, "--name", "other", "--force"]) == 0
    assert yaml.safe_load(out.read_text())["metadata"]["name"] == "other"
    # a plan scored for SGLang gets SGLang workers; --engine sglang only restates it
    sg = tmp_path / "sglang.yaml"
    sg_argv = ["export", "--format", "dynamo", "--from-json", str(serve_json_sglang), "--out", str(sg)]
    assert main(sg_argv) == 0
    assert check_dynamo(sg.read_text())["spec"]["backendFramework"] == "sglang"
    assert main([*sg_argv, "--engine", "sglang", "--force"]) == 0
    assert check_dynamo(sg.read_text())["spec"]["backendFramework"] == "sglang"
    values = tmp_path / "values.yaml"
    assert main(["export", "--format", "llm-d", "--from-json", str(serve_json), "--out", str(values)]) == 0
    check_llmd(values.read_text())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--format", "dynamo", "--tp", "2"], "--tp would be ignored"),
        (["--format", "vllm", "--namespace", "x"], "--namespace applies only to the deployment formats"),
        (["--format", "llm-d", "--name", "Not_A_Name"], "not a Kubernetes name"),
        (["--format", "dynamo", "--record", "999"], "--record 999 is out of range"),
        (["--format", "dynamo", "--launcher-version", "1.4"], "--launcher-version does not apply"),
        (["--format", "llm-d", "--checkpoint", "/models/llama"], "pods download a Hugging Face checkpoint"),
        (
            ["--format", "dynamo", "--engine", "sglang"],
            "--engine sglang for a plan scored for the vllm runtime",
        ),
    ],
)
def test_cli_refusals_are_one_line_and_write_nothing(
    tmp_path: Path, serve_json: Path, capsys, extra: list[str], message: str
) -> None:
    out = tmp_path / "m.yaml"
    assert main(["export", "--from-json", str(serve_json), "--out", str(out), *extra]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1 and message in cap.err, cap.err
    assert not out.exists()


def test_cli_refuses_sglang_workers_for_llmd(tmp_path: Path, serve_json_sglang: Path, capsys) -> None:
    """llm-d's chart runs vLLM: a plan scored for SGLang has no llm-d form (with or without --engine)."""
    out = tmp_path / "values.yaml"
    for extra in ([], ["--engine", "sglang"]):
        argv = ["export", "--format", "llm-d", "--from-json", str(serve_json_sglang), "--out", str(out)]
        assert main([*argv, *extra]) == 2
        cap = capsys.readouterr()
        assert cap.out == "" and len(cap.err.strip().splitlines()) == 1, cap.err
        assert "sglang workers cannot be expressed in llm-d" in cap.err and not out.exists()


def test_cli_refuses_training_records_and_missing_plans(tmp_path: Path, capsys) -> None:
    assert main(["export", "--format", "dynamo", "--model", "llama-3.1-8b"]) == 2
    assert "needs --from-json" in capsys.readouterr().err
    pred = tmp_path / "p.json"
    assert main(["predict", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb", "--num-devices", "8",
                 "--seq-len", "4096", "--global-batch", "64", "--json"]) == 0  # fmt: skip
    pred.write_text(capsys.readouterr().out)
    assert main(["export", "--format", "llm-d", "--from-json", str(pred)]) == 2
    assert "not one" in capsys.readouterr().err


def test_cli_and_module_name_the_same_formats() -> None:
    from autopar.cli.export import DEPLOY_FORMATS
    from autopar.serving.deploy import FORMATS

    assert set(DEPLOY_FORMATS) == set(FORMATS)
    for k, v in FORMATS.items():
        assert DEPLOY_FORMATS[k].startswith(v)


def test_the_plan_backend_picks_the_workers() -> None:
    """The plan's backend (job.workload.backend, as serve writes it) decides the workers."""
    trt = first(llama70b("trtllm"), "aggregated")
    assert trt["job"]["workload"]["backend"] == "trtllm"
    for fmt in ("dynamo", "llm-d"):
        for engine in (None, "vllm", "sglang"):
            with pytest.raises(ExportError, match="a plan scored for the trtllm runtime cannot be expressed"):
                render_deploy(trt, fmt, DeployOptions(engine=engine))
    # a record written before backends existed was scored with TensorRT-LLM's rules
    old = copy.deepcopy(first(llama70b(), "aggregated"))
    del old["job"]["workload"]["backend"]
    with pytest.raises(ExportError, match="scored for the trtllm runtime"):
        render_deploy(old, "dynamo")
    vl = first(llama70b(), "aggregated")
    assert read_deploy(render_deploy(vl, "dynamo"), "dynamo")[0]["engine"] == "vllm"
    assert render_deploy(vl, "dynamo", DeployOptions(engine="vllm")) == render_deploy(vl, "dynamo")
    with pytest.raises(ExportError, match="--engine sglang for a plan scored for the vllm runtime"):
        render_deploy(vl, "dynamo", DeployOptions(engine="sglang"))
    sg = first(llama70b("sglang"), "aggregated")
    assert read_deploy(render_deploy(sg, "dynamo"), "dynamo")[0]["engine"] == "sglang"
    assert render_deploy(sg, "dynamo", DeployOptions(engine="sglang")) == render_deploy(sg, "dynamo")
    with pytest.raises(ExportError, match="sglang workers cannot be expressed in llm-d"):
        render_deploy(sg, "llm-d")
    with pytest.raises(ExportError, match="--engine vllm for a plan scored for the sglang runtime"):
        render_deploy(sg, "dynamo", DeployOptions(engine="vllm"))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("replicas",), float("inf")),
        (("replicas",), 2**40),
        (("tp",), "8"),
        (("tp",), 1.5),
        (("concurrency_per_instance",), -3.0),
        (("max_num_tokens",), None),
        (("mode",), "hybrid"),
    ],
)
def test_a_malformed_record_is_refused_in_one_error(path: tuple[str, ...], value: Any) -> None:
    rec = copy.deepcopy(first(llama70b(), "aggregated"))
    rec[path[0]] = value
    with pytest.raises(ExportError):
        render_deploy(rec, "dynamo")


def test_pools_on_another_device_type_are_not_deployed_on_the_cluster_device() -> None:
    rec = copy.deepcopy(first(llama70b(), "disaggregated"))
    rec["prefill"]["device"] = "b200"
    with pytest.raises(ExportError, match="prefill pool on b200 beside h200-sxm-141gb"):
        render_deploy(rec, "llm-d")


def check_scored_sglang(
    text: str, rec: dict[str, Any], *, model: str, quantization: str | None, kv: str
) -> None:
    got = read_deploy(text, "dynamo")
    want = expected_pools(rec)
    pools = [rec] if rec["mode"] == "aggregated" else [rec["prefill"], rec["decode"]]
    assert [p["role"] for p in got] == [p["role"] for p in want]
    for g, e, d in zip(got, want, pools, strict=True):
        assert g["engine"] == "sglang"
        for k in ("replicas", "tp", "pp", "dp", "expert_parallel", "max_model_len"):
            assert g[k] == e[k], (g["role"], k, g[k], e[k])
        assert g["ep"] == d.get("ep", 1)
        batch = d.get("concurrency_per_instance", d.get("prompts_per_batch"))
        assert g["max_running_requests"] == max(1, math.ceil(batch - 1e-9))  # the server's total
        assert g["chunked_prefill_size"] == g["max_prefill_tokens"] == d["max_num_tokens"]
        assert g["devices_per_pod"] * g["nodes"] == e["devices"]
        assert (g["model"], g["quantization"], g["kv_cache_dtype"]) == (model, quantization, kv)
        assert (g["transfer_backend"] == "nixl") == (g["role"] != "worker")


def test_sglang_workers_on_dynamo() -> None:
    recs = dsv3("sglang")
    dis = first(recs, "disaggregated", lambda r: r["decode"]["adp"] > 1)
    agg = first(recs, "aggregated", lambda r: r["adp"] > 1 and r["ep"] == r["tp"])
    narrow = first(recs, "aggregated", lambda r: 1 < r["ep"] < r["tp"])  # SGLang's EP divides TP
    opts = DeployOptions(engine="sglang")
    for rec in (dis, agg, narrow):
        text = render_deploy(rec, "dynamo", opts)
        doc = check_dynamo(text)
        assert doc["spec"]["backendFramework"] == "sglang"
        assert all(
            c["podTemplate"]["spec"]["containers"][0]["image"]
            == "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.5.0"
            for c in doc["spec"]["components"]
        )
        check_scored_sglang(text, rec, model="deepseek-ai/DeepSeek-V3", quantization="fp8", kv="fp8_e4m3")
    off = first(llama70b("sglang", chunked_prefill=False), "aggregated")
    pool = read_deploy(render_deploy(off, "dynamo", opts), "dynamo")[0]
    assert pool["chunked_prefill_size"] == -1 and pool["kv_cache_dtype"] == "fp8_e4m3"
    assert pool["max_prefill_tokens"] == off["max_num_tokens"]


def _pools(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [rec] if rec["mode"] == "aggregated" else [rec["prefill"], rec["decode"]]


@pytest.mark.parametrize(
    ("model", "device", "devices", "budget", "seqs_cap"),
    [
        # vLLM's get_batch_defaults (OPENAI_API_SERVER): 8192 tokens / 1024 sequences from 70 GiB
        # up (not A100), else 2048 / 256
        ("llama-3.1-70b", "h200-sxm-141gb", 8, 8192, 1024),
        ("llama-3.1-8b", "l40s", 8, 2048, 256),
        ("llama-3.1-8b", "a100-80gb", 8, 2048, 256),
    ],
)
def test_vllm_workers_get_the_values_the_profile_scored(
    model: str, device: str, devices: int, budget: int, seqs_cap: int
) -> None:
    """A plan that left vLLM's limits at their defaults deploys them as the profile resolved them for
    the device (not the defaults of whatever vLLM the image holds): the token budget per iteration,
    chunked prefill on, gpu_memory_utilization 0.9, and the CUDA-graph capture bound the profile's
    rule min(2 x max_num_seqs, 512, max_num_batched_tokens) gave (vLLM would derive it from the
    --max-num-seqs written, the scored concurrency)."""
    recs = _serve(
        model=model, device=device, num_devices=devices, isl=2000, osl=500, ttft_ms=3000.0, tpot_ms=60.0
    )["records"]
    assert recs
    for rec in recs:
        for fmt in ("dynamo", "llm-d"):
            try:
                text = render_deploy(rec, fmt)
            except ExportError as e:  # only what the format cannot say (multi-node llm-d pods)
                assert fmt == "llm-d" and "instance of" in str(e), str(e)
                continue
            for g, d in zip(read_deploy(text, fmt), _pools(rec), strict=True):
                assert d["max_num_tokens"] == budget
                assert g["max_num_batched_tokens"] * g["dp"] == budget  # per engine, as scored
                assert g["chunked_prefill"] and g["memory_fraction"] == 0.9
                assert g["graph_limit"] == min(2 * seqs_cap, 512, budget, g["max_num_batched_tokens"])
    # a memory share the plan set is the one written
    rec = first(llama70b(kv_cache_fraction=0.8), "aggregated")
    assert read_deploy(render_deploy(rec, "llm-d"), "llm-d")[0]["memory_fraction"] == 0.8


def _sglang_mem_fraction_static(gpu_mib: float, chunk: int, graph_bs: int, tp: int, pp: int) -> float:
    """sglang server_args.py ServerArgs._handle_gpu_memory_settings (commit 469c63e5), written out."""
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def test_sglang_workers_get_the_values_the_profile_scored() -> None:
    """SGLang on H200 (131 GiB: chunked_prefill_size 8192, cuda_graph_max_bs 256 below TP 4 and
    512 from it): the manifest pins the chunked-prefill size, the CUDA-graph batch and
    mem_fraction_static the plan was scored with (with chunked prefill off SGLang would derive
    another fraction from --chunked-prefill-size -1)."""
    from autopar.hardware import load_cluster

    gpu_mib = load_cluster("h200-sxm-141gb", 8, None).device.memory_bytes / 2**20
    for recs in (llama70b("sglang"), dsv3("sglang"), llama70b("sglang", chunked_prefill=False)):
        chunked = recs[0]["job"]["workload"]["chunked_prefill"] is not False
        for rec in recs:
            for g, d in zip(read_deploy(render_deploy(rec, "dynamo"), "dynamo"), _pools(rec), strict=True):
                tp = g["tp"] * g["dp"]
                graph_bs = 512 if tp >= 4 else 256
                assert d["max_num_tokens"] == g["max_prefill_tokens"] == 8192
                assert g["chunked_prefill_size"] == (8192 if chunked else -1)
                assert g["graph_limit"] == graph_bs
                assert g["memory_fraction"] == _sglang_mem_fraction_static(
                    gpu_mib, 8192, graph_bs, tp, g["pp"]
                )
    rec = first(llama70b("sglang", kv_cache_fraction=0.85), "disaggregated")
    assert {p["memory_fraction"] for p in read_deploy(render_deploy(rec, "dynamo"), "dynamo")} == {0.85}


def test_a_record_whose_budget_is_not_its_backends_is_refused() -> None:
    rec = copy.deepcopy(first(llama70b(), "aggregated"))
    rec["max_num_tokens"] = 4096  # vLLM 0.11 on H200 scores 8192
    with pytest.raises(ExportError, match="token budget 4096 is not the 8192 vllm 0.11 scores with"):
        render_deploy(rec, "dynamo")
