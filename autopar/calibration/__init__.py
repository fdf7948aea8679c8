"""Calibration: microbenchmarks on this machine, least-squares fits of the engine's coefficients, and
validation of predictions against real ``torch.distributed`` runs (with refits)."""
