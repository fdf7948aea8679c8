"""The shipped published-runs data, the row-format conventions of studies/published.py, and the
accuracy study's smoke run (a few rows, no leave-one-source-out refits)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))

from published import (  # noqa: E402
    DEV2_CSV,
    DEV_CSV,
    Case,
    at_depth,
    build_model,
    megatron_model_flops_per_token,
    run_case,
)

from autopar.model import load_model  # noqa: E402


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with path.open(newline="") as f:
        return {r["run_id"]: r for r in csv.DictReader(f)}


DEV = _rows(DEV_CSV)
DEV2 = _rows(DEV2_CSV)
DEV3 = _rows(ROOT / "studies" / "data" / "published_runs_dev3.csv")


def _run(row: dict[str, str]) -> Case:
    c = Case(row=dict(row), run_id=row["run_id"])
    run_case(c)
    return c


def test_shipped_data_is_complete():
    assert len(DEV) == 323 and len(DEV2) == 57
    for name in ("published_runs_dev.README.md", "published_runs_dev2.README.md"):
        assert (DEV_CSV.parent / name).is_file()


def test_proxy_row_is_predicted_at_the_depth_run_not_the_presets():
    row = DEV2["sm-45"]  # Llama-3-70B cut to 12 of 80 layers, 8x A100 PCIe
    assert row["is_proxy_run"] == "1" and row["layers"] == "12"
    proxy = _run(row)
    assert proxy.prediction is not None, proxy.skipped
    assert proxy.job is not None and proxy.job.model.layers == 12
    assert any(a.startswith("proxy run") for a in proxy.assumptions)
    full = _run({**row, "is_proxy_run": "0"})  # the same row read as a full-depth run
    assert full.job is not None and full.job.model.layers == 80
    # 12 of 80 layers: the proxy's step is far shorter; a full-depth prediction would be ~5x slower
    ratio = (
        proxy.prediction["predicted_tokens_per_s_per_device"]
        / full.prediction["predicted_tokens_per_s_per_device"]  # type: ignore[index]
    )
    assert ratio > 3


def test_at_depth_keeps_the_dense_prefix_and_moe_pattern():
    v3 = load_model("deepseek-v3")  # 3 dense then 58 MoE layers
    p = at_depth(v3, 7)
    assert (p.layers, p.first_dense_layers, p.moe_layers) == (7, 3, 4)
    assert (p.num_experts, p.hidden, p.vocab) == (v3.num_experts, v3.hidden, v3.vocab)
    oss = load_model("gpt-oss-120b")  # alternating sliding / full attention
    assert at_depth(oss, 6).sliding_window_layers == 3


def test_dims_only_deepseek_row_uses_family_conventions_and_stated_notes():
    c = _run(DEV2["sm-57"])  # DeepSeek-V2 cut to 4 layers, dims only
    assert c.prediction is not None, c.skipped
    m = c.job.model  # type: ignore[union-attr]
    assert (m.layers, m.first_dense_layers, m.moe_layers, m.moe_ffn_hidden, m.kv_lora_rank) == (
        4,
        1,
        3,
        1536,
        512,
    )
    assert m.gated_mlp and m.norm == "rmsnorm" and not m.tie_embeddings
    assert any(a.startswith("DeepSeek family") for a in c.assumptions)


def test_llama_family_dims_only_row_without_ffn_is_refused_not_guessed():
    row = {**DEV2["sm-63"], "model_preset": "", "ffn_hidden": ""}
    c = _run(row)
    assert c.prediction is None and "without ffn_hidden" in (c.skipped or "")
    ok = _run({**DEV2["sm-63"], "model_preset": ""})
    assert ok.prediction is not None and any(a.startswith("Llama/Mistral/Qwen") for a in ok.assumptions)


def test_model_tflops_target_uses_the_megatron_basis_checked_on_nemo_rows():
    # NeMo 24.07 pre-training rows print tokens/s and model TFLOP/s: the Megatron formula links them
    for rid in ("124", "126", "127", "128", "132", "133"):
        r = DEV[rid]
        flops = megatron_model_flops_per_token(load_model(r["model_preset"]), int(r["seq_len"]))
        ratio = float(r["model_tflops_per_device"]) * 1e12 / float(r["tokens_per_s_per_device"]) / flops
        assert ratio == pytest.approx(1.0, abs=2e-3)
    c = _run(DEV2["148"])  # model TFLOP/s only, 1M-token context parallelism
    assert c.target_kind == "derived" and c.measured_tps and c.prediction is not None
    flops = megatron_model_flops_per_token(load_model("llama-2-7b"), 1048576)
    assert c.measured_tps == pytest.approx(536e12 / flops)


def test_mfu_without_a_stated_peak_is_refused():
    row = {**DEV["38"], "model_tflops_per_device": "", "mfu_peak_tflops": ""}
    c = _run(row)
    assert c.prediction is None and "mfu_peak_tflops" in (c.skipped or "")


def test_blank_etp_follows_the_stack_and_block_scaled_rows_are_predicted():
    c = _run(DEV2["373"])  # Megatron-Bridge DeepSeek-V3, ep=32, etp blank, mxfp8
    # Megatron-Bridge's MoE recipes set expert_tensor_parallel_size = 1 (studies/published.py
    # BRIDGE_ETP_SOURCE); another Megatron stack keeps Megatron-Core's default, etp = tp
    assert any(a.startswith("etp=1 (blank; Megatron-Bridge MoE recipes") for a in c.assumptions)
    nemo = _run({**DEV2["373"], "orig_framework": "NeMo 24.07", "tp": "2"})
    assert "etp=tp (blank; Megatron default expert_tensor_parallel_size = tp)" in nemo.assumptions
    assert not any("costed as fp8" in a for a in c.assumptions) and c.prediction
    # 26.08's MXFP8 recipe runs the full-iteration graph (studies/published.py BRIDGE_FUSED_GRAPH),
    # its NVFP4 one eager: compare the precisions on the eager recipe (26.04.01's) alone.
    assert any(a.startswith("moe_fused_graph (Megatron-Bridge 26.08 ") for a in c.assumptions)
    eager = {**DEV2["373"], "orig_framework": "Megatron-Bridge / NeMo 26.04.01"}
    c = _run(eager)
    assert not any(a.startswith("moe_fused_graph") for a in c.assumptions) and c.prediction
    fp4 = _run({**eager, "precision": "nvfp4"})  # the same run at the fp4 peak
    assert fp4.prediction
    key = "predicted_tokens_per_s_per_device"
    # NVFP4 runs at the FP4 peak with its own measured rate and shape law (studies/gemm_rates.py): a
    # fine-grained MoE's small expert GEMMs gain little or nothing over MXFP8 (measured: Nemotron 3
    # Super nvfp4 / mxfp8 = 0.88-1.04 on B200/B300/GB200/GB300), a dense 70B's large ones gain
    # ~1.3x (Llama 3 70B on GB200, rows 449/450, the same layout: 4,864 / 3,712 = 1.31).
    assert 0.85 < fp4.prediction[key] / c.prediction[key] < 1.15
    dense_fp4, dense_mx = _run(DEV3["450"]), _run({**DEV3["450"], "precision": "mxfp8"})
    assert 1.15 < dense_fp4.prediction[key] / dense_mx.prediction[key] < 1.6
    n = _run(DEV2["386"])  # Nemotron 3 Super, nvfp4: the latent-MoE hybrid's preset by its name
    assert n.prediction and n.job.model.moe_latent_size == 1024 and n.job.model.mamba_layers == 40
    u = _run(DEV2["389"])  # Nemotron 3 Ultra: no public config, no preset
    assert u.prediction is None and "preset" in (u.skipped or "")


def test_power_cap_changes_energy_not_throughput():
    row = DEV2["sm-63"]
    free, capped = _run(row), _run({**row, "power_cap_w": "250"})
    assert free.prediction and capped.prediction
    assert capped.prediction["power_limit_w"] == 250 and free.prediction["power_limit_w"] == 300
    assert capped.prediction["predicted_avg_power_w"] < free.prediction["predicted_avg_power_w"]
    assert (
        capped.prediction["predicted_tokens_per_s_per_device"]
        == free.prediction["predicted_tokens_per_s_per_device"]
    )
    assert any(a.startswith("power cap 250 W") for a in capped.assumptions)


def test_accuracy_smoke(tmp_path: Path):
    keep = ["sm-45", "sm-46", "sm-47", "sm-57", "148", "373", "389"]
    small = tmp_path / "small.csv"
    fields = list(next(iter(DEV2.values())))
    with small.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(DEV2[k] for k in keep)
    out = tmp_path / "acc.json"
    r = subprocess.run(
        [sys.executable, "studies/accuracy.py", "--csv", str(small), "--no-loso", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    for section in (
        "== coverage ==",
        "== by source_id ==",
        "== by stack ==",
        "== ranking",
        "== repeatability",
        "== allocated memory",
    ):
        assert section in r.stdout
    assert "leave-one-source-out" not in r.stdout
    assert "training rows 7, with a target 7, predicted 6" in r.stdout
    d = json.loads(out.read_text())
    assert [x["run_id"] for x in d["records"]] == keep
    assert {"overall", "by_source_id", "by_device", "by_model_family", "by_precision", "by_stack"} <= set(
        d["tables"]
    )
    assert d["tables"]["memory"]["summary"]["n"] == 4
    (rank,) = d["tables"]["ranking"]  # the three Llama-3-70B proxy layouts
    assert rank["rows"] == 3 and -1 <= rank["spearman"] <= 1
    assert "preset" in next(x["skipped"] for x in d["records"] if x["run_id"] == "389")  # no public config


def test_dims_only_classic_rows_build_a_stated_decoder() -> None:
    # rows of classic models by dimensions only were refused as "unknown family"
    for model, h, L, a, total in (
        ("BLOOM-176B", 14336, 70, 112, 176.25e9),
        ("PaLM 540B", 18432, 118, 48, 540.35e9),
    ):
        case = Case(row={"model": model, "hidden": str(h), "layers": str(L), "heads": str(a)}, run_id="r")
        spec = build_model(case)
        assert abs(spec.total_params / total - 1) < 0.01
        assert any(model.split("-")[0].split()[0] in x for x in case.assumptions), case.assumptions
    moe = Case(
        row={"model": "Foo-MoE", "hidden": "4096", "layers": "32", "heads": "32", "num_experts": "8"},
        run_id="r",
    )
    with pytest.raises(Exception, match="unknown family"):
        build_model(moe)


def test_repeatability_compares_only_the_same_job_across_releases() -> None:
    import accuracy

    # Qwen3-30B-A3B on 8 GB300, the same layout in NeMo 26.04.01 and 26.08 (run 468: 31744, 379: 44544
    # tokens/s per GPU); a third row of another release but another layout must not join them.
    rows = {**DEV2, **DEV3}
    a, b = _run(rows["468"]), _run(rows["379"])
    assert a.prediction and b.prediction and a.prediction["layout"] == b.prediction["layout"]
    assert a.row["orig_framework"] != b.row["orig_framework"]
    other = _run(rows["611"])  # same model and device, micro-batch 4 (another layout)
    assert other.prediction["layout"] != a.prediction["layout"]
    rep = accuracy.repeatability([a, b, other])
    (fam,) = rep
    gm = (31744.0 * 44544.0) ** 0.5
    assert rep[fam]["rows"] == 2
    assert rep[fam]["spread_mape"] == pytest.approx((gm / 31744.0 - 1 + 1 - gm / 44544.0) / 2)
    assert rep[fam]["max_ratio"] == pytest.approx(44544.0 / 31744.0)
    # each row under its own prediction: 26.08's recipe (run 379) is the full-iteration graph
    pa, pb = (c.prediction["predicted_tokens_per_s_per_device"] for c in (a, b))
    assert pb > pa
    assert rep[fam]["model_mape"] == pytest.approx((abs(pa / 31744.0 - 1) + abs(pb / 44544.0 - 1)) / 2)
    # one release only: not a repeat
    same = _run(rows["468"])
    assert accuracy.repeatability([a, same]) == {}
