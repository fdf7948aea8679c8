"""Golden tests of the per-stack memory profiles (autopar.frameworks), the headroom and the bases."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autopar import predict
from autopar.frameworks import DEFAULT_MEMORY_HEADROOM, PROFILES
from autopar.job import Job
from autopar.layout import Layout, LayoutTable
from autopar.memory import ALLOCATED_COMPONENTS, memory_breakdown
from autopar.model import load_model

D = 64  # data-parallel shard group of the goldens


# (stack, zero) -> bytes per parameter over a shard group of d, from the stacks' documentation
# (sources in autopar/frameworks.py).
GOLDEN = {
    # Megatron-Core distrib_optimizer guide: "float16 param, fp32 grads: 18 / 6 + 12/d".
    ("megatron", 0): 18.0,
    ("megatron", 1): 6 + 12 / D,
    ("megatron", 2): 2 + (4 + 12) / D,  # Megatron-FSDP optim_grads
    ("megatron", 3): 18 / D,  # Megatron-FSDP optim_grads_params
    # FSDP: fp32 sharded param + fp32 grad + Adam m, v; full shard = 16/d (= (2+2+12)/d in total).
    ("fsdp", 0): 16.0,  # DDP with autocast
    ("fsdp", 2): 16 / D,
    ("fsdp", 3): 16 / D,
    ("torchtitan", 3): 16 / D,
    # DeepSpeed ZeRO (Rajbhandari et al. 2020): (2 + 2 + K), K = 12.
    ("deepspeed", 0): 16.0,
    ("deepspeed", 1): 4 + 12 / D,
    ("deepspeed", 2): 2 + 14 / D,
    ("deepspeed", 3): 16 / D,
    ("megatron-deepspeed", 1): 4 + 12 / D,
}


@pytest.mark.parametrize(("stack", "zero"), sorted(GOLDEN))
def test_bytes_per_param_per_stack_and_zero_stage(stack: str, zero: int) -> None:
    prof = PROFILES[stack]
    spec = load_model("llama-3.1-8b")
    lay = LayoutTable.from_layouts([Layout(dp=D, zero=zero, grad_accum=1)])
    mem = memory_breakdown(spec, lay, seq_len=4096, profile=prof)
    state = mem["weights"][0] + mem["gradients"][0] + mem["optimizer"][0]
    assert state == pytest.approx(GOLDEN[stack, zero] * spec.total_params, rel=1e-6)


@pytest.mark.parametrize("stack", ["fsdp", "torchtitan"])
def test_fsdp_zero2_keeps_the_gathered_16bit_params_through_backward(stack: str) -> None:
    """reshard_after_forward=False: every layer's bf16 parameters stay gathered (2 bytes each) from
    its forward to its backward, on top of the 16/d sharded state; ZeRO-3 holds two layers."""
    spec = load_model("llama-3.1-8b")
    z2, z3 = (
        memory_breakdown(
            spec,
            LayoutTable.from_layouts([Layout(dp=D, zero=z, grad_accum=1)]),
            seq_len=4096,
            profile=PROFILES[stack],
        )
        for z in (2, 3)
    )
    assert z2["zero3_buffers"][0] == pytest.approx(2.0 * spec.total_params, rel=1e-6)
    assert z3["zero3_buffers"][0] < 0.2 * z2["zero3_buffers"][0]
    meg = memory_breakdown(
        spec,
        LayoutTable.from_layouts([Layout(dp=D, zero=2, grad_accum=1)]),
        seq_len=4096,
        profile=PROFILES["megatron"],
    )
    assert meg["zero3_buffers"][0] == 0.0  # Megatron-FSDP optim_grads keeps its bf16 weights as weights


def test_megatron_keeps_fp32_grads_unsharded_by_the_distributed_optimizer() -> None:
    spec = load_model("llama-3.1-8b")
    lay = LayoutTable.from_layouts([Layout(dp=8, zero=1, grad_accum=1)])
    meg = memory_breakdown(spec, lay, seq_len=4096, profile=PROFILES["megatron"])
    ds = memory_breakdown(spec, lay, seq_len=4096, profile=PROFILES["deepspeed"])
    assert meg["gradients"][0] == pytest.approx(4.0 * spec.total_params)
    assert meg["gradients"][0] == pytest.approx(2 * ds["gradients"][0])


def test_fp32_training_keeps_its_own_bytes_on_every_stack() -> None:
    spec = load_model("llama-3.1-8b")
    lay = LayoutTable.from_layouts([Layout(dp=1, zero=0, grad_accum=1, precision="fp32")])
    for prof in PROFILES.values():
        mem = memory_breakdown(spec, lay, seq_len=1024, profile=prof)
        state = mem["weights"][0] + mem["gradients"][0] + mem["optimizer"][0]
        assert state == pytest.approx(16.0 * spec.total_params)  # 4 + 4 + 8 (AdamW moments)


def test_allocated_reserved_and_footprint() -> None:
    spec = load_model("llama-3.1-8b")
    lay = LayoutTable.from_layouts([Layout(tp=2, dp=4, zero=1, sp=True, grad_accum=4)])
    mem = memory_breakdown(spec, lay, seq_len=4096, fragmentation=0.1)
    alloc = sum(mem[k] for k in ALLOCATED_COMPONENTS)
    assert mem["allocated"][0] == pytest.approx(alloc[0])
    assert mem["reserved"][0] == pytest.approx(mem["allocated"][0] + 0.1 * mem["activations"][0])
    assert mem["total"][0] == pytest.approx(
        mem["reserved"][0] + mem["comm_buffers"][0] + mem["framework_reserve"][0]
    )


KW = dict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, seq_len=4096, global_batch=64)


def test_headroom_decides_fits_and_the_reason_states_both_numbers() -> None:
    assert Job.from_flat(**KW).memory_headroom == DEFAULT_MEMORY_HEADROOM == 0.05
    lay = dict(tp=2, dp=4, zero=1, micro_batch=1)
    p = predict(**KW, **lay, memory_headroom=0.0)
    assert p.memory_allocated_gib < p.memory_reserved_gib < p.memory_gib_per_device
    frac = p.memory_gib_per_device / p.memory_capacity_gib
    assert frac < 1.0  # fits with no headroom ...
    tight = predict(**KW, **lay, memory_headroom=round(1.0 - frac + 0.01, 4))
    assert p.fits and not tight.fits  # ... not with a headroom larger than what is left
    (oom,) = [r for r in tight.reasons if r.code == "out_of_memory"]
    assert "allocated" in oom.message and "reserved" in oom.message and "limit" in oom.message
    assert oom.values["limit_gib"] == pytest.approx(tight.memory_limit_gib, abs=0.01)
    d = tight.to_dict()
    assert {"memory_allocated_gib", "memory_reserved_gib", "memory_limit_gib"} <= set(d)
    assert d["job"]["memory_headroom"] == tight.job["memory_headroom"]


def test_assumptions_say_what_is_per_stack_and_what_is_megatron() -> None:
    assert Job.from_flat(**KW).assumptions == []
    (a,) = Job.from_flat(**KW, framework="torchtitan").assumptions
    assert "memory and the stack's time settings from the torchtitan profile" in a
    assert "flash attention, 99 kernels per layer" in a and "TP comm overlap off" in a
    assert "still costed with the calibrated Megatron-Core" in a
    (d,) = Job.from_flat(**KW, framework="megatron-deepspeed").assumptions
    assert "unfused attention" in d


def test_stack_changes_memory_and_attention_time() -> None:
    lay = dict(tp=1, dp=8, zero=3, micro_batch=1)
    meg = predict(**KW, **lay, framework="megatron")
    ds = predict(**KW, **lay, framework="deepspeed")
    # DeepSpeed's unfused s x s core is slower than flash; the GEMMs are the same.
    assert ds.time_breakdown["attention"] > 2 * meg.time_breakdown["attention"]
    assert ds.time_breakdown["gemm"] == meg.time_breakdown["gemm"]
    assert meg.memory_breakdown["gradients"] == pytest.approx(2 * ds.memory_breakdown["gradients"])


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "studies"))


@pytest.mark.parametrize(
    ("orig", "framework"),
    [
        ("Megatron-LM v0.12.0rc3, TE release_v2.1", "megatron"),
        ("NeMo 24.07 (Megatron-Core)", "megatron"),
        ("Megatron-Bridge / NeMo 26.08", "megatron"),
        ("MosaicML Composer/llm-foundry (PyTorch FSDP)", "fsdp"),
        ("torchtitan (FSDP2, 2024)", "torchtitan"),
        ("DeepSpeed ZeRO-3 (no model parallelism)", "deepspeed"),
        ("Megatron-DeepSpeed", "megatron-deepspeed"),
        ("", "megatron"),
    ],
)
def test_published_row_framework_mapping(orig: str, framework: str) -> None:
    import published as P

    case = P.Case(row={"orig_framework": orig}, run_id="x")
    assert P.framework_of(case) == framework
    assert any(a.startswith(f"framework={framework}") for a in case.assumptions)


def test_published_memory_basis() -> None:
    import published as P

    row = {"targets_derived": "step_time_s=x; memory_gib_per_device=simumax_pred_peak_alloc_gib/(1+err)"}
    assert P.memory_basis(row, "reserved") == "allocated"
    assert P.memory_basis({"normalization_notes": "max reserved"}, "allocated") == "reserved"
    assert P.memory_basis({}, "reserved") == "reserved"


def test_gradient_reduce_dtype_per_stack() -> None:
    """Megatron reduces bf16 training's gradients in fp32 (Megatron-LM turns on
    accumulate_allreduce_grads_in_fp32 for bf16) and fp16 training's in fp16; llm-foundry's FSDP
    (mixed_precision PURE) in bf16. With ZeRO-1 over dp16 the step's communication is the gradient
    reduce-scatter plus the 16-bit parameter all-gather: equal bytes in 16 bits, the reduce-scatter
    doubled in fp32."""

    def comm(precision: str, framework: str) -> float:
        return predict(
            model="llama-3.1-8b",
            device="h100-sxm-80gb",
            num_devices=16,
            seq_len=4096,
            global_batch=16,
            precision=precision,
            framework=framework,
        ).comm_total_s

    half = comm("bf16", "fsdp")  # reduce-scatter + all-gather, both 16-bit
    assert comm("fp16", "megatron") == pytest.approx(half)
    assert comm("bf16", "megatron") == pytest.approx(1.5 * half, rel=0.01)  # RS doubled, AG not
    assert PROFILES["torchtitan"].grad_reduce_fp32 and not PROFILES["deepspeed"].grad_reduce_fp32
