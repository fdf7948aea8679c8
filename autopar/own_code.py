"""A language model read by its own code: a :class:`~autopar.model.ModelSpec` from module shapes.

When the field-driven reader (:mod:`autopar.model`) refuses a config for an unknown ``model_type`` or
fields it does not understand, and ``transformers`` is installed with a class for it, the config is
built on the ``meta`` device by that class (:func:`autopar.hf_meta.build_on_meta`: no weights, no
download, never remote code) and each decoder layer is read from the shapes of its modules:

* attention: heads from the config, head size, KV heads, a per-channel output gate (q projection
  twice as wide, or a separate gate projection), QK-norms and biases from the q/k/v/o (or fused qkv)
  weight shapes; MLA ranks and head sizes from q_a/q_b/kv_a/kv_b and their norms; the sliding window
  of each layer from its attention module, else the config's ``layer_types``;
* the feed-forward part: a dense MLP (gated or not from the up and down shapes), routed experts (count
  and per-expert width from the expert weights, fused 3-D tensors or one module per expert), shared
  experts, the router; top-k from the config;
* norms per layer (LayerNorm with or without bias, or RMSNorm), embeddings, the LM head (tied or not,
  with or without bias); vision/audio towers and MTP modules are reported apart.

What :class:`ModelSpec` cannot cost is refused by name (the module and its class): a sparse-attention
indexer, KV compressor, latent-MoE projection or hyper-connection; attention shapes that differ between
layers; a V head size that differs from the K head size; a module kind with no block (Mamba and linear
attention included: the field reader reads the hybrids it knows). Parameters that map to nothing are
tolerated up to 0.5 % of their layer (e.g. a per-head attention gate, attention sinks, router biases)
and named in the spec's warnings. The spec is kept only when its total and active parameters are
within 1 % of the class's own count (:func:`autopar.hf_meta.count_model`); otherwise it is refused.

Nothing here is imported by ``import autopar``: torch and transformers load on the first call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from autopar.block_order import block_pattern
from autopar.errors import ModelConfigError, UnsupportedArchitecture

__all__ = ["OWN_CODE", "spec_from_own_code"]

# The mark in ModelSpec.source and warnings of a spec read from the model's own code.
OWN_CODE = "read by its own code"
IGNORED_SHARE = 0.005  # unmapped parameters tolerated per layer
COUNT_TOLERANCE = 0.01  # total and active parameters against the class's own count

# Modules this reader does not map from shapes, refused by name wherever they appear in a layer (the
# field reader costs a DSA indexer and a latent MoE for the model types it knows: DeepSeek-V3.2,
# GLM-5, Nemotron 3 Super).
_REFUSED_SEGMENTS = {
    "indexer": "a sparse-attention indexer (DSA: a lightning indexer selecting the top-k keys)",
    "compressor": "a KV compressor (compressed sparse attention)",
    "fc1_latent_proj": "a latent-MoE projection (experts in a projected latent space)",
    "fc2_latent_proj": "a latent-MoE projection (experts in a projected latent space)",
    "attn_hc": "a hyper-connection (several residual streams)",
    "ffn_hc": "a hyper-connection (several residual streams)",
    "hc_head": "a hyper-connection (several residual streams)",
    "cross_attn": "cross-attention (an encoder-decoder or image cross-attention layer)",
    "encoder_attn": "cross-attention (an encoder-decoder layer)",
    "crossattention": "cross-attention (an encoder-decoder layer)",
    "altup": "AltUp (alternating updates)",
    "laurel": "a Laurel (learned augmented residual) block",
    "per_layer_input_gate": "per-layer input embeddings",
}
_RECURRENT_TYPES = re.compile(
    r"Mamba|SSM|DeltaNet|LinearAttention|Lightning|ShortConv|Rwkv|RGLRU|Recurrent|xLSTM"
)
_ATTN_SEGS = {"self_attn", "attention", "attn", "self_attention", "mixer", "temporal_block"}
_FFN_SEGS = {"mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "mixer", "dense_mlp"}
_SHARED_SEGS = {"shared_experts", "shared_expert", "shared_mlp", "shared_ffn"}
_ROUTER_SEGS = {"gate", "router", "wg", "router_gate"}
_Q = {"q_proj", "query", "wq", "q", "q_lin"}
_K = {"k_proj", "key", "wk", "k", "k_lin"}
_V = {"v_proj", "value", "wv", "v", "v_lin"}
_QKV = {"qkv_proj", "Wqkv", "wqkv", "query_key_value", "c_attn", "qkv", "W_pack"}
_O = {"o_proj", "out_proj", "dense", "c_proj", "wo", "o", "out", "proj", "out_lin"}
_GATE = {"g_proj", "gate_proj", "gate", "o_gate"}
_QN = {"q_norm", "q_layernorm", "query_layernorm", "q_ln"}
_KN = {"k_norm", "k_layernorm", "key_layernorm", "k_ln"}
_MLA = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "q_a_layernorm", "kv_a_layernorm"}
_DOWN = {"down_proj", "w2", "c_proj", "fc2", "dense_4h_to_h", "fc_out", "wo", "output_linear", "linear_2"}
_NORM_NAME = re.compile(r"(norm|^ln_?\w*$|^ln\d*$|layernorm)", re.I)


@dataclass
class _Leaf:
    path: str  # relative to the layer: "self_attn.q_proj"
    cls: str
    params: dict[str, Any]  # name -> tensor (meta)
    io: tuple[int, int] | None  # (in, out) of a Linear-like module

    @property
    def segs(self) -> list[str]:
        return self.path.split(".")

    @property
    def name(self) -> str:
        return self.segs[-1]

    @property
    def numel(self) -> int:
        return sum(int(p.numel()) for p in self.params.values())

    @property
    def bias(self) -> int:
        b = self.params.get("bias")
        return int(b.numel()) if b is not None else 0


@dataclass
class _Attn:
    heads: int
    kv_heads: int
    head_dim: int
    gate: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str = "none"
    mla: tuple[int, int, int, int, int] | None = None  # q_lora, kv_lora, nope, rope, v
    window: int = 0

    def shape(self) -> str:
        """Everything ModelSpec holds of one attention layer, readable (compared across layers)."""
        flags = [k for k, v in (("output gate", self.gate), ("qkv bias", self.qkv_bias),
                                ("o bias", self.o_bias)) if v]  # fmt: skip
        if self.qk_norm != "none":
            flags.append(f"{self.qk_norm} QK-norm")
        return self.describe() + "".join(f", {f}" for f in flags)

    def describe(self) -> str:
        if self.mla:
            q, kv, nope, rope, v = self.mla
            return f"MLA {self.heads} heads, q rank {q}, kv rank {kv}, qk {nope}+{rope}, v {v}"
        return f"{self.heads} heads x {self.head_dim}, {self.kv_heads} KV heads"


@dataclass
class _Layer:
    index: int
    total: int = 0
    attn: _Attn | None = None
    attn_params: int = 0
    ffn: str = "none"  # none / mlp / moe
    mlp: tuple[int, bool, bool] | None = None  # width, gated, bias (dense MLP of a dense layer)
    experts: tuple[int, int, bool] | None = None  # count, width, gated
    shared: list[tuple[int, bool]] = field(default_factory=list)  # always-active MLPs beside experts
    router: int = 0
    ffn_params: int = 0
    norms: list[_Leaf] = field(default_factory=list)
    ignored: list[tuple[str, int]] = field(default_factory=list)
    recurrent: tuple[str, tuple] | None = None  # ("mamba" | "linear", ModelSpec fields as items)
    recurrent_params: int = 0


def _block_order(reads: list[_Layer], parallel: bool) -> str:
    """ModelSpec.block_pattern of the layers as built (empty where the order does not matter)."""

    def mixer(r: _Layer) -> str:
        if r.recurrent and not parallel:
            return r.recurrent[0]
        return "attention" if r.attn else "none"

    mix = [mixer(r) for r in reads]
    return block_pattern(
        mix, [r.ffn if r.ffn in ("mlp", "moe") else "none" for r in reads], [r.ffn == "moe" for r in reads]
    )


def _refuse(what: str, hint: str = "") -> UnsupportedArchitecture:
    return UnsupportedArchitecture(
        what,
        hint
        or "autopar costs the layer kinds ModelSpec holds; describe the model with raw dimensions "
        "(ModelSpec field names) if an approximation is meant",
    )


def _io(mod: Any) -> tuple[int, int] | None:
    if isinstance(getattr(mod, "in_features", None), int) and isinstance(
        getattr(mod, "out_features", None), int
    ):
        return int(mod.in_features), int(mod.out_features)
    w = getattr(mod, "weight", None)
    if type(mod).__name__ == "Conv1D" and w is not None and w.dim() == 2:  # GPT-2 Conv1D: (in, out)
        return int(w.shape[0]), int(w.shape[1])
    return None


def _leaves(layer: Any) -> list[_Leaf]:
    out = []
    for path, mod in layer.named_modules():
        params = dict(mod.named_parameters(recurse=False))
        if params:
            out.append(_Leaf(path, type(mod).__name__, params, _io(mod)))
    return out


# ------------------------------------------------------------------------------------ attention
def _attention(
    leaves: list[_Leaf], h: int, heads: int, head_dim: int, where: str
) -> tuple[_Attn, int, list[tuple[str, int]]]:
    """(shape, mapped parameters, ignored (path, n)) of one layer's attention leaves."""
    by = {lf.name: lf for lf in leaves}
    ignored: list[tuple[str, int]] = []
    used: set[str] = set()

    def take(names: set[str]) -> _Leaf | None:
        hit = [lf for lf in leaves if lf.name in names and lf.path not in used and lf.io]
        if len(hit) > 1:
            raise _refuse(
                f"{where}: more than one {'/'.join(sorted(names))} projection ({hit[0].path}, {hit[1].path})"
            )
        if hit:
            used.add(hit[0].path)
            return hit[0]
        return None

    if any(n in by for n in ("kv_a_proj_with_mqa", "kv_b_proj")):
        return _mla(leaves, h, heads, where)
    o = take(_O)
    if o is None or o.io is None or o.io[1] != h:
        raise _refuse(
            f"{where}: no output projection to the hidden size {h} found among {', '.join(lf.path for lf in leaves)}"
        )
    od = o.io[0]
    # the head size: the config's head_dim where it divides the output projection, else by the heads
    d = head_dim if head_dim and od % head_dim == 0 else od // heads if od % heads == 0 else 0
    if not d:
        raise _refuse(f"{where}.{o.path}: input width {od} is not a multiple of the {heads} heads")
    heads = od // d
    qkv = take(_QKV)
    gate = False
    if qkv is not None:
        assert qkv.io is not None
        if qkv.io[0] != h or (qkv.io[1] - od) % (2 * d):
            raise _refuse(
                f"{where}.{qkv.path}: fused qkv width {qkv.io[1]} does not split into {heads} heads x {d}"
            )
        kv = (qkv.io[1] - od) // (2 * d)
        qkv_bias = qkv.bias > 0
        parts = [qkv]
    else:
        q, k, v = take(_Q), take(_K), take(_V)
        if q is None or k is None:
            raise _refuse(f"{where}: no q/k projections found among {', '.join(lf.path for lf in leaves)}")
        if v is None:
            raise _refuse(f"{where}: no v projection (K and V shared); ModelSpec's attention has its own V")
        assert q.io and k.io and v.io
        if q.io[1] == 2 * od:
            gate = True  # q projection emits the output gate too (Qwen3-Next)
        elif q.io[1] != od:
            raise _refuse(
                f"{where}: q width {q.io[1]} and the output projection's input {od} differ (a V head "
                "size other than the Q/K head size); ModelSpec holds one head size for Q, K and V"
            )
        if k.io[1] != v.io[1]:
            raise _refuse(
                f"{where}: K width {k.io[1]} and V width {v.io[1]} differ (a V head size other than the "
                "K head size); ModelSpec holds one head size for Q, K and V"
            )
        if k.io[1] % d:
            raise _refuse(f"{where}.{k.path}: K width {k.io[1]} is not a multiple of the head size {d}")
        kv = k.io[1] // d
        if any(x.io is None or x.io[0] != h for x in (q, k, v)):
            raise _refuse(f"{where}: q/k/v projections do not read the hidden size {h}")
        biases = [x.bias > 0 for x in (q, k, v)]
        qkv_bias = all(biases)
        parts = [q, k, v]
        if any(biases) and not qkv_bias:
            for x in parts:
                if x.bias:
                    ignored.append((f"{x.path}.bias", x.bias))
    if kv < 1 or heads % kv:
        raise _refuse(f"{where}: {kv} KV heads do not divide {heads} heads")
    g = take(_GATE)
    if g is not None:
        assert g.io
        if g.io == (h, od) and not gate:
            gate = True  # a separate per-channel gate projection: the same cost as a 2x wide q
            parts.append(g)
        else:
            ignored.append((g.path, g.numel))  # e.g. a per-head scalar gate (h -> heads)
    mapped = sum(x.numel for x in parts) + o.numel
    if not qkv_bias:  # a bias on some of q/k/v only is not costed (named in the warnings above)
        mapped -= sum(x.bias for x in parts if x is not g)
    qk_norm = "none"
    for names in (_QN, _KN):
        nl = [lf for lf in leaves if lf.name in names]
        for lf in nl:
            used.add(lf.path)
            size = int(lf.params["weight"].numel()) if "weight" in lf.params else 0
            kind = "head" if size == d else "full" if size in (heads * d, kv * d) else "?"
            if kind == "?" or (qk_norm != "none" and qk_norm != kind):
                raise _refuse(f"{where}.{lf.path}: a QK-norm of {size} channels (head size {d})")
            qk_norm = kind
            mapped += lf.numel
    for lf in leaves:
        if lf.path in used or lf in parts or lf is o:
            continue
        ignored.append((lf.path, lf.numel))  # sinks, per-head gates
    a = _Attn(heads, kv, d, gate=gate, qkv_bias=qkv_bias, o_bias=o.bias > 0, qk_norm=qk_norm)
    return a, mapped, ignored


