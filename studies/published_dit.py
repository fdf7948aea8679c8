"""Accuracy of autopar's DiT model against published diffusion-transformer runs (xDiT, Open-Sora).

    python studies/published_dit.py [--csv studies/data/dit_runs_dev.csv] [--json OUT] [--fit-out YAML] [--no-lomo]

Predicts every row of the DiT runs CSV (columns in studies/data/dit_runs_dev.README.md) in its own unit:
end-to-end latency per image/video (s) for inference rows, tokens/s/GPU for training rows. Prints the
MAPE per model, GPU and layout kind, and within each (model, GPU, GPU count, request) group with
two or more layouts the Spearman rank correlation and whether the layout predicted fastest is the
one measured fastest. The DiT coefficients are global (no device, model or source has one of its
own): the attention matmuls' multiple of the LLM path's attention efficiency, elementwise passes
per block eager and compiled, host time per block / ring step / all-to-all, VAE conv efficiency.
They are fitted here on log latency (soft-L1); the leave-one-model-out, leave-one-source-out and
leave-one-GPU-out MAPEs (each group's rows predicted by coefficients fitted without them) are
printed next to the in-sample one. ``--fit-out`` writes the in-sample coefficients as a DiT
calibration YAML (the shipped cost_models/calibration/dit.yaml is this file).

Rows are read as sources write them: a model name resolves against every DiT preset's id and name
(case, punctuation, I2V/T2V and -720P variants, a parenthesized size such as "(10B AsymmDiT)"), and a
name that matches no preset gets a spec built from the row's architecture columns; GPU names match
device profiles by pattern ("NVIDIA H200 141GB", "A100-SXM4-40GB").
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from accuracy import spearman  # studies/ is the script's own folder: one Spearman for every study

from autopar.dit import inference, training
from autopar.dit.costs import ATT_TENSOR_MAX, DiTCoefficients, dit_coefficients
from autopar.dit.spec import DiTSpec, load_dit
from autopar.hardware import load_device

HERE = Path(__file__).resolve().parent
DEV_CSV = HERE / "data" / "dit_runs_dev.csv"

# GPU names as sources write them (first match wins: "H200" before "H20", "A100 40GB" before "A100").
GPU_DEVICES = (  # (pattern in the lower-cased gpu_type, device profile); "H100/H800" pools two identical-compute parts
    (r"h200", "h200-sxm-141gb"),
    (r"h100", "h100-sxm-80gb"),
    (r"h800", "h800-sxm-80gb"),
    (r"h20\b", "h20"),
    (r"gh200", "gh200"),
    (r"gb200", "gb200-nvl72"),
    (r"b200", "b200"),
    (r"b300", "b300"),
    (r"l40s", "l40s"),
    (r"l20\b", "l20"),
    (r"a100.*pcie", "a100-pcie-80gb"),
    (r"a100.*40\s*gb", "a100-40gb"),
    (r"a100", "a100-80gb"),
    (r"mi300x", "mi300x"),
    (r"mi325x", "mi325x"),
    (r"mi355x", "mi355x"),
)
# Words a source adds to a model's name for a variant of the same transformer: task (text/image to
# video/image), output resolution, packaging.
VARIANT_WORDS = re.compile(
    r"(?<![a-z0-9])(t2v|i2v|ti2v|t2i|i2i|flf2v|\d{3,4}p|diffusers|preview)(?![a-z0-9])"
)


def name_tokens(text: str) -> frozenset[str]:
    """A model name as a set of words and numbers: case, punctuation, a version's "v", variant words
    (I2V/T2V, -720P) dropped; "Wan2.1-T2V-14B" -> {wan, 2, 1, 14, b}."""
    t = VARIANT_WORDS.sub(" ", text.lower())
    t = re.sub(r"(?<![a-z])v(?=\d)", " ", t)
    return frozenset(re.findall(r"[a-z]+|\d+", t))


def _strip_parens(text: str) -> str:
    return re.sub(r"\([^)]*\)", " ", text)


def resolve_preset(model: str) -> str | None:
    """The DiT preset a row's model name means, against every preset's id and name (not a fixed
    table of spellings): the name outside parentheses must hold a preset's words or be held by them;
    the whole name (parenthesized size such as "(10B AsymmDiT)" included) breaks ties. None: no
    preset, or two presets fit equally well."""
    from autopar.dit.spec import _data

    core, full = name_tokens(_strip_parens(model)), name_tokens(model)
    if not core:
        return None
    scored = []
    for pid, entry in _data()["models"].items():
        best = None
        for key in (
            name_tokens(pid),
            name_tokens(_strip_parens(entry.get("name", ""))),
            name_tokens(entry.get("name", "")),
        ):
            if key and (key <= core or core <= key):
                score = (len(full & key), -len(key - full))
                best = score if best is None or score > best else best
        if best is not None:
            scored.append((best, pid))
    if not scored:
        return None
    scored.sort(reverse=True)
    if len(scored) > 1 and scored[0][0] == scored[1][0]:
        return None
    return scored[0][1]


def spec_from_columns(row: dict[str, str], frames: int) -> tuple[DiTSpec | None, str]:
    """A spec from the row's architecture columns (arch_layers, arch_hidden, arch_heads, arch_ffn)
    when no preset matches: "N double + M single" blocks are an MMDiT (FLUX for images, HunyuanVideo
    for video), a plain count a cross-attention DiT (PixArt for images, Wan for video); the VAE, text
    encoders and conditioning widths are that family's. Returns (None, why) when the columns are missing."""
    from autopar.dit.spec import from_diffusers_config

    layers_text = (row.get("arch_layers") or "").lower()
    hidden, heads = _int(row.get("arch_hidden", "")), _int(row.get("arch_heads", ""))
    counts = [int(x) for x in re.findall(r"\d+", layers_text)]
    if not counts or not hidden or not heads or hidden % heads:
        return (
            None,
            "no preset matches and the architecture columns (arch_layers, arch_hidden, arch_heads) are incomplete",
        )
    ffn = _int(row.get("arch_ffn", "")) or 4 * hidden
    hd = hidden // heads
    name = row["model"]
    video = frames > 1
    if len(counts) >= 2 and ("single" in layers_text):
        double, single = counts[0], counts[1]
        if video:
            cfg = {"_class_name": "HunyuanVideoTransformer3DModel", "attention_head_dim": hd, "num_attention_heads": heads,
                   "num_layers": double, "num_single_layers": single, "mlp_ratio": ffn / hidden, "patch_size": 2,
                   "patch_size_t": 1, "in_channels": 16, "text_embed_dim": 4096, "pooled_projection_dim": 768,
                   "num_refiner_layers": 2}  # fmt: skip
        else:
            cfg = {"_class_name": "FluxTransformer2DModel", "attention_head_dim": hd, "num_attention_heads": heads,
                   "num_layers": double, "num_single_layers": single, "in_channels": 64,
                   "joint_attention_dim": 4096, "pooled_projection_dim": 768}  # fmt: skip
    elif video:
        cfg = {"_class_name": "WanTransformer3DModel", "attention_head_dim": hd, "num_attention_heads": heads,
               "num_layers": counts[0], "ffn_dim": ffn, "patch_size": [1, 2, 2], "in_channels": 16, "text_dim": 4096}  # fmt: skip
    else:
        cfg = {"_class_name": "PixArtTransformer2DModel", "attention_head_dim": hd, "num_attention_heads": heads,
               "num_layers": counts[0], "patch_size": 2, "in_channels": 4, "caption_channels": 4096}  # fmt: skip
    cfg["_name_or_path"] = name
    spec = from_diffusers_config(cfg, source=f"row {row.get('row_id', '')} architecture columns")
    return (
        spec,
        f"no preset matches {name!r}: built from the row's architecture columns ({cfg['_class_name']} family)",
    )


