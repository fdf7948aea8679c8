"""Deployment manifests for a ``serve`` plan: NVIDIA Dynamo and llm-d, aggregated or disaggregated.

A ``serve --json`` record (one of its ``results``) becomes the file a cluster deploys it with:

* ``dynamo``: a ``DynamoGraphDeployment`` (``nvidia.com/v1beta1``, Dynamo 1.5: ``spec.components``
  with a frontend and one component per pool; ``type`` ``worker`` for an aggregated layout,
  ``prefill`` and ``decode`` for a disaggregated one; ``replicas`` = the pool's instances;
  ``multinode.nodeCount`` where an instance spans nodes), each worker ``python3 -m dynamo.vllm``
  with vLLM engine arguments and ``--disaggregation-mode prefill|decode`` plus the NIXL KV connector
  (``examples/backends/vllm/deploy/disagg.yaml`` of ai-dynamo/dynamo), or, for a plan scored for
  SGLang, ``python3 -m dynamo.sglang`` with SGLang server arguments (:func:`sglang_args`;
  ``examples/backends/sglang/deploy/disagg.yaml``).
* ``llm-d``: values for the ``llm-d-modelservice`` Helm chart (v0.4.x: ``decode`` and ``prefill``
  pools with ``replicas``, ``parallelism.tensor/data/dataLocal/workers`` and a ``vllm`` container
  whose ``modelCommand: vllmServe`` makes the chart run ``vllm serve MODEL --tensor-parallel-size
  ... --data-parallel-size ...``; the rest of the engine arguments are the container's ``args``;
  ``examples/values-pd.yaml`` of llm-d-incubation/llm-d-modelservice). An aggregated layout is a
  decode pool with ``prefill.create: false``.

Every engine value comes from the scored record: per pool, TP (attention TP with attention DP),
PP, attention-DP engines (``--data-parallel-size``), expert parallelism (vLLM's switch: the
experts sharded over every rank of the instance), ``--max-num-seqs`` (the scored concurrency per
engine, rounded up: prompts per prefill iteration for a prefill pool), ``--max-num-batched-tokens``
(the scored token budget per iteration, per engine), ``--max-model-len`` (isl + osl), the weight
format (``--dtype``/``--quantization``), ``--kv-cache-dtype``, chunked prefill and prefix caching,
the KV memory share (``--gpu-memory-utilization``; SGLang ``--mem-fraction-static``) and the
CUDA-graph bound (``max_cudagraph_capture_size``; SGLang ``--cuda-graph-max-bs``). The plan's
backend decides the workers (``--engine`` may only restate it), and a limit the plan left at None
is written as that backend's profile resolved it for the device (:mod:`autopar.serving.backends`).
What the plan does not decide (name, namespace, image, the secret holding the Hugging Face token,
GPUs per node, a pre-quantized checkpoint) is a :class:`DeployOptions` field with a stated default.

Refused (:class:`~autopar.export.base.ExportError`, one line): for vLLM, expert parallelism
narrower than the instance (vLLM's EP is all ranks or none; SGLang's ``--ep-size`` divides TP);
SGLang workers for llm-d; a plan scored for another runtime (TensorRT-LLM, or a record without a
backend) and an ``--engine`` other than the plan's backend; a record whose token budget is not the
one its backend scores with, or on a device that runs its vendor's own stack; speculative decoding
(the plan does not name the draft), a KV-cache dtype vLLM has no name for, a checkpoint-quantized weight format
(fp8-block, int8, int4, nvfp4, mxfp4) without ``checkpoint``, an instance that does not fill whole
nodes, a device the target has no resource for, and a token budget vLLM would reject.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from autopar.export import sglang as _sglang
from autopar.export import vllm as _vllm
from autopar.export.base import ExportError, parse_flags, serving_model_ref, to_int, unsupported

__all__ = [
    "FORMATS",
    "DeployOptions",
    "Pool",
    "Plan",
    "plan_from_record",
    "read_deploy",
    "render_deploy",
    "vllm_args",
]

DYNAMO_API = "nvidia.com/v1beta1"
DYNAMO_VERSION = "1.5.0"
LLMD_CHART_VERSION = "v0.4.12"
FORMATS = {
    "dynamo": f"NVIDIA Dynamo DynamoGraphDeployment ({DYNAMO_API}, Dynamo {DYNAMO_VERSION}; vLLM or SGLang workers)",
    "llm-d": f"llm-d-modelservice Helm values (chart {LLMD_CHART_VERSION}; vLLM prefill/decode pools)",
}
DEFAULT_IMAGE = {
    ("dynamo", "vllm"): f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{DYNAMO_VERSION}",
    ("dynamo", "sglang"): f"nvcr.io/nvidia/ai-dynamo/sglang-runtime:{DYNAMO_VERSION}",
    ("llm-d", "vllm"): "ghcr.io/llm-d/llm-d-cuda:latest",
}
ENGINES = ("vllm", "sglang")
SGLANG_BOOTSTRAP_PORT = 12345  # --disaggregation-bootstrap-port of Dynamo's sglang disagg.yaml
# The KV connector both projects' vLLM P/D examples configure (NIXL, every worker kv_both).
KV_TRANSFER_CONFIG = json.dumps(
    {"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":")
)
# vLLM applies these at load time to a 16-bit checkpoint; the others are read from a quantized
# checkpoint's own quantization_config.
ONLINE_WEIGHTS = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "fp8": ("bfloat16", "fp8")}
CHECKPOINT_WEIGHTS = ("fp8-block", "int8", "int4", "nvfp4", "mxfp4")
# Kubernetes extended resource per device vendor (llm-d-modelservice values.yaml accelerator.resources;
# Dynamo's vLLM runtime images are CUDA builds).
LLMD_ACCELERATOR = {"nvidia": "nvidia", "amd": "amd", "intel": "intel-gaudi", "google": "google"}
LLMD_RESOURCE = {
    "nvidia": "nvidia.com/gpu",
    "amd": "amd.com/gpu",
    "intel-gaudi": "habana.ai/gaudi",
    "google": "google.com/tpu",
}
NIXL_PORT = 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT of llm-d-modelservice's values-pd.yaml
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
# The worker flags: those of autopar's `vllm serve` export, plus vLLM EngineArgs fields it does not
# write (SchedulerConfig.max_num_batched_tokens / enable_chunked_prefill, CacheConfig.cache_dtype /
# enable_prefix_caching, ModelConfig.model / served_model_name, kv_transfer_config) and Dynamo's
# --disaggregation-mode (components/src/dynamo/vllm/backend_args.py). read_deploy refuses any other.
VLLM_VALUE_FLAGS = (
    *_vllm.VALUE_FLAGS,
    "--model",
    "--served-model-name",
    "--max-num-batched-tokens",
    "--kv-cache-dtype",
    "--kv-transfer-config",
    "--gpu-memory-utilization",
    "--compilation-config",
)
VLLM_BOOL_FLAGS = (
    *_vllm.BOOL_FLAGS,
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--enable-prefix-caching",
)
DYNAMO_VALUE_FLAGS = ("--disaggregation-mode",)
# SGLang: the flags of autopar's sglang export plus ServerArgs fields it does not write
# (chunked_prefill_size, max_prefill_tokens, kv_cache_dtype, served_model_name, the PD
# disaggregation settings; enable_dp_attention and skip_tokenizer_init as Dynamo's examples use them).
SGLANG_VALUE_FLAGS = (
    *_sglang.VALUE_FLAGS,
    "--served-model-name",
    "--chunked-prefill-size",
    "--max-prefill-tokens",
    "--kv-cache-dtype",
    "--mem-fraction-static",
    "--cuda-graph-max-bs",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
    "--deepep-mode",
)
SGLANG_BOOL_FLAGS = ("--enable-dp-attention", "--skip-tokenizer-init", "--enable-two-batch-overlap")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class DeployOptions:
    """What a serving plan does not decide; each has a default that is stated in the CLI help."""

    name: str = "autopar-serve"  # metadata.name (Dynamo) / the model label (llm-d)
    namespace: str | None = None  # Dynamo metadata.namespace (None: kubectl's current namespace)
    image: str | None = None  # None: DEFAULT_IMAGE[format, engine]
    checkpoint: str | None = None  # what the workers load (None: the model's Hugging Face id)
    hf_token_secret: str = "hf-token-secret"  # Kubernetes Secret with HF_TOKEN ("" for none)
    gpus_per_node: int | None = None  # devices per Kubernetes node (None: the cluster's devices_per_node)
    engine: str | None = None  # vllm or sglang: must restate the plan's backend (None: the plan's)

    def check(self) -> None:
        for what, v in (("--name", self.name), ("--namespace", self.namespace)):
            if v is not None and (len(v) > 63 or not _DNS_LABEL.match(v)):
                raise ExportError(
                    f"{what} {v!r} is not a Kubernetes name",
                    "use lower-case letters, digits and '-', at most 63 characters, starting and ending "
                    "with a letter or digit",
                )
        if self.hf_token_secret and (
            len(self.hf_token_secret) > 253 or not _DNS_LABEL.match(self.hf_token_secret)
        ):
            raise ExportError(f"--hf-token-secret {self.hf_token_secret!r} is not a Kubernetes Secret name")
        if self.engine is not None and self.engine not in ENGINES:
            raise ExportError(f"--engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ExportError(f"--gpus-per-node {self.gpus_per_node} must be at least 1")
        for what, v in (("--image", self.image), ("--checkpoint", self.checkpoint)):
            if v is not None and (not v.strip() or any(c.isspace() or ord(c) < 32 for c in v)):
                raise ExportError(f"{what} {v!r} is empty or contains whitespace or control characters")


@dataclass(frozen=True)
class Pool:
    """One pool of identical instances (``role``: worker, prefill or decode), in vLLM's units (per
    data-parallel engine) with the instance totals SGLang takes."""

    role: str
    replicas: int
    tp: int  # tensor parallel per engine (attention TP under attention DP)
    pp: int
    dp: int  # data-parallel engines per instance (attention DP ranks)
    expert_parallel: bool
    max_num_seqs: int  # per engine
    max_num_batched_tokens: int  # per engine
    ep: int = 1  # expert-parallel width of the instance (SGLang's --ep-size)
    batch: float = 1.0  # scored concurrency of the instance (prompts per iteration for prefill)
    budget: int = 1  # scored token budget per iteration of the instance
    memory_fraction: float = 0.9  # vLLM gpu_memory_utilization / SGLang mem_fraction_static scored
    graph_limit: int | None = None  # the CUDA-graph bound scored (vLLM: tokens per step, per engine;
    # SGLang: cuda_graph_max_bs); None where the profile models no graphs on this device

    @property
    def devices(self) -> int:
        """Devices of one instance."""
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Plan:
    """A scored serving layout as deployable pools plus the engine settings every pool shares."""

    model: str  # the job's model (preset id or config path)
    checkpoint: str  # what the workers load
    engine: str  # vllm or sglang
    device: str
    vendor: str
    devices_per_node: int
    max_model_len: int
    dtype: str
    quantization: str | None
    kv_cache_dtype: str
    chunked_prefill: bool
    prefix_caching: bool
    pools: tuple[Pool, ...]
    short: str
    scored: dict[str, Any] = field(default_factory=dict)
    ep_dispatch: str = "default"  # the workload's expert all-to-all runtime (ServingWorkload.ep_dispatch)
    ep_overlap: bool = False  # two-batch overlap (ServingWorkload.ep_overlap)

    @property
    def disaggregated(self) -> bool:
        return any(p.role != "worker" for p in self.pools)


INT32_MAX = 2**31 - 1  # Kubernetes replicas and vLLM's token counts are 32-bit


def _int(d: Mapping[str, Any], key: str, where: str) -> int:
    v = d.get(key)
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or not 1 <= v <= INT32_MAX
        or v != int(v)
    ):
        raise ExportError(
            f"{where}: {key} is {v!r}, not a positive integer (at most {INT32_MAX})",
            "pass the --json output of `autopar serve` as written",
        )
    return int(v)


def _positive(d: Mapping[str, Any], key: str, where: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= INT32_MAX:
        raise ExportError(
            f"{where}: {key} is {v!r}, not a positive number",
            "pass the --json output of `autopar serve` as written",
        )
    return float(v)


def _pool(role: str, d: Mapping[str, Any], replicas: int, batch: float, budget: int, where: str) -> Pool:
    tp, pp = _int(d, "tp", where), _int(d, "pp", where)
    ep, adp = _int({"ep": d.get("ep", 1)}, "ep", where), _int({"adp": d.get("adp", 1)}, "adp", where)
    if tp % adp:
        raise ExportError(f"{where}: tp={tp} is not a multiple of adp={adp}", "pass serve --json as written")
    seqs = max(1, math.ceil(batch / adp - 1e-9))
    tokens = max(1, math.ceil(budget / adp - 1e-9))
    return Pool(role, replicas, tp // adp, pp, adp, ep > 1, seqs, tokens, ep, batch, budget)


def _check_engine(pool: Pool, engine: str, chunked_prefill: bool, max_model_len: int) -> None:
    """Refuse what ``engine`` cannot run as scored."""
    from autopar.serving.backends import expert_parallel_ok, load_backend

    tp = pool.tp * pool.dp  # the instance's TP (attention TP x attention-DP ranks)
    if not expert_parallel_ok(load_backend(engine), pool.ep, tp):
        raise unsupported(
            f"expert parallel ep={pool.ep} within tp={tp} ({pool.role} pool)",
            "SGLang" if engine == "sglang" else "vLLM",
            "SGLang's --ep-size divides --tp-size"
            if engine == "sglang"
            else "vLLM's --enable-expert-parallel shards the experts over every rank of the instance "
            "(ep = tp); search with --ep 1 or --ep equal to tp, or serve with --backend sglang",
        )
    if engine == "sglang":
        return
    if pool.max_num_batched_tokens < pool.max_num_seqs:
        raise unsupported(
            f"a token budget of {pool.max_num_batched_tokens} per engine below {pool.max_num_seqs} "
            f"sequences ({pool.role} pool)",
            "vLLM",
            "vLLM requires --max-num-batched-tokens >= --max-num-seqs; serve with a larger --max-num-tokens",
        )
    if not chunked_prefill and pool.max_num_batched_tokens < max_model_len:
        raise unsupported(
            f"a token budget of {pool.max_num_batched_tokens} below max-model-len {max_model_len} "
            f"without chunked prefill ({pool.role} pool)",
            "vLLM",
            "vLLM needs the budget to hold a whole sequence when chunked prefill is off; serve "
            "with chunked prefill or a larger --max-num-tokens",
        )


def plan_from_record(record: Mapping[str, Any], opts: DeployOptions | None = None) -> Plan:
    """The pools and engine settings of one ``serve --json`` result (with its ``job``)."""
    from pydantic import ValidationError

    from autopar.hardware import load_cluster
    from autopar.job import ServingWorkload

    opts = opts or DeployOptions()
    where = "serving record"
    job = record.get("job")
    if not isinstance(job, Mapping) or not isinstance(job.get("workload"), Mapping):
        raise ExportError(f"{where} has no job", "pass the --json output of `autopar serve`")
    wd = dict(job["workload"])
    if wd.get("kind") != "serving":
        raise ExportError(
            "a training record cannot be deployed as a serving graph",
            "pass the --json output of `autopar serve`",
        )
    try:
        w = ServingWorkload(**wd)
    except (ValidationError, TypeError) as e:
        raise ExportError(f"{where}: its workload does not validate ({str(e).splitlines()[0]})") from None
    # The workers run the runtime the plan was scored for (a record without a backend was scored
    # before backends existed: TensorRT-LLM's rules, the workload's default); --engine may only restate it.
    scored_for = w.backend
    if scored_for not in ENGINES:
        raise unsupported(
            f"a plan scored for the {scored_for} runtime",
            "a deployment manifest of vLLM or SGLang workers",
            "serve with --backend vllm or --backend sglang, or deploy the plan's own runtime by hand",
        )
    if opts.engine is not None and opts.engine != scored_for:
        raise ExportError(
            f"--engine {opts.engine} for a plan scored for the {scored_for} runtime",
            f"drop --engine, or serve with --backend {opts.engine}",
        )
    engine = scored_for
    if w.speculative_tokens:
        raise unsupported(
            f"speculative decoding ({w.speculative_tokens} draft tokens)",
            "a deployment manifest",
            "the plan does not name the draft (MTP module or draft model); serve with "
            "--speculative-tokens 0, or add vLLM's --speculative-config to the workers yourself",
        )
    c = job.get("cluster")
    cluster: Mapping[str, Any] = c if isinstance(c, Mapping) else {}
    device = cluster.get("device")
    if not isinstance(device, str):
        raise ExportError(
            f"{where}: job.cluster.device is missing", "pass the --json output of `autopar serve`"
        )
    try:
        cl = load_cluster(
            device, int(cluster.get("num_devices") or 1), cluster.get("devices_per_node") or None
        )
    except (TypeError, ValueError):
        raise ExportError(f"{where}: job.cluster does not describe a cluster") from None
    dpn = opts.gpus_per_node or cl.devices_per_node
    # The runtime limits the plan left at None are the backend profile's defaults for this device
    # (vLLM's max_num_batched_tokens by device memory, chunked prefill, the KV memory share): the
    # workers get the values the plan was scored with, not whatever their version defaults to.
    from autopar.serving.backends import load_backend
    from autopar.serving.estimate import resolve_workload

    if cl.device.serving is not None:  # serve refuses --backend vllm/sglang there: an edited record
        raise ExportError(
            f"{where}: {device} runs its vendor's own serving stack, not the {engine} the plan was scored for",
            "pass the --json output of `autopar serve` as written",
        )
    profile = load_backend(w.backend, w.backend_version)
    w = resolve_workload(w, profile, cl.device)
    model = job.get("model")
    if not isinstance(model, str) or not model:
        raise ExportError(f"{where}: job.model is missing", "pass the --json output of `autopar serve`")
    # weights
    if w.weight_precision in ONLINE_WEIGHTS:
        dtype, quant = ONLINE_WEIGHTS[w.weight_precision]
    elif opts.checkpoint is None:
        raise unsupported(
            f"{w.weight_precision} weights from the 16-bit checkpoint",
            "vLLM",
            f"vLLM reads {w.weight_precision} weights from a quantized checkpoint; name it with "
            "--checkpoint HF_ID_OR_PATH",
        )
    else:
        dtype, quant = "bfloat16", None  # the checkpoint's quantization_config says the format
    kv = w.kv_dtype
    act = {"float16": "fp16"}.get(dtype, "bf16")
    if kv == "fp8":
        kv_cache_dtype = "fp8"
    elif kv == act:
        kv_cache_dtype = "auto"  # the model dtype
    else:
        raise unsupported(
            f"a {kv} KV cache with {act} activations", engine, "the KV cache is the model dtype or fp8"
        )
    checkpoint = opts.checkpoint or serving_model_ref(model, "a deployment manifest")
    if not _HF_ID.match(checkpoint):
        raise ExportError(
            f"the workers cannot load {checkpoint!r}: pods download a Hugging Face checkpoint",
            "name it with --checkpoint ORG/NAME",
        )
    mode = record.get("mode")
    if mode == "aggregated":
        reps = _int(record, "replicas", where)
        budget = _int(
            record, "max_num_tokens", where + " (written by an autopar without token budgets: re-run serve)"
        )
        batch = _positive(record, "concurrency_per_instance", where)
        pools: tuple[Pool, ...] = (_pool("worker", record, reps, batch, budget, where),)
    elif mode == "disaggregated":
        pre, dec = record.get("prefill"), record.get("decode")
        if not isinstance(pre, Mapping) or not isinstance(dec, Mapping):
            raise ExportError(f"{where}: a disaggregated record without prefill/decode pools")
        pools = (
            _pool(
                "prefill",
                pre,
                _int(pre, "instances", where),
                float(_int(pre, "prompts_per_batch", where)),
                _int(pre, "max_num_tokens", where + " prefill (re-run serve)"),
                where,
            ),
            _pool(
                "decode",
                dec,
                _int(dec, "instances", where),
                _positive(dec, "concurrency_per_instance", where),
                _int(dec, "max_num_tokens", where + " decode (re-run serve)"),
                where,
            ),
        )
    else:
        raise ExportError(f"{where}: mode {mode!r} is neither aggregated nor disaggregated")
    for key in ("prefill", "decode"):
        pd = record.get(key)
        other = pd.get("device") if isinstance(pd, Mapping) else None
        if other is not None and other != device:
            raise unsupported(
                f"a {key} pool on {other} beside {device}",
                "a deployment manifest",
                "this export writes one device type for every pool; deploy each pool's component by hand",
            )
    # Every pool was scored with the backend's token budget (a fixed one for vLLM and SGLang) and its
    # KV memory share: vLLM's gpu_memory_utilization, or SGLang's mem_fraction_static as the profile
    # derives it per instance (memory, TP x PP, the chunked-prefill size, the CUDA-graph batch); and
    # the CUDA-graph bound it scored (vLLM derives its own from --max-num-seqs, which is the scored
    # concurrency here, not the max_num_seqs the profile's rule takes).
    import numpy as np

    from autopar.serving.backends import gpu_rules, graph_limit, kv_fraction

    chunked = bool(w.chunked_prefill)
    fixed = []
    for p in pools:
        if w.max_num_tokens is not None and p.budget != w.max_num_tokens:
            raise ExportError(
                f"{where}: the {p.role} pool's token budget {p.budget} is not the {w.max_num_tokens} "
                f"{profile.name} {profile.version} scores with on {device}",
                "pass the --json output of `autopar serve` as written",
            )
        if w.kv_cache_fraction is not None:
            frac = float(w.kv_cache_fraction)
        else:
            tp_i, pp_i, bud = (np.array([float(v)]) for v in (p.tp * p.dp, p.pp, p.budget))
            frac = float(kv_fraction(profile, cl.device, tp_i, pp_i, bud)[0])
        graphs = None
        if profile.cuda_graphs.modelled and gpu_rules(profile, cl.device):
            tp_i, bud = np.array([float(p.tp * p.dp)]), np.array([float(p.budget)])
            graphs = int(graph_limit(profile, cl.device, tp_i, bud, float(w.max_batch or 1))[0])
            if profile.cuda_graphs.scope == "tokens":  # vLLM captures at most an engine's budget
                graphs = min(graphs, p.max_num_batched_tokens)
        fixed.append(replace(p, memory_fraction=frac, graph_limit=graphs))
    pools = tuple(fixed)
    max_model_len = w.isl + w.osl
    for p in pools:
        _check_engine(p, engine, chunked, max_model_len)
        if p.devices > dpn and p.devices % dpn:
            raise unsupported(
                f"a {p.role} instance of {p.devices} devices on nodes of {dpn}",
                "a deployment manifest",
                "an instance spanning nodes must fill each of them; use --gpus-per-node or another layout",
            )
    scored = {
        k: record.get(k)
        for k in ("short", "ttft_ms", "tpot_ms", "output_tokens_per_s", "devices", "idle_devices")
        if record.get(k) is not None
    }
    return Plan(
        model=model,
        checkpoint=checkpoint,
        engine=engine,
        device=device,
        vendor=cl.device.vendor,
        devices_per_node=dpn,
        max_model_len=max_model_len,
        dtype=dtype,
        quantization=quant,
        kv_cache_dtype=kv_cache_dtype,
        chunked_prefill=chunked,
        prefix_caching=w.prefix_cache_hit_rate > 0,
        pools=pools,
        short=str(record.get("short", "")),
        scored=scored,
        ep_dispatch=w.ep_dispatch,
        ep_overlap=w.ep_overlap,
    )


def _wide_ep(plan: Plan, pool: Pool) -> tuple[bool, bool]:
    """(DeepEP, two-batch overlap) on ``pool``: where the plan was priced with them, i.e. where its
    experts' all-to-alls run, expert parallelism under attention DP (a pool without attention DP
    all-reduces the experts' output as TP does, whatever the workload asked)."""
    from autopar.serving.backends import wide_ep

    wide = bool(wide_ep(pool.ep, pool.dp))
    return wide and plan.ep_dispatch == "deepep", wide and plan.ep_overlap


