"""Search over training layouts: spaces, legal-only enumeration, exhaustive scoring (``recommend``),
uneven pipeline splits, persistent Optuna studies, sweeps, and the Ray back-end that spreads them."""
