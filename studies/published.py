"""Published training runs (the published-runs CSV format) as autopar jobs, layouts and targets.

Reads any CSV with the columns documented in the data README, builds the model, cluster and layout
of every training row it can express and predicts it. Blank layout fields are filled with stated
assumptions (recorded per row and counted in the summary), never silently. Rows whose only target
is TFLOP/s or MFU are converted with the source's own FLOP convention and reported separately as
"derived targets". Used by ``studies/published_runs.py`` (accuracy) and the coefficient fit.
"""

from __future__ import annotations

import csv
import math
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autopar.engine import evaluate
from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.job import Job, TrainingJob
from autopar.layout import PRECISION_CODES, LayoutTable, resolve_layout
from autopar.legality import Context, reasons_for_row
from autopar.model import ModelSpec, load_model

TRAINING_KINDS = ("pretrain", "finetune")

# The published-runs data ships with the studies (``studies/data/``, each CSV next to the README
# that documents its columns), so every accuracy command runs from a fresh clone.
DATA_DIR = Path(__file__).resolve().parent / "data"
DEV_CSV = DATA_DIR / "published_runs_dev.csv"
DEV2_CSV = DATA_DIR / "published_runs_dev2.csv"
DEV3_CSV = DATA_DIR / "published_runs_dev3.csv"


def _num(row: dict[str, str], key: str) -> float | None:
    v = (row.get(key) or "").strip()
    if v == "":
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _int(row: dict[str, str], key: str) -> int | None:
    v = _num(row, key)
    return None if v is None or math.isnan(v) else int(round(v))


@dataclass
class Case:
    row: dict[str, str]
    run_id: str
    assumptions: list[str] = field(default_factory=list)
    skipped: str | None = None
    measured_tps: float | None = None
    target_kind: str = "measured"  # measured | derived
    prediction: dict[str, Any] | None = None
    job: TrainingJob | None = None
    measured_step: float | None = None
    table: LayoutTable | None = None


# Architecture conventions of model families whose rows give only dimensions (the data README says
# the architecture columns came from the public configs of these families). Each entry: name keys,
# ModelSpec fields, the assumption stated on the record, and whether a missing ffn_hidden / vocab
# may take the GPT default (only GPT-style models: a SwiGLU width is never 4h, and the Llama/Qwen/
# DeepSeek tokenizers differ, so those rows are refused instead of guessed).
FAMILY_CONVENTIONS: tuple[tuple[tuple[str, ...], dict[str, Any], str, bool], ...] = (
    (
        ("mpt",),
        dict(gated_mlp=False, norm="layernorm", tie_embeddings=True),
        "MPT: GELU MLP, LayerNorm, tied embeddings",
        True,
    ),
    (
        ("deepseek",),
        dict(gated_mlp=True, norm="rmsnorm", tie_embeddings=False),
        "DeepSeek family: SwiGLU MLP, RMSNorm, untied embeddings, no qkv bias",
        False,
    ),
    (
        ("llama", "mistral", "mixtral", "qwen"),
        dict(gated_mlp=True, norm="rmsnorm", tie_embeddings=False),
        "Llama/Mistral/Qwen family: SwiGLU MLP, RMSNorm, untied embeddings, no qkv bias, GQA from kv_heads",
        False,
    ),
    (
        ("gpt",),
        dict(gated_mlp=False, norm="layernorm", tie_embeddings=True),
        "GPT: GELU MLP, LayerNorm, tied embeddings",
        True,
    ),
)


# ``orig_framework`` free text onto a few stack names (first matching key wins).
STACKS = (
    ("megatron-bridge", "nemo"),
    ("nemo", "nemo"),
    ("megatron", "megatron-lm"),
    ("deepspeed", "deepspeed"),
    ("llm-foundry", "llm-foundry"),
    ("torchtitan", "torchtitan"),
    ("tensorrt-llm", "tensorrt-llm"),
)
# Stacks built on Megatron-Core (their defaults, e.g. etp = tp, apply).
MEGATRON_STACKS = ("megatron-lm", "nemo")
# Megatron-Bridge's MoE recipes set expert_tensor_parallel_size = 1 whatever the TP (its tables leave
# ETP blank): the base recipes the performance recipes start from
# (src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config,
# recipes/deepseek/h100/deepseek_v3.py) and the performance recipes themselves
# (perf_recipes/nemotronh/*/nemotronh.py, perf_recipes/deepseek/common.py), NVIDIA-NeMo/Megatron-Bridge
# @067f987df, the commit the archive rows were read at.
BRIDGE_ETP_SOURCE = "Megatron-Bridge MoE recipes set expert_tensor_parallel_size = 1"


# ``orig_framework`` free text onto the training stacks of ``autopar.job.Framework`` (first matching
# key wins; Megatron-DeepSpeed before both of its parts). Memory is costed per stack
# (autopar.frameworks); rows naming none of them are costed as Megatron (stated).
FRAMEWORKS = (
    ("megatron-deepspeed", "megatron-deepspeed"),
    ("deepspeed", "deepspeed"),
    ("megatron", "megatron"),  # Megatron-LM, Megatron-Core, Megatron-Bridge
    ("nemo", "megatron"),  # NeMo runs Megatron-Core
    ("llm-foundry", "fsdp"),
    ("composer", "fsdp"),
    ("torchtitan", "torchtitan"),
)


# Megatron-LM releases that ran no FlashAttention: the 2021 PTD-P paper's and the 2022
# sequence-parallelism paper's runs predate FlashAttention itself (Dao et al., arXiv 2205.14135, May
# 2022); their attention materialized the s x s scores (fused softmax over baddbmm/bmm), autopar's
# "unfused" core (Job.attention_kernel; Megatron-LM --attention-backend unfused today).
BEFORE_FLASH_ATTENTION = ("megatron-lm (2021)", "megatron-lm ptd-p", "megatron-lm (2022)")