# DeepEP's kernels per pool role: the high-throughput (normal) ones for prompts, the low-latency ones
# (masked layout, CUDA graphs) for decode-only workers; one engine that runs both takes vLLM's
# high-throughput backend and SGLang's auto mode.
VLLM_DEEPEP = {
    "prefill": "deepep_high_throughput",
    "decode": "deepep_low_latency",
    "worker": "deepep_high_throughput",
}
SGLANG_DEEPEP_MODE = {"prefill": "normal", "decode": "low_latency", "worker": "auto"}


def vllm_args(plan: Plan, pool: Pool, *, parallel: bool = True) -> list[str]:
    """vLLM engine arguments of one pool (``parallel=False`` leaves out TP and DP, which the llm-d
    chart writes from ``parallelism``)."""
    a: list[str] = []
    if parallel:
        a += ["--tensor-parallel-size", str(pool.tp)]
        if pool.dp > 1:
            a += ["--data-parallel-size", str(pool.dp)]
    a += ["--pipeline-parallel-size", str(pool.pp)]
    if pool.expert_parallel:
        a.append("--enable-expert-parallel")
    deepep, overlap = _wide_ep(plan, pool)
    if deepep:
        a += ["--all2all-backend", VLLM_DEEPEP[pool.role]]
    if overlap:
        a.append("--enable-dbo")
    a += [
        "--max-model-len",
        str(plan.max_model_len),
        "--max-num-seqs",
        str(pool.max_num_seqs),
        "--max-num-batched-tokens",
        str(pool.max_num_batched_tokens),
        "--dtype",
        plan.dtype,
    ]
    if plan.quantization:
        a += ["--quantization", plan.quantization]
    a += ["--kv-cache-dtype", plan.kv_cache_dtype, "--gpu-memory-utilization", f"{pool.memory_fraction:g}"]
    if pool.graph_limit is not None:
        cc = {"max_cudagraph_capture_size": pool.graph_limit}
        a += ["--compilation-config", json.dumps(cc, separators=(",", ":"))]
    a.append("--enable-chunked-prefill" if plan.chunked_prefill else "--no-enable-chunked-prefill")
    if plan.prefix_caching:
        a.append("--enable-prefix-caching")
    return a


