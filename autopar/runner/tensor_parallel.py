"""Tensor (Megatron-style) and sequence parallelism with DTensor ``parallelize_module`` plans.

Follows torchtitan's ``apply_tp``: column-parallel q/k/v and w1/w3, row-parallel wo and w2; with
sequence parallelism the norms run on sequence shards (``SequenceParallel``) and the row-parallel
outputs are reduce-scattered back to ``Shard(1)``. The LM head all-gathers full logits (no loss
parallel), so the loss is the same code on every layout.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autopar.runner.model import MoE, Transformer


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, *, sequence_parallel: bool, expert_tp: bool) -> None:
    """Shard ``model`` (a whole model or one pipeline stage of it) over ``tp_mesh`` in place.

    ``expert_tp``: shard each MoE expert's SwiGLU like a dense MLP (etp = tp); otherwise the experts
    stay replicated on the TP ranks (etp = 1) and each TP rank computes all of them.
    """
    sp = sequence_parallel
    seq = Shard(1) if sp else Replicate()
    root_plan: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        root_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.norm is not None and sp:
        root_plan["norm"] = SequenceParallel()
    if model.output is not None:
        root_plan["output"] = ColwiseParallel(
            input_layouts=seq, output_layouts=Replicate(), use_local_output=True
        )
    if root_plan:
        parallelize_module(model, tp_mesh, root_plan)

    for block in model.layers.values():
        plan: dict[str, ParallelStyle] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
        }
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
            plan["attention"] = PrepareModuleInput(
                input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
            )
        ffn = block.feed_forward
        if isinstance(ffn, MoE):
            # The router and the top-k combine work on the full (replicated) token set; each expert
            # is a small row/column-parallel MLP whose output is all-reduced, and the MoE output is
            # re-sharded on the sequence for the residual stream.
            if sp:
                plan["feed_forward"] = PrepareModuleInputOutput(
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Replicate(),),
                    use_local_input=True,
                    output_layouts=(Replicate(),),
                    desired_output_layouts=(Shard(1),),
                    use_local_output=True,
                )
            if expert_tp:
                for i in range(len(ffn.experts)):
                    plan[f"feed_forward.experts.{i}.w1"] = ColwiseParallel()
                    plan[f"feed_forward.experts.{i}.w3"] = ColwiseParallel()
                    plan[f"feed_forward.experts.{i}.w2"] = RowwiseParallel(output_layouts=Replicate())
        else:
            if sp:
                plan["feed_forward"] = PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                )
            plan["feed_forward.w1"] = ColwiseParallel()
            plan["feed_forward.w3"] = ColwiseParallel()
            plan["feed_forward.w2"] = RowwiseParallel(output_layouts=seq)
        parallelize_module(block, tp_mesh, plan)
