"""Serving stacks as an input (issue 23 item 1): backend profiles, their rules, and the default."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autopar.errors import AutoparError
from autopar.hardware import load_device
from autopar.model import load_model
from autopar.serving import backends as B
from autopar.serving.estimate import (
    ServingTable,
    evaluate_serving,
    instance_memory,
    iteration,
    make_context,
    make_workload,
)
from autopar.serving.search import serve

ROOT = Path(__file__).resolve().parent.parent
H100 = load_device("h100-sxm-80gb")


def ctx_for(model: str, backend: str, **kw):
    m = load_model(str(ROOT / "tests" / "configs" / model) if model.endswith(".json") else model)
    return make_context(m, H100, make_workload(backend=backend, **kw), devices_per_node=8)


@pytest.mark.parametrize("name", B.BACKENDS)
def test_every_profile_loads_and_sources_its_figures(name: str) -> None:
    b = B.load_backend(name)
    assert b.name == name and b.version in b.versions
    for src in (
        b.scheduler.max_batch.source,
        b.scheduler.max_num_tokens.source,
        b.scheduler.chunked_prefill.source,
        b.kv_cache.block_source,
        b.kv_cache.fraction.source,
        b.attention.source,
    ):
        assert len(src) > 20
    if b.all_reduce.custom is not None:
        assert b.all_reduce.custom.source and b.all_reduce.custom.latency_source


def test_trtllm_is_the_default_and_unchanged() -> None:
    """The default workload is trtllm's, resolved to the limits the model had before backends."""
    ctx = ctx_for("llama-3.1-8b", "trtllm", isl=1024, osl=256)
    w = ctx.workload
    assert (w.max_batch, w.max_num_tokens, w.chunked_prefill, w.kv_cache_fraction) == (4096, None, True, 0.95)
    assert make_workload(isl=1, osl=1).backend == "trtllm"
    a = serve(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=4, isl=1024, osl=256, offline=True)
    b = serve(
        model="llama-3.1-8b",
        device="h100-sxm-80gb",
        num_devices=4,
        isl=1024,
        osl=256,
        offline=True,
        backend="trtllm",
    )
    assert a.results == b.results


def test_vllm_defaults_follow_the_device() -> None:
    b = B.load_backend("vllm")
    assert (B.max_batch(b, H100), B.max_num_tokens(b, H100)) == (1024, 8192)
    a100 = load_device("a100-80gb")  # >= 70 GiB, but the A100 is excluded (vLLM PR #17885)
    assert (B.max_batch(b, a100), B.max_num_tokens(b, a100)) == (256, 2048)


def test_kv_memory_rules_per_backend() -> None:
    """TRT-LLM: a share of the memory left free; vLLM: gpu_memory_utilization of the total, less the
    rest; SGLang: mem_fraction_static of the total holds weights + KV (its reserve formula by hand)."""
    tab = ServingTable({"tp": [1, 2, 8]})
    cap = H100.memory_bytes
    out = {}
    for name in B.BACKENDS:
        ctx = ctx_for("llama-3.1-8b", name, isl=1024, osl=256)
        mem = instance_memory(ctx, tab)
        free = cap - mem["weights"] - mem["workspace"] - mem["reserve"]
        out[name] = (mem, free)
    mem, free = out["trtllm"]
    np.testing.assert_allclose(mem["kv_available"], 0.95 * free, rtol=1e-12)
    mem, free = out["vllm"]
    np.testing.assert_allclose(mem["kv_available"], free - 0.1 * cap, rtol=1e-12)
    mem, free = out["sglang"]
    gpu_mib = cap / 2**20
    graph_bs = np.array([256.0, 256.0, 512.0])  # cuda_graph_max_bs on an 80 GB part: 256 below TP4, else 512
    reserved = 512 + 8192 * 1.5 + graph_bs * 2 + np.array([1.0, 2.0, 8.0]) / 8 * 1024
    reserved = np.maximum(reserved, 10 * 1024)
    frac = np.round((gpu_mib - reserved) / gpu_mib, 3)
    np.testing.assert_allclose(mem["kv_available"], np.minimum(frac * cap - mem["weights"], free), rtol=1e-12)
    # KV blocks: 64 tokens (TRT-LLM), 16 (vLLM), 1 (SGLang): a 1000-token sequence reserves 1024, 1008, 1000
    per_tok = {}
    for name, paged in (("trtllm", 1024), ("vllm", 1008), ("sglang", 1000)):
        ctx = ctx_for("llama-3.1-8b", name, isl=900, osl=100)
        per_tok[name] = float(instance_memory(ctx, ServingTable({"tp": [1]}))["kv_per_seq"][0]) / paged
    assert per_tok["trtllm"] == pytest.approx(per_tok["vllm"]) == pytest.approx(per_tok["sglang"])