def sglang_args(plan: Plan, pool: Pool) -> list[str]:
    """SGLang ``ServerArgs`` of one pool, as Dynamo 1.5's sglang runtime (SGLang 0.5.17) takes them:
    one server per instance, ``--tp-size`` its TP (all ranks under attention DP, with ``--dp-size``
    and ``--enable-dp-attention``), ``--ep-size`` dividing it; ``--max-running-requests`` and
    ``--chunked-prefill-size`` are the instance's totals (SGLang divides both by the attention-DP
    size: server_args.py, pool_configurator.py)."""
    a = ["--tp-size", str(pool.tp * pool.dp)]
    if pool.dp > 1:
        a += ["--dp-size", str(pool.dp), "--enable-dp-attention"]
    if pool.ep > 1:
        a += ["--ep-size", str(pool.ep)]
    deepep, overlap = _wide_ep(plan, pool)
    if deepep:
        a += ["--moe-a2a-backend", "deepep", "--deepep-mode", SGLANG_DEEPEP_MODE[pool.role]]
    if overlap:
        a.append("--enable-two-batch-overlap")
    a += [
        "--pp-size",
        str(pool.pp),
        "--context-length",
        str(plan.max_model_len),
        "--max-running-requests",
        str(max(1, math.ceil(pool.batch - 1e-9))),
        "--chunked-prefill-size",
        str(pool.budget if plan.chunked_prefill else -1),
        "--max-prefill-tokens",
        str(pool.budget),
        "--dtype",
        plan.dtype,
    ]
    if plan.quantization:
        a += ["--quantization", plan.quantization]
    a += ["--kv-cache-dtype", {"fp8": "fp8_e4m3"}.get(plan.kv_cache_dtype, plan.kv_cache_dtype)]
    a += ["--mem-fraction-static", f"{pool.memory_fraction:g}"]
    if pool.graph_limit is not None:
        a += ["--cuda-graph-max-bs", str(pool.graph_limit)]
    return a


