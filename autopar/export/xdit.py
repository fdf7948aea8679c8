"""Launch arguments of a DiT layout: xDiT (``xfuser``) and diffusers + torchrun for inference,
torchrun + Megatron Bridge / DFM recipe overrides for training.

xDiT flag names are those of ``xfuser/config/args.py`` (xFuserArgs.add_cli_args); its rule
world = dp x cfg x pipefusion x ulysses x ring x tp is checked before anything is emitted.
Megatron Bridge overrides are Megatron-Core config fields (``model.tensor_model_parallel_size``,
``model.context_parallel_size``, ``model.cp_comm_type`` with ``a2a`` for Ulysses-style, ``p2p`` for
ring and ``a2a+p2p`` with ``hierarchical_context_parallel_sizes`` for both).
"""

from __future__ import annotations

import shlex
from typing import Any

from autopar.dit.inference import LAYOUT_KEYS, Generation
from autopar.dit.spec import DiTSpec
from autopar.errors import AutoparError

XDIT_SCRIPTS = {  # xDiT's example script per model family (examples/ in xdit-project/xDiT)
    "flux.1-dev": "examples/flux_example.py",
    "sd3.5-large": "examples/sd3_example.py",
    "hunyuanvideo": "examples/hunyuan_video_usp_example.py",
    "cogvideox-5b": "examples/cogvideox_example.py",
    "consisid": "examples/consisid_example.py",
    "wan2.1-t2v-1.3b": "examples/wan_example.py",
    "wan2.1-t2v-14b": "examples/wan_example.py",
    "pixart-alpha": "examples/pixartalpha_example.py",
    "sana-1600m": "examples/sana_example.py",
    "step-video-t2v": "examples/stepvideo_example.py",
}
HF_IDS = {
    "flux.1-dev": "black-forest-labs/FLUX.1-dev",
    "sd3.5-large": "stabilityai/stable-diffusion-3.5-large",
    "hunyuanvideo": "hunyuanvideo-community/HunyuanVideo",
    "cogvideox-5b": "THUDM/CogVideoX-5b",
    "consisid": "BestWishYsh/ConsisID-preview",
    "wan2.1-t2v-1.3b": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
    "wan2.1-t2v-14b": "Wan-AI/Wan2.1-T2V-14B-Diffusers",
    "pixart-alpha": "PixArt-alpha/PixArt-XL-2-1024-MS",
    "sana-1600m": "Efficient-Large-Model/Sana_1600M_4Kpx_BF16_diffusers",
    "mochi-1": "genmo/mochi-1-preview",
    "step-video-t2v": "stepfun-ai/stepvideo-t2v",
    "open-sora-2.0": "hpcai-tech/Open-Sora-v2",
}


def _world(layout: dict[str, int]) -> int:
    n = 1
    for k in LAYOUT_KEYS:
        n *= int(layout.get(k, 1))
    return n


def xfuser_args(spec: DiTSpec, req: Generation, layout: dict[str, int], *, num_devices: int) -> list[str]:
    """The ``xfuser`` example-script arguments of one layout."""
    if _world(layout) != num_devices:
        raise AutoparError(
            f"layout multiplies to {_world(layout)} devices, not {num_devices}",
            "xDiT needs dp x cfg x pipefusion x ulysses x ring x tp = world size",
        )
    args = [
        "--model", HF_IDS.get(spec.id, spec.id),
        "--height", str(req.height), "--width", str(req.width),
        "--num_inference_steps", str(req.steps),
        "--ulysses_degree", str(layout.get("ulysses", 1)),
        "--ring_degree", str(layout.get("ring", 1)),
        "--pipefusion_parallel_degree", str(layout.get("pipefusion", 1)),
        "--tensor_parallel_degree", str(layout.get("tp", 1)),
        "--data_parallel_degree", str(layout.get("dp", 1)),
    ]  # fmt: skip
    if spec.video:
        args += ["--num_frames", str(req.frames)]
    if layout.get("cfg", 1) == 2:
        args.append("--use_cfg_parallel")
    if layout.get("pipefusion", 1) > 1:
        args += ["--num_pipeline_patch", str(layout["pipefusion"]), "--warmup_steps", str(req.warmup_steps)]
    if req.parallel_vae:
        args.append("--use_parallel_vae")
    if req.compiled:
        args.append("--use_torch_compile")
    if req.cache_skip > 0:  # xfuser 0.7 (config/args.py): --use_teacache is deprecated for this
        args += ["--cache_method", "teacache"]
    return args


