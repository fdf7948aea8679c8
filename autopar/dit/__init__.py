"""Diffusion transformers (DiT): model spec, training and denoising-inference layouts.

``spec`` normalizes a model (preset or diffusers ``config.json``) into parameter counts, tokens per
sample and FLOPs; ``inference`` and ``training`` cost layouts over whole candidate arrays with the
LLM path's device profiles, GEMM model and collectives.
"""