def attention_kernel_of(case: Case) -> str:
    """The attention core a row ran where its stack's release is older than its profile's default."""
    fw = (case.row.get("orig_framework") or "").strip().lower()
    if fw in BEFORE_FLASH_ATTENTION:
        case.assumptions.append(
            f"attention_kernel=unfused ({case.row.get('orig_framework')!r} predates FlashAttention, May 2022)"
        )
        return "unfused"
    return "default"


def framework_of(case: Case) -> str:
    """The ``Job.framework`` a row ran on, from ``orig_framework``; the mapping is an assumption."""
    fw = (case.row.get("orig_framework") or "").strip()
    name = next((n for key, n in FRAMEWORKS if key in fw.lower()), None)
    if name is None:
        case.assumptions.append(f"framework=megatron (orig_framework {fw or 'blank'!r} names no known stack)")
        return "megatron"
    case.assumptions.append(f"framework={name} (orig_framework {fw!r})")
    return name


# How Megatron-Bridge's performance recipes run each MoE model's token dispatch, per GPU type and
# precision: NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/{qwen,deepseek,gpt_oss,nemotronh}/
# *_workload_base_configs.py (the source's own recipes; a convention applied to its rows as stated).
# "deepep" is the flex dispatcher (moe_flex_dispatcher_backend hybridep or deepep: one copy per
# destination rank); "alltoall" is moe_token_dispatcher_type alltoall (one copy per chosen expert),
# which is what a recipe that sets no flex backend runs; overlap is moe_a2a_overlap. The recipes
# are read at the repository's current commit: rows of older containers ran earlier versions of them.
#   (model key, device, precision or "*") -> (dispatcher, moe_a2a_overlap)
BRIDGE_MOE_RECIPES: dict[tuple[str, str, str], tuple[str, bool]] = {
    # Qwen3-235B-A22B: HybridEP on the NVL72 racks; the plain all-to-all on HGX B200/B300 and H100,
    # which overlaps it with the paired micro-batch on H100 only.
    ("qwen3_235b", "gb200-nvl72", "*"): ("deepep", False),
    ("qwen3_235b", "gb300-nvl72", "*"): ("deepep", False),
    ("qwen3_235b", "b200", "*"): ("alltoall", False),
    ("qwen3_235b", "b300", "*"): ("alltoall", False),
    ("qwen3_235b", "h100-sxm-80gb", "*"): ("alltoall", True),
    # Qwen3-30B-A3B and Nemotron 3 Nano: HybridEP everywhere, no overlap.
    **{
        ("qwen3_30b", d, "*"): ("deepep", False)
        for d in ("gb200-nvl72", "gb300-nvl72", "b200", "b300", "h100-sxm-80gb")
    },
    **{
        ("nemotron_3_nano", d, "*"): ("deepep", False)
        for d in ("gb200-nvl72", "gb300-nvl72", "b200", "b300", "h100-sxm-80gb")
    },
    # GPT-OSS-120B (V2): HybridEP with overlap for MXFP8 on the racks and on B300; B300 bf16 HybridEP;
    # GB200 bf16 the all-to-all with overlap; B200, GB300 bf16 and H100 the plain all-to-all.
    ("gpt_oss_120b", "gb300-nvl72", "mxfp8"): ("deepep", True),
    ("gpt_oss_120b", "gb200-nvl72", "mxfp8"): ("deepep", True),
    ("gpt_oss_120b", "b300", "mxfp8"): ("deepep", True),
    ("gpt_oss_120b", "b300", "*"): ("deepep", False),
    ("gpt_oss_120b", "gb200-nvl72", "*"): ("alltoall", True),
    ("gpt_oss_120b", "gb300-nvl72", "*"): ("alltoall", False),
    ("gpt_oss_120b", "b200", "*"): ("alltoall", False),
    ("gpt_oss_120b", "h100-sxm-80gb", "*"): ("alltoall", False),
    # DeepSeek-V3: HybridEP everywhere; MXFP8 overlaps it on the racks and B300; B200 MXFP8 (V2: PP8
    # VP2 EP32 across nodes) runs DeepEP with overlap.
    ("deepseekv3", "b200", "mxfp8"): ("deepep", True),
    ("deepseekv3", "gb200-nvl72", "mxfp8"): ("deepep", True),
    ("deepseekv3", "gb300-nvl72", "mxfp8"): ("deepep", True),
    ("deepseekv3", "b300", "mxfp8"): ("deepep", True),
    **{
        ("deepseekv3", d, "*"): ("deepep", False)
        for d in ("gb200-nvl72", "gb300-nvl72", "b200", "b300", "h100-sxm-80gb")
    },
}
# Models whose recipe this table does not list (Kimi K2): the flex dispatcher on Blackwell, as the
# listed models' recipes mostly run, and the plain all-to-all elsewhere.
BLACKWELL_DEVICES = ("gb200-nvl72", "gb300-nvl72", "b200", "b300")


# Megatron-Bridge MoE and hybrid recipes that run TP without communication overlap, read at the
# archive's commit (NVIDIA-NeMo/Megatron-Bridge @067f987df). A recipe that sets no CommOverlapConfig
# keeps the ConfigContainer's comm_overlap=None (recipes/common.py _pretrain_common), i.e.
# Megatron-Core's tp_comm_overlap=False. Not applied: the dense Llama NVFP4 recipes also set
# tp_comm_overlap = False (perf_recipes/llama/*/llama3*.py), but priced so, Llama 3 70B on GB200
# comes out 1.12x faster in NVFP4 than in MXFP8 where the same layout measured 1.31x (rows 449/450),
# and the held-out figures got worse (docs/calibration.md): which recipe those rows ran is not known.
#   (model key, device or "*", precision or "*")
BRIDGE_TP_OVERLAP_OFF: tuple[tuple[str, str, str], ...] = (
    ("qwen3_235b", "h100-sxm-80gb", "*"),  # perf_recipes/qwen/h100/qwen3_moe.py: tp_comm_overlap=False
    ("deepseekv3", "h100-sxm-80gb", "*"),  # recipes/deepseek/h100/deepseek_v3.py: tp_comm_overlap=False
    ("nemotron_3_super", "*", "*"),  # perf_recipes/nemotronh/*: no CommOverlapConfig (comm_overlap None)
    ("nemotron_3_ultra", "*", "*"),  # the same
)