def _mla(leaves: list[_Leaf], h: int, heads: int, where: str) -> tuple[_Attn, int, list[tuple[str, int]]]:
    by = {lf.name: lf for lf in leaves}
    for lf in leaves:
        if lf.name not in _MLA | _O | _Q:
            raise _refuse(
                f"{where}.{lf.path} ({lf.cls}): a module beside MLA attention that autopar does not cost"
            )
        if lf.bias and "norm" not in lf.name:
            raise _refuse(f"{where}.{lf.path}: a bias in MLA attention (not modeled)")
    kva, kvb, kvn = by.get("kv_a_proj_with_mqa"), by.get("kv_b_proj"), by.get("kv_a_layernorm")
    o = next((by[n] for n in _O if n in by), None)
    if not (kva and kvb and kvn and o and kva.io and kvb.io and o.io):
        raise _refuse(
            f"{where}: MLA attention without kv_a_proj_with_mqa, kv_b_proj, kv_a_layernorm and o_proj"
        )
    r = int(kvn.params["weight"].numel())
    rope = kva.io[1] - r
    qa, qb = by.get("q_a_proj"), by.get("q_b_proj")
    if qa and qb and qa.io and qb.io:
        q_rank, qk = qa.io[1], qb.io[1]
    elif (q := next((by[n] for n in _Q if n in by), None)) is not None and q.io:
        q_rank, qk = 0, q.io[1]
    else:
        raise _refuse(f"{where}: MLA attention without a q projection")
    if qk % heads or o.io[0] % heads or o.io[1] != h:
        raise _refuse(f"{where}: MLA widths do not split into {heads} heads")
    qk, v = qk // heads, o.io[0] // heads
    nope = qk - rope
    if nope <= 0 or rope <= 0 or kvb.io != (r, heads * (nope + v)):
        raise _refuse(f"{where}: MLA shapes do not fit one latent rank {r} and rope size {rope}")
    mapped = sum(lf.numel for lf in leaves)
    return _Attn(heads, heads, nope + rope, mla=(q_rank, r, nope, rope, v)), mapped, []


