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


def xfuser_command(spec: DiTSpec, req: Generation, layout: dict[str, int], *, num_devices: int) -> str:
    script = XDIT_SCRIPTS.get(spec.id, "examples/<model>_example.py")
    argv = [
        "torchrun",
        f"--nproc_per_node={num_devices}",
        script,
        *xfuser_args(spec, req, layout, num_devices=num_devices),
    ]
    return shlex.join(argv)


def diffusers_command(spec: DiTSpec, req: Generation, layout: dict[str, int], *, num_devices: int) -> str:
    """A torchrun script for diffusers' own context parallelism (``ContextParallelConfig(ulysses_degree,
    ring_degree)``, ``transformer.enable_parallelism``); it has no CFG, PipeFusion or TP parallelism,
    so those layouts are refused."""
    if layout.get("pipefusion", 1) > 1 or layout.get("cfg", 1) > 1 or layout.get("tp", 1) > 1:
        raise AutoparError(
            "diffusers' context parallelism runs Ulysses x ring (x data parallel) only",
            "export this layout with --export xdit",
        )
    u, r, dp = layout.get("ulysses", 1), layout.get("ring", 1), layout.get("dp", 1)
    if u * r * dp != num_devices:
        raise AutoparError(
            f"ulysses {u} x ring {r} x dp {dp} != {num_devices} devices", "pick a layout from the search"
        )
    frames = f", num_frames={req.frames}" if spec.video else ""
    script = f"""# autopar: diffusers context parallelism (ulysses {u} x ring {r}), run with:
#   torchrun --nproc_per_node={num_devices} this_file.py
import torch, torch.distributed as dist
from diffusers import ContextParallelConfig, DiffusionPipeline
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank % torch.cuda.device_count())
pipe = DiffusionPipeline.from_pretrained({HF_IDS.get(spec.id, spec.id)!r}, torch_dtype=torch.bfloat16).to("cuda")
pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree={u}, ring_degree={r}))
out = pipe(prompt="a prompt", height={req.height}, width={req.width}, num_inference_steps={req.steps}{frames})
dist.destroy_process_group()
"""
    return script


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
        return xfuser_command(kw["spec"], kw["req"], kw["layout"], num_devices=kw["num_devices"])
    if kind == "diffusers":
        return diffusers_command(kw["spec"], kw["req"], kw["layout"], num_devices=kw["num_devices"])
    raise AutoparError(f"unknown DiT export {kind!r}", "use xdit or diffusers")