def _nodes(plan: Plan, pool: Pool) -> tuple[int, int]:
    """(nodes per instance, devices per pod)."""
    if pool.devices <= plan.devices_per_node:
        return 1, pool.devices
    return pool.devices // plan.devices_per_node, plan.devices_per_node


def _header(plan: Plan, fmt: str) -> str:
    pools = "; ".join(
        f"{p.role}: {p.replicas} x (tp {p.tp}, pp {p.pp}, dp {p.dp}{f', ep {p.ep}' if p.ep > 1 else ''}; "
        f"{p.devices} {plan.device} each)"
        for p in plan.pools
    )
    scored = json.dumps(plan.scored, sort_keys=True, separators=(",", ":"), default=float)
    return (
        f"# {FORMATS[fmt]}, written by autopar export for the serve layout {plan.short}\n"
        f"# {plan.engine} workers; model {plan.model} ({plan.checkpoint}); {pools}\n"
        f"# scored: {scored}\n"
    )


def _dynamo(plan: Plan, opts: DeployOptions) -> dict[str, Any]:
    if plan.vendor != "nvidia":
        raise unsupported(
            f"a {plan.vendor} device ({plan.device})",
            "dynamo",
            "Dynamo's vLLM runtime images are CUDA builds; use --format llm-d",
        )
    image = opts.image or DEFAULT_IMAGE["dynamo", plan.engine]
    env_from = [{"secretRef": {"name": opts.hf_token_secret}}] if opts.hf_token_secret else []
    comps: list[dict[str, Any]] = [
        {
            "name": "Frontend",
            "type": "frontend",
            "replicas": 1,
            "podTemplate": {
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "command": ["python3", "-m", "dynamo.frontend"],
                            "args": ["--http-port", "8000"],
                        }
                    ]
                }
            },
        }
    ]
    prefix = {"vllm": "Vllm", "sglang": "Sglang"}[plan.engine]
    names = {"worker": "Worker", "prefill": "PrefillWorker", "decode": "DecodeWorker"}
    for p in plan.pools:
        nodes, per_pod = _nodes(plan, p)
        if plan.engine == "vllm":
            args = ["--model", plan.checkpoint, "--served-model-name", plan.checkpoint, *vllm_args(plan, p)]
            if p.role != "worker":
                args += ["--disaggregation-mode", p.role, "--kv-transfer-config", KV_TRANSFER_CONFIG]
        else:  # the frontend tokenizes (examples/backends/sglang/deploy/*.yaml)
            args = ["--model-path", plan.checkpoint, "--served-model-name", plan.checkpoint]
            args += ["--skip-tokenizer-init", *sglang_args(plan, p)]
            if p.role != "worker":
                args += ["--disaggregation-mode", p.role, "--disaggregation-transfer-backend", "nixl"]
                args += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]
        container: dict[str, Any] = {
            "name": "main",
            "image": image,
            "command": ["python3", "-m", f"dynamo.{plan.engine}"],
            "args": args,
            "resources": {"limits": {"nvidia.com/gpu": str(per_pod)}},
        }
        if env_from:
            container["envFrom"] = env_from
        comp: dict[str, Any] = {
            "name": prefix + names[p.role],
            "type": p.role,
            "replicas": p.replicas,
            "podTemplate": {"spec": {"containers": [container]}},
        }
        if nodes > 1:
            comp["multinode"] = {"nodeCount": nodes}
        comps.append(comp)
    meta: dict[str, Any] = {"name": opts.name}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    return {
        "apiVersion": DYNAMO_API,
        "kind": "DynamoGraphDeployment",
        "metadata": meta,
        "spec": {"backendFramework": plan.engine, "components": comps},
    }


