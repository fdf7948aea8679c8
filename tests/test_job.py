"""The one job declaration: both API spellings, the framework assumption, derived sizes."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.errors import AutoparError
from autopar.job import ClusterSpec, Job, TrainingWorkload
from autopar.layout import Layout, LayoutTable, ParallelDims, resolve_layout
from autopar.prediction import predict

FLAT = dict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=16, seq_len=4096, global_batch=64)


def test_flat_keywords_and_job_build_the_same_prediction() -> None:
    job = Job(
        model="llama-3.1-8b",
        cluster=ClusterSpec(device="h100-sxm-80gb", num_devices=16),
        workload=TrainingWorkload(seq_len=4096, global_batch=64),
    )
    assert Job.from_flat(**FLAT) == job and Job.from_flat(**job.flat()) == job
    a = predict(**FLAT, tp=2, pp=2)
    b = predict(job=job, layout=resolve_layout(num_devices=16, global_batch=64, tp=2, pp=2))
    assert a.to_dict() == b.to_dict() and a.to_dict()["job"]["schema_version"] == 1
    with pytest.raises(AutoparError, match="not both"):
        predict(job=job, seq_len=8)


def test_non_megatron_framework_is_recorded_with_its_assumption() -> None:
    d = predict(**FLAT, framework="torchtitan", tp=2).to_dict()
    assert d["job"]["framework"] == "torchtitan"
    assert len(d["assumptions"]) == 1 and "Megatron-Core" in d["assumptions"][0]
    assert Job.from_flat(**FLAT, framework="fsdp").export_format == "accelerate"
    with pytest.raises(AutoparError, match="framework"):
        Job.from_flat(**FLAT, framework="jax")
    with pytest.raises(AutoparError, match="num_devices"):
        Job.from_flat(**{**FLAT, "num_devices": 0})


def test_derived_sizes_are_the_same_on_a_layout_and_on_a_table() -> None:
    lays = [
        Layout(tp=2, dp=8, ep=4, etp=1, sp=True, zero=1, grad_accum=4),
        Layout(tp=4, pp=2, dp=2, cp=2, ep=2, etp=4, shard_group=2, zero=3),
        Layout(dp=1, zero=0),
    ]
    dims = ParallelDims(LayoutTable.from_layouts(lays).cols)

    class M:
        layers = 30

    for i, lay in enumerate(lays):
        assert lay.shard_size == dims.shard_size[i] == (lay.shard_group or lay.dp * lay.cp)
        assert lay.expert_dp == dims.expert_dp[i] == lay.tp * lay.cp * lay.dp // (lay.ep * lay.etp)
        assert lay.expert_shard == min(lay.shard_size, lay.expert_dp) == dims.expert_shard[i]
        assert lay.sp_divisor == (lay.tp if lay.sp else 1) == dims.sp_divisor[i]
        assert lay.layers_per_stage(M) == -(-30 // lay.pp) == dims.layers_per_stage(M)[i]
    assert list(dims.process_groups) == [3, 5, 0]
    assert np.all(Layout().zero == resolve_layout(num_devices=1, global_batch=1).zero == 1)
