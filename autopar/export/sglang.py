"""SGLang serving command (``python -m sglang.launch_server``; ``ServerArgs`` flags of SGLang 0.5.x).

* ``--tp-size``, ``--pp-size``, ``--dp-size`` (DP replicas without DP attention: each replica
  runs on tp*pp GPUs, so the world is tp*pp*dp as in a layout).
* ``--ep-size`` is an **integer** in SGLang (unlike vLLM's switch) and partitions each replica's
  TP ranks: ``ep`` must divide ``tp`` and the experts' TP is ``tp / ep``, so a layout with
  ``ep > 1`` is expressible only when ``etp == tp // ep``. With ``ep == 1`` the layout's ``etp``
  is kept in the autopar header.
* attention data parallelism (a ``serve`` layout scored with attention DP: ``ep`` divides
  ``tp*dp`` and ``etp == tp*dp/ep``, e.g. DeepSeek-V3 attention-DP 16 with EP 16, or Qwen3-30B-A3B
  attention-DP 8 with EP 4 and the experts split over 2) is one server whose ``--tp-size`` spans
  every rank: ``--tp-size tp*dp --attn-dp-size dp --ep-size ep`` (SGLang 0.5.23's spelling,
  server_args.py; ``--enable-dp-attention --dp-size`` is deprecated there; the experts' TP is
  ``tp_size / ep_size``).
* ``micro_batch`` -> ``--max-running-requests`` (per scheduler, i.e. per DP replica when DP
  attention is off; with attention DP the flag is the server's total, which SGLang divides by
  ``attn_dp_size`` (pool_configurator.py), so ``micro_batch * dp`` is written); ``seq_len`` ->
  ``--context-length``.
* precision: ``--dtype bfloat16|float16|float32``; fp8 -> ``--dtype bfloat16 --quantization fp8``.
* refused: context parallel (SGLang's decode-context parallel reuses TP ranks), virtual stages,
  Megatron sequence parallelism, and non-default training-only settings.
* pipeline parallelism: ``--disable-overlap-schedule`` (SGLang 0.5.23 refuses its overlap scheduler
  with pp > 1).
* multi-node: ``--nnodes N --node-rank 0 --dist-init-addr "$MASTER_ADDR:$MASTER_PORT"``.
"""

from __future__ import annotations

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

FMT = "sglang"
DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}
# SGLang 0.5.23 refuses pipeline parallelism with its overlap scheduler (check_server_args:
# "Pipeline parallelism is not compatible with overlap schedule"): pp > 1 turns it off
BOOL_FLAGS = ("--disable-overlap-schedule", "--enable-two-batch-overlap")
VALUE_FLAGS = (
    "--model-path",
    "--tp-size",
    "--pp-size",
    "--dp-size",
    "--attn-dp-size",
    "--ep-size",
    "--context-length",
    "--max-running-requests",
    "--dtype",
    "--quantization",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--moe-a2a-backend",
)


