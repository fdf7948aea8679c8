"""``autopar export``: a layout as launcher arguments (Megatron-LM, DeepSpeed, torchtitan, vLLM, ...)."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

from autopar.errors import AutoparError


def _formats() -> list[str]:
    from autopar.export import EXPORTERS

    return sorted(EXPORTERS)


def add_export_output_args(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--out", type=Path, default=None, help="write here instead of stdout")


def check_out(out: Path | None) -> None:
    """Refuse a bad ``--out`` before any work (autopar.files.check_output)."""
    if out is not None:
        from autopar.files import check_output

        check_output(out, "launcher file", "--out")


def write_output(text: str, out: Path | None) -> None:
    """stdout, or an atomic write of ``out`` (autopar.files: no half-written file on failure)."""
    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    from autopar.files import write_text

    write_text(out, text if text.endswith("\n") else text + "\n", "launcher file", "--out")


def render_record(record: dict[str, Any], fmt: str, launcher_version: str | None = None) -> str:
    """Export one ``predict``/``recommend --json`` record (fills ``num_layers`` from the model),
    for the launcher's current release or ``launcher_version``."""
    from autopar.export import export, get_exporter, layout_and_job_from_json

    # env is a plain serialization for scripts, not launcher arguments
    if isinstance(record, dict) and record.get("serving") and not get_exporter(fmt).serving and fmt != "env":
        raise AutoparError(
            f"a serving record (serve --json) cannot be exported as {fmt} training arguments",
            "export it with --format vllm or sglang",
        )
    inst = record.get("per_instance") if isinstance(record, dict) else None
    if inst:  # serve_export_record's replica bookkeeping, not a layout field
        record = {k: v for k, v in record.items() if k != "per_instance"}
    layout, job = layout_and_job_from_json(record)
    replicas = _separate_replicas(inst, fmt, job.nnodes)
    if inst and replicas > 1:
        layout, job = layout_and_job_from_json(_one_replica(record, replicas, int(inst["engines"])))
    if job.num_layers is None:
        try:
            from autopar.model import load_model

            job = job.model_copy(update={"num_layers": load_model(job.model).layers})
        except AutoparError:
            pass  # a model we cannot load here: formats that need the depth will say so
    text = export(layout, fmt, job, launcher_version)
    if replicas > 1:
        head, _, rest = text.partition("\n")
        note = (
            f"# one of {replicas} identical replicas: run this command once per replica, on its own "
            f"{job.num_devices} devices ("
            + (
                "data parallelism across replicas would share the MoE layers' experts over every "
                "replica's ranks, which is not the layout scored)"
                if fmt == "vllm"
                else "SGLang runs data-parallel replicas within one node only)"
            )
        )
        text = f"{head}\n{note}\n{rest}"
    return text


def _separate_replicas(inst: dict[str, Any] | None, fmt: str, nnodes: int) -> int:
    """How many separate launches a serving record's replicas take in ``fmt`` (1: one command).

    vLLM's data parallelism shares a MoE model's expert layers over every DP engine (experts
    sharded, or expert-parallel, over all DP x TP ranks); SGLang refuses data-parallel replicas over
    several nodes (check_server_args: "multi-node data-parallel replicas are not supported"). There
    each replica is a separate launch of one instance."""
    if not inst:
        return 1
    split = (fmt == "vllm" and inst.get("moe")) or (fmt == "sglang" and nnodes > 1)
    return int(inst["replicas"]) if split else 1