def resolve_device(gpu_type: str) -> str:
    g = gpu_type.lower()
    return next((d for pat, d in GPU_DEVICES if re.search(pat, g)), "")


GLOBAL_NAMES = [
    "att_ratio",
    "eager",
    "compiled",
    "host_eager_us",
    "host_compiled_us",
    "host_ring_us",
    "host_a2a_us",
    "vae_conv_eff",
]
UNITS = {"s": "s", "tokens/s/GPU": "tokens/s/GPU"}


@dataclass
class Case:
    row: dict[str, str]
    spec: DiTSpec | None = None
    device_id: str = ""
    n: int = 0
    kind: str = ""  # layout kind label
    note: str = ""  # how the model was resolved when no preset matched
    task: str = ""
    skip: str = ""
    infer: inference.Generation | None = None
    layout: dict[str, int] | None = None
    train: training.DiTTraining | None = None
    train_layout: dict[str, int] | None = None

    @property
    def measured(self) -> float:
        return float(self.row["metric_value"])

    @property
    def group(self) -> tuple[str, ...]:
        r = self.row
        return (
            self.spec.id if self.spec else r["model"],
            self.device_id,
            str(self.n),
            r["resolution"],
            r["frames"],
            r["steps"],
        )


def _int(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _deg(text: str) -> int:
    v = _int(text)
    return v if v else 1


def parse(row: dict[str, str]) -> Case:
    c = Case(row=row)
    c.device_id = resolve_device(row["gpu_type"])
    if not c.device_id:
        c.skip = f"no device profile for {row['gpu_type']!r}"
        return c
    c.n = int(row["gpu_count"])
    if row["metric_unit"] not in UNITS:
        c.skip = f"unit {row['metric_unit']!r} not predicted"
        return c
    res = row["resolution"]
    m = re.match(r"\s*(\d+)x(\d+)", res)
    if m:
        width, height = int(m.group(1)), int(m.group(2))
    elif _int(res):
        width = height = int(_int(res) or 0)
    else:
        c.skip = "resolution not stated"
        return c
    frames = _int(row["frames"])
    if frames is None:
        c.skip = "frames not stated"
        return c
    preset = resolve_preset(row["model"])
    if preset is not None:
        c.spec = load_dit(preset)
    else:
        c.spec, why = spec_from_columns(row, frames)
        if c.spec is None:
            c.skip = why
            return c
        c.note = why
    other = row["other_layout"].lower()
    c.task = "train" if row["task"].startswith("train") else "infer"
    if c.task == "infer":
        steps = _int(row["steps"])
        if steps is None:
            c.skip = "denoising steps not stated"
            return c
        lay = {
            "tp": _deg(row["tp"]),
            "ulysses": _deg(row["sp_ulysses"]),
            "ring": _deg(row["sp_ring"]),
            "pipefusion": _deg(row["pipefusion"]),
            "cfg": _deg(row["cfg"]),
        }
        lay["dp"] = 1
        if "sp=" in other and lay["ulysses"] * lay["ring"] == 1 and c.n > 1:
            c.skip = "SP type (Ulysses or ring) not stated"
            return c
        c.infer = inference.Generation(
            height=height,
            width=width,
            frames=frames,
            steps=steps,
            compiled="compile" in other and "no compile" not in other,
        )
        c.layout = lay
        if int(np.prod(list(lay.values()))) != c.n:
            c.skip = f"layout {lay} does not multiply to {c.n} GPUs"
            return c
        kinds = [k for k in ("cfg", "pipefusion", "ulysses", "ring", "tp") if lay[k] > 1]
        c.kind = "+".join(kinds) if kinds else "single"
        try:
            inference.check_layout(c.spec, c.n, c.infer, lay)
        except Exception as e:  # noqa: BLE001 - an illegal published layout is a skip reason
            c.skip = f"layout illegal for the model: {e}"
        return c
    # training: Open-Sora 1.x tables (data parallel; 'sp=2' is ColossalAI SP of unstated type: ring
    # and Ulysses cost nearly the same at this width; Ulysses assumed)
    sp = 2 if "sp=2" in other else 1
    rec = 1 if "checkpointing" in other else 0
    c.train = training.DiTTraining(buckets=(training.Bucket(height, width, frames),), global_batch=c.n // sp)
    c.train_layout = {"ulysses": sp, "recompute": rec}
    c.kind = "dp" + ("+sp" if sp > 1 else "") + ("+recompute" if rec else "")
    return c


@cache
def _base(device_id: str) -> tuple[DiTCoefficients, float]:
    """The device's shipped DiT coefficients and its LLM-path attention efficiency."""
    from autopar.coefficients import coefficients_for

    device = load_device(device_id)
    return dit_coefficients(device), coefficients_for(device)[0].attention_eff


def dc_from(params: dict[str, float], device) -> DiTCoefficients:
    base, llm_att = _base(device.id)
    return replace(
        base,
        attention_eff=min(llm_att * params["att_ratio"], ATT_TENSOR_MAX),
        elementwise_passes_eager=params["eager"],
        elementwise_passes_compiled=params["compiled"],
        host_per_block_eager_s=params["host_eager_us"] * 1e-6,
        host_per_block_compiled_s=params["host_compiled_us"] * 1e-6,
        host_per_ring_step_s=params["host_ring_us"] * 1e-6,
        host_per_a2a_s=params["host_a2a_us"] * 1e-6,
        vae_conv_eff=params["vae_conv_eff"],
    )


def predict(c: Case, params: dict[str, float]) -> float:
    assert c.spec is not None
    dev = load_device(c.device_id)
    dc = dc_from(params, dev)
    if c.task == "infer":
        assert c.infer is not None and c.layout is not None
        p = inference.predict(c.spec, dev, c.n, c.infer, inference.single_layout(c.layout), dc=dc)
        return float(p["latency_s"][0])
    assert c.train is not None and c.train_layout is not None
    p = training.predict(c.spec, dev, c.n, c.train, training.single_layout(c.train_layout, c.n), dc=dc)
    return float(p["tokens_per_s_per_device"][0])


def fit(cases: list[Case], start: dict[str, float] | None = None) -> dict[str, float]:
    """Least squares on log(pred / measured), soft-L1, of the global coefficients only: no device,
    model or source has a coefficient of its own, so a held-out one is predicted the same way."""
    from scipy.optimize import least_squares

    names = GLOBAL_NAMES
    x0 = np.array([2.0, 40.0, 10.0, 1000.0, 100.0, 200.0, 50.0, 0.3])
    if start is not None:  # warm start (the hold-out refits start from the full fit)
        x0 = np.array([start.get(k, v) for k, v in zip(names, x0, strict=True)])
    lo = np.array([0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.02])
    hi = np.array([8.0, 400.0, 400.0, 20000.0, 20000.0, 20000.0, 20000.0, 0.9])

    def resid(x: np.ndarray) -> np.ndarray:
        p = dict(zip(names, map(float, x), strict=True))
        # training rows are a rate: a slower prediction is a smaller number
        return np.array([np.log(predict(c, p) / c.measured) for c in cases])

    sol = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, x_scale="jac")
    return dict(zip(names, map(float, sol.x), strict=True))


def source_of(c: Case) -> str:
    """The publication a row comes from: the repository and document (commit dropped)."""
    repo, _, rest = c.row["source"].partition("@")
    doc = rest.split(" ", 1)[1] if " " in rest else rest
    return f"{repo.split('/')[-1]}:{doc.split(' ')[0].split('/')[-1]}"


HOLDOUTS = {
    "model": lambda c: c.spec.id if c.spec else "",
    "source": source_of,
    "gpu": lambda c: c.device_id,
}


def mape(pairs: list[tuple[float, float]]) -> float:
    if not pairs:
        return float("nan")
    return float(np.mean([abs(p - m) / m for p, m in pairs]))


def write_yaml(path: Path, params: dict[str, float], cases: list[Case]) -> None:
    lines = [
        "# DiT-specific coefficients (autopar.dit.costs.DiTCoefficients), fitted by",
        "#   python studies/published_dit.py --fit-out cost_models/calibration/dit.yaml",
        f"# on {len(cases)} rows of studies/data/dit_runs_dev.csv (log latency / log tokens/s, soft-L1).",
        "# attention_llm_ratio: the attention matmuls (QK^T, PV) run at this multiple of the LLM path's",
        "# attention efficiency of the device (coefficients_for: profile x LLM transfer ratio), capped at",
        "# 0.95; the softmax exponentials add their own term on the SFUs (autopar.dit.costs).",
        "# elementwise passes: d-wide bf16 activation reads+writes per token per block (norms, adaLN",
        "# modulation and gates, RoPE, GELU), eager PyTorch vs torch.compile.",
        "# host_per_block_*_us: host (Python + kernel launch) time per block per forward, a floor under",
        "# the GPU time; host_per_ring_step_us: host time of one ring-attention step (chunk + merge);",
        "# host_per_a2a_us: host time of one Ulysses all-to-all (reshape copies + NCCL launch).",
        "# vae_conv_eff: VAE convolutions' fraction of dense bf16 peak.",
        "# All coefficients are global: no device, model or source has one of its own.",
        "schema: 2",
        f'fitted_on: "studies/data/dit_runs_dev.csv, {len(cases)} rows"',
        "global:",
        f"  attention_llm_ratio: {params['att_ratio']:.4f}",
        f"  elementwise_passes_eager: {params['eager']:.2f}",
        f"  elementwise_passes_compiled: {params['compiled']:.2f}",
        f"  host_per_block_eager_us: {params['host_eager_us']:.1f}",
        f"  host_per_block_compiled_us: {params['host_compiled_us']:.1f}",
        f"  host_per_ring_step_us: {params['host_ring_us']:.1f}",
        f"  host_per_a2a_us: {params['host_a2a_us']:.1f}",
        f"  vae_conv_eff: {params['vae_conv_eff']:.4f}",
    ]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEV_CSV, help="DiT runs CSV (default: %(default)s)")
    ap.add_argument("--json", type=Path, default=None, help="write one record per row")
    ap.add_argument(
        "--fit-out",
        type=Path,
        default=None,
        help="write the in-sample fitted coefficients as a DiT calibration YAML",
    )
    ap.add_argument("--no-lomo", action="store_true", help="skip the leave-one-model/source/GPU-out refits")
    a = ap.parse_args(argv)
    try:
        with a.csv.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        print(f"error: cannot read --csv {a.csv}: {e.strerror or e}", file=sys.stderr)
        return 2
    need = {"row_id", "model", "gpu_type", "gpu_count", "metric_value", "metric_unit"}
    if not rows or not need <= set(rows[0]):
        print(
            f"error: {a.csv} is not a DiT runs CSV (needs columns {', '.join(sorted(need))})", file=sys.stderr
        )
        return 2
    cases = [parse(r) for r in rows]
    used = [c for c in cases if not c.skip]
    params = fit(used)
    pred = {c.row["row_id"]: predict(c, params) for c in used}
    # hold-outs: each model / source / GPU predicted by coefficients fitted without its rows
    held: dict[str, dict[str, float]] = {"model": {}, "source": {}, "gpu": {}}
    fits_out: list[tuple[str, str, dict[str, float]]] = []
    if not a.no_lomo:
        for how, key in HOLDOUTS.items():
            for v in sorted({key(c) for c in used}):
                p = fit([c for c in used if key(c) != v], params)
                fits_out.append((how, v, p))
                for c in used:
                    if key(c) == v:
                        held[how][c.row["row_id"]] = predict(c, p)

    print(
        f"{len(rows)} rows, {len(used)} predicted ({100 * len(used) / len(rows):.0f}% coverage), {len(rows) - len(used)} skipped"
    )
    print("fitted coefficients (in-sample): " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(params.items())))
    print()
    print(
        f"{'row':5} {'model':22} {'gpu':14} {'n':>2} {'layout':22} {'measured':>10} {'pred':>10} {'err':>7} {'LOMO':>7} {'LOSO':>7} {'LOGO':>7}"
    )
    for c in used:
        rid = c.row["row_id"]
        e = pred[rid] / c.measured - 1
        le = " ".join(
            f"{100 * (held[h][rid] / c.measured - 1):+6.1f}%" if rid in held[h] else " " * 7 for h in held
        )
        print(
            f"{rid:5} {c.spec.id if c.spec else '':22} {c.device_id:14} {c.n:>2} {c.kind:22} {c.measured:10.2f} {pred[rid]:10.2f} {100 * e:+6.1f}% {le}"
        )

    def table(title: str, key) -> None:
        print(
            f"\nMAPE by {title}: in-sample | leave-one-model-out | leave-one-source-out | leave-one-GPU-out"
        )
        groups: dict[str, list[Case]] = defaultdict(list)
        for c in used:
            groups[key(c)].append(c)
        for k, cs in sorted(groups.items()):
            ins = mape([(pred[c.row["row_id"]], c.measured) for c in cs])
            outs = " | ".join(
                f"{100 * mape([(held[h][c.row['row_id']], c.measured) for c in cs if c.row['row_id'] in held[h]]):6.1f}%"
                for h in held
            )
            print(f"  {k:28} rows {len(cs):>3}  {100 * ins:6.1f}% | {outs}")

    table("model", lambda c: c.spec.id if c.spec else "")
    table("GPU", lambda c: c.device_id)
    table("layout kind", lambda c: c.kind)
    table("source", source_of)
    table("task", lambda c: c.task)
    lat = [c for c in used if c.task == "infer"]
    overall = mape([(pred[c.row["row_id"]], c.measured) for c in used])
    lat_m = mape([(pred[c.row["row_id"]], c.measured) for c in lat])
    lat_held = {
        h: mape([(held[h][c.row["row_id"]], c.measured) for c in lat if c.row["row_id"] in held[h]])
        for h in held
    }
    lat_rows = sum(1 for r in rows if r["metric_unit"] == "s")
    print(
        f"\noverall MAPE {100 * overall:.1f}% ({len(used)} of {len(rows)} rows); latency: {len(lat)} of "
        f"{lat_rows} latency rows predicted ({100 * len(lat) / max(lat_rows, 1):.0f}% coverage), MAPE "
        f"{100 * lat_m:.1f}% in-sample, {100 * lat_held['model']:.1f}% leave-one-model-out, "
        f"{100 * lat_held['source']:.1f}% leave-one-source-out, {100 * lat_held['gpu']:.1f}% leave-one-GPU-out"
    )

    print("\nRanking within (model, GPU, GPU count, request) groups with >= 2 layouts:")
    groups: dict[tuple[str, ...], list[Case]] = defaultdict(list)
    for c in used:
        groups[c.group].append(c)
    rank_out = []
    for key, cs in sorted(groups.items()):
        if len({c.row["row_id"] for c in cs}) < 2:
            continue
        sign = 1.0 if cs[0].task == "infer" else -1.0  # latency: smaller is better
        p = np.array([sign * pred[c.row["row_id"]] for c in cs])
        m = np.array([sign * c.measured for c in cs])
        rho = spearman(p, m)
        best = cs[int(np.argmin(p))].row["row_id"] == cs[int(np.argmin(m))].row["row_id"]
        lab = f"{key[0]} {key[1]} x{key[2]} {key[3][:12]}"
        print(
            f"  {lab:44} layouts {len(cs):>2}  spearman {rho:+.2f}  best predicted == best measured: {'yes' if best else 'no'}"
        )
        rank_out.append({"group": list(key), "rows": len(cs), "spearman": rho, "best_match": best})
    if rank_out:
        hits = sum(r["best_match"] for r in rank_out)
        rhos = [r["spearman"] for r in rank_out if r["spearman"] == r["spearman"]]
        print(
            f"  {len(rank_out)} groups: best layout found in {hits} ({100 * hits / len(rank_out):.0f}%), mean spearman {np.mean(rhos):+.2f}"
        )

    if fits_out:
        print("\ncoefficients fitted without each held-out group:")
        for how, v, p in fits_out:
            print(f"  {how:6} {v:28} " + ", ".join(f"{k}={x:.3g}" for k, x in p.items()))

    built = [c for c in cases if c.note and not c.skip]
    if built:
        print("\nrows whose model matched no preset:")
        for c in built:
            print(f"  {c.row['row_id']}: {c.note}")
    print("\nskipped rows:")
    for c in cases:
        if c.skip:
            print(f"  {c.row['row_id']}: {c.skip}")
    if a.fit_out:
        write_yaml(a.fit_out, params, used)
        print(f"wrote {a.fit_out}")
    if a.json:
        recs: list[dict[str, Any]] = []
        for c in cases:
            rid = c.row["row_id"]
            if c.skip:
                recs.append({"row_id": rid, "skipped": c.skip})
            else:
                recs.append(
                    {
                        "row_id": rid,
                        "predicted_value": pred[rid],
                        "measured_value": c.measured,
                        "metric_unit": c.row["metric_unit"],
                        **({"model_resolution": c.note} if c.note else {}),
                    }
                )
        a.json.write_text(json.dumps({"records": recs}, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