def _llmd(plan: Plan, opts: DeployOptions) -> dict[str, Any]:
    acc = LLMD_ACCELERATOR.get(plan.vendor)
    if acc is None:
        raise unsupported(
            f"a {plan.vendor} device ({plan.device})",
            "llm-d",
            "llm-d-modelservice schedules nvidia, amd, intel-gaudi and google accelerators",
        )
    if plan.engine != "vllm":
        raise unsupported(
            f"{plan.engine} workers",
            "llm-d",
            "llm-d-modelservice's vllmServe command runs vLLM; use --format dynamo for SGLang",
        )
    image = opts.image or DEFAULT_IMAGE["llm-d", "vllm"]
    by_role = {p.role: p for p in plan.pools}

    def section(p: Pool | None) -> dict[str, Any]:
        if p is None:
            return {"create": False, "replicas": 0}
        if _nodes(plan, p)[0] > 1:
            raise unsupported(
                f"a {p.role} instance of {p.devices} devices on nodes of {plan.devices_per_node}",
                "llm-d",
                "the chart's vllmServe command runs an instance in one pod; a multi-node instance "
                "needs llm-d's wide-EP LeaderWorkerSet guide (or --gpus-per-node if nodes are larger)",
            )
        args = vllm_args(plan, p, parallel=False)
        container: dict[str, Any] = {
            "name": "vllm",
            "image": image,
            "modelCommand": "vllmServe",
            "args": args,
        }
        if p.role != "worker":  # NIXL KV transfer between prefill and decode pods (values-pd.yaml)
            args += ["--kv-transfer-config", KV_TRANSFER_CONFIG]
            container["env"] = [
                {
                    "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                },
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_PORT)},
            ]
            container["ports"] = [
                {"containerPort": 8200 if p.role == "decode" else 8000, "protocol": "TCP"},
                {"containerPort": NIXL_PORT, "protocol": "TCP"},
            ]
        res = LLMD_RESOURCE[acc]
        # the chart counts tensor x dataLocal devices per pod; pipeline stages are devices too
        container["resources"] = {"limits": {res: str(p.devices)}, "requests": {res: str(p.devices)}}
        container["mountModelVolume"] = True
        return {
            "create": True,
            "replicas": p.replicas,
            "parallelism": {"tensor": p.tp, "data": p.dp, "dataLocal": p.dp, "workers": 1},
            "containers": [container],
        }

    model_artifacts: dict[str, Any] = {
        "name": plan.checkpoint,
        "uri": f"hf://{plan.checkpoint}",
        "labels": {"llm-d.ai/inference-serving": "true", "llm-d.ai/model": opts.name},
    }
    if opts.hf_token_secret:
        model_artifacts["authSecretName"] = opts.hf_token_secret
    return {
        "multinode": False,
        "accelerator": {"type": acc},
        "modelArtifacts": model_artifacts,
        # the routing sidecar sends prompts to a prefill pod (nixlv2 connector) when there is one
        "routing": {"servicePort": 8000, "proxy": {"enabled": plan.disaggregated, "connector": "nixlv2"}},
        "decode": section(by_role.get("decode") or by_role.get("worker")),
        "prefill": section(by_role.get("prefill")),
    }