def _one_replica(record: dict[str, Any], replicas: int, engines: int) -> dict[str, Any]:
    """The serving record of one of its ``replicas`` (its ``engines`` data-parallel engines)."""
    j = dict(record["job"])
    j["cluster"] = dict(j["cluster"], num_devices=int(j["cluster"]["num_devices"]) // replicas)
    j["workload"] = dict(j["workload"], global_batch=int(record["micro_batch"]) * engines)
    return {**record, "dp": engines, "job": j}


def _read_records(src: str) -> list[dict[str, Any]]:
    from autopar.files import MAX_INPUT_BYTES, parse_json, read_text

    hint = "pass the output of `autopar recommend --json` or `predict --json`"
    if src == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES or b"\x00" in data:
            raise AutoparError("--from-json -: standard input is binary or too large", hint)
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise AutoparError(
                f"--from-json -: standard input is not UTF-8 (offset {exc.start})", hint
            ) from None
    else:
        text = read_text(src, "--from-json", hint)
    data = parse_json(text, f"--from-json {src}")
    recs = records_of(data, f"--from-json {src}")
    bad = next((i for i, r in enumerate(recs) if not isinstance(r, dict)), None)
    if bad is not None:
        raise AutoparError(f"--from-json {src}: record {bad} is not an object", hint)
    return recs


def records_of(data: Any, where: str) -> list[dict[str, Any]]:
    """The exportable layout records of any command's ``--json``, best first.

    predict: the record itself; recommend and serve: ``results``; study show: ``best``; compare:
    the winning cells, then the other feasible ones; sweep: the points that found a layout. A
    record without its own ``job`` takes the file's; a serving record becomes the layout and job
    the serving launchers (vllm, sglang) read.
    """
    hint = "pass the --json output of predict, recommend, serve, compare, study show or sweep"
    if isinstance(data, list):
        return data
    if not isinstance(data, dict):
        raise AutoparError(f"{where}: no layout records found", hint)
    top_job = data.get("job")
    if "results" in data:
        recs = data["results"]
    elif "best" in data:
        recs = data["best"]
    elif "cells" in data:
        cells = [c for c in data["cells"] if isinstance(c, dict) and c.get("record")]
        recs = [c["record"] for c in sorted(cells, key=lambda c: not c.get("winner"))]
    elif "rows" in data:
        recs = [r for r in data["rows"] if isinstance(r, dict) and r.get("status") == "ok"]
    else:
        recs = [data]
    if not isinstance(recs, list) or not recs:
        raise AutoparError(
            f"{where}: the JSON has no exportable layout (nothing fitted, or not a result)", hint
        )
    out = []
    for r in recs:
        if isinstance(r, dict):
            r = dict(r)
            if not isinstance(r.get("job"), dict) and isinstance(top_job, dict):
                r["job"] = top_job
        out.append(r)
    return out


def _is_serving(r: dict[str, Any]) -> bool:
    w = (r.get("job") or {}).get("workload") if isinstance(r.get("job"), dict) else None
    return isinstance(w, dict) and w.get("kind") == "serving"


def serving_export_record(r: dict[str, Any]) -> dict[str, Any]:
    """A ``serve`` result as the layout + job the serving exporters read: pp, ep; every replica
    and every attention-DP rank a data-parallel engine (attention TP ``tp / adp``: DeepSeek-V3
    scored as attention-DP 16 with EP 16 on 16 GPUs is tp=1, dp=16, ep=16, which vLLM runs as
    ``--data-parallel-size 16 --tensor-parallel-size 1 --enable-expert-parallel`` and SGLang as
    ``--attn-dp-size 16``); the concurrency per engine as ``micro_batch`` (so the engines together
    admit the scored concurrency); isl + osl as ``seq_len`` (--max-model-len)."""
    from autopar.serving.backends import wide_ep

    job, w = r["job"], r["job"]["workload"]
    if r.get("mode") != "aggregated":
        raise AutoparError(
            f"{r.get('short', 'this layout')} is a disaggregated prefill/decode deployment: two "
            "pools that no single launcher command runs",
            "export an aggregated layout (pick one with --record N, or serve --no-disaggregated)",
        )
    try:
        tp, pp, devices = int(r["tp"]), int(r["pp"]), int(r["devices"])
        engines = max(1, int(r.get("adp") or 1))
        ep = int(r.get("ep") or 1)
        if tp % engines:
            raise ValueError
        dp = devices // (tp * pp) * engines  # replicas x attention-DP ranks
        conc = float(r["concurrency_per_instance"]) / engines
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise AutoparError(
            "a serving record lacks tp/pp/devices/concurrency_per_instance", "pass serve --json"
        ) from None
    micro = max(1, round(conc))
    replicas = devices // (tp * pp)
    # Where a launcher's data parallelism is not independent replicas, each replica is its own
    # launch of one instance (render_record decides per format, from these)
    per_instance = (
        {"replicas": replicas, "engines": engines, "moe": _moe(job.get("model"))} if replicas > 1 else None
    )
    cluster = dict(job.get("cluster") or {}, num_devices=devices)
    # the experts keep the instance's TP: ep ranks of etp = tp/ep (SGLang's moe_tp_size, TRT-LLM's
    # moe_tensor_parallel_size; vLLM runs EP only with ep = tp, so etp = 1 there); under attention
    # DP without EP the experts are split over all tp ranks (etp = tp, beyond the attention TP)
    attn = {"etp": max(1, tp // ep)} if ep > 1 or engines > 1 else {}
    return {
        "tp": tp // engines,
        "pp": pp,
        "dp": dp,
        "ep": ep,
        **attn,
        "micro_batch": micro,
        "grad_accum": 1,
        "zero": 0,
        "sp": False,
        "precision": "fp8" if w.get("weight_precision") == "fp8" else "bf16",
        "serving": True,
        **({"per_instance": per_instance} if per_instance else {}),
        "job": {
            "model": job["model"],
            "cluster": cluster,
            "workload": {
                "kind": "training",
                "seq_len": int(w["isl"]) + int(w["osl"]),
                "global_batch": micro * dp,
                # the expert all-to-all runtime priced where it runs: EP under attention DP
                **(
                    {
                        "moe_dispatcher": "deepep" if w.get("ep_dispatch") == "deepep" else "alltoall",
                        "moe_a2a_overlap": bool(w.get("ep_overlap")),
                    }
                    if wide_ep(ep, engines)
                    else {}
                ),
            },
            "allow_long_context": job.get("allow_long_context", False),
        },
    }


def _moe(model: Any) -> bool:
    """Whether a record's model is a MoE model (False where it cannot be loaded here)."""
    from autopar.model import load_model

    try:
        return bool(load_model(model).is_moe)
    except (AutoparError, TypeError):
        return False


def _framework_format(record: dict[str, Any]) -> str:
    """The export format of the record's training stack (``Job.framework``)."""
    from autopar.job import FRAMEWORK_EXPORT_FORMAT

    if isinstance(record, dict) and record.get("serving"):
        return "vllm"
    job = record.get("job") if isinstance(record, dict) else None
    framework = job.get("framework", "megatron") if isinstance(job, dict) else None
    if framework not in FRAMEWORK_EXPORT_FORMAT:
        raise AutoparError("autopar export needs --format", f"one of: {', '.join(_formats())}")
    return FRAMEWORK_EXPORT_FORMAT[framework]


@functools.cache
def _job_and_layout_dests() -> frozenset[str]:
    from autopar.cli.args import JOB_TOP_FIELDS, JOB_TRAINING_FIELDS
    from autopar.job import ClusterSpec
    from autopar.layout import LAYOUT_ARGS

    return frozenset(
        (*JOB_TOP_FIELDS, *ClusterSpec.model_fields, *JOB_TRAINING_FIELDS)
        + ("framework", "memory_headroom", "calibration")
        + tuple(LAYOUT_ARGS)
    )


# autopar.serving.deploy.FORMATS, spelled here so that --help and --list-formats import nothing
DEPLOY_FORMATS = {
    "dynamo": "NVIDIA Dynamo DynamoGraphDeployment (nvidia.com/v1beta1, Dynamo 1.5.0; vLLM or SGLang "
    "workers), from serve --json",
    "llm-d": "llm-d-modelservice Helm values (chart v0.4.12; vLLM prefill/decode pools), from serve --json",
}
DEPLOY_OPTIONS = (
    "engine",
    "name",
    "namespace",
    "image",
    "checkpoint",
    "hf_token_secret",
    "gpus_per_node",
    "force",
)


def _cmd_deploy(a: argparse.Namespace) -> int:
    """``--format dynamo|llm-d``: the manifest of one ``serve --json`` result, written whole or
    not at all; an existing ``--out`` is replaced only with ``--force``."""
    from autopar.serving.deploy import DeployOptions, render_deploy

    fmt = a.format
    if a.launcher_version is not None:
        raise AutoparError(f"--launcher-version does not apply to --format {fmt}", "drop --launcher-version")
    if not a.from_json:
        raise AutoparError(
            f"--format {fmt} needs --from-json FILE: the --json output of `autopar serve`",
            "autopar serve ... --json > serve.json, then autopar export --format "
            + fmt
            + " --from-json serve.json",
        )
    given = sorted(getattr(a, "_given", set()) & _job_and_layout_dests())
    if given:
        flags = ", ".join("--" + d.replace("_", "-") for d in given)
        raise AutoparError(
            f"--from-json carries the serving plan, so {flags} would be ignored", "drop " + flags
        )
    opts = DeployOptions(
        name=a.name,
        namespace=a.namespace,
        image=a.image,
        checkpoint=a.checkpoint,
        hf_token_secret=a.hf_token_secret,
        gpus_per_node=a.gpus_per_node,
        engine=a.engine,
    )
    opts.check()
    if a.out is not None:
        check_out(a.out)
        if not a.force and (a.out.exists() or a.out.is_symlink()):
            raise AutoparError(f"--out {a.out} exists", "pass --force to replace it, or choose another path")
    records = _read_records(a.from_json)
    if not 0 <= a.record < len(records):
        raise AutoparError(f"--record {a.record} is out of range (0..{len(records) - 1})")
    record = records[a.record]
    if not _is_serving(record):
        raise AutoparError(
            f"--format {fmt} deploys a serving plan; record {a.record} is not one",
            "pass the --json output of `autopar serve`",
        )
    write_output(render_deploy(record, fmt, opts), a.out)
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from autopar.export import EXPORTERS

    if a.list_formats:
        for name in _formats():
            from autopar.export import launcher_versions

            desc = getattr(EXPORTERS[name], "description", "")
            versions = launcher_versions(name)
            tail = f" [launcher versions: {', '.join(versions)}]" if len(versions) > 1 else ""
            sys.stdout.write(f"{name:<16} {desc}{tail}\n")
        for name, desc in DEPLOY_FORMATS.items():
            sys.stdout.write(f"{name:<16} {desc}\n")
        return 0
    if a.format in DEPLOY_FORMATS:
        return _cmd_deploy(a)
    given = sorted(getattr(a, "_given", set()) & set(DEPLOY_OPTIONS))
    if given:
        flags = ", ".join("--" + d.replace("_", "-") for d in given)
        raise AutoparError(
            f"{flags} {'applies' if len(given) == 1 else 'apply'} only to the deployment formats "
            f"({', '.join(DEPLOY_FORMATS)})",
            "drop " + flags + " or pass --format dynamo or --format llm-d",
        )
    check_out(a.out)
    if a.launcher_version is not None and a.format is not None:
        from autopar.export import get_exporter

        get_exporter(a.format, a.launcher_version)  # an unknown version is refused before any work
    if a.from_json:
        given = sorted(getattr(a, "_given", set()) & _job_and_layout_dests())
        if given:
            flags = ", ".join("--" + d.replace("_", "-") for d in given)
            raise AutoparError(
                f"--from-json carries the job and the layout, so {flags} would be ignored",
                "drop " + flags + ", or export from the job and layout flags without --from-json",
            )
        records = _read_records(a.from_json)
        if not 0 <= a.record < len(records):
            raise AutoparError(f"--record {a.record} is out of range (0..{len(records) - 1})")
        record = records[a.record]
        if _is_serving(record):
            record = serving_export_record(record)
    else:
        missing = [
            f for f in ("model", "device", "num_devices", "seq_len", "global_batch") if getattr(a, f) is None
        ]
        if missing:
            raise AutoparError(
                "autopar export needs --from-json FILE or the job flags; missing: "
                + ", ".join("--" + m.replace("_", "-") for m in missing),
                "pass --from-json plan.json (from `autopar recommend --json`) or every job flag",
            )
        from autopar.cli.args import job_kwargs, layout_kwargs
        from autopar.prediction import predict

        record = predict(**job_kwargs(a), **layout_kwargs(a)).to_dict()
    fmt = a.format or _framework_format(record)
    write_output(render_record(record, fmt, a.launcher_version), a.out)
    return 0


def register(sub) -> dict:
    from autopar.cli.args import add_job_args, add_layout_args

    p = sub.add_parser("export", help="render a layout as launcher arguments or config")
    p.add_argument(
        "--format",
        default=None,
        help="megatron, megatron_bridge, deepspeed, torchtitan, accelerate, "
        "torchrun, vllm, sglang or env (see --list-formats); dynamo or llm-d for a serve --json "
        "plan's deployment manifest (default: the job's framework's: "
        "megatron->megatron, torchtitan->torchtitan, deepspeed/megatron-deepspeed->deepspeed, "
        "fsdp->accelerate)",
    )
    p.add_argument("--list-formats", action="store_true", help="list the formats and exit")
    p.add_argument(
        "--launcher-version",
        default=None,
        metavar="X.Y",
        help="target this release of the launcher where its format changed (default: the current "
        "one; torchtitan: 0.3 (command), 0.2 (TOML); see --list-formats)",
    )
    p.add_argument(
        "--from-json",
        default=None,
        metavar="FILE",
        help="the --json output of predict, recommend, serve, compare, study show or sweep ('-' for stdin)",
    )
    p.add_argument(
        "--record", type=int, default=0, help="which record of the JSON to export (0 = the best / the winner)"
    )
    # The job flags of predict, optional here because --from-json carries them.
    add_job_args(p, optional=True)
    add_layout_args(p)
    add_export_output_args(p, required=False)
    from autopar.cli.args import positive_int

    g = p.add_argument_group("deployment manifests (--format dynamo or llm-d, from serve --json)")
    g.add_argument(
        "--engine",
        choices=("vllm", "sglang"),  # autopar.serving.deploy.ENGINES (not imported: startup)
        default=None,
        help="the workers' inference engine: the plan's serving backend, which this may only restate "
        "(serve --backend vllm or sglang); sglang for --format dynamo only",
    )
    g.add_argument(
        "--name",
        default="autopar-serve",
        help="DynamoGraphDeployment name / llm-d model label (default: autopar-serve)",
    )
    g.add_argument(
        "--namespace",
        default=None,
        help="Dynamo metadata.namespace (default: none, kubectl's current namespace)",
    )
    g.add_argument(
        "--image",
        default=None,
        help="container image of the workers (default: nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.5.0 "
        "or sglang-runtime:1.5.0 for dynamo, ghcr.io/llm-d/llm-d-cuda:latest for llm-d)",
    )
    g.add_argument(
        "--checkpoint",
        default=None,
        metavar="ORG/NAME",
        help="Hugging Face checkpoint the workers load; needed for fp8-block, int8, int4, nvfp4 and mxfp4 "
        "weights, which vLLM reads from a quantized checkpoint (default: the model's checkpoint)",
    )
    g.add_argument(
        "--hf-token-secret",
        default="hf-token-secret",
        metavar="SECRET",
        help="Kubernetes Secret holding HF_TOKEN ('' for none) (default: hf-token-secret)",
    )
    g.add_argument(
        "--gpus-per-node",
        type=positive_int,
        default=None,
        help="devices per Kubernetes node (default: the plan's devices_per_node)",
    )
    g.add_argument("--force", action="store_true", help="replace an existing --out file (default: refuse)")
    from autopar.cli.args import track_given

    track_given(p, _job_and_layout_dests() | set(DEPLOY_OPTIONS))
    return {"export": cmd_export}
