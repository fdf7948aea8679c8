"""Routing arithmetic of autopar.moe against hand derivations, and MoE plausibility checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autopar import moe, predict
from autopar.errors import LayoutError
from autopar.layout import resolve_layout
from autopar.model import load_model

DSV3 = dict(
    model="deepseek-v3",
    device="h800-sxm-80gb",
    num_devices=2048,
    seq_len=4096,
    global_batch=15360,
    tp=1,
    pp=16,
    ep=64,
    zero=1,
)


class _M:  # a MoE shape small enough to count by hand
    hidden = 1024
    num_experts = 64
    moe_topk = 4
    moe_ffn_hidden = 512
    gated_mlp = True
    moe_dim = 1024  # no latent projection: the experts read hidden-wide rows


# (tp, etp, ep, sp, tokens per local expert GEMM per rank), T = 4096 tokens per micro-batch per rank.
# Derivation: each rank routes its SP share T/sp (sp = tp with SP, 1 without) and makes k copies;
# an EP group of ep ranks spreads ep*(T/sp)*k copies over E experts, so each expert gets
# ep*(T/sp)*k/E from its EP group, and the ETP all-gather adds the copies of the etp EP groups that
# hold the same experts: (T/sp) * k * ep * etp / E.
GOLDEN = [
    (1, 1, 1, 1, 4096 * 4 * 1 * 1 / 64),  # 256: no parallelism, k/E of the tokens
    (1, 1, 8, 1, 4096 * 4 * 8 / 64),  # 2048: 8 ranks' copies meet on 8 experts per rank
    (2, 2, 8, 2, 2048 * 4 * 8 * 2 / 64),  # 2048: SP halves the routed tokens, ETP gathers 2 back
    (2, 1, 8, 2, 2048 * 4 * 8 / 64),  # 1024: etp=1, each TP rank's SP share stays its own
    (4, 1, 16, 4, 1024 * 4 * 16 / 64),  # 1024
    (4, 4, 4, 4, 1024 * 4 * 4 * 4 / 64),  # 1024
    (2, 2, 1, 1, 4096 * 4 * 1 * 2 / 64),  # 512: without SP every TP rank routes all T (redundant)
]


@pytest.mark.parametrize(("tp", "etp", "ep", "sp", "want"), GOLDEN)
def test_tokens_per_expert_by_hand(tp, etp, ep, sp, want) -> None:
    got = moe.tokens_per_expert(_M, 4096.0, sp, ep, etp)
    assert float(got) == pytest.approx(want)
    # Expert FLOPs per rank: E/ep local experts x rows x width F/etp = (T/sp)*k*F tokens' worth,
    # i.e. with SP the tp*cp*dp ranks of a stage split the routed work evenly whatever ep, etp are.
    work = _M.num_experts / ep * float(got) * _M.moe_ffn_hidden / etp
    assert work == pytest.approx(4096 / sp * _M.moe_topk * _M.moe_ffn_hidden)


def test_dispatch_and_permutation_bytes_by_hand() -> None:
    # tp=2 with SP: 2048 routed tokens x k=4 copies x h=1024 x 2 bytes per dispatch.
    assert float(moe.dispatch_bytes(_M, 4096.0, 2, 2.0)) == 2048 * 4 * 1024 * 2
    # Fused permute (read 2048, write 8192 rows) + combine (read 8192, write 2048) = 2*(2048+8192),
    # plus the sort by local expert and back on 8192*etp rows (read+write each): 4*8192*2.
    rows = 2 * (2048 + 8192) + 4 * 8192 * 2
    assert float(moe.permutation_bytes(_M, 4096.0, 2, 8, 2, 2.0)) == rows * 1024 * 2
    # One local expert (ep = E): no sort.
    assert float(moe.permutation_bytes(_M, 4096.0, 2, 64, 2, 2.0)) == 2 * (2048 + 8192) * 1024 * 2


def test_deepep_internode_share_by_hand() -> None:
    # DeepSeek-V3's shape without its group limit: 256 experts, top-8, EP64 over 8 nodes of 8 GPUs ->
    # 32 experts per node; a token reaches 8 (1 - miss) ~ 5.3 of the 8 nodes with its 8 copies.
    free = load_model("deepseek-v3").model_copy(update={"moe_router_groups": 1, "moe_router_topk_groups": 0})
    miss = math.comb(256 - 32, 8) / math.comb(256, 8)
    want = 8 * (1 - miss) / 8
    assert float(moe.deepep_internode_share(free, 64, 1, 8)) == pytest.approx(want)
    assert 0.6 < want < 0.7
    # One node: nothing leaves it; the share is defined as 1 (no de-duplication to claim).
    assert float(moe.deepep_internode_share(free, 8, 1, 8)) == pytest.approx(1.0)


def test_group_limited_routing_reaches_fewer_nodes() -> None:
    # DeepSeek-V3 routes a token to at most topk_group = 4 of its n_group = 8 expert groups (its
    # report's node-limited routing, M = 4): read from the config.
    m = load_model("deepseek-v3")
    assert (m.moe_router_groups, m.moe_router_topk_groups) == (8, 4)
    # 8 nodes, one group each: exactly 4 nodes per token (free routing: 5.3), so DeepEP's network
    # bytes are 4 / 8 of the all-to-all's.
    assert float(moe.group_limited_nodes(m, np.array([8.0]))[0]) == pytest.approx(4.0)
    assert float(moe.deepep_internode_share(m, 64, 1, 8)) == pytest.approx(0.5)
    # 4 nodes, two groups each: the 4 chosen groups miss a node with probability C(6,4)/C(8,4).
    want = 4 * (1 - math.comb(6, 4) / math.comb(8, 4))
    assert float(moe.group_limited_nodes(m, np.array([4.0]))[0]) == pytest.approx(want)
    # 16 nodes, a group spans 2: 8 experts from the 4 groups' 128 experts on their 8 nodes.
    want16 = 8 * (1 - math.comb(128 - 16, 8) / math.comb(128, 8))
    assert float(moe.group_limited_nodes(m, np.array([16.0]))[0]) == pytest.approx(want16)
    # Groups that do not tile the nodes (9) and models without a limit: free routing.
    assert np.isinf(moe.group_limited_nodes(m, np.array([9.0]))[0])
    q = load_model("qwen3-235b-a22b")
    assert (q.moe_router_groups, q.moe_router_topk_groups) == (1, 0)
    assert np.isinf(moe.group_limited_nodes(q, np.array([8.0]))[0])
    # The limit never raises the share above free routing's.
    for n in (2.0, 4.0, 8.0, 16.0):
        free = float(moe.distinct_share(m, np.array([n]))[0])
        assert float(moe.deepep_internode_share(m, n * 8, 1, 8)) <= free + 1e-12


def test_greedy_routing_ignores_the_groups() -> None:
    # DeepSeek-V2-Lite states n_group but routes greedily (topk_method greedy): no limit.
    from autopar.model import raw_config

    cfg = dict(raw_config("deepseek-v3"))
    cfg.update(topk_method="greedy")
    assert load_model(cfg).moe_router_groups == 1
    cfg.update(topk_method="noaux_tc")
    assert load_model(cfg).moe_router_groups == 8


def test_deepep_intranode_share_by_hand() -> None:
    # Qwen3-30B-A3B shape: 128 experts, top-8, EP8 -> 16 experts per rank. A token misses a rank with
    # probability C(112, 8) / C(128, 8) and so reaches 8 (1 - miss) ~ 5.3 ranks: DeepEP / HybridEP send
    # it once to each, the all-to-all dispatcher sends 8 copies.
    m = load_model("qwen3-30b-a3b")
    miss = math.comb(128 - 16, 8) / math.comb(128, 8)
    want = 8 * (1 - miss) / 8
    assert float(moe.deepep_intranode_share(m, 8)) == pytest.approx(want)
    assert 0.6 < want < 0.7
    # One expert per rank (ep = E): every copy goes to a different rank, nothing to de-duplicate.
    assert float(moe.deepep_intranode_share(m, 128)) == pytest.approx(1.0)


def test_deepep_sends_fewer_bytes_inside_the_node() -> None:
    kw = dict(
        model="qwen3-30b-a3b",
        device="gb200-nvl72",
        num_devices=8,
        seq_len=4096,
        global_batch=64,
        ep=8,
        micro_batch=4,
    )
    a2a = predict(**kw).time_breakdown["ep_comm"]
    dedup = predict(**kw, moe_dispatcher="deepep").time_breakdown["ep_comm"]
    m = load_model("qwen3-30b-a3b")
    share = float(moe.deepep_intranode_share(m, 8))
    # Same latency terms, bytes scaled by the share: the bandwidth part shrinks by exactly that.
    assert dedup < a2a
    assert dedup == pytest.approx(a2a * share, rel=0.05)


def test_paired_fraction() -> None:
    assert float(moe.paired_fraction(1, 8)) == pytest.approx(7 / 8)
    assert float(moe.paired_fraction(16, 120)) == pytest.approx(104 / 120)
    assert float(moe.paired_fraction(4, 4)) == 0.0


def test_etp_defaults_to_tp_as_megatron_core() -> None:
    # ModelParallelConfig: expert_tensor_parallel_size None -> tensor_model_parallel_size, with EP too.
    lay = resolve_layout(num_devices=16, global_batch=16, tp=2, ep=4)
    assert lay.etp == 2 and lay.expert_dp == 2
    assert resolve_layout(num_devices=16, global_batch=16, tp=2, ep=8, etp=1).etp == 1


def test_moe_with_tp_needs_sp() -> None:
    with pytest.raises(LayoutError, match="sequence parallelism"):
        predict(
            model="mixtral-8x7b", device="h100-sxm-80gb", num_devices=8, seq_len=4096,
            global_batch=8, tp=2, ep=4, sp=False,
        )  # fmt: skip


def test_expert_state_sharded_over_whole_expert_dp_group() -> None:
    # tp=4, ep=2, etp=1 on 16 ranks: expert-DP = 4*1*4/(2*1) = 8 > dp*cp = 4 (Megatron shards the
    # distributed optimizer's expert state over the expert-DP group, not the dense DP group).
    lay = resolve_layout(num_devices=16, global_batch=16, tp=4, ep=2, etp=1)
    assert lay.expert_dp == 8 and lay.expert_shard == 8


def test_deepseek_v3_overlap_and_deepep_shrink_the_all_to_all() -> None:
    base = predict(**DSV3)
    over = predict(**DSV3, moe_a2a_overlap=True)
    deep = predict(**DSV3, moe_a2a_overlap=True, moe_dispatcher="deepep")
    ep0, ep1, ep2 = (p.time_breakdown["ep_comm"] for p in (base, over, deep))
    assert ep2 < ep1 < ep0
    # Hidden all-to-all is bounded by the compute it hides behind: the step never drops below
    # the compute alone, and the exposed communication shrinks with overlap.
    for p in (over, deep):
        compute = sum(p.time_breakdown[k] for k in ("gemm", "attention", "elementwise"))
        assert p.step_time_s > compute
    assert over.exposed_comm_fraction < base.exposed_comm_fraction
    # Balanced EP64 over 8 nodes: 7/8 of the copies leave the node, so all-to-all dominates the
    # communication without overlap; with DeepEP + overlap it is below the no-overlap share.
    share = [p.time_breakdown["ep_comm"] / p.step_time_s for p in (base, deep)]
    assert share[1] < share[0]


def test_overlap_changes_nothing_for_dense_models() -> None:
    kw = dict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, seq_len=4096, global_batch=32)
    a, b = predict(**kw), predict(**kw, moe_a2a_overlap=True, moe_dispatcher="deepep")
    assert a.step_time_s == b.step_time_s
    assert np.isclose(a.time_breakdown["ep_comm"], 0.0)


QWEN3_30B_GB200 = dict(
    model="qwen3-30b-a3b",
    device="gb200-nvl72",
    num_devices=8,
    seq_len=4096,
    global_batch=512,
    ep=8,
    micro_batch=4,
    precision="mxfp8",
    moe_dispatcher="deepep",
)


def test_fused_graph_drops_host_waits_and_the_routed_experts_elementwise_work() -> None:
    # Megatron-Bridge's full-iteration MXFP8 recipe for Qwen3-30B-A3B on 8 GB200 (26.06+): 16 local
    # experts per rank, so the eager run waits on the host for their per-expert launches.
    eager = predict(**QWEN3_30B_GB200)
    graphed = predict(**QWEN3_30B_GB200, moe_fused_graph=True)
    assert graphed.step_time_s < eager.step_time_s
    # Only launch waits, launch gaps and the routed experts' activation/cast traffic go: the GEMMs,
    # the attention cores and the all-to-all are priced as before.
    for part in ("gemm", "attention", "ep_comm"):
        assert np.isclose(graphed.time_breakdown[part], eager.time_breakdown[part])
    assert graphed.time_breakdown["elementwise"] < eager.time_breakdown["elementwise"]
    # What is left of the elementwise work is real memory traffic (norms, residuals, permutations).
    assert graphed.time_breakdown["elementwise"] > 0.0


def test_fused_graph_changes_nothing_for_dense_models() -> None:
    kw = dict(model="llama-3.1-8b", device="h100-sxm-80gb", num_devices=8, seq_len=4096, global_batch=32)
    assert predict(**kw).step_time_s == predict(**kw, moe_fused_graph=True).step_time_s


def test_fused_graph_is_refused_by_every_launcher_but_env() -> None:
    from autopar.export import EXPORTERS, ExportError, Job, export, parse
    from autopar.layout import resolve_layout

    lay = resolve_layout(num_devices=8, global_batch=512, ep=8, micro_batch=4, precision="bf16")
    job = Job(model="qwen3-30b-a3b", num_devices=8, seq_len=4096, global_batch=512, moe_fused_graph=True)
    for name, ex in EXPORTERS.items():
        if ex.serving or name == "env":
            continue
        with pytest.raises(ExportError, match="moe_fused_graph"):
            export(lay, name, job)
    lay2, job2 = parse(export(lay, "env", job), "env")
    assert job2.moe_fused_graph and lay2 == lay


def test_the_study_reads_the_bridge_full_iteration_recipes_by_release() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "studies"))
    from published import Case, container_release, fused_graph_of

    def case(release: str, **row) -> Case:
        base = {"orig_framework": f"Megatron-Bridge / NeMo {release}", "model": "Qwen3_30B_a3B"}
        return Case(row=base | {"device": "gb200-nvl72", "precision": "mxfp8"} | row, run_id="t")

    assert container_release(case("26.04.01").row) == (26, 4, 1)
    assert container_release({"orig_framework": "NeMo 24.07"}) is None
    # The same recipe: eager in 26.04.01, the full-iteration graph from 26.06 (v0.5.0's configs).
    assert not fused_graph_of(case("26.04.01"))
    assert fused_graph_of(case("26.06")) and fused_graph_of(case("26.08"))
    assert fused_graph_of(case("26.08", model="DeepSeekV3", device="gb300-nvl72"))
    # Not in the recipes at v0.6.0: bf16, B200, Nemotron 3 Super.
    assert not fused_graph_of(case("26.08", precision="bf16"))
    assert not fused_graph_of(case("26.08", device="b200"))
    assert not fused_graph_of(case("26.08", model="Nemotron_3_Super"))


def test_fused_graph_prediction_says_so() -> None:
    p = predict(**QWEN3_30B_GB200, moe_fused_graph=True)
    assert any("--moe-fused-graph" in a for a in p.assumptions)
    assert not any("--moe-fused-graph" in a for a in predict(**QWEN3_30B_GB200).assumptions)


def test_recommend_refuses_a_fused_graph_job_its_launcher_cannot_write_before_searching() -> None:
    import subprocess
    import sys

    args = ["recommend", "--model", "qwen3-30b-a3b", "--device", "gb200-nvl72", "--num-devices", "8",
            "--seq-len", "4096", "--global-batch", "512", "--moe-fused-graph"]  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "autopar.cli", *args], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "--moe-fused-graph cannot be launched by megatron" in r.stderr
