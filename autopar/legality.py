"""Which layouts are legal for a model, cluster and workload: vectorized rules with reasons.

Each rule is a boolean mask over a :class:`LayoutTable` plus a code and a sentence; rules follow
the launchers' own validation (Megatron-LM ``validate_args``, torchtitan ``ParallelDims``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autopar.layout import PRECISION_CODES, LayoutTable, ParallelDims, Reason
from autopar.precision import REQUIRES
from autopar.schedules import schedule_problem, schedule_unfit


@dataclass(frozen=True)
class Rule:
    code: str
    message: str
    violated: Callable[..., np.ndarray]  # (model, lay, ctx) -> bool mask of violating rows
    values: tuple[str, ...] = ()
    # (lay, ctx, row) -> the row's own sentence, when the fixed message cannot name the culprit
    explain: Callable[..., str] | None = None


@dataclass(frozen=True)
class Context:
    num_devices: int
    seq_len: int
    global_batch: int
    # The device's tensor-core precisions (``DeviceProfile.peak_tflops`` keys) and its name.
    device_peaks: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8", "fp4")
    device: str = "the device"
    pipeline_schedule: str = "1f1b"

    @classmethod
    def for_job(cls, job) -> Context:
        """The context of a :class:`autopar.job.TrainingJob`."""
        dev = job.device
        return cls(
            job.num_devices,
            job.seq_len,
            job.global_batch,
            tuple(sorted(dev.peak_tflops)),
            dev.id,
            job.pipeline_schedule,
        )


def unsupported_precisions(peaks) -> list[str]:
    """Layout precisions whose GEMMs need a tensor-core peak the device lacks (``precision.REQUIRES``)."""
    return [p for p in PRECISION_CODES if any(k not in peaks for k in REQUIRES.get(p, ()))]


def _precision_unsupported(m, L, c: Context) -> np.ndarray:
    bad = [PRECISION_CODES.index(p) for p in unsupported_precisions(c.device_peaks)]
    return np.isin(L["precision"], bad)


def _precision_reason(lay, c: Context, i: int) -> str:
    p = PRECISION_CODES[int(lay["precision"][i])]
    need = " and ".join(REQUIRES[p])
    has = ", ".join(sorted(c.device_peaks))
    return f"precision {p} needs {need} tensor cores; {c.device} has {has} peaks only"


def stage_split_problems(model, L) -> tuple[np.ndarray, np.ndarray]:
    """(bad declared split, bad interleaving) masks, per Megatron-Core's checks of uneven pipelines.

    Megatron-Core (``TransformerConfig.__post_init__`` and ``get_num_layers_to_build``, mcore 0.16):
    ``num_layers_in_first/last_pipeline_stage`` (``--decoder-first/last-pipeline-num-layers``) must
    be > 0 and leave layers that split evenly over the middle stages (none when pp = 2 and both are
    given). With interleaving, either every declared end count and the middle stages' count are
    divisible by vpp, or the ends hold one layer less than a middle stage and the split is the
    ``--account-for-embedding-in-pipeline-split``/``--account-for-loss-in-pipeline-split`` one
    ((L + ends) divisible by pp, per-rank count divisible by vpp; the first/last model chunk builds
    one layer less). Undeclared ends: the interleaved schedule needs L divisible by pp*vpp.
    """
    layers = int(model.layers)
    pp, vpp = L["pp"], L["vpp"]
    f, last = L["first_stage_layers"], L["last_stage_layers"]
    declared = (f > 0) | (last > 0)
    ends = (f > 0).astype(np.int64) + (last > 0)
    rest = pp - ends
    left = layers - f - last
    mid = np.where(rest > 0, left // np.maximum(rest, 1), 0)
    bad_split = declared & (
        (pp < 2) | np.where(rest > 0, (left < rest) | (left % np.maximum(rest, 1) != 0), left != 0)
    )
    v = np.maximum(vpp, 1)
    divisible = ((f % v) == 0) & ((last % v) == 0) & np.where(rest > 0, mid % v == 0, True)
    account_for = (
        (rest > 0) & ((f == 0) | (f == mid - 1)) & ((last == 0) | (last == mid - 1)) & (mid % v == 0)
    )
    bad_vpp = (vpp > 1) & np.where(declared, ~(divisible | account_for), layers % (pp * v) != 0)
    return bad_split, bad_vpp


def _schedule_unfit(m, L, c: Context) -> np.ndarray:
    """Layouts the job's pipeline schedule cannot run (``autopar.schedules.REQUIREMENTS``)."""
    return schedule_unfit(c.pipeline_schedule, L["pp"], L["vpp"], L["grad_accum"])


