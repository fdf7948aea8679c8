"""Reference runner: train a small Llama-style model under a :class:`~autopar.layout.Layout` with
PyTorch-native parallelism (DTensor TP/SP, FSDP2, pipelining, activation checkpointing) and measure
step time, peak memory and loss; gloo on CPU, NCCL on GPU.

``run_layout``/``run_layouts`` launch torchrun without importing torch in the caller; the modules
that apply the parallelism (``tensor_parallel``, ``data_parallel``, ``pipeline_parallel``,
``activation_checkpoint``, ``parallelize``) and ``train`` import it.
"""

from autopar.runner.checks import check_device_support, check_layout
from autopar.runner.config import RunnerModelConfig
from autopar.runner.launch import run_layout, run_layouts

__all__ = ["RunnerModelConfig", "check_device_support", "check_layout", "run_layout", "run_layouts"]
