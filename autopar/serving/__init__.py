"""Serving: per-instance memory and latency (``estimate``) and the layout search under latency targets
(``search``: aggregated and disaggregated pools, Pareto front, fewest devices for a rate)."""