def _no_aliases_dumper() -> type:
    import yaml

    class NoAliases(yaml.SafeDumper):
        """Writes a repeated object out again instead of as a YAML anchor and alias."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    return NoAliases


def render_deploy(record: Mapping[str, Any], fmt: str, opts: DeployOptions | None = None) -> str:
    """The ``fmt`` manifest (``dynamo`` or ``llm-d``) of one ``serve --json`` result, as YAML text."""
    import yaml

    _NoAliases = _no_aliases_dumper()
    if fmt not in FORMATS:
        raise ExportError(f"unknown deployment format {fmt!r}", f"one of: {', '.join(FORMATS)}")
    opts = opts or DeployOptions()
    opts.check()
    plan = plan_from_record(record, opts)
    doc = _dynamo(plan, opts) if fmt == "dynamo" else _llmd(plan, opts)
    body = yaml.dump(doc, Dumper=_NoAliases, sort_keys=False, width=100000)
    return _header(plan, fmt) + body


def _pool_view(role: str, replicas: int, flags: Mapping[str, Any], fmt: str, **extra: Any) -> dict[str, Any]:
    def num(key: str, default: int | None = None) -> int:
        if key not in flags:
            if default is None:
                raise ExportError(f"{key} missing from a {fmt} worker")
            return default
        return to_int(flags[key], key, fmt)

    view = {
        "role": role,
        "replicas": replicas,
        "tp": num("--tensor-parallel-size", 1),
        "pp": num("--pipeline-parallel-size", 1),
        "dp": num("--data-parallel-size", 1),
        "expert_parallel": bool(flags.get("--enable-expert-parallel")),
        "max_num_seqs": num("--max-num-seqs"),
        "max_num_batched_tokens": num("--max-num-batched-tokens"),
        "max_model_len": num("--max-model-len"),
        "dtype": flags.get("--dtype"),
        "quantization": flags.get("--quantization"),
        "kv_cache_dtype": flags.get("--kv-cache-dtype", "auto"),
        "memory_fraction": (
            float(flags["--gpu-memory-utilization"]) if "--gpu-memory-utilization" in flags else None
        ),
        "graph_limit": (
            json.loads(flags["--compilation-config"])["max_cudagraph_capture_size"]
            if "--compilation-config" in flags
            else None
        ),
        "chunked_prefill": not flags.get("--no-enable-chunked-prefill"),
        "prefix_caching": bool(flags.get("--enable-prefix-caching")),
        "kv_transfer_config": flags.get("--kv-transfer-config"),
        "all2all_backend": flags.get("--all2all-backend"),
        "two_batch_overlap": bool(flags.get("--enable-dbo")),
        "engine": "vllm",
    }
    view.update(extra)
    return view


def _sglang_view(
    comp: Mapping[str, Any], c: Mapping[str, Any], per_pod: int, nodes: int, fmt: str
) -> dict[str, Any]:
    flags = parse_flags(list(c["args"]), SGLANG_VALUE_FLAGS, SGLANG_BOOL_FLAGS, fmt)

    def num(key: str, default: int | None = None) -> int:
        if key not in flags:
            if default is None:
                raise ExportError(f"{key} missing from a {fmt} SGLang worker")
            return default
        return int(flags[key]) if key == "--chunked-prefill-size" else to_int(flags[key], key, fmt)

    mode = flags.get("--disaggregation-mode", "null")
    role = {"null": "worker"}.get(mode, mode)
    if role != comp.get("type"):
        raise ExportError(f"component {comp.get('name')!r} of type {comp.get('type')} runs {mode}")
    tp, dp = num("--tp-size", 1), num("--dp-size", 1)
    if dp > 1 and not flags.get("--enable-dp-attention"):
        raise ExportError(f"component {comp.get('name')!r}: --dp-size without --enable-dp-attention")
    return {
        "role": role,
        "replicas": int(comp["replicas"]),
        "engine": "sglang",
        "tp": tp // dp,
        "pp": num("--pp-size", 1),
        "dp": dp,
        "ep": num("--ep-size", 1),
        "expert_parallel": num("--ep-size", 1) > 1,
        "max_running_requests": num("--max-running-requests"),
        "chunked_prefill_size": num("--chunked-prefill-size"),
        "max_prefill_tokens": num("--max-prefill-tokens"),
        "max_model_len": num("--context-length"),
        "dtype": flags.get("--dtype"),
        "quantization": flags.get("--quantization"),
        "kv_cache_dtype": flags.get("--kv-cache-dtype", "auto"),
        "memory_fraction": float(flags["--mem-fraction-static"])
        if "--mem-fraction-static" in flags
        else None,
        "graph_limit": num("--cuda-graph-max-bs") if "--cuda-graph-max-bs" in flags else None,
        "transfer_backend": flags.get("--disaggregation-transfer-backend"),
        "moe_a2a_backend": flags.get("--moe-a2a-backend", "none"),
        "deepep_mode": flags.get("--deepep-mode"),
        "two_batch_overlap": bool(flags.get("--enable-two-batch-overlap")),
        "devices_per_pod": per_pod,
        "nodes": nodes,
        "model": flags.get("--model-path"),
    }


def read_deploy(text: str, fmt: str) -> list[dict[str, Any]]:
    """The pools a ``dynamo`` or ``llm-d`` manifest deploys, read back: per pool its role, replicas,
    devices per pod, nodes per instance and the vLLM engine settings of its workers. Every worker
    argument must be one :data:`VLLM_VALUE_FLAGS` / :data:`VLLM_BOOL_FLAGS` (and, for Dynamo,
    :data:`DYNAMO_VALUE_FLAGS`) names; anything else is an :class:`ExportError`."""
    from autopar.files import parse_yaml

    doc = parse_yaml(text, f"{fmt} manifest")
    if not isinstance(doc, Mapping):
        raise ExportError(f"the {fmt} manifest is not a mapping")
    pools: list[dict[str, Any]] = []
    if fmt == "dynamo":
        for comp in doc["spec"]["components"]:
            if comp.get("type") == "frontend":
                continue
            (c,) = comp["podTemplate"]["spec"]["containers"]
            per_pod = to_int(c["resources"]["limits"]["nvidia.com/gpu"], "nvidia.com/gpu", fmt)
            nodes = int(comp.get("multinode", {}).get("nodeCount", 1))
            if c.get("command") == ["python3", "-m", "dynamo.sglang"]:
                pools.append(_sglang_view(comp, c, per_pod, nodes, fmt))
                continue
            if c.get("command") != ["python3", "-m", "dynamo.vllm"]:
                raise ExportError(
                    f"component {comp.get('name')!r} runs neither dynamo.vllm nor dynamo.sglang"
                )
            flags = parse_flags(list(c["args"]), VLLM_VALUE_FLAGS + DYNAMO_VALUE_FLAGS, VLLM_BOOL_FLAGS, fmt)
            mode = flags.get("--disaggregation-mode", "agg")
            role = {"agg": "worker"}.get(mode, mode)
            if role != comp.get("type"):
                raise ExportError(f"component {comp.get('name')!r} of type {comp.get('type')} runs {mode}")
            pools.append(
                _pool_view(
                    role,
                    int(comp["replicas"]),
                    flags,
                    fmt,
                    devices_per_pod=per_pod,
                    nodes=nodes,
                    model=flags.get("--model"),
                )
            )
        return pools
    if fmt != "llm-d":
        raise ExportError(f"unknown deployment format {fmt!r}", f"one of: {', '.join(FORMATS)}")
    res = LLMD_RESOURCE[doc["accelerator"]["type"]]
    for key in ("prefill", "decode"):
        sec = doc[key]
        if not sec.get("create"):
            continue
        (c,) = sec["containers"]
        if c.get("modelCommand") != "vllmServe":
            raise ExportError(f"the {key} container is not the chart's vllmServe command")
        flags = parse_flags(list(c["args"]), VLLM_VALUE_FLAGS, VLLM_BOOL_FLAGS, fmt)
        par = sec["parallelism"]
        for k, v in (("--tensor-parallel-size", par["tensor"]), ("--data-parallel-size", par["data"])):
            if k in flags:
                raise ExportError(f"{k} in the {key} args: the chart writes it from parallelism")
            flags = {**flags, k: str(v)}
        role = key if doc["prefill"].get("create") else "worker"
        pools.append(
            _pool_view(
                role,
                int(sec["replicas"]),
                flags,
                fmt,
                devices_per_pod=to_int(c["resources"]["limits"][res], res, fmt),
                nodes=int(par.get("workers", 1)),
                model=doc["modelArtifacts"]["name"],
            )
        )
    return pools