def tp_overlap_of(case: Case) -> str:
    """The TP communication overlap a Megatron-Bridge row ran with: "off" where its recipe runs none
    (:data:`BRIDGE_TP_OVERLAP_OFF`), else the stack's default (on for megatron)."""
    row = case.row
    fw = (row.get("orig_framework") or "").lower()
    if "megatron-bridge" not in fw or (_int(row, "tp") or 1) == 1:
        return "default"
    key = _recipe_key(row.get("model") or "")
    dev = (row.get("device") or "").strip()
    prec = (row.get("precision") or "").strip()
    for k, d, p in BRIDGE_TP_OVERLAP_OFF:
        if k in ("*", key) and d in ("*", dev) and p in ("*", prec):
            case.assumptions.append(
                f"tp_comm_overlap=off (the Megatron-Bridge recipe for {key} {prec} on {dev})"
            )
            return "off"
    return "default"


def _recipe_key(name: str) -> str:
    n = name.lower().replace(" ", "_").replace("-", "_")
    for key in (
        "qwen3_235b",
        "qwen3_30b",
        "nemotron_3_nano",
        "nemotron_3_super",
        "nemotron_3_ultra",
        "gpt_oss_120b",
        "deepseekv3",
    ):
        if n.startswith(key):
            return key
    return n


def moe_recipe_of(case: Case, model) -> tuple[str, bool]:
    """The MoE token dispatcher and all-to-all overlap a row ran with: the source's documented recipe
    (:data:`BRIDGE_MOE_RECIPES`), else the plain all-to-all without overlap."""
    fw = (case.row.get("orig_framework") or "").lower()
    dev = (case.row.get("device") or "").strip()
    if not model.is_moe or "megatron-bridge" not in fw:
        return "alltoall", False
    key = _recipe_key(case.row.get("model") or "")
    prec = (case.row.get("precision") or "").strip()
    hit = BRIDGE_MOE_RECIPES.get((key, dev, prec)) or BRIDGE_MOE_RECIPES.get((key, dev, "*"))
    if hit is None:
        hit = ("deepep", False) if dev in BLACKWELL_DEVICES else ("alltoall", False)
        case.assumptions.append(
            f"moe_dispatcher={hit[0]} (no Megatron-Bridge recipe listed for {key} on {dev}: the usual one)"
        )
    else:
        case.assumptions.append(
            f"moe_dispatcher={hit[0]}, moe_a2a_overlap={hit[1]} (Megatron-Bridge recipe for {key} on {dev})"
        )
    return hit


# Megatron-Bridge recipes that run the whole MoE iteration as one CUDA graph with Transformer Engine's
# CuTe DSL fused grouped MLP, and the first container release whose recipe does: (model key, device,
# precision) -> release. Read at the releases' tags (NVIDIA-NeMo/Megatron-Bridge; the tag whose
# docs/performance-summary.md heads that container: v0.5.0 = 26.06, v0.6.0 = 26.08):
# scripts/performance/configs/{qwen,deepseek,gpt_oss}/*_workload_base_configs.py @v0.5.0
# (QWEN3_30B_A3B_PRETRAIN_CONFIG_{GB200,GB300,B300}_FP8_MX_V1, QWEN3_235B_A22B_..._{GB200,GB300}_FP8_MX_V2,
# DEEPSEEK_V3_PRETRAIN_CONFIG_{GB200,GB300}_FP8_MX_V1, GPT_OSS_120B_..._{GB200,GB300}_FP8_MX_V2:
# cuda_graph_impl="full_iteration", cutedsl_fused_grouped_mlp=True, moe_a2a_overlap=True) and
# src/megatron/bridge/perf_recipes/{qwen,deepseek,gpt_oss}/{gb200,gb300}/*.py @v0.6.0
# (_enable_hybridep_full_iteration_mxfp8 / _enable_deepseek_full_iteration_mxfp8 /
# _apply_gpt_oss_120b_full_iter_fp8mx_configs, env NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, and
# overlap_moe_expert_parallel_comm=True). Not listed, so eager: every bf16/fp8/nvfp4 recipe, the
# B200 ones, DeepSeek-V3 and GPT-OSS on B300, and Nemotron 3 Nano/Super (their CuTe DSL fusion
# landed after v0.6.0, d0debd0bd of 2026-08-18, with partial graphs).
BRIDGE_FUSED_GRAPH: dict[tuple[str, str, str], tuple[int, ...]] = {
    ("qwen3_30b", "gb200-nvl72", "mxfp8"): (26, 6),
    ("qwen3_30b", "gb300-nvl72", "mxfp8"): (26, 6),
    ("qwen3_30b", "b300", "mxfp8"): (26, 6),
    ("qwen3_235b", "gb200-nvl72", "mxfp8"): (26, 6),
    ("qwen3_235b", "gb300-nvl72", "mxfp8"): (26, 6),
    ("deepseekv3", "gb200-nvl72", "mxfp8"): (26, 6),
    ("deepseekv3", "gb300-nvl72", "mxfp8"): (26, 6),
    ("gpt_oss_120b", "gb200-nvl72", "mxfp8"): (26, 6),
    ("gpt_oss_120b", "gb300-nvl72", "mxfp8"): (26, 6),
}