@register
class SglangExporter(Exporter):
    name = FMT
    suffix = ".sh"
    description = "SGLang serving command (python -m sglang.launch_server)"
    serving = True
    moe_options = True

    def _render(self, layout: Layout, job: Job) -> str:
        for cond, feature, hint in (
            (layout.cp > 1, f"context parallel (cp={layout.cp})", "SGLang's DCP reuses TP ranks"),
            (layout.vpp > 1, f"virtual pipeline stages (vpp={layout.vpp})", None),
            (layout.sp, "sequence parallel (sp=True)", "SGLang has no Megatron-style sequence parallelism"),
            (
                layout.precision not in DTYPE,
                f"{layout.precision} training precision",
                "a block-scaled training recipe, not a serving dtype/quantization",
            ),
        ):
            if cond:
                raise unsupported(feature, FMT, hint)
        world = layout.tp * layout.dp
        plain = (layout.ep == 1 and layout.etp <= layout.tp) or (
            layout.tp % layout.ep == 0 and layout.etp == layout.tp // layout.ep
        )
        # attention DP: one server whose --tp-size spans the dp attention ranks; --ep-size divides it
        # and the experts' TP is the rest (SGLang: moe_tp_size = tp_size / ep_size)
        attn_dp = not plain and layout.dp > 1 and world % layout.ep == 0 and layout.etp == world // layout.ep
        if not plain and not attn_dp:
            raise unsupported(
                f"expert parallel ep={layout.ep}, etp={layout.etp} with tp={layout.tp}",
                FMT,
                "SGLang splits each replica's TP ranks (ep divides tp, etp = tp/ep), or runs "
                "attention DP over tp*dp ranks with ep dividing them and etp = tp*dp/ep",
            )
        a = [
            "python -m sglang.launch_server",
            flag("--model-path", serving_model_ref(job.model, FMT)),
        ]
        if attn_dp:
            a += [
                flag("--tp-size", layout.tp * layout.dp),
                flag("--pp-size", layout.pp),
                flag("--attn-dp-size", layout.dp),
            ]
        else:
            a += [flag("--tp-size", layout.tp), flag("--pp-size", layout.pp), flag("--dp-size", layout.dp)]
        if layout.ep > 1:
            a.append(flag("--ep-size", layout.ep))
        a += _moe_runtime_flags(layout, job, attn_dp)
        a += [
            flag("--context-length", job.seq_len),
            flag("--max-running-requests", layout.micro_batch * (layout.dp if attn_dp else 1)),
            flag("--dtype", DTYPE[layout.precision]),
        ]
        if layout.precision == "fp8":
            a.append(flag("--quantization", "fp8"))
        if layout.pp > 1:
            a.append(flag("--disable-overlap-schedule"))
        if job.nnodes > 1:
            a += [
                flag("--nnodes", job.nnodes),
                flag("--node-rank", 0),
                '--dist-init-addr "${MASTER_ADDR}:${MASTER_PORT}"',
            ]
        return "\n".join(
            [
                header_line(FMT, job, inert_etp(layout)),
                f"# SGLang serving command for layout: {layout.short()}",
                shell_lines(a),
            ]
        )

    def _parse(self, text: str) -> tuple[Layout, Job]:
        header = read_header(text, FMT)
        _, f = split_command(text, ["python", "-m", "sglang.launch_server"], VALUE_FLAGS, BOOL_FLAGS, FMT)

        def num(key: str, default: int | None = None) -> int:
            if key not in f:
                if default is None:
                    raise ExportError(f"{key} missing from the {FMT} text")
                return default
            return to_int(f[key], key, FMT)

        tp, pp, dp, ep = num("--tp-size", 1), num("--pp-size", 1), num("--dp-size", 1), num("--ep-size", 1)
        mb = num("--max-running-requests")
        attn_dp = num("--attn-dp-size", 1)
        world = tp
        if attn_dp > 1:  # one server: --tp-size spans every rank, requests split over attention DP
            if num("--dp-size", 1) > 1 or tp % ep:
                raise unsupported(
                    "--attn-dp-size with --dp-size, or with an --ep-size that does not divide --tp-size",
                    "autopar (reading " + FMT + ")",
                    "autopar writes attention DP with --ep-size dividing --tp-size and no --dp-size",
                )
            tp, dp = exact_div(tp, attn_dp, "--tp-size / --attn-dp-size", FMT), attn_dp
            mb = exact_div(mb, attn_dp, "--max-running-requests / --attn-dp-size", FMT)
        if "--model-path" not in f:
            raise ExportError(f"--model-path missing from the {FMT} text")
        model = f["--model-path"]
        a2a = f.get("--moe-a2a-backend", "none")
        if a2a not in ("none", "deepep"):
            raise unsupported(
                f"--moe-a2a-backend {a2a}", "autopar (reading " + FMT + ")", "autopar prices none or deepep"
            )
        if header and model == serving_model_ref(str(header["job"].get("model", "")), FMT):
            model = header["job"]["model"]  # the checkpoint named for the job's preset or config
        job = merge_job(
            header,
            {
                "model": model,
                "seq_len": num("--context-length"),
                "num_devices": tp * pp * dp,
                "global_batch": mb * dp,
                "moe_dispatcher": "deepep" if a2a == "deepep" else "alltoall",
                "moe_a2a_overlap": bool(f.get("--enable-two-batch-overlap")),
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
        if attn_dp > 1:
            etp = world // ep
        else:
            etp = exact_div(tp, ep, "tp / ep", FMT) if ep > 1 else etp_from_header(header, tp)
        layout = build_layout(
            dict(
                tp=tp,
                pp=pp,
                dp=dp,
                ep=ep,
                etp=etp,
                micro_batch=mb,
                grad_accum=exact_div(job.global_batch, mb * dp, "batch", FMT),
                precision=precision,
                zero=0,  # serving: no optimizer (check_serving)
            ),
            FMT,
        )
        return layout, job


def _moe_runtime_flags(layout: Layout, job: Job, attn_dp: bool) -> list[str]:
    """The expert all-to-all runtime the plan was priced with: DeepEP (``--moe-a2a-backend deepep``,
    its mode left at ``auto``) and two-batch overlap (``--enable-two-batch-overlap``). Both run under
    attention DP with the experts over every rank (SGLang sets ep_size = tp_size for DeepEP)."""
    deepep, overlap = job.moe_dispatcher == "deepep", job.moe_a2a_overlap
    if not (deepep or overlap):
        return []
    if not (attn_dp and layout.ep == layout.tp * layout.dp):
        raise unsupported(
            f"MoE dispatcher {job.moe_dispatcher}" + (" with two-batch overlap" if overlap else ""),
            FMT,
            "SGLang runs DeepEP and two-batch overlap under attention DP with --ep-size equal to --tp-size",
        )
    return ([flag("--moe-a2a-backend", "deepep")] if deepep else []) + (
        [flag("--enable-two-batch-overlap")] if overlap else []
    )