def test_custom_allreduce_latency_and_when_it_runs() -> None:
    car = B.load_backend("vllm").all_reduce.custom
    assert car is not None
    # the measured points themselves (vLLM kernel on H100, sglang PR #2904)
    t = B.custom_allreduce_s(car, np.array([262144.0, 262144.0, 1048576.0]), np.array([2.0, 8.0, 4.0]))
    np.testing.assert_allclose(t, [12.9e-6, 24.1e-6, 40.2e-6])
    # TP 6 lies between TP 4 and TP 8; a larger message costs more
    t6 = B.custom_allreduce_s(car, np.array([262144.0]), np.array([6.0]))[0]
    assert 20.6e-6 < t6 < 24.1e-6
    sizes = np.array([1e3, 1e4, 1e5, 1e6, 4e6])
    ts = B.custom_allreduce_s(car, sizes, np.full(5, 8.0))
    assert np.all(np.diff(ts) > 0)
    use = B.uses_custom_allreduce(
        car, np.array([1e6, 9e6, 1e6, 1e6]), np.array([8.0, 8.0, 16.0, 3.0]), devices_per_node=8
    )
    assert use.tolist() == [True, False, False, False]  # 8 MiB buffer, one node, TP 2/4/6/8
    assert not B.uses_custom_allreduce(
        B.load_backend("trtllm").all_reduce.custom, np.array([1e3]), np.array([2.0]), 8
    )


def test_tp_decode_is_cheaper_with_a_custom_allreduce() -> None:
    """Decode at TP8 with small messages: the custom kernel's measured ~10-25 us per call against NCCL
    plus the fitted 53 us sync: the TP communication of a vLLM step is the smaller."""
    tab = ServingTable({"tp": [8]})
    comm = {}
    for name in ("trtllm", "vllm"):
        ctx = ctx_for("llama-3.1-70b", name, isl=1000, osl=1000, weight_precision="fp8")
        it = iteration(ctx, tab, n_dec=32, n_pre=0, dec_ctx=1500, pre_ctx=0, pre_len=1, logit_rows=32)
        comm[name] = float(it["comm"][0])
    assert comm["vllm"] < 0.6 * comm["trtllm"]


def test_steps_outside_cuda_graphs_pay_the_eager_launches() -> None:
    """vLLM captures steps up to min(2 x max_num_seqs, 512) tokens: at TP8 a 12-layer model's GPU
    time is below its launches, so one token more than 512 adds host time; trtllm adds none."""
    tab = ServingTable({"tp": [8]})
    host = {}
    for name in ("trtllm", "vllm"):
        ctx = ctx_for("gpt2.json", name, isl=128, osl=128)
        h = []
        for n in (512, 513):
            it = iteration(ctx, tab, n_dec=n, n_pre=0, dec_ctx=200, pre_ctx=0, pre_len=1, logit_rows=n)
            h.append(float(it["host"][0]))
            gpu = float(it["gpu"][0])
        host[name] = h
    launches = 12 * 12 * 10e-6  # layers x kernels per layer x launch
    assert host["vllm"][1] - host["vllm"][0] == pytest.approx(launches - gpu, rel=0.05)
    assert host["trtllm"][1] - host["trtllm"][0] < 1e-5


def test_other_stacks_widen_the_expected_error_by_the_largest_held_out_factor() -> None:
    """The stack factor is the largest of the factors the table borrows from the training table (it
    states it as ``widening.backend``; the measured MoE/MLA factor is not a stack's)."""
    import yaml

    from autopar.coefficients import expected_error_path
    from autopar.serving.accuracy import table_path

    table = yaml.safe_load(table_path().read_text())
    training = yaml.safe_load(expected_error_path().read_text())["widening"]
    f_max = max(float(training[k]["factor"]) for k in ("device", "model_class"))
    assert float(table["widening"]["backend"]["factor"]) == pytest.approx(f_max)
    kw = dict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=1, isl=1024, osl=256, offline=True)
    base = serve(**kw).costing["expected_error"]
    for name in ("vllm", "sglang"):
        r = serve(**kw, backend=name)
        ee = r.costing["expected_error"]
        assert "backend" in ee["widened_by"] and ee["factor"] == pytest.approx(
            base["factor"] * f_max, rel=1e-3
        )
        assert r.expected_error_p90 > base["p90"]
        assert any("no serving run of" in n for n in r.notes)
        assert r.costing["backend"]["name"] == name and not r.costing["backend"]["measured"]


