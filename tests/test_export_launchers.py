"""Exports read by the launchers' own code at their current releases (issue 25, item 1).

* Megatron Bridge: a recipe that sets its own pipeline split (llama31_405b_pretrain_config sets
  ``account_for_embedding/loss_in_pipeline_split=True``) with the exported overrides applied on
  top. Megatron-Bridge 0.3.1 does not import on a CPU-only Python 3.11 install (it needs
  transformer_engine, and mamba-ssm does not build), so the check is the one its ConfigContainer
  runs: ``cfg.model`` is a Megatron-Core TransformerConfig subclass whose ``__post_init__``
  (run again on every override) refuses the two split forms together; the layers each pipeline
  rank builds come from Megatron-Core's ``get_num_layers_to_build``.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

import pytest

from autopar.export import Job, export
from autopar.layout import Layout

LLAMA31_405B_LAYERS = 126


def _bridge_model_overrides(text: str) -> dict[str, Any]:
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#")).replace("\\\n", " ")
    out: dict[str, Any] = {}
    for tok in shlex.split(body):
        key, _, raw = tok.partition("=")
        if not key.startswith("model."):
            continue
        v: Any = {"null": None, "true": True, "false": False}.get(raw, raw)
        if isinstance(v, str) and v.isdigit():
            v = int(v)
        out[key.removeprefix("model.")] = v
    return out


def _transformer_fields(o: dict[str, Any]) -> dict[str, Any]:
    """The ``model.*`` overrides that are TransformerConfig fields; the rest must be fields of
    Bridge's GPTModelProvider (a TransformerConfig subclass) that TransformerConfig lacks."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    assert set(o) - names <= {"seq_length"}, sorted(set(o) - names)
    return {k: v for k, v in o.items() if k in names}


def _recipe_405b(**kw: Any) -> Any:
    """The parallel and split fields llama31_405b_pretrain_config (Bridge 0.3.1) sets, on a small
    hidden size (the split checks do not look at it)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(
        num_layers=LLAMA31_405B_LAYERS,
        hidden_size=256,
        num_attention_heads=8,
        tensor_model_parallel_size=8,
        pipeline_model_parallel_size=8,
        virtual_pipeline_model_parallel_size=2,
        context_parallel_size=4,
        sequence_parallel=True,
        pipeline_dtype=torch.bfloat16,
        params_dtype=torch.bfloat16,
        bf16=True,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    base.update(kw)
    return TransformerConfig(**base)


@pytest.mark.parametrize(
    ("vpp", "stages", "form"),
    [
        (1, [15, 16, 16, 16, 16, 16, 16, 15], "num_layers_in_first_pipeline_stage"),
        (2, [15, 16, 16, 16, 16, 16, 16, 15], "account_for_embedding_in_pipeline_split"),
        (1, [14, 16, 16, 16, 16, 16, 16, 16], "num_layers_in_first_pipeline_stage"),
        (1, [16] * 7 + [14], "num_layers_in_last_pipeline_stage"),
        (2, [16] * 7 + [14], "num_layers_in_last_pipeline_stage"),
    ],
)
def test_bridge_405b_recipe_accepts_the_uneven_export(vpp: int, stages: list[int], form: str) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    n = sum(stages)
    layout = Layout(tp=8, pp=8, vpp=vpp, cp=4, dp=4, sp=True, zero=1, micro_batch=1, grad_accum=128)
    middle = stages[1:-1]
    first = stages[0] if stages[0] != middle[0] else 0
    last = stages[-1] if stages[-1] != middle[0] else 0
    layout = layout.model_copy(update={"first_stage_layers": first, "last_stage_layers": last})
    job = Job(model="llama3.1-405b", num_devices=1024, seq_len=8192, global_batch=512, num_layers=n)
    o = _bridge_model_overrides(export(layout, "megatron_bridge", job))
    assert o[form] not in (None, False), o  # the form the scored layout needs
    recipe = _recipe_405b(num_layers=n)
    cfg = dataclasses.replace(recipe, **_transformer_fields(o))  # __post_init__ again, as in finalize()
    built = [sum(get_num_layers_to_build(cfg, vp_stage=v, pp_rank=r) for v in range(vpp)) for r in range(8)]
    assert built == stages


def test_bridge_even_export_clears_the_recipe_split() -> None:
    """An even layout scored without the recipe's lighter end stages must not inherit them."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    layout = Layout(tp=8, pp=9, cp=4, dp=4, sp=True, zero=1, micro_batch=1, grad_accum=128)
    job = Job(model="llama3.1-405b", num_devices=1152, seq_len=8192, global_batch=512, num_layers=126)
    o = _bridge_model_overrides(export(layout, "megatron_bridge", job))
    cfg = dataclasses.replace(_recipe_405b(), **_transformer_fields(o))
    assert [get_num_layers_to_build(cfg, pp_rank=r) for r in range(9)] == [14] * 9


def test_bridge_without_the_fix_is_refused_by_megatron_core() -> None:
    """The check can fail: the recipe's split plus first/last stage layers is refused."""
    pytest.importorskip("megatron.core")
    with pytest.raises((AssertionError, ValueError), match="account_for"):
        _recipe_405b(
            virtual_pipeline_model_parallel_size=None,
            num_layers_in_first_pipeline_stage=15,
            num_layers_in_last_pipeline_stage=15,
        )