def container_release(row: dict[str, str]) -> tuple[int, ...] | None:
    """The NeMo container release a Megatron-Bridge row ran in (``orig_framework`` "... NeMo 26.04.01"
    -> (26, 4, 1)), or None."""
    fw = row.get("orig_framework") or ""
    if "megatron-bridge" not in fw.lower():
        return None
    tail = fw.split()[-1]
    parts = tail.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def fused_graph_of(case: Case) -> bool:
    """Whether a row's recipe ran the full-iteration CUDA graph with fused expert MLPs
    (:data:`BRIDGE_FUSED_GRAPH`, from the release it lists on)."""
    rel = container_release(case.row)
    key = (
        _recipe_key(case.row.get("model") or ""),
        (case.row.get("device") or "").strip(),
        (case.row.get("precision") or "").strip(),
    )
    first = BRIDGE_FUSED_GRAPH.get(key)
    if rel is None or first is None or rel < first:
        return False
    release = (case.row.get("orig_framework") or "").split()[-1]  # as the row writes it, e.g. 26.08
    case.assumptions.append(
        f"moe_fused_graph (Megatron-Bridge {release} full-iteration recipe for {key[0]} {key[2]} on {key[1]})"
    )
    return True


def memory_basis(row: dict[str, str], reported: str) -> str:
    """What a row's ``memory_gib_per_device`` measures: allocated or reserved memory.

    The row's own words decide (``targets_derived``/``normalization_notes`` naming peak allocated or
    reserved memory); otherwise the basis the stack's memory log reports (``reported``).
    """
    text = " ".join(
        (row.get(k) or "") for k in ("targets_derived", "orig_memory_basis", "normalization_notes")
    ).lower()
    mem = text[text.find("memory_gib_per_device") :] if "memory_gib_per_device" in text else text
    if "alloc" in mem:
        return "allocated"
    if "reserved" in mem:
        return "reserved"
    return reported


def stack_of(row: dict[str, str]) -> str:
    fw = (row.get("orig_framework") or "").lower()
    return next((name for key, name in STACKS if key in fw), "other" if fw else "(blank)")


# Sources whose dims-only models are Megatron GPT models (the paper/README tables say so).
MEGATRON_GPT_SOURCES = ("narayanan", "korthikanti", "megatron_core")

# Architecture values some rows state only in ``normalization_notes`` as ``key=value`` (Megatron
# launcher names, e.g. the SimuMax DeepSeek-V2 rows), mapped onto ModelSpec fields.
_NOTE_ARCH = {
    "moe_ffn_hidden": "moe_ffn_hidden",
    "shared_expert_ffn": "shared_expert_ffn",
    "dense_layers": "first_dense_layers",  # Megatron MOE_LAYER_FREQ [0]*k+[1]*n: a dense prefix
    "moe_layers": "moe_layers",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_head_dim": "qk_nope_head_dim",  # Megatron --qk-head-dim is the no-RoPE part
    "qk_pos_emb_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
}
_NOTE_ARCH_RE = re.compile(r"\b(" + "|".join(_NOTE_ARCH) + r")=(\d+)\b")


def note_architecture(row: dict[str, str]) -> dict[str, int]:
    """ModelSpec fields that the row states in ``normalization_notes`` (first value per key)."""
    found: dict[str, int] = {}
    for key, val in _NOTE_ARCH_RE.findall(row.get("normalization_notes") or ""):
        found.setdefault(_NOTE_ARCH[key], int(val))
    return found


def at_depth(spec: ModelSpec, depth: int) -> ModelSpec:
    """``spec`` cut to ``depth`` layers, keeping its layer pattern (a reduced-depth proxy run).

    The dense prefix (DeepSeek ``first_k_dense_replace``) is kept up to ``depth``; the remaining
    layers keep the preset's MoE / dense and sliding-window / full-attention proportions (rounded).
    Width, experts, attention and vocabulary are unchanged, so embedding and LM head stay full.
    """
    if depth <= 0:
        raise AutoparError(f"proxy depth {depth} must be positive")
    if depth == spec.layers:
        return spec
    L0 = spec.layers
    first = min(spec.first_dense_layers, depth)
    rest0, rest = L0 - spec.first_dense_layers, depth - first
    moe = round(rest * spec.moe_layers / rest0) if rest0 and spec.moe_layers else 0
    if spec.moe_layers and rest and not moe:
        moe = 1  # a MoE model's proxy keeps at least one MoE layer
    sliding = round(depth * spec.sliding_window_layers / L0) if spec.sliding_window_layers else 0
    fields = spec.model_dump() | dict(
        name=f"{spec.name} @ {depth} of {L0} layers",
        layers=depth,
        first_dense_layers=first,
        moe_layers=moe,
        sliding_window_layers=sliding,
    )
    return ModelSpec(**fields)


# Rows whose model_preset cell is blank but whose model has a preset (the data files are not edited):
# the ``model`` column, lowercased, to the preset id.
MODEL_PRESETS = {
    "gpt3-20b": "gpt3-20b",  # NeMo GPTConfig20B
    "nemotron-8b": "nemotron-8b",  # NeMo Nemotron3Config8B
    "nemotron-22b": "nemotron-22b",  # NeMo Nemotron3Config22B
    "nemotron_3_nano": "nemotron-3-nano-30b-a3b",
    "nemotron_3_super": "nemotron-3-super-120b-a12b",
}


def preset_of(row: dict[str, str]) -> str:
    """The row's preset id: its model_preset cell, else MODEL_PRESETS by its model name."""
    return (row.get("model_preset") or "").strip() or MODEL_PRESETS.get(
        (row.get("model") or "").strip().lower(), ""
    )