def _schedule_reason(lay, c: Context, i: int) -> str:
    why = schedule_problem(
        c.pipeline_schedule, int(lay["pp"][i]), int(lay["vpp"][i]), int(lay["grad_accum"][i])
    )
    return why or f"pipeline schedule {c.pipeline_schedule} cannot run this layout"


def _mixer_units(model) -> int:
    """What TP splits the recurrent mixers over (gcd of the counts that must divide; 0 if none)."""
    units = 0
    if model.linear_attn_layers:
        units = math.gcd(units, model.linear_k_heads, model.linear_v_heads)
    if model.mamba_layers:
        if model.mamba_version == 2:
            units = math.gcd(units, model.mamba_heads, model.mamba_groups)
        else:
            units = math.gcd(units, model.mamba_inner)
    return units


def _rules() -> list[Rule]:
    def kv_heads(model) -> int:  # every layer's KV heads (MLA: its heads)
        return model.tp_head_units[1]

    return [
        Rule(
            "world_size",
            "tp*pp*cp*dp must equal num_devices",
            lambda m, L, c: L["tp"] * L["pp"] * L["cp"] * L["dp"] != c.num_devices,
            ("tp", "pp", "cp", "dp"),
        ),
        Rule(
            "batch",
            "micro_batch*grad_accum*dp must equal global_batch",
            lambda m, L, c: L["micro_batch"] * L["grad_accum"] * L["dp"] != c.global_batch,
            ("micro_batch", "grad_accum", "dp"),
        ),
        Rule(
            "tp_heads",
            "tp must divide the attention heads (of every layer)",
            lambda m, L, c: m.tp_head_units[0] % L["tp"] != 0,
            ("tp",),
        ),
        Rule(
            "tp_kv_heads",
            "tp must divide the KV heads (query groups)",
            lambda m, L, c: kv_heads(m) % L["tp"] != 0,
            ("tp",),
        ),
        Rule(
            "tp_hidden",
            "tp must divide the hidden and FFN sizes",
            lambda m, L, c: (m.hidden % L["tp"] != 0) | ((m.ffn_hidden or 0) % L["tp"] != 0),
            ("tp",),
        ),
        Rule(
            "tp_mixer_heads",
            "tp must divide the heads of the Mamba / Gated DeltaNet mixers (Megatron MambaMixer: "
            "Mamba2 heads and B/C groups; Gated DeltaNet key heads; Mamba1 d_inner)",
            lambda m, L, c: _mixer_units(m) % L["tp"] != 0,
            ("tp",),
        ),
        Rule(
            "cp_recurrent",
            "context parallelism (ring attention over sequence chunks) is not modeled for Mamba / Gated "
            "DeltaNet blocks: their recurrence carries a state from one chunk of the sequence to the "
            "next, which the ring CP model does not split; use cp = 1",
            lambda m, L, c: (L["cp"] > 1) & bool(m.mamba_layers or m.linear_attn_layers),
            ("cp",),
        ),
        Rule(
            "encdec_split",
            "pipeline and context parallelism are not modeled for an encoder-decoder model: a stage "
            "or sequence split would carry the encoder output to every decoder stage or CP rank for "
            "its cross-attention, which autopar does not cost; use pp = 1 and cp = 1",
            lambda m, L, c: ((L["pp"] > 1) | (L["cp"] > 1)) & (m.arch == "encoder_decoder"),
            ("pp", "cp"),
        ),
        Rule(
            "tp_encoder_heads",
            "tp must divide the encoder stack's attention heads and FFN size",
            lambda m, L, c: (m.encoder_heads % L["tp"] != 0) | (m.encoder_ffn_hidden % L["tp"] != 0),
            ("tp",),
        ),
        Rule(
            "pp_layers",
            "pp*vpp must not exceed the number of layers (plus the declared end stages, whose "
            "first/last model chunk may hold only the embedding/loss)",
            lambda m, L, c: (
                L["pp"] * L["vpp"] > m.layers + (L["first_stage_layers"] > 0) + (L["last_stage_layers"] > 0)
            ),
            ("pp", "vpp"),
        ),
        Rule(
            "vpp_needs_pp",
            "virtual pipeline stages need pp > 1",
            lambda m, L, c: (L["vpp"] > 1) & (L["pp"] == 1),
            ("vpp", "pp"),
        ),
        Rule(
            "stage_layers",
            "first/last stage layers must be >= 1, need pp >= 2, and leave layers that split evenly "
            "over the middle stages (Megatron --decoder-first/last-pipeline-num-layers)",
            lambda m, L, c: stage_split_problems(m, L)[0],
            ("pp", "first_stage_layers", "last_stage_layers"),
        ),
        Rule(
            "vpp_layers",
            "the interleaved schedule needs equal model chunks: layers divisible by pp*vpp, or with "
            "declared first/last stage layers, the middle stages' layers divisible by vpp and the end "
            "stages' either divisible by vpp or one less than a middle stage (Megatron's "
            "account-for-embedding/loss split)",
            lambda m, L, c: stage_split_problems(m, L)[1],
            ("pp", "vpp", "first_stage_layers", "last_stage_layers"),
        ),
        Rule(
            "vpp_microbatches",
            "the interleaved schedule needs at least pp micro-batches per step",
            lambda m, L, c: (L["vpp"] > 1) & (L["grad_accum"] < L["pp"]),
            ("vpp", "grad_accum", "pp"),
        ),
        Rule(
            "sp_needs_tp",
            "sequence parallelism needs tp > 1",
            lambda m, L, c: (L["sp"] > 0) & (L["tp"] == 1),
            ("sp", "tp"),
        ),
        Rule(
            "cp_seq",
            "context parallelism needs seq_len divisible by 2*cp (load-balanced chunks)",
            lambda m, L, c: (L["cp"] > 1) & (c.seq_len % (2 * L["cp"]) != 0),
            ("cp",),
        ),
        Rule(
            "ep_dense",
            "expert parallelism needs a MoE model",
            lambda m, L, c: (L["ep"] > 1) & (not m.is_moe),
            ("ep",),
        ),
        Rule(
            "ep_experts",
            "ep must divide the number of experts",
            lambda m, L, c: (m.num_experts or 1) % L["ep"] != 0,
            ("ep",),
        ),
        Rule(
            "moe_sp",
            "a MoE model with tp > 1 needs sequence parallelism (Megatron-Core's MoELayer raises "
            "without it in training)",
            lambda m, L, c: bool(m.is_moe) & (L["tp"] > 1) & (L["sp"] == 0),
            ("tp", "sp"),
        ),
        Rule(
            "ep_ranks",
            "ep*etp must divide tp*cp*dp (experts are carved out of the same ranks)",
            lambda m, L, c: ParallelDims(L).expert_dp % 1 != 0,
            ("ep", "etp"),
        ),
        Rule(
            "shard_group",
            "shard_group must divide dp*cp and needs zero >= 1",
            lambda m, L, c: (
                (L["shard_group"] > 0)
                & (((L["dp"] * L["cp"]) % np.maximum(L["shard_group"], 1) != 0) | (L["zero"] == 0))
            ),
            ("shard_group", "zero"),
        ),
        Rule(
            "offload_needs_zero",
            "optimizer offload needs zero >= 1",
            lambda m, L, c: (L["offload"] > 0) & (L["zero"] == 0),
            ("offload", "zero"),
        ),
        Rule(
            "precision_unsupported",
            "the device has no tensor cores for the layout's precision",
            _precision_unsupported,
            ("precision",),
            _precision_reason,
        ),
        Rule(
            "pipeline_schedule",
            "the job's pipeline schedule cannot run this pipeline (pp, vpp, grad_accum)",
            _schedule_unfit,
            ("pp", "vpp", "grad_accum"),
            _schedule_reason,
        ),
    ]