# ------------------------------------------------------------------------------------ feed-forward
def _mlp_shape(leaves: list[_Leaf], h: int, where: str) -> tuple[int, bool, bool, int]:
    """(width, gated, bias, mapped parameters) of one MLP from its Linear modules."""
    lin = [lf for lf in leaves if lf.io]
    others = [lf for lf in leaves if not lf.io]
    if others:
        lf = others[0]
        raise _refuse(f"{where}.{lf.path} ({lf.cls}): a module inside the MLP that autopar does not cost")
    if len(lin) < 2:
        raise _refuse(f"{where}: an MLP of {len(lin)} projection(s) ({', '.join(lf.path for lf in lin)})")
    down = next((lf for lf in lin if lf.name in _DOWN), lin[-1])
    ups = [lf for lf in lin if lf is not down]
    assert down.io
    f = down.io[0]
    if down.io[1] != h or any(u.io is None or u.io[0] != h for u in ups):
        raise _refuse(
            f"{where}: MLP projections do not map the hidden size {h} ({', '.join(lf.path for lf in lin)})"
        )
    width = sum(u.io[1] for u in ups if u.io)
    if width not in (f, 2 * f):
        raise _refuse(f"{where}: MLP up width {width} is neither the down width {f} nor twice it")
    biases = [lf.bias > 0 for lf in lin]
    if any(biases) and not all(biases):
        raise _refuse(f"{where}: biases on some MLP projections only")
    return f, width == 2 * f, all(biases), sum(lf.numel for lf in lin)


