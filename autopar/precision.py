"""What each training precision of a :class:`autopar.layout.Layout` means physically.

A training precision names the format the transformer blocks' linear-layer GEMMs run in; attention
(softmax and the two batched GEMMs), norms, activations, the embedding and the LM head stay in
bf16 (fp32 for ``fp32``) in every recipe below. Per precision this module gives the device peak
and achieved-efficiency keys of the GEMMs (``DeviceProfile.peak_tflops`` / ``efficiency.gemm``),
the block-scaling traffic of each quantized GEMM input, and the low-precision weight copy kept
next to the bf16 weights.

Recipes (Transformer Engine through Megatron-Core; ``autopar.export.megatron`` writes the flags):

* ``fp8``: per-tensor scaled FP8 (``--fp8-format hybrid``; E4M3 forward, E5M2 gradients).
* ``mxfp8``: MX block-scaled FP8 (``--fp8-format e4m3 --fp8-recipe mxfp8``; Megatron-Bridge
  ``bf16_with_mxfp8_mixed``). TE docs, "MXFP8": E4M3 values, one E8M0 (power-of-two) scale per
  32 consecutive values, 1-D blocks along the GEMM's contraction dimension, Blackwell (SM 10.0+)
  only. Because the blocks follow the contraction dimension, the forward (X·Wᵀ) and the
  weight-gradient (Xᵀ·dY) GEMMs need differently blocked copies of X and dY: TE's quantizer writes
  a rowwise and a columnwise copy of each (TE ``MXFP8Quantizer(rowwise=True, columnwise=True)``).
  Runs at the fp8 tensor-core peak.
* ``nvfp4``: NVFP4 (``--fp4-format e2m1 --fp4-recipe nvfp4``; Megatron-Bridge
  ``bf16_with_nvfp4_mixed``; TE ``NVFP4BlockScaling``). NVIDIA, "Pretraining Large Language Models
  with NVFP4" (arXiv 2509.25149, 2025): E2M1 values, one E4M3 scale per 16 values plus one FP32
  per-tensor scale (two-level scaling, so the tensor's global amax is needed before quantizing:
  one extra read pass), 16x16 2-D blocks for weights and 1x16 for activations and gradients, a
  16x16 random Hadamard transform on the weight-gradient GEMM's inputs (fused into that
  quantization pass), stochastic rounding for gradients; all three GEMMs of a linear layer (Fprop,
  Dgrad, Wgrad) run in FP4 (paper Sec. 4). Runs at the fp4 tensor-core peak. The paper also keeps
  about 15% of the linear layers (mostly the last blocks) in bf16; Megatron-Core's
  ``first_last_layers_bf16`` that does so defaults to False and Bridge's recipe leaves it off, so
  the layout precision quantizes every transformer block, as the exported command does.

GEMM efficiency: no published max-achievable-matmul figure for block-scaled GEMMs exists in the
device data (``studies/data/hardware.md`` [S16] measures bf16 and per-tensor fp8 only), so both
block-scaled formats take the device's fp8 efficiency (the profiles' fp4 entry is an unsourced
"a little below fp8" estimate, not better founded).
"""

from __future__ import annotations

# Device peak (``peak_tflops`` key) of each layout precision's GEMMs.
PEAK_KEY: dict[str, str] = {
    "bf16": "bf16",
    "fp8": "fp8",
    "fp16": "fp16",
    "fp32": "fp32",
    "mxfp8": "fp8",
    "nvfp4": "fp4",
}
# Achieved-efficiency key (``efficiency.gemm``): the fp8 one for both block-scaled formats (above).
EFFICIENCY_KEY: dict[str, str] = {**PEAK_KEY, "nvfp4": "fp8"}

# Device peaks (``peak_tflops`` keys) a precision needs. MX/NV block-scaled MMA arrived with the
# FP4-capable tensor cores (Blackwell SM 10.0 ``tcgen05`` block-scaled MMA; TE: MXFP8 "on Blackwell
# GPUs (SM 10.0+)"): Hopper has an fp8 peak but cannot run mxfp8, so mxfp8 needs fp4 too.
REQUIRES: dict[str, tuple[str, ...]] = {"fp8": ("fp8",), "mxfp8": ("fp8", "fp4"), "nvfp4": ("fp4",)}

# Precisions whose GEMMs run in a narrow format that TE quantizes per GEMM input.
BLOCK_SCALED: tuple[str, ...] = ("mxfp8", "nvfp4")
LOW_PRECISION: tuple[str, ...] = ("fp8", *BLOCK_SCALED)

_BF16 = 2.0  # bytes of the bf16 tensor a quantizer reads


def _quantized_bytes(value_bits: float, block: int, scale_bytes: float) -> float:
    """Bytes per element of one quantized copy: the values plus their share of the block scale."""
    return value_bits / 8.0 + scale_bytes / block


# HBM bytes moved per element of a GEMM input that the recipe quantizes (read the bf16 tensor,
# write the low-precision copies and their scales; nvfp4 first reads it once more for the global
# amax of its two-level scaling). Both recipes write a rowwise and a columnwise copy (module doc).
QUANT_BYTES_PER_ELEMENT: dict[str, float] = {
    "mxfp8": _BF16 + 2 * _quantized_bytes(8, 32, 1.0),  # 2 + 2 * (1 + 1/32) = 4.0625
    "nvfp4": 2 * _BF16 + 2 * _quantized_bytes(4, 16, 1.0),  # 4 + 2 * (0.5 + 1/16) = 5.125
}

# Bytes per weight of the persistent low-precision copy TE keeps next to the bf16 weights
# (rowwise + columnwise, with scales): the quantized weight cached across micro-batches
# (``is_first_microbatch``) and saved for the backward. Megatron's fp32 main weights and bf16
# model weights are in the framework's memory profile already.
WEIGHT_COPY_BYTES: dict[str, float] = {
    "mxfp8": 2 * _quantized_bytes(8, 32, 1.0),  # 2.0625
    "nvfp4": 2 * _quantized_bytes(4, 16, 1.0),  # 1.125
}


def scaling_bytes(q, m, n, k, micro_batches=1.0):
    """(forward, backward) HBM bytes of block-scaling one GEMM ``[m, k] x [k, n]`` (m tokens).

    ``q``: bytes per quantized element (:data:`QUANT_BYTES_PER_ELEMENT`; 0 without block scaling).
    Forward quantizes the activation ``X`` (m·k); the backward the output gradient ``dY`` (m·n),
    which feeds both the Dgrad and the Wgrad GEMM (the two copies above). The weight (n·k) is
    quantized once per step and cached for the other micro-batches (Megatron-Core's TE layers pass
    ``is_first_microbatch``), so one micro-batch carries 1/``micro_batches`` of it.
    """
    return q * (m * k + n * k / micro_batches), q * (m * n)
