"""Exports read by the launchers' own code at their current releases (issue 25, item 1).

* Megatron Bridge: a recipe that sets its own pipeline split (llama31_405b_pretrain_config sets
  ``account_for_embedding/loss_in_pipeline_split=True``) with the exported overrides applied on
  top. Megatron-Bridge 0.3.1 does not import on a CPU-only Python 3.11 install (it needs
  transformer_engine, and mamba-ssm does not build), so the check is the one its ConfigContainer
  runs: ``cfg.model`` is a Megatron-Core TransformerConfig subclass whose ``__post_init__``
  (run again on every override) refuses the two split forms together; the layers each pipeline
  rank builds come from Megatron-Core's ``get_num_layers_to_build``.
"""

from __future__ import annotations

import dataclasses
import shlex
import tomllib
from typing import Any

import pytest

from autopar.export import ExportError, Job, export, parse
from autopar.layout import Layout

LLAMA31_405B_LAYERS = 126


def _bridge_model_overrides(text: str) -> dict[str, Any]:
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#")).replace("\\\n", " ")
    out: dict[str, Any] = {}
    for tok in shlex.split(body):
        key, _, raw = tok.partition("=")
        if not key.startswith("model."):
            continue
        v: Any = {"null": None, "true": True, "false": False}.get(raw, raw)
        if isinstance(v, str) and v.isdigit():
            v = int(v)
        out[key.removeprefix("model.")] = v
    return out


