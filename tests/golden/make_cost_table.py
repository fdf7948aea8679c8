"""Regenerate ``cost_table.json``: the training cost model's figures on ~40 diverse jobs x layouts.

The table pins the block-module restructure (issue 22 item 2) as behaviour-preserving: it was
generated from main's code before ``autopar/blocks/`` existed, and ``tests/test_blocks_golden.py``
compares the current code with it at rel 1e-9. Only regenerate it for a change that is meant to
move the figures, and say so in the commit message:

    python tests/golden/make_cost_table.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIGS = ROOT / "tests" / "configs"

# (name, job keywords, layout keywords). Models: dense GQA, MHA, sliding window, MLA, MoE (top-k,
# shared experts, interleaved), hybrid Mamba2 / Mamba1 / Gated DeltaNet / parallel (Falcon-H1).
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "llama8b-tp2-sel",
        dict(model="llama-3.1-8b", num_devices=8, seq_len=4096, global_batch=64),
        dict(tp=2, recompute="selective"),
    ),
    (
        "llama8b-fp8-pp2",
        dict(model="llama-3.1-8b", num_devices=8, seq_len=8192, global_batch=32),
        dict(tp=2, pp=2, precision="fp8", recompute="none"),
    ),
    (
        "llama70b-tp8-pp4-vpp",
        dict(model="llama-3.1-70b", num_devices=64, seq_len=4096, global_batch=256),
        dict(tp=8, pp=4, vpp=2, recompute="selective"),
    ),
    (
        "llama70b-cp4-full",
        dict(model="llama-3.1-70b", num_devices=64, seq_len=32768, global_batch=32),
        dict(tp=8, cp=4, pp=2, recompute="full"),
    ),
    (
        "llama70b-uneven-ends",
        dict(model="llama-3.1-70b", num_devices=32, seq_len=4096, global_batch=64),
        dict(tp=4, pp=4, first_stage_layers=18, last_stage_layers=18, recompute="selective"),
    ),
    (
        "llama70b-zero3-fsdp",
        dict(model="llama-3.1-70b", num_devices=64, seq_len=4096, global_batch=128, framework="fsdp"),
        dict(tp=1, zero=3, recompute="full"),
    ),
    (
        "llama70b-torchtitan-zbv",
        dict(
            model="llama-3.1-70b",
            num_devices=64,
            seq_len=4096,
            global_batch=256,
            framework="torchtitan",
            pipeline_schedule="zbv",
        ),
        dict(tp=4, pp=4, vpp=2, zero=3, recompute="selective"),
    ),
    (
        "llama70b-zb",
        dict(
            model="llama-3.1-70b",
            num_devices=64,
            seq_len=4096,
            global_batch=256,
            framework="torchtitan",
            pipeline_schedule="zb",
        ),
        dict(tp=4, pp=4, vpp=2),
    ),
    (
        "llama8b-lora",
        dict(model="llama-3.1-8b", num_devices=8, seq_len=4096, global_batch=32, lora=True),
        dict(tp=1, recompute="none"),
    ),
    (
        "llama8b-mxfp8-b200",
        dict(model="llama-3.1-8b", device="b200", num_devices=8, seq_len=4096, global_batch=64),
        dict(tp=2, precision="mxfp8", recompute="norm_act"),
    ),
    (
        "llama8b-nvfp4-b200",
        dict(model="llama-3.1-8b", device="b200", num_devices=8, seq_len=4096, global_batch=64),
        dict(tp=1, precision="nvfp4", recompute="norm_act_mlp"),
    ),
    (
        "llama8b-fp32-a100",
        dict(model="llama-3.1-8b", device="a100-80gb", num_devices=8, seq_len=2048, global_batch=16),
        dict(tp=4, precision="fp32", recompute="full"),
    ),
    (
        "llama8b-pcie",
        dict(model="llama-3.1-8b", device="a100-pcie-80gb", num_devices=8, seq_len=4096, global_batch=32),
        dict(tp=4, sp=True),
    ),
    (
        "gpt3-175b-mds",
        dict(
            model="gpt3-175b", num_devices=256, seq_len=2048, global_batch=512, framework="megatron-deepspeed"
        ),
        dict(tp=8, pp=8, zero=1, recompute="full"),
    ),
    (
        "gpt3-175b-fp16",
        dict(model="gpt3-175b", num_devices=256, seq_len=2048, global_batch=512, device="a100-80gb"),
        dict(tp=8, pp=16, precision="fp16", recompute="selective"),
    ),
    (
        "gemma3-27b-sw",
        dict(model="gemma-3-27b", num_devices=16, seq_len=16384, global_batch=32),
        dict(tp=4, cp=2, recompute="selective"),
    ),
    (
        "qwen3-8b-deepspeed",
        dict(model="qwen3-8b", num_devices=16, seq_len=4096, global_batch=64, framework="deepspeed"),
        dict(zero=2),
    ),
    (
        "mixtral-ep8",
        dict(model="mixtral-8x7b", num_devices=32, seq_len=4096, global_batch=128),
        dict(tp=2, ep=8, etp=1, recompute="selective"),
    ),
    (
        "mixtral-etp2-pp2",
        dict(model="mixtral-8x7b", num_devices=32, seq_len=4096, global_batch=128),
        dict(tp=2, pp=2, ep=4, etp=2, recompute="full"),
    ),
    (
        "qwen3-30b-deepep-overlap",
        dict(
            model="qwen3-30b-a3b",
            num_devices=64,
            seq_len=4096,
            global_batch=256,
            moe_dispatcher="deepep",
            moe_a2a_overlap=True,
        ),
        dict(tp=1, pp=2, ep=16, recompute="selective"),
    ),
    (
        "qwen3-30b-fp8-norm-act",
        dict(model="qwen3-30b-a3b", num_devices=32, seq_len=4096, global_batch=128),
        dict(tp=2, ep=8, precision="fp8", recompute="norm_act"),
    ),
    (
        "deepseek-v3-mla",
        dict(model="deepseek-v3", num_devices=256, seq_len=4096, global_batch=1024, moe_dispatcher="deepep"),
        dict(tp=1, pp=8, ep=32, recompute="norm_act"),
    ),
    (
        "deepseek-v3-mla-mlp",
        dict(model="deepseek-v3", num_devices=512, seq_len=4096, global_batch=1024),
        dict(tp=2, pp=16, vpp=2, ep=16, etp=1, recompute="norm_act_mlp"),
    ),
    (
        "deepseek-v3-cp2",
        dict(model="deepseek-v3", num_devices=256, seq_len=16384, global_batch=256),
        dict(tp=2, cp=2, pp=8, ep=16, etp=1, recompute="full"),
    ),
    (
        "dsv2-lite-cfg",
        dict(model="deepseek-v2-lite.json", num_devices=8, seq_len=4096, global_batch=32),
        dict(tp=2, ep=4, etp=1, recompute="selective"),
    ),
    (
        "llama4-scout-interleaved",
        dict(model="llama-4-maverick-17b-128e", num_devices=128, seq_len=8192, global_batch=256),
        dict(tp=4, pp=4, ep=8, etp=1, recompute="selective"),
    ),
    (
        "gpt-oss-20b-sw-moe",
        dict(model="gpt-oss-20b", num_devices=16, seq_len=8192, global_batch=64),
        dict(tp=2, ep=8, etp=1, recompute="selective"),
    ),
    (
        "nemotron-h-8b",
        dict(model="nemotron-h-8b.json", num_devices=8, seq_len=8192, global_batch=64),
        dict(tp=2, recompute="selective"),
    ),
    (
        "nemotron-h-8b-pp4-full",
        dict(model="nemotron-h-8b.json", num_devices=16, seq_len=8192, global_batch=64),
        dict(tp=2, pp=4, cp=2, recompute="full"),
    ),
    (
        "nemotron-h-8b-fp8-pcie",
        dict(
            model="nemotron-h-8b.json", device="a100-pcie-80gb", num_devices=8, seq_len=4096, global_batch=32
        ),
        dict(tp=4, precision="fp8"),
    ),
    (
        "nemotron3-nano-moe",
        dict(model="nemotron-3-nano-30b-a3b", num_devices=32, seq_len=8192, global_batch=128),
        dict(tp=2, pp=2, ep=8, etp=1, recompute="norm_act"),
    ),
    (
        "qwen3-next-gdn",
        dict(model="qwen3-next-80b-a3b", num_devices=64, seq_len=8192, global_batch=128),
        dict(tp=2, pp=4, ep=8, etp=1, recompute="selective"),
    ),
    (
        "qwen3-next-gdn-mlp",
        dict(model="qwen3-next-80b-a3b", num_devices=64, seq_len=4096, global_batch=128),
        dict(tp=4, pp=2, ep=8, etp=1, recompute="norm_act_mlp", precision="fp8"),
    ),
    (
        "jamba-mamba1",
        dict(model="jamba-v0.1.json", num_devices=32, seq_len=8192, global_batch=64),
        dict(tp=4, pp=2, ep=4, etp=1, recompute="selective"),
    ),
    (
        "falcon-h1-parallel",
        dict(model="falcon-h1-0.5b.json", num_devices=8, seq_len=4096, global_batch=64),
        dict(tp=2, recompute="norm_act_mlp"),
    ),
    (
        "falcon-h1-full",
        dict(
            model="falcon-h1-0.5b.json",
            num_devices=8,
            seq_len=4096,
            global_batch=64,
            framework="megatron-deepspeed",
        ),
        dict(tp=2, recompute="full"),
    ),
    (
        "phi35-moe",
        dict(model="phi-3.5-moe.json", num_devices=32, seq_len=4096, global_batch=64),
        dict(tp=4, pp=2, ep=4, etp=2),
    ),
    (
        "granite-moe-nvfp4",
        dict(model="granite-3.0-3b-a800m.json", device="b200", num_devices=8, seq_len=4096, global_batch=64),
        dict(tp=1, ep=8, precision="nvfp4", recompute="selective"),
    ),
    ("gpt2-mha", dict(model="gpt2.json", num_devices=4, seq_len=1024, global_batch=32), dict(tp=2)),
    (
        "qwen2-57b-shared",
        dict(model="qwen2-57b-a14b.json", num_devices=32, seq_len=4096, global_batch=64),
        dict(tp=4, ep=8, etp=1, pp=2, recompute="norm_act_mlp"),
    ),
    (
        "mixtral-norm-act-mlp",
        dict(model="mixtral-8x7b", num_devices=32, seq_len=4096, global_batch=128),
        dict(tp=4, ep=8, etp=1, precision="fp8", recompute="norm_act_mlp"),
    ),
    (
        "mixtral-overlap-full",
        dict(model="mixtral-8x7b", num_devices=32, seq_len=4096, global_batch=128, moe_a2a_overlap=True),
        dict(tp=2, pp=2, ep=8, etp=1, recompute="full"),
    ),
    (
        "deepseek-v3-ends",
        dict(model="deepseek-v3", num_devices=256, seq_len=4096, global_batch=1024),
        dict(tp=1, pp=8, ep=32, first_stage_layers=5, last_stage_layers=8, recompute="selective"),
    ),
    (
        "gemma3-27b-unfused",
        dict(
            model="gemma-3-27b", num_devices=16, seq_len=4096, global_batch=32, framework="megatron-deepspeed"
        ),
        dict(tp=4, recompute="selective"),
    ),
    (
        "qwen3-next-fp32-cp",
        dict(model="qwen3-next-80b-a3b", device="a100-80gb", num_devices=64, seq_len=8192, global_batch=64),
        dict(tp=4, cp=2, ep=8, etp=1, precision="fp32"),
    ),
    (
        "jamba-pcie-full",
        dict(model="jamba-v0.1.json", device="a100-pcie-80gb", num_devices=16, seq_len=4096, global_batch=32),
        dict(tp=4, pp=2, ep=2, etp=1, recompute="full"),
    ),
]


def _job(kw: dict[str, Any]):
    from autopar.prediction import training_job

    kw = dict(kw)
    kw.setdefault("device", "h100-sxm-80gb")
    if str(kw["model"]).endswith(".json"):
        kw["model"] = str(CONFIGS / kw["model"])
    return training_job(**kw)


def _floats(a: Any) -> list[float]:
    return [float(x) for x in np.ravel(np.asarray(a, dtype=np.float64))]


def compute(name: str, job_kw: dict[str, Any], lay_kw: dict[str, Any]) -> dict[str, list[float]]:
    """All of ``evaluate``'s figures, and ``evaluate_stages`` on every stage, for one case."""
    from autopar.engine import evaluate, evaluate_stages
    from autopar.layout import LayoutTable, resolve_layout

    tj = _job(job_kw)
    lay = resolve_layout(num_devices=tj.num_devices, global_batch=tj.global_batch, **lay_kw)
    table = LayoutTable.from_layouts([lay])
    res = evaluate(tj, table, check_legal=False)
    out = {k: _floats(v) for k, v in res.items()}
    # every stage of the layout, as the uneven-split scorer sees them
    model = tj.model
    pp = lay.pp
    first, mid, last = table.dims.stage_layers(model)
    counts = [int(first[0])] + [int(mid[0])] * (pp - 2) + [int(last[0])] if pp > 1 else [int(first[0])]
    if sum(counts) == model.layers:
        from autopar.blocks.stage import window
        from autopar.memory import dense_moe

        rows = LayoutTable.from_layouts([lay] * pp)
        start = np.cumsum([0, *counts[:-1]])
        if model.block_pattern:  # each stage's own blocks in the model's order
            nd, nm, mixers = window(model, start, np.asarray(counts))
        else:
            (nd, nm), mixers = dense_moe(model, start, np.asarray(counts)), None
        st = evaluate_stages(tj, rows, stage=np.arange(pp), n_dense=nd, n_moe=nm, mixers=mixers)
        out.update({f"stage:{k}": _floats(v) for k, v in st.items()})
    return out


def main() -> None:
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    table = {
        "provenance": (
            f"generated by tests/golden/make_cost_table.py from commit {commit} (main's cost model before "
            "the autopar/blocks restructure, issue 22 item 2); shipped calibration"
        ),
        "cases": [{"name": n, "job": j, "layout": lk, "figures": compute(n, j, lk)} for n, j, lk in CASES],
    }
    (HERE / "cost_table.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(CASES)} cases written to {HERE / 'cost_table.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
