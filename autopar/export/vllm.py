"""vLLM serving command (``vllm serve``; flags of vLLM 0.11+ ``EngineArgs``/``ParallelConfig``).

* ``--tensor-parallel-size``, ``--pipeline-parallel-size``, ``--data-parallel-size``;
  ``cp`` -> ``--prefill-context-parallel-size`` (PCP multiplies vLLM's world size as CP does in
  a layout; vLLM does not support PCP together with DP, so ``cp > 1`` needs ``dp == 1``).
* EP is a **boolean** in vLLM (``--enable-expert-parallel``): the experts are sharded over all
  TP*DP*PCP ranks with no expert tensor parallelism. A layout with ``ep > 1`` is expressible only
  when ``ep == tp*dp*cp`` and ``etp == 1``; anything else is an error. With ``ep == 1`` vLLM
  tensor-shards the experts (the layout's ``etp`` is then kept in the autopar header).
* ``micro_batch`` -> ``--max-num-seqs`` (concurrent sequences per engine, i.e. per DP rank);
  ``seq_len`` -> ``--max-model-len``.
* precision: ``--dtype bfloat16|float16|float32``; fp8 -> ``--dtype bfloat16 --quantization fp8``.
* refused: virtual stages, Megatron sequence parallelism, and (as for every serving format) the
  training-only settings zero/shard_group/recompute/grad_accum/offload at non-default values.
* multi-node: ``--nnodes N --node-rank 0 --master-addr "$MASTER_ADDR"`` (run the same command on
  node i with ``--node-rank i``).
"""

from __future__ import annotations

import shlex

from autopar.export._cmd import split_command
from autopar.export.base import (
    Exporter,
    ExportError,
    Job,
    build_layout,
    etp_from_header,
    exact_div,
    flag,
    header_line,
    inert_etp,
    merge_job,
    read_header,
    register,
    serving_model_ref,
    shell_lines,
    to_int,
    unsupported,
)
from autopar.layout import Layout

FMT = "vllm"
DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}
VALUE_FLAGS = (
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--prefill-context-parallel-size",
    "--max-model-len",
    "--max-num-seqs",
    "--dtype",
    "--quantization",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--all2all-backend",
)
BOOL_FLAGS = ("--enable-expert-parallel", "--enable-dbo")
# vLLM's DeepEP all2all backends (ParallelConfig.all2all_backend, vLLM 0.34): high-throughput kernels
# for prefill and mixed batches, low-latency ones (CUDA-graph friendly) for decode-only engines
DEEPEP_BACKENDS = ("deepep_high_throughput", "deepep_low_latency")