def build_model(case: Case):
    row = case.row
    preset = preset_of(row)
    proxy = _int(row, "is_proxy_run") == 1
    if preset:
        spec = load_model(preset)
        if proxy:
            depth = _int(row, "layers")
            if depth is None:
                raise AutoparError("is_proxy_run=1 but layers (the depth actually run) is blank")
            spec = at_depth(spec, depth)
            case.assumptions.append(
                f"proxy run: {preset} at {depth} of {load_model(preset).layers} layers "
                f"({spec.first_dense_layers} dense prefix, {spec.moe_layers} MoE), full width and vocab"
            )
        return spec
    need = {"layers": "layers", "hidden": "hidden", "heads": "heads"}
    dims = {k: _int(row, c) for k, c in need.items()}
    missing = [k for k, v in dims.items() if v is None]
    if len(missing) == len(dims):
        raise AutoparError("no model_preset and no architecture columns (the model needs a preset)")
    if missing:
        raise AutoparError(f"architecture columns missing: {', '.join(missing)}")
    if proxy:
        case.assumptions.append(f"proxy run: the row's dimensions at the depth run ({dims['layers']} layers)")
    name = (row.get("model") or "").lower()
    source = (row.get("source_id") or "").lower()
    if source.startswith(MEGATRON_GPT_SOURCES):
        name = "gpt " + name
    conv = next((c for c in FAMILY_CONVENTIONS if any(k in name for k in c[0])), None)
    if conv is None:  # a classic dense decoder (PaLM, BLOOM, OPT, else GPT-3-style), conventions stated
        from autopar.model import classic_decoder

        if _int(row, "num_experts"):
            raise AutoparError(f"no preset and unknown family for dims-only MoE model {row.get('model')!r}")
        spec, notes = classic_decoder(
            row.get("model") or "model", **dims, ffn_hidden=_int(row, "ffn_hidden"), vocab=_int(row, "vocab"),
            kv_heads=_int(row, "kv_heads"),
        )  # fmt: skip
        case.assumptions.extend(notes)
        return spec
    keys, fields, note, gpt_defaults = conv
    h = dims["hidden"]
    ffn = _int(row, "ffn_hidden")
    vocab = _int(row, "vocab")
    if ffn is None:
        if not gpt_defaults:
            raise AutoparError(f"dims-only {keys[0]}-family model without ffn_hidden (no 4h convention)")
        ffn = 4 * h
        case.assumptions.append("ffn_hidden=4*hidden (GPT convention)")
    if vocab is None:
        if not gpt_defaults:
            raise AutoparError(f"dims-only {keys[0]}-family model without vocab")
        vocab = 50257
        case.assumptions.append("vocab=50257 (GPT-2/3 tokenizer)")
    kv = _int(row, "kv_heads") or dims["heads"]
    case.assumptions.append(note)
    raw = dict(
        name=row.get("model") or "model",
        hidden=h,
        layers=dims["layers"],
        heads=dims["heads"],
        kv_heads=kv,
        head_dim=h // dims["heads"],
        ffn_hidden=ffn,
        vocab=vocab,
        **fields,
    )
    ne = _int(row, "num_experts")
    noted = note_architecture(row)
    if ne and keys[0] == "deepseek":
        # DeepSeek MoE: the row's ffn_hidden is the dense-prefix width; routed / shared expert widths,
        # the dense prefix and MLA ranks must be stated (the notes of the SimuMax rows do).
        need_moe = ("moe_ffn_hidden", "moe_layers")
        if any(k not in noted for k in need_moe):
            raise AutoparError(
                "dims-only DeepSeek MoE row without per-expert width / MoE layer count in the row or notes"
            )
        raw.update(num_experts=ne, moe_topk=_int(row, "moe_topk") or 1, **noted)
        case.assumptions.append(
            "architecture from normalization_notes: "
            + ", ".join(f"{k}={v}" for k, v in sorted(noted.items()))
        )
    elif ne:
        raw.update(
            num_experts=ne,
            moe_topk=_int(row, "moe_topk") or 1,
            moe_ffn_hidden=ffn,
            moe_layers=dims["layers"],
            ffn_hidden=0,
        )
    return load_model(raw)


def layout_for(case: Case, num_devices: int, global_batch: int):
    row = case.row
    tp, pp, cp = _int(row, "tp"), _int(row, "pp"), _int(row, "cp") or 1
    if tp is None or pp is None:
        return best_layout_for(case, num_devices, global_batch)
    vpp = _int(row, "vpp")
    if vpp is None:
        vpp = 1
        case.assumptions.append("vpp=1 (not stated)")
    ep = _int(row, "ep") or 1
    etp = _int(row, "etp")
    if etp is None and ep > 1:
        if "megatron-bridge" in (row.get("orig_framework") or "").lower():
            etp = 1
            case.assumptions.append(f"etp=1 (blank; {BRIDGE_ETP_SOURCE})")
        elif stack_of(row) in MEGATRON_STACKS:
            etp = tp
            case.assumptions.append("etp=tp (blank; Megatron default expert_tensor_parallel_size = tp)")
        else:
            etp = 1
            case.assumptions.append(f"etp=1 (blank; {stack_of(row)} stack, autopar default)")
    dp = _int(row, "dp")
    mb = _int(row, "micro_batch")
    if mb is None:
        mb = 1
        case.assumptions.append("micro_batch=1 (not stated)")
    zero = _int(row, "zero_stage")
    if zero is None:
        zero = 1
        case.assumptions.append("zero=1 (distributed optimizer; not stated)")
    sp_v = _int(row, "sequence_parallel")
    if sp_v is None:
        sp = tp > 1
        if sp:
            case.assumptions.append("sp=on (tp > 1; not stated)")
    else:
        sp = bool(sp_v) and tp > 1
    rec = (row.get("recompute") or "").strip()
    if not rec:
        rec = "none"
        case.assumptions.append("recompute=none (not stated)")
    prec = (row.get("precision") or "").strip()
    if not prec:
        prec = "bf16"
        case.assumptions.append("precision=bf16 (not stated; same peak as fp16 on these devices)")
    prec = normalize_precision(case, prec)
    shard = _int(row, "shard_group") or 0
    if shard and zero == 0:
        shard = 0
    return resolve_layout(
        num_devices=num_devices,
        global_batch=global_batch,
        tp=tp,
        pp=pp,
        vpp=vpp,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=etp,
        zero=zero,
        shard_group=shard if shard and shard < (dp or 0) * cp else 0,
        sp=sp,
        micro_batch=mb,
        recompute=rec,
        precision=prec,
    )