def _experts(leaves: list[_Leaf], h: int, where: str) -> tuple[int, int, bool, int, list[tuple[str, int]]]:
    """(count, per-expert width, gated, mapped, ignored) of the routed experts."""
    ignored: list[tuple[str, int]] = []
    per_index: dict[int, list[_Leaf]] = {}
    fused: list[tuple[str, Any]] = []
    for lf in leaves:
        segs = lf.segs
        i = segs.index("experts")
        if i + 1 < len(segs) and segs[i + 1].isdigit():
            per_index.setdefault(int(segs[i + 1]), []).append(lf)
            continue
        for n, p in lf.params.items():
            if p.dim() == 3:
                fused.append((f"{lf.path}.{n}", p))
            else:
                ignored.append((f"{lf.path}.{n}", int(p.numel())))  # expert biases
    if per_index and fused:
        raise _refuse(f"{where}: experts both fused and per module")
    if per_index:
        n_exp = len(per_index)
        sets = {tuple(sorted((lf.name, lf.io) for lf in v)) for v in per_index.values()}
        if len(sets) != 1 or sorted(per_index) != list(range(n_exp)):
            raise _refuse(f"{where}: experts of different shapes")
        f, gated, bias, mapped0 = _mlp_shape(per_index[0], h, f"{where}.experts.0")
        mapped = mapped0 * n_exp
        if bias:
            b = sum(lf.bias for v in per_index.values() for lf in v)
            ignored.append(("experts.*.bias", b))
            mapped -= b
        return n_exp, f, gated, mapped, ignored
    if not fused:
        raise _refuse(f"{where}: an experts module without expert weights")
    E = int(fused[0][1].shape[0])
    dims = []
    for n, p in fused:
        if int(p.shape[0]) != E:
            raise _refuse(f"{where}.{n}: {p.shape[0]} experts, not {E}")
        a, b = int(p.shape[1]), int(p.shape[2])
        if h not in (a, b):
            raise _refuse(f"{where}.{n}: expert weight {tuple(p.shape)} does not touch the hidden size {h}")
        dims.append((n, b if a == h else a))
    down = next((d for d in dims if re.search(r"down|w2|output|fc2", d[0].rsplit(".", 1)[-1])), dims[-1])
    f = down[1]
    width = sum(o for n, o in dims if n != down[0])
    if width not in (f, 2 * f):
        raise _refuse(f"{where}: expert up width {width} is neither the down width {f} nor twice it")
    return E, f, width == 2 * f, sum(int(p.numel()) for _, p in fused), ignored