def test_backend_version_must_be_a_profiled_one() -> None:
    with pytest.raises(AutoparError, match="no profile for version"):
        B.load_backend("vllm", "0.2")
    p = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "serve", "--model", "llama-3.1-8b", "--device", "h100-sxm-80gb",
         "--num-devices", "1", "--isl", "100", "--osl", "100", "--backend", "vllm", "--backend-version", "0.2"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "0.11" in p.stderr


def test_every_backend_serves() -> None:
    """70B FP8 (72.7 GB of weights) on one 80 GB H100: TRT-LLM keeps a KV cache in what is left;
    vLLM's 0.9 of the total (72 GB) holds no more than the weights: nothing to cache."""
    for name in B.BACKENDS:
        ctx = ctx_for("llama-3.1-70b", name, isl=2000, osl=500, weight_precision="fp8", offline=True)
        res = evaluate_serving(ctx, ServingTable({"tp": [1, 2, 4, 8]}))
        assert res["valid"][1:].all() and np.all(res["output_tps_instance"][1:] > 0)
        assert res["valid"][0] == (name == "trtllm")


def test_study_reads_each_rows_stack() -> None:
    sys.path.insert(0, str(ROOT / "studies"))
    from published_serving import stack_of

    assert stack_of({"orig_framework": "TensorRT-LLM 0.17 (in-flight batching, trtllm-bench)"})[0] == "trtllm"
    assert stack_of({"stack": "vLLM 0.8.5"})[0] == "vllm"
    assert stack_of({"orig_framework": "SGLang v0.4"})[0] == "sglang"
    assert stack_of({"orig_framework": "llama.cpp"}) == (None, "llama.cpp")


def test_gpu_stack_rules_stay_on_gpus() -> None:
    """vLLM on a PCIe-only node: its custom kernel only at TP 2 (should_custom_ar needs NVLink above
    two ranks); on a vendor's own stack (Groq) a GPU backend is refused; on a TPU neither graphs nor
    the custom kernel are modelled, and the notes say so."""
    car = B.load_backend("vllm").all_reduce.custom
    use = B.uses_custom_allreduce(car, np.array([1e4, 1e4]), np.array([2.0, 4.0]), 8, fully_connected=False)
    assert use.tolist() == [True, False]
    m = load_model("llama-3.1-8b")
    with pytest.raises(AutoparError, match="its vendor's own serving stack"):
        make_context(
            m, load_device("groq-lpu"), make_workload(isl=100, osl=100, backend="vllm"), devices_per_node=8
        )
    tpu = load_device("tpu-v5p")
    notes = B.describe(B.load_backend("vllm"), tpu, kv_fraction_text="x")
    assert any("neither is modelled" in n for n in notes) and not any("custom one-shot" in n for n in notes)


def test_vllm_offline_runs_take_the_llm_class_budget() -> None:
    b = B.load_backend("vllm")
    assert B.max_num_tokens(b, H100, offline=True) == 16384 and B.max_num_tokens(b, H100) == 8192
    ctx = ctx_for("llama-3.1-8b", "vllm", isl=1000, osl=1000, offline=True)
    assert ctx.workload.max_num_tokens == 16384
    ctx = ctx_for("llama-3.1-8b", "vllm", isl=1000, osl=1000, max_num_tokens=4096, offline=True)
    assert ctx.workload.max_num_tokens == 4096  # a given budget wins


def test_sglang_runs_prefill_and_decode_in_separate_batches() -> None:
    """SGLang (no --enable-mixed-chunk): a decode step costs a decode-only iteration plus its share of
    a prefill-only batch of the token budget; vLLM mixes both in one iteration, which is cheaper."""
    from autopar.serving.estimate import steady_state

    tab = ServingTable({"tp": [2]})
    ctx = ctx_for("llama-3.1-8b", "sglang", isl=2000, osl=500)
    budget = float(ctx.workload.max_num_tokens)
    B = 64.0
    ss = steady_state(ctx, tab, B, budget=budget)
    dec = iteration(
        ctx, tab, n_dec=B, n_pre=0, dec_ctx=2250, pre_ctx=0, pre_len=2000, logit_rows=B, pre_seqs=0
    )
    pre = iteration(
        ctx, tab, n_dec=0, n_pre=budget, dec_ctx=2250, pre_ctx=1000, pre_len=2000, logit_rows=budget / 2000,
        pre_seqs=budget / 2000,
    )  # fmt: skip
    share = B * 2000 / 500 / budget
    assert float(ss["tpot"][0]) == pytest.approx(
        float(dec["t_iter"][0] + share * pre["t_iter"][0]), rel=1e-12
    )
    assert float(ss["ttft"][0]) == pytest.approx(float(pre["t_iter"][0]), rel=1e-12)  # 2000 tokens: one batch
    assert float(ss["batch"][0]) == B