def normalize_precision(case: Case, prec: str) -> str:
    """The data format's precision vocabulary onto autopar's GEMM precisions (stated when mapped)."""
    if prec not in PRECISION_CODES:
        raise AutoparError(f"precision {prec} is not modeled for training")
    return prec


def best_layout_for(case: Case, num_devices: int, global_batch: int):
    """The source does not state its layout: assume the practitioners ran autopar's top-1 layout of
    the default search space (a stated assumption; the prediction is then an upper bound)."""
    from autopar.search.recommend import recommend

    row = case.row
    prec = normalize_precision(case, (row.get("precision") or "").strip() or "bf16")
    model = build_model(case)
    dev = (row.get("device") or "").strip()
    res = recommend(
        model=model,
        device=dev,
        num_devices=num_devices,
        devices_per_node=_int(row, "devices_per_node"),
        seq_len=_int(row, "seq_len") or 0,
        global_batch=global_batch,
        top=1,
        overrides=[f"precision={prec}"],
        progress=False,
    )
    lay = res.results[0].layout
    case.assumptions.append("layout not stated: autopar's top-1 layout of the default space")
    return lay


def megatron_flops_per_iter(model, B: int, s: int) -> float:
    """Narayanan et al. 2021 Eq. 3 (full recompute, hardware FLOPs): 96·B·s·L·h²·(1 + s/6h + V/16Lh)."""
    L, h, V = model.layers, model.hidden, model.vocab
    return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def megatron_model_flops_per_token(model, s: int) -> float:
    """Megatron-LM ``num_floating_point_operations`` per token (GQA, gated MLP, no recompute)."""
    L, h, V = model.layers, model.hidden, model.vocab
    q = model.heads * model.head_dim
    g, a = model.kv_heads, model.heads
    F = model.ffn_hidden
    gamma = 1.5 if model.gated_mlp else 1.0
    return 12.0 * L * h * h * ((1 + g / a + s / h) * (q / h) + (F / h) * gamma + V / (2 * L * h))


# Model-FLOP bases whose formula is Megatron's ``num_floating_point_operations`` (dense, no
# recompute, non-causal attention, logits counted). Checked, not assumed: on the NeMo 24.07
# pre-training rows of published_runs_dev.csv that print both tokens/s and model TFLOP/s, this
# formula reproduces their ratio to 0.1% (tests/test_accuracy.py). Megatron-Core's table states
# "MFU = tflops/989" on the same basis.
MEGATRON_FLOP_STACKS = ("megatron-lm", "nemo")


def model_flops_per_token(case: Case, model, seq: int) -> float:
    """FLOPs per token on the row's stated model-FLOP basis; refuses bases it cannot reproduce."""
    row = case.row
    basis = (row.get("orig_tflops_basis") or "").strip().lower()
    stack = stack_of(row)
    if not basis.startswith("model"):
        raise AutoparError(f"TFLOP/s basis {basis or 'blank'!r} has no FLOP formula here")
    if stack not in MEGATRON_FLOP_STACKS:
        raise AutoparError(f"model-FLOP basis of the {stack} stack is not reproduced here")
    if model.is_moe or model.is_mla:
        raise AutoparError("model-FLOP target of a MoE/MLA model: Megatron's dense formula does not apply")
    case.assumptions.append(
        f"target from model TFLOP/s on the {stack} basis (Megatron num_floating_point_operations)"
    )
    return megatron_model_flops_per_token(model, seq)


def measured_target(case: Case, model, num_devices: int, global_batch: int, seq: int) -> None:
    row = case.row
    tps = _num(row, "tokens_per_s_per_device")
    st = _num(row, "step_time_s")
    if tps is not None:
        case.measured_tps = tps
        return
    if st is not None and global_batch:
        case.measured_tps = global_batch * seq / (st * num_devices)
        return
    hw = _num(row, "hw_tflops_per_device")
    if hw is not None:  # Narayanan: TFLOP/s per GPU counting the recompute forward (Eq. 3)
        t = megatron_flops_per_iter(model, global_batch, seq) / (hw * 1e12 * num_devices)
        case.measured_tps = global_batch * seq / (t * num_devices)
        case.target_kind = "derived"
        return
    mtf = _num(row, "model_tflops_per_device")
    mfu, peak = _num(row, "mfu"), _num(row, "mfu_peak_tflops")
    if mtf is None and mfu is not None:
        if peak is None:
            raise AutoparError("mfu without mfu_peak_tflops: its denominator is not stated")
        mtf = mfu * peak  # the README: mfu = model TFLOP/s / mfu_peak_tflops
        case.assumptions.append(f"model TFLOP/s = mfu x {peak:g} (the stated MFU peak)")
    if mtf is not None:
        case.measured_tps = mtf * 1e12 / model_flops_per_token(case, model, seq)
        case.target_kind = "derived"
        return
    raise AutoparError("no throughput, step time, TFLOP/s or MFU target")