def _recurrent(params: dict[str, Any], h: int, tc: Any, where: str) -> tuple[str, tuple]:
    """(kind, ModelSpec fields) of a Mamba1, Mamba2 or Gated DeltaNet mixer from its weight shapes.

    The state size (Mamba) and the key heads (Gated DeltaNet) are not in the shapes alone: they
    come from the config, and the shapes must fit them.
    """

    def shape(n: str) -> tuple[int, ...]:
        t = params.get(n)
        if t is None:
            raise _refuse(f"{where}: a recurrent mixer without {n!r} (not a Mamba or Gated DeltaNet mixer)")
        return tuple(int(x) for x in t.shape)

    def bad(what: str) -> UnsupportedArchitecture:
        return _refuse(f"{where}: {what}")

    names = set(params)
    if {n for n in names if n.endswith(".bias")} - {"conv1d.bias", "dt_proj.bias"}:
        raise bad("biases on the mixer's projections (not modeled)")
    conv = shape("conv1d.weight")
    if len(conv) != 3 or conv[1] != 1:
        raise bad(f"conv1d {conv} is not a depthwise convolution")
    conv_dim, width = conv[0], conv[2]
    out = shape("out_proj.weight")
    if out[0] != h:
        raise bad(f"out_proj {out} does not map back to the hidden size {h}")
    inner = out[1]
    if "x_proj.weight" in names:  # Mamba1 (selective scan): JambaMambaMixer
        n_state = shape("A_log")[1] if len(shape("A_log")) == 2 else 0
        r = shape("dt_proj.weight")[1]
        if (
            conv_dim != inner
            or shape("in_proj.weight") != (2 * inner, h)
            or shape("x_proj.weight") != (r + 2 * n_state, inner)
        ):
            raise bad("Mamba1 shapes do not fit one inner size, state size and dt rank")
        fields = dict(mamba_version=1, mamba_inner=inner, mamba_state=n_state, mamba_dt_rank=r, mamba_conv=width,
                      mamba_conv_bias="conv1d.bias" in names, mamba_heads=0, mamba_groups=0,
                      mamba_gated_norm=False)  # fmt: skip
        return "mamba", tuple(sorted(fields.items()))
    if "in_proj.weight" in names:  # Mamba2 (SSD): in_proj -> z, x, B, C, dt
        nh = shape("dt_bias")[0]
        n_state = _cfg_int(tc, ("ssm_state_size", "mamba_d_state", "state_size", "d_state"))
        if not n_state or (conv_dim - inner) % (2 * n_state) or conv_dim <= inner:
            raise bad(f"conv width {conv_dim} - inner {inner} is not 2 x groups x the state size {n_state}")
        groups = (conv_dim - inner) // (2 * n_state)
        if shape("in_proj.weight") != (2 * inner + 2 * groups * n_state + nh, h):
            raise bad(f"in_proj {shape('in_proj.weight')} is not z, x, B, C and dt of {nh} heads")
        fields = dict(mamba_version=2, mamba_inner=inner, mamba_state=n_state, mamba_heads=nh, mamba_groups=groups,
                      mamba_conv=width, mamba_conv_bias="conv1d.bias" in names, mamba_dt_rank=0,
                      mamba_gated_norm="norm.weight" in names)  # fmt: skip
        return "mamba", tuple(sorted(fields.items()))
    if any(n.startswith("in_proj_") for n in names):  # Gated DeltaNet (Qwen3-Next, Qwen3.5)
        vh = shape("dt_bias")[0]
        vdim = shape("norm.weight")[0]
        kd2 = conv_dim - inner
        kh = _cfg_int(tc, ("linear_num_key_heads",))
        if inner != vh * vdim or kd2 <= 0 or kd2 % 2 or not kh or (kd2 // 2) % kh:
            raise bad(f"Gated DeltaNet shapes do not fit {vh} value heads x {vdim} and {kh} key heads")
        kd = kd2 // 2
        proj = sum(int(params[n].numel()) for n in names if n.startswith("in_proj_"))
        if proj != h * (2 * kd + 2 * inner + 2 * vh):
            raise bad("in_proj_* are not q, k, v, z, b and a")
        fields = dict(linear_k_heads=kh, linear_v_heads=vh, linear_k_head_dim=kd // kh, linear_v_head_dim=vdim,
                      linear_conv=width)  # fmt: skip
        return "linear", tuple(sorted(fields.items()))
    raise bad("a recurrent mixer of a kind the own-code reader does not map")


def _segment_kind(lf: _Leaf) -> str:
    """refused:<segment>, experts, shared or router by the path; "" for the rest."""
    for s in lf.segs:
        if s in _REFUSED_SEGMENTS:
            return "refused:" + s
    if "experts" in lf.segs:
        return "experts"
    if any(s in _SHARED_SEGS for s in lf.segs):
        return "shared"
    if any(s in _ROUTER_SEGS for s in lf.segs) or lf.name == "shared_expert_gate":
        return "router"
    return ""


def _read_layer(index: int, layer: Any, h: int, heads: int, head_dim: int, tc: Any, where: str) -> _Layer:
    """One decoder layer, read from its modules' shapes."""
    rd = _Layer(index)
    leaves = _leaves(layer)
    rd.total = sum(lf.numel for lf in leaves)
    # recurrent mixers first: their in/out projections would read as an MLP
    rec_path = ""
    for path, mod in layer.named_modules():
        cls = type(mod).__name__
        if (
            not path
            or "Norm" in cls
            or not _RECURRENT_TYPES.search(cls)
            or not any(True for _ in mod.parameters())
        ):
            continue
        if rd.recurrent is not None and path.startswith(rec_path + "."):
            continue  # a part of the mixer already read
        if rd.recurrent is not None:
            raise _refuse(f"{where}.{path} ({type(mod).__name__}): a second recurrent mixer in one layer")
        mine = [lf for lf in leaves if lf.path == path or lf.path.startswith(path + ".")]
        params = {lf.path[len(path) + 1 :] + "." + n if lf.path != path else n: t
                  for lf in mine for n, t in lf.params.items()}  # fmt: skip
        rd.recurrent = _recurrent(params, h, tc, f"{where}.{path} ({type(mod).__name__})")
        rec_path = path
        rd.recurrent_params = sum(int(t.numel()) for t in params.values())
        leaves = [lf for lf in leaves if lf not in mine]
    # Nemotron-H names every block's one part "mixer": attention when it holds q/qkv projections
    mixer_is_attn = any(lf.segs[0] == "mixer" and lf.name in _Q | _QKV | _MLA for lf in leaves)
    groups: dict[str, list[_Leaf]] = {
        "attn": [],
        "experts": [],
        "shared": [],
        "router": [],
        "mlp": [],
        "norm": [],
    }
    for lf in leaves:
        k = _segment_kind(lf)
        if k.startswith("refused:"):
            seg = k.split(":", 1)[1]
            sub = ".".join(lf.segs[: lf.segs.index(seg) + 1])
            cls = type(layer.get_submodule(sub)).__name__
            raise _refuse(
                f"{where}.{sub} ({cls}): {_REFUSED_SEGMENTS[seg]}, which the own-code reader does not map"
            )
        if k:
            groups[k].append(lf)
            continue
        top = lf.segs[0]
        if len(lf.segs) == 1 and _NORM_NAME.search(lf.name) and not lf.io:
            groups["norm"].append(lf)
        elif (top in _ATTN_SEGS and top != "mixer") or (top == "mixer" and mixer_is_attn):
            groups["attn"].append(lf)
        elif top in _FFN_SEGS:
            groups["mlp"].append(lf)
        else:
            rd.ignored.append((lf.path, lf.numel))
    if groups["attn"]:
        base = groups["attn"][0].segs[0]
        rel = [_Leaf(".".join(lf.segs[1:]) or lf.name, lf.cls, lf.params, lf.io) for lf in groups["attn"]]
        rd.attn, rd.attn_params, ign = _attention(rel, h, heads, head_dim, f"{where}.{base}")
        rd.ignored += [(f"{base}.{p}", n) for p, n in ign]
    for lf in groups["norm"]:
        w = lf.params.get("weight")
        if (
            w is None
            or int(w.numel()) != h
            or (lf.bias and lf.bias != h)
            or set(lf.params) - {"weight", "bias"}
        ):
            rd.ignored.append((lf.path, lf.numel))
        else:
            rd.norms.append(lf)
    if groups["experts"]:
        E, f, gated, mapped, ign = _experts(groups["experts"], h, where)
        rd.experts, rd.ffn, rd.ffn_params = (E, f, gated), "moe", mapped
        rd.ignored += ign
        for lf in groups["router"]:
            for n, p in lf.params.items():
                if tuple(p.shape) == (E, h) and not rd.router:  # the router's hidden -> experts weight
                    rd.router = h * E
                    rd.ffn_params += h * E
                else:  # router biases, correction biases, scales, a shared-expert gate
                    rd.ignored.append((f"{lf.path}.{n}", int(p.numel())))
        if not rd.router:
            raise _refuse(f"{where}: routed experts without a router (hidden {h} -> {E} experts)")
        for grp in ("shared", "mlp"):  # always-active MLPs beside the experts (shared experts)
            if groups[grp]:
                f_s, g_s, b_s, m_s = _mlp_shape(groups[grp], h, f"{where}.{groups[grp][0].segs[0]}")
                if b_s:
                    raise _refuse(f"{where}.{groups[grp][0].path}: biases on a shared expert (not modeled)")
                rd.shared.append((f_s, g_s))
                rd.ffn_params += m_s
    else:
        for grp in ("router", "shared"):
            for lf in groups[grp]:
                rd.ignored.append((lf.path, lf.numel))
        if groups["mlp"]:
            f, gated, bias, mapped = _mlp_shape(groups["mlp"], h, f"{where}.{groups['mlp'][0].segs[0]}")
            rd.mlp, rd.ffn, rd.ffn_params = (f, gated, bias), "mlp", mapped
    return rd


# ------------------------------------------------------------------------------------ the model
def _decoder_layers(model: Any) -> tuple[str, Any]:
    import torch

    from autopar.hf_meta import kind_of

    best: tuple[int, str, Any] = (0, "", None)
    for path, mod in model.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or kind_of(path + ".x") in ("towers", "mtp"):
            continue
        n = sum(int(p.numel()) for p in mod.parameters())
        if n > best[0]:
            best = (n, path, mod)
    if best[2] is None:
        raise _refuse("no list of decoder layers found in the model")
    return best[1], best[2]


def _uniform(values: list[Any], what: str, where: list[str]) -> Any:
    distinct = list(dict.fromkeys(values))
    if len(distinct) > 1:
        i = values.index(distinct[1])
        raise _refuse(
            f"{what} differ between layers ({where[0]}: {distinct[0]}; {where[i]}: {distinct[1]}); "
            "ModelSpec holds one per model"
        )
    return distinct[0] if distinct else None


def _cfg_int(cfg: Any, names: tuple[str, ...]) -> int:
    for n in names:
        try:
            v = getattr(cfg, n, None)
        except Exception:  # noqa: BLE001 - a per-layer attribute the config will not give globally
            v = None
        if isinstance(v, list) and v and len(set(v)) == 1:
            v = v[0]
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def _slides_every_layer(layer: Any) -> bool:
    """The class's own module masks every layer with ``config.sliding_window`` (Mistral, Starcoder2,
    Phi-3: one sliding-window causal mask, no per-layer types)."""
    import inspect
    import sys

    try:
        src = inspect.getsource(sys.modules[type(layer).__module__])
    except (KeyError, OSError, TypeError):
        return False
    mask = "create_causal_mask if self.config.sliding_window is None else create_sliding_window_causal_mask"
    return mask in src and "layer_types" not in src


def _windows(
    model_layers: list[Any], attn_idx: list[int], tc: Any, max_pos: int, where: str
) -> tuple[int, int]:
    """(window, sliding layers): from each attention module, else the config's layer_types."""
    types = getattr(tc, "layer_types", None)
    if isinstance(types, list | tuple) and len(types) == len(model_layers):
        for i in attn_idx:  # the config says what each attention layer is; a kind it names is not ignored
            if types[i] not in ("full_attention", "sliding_attention", "chunked_attention", "attention"):
                raise _refuse(
                    f"{where}.{i}: layer_types names {types[i]!r} for a layer the class builds as attention"
                )
    wins: list[int] = []
    for i in attn_idx:
        layer = model_layers[i]
        attn = next((m for n, m in layer.named_children() if n in _ATTN_SEGS), None)
        w = getattr(attn, "sliding_window", "absent") if attn is not None else "absent"
        if w == "absent" and isinstance(types, list | tuple) and len(types) == len(model_layers):
            t = types[i]
            if t in ("sliding_attention", "chunked_attention"):
                key = ("attention_chunk_size",) if t == "chunked_attention" else ("sliding_window",)
                w = _cfg_int(tc, key)
                if not w:
                    raise _refuse(f"{where}.{i}: layer type {t!r} without a window size in the config")
            elif t == "full_attention":
                w = 0
            else:
                raise _refuse(f"{where}.{i}: attention layer of type {t!r} in layer_types")
        if w == "absent":
            sw = _cfg_int(tc, ("sliding_window",))
            w = 0
            if sw and (not max_pos or sw < max_pos) and getattr(tc, "use_sliding_window", True) is not False:
                if not _slides_every_layer(layer):
                    raise _refuse(
                        f"sliding_window={sw} but neither the attention modules, layer_types nor the "
                        "class's code say which layers use it"
                    )
                w = sw
        w = int(w or 0)
        wins.append(0 if max_pos and w >= max_pos else w)
    sliding = [w for w in wins if w]
    if len(set(sliding)) > 1:
        raise _refuse(f"sliding windows of different sizes ({sorted(set(sliding))}); ModelSpec holds one")
    return (sliding[0], len(sliding)) if sliding else (0, 0)


def spec_from_own_code(
    raw: dict, *, name: str, source: str, build: Callable[[dict], Any], max_position: int = 0
) -> tuple[Any, str]:
    """``(spec, how)`` read from the modules the config's own class builds on the meta device, or
    ``(None, why)`` when transformers is absent or has no class for it. Raises
    :class:`UnsupportedArchitecture` naming the module ModelSpec cannot cost.

    ``build`` makes the ModelSpec from its fields (:mod:`autopar.model`, which calls this: no import
    back); ``max_position`` is the config's position limit as the field reader reads it (rope-scaled
    where the config says so), else the class's ``max_position_embeddings``.
    """
    key = json.dumps(raw, sort_keys=True, default=str)
    return _cached(key, name, source, build, max_position)


@lru_cache(maxsize=16)
def _cached(
    key: str, name: str, source: str, build: Callable[[dict], Any], max_position: int
) -> tuple[Any, str]:
    from autopar.hf_meta import build_on_meta, count_model

    raw = json.loads(key)
    built, how = build_on_meta(raw)
    if built is None:
        return None, how
    model, cfg, cls, lib = built
    count = count_model(model, cfg, cls, lib)
    try:
        spec = _read_model(
            model, cfg, name=name, source=source, how=how, build=build, max_position=max_position
        )
    except UnsupportedArchitecture as e:
        raise UnsupportedArchitecture(f"{name}: {how}: {e.message}", e.hint) from None
    except ModelConfigError as e:  # the shapes read do not form a spec ModelSpec accepts
        raise UnsupportedArchitecture(
            f"{name}: {how}: the module shapes give no valid ModelSpec: {e.message}"
        ) from None
    _check_counts(spec, count, how)
    return spec, how


def _check_counts(spec: Any, count: Any, how: str) -> None:
    for what, ours, truth in (
        ("total", spec.total_params, count.text_total),
        ("active", spec.active_params, count.text_active),
    ):
        if truth is None:
            raise _refuse(f"{spec.name}: {how}: the class's {what} parameter count is not known")
        if abs(ours / truth - 1) > COUNT_TOLERANCE:
            raise _refuse(
                f"{spec.name}: {how}: {what} parameters read from the module shapes ({ours:,}) are "
                f"{ours / truth - 1:+.2%} off the class's own count ({truth:,}); a module is not understood"
            )


def _read_model(
    model: Any, cfg: Any, *, name: str, source: str, how: str, build: Callable[[dict], Any], max_position: int
) -> Any:
    from autopar.hf_meta import _text_cfg, kind_of

    tc = _text_cfg(cfg)
    path, layers = _decoder_layers(model)
    emb = model.get_input_embeddings()
    if emb is None or getattr(emb, "weight", None) is None or emb.weight.dim() != 2:
        raise _refuse("no input token embedding found")
    vocab, h = (int(x) for x in emb.weight.shape)
    heads = _cfg_int(tc, ("num_attention_heads", "n_heads", "n_head", "num_heads"))
    if not heads:
        raise _refuse("the config names no num_attention_heads")
    head_dim = _cfg_int(tc, ("head_dim",))
    reads = [_read_layer(i, layer, h, heads, head_dim, tc, f"{path}.{i}") for i, layer in enumerate(layers)]
    where = [f"{path}.{r.index}" for r in reads]
    notes: list[str] = []
    # ---- unmapped parameters: tolerated up to IGNORED_SHARE of their layer
    for r in reads:
        n_ign = sum(n for _, n in r.ignored)
        if r.total and n_ign / r.total > IGNORED_SHARE:
            p, n = max(r.ignored, key=lambda x: x[1])
            sub = p.rsplit(".", 1)[0] if p.endswith((".bias", ".weight")) else p
            try:
                mod = layers[r.index].get_submodule(sub)
            except AttributeError:
                mod = layers[r.index]
            raise _refuse(
                f"{path}.{r.index}.{p} ({type(mod).__name__}, {n:,} parameters): a module kind autopar "
                f"cannot cost ({n_ign / r.total:.1%} of the layer is not mapped to any ModelSpec part)"
            )
    ign: dict[str, int] = {}
    for r in reads:
        for p, n in r.ignored:
            ign[re.sub(r"\d+", "N", p)] = ign.get(re.sub(r"\d+", "N", p), 0) + n
    # ---- recurrent mixers (Mamba, Gated DeltaNet), beside attention in every block or instead of it
    rec = [r for r in reads if r.recurrent]
    parallel = bool(rec) and all(r.recurrent and r.attn for r in reads)
    for r in reads:
        if r.recurrent and r.attn and not parallel:
            raise _refuse(f"{where[r.index]}: a recurrent mixer beside attention in some layers only")
    rec_fields: dict[str, Any] = {}
    for kind in ("mamba", "linear"):
        mine = [r for r in rec if r.recurrent and r.recurrent[0] == kind]
        if mine:
            dims = _uniform([r.recurrent[1] for r in mine if r.recurrent], f"{kind} mixer shapes",
                            [where[r.index] for r in mine])  # fmt: skip
            rec_fields.update(dict(dims))
            rec_fields[f"{kind}_attn_layers" if kind == "linear" else "mamba_layers"] = len(mine)
    if parallel:
        if rec_fields.get("linear_attn_layers"):
            raise _refuse(
                "linear attention beside attention in every block (ModelSpec holds Mamba there only)"
            )
        rec_fields["mamba_parallel"] = True
    # ---- attention
    attn_idx = [r.index for r in reads if r.attn is not None]
    if not attn_idx:
        raise _refuse("no attention layer found")
    shape = _uniform([r.attn.shape() for r in reads if r.attn], "attention shapes",
                     [where[i] for i in attn_idx])  # fmt: skip
    a = next(r.attn for r in reads if r.attn)
    assert a is not None and shape is not None
    no_mixer = sum(1 for r in reads if r.attn is None and r.recurrent is None)
    # ---- feed-forward
    dense = [r for r in reads if r.ffn == "mlp"]
    moe = [r for r in reads if r.ffn == "moe"]
    no_ffn = len(reads) - len(dense) - len(moe)
    gates: list[tuple[str, bool]] = []
    f: dict[str, Any] = {}
    if dense:
        w = _uniform([r.mlp for r in dense], "dense MLP shapes", [where[r.index] for r in dense])
        f["ffn_hidden"], g, f["mlp_bias"] = w
        gates.append(("dense MLP", g))
    else:
        f["ffn_hidden"] = 0
    if moe:
        E, fe, ge = _uniform([r.experts for r in moe], "expert shapes", [where[r.index] for r in moe])
        gates.append(("experts", ge))
        shared = _uniform(
            [tuple(r.shared) for r in moe], "shared-expert shapes", [where[r.index] for r in moe]
        )
        for _fs, gs in shared:
            gates.append(("shared experts", gs))
        topk = _cfg_int(tc, ("num_experts_per_tok", "moe_topk", "top_k", "experts_per_token",
                             "num_experts_per_token", "moe_k"))  # fmt: skip
        if not topk:
            raise _refuse("routed experts, but the config names no experts per token (num_experts_per_tok)")
        n_cfg = _cfg_int(tc, ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"))
        if n_cfg and n_cfg != E:
            raise _refuse(f"{E} expert weights built but the config names {n_cfg} experts")
        f.update(
            num_experts=E,
            moe_topk=topk,
            moe_ffn_hidden=fe,
            shared_expert_ffn=sum(fs for fs, _ in shared),
            moe_layers=len(moe),
            first_dense_layers=next(i for i, r in enumerate(reads) if r.ffn != "mlp"),  # leading dense layers
        )
        if len(shared) > 1 or any(r.mlp for r in moe):
            notes.append("an always-active MLP beside the routed experts is costed as a shared expert")
    if len({g for _, g in gates}) > 1:
        raise _refuse(
            "gated and plain MLPs in one model ("
            + ", ".join(f"{k}: {'gated' if g else 'plain'}" for k, g in gates)
            + "); ModelSpec holds one MLP kind"
        )
    f["gated_mlp"] = gates[0][1] if gates else True
    # ---- norms
    n_norms = _uniform([len(r.norms) for r in reads], "norms per layer", where)
    kinds = [("layernorm" if lf.bias else "layernorm_nobias") if "LayerNorm" in lf.cls and "RMS" not in lf.cls
             else "rmsnorm" for r in reads for lf in r.norms]  # fmt: skip
    norm = _uniform(kinds, "norm kinds", where[: len(kinds)]) or "rmsnorm"
    if not n_norms:
        raise _refuse("a decoder layer without a norm")
    # ---- embeddings, head, outside parameters
    head = model.get_output_embeddings()
    tied = head is None or getattr(head, "weight", None) is emb.weight
    head_bias = bool(head is not None and getattr(head, "bias", None) is not None)
    if head is not None and tuple(head.weight.shape) != (vocab, h):
        raise _refuse(
            f"the LM head {tuple(head.weight.shape)} does not map the hidden size {h} to the vocabulary {vocab}"
        )
    layer_ids = {id(p) for p in layers.parameters()}
    counted = {id(emb.weight)} | ({id(head.weight)} if head is not None else set())
    if head_bias:
        counted.add(id(head.bias))
    outside: dict[str, int] = {}
    vision = audio = 0
    final_norm = 0
    for n, p in model.named_parameters():
        if id(p) in layer_ids or id(p) in counted:
            continue
        k = kind_of(n)
        if k == "towers":
            if "audio" in n or "speech" in n:
                audio += int(p.numel())
            else:
                vision += int(p.numel())
        elif k == "mtp":
            continue
        elif k == "embeddings":  # learned positions, token types: lookups, no FLOPs; named below
            ign[re.sub(r"\d+", "N", n)] = ign.get(re.sub(r"\d+", "N", n), 0) + int(p.numel())
        elif k == "norms" and int(p.numel()) == h and not final_norm:
            final_norm = 1
        elif k == "norms" and int(p.numel()) == h and n.endswith(".bias") and final_norm == 1:
            final_norm = 2
        else:
            outside[n] = int(p.numel())
    total_layers = sum(r.total for r in reads)
    n_out = sum(outside.values())
    if n_out > IGNORED_SHARE * total_layers:
        big = max(outside, key=lambda k: outside[k])
        raise _refuse(
            f"{big} ({outside[big]:,} parameters, outside the decoder layers): a module kind autopar cannot cost"
        )
    for pname, v in outside.items():
        pat = re.sub(r"\d+", "N", pname)
        ign[pat] = ign.get(pat, 0) + v
    max_pos = max_position or _cfg_int(tc, ("max_position_embeddings", "n_positions", "max_seq_len"))
    window, n_sliding = _windows(list(layers), attn_idx, tc, max_pos, path)
    f.update(rec_fields)
    f.update(
        name=name,
        source=f"{source} ({OWN_CODE}: {how})" if source else f"({OWN_CODE}: {how})",
        hidden=h,
        layers=len(reads),
        heads=a.heads,
        kv_heads=a.kv_heads,
        head_dim=a.head_dim,
        vocab=vocab,
        tie_embeddings=tied,
        qkv_bias=a.qkv_bias,
        o_bias=a.o_bias,
        head_bias=head_bias,
        norm=norm,
        norms_per_layer=n_norms,
        qk_norm=a.qk_norm,
        attn_output_gate=a.gate,
        no_mixer_layers=no_mixer,
        no_ffn_layers=no_ffn,
        block_pattern=_block_order(reads, parallel),
        sliding_window=window,
        sliding_window_layers=n_sliding,
        max_position=max_pos,
        mtp_layers=_cfg_int(tc, ("num_nextn_predict_layers", "mtp_num_layers", "num_mtp_layers")),
        vision_params=vision,
        audio_params=audio,
    )
    if a.mla:
        f["q_lora_rank"], f["kv_lora_rank"], f["qk_nope_head_dim"], f["qk_rope_head_dim"], f["v_head_dim"] = (
            a.mla
        )
        f["kv_heads"] = _cfg_int(tc, ("num_key_value_heads",)) or a.heads
        if a.heads % f["kv_heads"]:
            f["kv_heads"] = a.heads
    warnings = [
        f"{OWN_CODE}: {how}, from its modules' shapes (a parallel attention+MLP block does not show "
        "in shapes: TP communication is costed as for sequential sub-layers, an upper bound)"
    ]
    if vision or audio:
        warnings.append(
            "vision/audio towers counted apart by the class's own modules; the text decoder alone is costed"
        )
    if ign:
        total_ign = sum(ign.values())
        top = sorted(ign.items(), key=lambda kv: -kv[1])[:4]
        warnings.append(
            f"not costed: {total_ign:,} parameters no ModelSpec part holds ("
            + ", ".join(f"{k} {v:,}" for k, v in top)
            + (", ..." if len(ign) > 4 else "")
            + ")"
        )
    warnings += notes
    f["warnings"] = tuple(warnings)
    spec = build(f)
    _check_layers(spec, reads, where)
    return spec


def _check_layers(spec: Any, reads: list[_Layer], where: list[str]) -> None:
    """Each layer's mapped parameters are what ModelSpec's formulas give for its parts."""
    for r in reads:
        if r.recurrent is not None:
            want_rec = (
                spec.mamba_params_per_layer
                if r.recurrent[0] == "mamba"
                else spec.linear_attn_params_per_layer
            )
            if r.recurrent_params != want_rec:
                raise _refuse(
                    f"{where[r.index]}: the {r.recurrent[0]} mixer holds {r.recurrent_params:,} parameters, "
                    f"ModelSpec's formula {want_rec:,}"
                )
        if r.attn is not None and r.attn_params != spec.attn_params_per_layer:
            raise _refuse(
                f"{where[r.index]}: attention holds {r.attn_params:,} mapped parameters, ModelSpec's "
                f"formula {spec.attn_params_per_layer:,} ({r.attn.describe()})"
            )
        want = {"mlp": spec.dense_mlp_params, "moe": spec.moe_ffn_params, "none": 0}[r.ffn]
        if r.ffn_params != want:
            raise _refuse(
                f"{where[r.index]}: the feed-forward part holds {r.ffn_params:,} mapped parameters, "
                f"ModelSpec's formula {want:,}"
            )
