"""The block order a config states, as ``ModelSpec.block_pattern``: shared by the field-driven reader
(:mod:`autopar.model`) and the own-code reader (:mod:`autopar.own_code`). No autopar imports."""

from __future__ import annotations

_MIXER_CODE = {"attention": "a", "linear": "l", "mamba": "m", "none": "-"}


def block_pattern(mix: list[str], ffn: list[str], moe: list[bool]) -> str:
    """ModelSpec.block_pattern of the blocks as read, where the order matters: hybrid stacks and
    MoE layers that are neither every layer nor every layer after a dense prefix (the split of
    such a prefix is already exact: ``autopar.memory.dense_moe``). Empty otherwise."""
    kinds = ["-" if f == "none" else ("e" if m else "d") for f, m in zip(ffn, moe, strict=True)]
    hybrid = any(x != "attention" for x in mix) or "-" in kinds
    n_moe = kinds.count("e")
    prefix = n_moe == 0 or all(k == "e" for k in kinds[len(kinds) - n_moe :])
    if not hybrid and prefix:
        return ""
    return "".join(_MIXER_CODE[m] + k for m, k in zip(mix, kinds, strict=True))