def run_case(case: Case, calibration=None) -> None:
    row = case.row
    kind = (row.get("workload_kind") or "").strip()
    if kind == "microbench":
        run_microbench(case, calibration)
        return
    if kind not in TRAINING_KINDS:
        case.skipped = f"workload_kind={kind or 'blank'} (not a training run)"
        return
    lora = "lora" in (row.get("model") or "").lower() or "lora" in (row.get("orig_workload") or "").lower()
    try:
        model = build_model(case)
        num_devices = _int(row, "num_devices")
        seq = _int(row, "seq_len")
        gb = _int(row, "global_batch")
        if not num_devices or not seq or not gb:
            raise AutoparError("num_devices, seq_len or global_batch missing")
        dev = apply_power_cap(case, load_device((row.get("device") or "").strip()))
        measured_target(case, model, num_devices, gb, seq)
        lay = layout_for(case, num_devices, gb)
        dpn = min(_int(row, "devices_per_node") or dev.scale_up.domain, num_devices)
        if num_devices % dpn:
            # e.g. 256 GPUs on NVL72 racks: the job fills each rack's domain only partly; every
            # model-parallel group then lives in the largest equal share of a rack that divides it.
            full = dpn
            dpn = next(d for d in range(dpn, 0, -1) if num_devices % d == 0)
            case.assumptions.append(
                f"devices_per_node={dpn}: {num_devices} devices do not fill whole {full}-device domains"
            )
        recipe = moe_recipe_of(case, model)
        graphed = model.is_moe and fused_graph_of(case)
        job = Job.from_flat(
            model=model.name,
            device=dev.id,
            num_devices=num_devices,
            devices_per_node=dpn,
            seq_len=seq,
            global_batch=gb,
            lora=lora,
            framework=framework_of(case),
            moe_dispatcher=recipe[0],
            # the full-iteration recipes overlap the EP all-to-all (overlap_moe_expert_parallel_comm)
            moe_a2a_overlap=recipe[1] or graphed,
            moe_fused_graph=graphed,
            attention_kernel=attention_kernel_of(case),
            tp_comm_overlap=tp_overlap_of(case),
            allow_long_context=True,  # a measured run: past the position limit it was extension work
        ).resolve(model=model, device=dev)
        if lora:
            case.assumptions.append("LoRA: base weights frozen (no weight gradients or optimizer)")
        table = LayoutTable.from_layouts([lay])
        case.job, case.table = job, table
        res = evaluate(job, table, calibration=calibration)
        basis = memory_basis(row, job.framework.reported_basis)
        ctx = Context(num_devices, seq, gb, tuple(sorted(dev.peak_tflops)), dev.id)
        illegal = reasons_for_row(model, table, ctx, 0)
        if illegal:
            case.assumptions.append("layout breaks rule(s): " + ", ".join(r.code for r in illegal))
        case.prediction = {
            "layout": lay.short(),
            "predicted_tokens_per_s_per_device": float(res["tokens_per_s_per_device"][0]),
            "predicted_step_time_s": float(res["step_time_s"][0]),
            # On the basis the row measured (allocated or reserved), not the device footprint.
            "memory_basis": basis,
            "predicted_memory_gib": float(res[f"memory_{basis}_bytes"][0]) / 2**30,
            "predicted_footprint_gib": float(res["memory_bytes"][0]) / 2**30,
            "fits": bool(res["fits"][0]),
            "predicted_mfu": float(res["mfu"][0]),
            "predicted_avg_power_w": float(res["avg_power_w"][0]),
            "power_limit_w": dev.power.tdp_w,
        }
    except AutoparError as exc:
        case.skipped = str(exc)


def apply_power_cap(case: Case, dev):
    """A row's ``power_cap_w``: the energy model draws at most the cap instead of the TDP.

    Throughput is not derated: no published clock-vs-cap curve backs a derating for these devices
    (hardware.md 2.2 lists the caps, not their speed cost), so the cap changes energy only.
    """
    cap = _num(case.row, "power_cap_w")
    if cap is None or cap >= dev.power.tdp_w:
        return dev
    if cap <= dev.power.idle_w:
        raise AutoparError(
            f"power_cap_w={cap:g} is at or below the {dev.id} idle power {dev.power.idle_w:g} W"
        )
    power = dev.power.model_copy(update={"tdp_w": cap})
    prov = dev.provenance | {"power.tdp_w": f"row power_cap_w={cap:g} W (profile TDP {dev.power.tdp_w:g} W)"}
    case.assumptions.append(
        f"power cap {cap:g} W: energy at the capped power; throughput not derated (no sourced derating)"
    )
    return dev.model_copy(update={"power": power, "provenance": prov})


def run_microbench(case: Case, calibration=None) -> None:
    """One transformer layer, forward + backward (Korthikanti Table 4): no embedding, loss or optimizer.

    Predicted as a one-layer model with a one-token vocabulary on dp = 1, minus the optimizer step.
    """
    row = case.row
    try:
        if _int(row, "layers") != 1:
            raise AutoparError("microbench rows must describe one layer")
        if not (row.get("vocab") or "").strip():
            row = {**row, "vocab": "1"}
            case.row = row
        model = build_model(case)
        case.assumptions = [a for a in case.assumptions if not a.startswith("vocab=")]
        num_devices, seq, mb = _int(row, "num_devices"), _int(row, "seq_len"), _int(row, "micro_batch") or 1
        st = _num(row, "step_time_s")
        if not num_devices or not seq or st is None:
            raise AutoparError("num_devices, seq_len or step_time_s missing")
        dev = load_device((row.get("device") or "").strip())
        lay = layout_for(case, num_devices, mb)
        job = Job.from_flat(
            model=model.name,
            device=dev.id,
            num_devices=num_devices,
            devices_per_node=min(_int(row, "devices_per_node") or 8, num_devices),
            seq_len=seq,
            global_batch=mb,
            allow_long_context=True,  # a measured run: past the position limit it was extension work
        ).resolve(model=model, device=dev)
        table = LayoutTable.from_layouts([lay])
        res = evaluate(job, table, calibration=calibration, check_legal=False)
        layer = float(res["step_time_s"][0] - res["time_optimizer"][0] - res["time_dp_comm"][0])
        case.target_kind = "microbench"
        case.measured_step = st
        case.prediction = {"layout": lay.short(), "predicted_layer_time_s": layer}
    except AutoparError as exc:
        case.skipped = str(exc)


def load_cases(path: Path) -> list[Case]:
    with path.open(newline="") as f:
        return [Case(row=r, run_id=r.get("run_id", "")) for r in csv.DictReader(f)]


def ape(case: Case) -> float:
    p = case.prediction["predicted_tokens_per_s_per_device"]  # type: ignore[index]
    return abs(p - case.measured_tps) / case.measured_tps  # type: ignore[operator]