@register
class VllmExporter(Exporter):
    name = FMT
    suffix = ".sh"
    description = "vLLM serving command (vllm serve)"
    serving = True
    moe_options = True

    def _render(self, layout: Layout, job: Job) -> str:
        for cond, feature, hint in (
            (layout.vpp > 1, f"virtual pipeline stages (vpp={layout.vpp})", None),
            (layout.sp, "sequence parallel (sp=True)", "vLLM has no Megatron-style sequence parallelism"),
            (
                layout.precision not in DTYPE,
                f"{layout.precision} training precision",
                "a block-scaled training recipe, not a serving dtype/quantization",
            ),
            (
                layout.cp > 1 and layout.dp > 1,
                f"context parallel (cp={layout.cp}) with data parallel (dp={layout.dp})",
                "vLLM does not combine prefill context parallel with DP",
            ),
        ):
            if cond:
                raise unsupported(feature, FMT, hint)
        width = layout.tp * layout.dp * layout.cp
        if layout.ep > 1 and (layout.ep != width or layout.etp != 1):
            raise unsupported(
                f"expert parallel ep={layout.ep}, etp={layout.etp}",
                FMT,
                f"vLLM's EP is a switch: EP width = tp*dp*cp = {width} with etp = 1",
            )
        a = [
            f"vllm serve {shlex.quote(serving_model_ref(job.model, FMT))}",
            flag("--tensor-parallel-size", layout.tp),
            flag("--pipeline-parallel-size", layout.pp),
            flag("--data-parallel-size", layout.dp),
        ]
        if layout.cp > 1:
            a.append(flag("--prefill-context-parallel-size", layout.cp))
        if layout.ep > 1:
            a.append(flag("--enable-expert-parallel"))
        a += _moe_runtime_flags(layout, job)
        a += [
            flag("--max-model-len", job.seq_len),
            flag("--max-num-seqs", layout.micro_batch),
            flag("--dtype", DTYPE[layout.precision]),
        ]
        if layout.precision == "fp8":
            a.append(flag("--quantization", "fp8"))
        if job.nnodes > 1:
            a += [flag("--nnodes", job.nnodes), flag("--node-rank", 0), '--master-addr "${MASTER_ADDR}"']
        return "\n".join(
            [
                header_line(FMT, job, inert_etp(layout)),
                f"# vLLM serving command for layout: {layout.short()}",
                shell_lines(a),
            ]
        )

    def _parse(self, text: str) -> tuple[Layout, Job]:
        header = read_header(text, FMT)
        (model,), f = split_command(text, ["vllm", "serve"], VALUE_FLAGS, BOOL_FLAGS, FMT, positional=1)

        def num(key: str, default: int | None = None) -> int:
            if key not in f:
                if default is None:
                    raise ExportError(f"{key} missing from the {FMT} text")
                return default
            return to_int(f[key], key, FMT)

        tp, pp, dp = (
            num("--tensor-parallel-size", 1),
            num("--pipeline-parallel-size", 1),
            num("--data-parallel-size", 1),
        )
        cp = num("--prefill-context-parallel-size", 1)
        mb = num("--max-num-seqs")
        backend = f.get("--all2all-backend")
        if backend is not None and backend not in DEEPEP_BACKENDS:
            raise unsupported(
                f"--all2all-backend {backend}",
                "autopar (reading " + FMT + ")",
                f"autopar prices the default all2all or DeepEP's ({', '.join(DEEPEP_BACKENDS)})",
            )
        if header and model == serving_model_ref(str(header["job"].get("model", "")), FMT):
            model = header["job"]["model"]  # the checkpoint named for the job's preset or config
        job = merge_job(
            header,
            {
                "model": model,
                "seq_len": num("--max-model-len"),
                "num_devices": tp * pp * dp * cp,
                "global_batch": mb * dp,
                "moe_dispatcher": "deepep" if backend else "alltoall",
                "moe_a2a_overlap": bool(f.get("--enable-dbo")),
            },
            FMT,
        )
        if num("--nnodes", 1) != job.nnodes:
            raise ExportError(f"--nnodes {num('--nnodes', 1)} but the job spans {job.nnodes} node(s) ({FMT})")
        dtype, quant = f.get("--dtype", "bfloat16"), f.get("--quantization")
        if quant not in (None, "fp8") or (quant == "fp8" and dtype != "bfloat16"):
            raise unsupported(f"--quantization {quant} with --dtype {dtype}", "autopar (reading " + FMT + ")")
        precision = "fp8" if quant else {v: k for k, v in DTYPE.items() if k != "fp8"}.get(dtype)
        if precision is None:
            raise ExportError(f"--dtype {dtype!r} in the {FMT} text")
        ep = tp * dp * cp if f.get("--enable-expert-parallel") else 1
        layout = build_layout(
            dict(
                tp=tp,
                pp=pp,
                dp=dp,
                cp=cp,
                ep=ep,
                etp=1 if ep > 1 else etp_from_header(header, tp),
                micro_batch=mb,
                grad_accum=exact_div(job.global_batch, mb * dp, "batch", FMT),
                precision=precision,
                zero=0,  # serving: no optimizer (check_serving)
            ),
            FMT,
        )
        return layout, job


def _moe_runtime_flags(layout: Layout, job: Job) -> list[str]:
    """The expert all-to-all runtime the plan was priced with: DeepEP (``--all2all-backend
    deepep_high_throughput``: one engine runs prefill and decode) and dual-batch overlap
    (``--enable-dbo``). vLLM runs both between data-parallel ranks with expert parallelism over all
    of them; anything else would launch another runtime than the one scored."""
    deepep, overlap = job.moe_dispatcher == "deepep", job.moe_a2a_overlap
    if not (deepep or overlap):
        return []
    if not (layout.ep > 1 and layout.dp > 1):
        raise unsupported(
            f"MoE dispatcher {job.moe_dispatcher}" + (" with two-batch overlap" if overlap else ""),
            FMT,
            "vLLM's all2all backends and --enable-dbo run expert parallelism between data-parallel "
            "ranks (--enable-expert-parallel with --data-parallel-size > 1)",
        )
    return ([flag("--all2all-backend", DEEPEP_BACKENDS[0])] if deepep else []) + (
        [flag("--enable-dbo")] if overlap else []
    )
