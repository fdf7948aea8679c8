"""``autopar dit``: diffusion transformers: ``model`` (spec), ``generate`` (inference layouts), ``train``.

The job is :class:`autopar.job.Job` with a ``generation`` or ``dit_training`` workload; the flags are
generated from those fields. Without layout flags a command searches every legal layout; with any,
it predicts that one layout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from autopar.cli.args import MAX_TOP, add_field_args, int_range, positive_int, print_json, print_names
from autopar.errors import AutoparError
from autopar.job import ClusterSpec, DiTTrainingWorkload, GenerationWorkload, Job, WorkloadKind

GEN_FIELDS = tuple(k for k in GenerationWorkload.model_fields if k != "kind")
TRAIN_FIELDS = tuple(k for k in DiTTrainingWorkload.model_fields if k != "kind")
GEN_LAYOUT = ("dp", "cfg", "pipefusion", "ulysses", "ring", "tp")
TRAIN_LAYOUT = ("dp", "shard", "ulysses", "ring", "tp", "recompute")


def _job(a: argparse.Namespace, kind: WorkloadKind, fields: tuple[str, ...]) -> Job:
    kw: dict[str, Any] = {k: getattr(a, k) for k in fields}
    kw.update(model=a.model, device=a.device, num_devices=a.num_devices, devices_per_node=a.devices_per_node)
    return Job.from_flat(kind=kind, memory_headroom=a.memory_headroom, **kw)


def _layout(a: argparse.Namespace, keys: tuple[str, ...]) -> dict[str, int] | None:
    lay = {k: getattr(a, f"l_{k}") for k in keys if getattr(a, f"l_{k}") is not None}
    return lay or None


def _gb(x: float) -> str:
    return f"{x / 2**30:.1f} GiB"  # GiB, as every other memory figure autopar prints


def _shape_lines(d: dict[str, Any]) -> list[str]:
    """The VAE and request lines of ``autopar dit model`` (an audio DiT: its fixed window)."""
    v, grid = d["vae"], tuple(d["token_grid"])
    if d["request"] is None:
        return [
            f"  VAE {v['name']}: {v['channels']} ch (audio); patch {tuple(d['patch'])}",
            f"  every forward: a window of {d['latent_shape'][2]} latents + {grid[2] - d['latent_shape'][2]} "
            f"prefix token(s) = {d['tokens_per_sample']} tokens (+ {d['text_tokens']} text)",
        ]
    r = d["request"]
    return [
        f"  VAE {v['name']}: {v['temporal']}x time, {v['spatial']}x space, {v['channels']} ch; patch {tuple(d['patch'])}",
        f"  request {r['width']}x{r['height']}, {r['frames']} frames -> latent {tuple(d['latent_shape'])} "
        f"-> tokens {grid} = {d['tokens_per_sample']} (+ {d['text_tokens']} text)",
    ]


def cmd_model(a: argparse.Namespace) -> int:
    from autopar.dit.spec import describe, is_dit_preset, list_dit_presets, load_dit

    if a.list:
        print_names(list_dit_presets(), a.json)
        return 0
    if not a.name:
        raise AutoparError(
            "autopar dit model needs a DiT preset id or a diffusers config.json", "or pass --list"
        )
    spec = load_dit(a.name)
    d = describe(spec, a.height, a.width, a.frames)
    meta, how = None, "a preset (no diffusers config.json)"
    if not is_dit_preset(a.name):  # a diffusers config: its own class's count beside autopar's
        from autopar.hf_meta import dit_meta_count
        from autopar.model import read_config_file

        path = Path(a.name).expanduser()
        meta, how = dit_meta_count(read_config_file(path))
    d["meta_params"], d["meta_note"] = meta, how
    if a.json:
        print_json(d)
        return 0
    pub = f" (published {d['published_params'] / 1e9:.2f}B)" if d["published_params"] else ""
    out = [
        f"{d['name']} [{d['id']}]  arch {d['arch']}",
        f"  hidden {d['hidden']}, heads {d['heads']} x {d['head_dim']}, ffn {d['ffn']}, blocks {d['layers']}"
        + (f" + {d['single_layers']} single-stream" if d["single_layers"] else "")
        + (f" + {d['refiner_blocks']} refiner" if d.get("refiner_blocks") else ""),
        f"  parameters {d['params'] / 1e9:.3f}B{pub}: "
        + ", ".join(f"{k} {v / 1e9:.3f}B" for k, v in d["params_breakdown"].items()),
        *_shape_lines(d),
        f"  one forward: {d['forward_tflops']['gemm']:.1f} TFLOP linear + {d['forward_tflops']['attention']:.1f} TFLOP attention; "
        + (f"VAE decode {d['vae_decode_tflops']:.1f} TFLOP; " if d["vae_decode_tflops"] is not None else "")
        + f"CFG {'yes' if d['cfg'] else 'no (guidance-distilled)'}",
        f"  source: {d['source']}",
        (
            f"  read by autopar's spec; {how}: {meta / 1e9:.3f}B (autopar {d['params'] / meta - 1:+.2%})"
            if meta
            else f"  read by autopar's spec; diffusers count: {how}"
        ),
    ]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _gen_request(job: Job):
    from autopar.dit.inference import Generation

    w = job.workload
    assert isinstance(w, GenerationWorkload)
    return Generation(
        height=w.height, width=w.width, frames=w.frames, steps=w.steps, batch=w.batch, cfg=w.cfg,
        cache_skip=w.cache_skip, compiled=w.compiled, parallel_vae=w.parallel_vae,
        warmup_steps=w.warmup_steps, offload_text_encoder=w.offload_text_encoder,
    )  # fmt: skip


def cmd_generate(a: argparse.Namespace) -> int:
    from autopar.dit import inference
    from autopar.dit.spec import load_dit
    from autopar.hardware import load_device

    if a.launcher_version is not None:  # refused before any work
        from autopar.export.xdit import XDIT_VERSIONS

        if a.export != "xdit":
            raise AutoparError("--launcher-version is for --export xdit", "add --export xdit or drop it")
        if a.launcher_version not in XDIT_VERSIONS:
            raise AutoparError(
                f"unknown xDiT launcher version {a.launcher_version!r}",
                f"use one of {', '.join(XDIT_VERSIONS)}",
            )
    job = _job(a, "generation", GEN_FIELDS)
    spec = load_dit(job.model)
    device = load_device(job.cluster.device)
    n = job.cluster.num_devices
    req = _gen_request(job)
    spec.token_grid(req.height, req.width, req.frames)  # resolution checks, one line each
    w = job.workload
    assert isinstance(w, GenerationWorkload)
    lay = _layout(a, GEN_LAYOUT)
    if lay is not None:
        inference.check_layout(spec, n, req, lay)
        lays = inference.single_layout(lay)
        pred = inference.predict(
            spec,
            device,
            n,
            req,
            lays,
            devices_per_node=job.cluster.devices_per_node,
            memory_headroom=job.memory_headroom,
        )
        rows = [inference.row(lays, pred, 0)]
    else:
        rows = inference.search(
            spec, device, n, req, latency_target_s=w.latency_target_s, top=a.top,
            devices_per_node=job.cluster.devices_per_node,
        )  # fmt: skip
    exports: list[str] = []
    if a.export:
        from autopar.export.xdit import export

        exports = [
            export(
                a.export,
                spec=spec,
                req=req,
                layout=r["layout"],
                num_devices=n,
                launcher_version=a.launcher_version,
            )
            for r in rows
        ]
    tokens = spec.tokens(req.height, req.width, req.frames)
    if a.json:
        out = {"schema_version": 1, "job": job.to_dict(), "tokens_per_sample": tokens, "results": rows}
        if exports:
            out["exports"] = exports
        print_json(out)
        return 0
    lines = [
        f"{spec.name}: {req.width}x{req.height}x{req.frames}, {req.steps} steps, CFG {'on' if req.guidance(spec) else 'off'}; "
        f"{tokens} tokens per sample; {n} x {device.id}"
    ]
    for i, r in enumerate(rows):
        lay_s = " ".join(f"{k}={v}" for k, v in r["layout"].items() if v > 1) or "single device"
        lines.append(
            f"  {i + 1}. {lay_s:40} latency {r['latency_s']:9.2f} s  ({r['denoise_s']:.2f} denoise + {r['vae_decode_s']:.2f} VAE "
            f"+ {r['text_encode_s']:.2f} text)  memory {_gb(r['memory_bytes'])}{'' if r['fits'] else ' (does NOT fit)'}  "
            f"{r['energy_per_sample_j'] / 1e3:.1f} kJ/sample"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    for e in exports:
        sys.stdout.write(e + ("\n" if not e.endswith("\n") else ""))
    return 0


def cmd_train(a: argparse.Namespace) -> int:
    from autopar.dit import training
    from autopar.dit.spec import load_dit
    from autopar.hardware import load_device

    job = _job(a, "dit_training", TRAIN_FIELDS)
    spec = load_dit(job.model)
    device = load_device(job.cluster.device)
    n = job.cluster.num_devices
    w = job.workload
    assert isinstance(w, DiTTrainingWorkload)
    buckets = tuple(training.Bucket(h, wd, f, s) for h, wd, f, s in w.parsed_buckets())
    for b in buckets:
        spec.token_grid(b.height, b.width, b.frames)
    work = training.DiTTraining(
        buckets=buckets,
        global_batch=w.global_batch,
        precomputed_latents=w.precomputed_latents,
        compiled=w.compiled,
    )
    lay = _layout(a, TRAIN_LAYOUT)
    if lay is not None:
        lays = training.single_layout(lay, n)
        if spec.heads % int(lays["tp"][0]) or (spec.heads // int(lays["tp"][0])) % int(lays["ulysses"][0]):
            raise AutoparError(
                f"{spec.heads} heads do not split over tp x ulysses", "pick (heads / tp) % ulysses == 0"
            )
        if w.global_batch % int(lays["dp"][0]):
            raise AutoparError(
                f"global batch {w.global_batch} does not split over dp {int(lays['dp'][0])}",
                "pick a dp dividing it",
            )
        pred = training.predict(spec, device, n, work, lays, memory_headroom=job.memory_headroom)
        rows = [training.row(lays, pred, 0)]
    else:
        rows = training.search(spec, device, n, work, top=a.top)
    exports: list[str] = []
    if a.export:
        from autopar.export.xdit import training_command

        nodes = max(1, n // (job.cluster.devices_per_node or device.scale_up.domain))
        exports = [
            training_command(r["layout"], num_devices=n, global_batch=w.global_batch, nodes=nodes)
            for r in rows
        ]
    if a.json:
        out: dict[str, Any] = {"schema_version": 1, "job": job.to_dict(), "results": rows}
        if exports:
            out["exports"] = exports
        print_json(out)
        return 0
    lines = [f"{spec.name} training on {n} x {device.id}, buckets {w.buckets}, global batch {w.global_batch}"]
    for i, r in enumerate(rows):
        lay_s = " ".join(f"{k}={v}" for k, v in r["layout"].items() if v > 1 or (k == "recompute" and v))
        lines.append(
            f"  {i + 1}. {lay_s:44} step {r['step_time_s']:8.2f} s  {r['tokens_per_s_per_device']:9.0f} tokens/s/device  "
            f"MFU {100 * r['mfu']:4.1f}%  memory {_gb(r['memory_bytes'])}{'' if r['fits'] else ' (does NOT fit)'}"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    for e in exports:
        sys.stdout.write(e + "\n")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="DiT preset id (see `autopar dit model --list`) or a diffusers transformer config.json",
    )
    add_field_args(p, ClusterSpec, tuple(ClusterSpec.model_fields))
    add_field_args(p, Job, ("memory_headroom",))
    p.add_argument("--top", type=int_range(1, MAX_TOP), default=5, help="layouts to show when searching")
    p.add_argument(
        "--json", action="store_true", help="machine-readable output (schema_version, job, results)"
    )


def register(sub: Any) -> dict[str, Any]:
    p = sub.add_parser("dit", help="diffusion transformers: model spec, inference and training layouts")
    dsub = p.add_subparsers(dest="dit_command", required=True, parser_class=type(p))

    m = dsub.add_parser("model", help="a DiT's normalized spec, parameters and tokens per sample")
    m.add_argument("name", nargs="?", help="DiT preset id or a diffusers transformer config.json")
    m.add_argument("--list", action="store_true", help="list the DiT presets")
    m.add_argument("--height", type=positive_int, default=None, help="request height (default: the model's)")
    m.add_argument("--width", type=positive_int, default=None, help="request width (default: the model's)")
    m.add_argument("--frames", type=positive_int, default=None, help="request frames (default: the model's)")
    m.add_argument("--json", action="store_true", help="machine-readable output")

    g = dsub.add_parser(
        "generate",
        help="latency, memory and energy of inference layouts (xDiT: CFG, PipeFusion, Ulysses, ring, TP)",
        description="Search xDiT layouts (dp x cfg x pipefusion x ulysses x ring x tp = devices) for one "
        "generation request, or predict one layout when any layout flag is given.",
    )
    _common(g)
    add_field_args(g, GenerationWorkload, GEN_FIELDS)
    for k in GEN_LAYOUT:
        flag = "--cfg-parallel" if k == "cfg" else f"--{k}"  # --cfg is the workload's guidance switch
        g.add_argument(
            flag,
            dest=f"l_{k}",
            type=positive_int,
            default=None,
            help=f"layout: {k} degree (predict this layout)",
        )
    g.add_argument(
        "--export",
        choices=["xdit", "diffusers"],
        default=None,
        help="print the launch of each layout: xdit (xfuser) or diffusers (a torchrun script, "
        "ParallelConfig with context or tensor parallelism)",
    )
    g.add_argument(
        "--launcher-version",
        default=None,
        help="with --export xdit: 0.7 (default, the xdit entry point) or 0.6 (torchrun + xDiT's example script)",
    )

    t = dsub.add_parser(
        "train",
        help="step time, tokens/s, MFU and memory of DiT training layouts (FSDP/HSDP, Ulysses, ring, TP)",
        description="Search training layouts for a bucket list of shapes, or predict one layout when any layout flag is given.",
    )
    _common(t)
    add_field_args(t, DiTTrainingWorkload, TRAIN_FIELDS)
    for k in TRAIN_LAYOUT:
        t.add_argument(
            f"--{k}",
            dest=f"l_{k}",
            type=int_range(0, 1) if k == "recompute" else positive_int,
            default=None,
            help=f"layout: {k} (predict this layout)",
        )
    t.add_argument(
        "--export",
        choices=["megatron-bridge"],
        default=None,
        help="print torchrun + Megatron Bridge/DFM overrides",
    )

    handlers = {"model": cmd_model, "generate": cmd_generate, "train": cmd_train}

    def run(a: argparse.Namespace) -> int:
        return handlers[a.dit_command](a)

    return {"dit": run}