def summarize(cases: list[Case], *, out=sys.stdout, worst: int = 10) -> dict[str, Any]:
    done = [c for c in cases if c.prediction is not None and c.measured_tps and c.target_kind != "microbench"]
    micro = [c for c in cases if c.target_kind == "microbench" and c.prediction is not None]
    meas = [c for c in done if c.target_kind == "measured"]
    derived = [c for c in done if c.target_kind == "derived"]
    training = [c for c in cases if (c.row.get("workload_kind") or "") in TRAINING_KINDS]
    with_target = [
        c
        for c in training
        if _num(c.row, "tokens_per_s_per_device") is not None or _num(c.row, "step_time_s") is not None
    ]

    def stats(cs: list[Case]) -> dict[str, float]:
        e = np.array([ape(c) for c in cs])
        signed = np.array(
            [
                (c.prediction["predicted_tokens_per_s_per_device"] - c.measured_tps) / c.measured_tps
                for c in cs
            ]
        )
        return {
            "n": len(cs),
            "mape": float(e.mean()) if len(e) else float("nan"),
            "median_ape": float(np.median(e)) if len(e) else float("nan"),
            "p90_ape": float(np.percentile(e, 90)) if len(e) else float("nan"),
            "mean_signed": float(signed.mean()) if len(e) else float("nan"),
        }

    def line(label: str, s: dict[str, float]) -> str:
        return (
            f"  {label:<38} n={s['n']:>4}  MAPE {s['mape']:6.1%}  median {s['median_ape']:6.1%}  "
            f"p90 {s['p90_ape']:6.1%}  bias {s['mean_signed']:+6.1%}"
        )

    p = lambda *a: print(*a, file=out)  # noqa: E731
    overall = stats(meas)
    covered = sum(1 for c in with_target if c.prediction is not None)
    p("== tokens/s per device, rows with a measured throughput or step time ==")
    p(line("overall", overall))
    p(
        f"  coverage: {covered}/{len(with_target)} training rows with a measured target "
        f"({covered / max(len(with_target), 1):.1%})"
    )
    for key in ("source_id", "device", "precision"):
        groups: dict[str, list[Case]] = defaultdict(list)
        for c in meas:
            groups[c.row.get(key) or "(blank)"].append(c)
        p(f"-- by {key}")
        for k in sorted(groups):
            p(line(k, stats(groups[k])))
    if derived:
        p("== derived targets (TFLOP/s or MFU converted with the source's FLOP formula) ==")
        p(line("derived", stats(derived)))
        groups = defaultdict(list)
        for c in derived:
            groups[c.row.get("source_id") or ""].append(c)
        for k in sorted(groups):
            p(line(k, stats(groups[k])))
    if micro:
        p("== microbench: one layer forward+backward (step time) ==")
        for c in micro:
            pr, m = c.prediction["predicted_layer_time_s"], c.measured_step  # type: ignore[index]
            p(
                f"  run {c.run_id:>4} {c.prediction['layout']:<40} pred {pr * 1e3:7.2f} ms  "  # type: ignore[index]
                f"meas {m * 1e3:7.2f} ms  ({(pr - m) / m:+.0%})"
            )
    p(f"== worst {worst} rows ==")
    for c in sorted(done, key=ape, reverse=True)[:worst]:
        pr = c.prediction
        p(
            f"  run {c.run_id:>4} {c.row.get('source_id', '')[:28]:<28} {c.row.get('model', '')[:28]:<28} "
            f"{c.row.get('device', '')[:14]:<14} {pr['layout']:<40} pred {pr['predicted_tokens_per_s_per_device']:>9.0f} "
            f"meas {c.measured_tps:>9.0f}  ({ape(c):.0%})"
        )
    skipped = [c for c in cases if c.skipped]
    p(f"== skipped {len(skipped)} rows ==")
    reasons = Counter(c.skipped for c in skipped)
    for reason, k in reasons.most_common():
        ids = [c.run_id for c in skipped if c.skipped == reason]
        p(f"  {k:>3} x {reason}: runs {', '.join(ids[:12])}{' ...' if len(ids) > 12 else ''}")
    assumed = Counter(a for c in done for a in c.assumptions)
    if assumed:
        p("== assumptions made for blank fields (rows) ==")
        for a, k in assumed.most_common():
            p(f"  {k:>3} x {a}")
    return {
        "overall": overall,
        "coverage": covered / max(len(with_target), 1),
        "derived": stats(derived) if derived else None,
    }


IDENTITY = ("source_id", "model", "model_family", "device", "num_devices", "seq_len", "precision")


def identity(c: Case) -> dict[str, Any]:
    """The columns a record is grouped by, plus the normalized stack and the proxy flag."""
    d: dict[str, Any] = {k: (c.row.get(k) or "").strip() for k in IDENTITY}
    d["stack"] = stack_of(c.row)
    d["is_proxy_run"] = _int(c.row, "is_proxy_run") == 1
    return d


def records(cases: list[Case]) -> list[dict[str, Any]]:
    out = []
    for c in cases:
        base = {"run_id": c.run_id, **identity(c)}
        if c.skipped or c.prediction is None:
            out.append({**base, "skipped": c.skipped or "no target"})
            continue
        if c.target_kind == "microbench":
            out.append(
                {
                    **base,
                    "target_kind": "microbench",
                    "layout": c.prediction["layout"],
                    "predicted_step_time_s": c.prediction["predicted_layer_time_s"],
                    "measured_step_time_s": c.measured_step,
                    "assumptions": c.assumptions,
                }
            )
            continue
        out.append(
            {
                **base,
                "predicted_tokens_per_s_per_device": c.prediction["predicted_tokens_per_s_per_device"],
                "measured_tokens_per_s_per_device": c.measured_tps,
                "target_kind": c.target_kind,
                "predicted_step_time_s": c.prediction["predicted_step_time_s"],
                "predicted_memory_gib": c.prediction["predicted_memory_gib"],
                "measured_memory_gib": _num(c.row, "memory_gib_per_device"),
                "predicted_avg_power_w": c.prediction["predicted_avg_power_w"],
                "power_limit_w": c.prediction["power_limit_w"],
                "layout": c.prediction["layout"],
                "assumptions": c.assumptions,
            }
        )
    return out