def _transformer_fields(o: dict[str, Any]) -> dict[str, Any]:
    """The ``model.*`` overrides that are TransformerConfig fields; the rest must be fields of
    Bridge's GPTModelProvider (a TransformerConfig subclass) that TransformerConfig lacks."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert set(o) - names <= {"seq_length"}, sorted(set(o) - names)
    return {k: v for k, v in o.items() if k in names}


def _recipe_405b(**kw: Any) -> Any:
    """The parallel and split fields llama31_405b_pretrain_config (Bridge 0.3.1) sets, on a small
    hidden size (the split checks do not look at it)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(
        num_layers=LLAMA31_405B_LAYERS,
        hidden_size=256,
        num_attention_heads=8,
        tensor_model_parallel_size=8,
        pipeline_model_parallel_size=8,
        virtual_pipeline_model_parallel_size=2,
        context_parallel_size=4,
        sequence_parallel=True,
        pipeline_dtype=torch.bfloat16,
        params_dtype=torch.bfloat16,
        bf16=True,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    base.update(kw)
    return TransformerConfig(**base)


@pytest.mark.parametrize(
    ("vpp", "stages", "form"),
    [
        (1, [15, 16, 16, 16, 16, 16, 16, 15], "num_layers_in_first_pipeline_stage"),
        (2, [15, 16, 16, 16, 16, 16, 16, 15], "account_for_embedding_in_pipeline_split"),
        (1, [14, 16, 16, 16, 16, 16, 16, 16], "num_layers_in_first_pipeline_stage"),
        (1, [16] * 7 + [14], "num_layers_in_last_pipeline_stage"),
        (2, [16] * 7 + [14], "num_layers_in_last_pipeline_stage"),
    ],
)
def test_bridge_405b_recipe_accepts_the_uneven_export(vpp: int, stages: list[int], form: str) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    n = sum(stages)
    layout = Layout(tp=8, pp=8, vpp=vpp, cp=4, dp=4, sp=True, zero=1, micro_batch=1, grad_accum=128)
    middle = stages[1:-1]
    first = stages[0] if stages[0] != middle[0] else 0
    last = stages[-1] if stages[-1] != middle[0] else 0
    layout = layout.model_copy(update={"first_stage_layers": first, "last_stage_layers": last})
    job = Job(model="llama3.1-405b", num_devices=1024, seq_len=8192, global_batch=512, num_layers=n)
    o = _bridge_model_overrides(export(layout, "megatron_bridge", job))
    assert o[form] not in (None, False), o  # the form the scored layout needs
    recipe = _recipe_405b(num_layers=n)
    cfg = dataclasses.replace(recipe, **_transformer_fields(o))  # __post_init__ again, as in finalize()
    built = [sum(get_num_layers_to_build(cfg, vp_stage=v, pp_rank=r) for v in range(vpp)) for r in range(8)]
    assert built == stages


def test_bridge_even_export_clears_the_recipe_split() -> None:
    """An even layout scored without the recipe's lighter end stages must not inherit them."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    layout = Layout(tp=8, pp=9, cp=4, dp=4, sp=True, zero=1, micro_batch=1, grad_accum=128)
    job = Job(model="llama3.1-405b", num_devices=1152, seq_len=8192, global_batch=512, num_layers=126)
    o = _bridge_model_overrides(export(layout, "megatron_bridge", job))
    cfg = dataclasses.replace(_recipe_405b(), **_transformer_fields(o))
    assert [get_num_layers_to_build(cfg, pp_rank=r) for r in range(9)] == [14] * 9


def test_bridge_without_the_fix_is_refused_by_megatron_core() -> None:
    """The check can fail: the recipe's split plus first/last stage layers is refused."""
    pytest.importorskip("megatron.core")
    with pytest.raises((AssertionError, ValueError), match="account_for"):
        _recipe_405b(
            virtual_pipeline_model_parallel_size=None,
            num_layers_in_first_pipeline_stage=15,
            num_layers_in_last_pipeline_stage=15,
        )


# ---------------------------------------------------------------------------------------------
# torchtitan 0.3.0: ConfigManager (tyro over the model's config_registry function) and
# Trainer.Config.__post_init__ (CUDA graphs vs PP and host-synchronising EP dispatchers)

# What a model without a torchtitan config function is checked with: the debug configs of the
# same family (a dense llama3, an MoE deepseek_v3 with its default token dispatcher).
DEBUG_CONFIGS = {False: ("llama3", "llama3_debugmodel"), True: ("deepseek_v3", "deepseek_v3_debugmodel")}


def torchtitan_args(text: str, moe: bool) -> list[str]:
    """The arguments after ``-m torchtitan.train``, with $TORCHTITAN_MODULE/$TORCHTITAN_CONFIG set
    to a debug config of the model's family."""
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    toks = shlex.split(body.replace("\\\n", " "))
    assert toks[0] == "torchrun" and "torchtitan.train" in toks
    args = toks[toks.index("torchtitan.train") + 1 :]
    module, config = DEBUG_CONFIGS[moe]
    return [{"$TORCHTITAN_MODULE": module, "$TORCHTITAN_CONFIG": config}.get(t, t) for t in args]


def torchtitan_config(text: str, layout: Layout, moe: bool) -> Any:
    """torchtitan's own Trainer.Config for the exported command; checks it is the layout."""
    manager = pytest.importorskip("torchtitan.config.manager")
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    cfg = manager.ConfigManager().parse_args(torchtitan_args(text, moe))
    par, tr = cfg.parallelism, cfg.training
    shard = par.data_parallel_shard_degree
    assert par.data_parallel_replicate_degree * shard == layout.dp
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (layout.tp, layout.pp)
    assert (par.context_parallel_degree, par.expert_parallel_degree) == (layout.cp, layout.ep)
    if layout.pp > 1:
        assert tr.local_batch_size == layout.micro_batch * layout.grad_accum
        assert par.pipeline_parallel_microbatch_size == layout.micro_batch
    else:
        assert tr.local_batch_size == layout.micro_batch
    assert tr.global_batch_size == layout.global_batch
    assert tr.mixed_precision_param == ("float32" if layout.precision == "fp32" else "bfloat16")
    want_ac = {"none": type(None), "selective": SelectiveAC.Config, "full": FullAC.Config}[layout.recompute]
    assert type(cfg.activation_checkpoint) is want_ac
    if layout.zero >= 2:
        assert par.fsdp_reshard_after_forward == ("always" if layout.zero == 3 else "never")
    return cfg


TITAN_CASES = {
    "dense_fsdp": (Layout(dp=8, zero=3, micro_batch=2, grad_accum=2, recompute="full"), False),
    "tp_sp": (Layout(tp=4, dp=2, sp=True, zero=2, micro_batch=1, grad_accum=4, recompute="selective"), False),
    "pp_vpp": (Layout(tp=2, pp=2, vpp=2, dp=2, sp=True, zero=3, micro_batch=1, grad_accum=8), False),
    "cp": (Layout(tp=2, cp=2, dp=2, sp=True, zero=3, micro_batch=1, grad_accum=4), False),
    "moe_ep": (Layout(tp=2, dp=4, ep=4, etp=1, sp=True, zero=3, micro_batch=1, grad_accum=2), True),
}


def _titan_job(layout: Layout, model: str) -> Job:
    return Job(model=model, num_devices=layout.num_devices, seq_len=4096, global_batch=layout.global_batch)


@pytest.mark.parametrize("case", sorted(TITAN_CASES))
def test_torchtitan_config_manager_accepts_the_export(case: str) -> None:
    layout, moe = TITAN_CASES[case]
    text = export(layout, "torchtitan", _titan_job(layout, "my-model"))
    cfg = torchtitan_config(text, layout, moe)
    # CUDA graphs off: autopar prices eager launches (and torchtitan refuses graphs with PP and EP)
    assert cfg.training.disable_cuda_graphs


def test_torchtitan_refuses_what_the_export_leaves_out(capsys: pytest.CaptureFixture[str]) -> None:
    """The check can fail: torchtitan 0.3 refuses CUDA graphs under PP and with the default EP
    dispatcher, and the 0.2.2 TOML keys have no 0.3 flag."""
    manager = pytest.importorskip("torchtitan.config.manager")
    for case in ("pp_vpp", "moe_ep"):
        layout, moe = TITAN_CASES[case]
        args = torchtitan_args(export(layout, "torchtitan", _titan_job(layout, "m")), moe)
        args.remove("--training.disable_cuda_graphs")
        with pytest.raises(SystemExit):  # tyro reports __post_init__'s ValueError and exits 2
            manager.ConfigManager().parse_args(args)
        assert "CUDA graphs" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(ValueError, match="--module is required"):
        manager.ConfigManager().parse_args(["--parallelism.tensor_parallel_degree", "2"])
    layout, moe = TITAN_CASES["moe_ep"]
    args = torchtitan_args(export(layout, "torchtitan", _titan_job(layout, "m")), moe)
    with pytest.raises(SystemExit):  # tyro: unrecognized option
        manager.ConfigManager().parse_args(
            [*args[:-1], "--parallelism.expert_tensor_parallel_degree", "2", args[-1]]
        )


def test_torchtitan_named_presets_load_their_config_function() -> None:
    """A preset with a torchtitan config function is launched with it, as written."""
    pytest.importorskip("torchtitan.config.manager")
    layout = Layout(tp=8, pp=2, dp=4, sp=True, zero=3, micro_batch=1, grad_accum=16)
    text = export(layout, "torchtitan", _titan_job(layout, "llama-3.1-70b"))
    assert "--module llama3" in text and "--config llama3_70b" in text
    torchtitan_config(text, layout, moe=False)


def test_torchtitan_refuses_what_0_3_cannot_say_and_0_2_still_writes_it() -> None:
    fp8 = Layout(tp=2, dp=4, sp=True, zero=3, micro_batch=1, grad_accum=2, precision="fp8")
    job = _titan_job(fp8, "my-model")
    with pytest.raises(ExportError, match="fp8 precision .* torchtitan 0.3.0"):
        export(fp8, "torchtitan", job)
    etp = Layout(tp=2, dp=4, ep=4, etp=2, sp=True, zero=3, micro_batch=1, grad_accum=2)
    with pytest.raises(ExportError, match=r"expert tensor parallel \(etp=2"):
        export(etp, "torchtitan", _titan_job(etp, "m"))
    for layout in (fp8, etp):
        text = export(layout, "torchtitan", _titan_job(layout, "m"), launcher_version="0.2")
        doc = tomllib.loads(text)  # the 0.2.2 --job.config_file sections
        assert doc["parallelism"]["tensor_parallel_degree"] == 2
        assert parse(text, "torchtitan") == (layout, _titan_job(layout, "m"))
    with pytest.raises(ExportError, match="use one of 0.3.0, 0.2.2"):
        export(fp8, "torchtitan", job, launcher_version="0.1")


def test_previous_torchtitan_round_trips_every_case_it_expressed() -> None:
    from test_export import CASES

    expressed = 0
    for name, (layout, job) in CASES.items():
        try:
            text = export(layout, "torchtitan", job, launcher_version="0.2.2")
        except ExportError:
            continue
        expressed += 1
        assert parse(text, "torchtitan") == (layout, job), name
    assert expressed >= 8


# ---------------------------------------------------------------------------------------------
# serving: attention data parallelism (issue 25). vLLM's own `vllm serve` parser checks every vLLM
# export in tests/test_serving_parsers.py (slow: it installs the wheel); SGLang 0.5.23's ServerArgs needs
# a chain of GPU-serving packages and does not run here: its spellings are
# SGLang 0.5.23's server_args.py (--attn-dp-size; max_running_requests is the server's total,
# divided by attn_dp_size in pool_configurator.py) and vLLM's EngineArgs (per-engine max_num_seqs).

DSV3_ADP = {
    "mode": "aggregated",
    "tp": 16,
    "pp": 1,
    "ep": 16,
    "adp": 16,
    "devices": 16,
    "concurrency_per_instance": 512,
    "job": {
        "model": "deepseek-v3",
        "cluster": {"device": "h200-sxm-141gb", "num_devices": 16},
        "workload": {"kind": "serving", "isl": 1024, "osl": 1024},
    },
}


def _flags(text: str) -> dict[str, str | bool]:
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    toks = shlex.split(body.replace("\\\n", " "))
    out: dict[str, str | bool] = {}
    for i, t in enumerate(toks):
        if t.startswith("--"):
            nxt = toks[i + 1] if i + 1 < len(toks) else "--"
            out[t] = True if nxt.startswith("--") else nxt
    return out


def test_attention_dp_serving_exports_keep_attention_dp_and_the_scored_concurrency() -> None:
    from autopar.cli.export import render_record, serving_export_record

    rec = serving_export_record(DSV3_ADP)
    v = _flags(render_record(rec, "vllm"))
    assert (v["--tensor-parallel-size"], v["--data-parallel-size"]) == ("1", "16")
    assert v["--enable-expert-parallel"] is True
    assert int(v["--max-num-seqs"]) * 16 == 512  # per DP engine: the 16 engines admit 512
    s = _flags(render_record(rec, "sglang"))
    assert (s["--tp-size"], s["--attn-dp-size"], s["--ep-size"]) == ("16", "16", "16")
    assert "--dp-size" not in s and "--enable-dp-attention" not in s
    assert s["--max-running-requests"] == "512"  # the server's total over attention-DP ranks
    for fmt in ("vllm", "sglang"):
        layout, job = parse(render_record(rec, fmt), fmt)
        assert (layout.tp, layout.dp, layout.ep, layout.etp, layout.micro_batch) == (1, 16, 16, 1, 32)
        assert job.num_devices == 16


def test_serving_without_attention_dp_is_unchanged() -> None:
    from autopar.cli.export import render_record, serving_export_record

    rec = serving_export_record(dict(DSV3_ADP, adp=1, ep=8, tp=8, devices=16, concurrency_per_instance=64))
    text = render_record(rec, "sglang")
    s = _flags(text)
    # two replicas on two 8-GPU nodes: SGLang 0.5.23 refuses data-parallel replicas over nodes
    # (check_server_args), so each replica is its own one-node launch
    assert (s["--tp-size"], s["--ep-size"], s.get("--dp-size", "1")) == (
        "8",
        "8",
        "1",
    ) and "--nnodes" not in s
    assert "--attn-dp-size" not in s and s["--max-running-requests"] == "64"
    assert "# one of 2 identical replicas" in text.splitlines()[1]
    # on one node (4 x TP2 replicas of a dense model on 8 GPUs) SGLang's --dp-size stays
    dense = dict(DSV3_ADP, adp=1, ep=1, tp=2, devices=8, concurrency_per_instance=16)
    dense["job"] = dict(
        dense["job"], model="llama-3.1-8b", cluster={"device": "h200-sxm-141gb", "num_devices": 8}
    )
    s = _flags(render_record(serving_export_record(dense), "sglang"))
    assert (s["--tp-size"], s["--dp-size"]) == ("2", "4")


def test_moe_replicas_are_separate_vllm_launches() -> None:
    """Two replicas of DeepSeek-V3 at TP8 EP8: vLLM's --data-parallel-size 2 would put the experts
    over all 16 ranks (EP16), so the vLLM export is one instance's command, run once per replica;
    SGLang's --dp-size runs independent replicas (above). A dense model keeps vLLM DP."""
    from autopar.cli.export import render_record, serving_export_record

    rec = serving_export_record(dict(DSV3_ADP, adp=1, ep=8, tp=8, devices=16, concurrency_per_instance=64))
    text = render_record(rec, "vllm")
    v = _flags(text)
    assert (v["--tensor-parallel-size"], v["--data-parallel-size"], v["--enable-expert-parallel"]) == (
        "8",
        "1",
        True,
    )
    assert v["--max-num-seqs"] == "64" and "--nnodes" not in v
    assert "# one of 2 identical replicas" in text.splitlines()[1]
    layout, job = parse(text, "vllm")
    assert (layout.tp, layout.dp, layout.ep, job.num_devices) == (8, 1, 8, 8)
    dense = dict(DSV3_ADP, adp=1, ep=1, tp=8, devices=16, concurrency_per_instance=64)
    dense["job"] = dict(dense["job"], model="llama-3.1-70b")
    v = _flags(render_record(serving_export_record(dense), "vllm"))
    assert (v["--tensor-parallel-size"], v["--data-parallel-size"]) == ("8", "2")


# ---------------------------------------------------------------------------------------------
# the launch environment: CUDA_DEVICE_MAX_CONNECTIONS (Megatron-LM validate_args; Bridge's
# ConfigContainer for Megatron-FSDP)


@pytest.mark.parametrize(
    ("update", "device", "want"),
    [
        (dict(tp=2, dp=4, zero=1), "h100-sxm-80gb", "export CUDA_DEVICE_MAX_CONNECTIONS=1"),
        (dict(cp=2, dp=4, zero=1), None, "export CUDA_DEVICE_MAX_CONNECTIONS=1"),
        (dict(tp=2, dp=4, zero=1), "b200", None),  # no requirement since Blackwell
        (dict(tp=2, dp=4, zero=3), "h100-sxm-80gb", "unset CUDA_DEVICE_MAX_CONNECTIONS"),
        (dict(dp=8, zero=1), "h100-sxm-80gb", None),
    ],
)
def test_megatron_exports_say_what_cuda_device_max_connections_must_be(
    update: dict[str, int], device: str | None, want: str | None
) -> None:
    layout = Layout(micro_batch=1, grad_accum=2, sp=update.get("tp", 1) > 1, **update)
    job = Job(
        model="llama-3.1-8b",
        num_devices=layout.num_devices,
        seq_len=4096,
        global_batch=layout.global_batch,
        num_layers=32,
        device=device,
    )
    text = export(layout, "megatron", job)
    notes = [ln for ln in text.splitlines() if "CUDA_DEVICE_MAX_CONNECTIONS" in ln]
    assert (notes[0] if notes else None) is None if want is None else want in notes[0]
    bridge = export(layout, "megatron_bridge", job)
    assert ("unset CUDA_DEVICE_MAX_CONNECTIONS" in bridge) == (layout.zero >= 2)


# ---------------------------------------------------------------------------------------------
# DeepSpeed AutoTP without a Megatron mpu (the Hugging Face / accelerate path): deepspeed.initialize
# builds DeepSpeedConfig(config, mpu=None) before AutoTP makes its groups, so the batch identity
# counts every rank as a data-parallel one (runtime/config.py: world_size = dist.get_world_size()).


def test_deepspeed_autotp_without_mpu_runs_the_scored_micro_batch_and_accumulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("deepspeed")
    import json

    import deepspeed.runtime.config as dsc

    layout = Layout(tp=4, dp=2, etp=4, zero=1, micro_batch=4, grad_accum=8)  # 64 sequences a step
    job = Job(model="llama-3.1-8b", num_devices=8, seq_len=4096, global_batch=64)
    cfg = json.loads(export(layout, "deepspeed", job))
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dsc.dist, "get_world_size", lambda *a, **k: job.num_devices)
    c = dsc.DeepSpeedConfig(cfg, mpu=None)  # the AutoTP path: no mpu
    assert c.tensor_parallel_config.autotp_size == 4
    # what the engine steps on is what was scored: 4 per rank, 8 accumulation steps, 2 DP groups
    assert (c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (4, 8)
    # DeepSpeed's own bookkeeping then reads the total TP times too large (256 for 64; display only,
    # deepspeedai/DeepSpeed#7298), which is why the export leaves train_batch_size out under AutoTP
    # and carries the scored total in its "autopar" header instead
    assert "train_batch_size" not in cfg and cfg["autopar"]["job"]["global_batch"] == 64
    assert c.train_batch_size == 64 * layout.tp
    # writing the scored total is refused on this path: DeepSpeed's identity counts all 8 ranks
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        dsc.DeepSpeedConfig(dict(cfg, train_batch_size=64), mpu=None)


def test_xfuser_cache_uses_the_0_7_spelling() -> None:
    """xfuser 0.7's args.py: "--use_teacache is deprecated, use --cache_method teacache" (xfuser
    does not import without a GPU, so its parser cannot run here)."""
    from autopar.dit import inference
    from autopar.dit.spec import load_dit
    from autopar.export.xdit import xfuser_args

    spec = load_dit("hunyuanvideo")
    req = inference.Generation(height=720, width=1280, frames=129, steps=50, cache_skip=0.3)
    args = xfuser_args(spec, req, {"ulysses": 4, "ring": 2}, num_devices=8)
    assert args[args.index("--cache_method") + 1] == "teacache" and "--use_teacache" not in args
    plain = xfuser_args(
        spec,
        inference.Generation(height=720, width=1280, frames=129, steps=50),
        {"ulysses": 8},
        num_devices=8,
    )
    assert "--cache_method" not in plain


# ---------------------------------------------------------------------------------------------
# Megatron-LM's own parse_args + validate_args (not on the package index): tools/check_megatron_args.py
# with a checkout named by AUTOPAR_MEGATRON_LM (core_v0.16.x on Python 3.11).


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "device"),
    [
        (["--tp", "2", "--pp", "2", "--dp", "4", "--zero", "1"], "h100-sxm-80gb"),
        (["--tp", "2", "--dp", "8", "--zero", "3"], "h100-sxm-80gb"),
        (["--tp", "2", "--pp", "2", "--dp", "4", "--zero", "1"], "b200"),
        (["--cp", "2", "--dp", "8", "--zero", "1"], "h100-sxm-80gb"),
    ],
)
def test_megatron_lm_validate_args_accepts_the_export(tmp_path: Any, flags: list[str], device: str) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    checkout = os.environ.get("AUTOPAR_MEGATRON_LM")
    if not checkout:
        pytest.skip("set AUTOPAR_MEGATRON_LM to a Megatron-LM core_v0.16.x checkout")
    out = tmp_path / "megatron.txt"
    job = ["--model", "llama-3.1-8b", "--device", device, "--num-devices", "16", "--seq-len", "4096"]
    r = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "export", "--format", "megatron", *job, "--global-batch", "64",
         *flags, "--micro-batch", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    tool = Path(__file__).resolve().parents[1] / "tools" / "check_megatron_args.py"
    run = [sys.executable, "-W", "ignore", str(tool), "--megatron-lm", checkout]
    r = subprocess.run([*run, str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Megatron-LM accepted" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    # the check can fail: without its environment line a TP/CP export on Hopper is refused
    text = out.read_text()
    if "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text:
        bare = tmp_path / "bare.txt"
        bare.write_text("\n".join(ln for ln in text.splitlines() if "CUDA_DEVICE_MAX_CONNECTIONS" not in ln))
        r = subprocess.run([*run, str(bare)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and "CUDA_DEVICE_MAX_CONNECTIONS" in r.stdout
