"""What is exported is what was scored (issue 21 item 3): a study's per-stage plan, the MoE
dispatcher and all-to-all overlap a job was priced with, and a serving record's kind survive export
or are refused; nothing is silently dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopar.cli.main import main
from autopar.errors import AutoparError
from autopar.export import ExportError, parse

CORE_JOB = {
    "model": "llama-3.1-70b",
    "cluster": {"device": "h100-sxm-80gb", "num_devices": 256, "devices_per_node": 8},
    "workload": {"kind": "training", "seq_len": 8192, "global_batch": 512},
    "framework": "megatron",
}


def study_record(stage_layers: list[int], stage_recompute: list[int], **layout) -> dict:
    """The shape `autopar study show --json` writes for an uneven_pipeline trial (layout fields by
    name, the per-stage plan, the study's job)."""
    base = dict(tp=8, pp=4, vpp=1, dp=8, cp=1, ep=1, etp=8, zero=1, sp=True, micro_batch=1, grad_accum=64)
    base.update(layout)
    return {
        **base,
        "recompute": "none",
        "stage_layers": stage_layers,
        "stage_recompute": stage_recompute,
        "trial": 3,
        "layout": "...",
        "job": CORE_JOB,
    }


def render(record: dict, fmt: str) -> str:
    from autopar.cli.export import render_record

    return render_record(record, fmt)


def test_study_winner_with_uneven_ends_exports_its_scored_split() -> None:
    # the finding's 19/21/21/19 split of Llama-3.1-70B's 80 layers, one recompute mode (selective = 1)
    text = render(study_record([19, 21, 21, 19], [1, 1, 1, 1]), "megatron")
    assert (
        "--decoder-first-pipeline-num-layers 19" in text and "--decoder-last-pipeline-num-layers 19" in text
    )
    assert "--recompute-granularity selective" in text
    layout, job = parse(text, "megatron")
    assert (layout.first_stage_layers, layout.last_stage_layers, layout.recompute) == (19, 19, "selective")
    # the engine splits the rest as Megatron does: 21 on each middle stage, as the study scored
    from autopar.model import load_model

    first, mid, last = (int(x) for x in layout.dims.stage_layers(load_model("llama-3.1-70b")))
    assert (first, mid, last) == (19, 21, 19)
    # only one end uneven
    layout, _ = parse(render(study_record([20, 20, 20, 20], [0] * 4), "megatron"), "megatron")
    assert (layout.first_stage_layers, layout.last_stage_layers) == (0, 0)
    layout, _ = parse(render(study_record([17, 21, 21, 21], [0] * 4), "megatron"), "megatron")
    assert (layout.first_stage_layers, layout.last_stage_layers) == (17, 0)


def test_refused_per_stage_plans() -> None:
    with pytest.raises(ExportError, match=r"per-stage recompute \(full/selective/none/none\)"):
        render(study_record([19, 21, 21, 19], [2, 1, 0, 0]), "megatron")
    with pytest.raises(ExportError, match="uneven middle stages"):
        render(study_record([20, 20, 22, 18], [0] * 4), "megatron")
    # a format without stage layer counts refuses the uneven split instead of writing an even one
    with pytest.raises(ExportError, match="first/last pipeline stage layers"):
        render(study_record([19, 21, 21, 19], [0] * 4, zero=3, etp=8), "torchtitan")
    with pytest.raises(ExportError, match="one non-negative integer per pipeline stage"):
        render(study_record([40, 40], [0, 0]), "megatron")


def test_cli_refuses_an_unlaunchable_study_winner_in_one_line(tmp_path: Path, capsys) -> None:
    src = tmp_path / "show.json"
    src.write_text(json.dumps({"job": CORE_JOB, "best": [study_record([19, 21, 21, 19], [2, 2, 0, 0])]}))
    out = tmp_path / "out.sh"
    assert main(["export", "--from-json", str(src), "--out", str(out)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1 and "per-stage recompute" in cap.err
    assert not out.exists()


def test_serving_record_is_never_exported_as_training_arguments(tmp_path: Path, capsys) -> None:
    from autopar.cli.export import serving_export_record

    serve = {
        "mode": "aggregated",
        "tp": 8,
        "pp": 1,
        "devices": 8,
        "concurrency_per_instance": 32,
        "job": {
            "model": "llama-3.1-70b",
            "cluster": {"device": "h100-sxm-80gb", "num_devices": 8},
            "workload": {"kind": "serving", "isl": 1024, "osl": 256},
        },
    }
    record = serving_export_record(serve)
    assert "vllm serve" in render(record, "vllm")
    for fmt in ("megatron", "megatron_bridge", "deepspeed", "torchtitan", "accelerate", "torchrun"):
        with pytest.raises(AutoparError, match="serving record"):
            render(record, fmt)
    src = tmp_path / "serve.json"
    src.write_text(json.dumps({"results": [serve]}))
    assert main(["export", "--from-json", str(src), "--format", "megatron"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1


MOE = ["--model", "mixtral-8x7b", "--device", "h100-sxm-80gb", "--num-devices", "64", "--seq-len", "4096"]
MOE += ["--global-batch", "256", "--tp", "2", "--pp", "2", "--vpp", "2", "--ep", "8", "--etp", "1"]


@pytest.mark.parametrize(
    ("flags", "dispatcher", "overlap"),
    [([], "alltoall", False), (["--moe-dispatcher", "deepep", "--moe-a2a-overlap"], "deepep", True)],
)
def test_megatron_export_names_the_priced_moe_dispatcher_and_overlap(
    flags: list[str], dispatcher: str, overlap: bool, tmp_path: Path, capsys
) -> None:
    assert main(["predict", *MOE, *flags, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["job"]["workload"]["moe_dispatcher"] == dispatcher
    text = render(record, "megatron")
    # Megatron's own default dispatcher is allgather: the priced one is always written
    want = (
        "--moe-token-dispatcher-type alltoall"
        if dispatcher == "alltoall"
        else ("--moe-token-dispatcher-type flex")
    )
    assert want in text
    assert ("--moe-flex-dispatcher-backend deepep" in text) == (dispatcher == "deepep")
    assert ("--overlap-moe-expert-parallel-comm" in text) == overlap
    layout, job = parse(text, "megatron")
    assert (job.moe_dispatcher, job.moe_a2a_overlap) == (dispatcher, overlap)
    # a hand-edit that drops the dispatcher is refused
    with pytest.raises(ExportError, match="MoE dispatcher"):
        parse("\n".join(ln for ln in text.splitlines() if not ln.startswith("--moe-")), "megatron")
    # formats that cannot name them refuse a non-default choice rather than launch another dispatcher
    for fmt in ("deepspeed", "torchtitan", "accelerate", "megatron_bridge", "torchrun"):
        try:
            render(record, fmt)
        except ExportError as exc:
            if overlap:
                assert "MoE dispatcher" in exc.message or "cannot be expressed" in exc.message
        else:
            assert not overlap, fmt
    if overlap:
        megatron_core = pytest.importorskip("megatron.core.transformer.transformer_config")
        import torch

        megatron_core.TransformerConfig(
            num_layers=32,
            hidden_size=256,
            num_attention_heads=8,
            num_moe_experts=8,
            moe_router_topk=2,
            pipeline_model_parallel_size=2,
            virtual_pipeline_model_parallel_size=2,
            expert_model_parallel_size=8,
            moe_token_dispatcher_type="flex",
            moe_flex_dispatcher_backend="deepep",
            overlap_moe_expert_parallel_comm=True,
            bf16=True,
            params_dtype=torch.bfloat16,
            pipeline_dtype=torch.bfloat16,
        )


def test_overlap_megatron_cannot_run_is_refused(capsys) -> None:
    argv = [a if a != "2" or i != MOE.index("--vpp") + 1 else "1" for i, a in enumerate(MOE)]
    assert main(["predict", *argv, "--moe-a2a-overlap", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    with pytest.raises(ExportError, match="without interleaving"):
        render(record, "megatron")