RULES = _rules()


def legality_mask(model, lay: LayoutTable, ctx: Context) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(legal mask, {rule code: violating mask}) for every layout."""
    bad: dict[str, np.ndarray] = {}
    legal = np.ones(len(lay), dtype=bool)
    for rule in RULES:
        v = np.broadcast_to(np.asarray(rule.violated(model, lay, ctx), dtype=bool), legal.shape)
        if v.any():
            bad[rule.code] = v
            legal &= ~v
    return legal, bad


def reasons_for_row(model, lay: LayoutTable, ctx: Context, i: int) -> list[Reason]:
    """The structured reasons why row ``i`` is illegal (empty when legal)."""
    out = []
    for rule in RULES:
        v = np.broadcast_to(np.asarray(rule.violated(model, lay, ctx), dtype=bool), (len(lay),))
        if v[i]:
            values = {k: int(lay[k][i]) for k in rule.values}
            message = rule.explain(lay, ctx, i) if rule.explain else rule.message
            out.append(Reason(rule.code, message, values, _allowed(rule.code, model, lay, ctx, i)))
    return out


def _allowed(code: str, model, lay: LayoutTable, ctx: Context, i: int):
    from autopar.layout import divisors

    if code == "tp_mixer_heads":
        return divisors(_mixer_units(model))
    if code == "cp_recurrent":
        return [1]
    if code == "encdec_split":
        return {"pp": [1], "cp": [1]}
    if code == "tp_encoder_heads":
        return [d for d in divisors(int(model.encoder_heads)) if model.encoder_ffn_hidden % d == 0]
    if code in ("tp_heads", "tp_kv_heads", "tp_hidden"):
        heads, kv = model.tp_head_units
        return [
            d
            for d in divisors(np.gcd(heads, kv))
            if model.hidden % d == 0 and (model.ffn_hidden or 0) % d == 0
        ]
    if code == "ep_experts":
        return divisors(model.num_experts) if model.num_experts else [1]
    if code == "cp_seq":
        return divisors(ctx.seq_len // 2)
    if code in ("stage_layers", "vpp_layers"):
        # Equal end counts that make the row legal with its pp and vpp (0: the even split).
        from autopar.layout import LayoutTable

        pp, vpp = int(lay["pp"][i]), int(lay["vpp"][i])
        cand = np.arange(0, model.layers + 1)
        trial = LayoutTable(
            {
                **{k: np.repeat(lay[k][i], len(cand)) for k in lay.cols},
                "first_stage_layers": cand,
                "last_stage_layers": cand,
            }
        )
        split, inter = stage_split_problems(model, trial.cols)
        ok = cand[~split & ~inter & ~((cand == 0) & (model.layers % max(pp, 1) != 0) & (vpp > 1))]
        return {"first_stage_layers = last_stage_layers": [int(x) for x in ok]}
    if code == "world_size":
        return {"product": ctx.num_devices}
    if code == "batch":
        return {"global_batch": ctx.global_batch}
    return None