# xfuser's ``xdit`` entry point (``xdit = xfuser.cli:main``) runs ``torchrun -m xfuser.runner`` with a
# model from its registry (``@register_model`` in xfuser/model_executor/models/runner_models/, 0.7.0);
# the presets it serves, under the name it registers.
XDIT_MODELS = {
    "flux.1-dev": "black-forest-labs/FLUX.1-dev",
    "sd3.5-large": "stabilityai/stable-diffusion-3.5-large",
    "hunyuanvideo": "tencent/HunyuanVideo",
    "wan2.1-t2v-14b": "Wan-AI/Wan2.1-T2V-14B-Diffusers",
}
# The runner's parser (xFuserArgs.add_runner_args, 0.7.0) has no PipeFusion patch or warm-up flags:
# the runner takes xfuser's defaults for them.
_NOT_RUNNER_ARGS = ("--num_pipeline_patch", "--warmup_steps")
XDIT_VERSIONS = ("0.7", "0.6")  # current first: ``xdit`` entry point; 0.6: torchrun + example script


def _drop(args: list[str], flags: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        else:
            out.append(a)
    return out


def xfuser_command(
    spec: DiTSpec,
    req: Generation,
    layout: dict[str, int],
    *,
    num_devices: int,
    launcher_version: str | None = None,
) -> str:
    """The xDiT launch of one layout: ``xdit --nproc_per_node=N --model ...`` (xfuser 0.7, the
    default) or ``torchrun --nproc_per_node=N examples/<model>_example.py ...`` (``0.6``)."""
    version = launcher_version or XDIT_VERSIONS[0]
    if version not in XDIT_VERSIONS:
        raise AutoparError(
            f"unknown xDiT launcher version {version!r}", f"use one of {', '.join(XDIT_VERSIONS)}"
        )
    args = xfuser_args(spec, req, layout, num_devices=num_devices)
    if version == "0.6":
        script = XDIT_SCRIPTS.get(spec.id, "examples/<model>_example.py")
        return shlex.join(["torchrun", f"--nproc_per_node={num_devices}", script, *args])
    if spec.id not in XDIT_MODELS:
        raise AutoparError(
            f"xfuser 0.7's xdit runner has no model {spec.id!r} in its registry",
            "export with --launcher-version 0.6 (torchrun + xDiT's example script)",
        )
    args[args.index("--model") + 1] = XDIT_MODELS[spec.id]
    return shlex.join(["xdit", f"--nproc_per_node={num_devices}", *_drop(args, _NOT_RUNNER_ARGS)])


# diffusers 0.42 (models/_modeling_parallel.py): ``ParallelConfig`` holds a ``ContextParallelConfig``
# (Ulysses x ring over a ("ring", "ulysses") mesh) OR a ``TensorParallelConfig`` (a ("tp",) mesh),
# never both; each mesh spans the whole world (no data-parallel, CFG or pipeline dimension). A model
# runs CP when its class has a ``_cp_plan`` and TP when it has a ``_tp_plan``; the presets' classes,
# with what diffusers 0.42.1 defines for them (tests/test_export_dit.py checks this against diffusers).
DIFFUSERS_CLASSES: dict[str, tuple[str, bool, bool]] = {  # id: (transformer class, CP, TP)
    "flux.1-dev": ("FluxTransformer2DModel", True, True),
    "sd3.5-large": ("SD3Transformer2DModel", False, False),
    "hunyuanvideo": ("HunyuanVideoTransformer3DModel", False, False),
    "cogvideox-5b": ("CogVideoXTransformer3DModel", False, False),
    "consisid": ("ConsisIDTransformer3DModel", False, False),
    "wan2.1-t2v-1.3b": ("WanTransformer3DModel", True, False),
    "wan2.1-t2v-14b": ("WanTransformer3DModel", True, False),
    "pixart-alpha": ("PixArtTransformer2DModel", False, False),
    "sana-1600m": ("SanaTransformer2DModel", False, False),
    "mochi-1": ("MochiTransformer3DModel", False, False),
}


def diffusers_parallel_config(spec: DiTSpec, layout: dict[str, int], *, num_devices: int) -> str:
    """The ``ParallelConfig(...)`` expression of a layout diffusers can run; refuses the others."""
    if spec.id not in DIFFUSERS_CLASSES:
        raise AutoparError(
            f"diffusers has no parallel transformer class for {spec.id!r}",
            "export this layout with --export xdit",
        )
    cls, cp_ok, tp_ok = DIFFUSERS_CLASSES[spec.id]
    for k in ("dp", "cfg", "pipefusion"):
        if layout.get(k, 1) > 1:
            raise AutoparError(
                f"diffusers' parallelism has no {k} dimension ({k} {layout[k]})",
                "export this layout with --export xdit, or pick one without it",
            )
    u, r, tp = layout.get("ulysses", 1), layout.get("ring", 1), layout.get("tp", 1)
    if tp > 1 and u * r > 1:
        raise AutoparError(
            "diffusers' ParallelConfig takes context or tensor parallelism, not both",
            "export this layout with --export xdit",
        )
    if u * r * tp != num_devices:
        raise AutoparError(
            f"ulysses {u} x ring {r} x tp {tp} != {num_devices} devices", "pick a layout from the search"
        )
    if tp > 1:
        if not tp_ok:
            raise AutoparError(
                f"diffusers' {cls} has no tensor-parallel plan", "export this layout with --export xdit"
            )
        if spec.heads % tp:
            raise AutoparError(f"tp {tp} does not divide {spec.heads} heads", "pick tp dividing the heads")
        return f"ParallelConfig(tensor_parallel_config=TensorParallelConfig(tp_degree={tp}))"
    if u * r > 1:
        if not cp_ok:
            raise AutoparError(
                f"diffusers' {cls} has no context-parallel plan", "export this layout with --export xdit"
            )
        return f"ParallelConfig(context_parallel_config=ContextParallelConfig(ulysses_degree={u}, ring_degree={r}))"
    raise AutoparError("a single-device layout needs no parallel launch", "run the pipeline as usual")


def diffusers_command(spec: DiTSpec, req: Generation, layout: dict[str, int], *, num_devices: int) -> str:
    """A torchrun script for diffusers' own parallelism: the transformer loads with
    ``parallel_config=`` (TP shards while reading the checkpoint; CP registers its hooks)."""
    config = diffusers_parallel_config(spec, layout, num_devices=num_devices)
    cls = DIFFUSERS_CLASSES[spec.id][0]
    repo = HF_IDS.get(spec.id, spec.id)
    frames = f", num_frames={req.frames}" if spec.video else ""
    return f"""# autopar: diffusers parallelism for {" ".join(f"{k}={v}" for k, v in layout.items() if v > 1)}, run with:
#   torchrun --nproc_per_node={num_devices} this_file.py
import torch
import torch.distributed as dist
from diffusers import ContextParallelConfig, DiffusionPipeline, ParallelConfig, TensorParallelConfig, {cls}
dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
parallel_config = {config}
transformer = {cls}.from_pretrained(
    {repo!r}, subfolder="transformer", torch_dtype=torch.bfloat16, parallel_config=parallel_config
)
pipe = DiffusionPipeline.from_pretrained({repo!r}, transformer=transformer, torch_dtype=torch.bfloat16).to("cuda")
out = pipe(prompt="a prompt", height={req.height}, width={req.width}, num_inference_steps={req.steps}{frames})
dist.destroy_process_group()
"""


def megatron_bridge_overrides(layout: dict[str, int], *, global_batch: int) -> list[str]:
    """Megatron Bridge / DFM recipe overrides (Hydra-style ``key=value``) of a training layout."""
    u, r, tp = layout.get("ulysses", 1), layout.get("ring", 1), layout.get("tp", 1)
    cp = u * r
    out = [
        f"model.tensor_model_parallel_size={tp}",
        "model.pipeline_model_parallel_size=1",
        f"model.context_parallel_size={cp}",
        f"model.sequence_parallel={'true' if tp > 1 else 'false'}",
    ]
    if cp > 1:
        if u > 1 and r > 1:
            out += ["model.cp_comm_type=a2a+p2p", f"model.hierarchical_context_parallel_sizes=[{u},{r}]"]
        else:
            out.append(f"model.cp_comm_type={'a2a' if u > 1 else 'p2p'}")
    if layout.get("recompute", 0):
        out += [
            "model.recompute_granularity=full",
            "model.recompute_method=uniform",
            "model.recompute_num_layers=1",
        ]
    # FSDP (ZeRO-3) as autopar.export.megatron_bridge writes it: Megatron-FSDP optim_grads_params
    out += [
        "dist.use_megatron_fsdp=true",
        "ddp.use_megatron_fsdp=true",
        "ddp.data_parallel_sharding_strategy=optim_grads_params",
        "ddp.average_in_collective=false",
        "checkpoint.ckpt_format=fsdp_dtensor",
        f"train.global_batch_size={global_batch}",
        "train.micro_batch_size=1",
    ]
    return out


def training_command(
    layout: dict[str, int],
    *,
    num_devices: int,
    global_batch: int,
    nodes: int = 1,
    recipe: str = "<dit_recipe>",
) -> str:
    """torchrun of Megatron Bridge's recipe runner (``scripts/training/run_recipe.py``, as
    :mod:`autopar.export.megatron_bridge`) with the layout's overrides; ``recipe``: the DFM/Bridge
    pretrain recipe of the model (e.g. a Wan recipe), which autopar does not choose."""
    per_node = num_devices // max(nodes, 1)
    launch = [
        "torchrun",
        f"--nnodes={nodes}",
        f"--nproc_per_node={per_node}",
        "scripts/training/run_recipe.py",
        "--recipe",
        recipe,
    ]
    return shlex.join([*launch, *megatron_bridge_overrides(layout, global_batch=global_batch)])


def export(kind: str, **kw: Any) -> str:
    if kind == "xdit":
        return xfuser_command(
            kw["spec"],
            kw["req"],
            kw["layout"],
            num_devices=kw["num_devices"],
            launcher_version=kw.get("launcher_version"),
        )
    if kind == "diffusers":
        return diffusers_command(kw["spec"], kw["req"], kw["layout"], num_devices=kw["num_devices"])
    raise AutoparError(f"unknown DiT export {kind!r}", "use xdit or diffusers")
