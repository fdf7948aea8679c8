"""The objectives every search ranks by: one registry, one cost formula, one Pareto front.

Each :class:`Objective` has a name, a direction, a unit, the metric name Optuna records, and a
vectorized value function over result arrays: the engine's (``autopar.engine.evaluate``, for
training) or the serving estimator's records (``autopar.serving``). ``autopar.search.recommend``,
``autopar.search.study``, ``autopar.serving.search`` and ``autopar.whatif.compare`` all read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from autopar.errors import AutoparError

GIB = float(1 << 30)
# Default cloud price of one accelerator-hour (USD), used by the "cost" objective: about the
# on-demand H100 rate of the large GPU clouds in 2025-26. Pass price_per_device_hour for yours.
DEFAULT_PRICE_PER_DEVICE_HOUR = 2.0
J_PER_KWH = 3.6e6


def cost_per_mtok(
    tokens_per_s_per_device: Any,
    price_per_device_hour: float,
    *,
    joules_per_token: Any = 0.0,
    price_per_kwh: float = 0.0,
) -> np.ndarray:
    """USD per million tokens: device time at ``price_per_device_hour`` plus energy at ``price_per_kwh``.

    The one cost formula of autopar (training search, studies, serving search, device comparison).
    """
    tps = np.maximum(np.asarray(tokens_per_s_per_device, dtype=np.float64), 1e-30)
    usd_per_token = price_per_device_hour / 3600.0 / tps + np.asarray(joules_per_token) * (
        price_per_kwh / J_PER_KWH
    )
    return usd_per_token * 1e6


@dataclass(frozen=True)
class Prices:
    """What the value functions need besides the result arrays."""

    tokens_per_step: float = 1.0  # training: tokens per optimizer step (energy per token)
    price_per_device_hour: float = DEFAULT_PRICE_PER_DEVICE_HOUR
    price_per_kwh: float = 0.0


@dataclass(frozen=True)
class Objective:
    name: str
    direction: Literal["minimize", "maximize"]
    unit: str
    metric: str  # the record key and the Optuna metric name
    value: Callable[[Mapping[str, Any], Prices], np.ndarray]

    def key(self, res: Mapping[str, Any], prices: Prices) -> np.ndarray:
        """The value as a quantity to minimize (ranking and Pareto fronts)."""
        v = np.asarray(self.value(res, prices), dtype=np.float64)
        return -v if self.direction == "maximize" else v


def _energy_per_token(r: Mapping[str, Any], p: Prices) -> np.ndarray:
    return np.asarray(r["energy_j_per_step"], dtype=np.float64) / p.tokens_per_step


# Training objectives over ``evaluate``'s arrays (or a scored study trial with the same keys).
TRAINING: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective(
            "throughput",
            "maximize",
            "tokens/s/device",
            "tokens_per_s_per_device",
            lambda r, p: np.asarray(r["tokens_per_s_per_device"], dtype=np.float64),
        ),
        Objective(
            "memory",
            "minimize",
            "GiB/device",
            "memory_gib_per_device",
            lambda r, p: np.asarray(r["memory_bytes"], dtype=np.float64) / GIB,
        ),
        Objective("energy", "minimize", "J/token", "energy_j_per_token", _energy_per_token),
        Objective(
            "cost",
            "minimize",
            "USD/Mtok",
            "cost_usd_per_million_tokens",
            lambda r, p: cost_per_mtok(
                r["tokens_per_s_per_device"],
                p.price_per_device_hour,
                joules_per_token=_energy_per_token(r, p) if p.price_per_kwh else 0.0,
                price_per_kwh=p.price_per_kwh,
            ),
        ),
    )
}
OBJECTIVES: tuple[str, ...] = tuple(TRAINING)

# Serving objectives over the serving search's arrays/records.
SERVING: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective(
            "throughput",
            "maximize",
            "output tokens/s/device",
            "output_tokens_per_s_per_device",
            lambda r, p: np.asarray(r["output_tokens_per_s_per_device"], dtype=np.float64),
        ),
        Objective(
            "interactivity",
            "maximize",
            "output tokens/s/user",
            "output_tokens_per_s_per_user",
            lambda r, p: np.asarray(r["output_tokens_per_s_per_user"], dtype=np.float64),
        ),
        Objective(
            "energy",
            "maximize",
            "output tokens/J",
            "output_tokens_per_joule",
            lambda r, p: np.asarray(r["output_tokens_per_joule"], dtype=np.float64),
        ),
        Objective(
            "cost",
            "minimize",
            "USD/Mtok",
            "cost_per_mtok",
            lambda r, p: cost_per_mtok(r["output_tokens_per_s_per_device"], p.price_per_device_hour),
        ),
    )
}


def pareto_mask(vals: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Non-dominated rows of ``vals`` (n x k, all minimized); of identical rows the lowest id is kept.

    Rows are sorted lexicographically, so a row can only be dominated by an earlier one: for k = 2
    a running minimum of the second column decides, for k > 2 each kept row removes what it
    dominates.
    """
    vals = np.asarray(vals, dtype=np.float64)
    n = len(vals)
    if n == 0:
        return np.zeros(0, dtype=bool)
    order = np.lexsort((ids, *vals.T[::-1]))
    v = vals[order]
    if v.shape[1] == 1:
        keep_sorted = np.zeros(n, dtype=bool)
        keep_sorted[0] = True
    elif v.shape[1] == 2:
        prev = np.minimum.accumulate(v[:, 1])
        keep_sorted = np.empty(n, dtype=bool)
        keep_sorted[0] = True
        keep_sorted[1:] = v[1:, 1] < prev[:-1]
    else:
        alive = np.ones(n, dtype=bool)
        keep_sorted = np.zeros(n, dtype=bool)
        i = 0
        while True:
            idx = np.flatnonzero(alive[i:])
            if not len(idx):
                break
            i += int(idx[0])
            keep_sorted[i] = True
            alive[i] = False
            dominated = np.all(v[i] <= v, axis=1)  # sorted lexicographically: v[i] is not dominated later
            alive &= ~dominated
    keep = np.zeros(n, dtype=bool)
    keep[order[keep_sorted]] = True
    return keep


def pareto_front(vals: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated rows of ``vals`` (all minimized), in lexicographic order."""
    vals = np.asarray(vals, dtype=np.float64)
    ids = np.arange(len(vals))
    keep = np.flatnonzero(pareto_mask(vals, ids))
    return keep[np.lexsort((keep, *vals[keep].T[::-1]))] if len(keep) else keep


@dataclass(frozen=True)
class Objectives:
    """The training objectives of one search (the first ranks), with the prices for "cost"."""

    names: tuple[str, ...] = ("throughput",)
    price_per_device_hour: float = DEFAULT_PRICE_PER_DEVICE_HOUR
    price_per_kwh: float = 0.0

    @classmethod
    def parse(
        cls,
        objective: str | Sequence[str],
        *,
        price_per_device_hour: float = DEFAULT_PRICE_PER_DEVICE_HOUR,
        price_per_kwh: float = 0.0,
    ) -> Objectives:
        names = [objective] if isinstance(objective, str) else list(objective)
        names = [p.strip() for n in names for p in str(n).split(",") if p.strip()]
        if not names:
            raise AutoparError("no objective given", f"use one or more of: {', '.join(OBJECTIVES)}")
        bad = [n for n in names if n not in TRAINING]
        if bad:
            raise AutoparError(
                f"unknown objective {bad[0]!r}", f"use one or more of: {', '.join(OBJECTIVES)}"
            )
        if len(set(names)) != len(names):
            raise AutoparError(f"objective listed twice: {','.join(names)}", "name each objective once")
        if price_per_device_hour < 0 or price_per_kwh < 0:
            raise AutoparError("prices must be >= 0", "pass --price-per-device-hour >= 0")
        return cls(tuple(names), float(price_per_device_hour), float(price_per_kwh))

    @property
    def primary(self) -> str:
        return self.names[0]

    def prices(self, tokens_per_step: float) -> Prices:
        return Prices(float(tokens_per_step), self.price_per_device_hour, self.price_per_kwh)

    def values(self, name: str, res: Mapping[str, Any], tokens_per_step: float) -> np.ndarray:
        """Objective ``name`` as a quantity to minimize, over result arrays."""
        return TRAINING[name].key(res, self.prices(tokens_per_step))

    def report(self, res: Mapping[str, Any], tokens_per_step: float) -> dict[str, float]:
        """Every training objective in its own unit, keyed by metric name (one result row)."""
        p = self.prices(tokens_per_step)
        return {o.metric: float(np.asarray(o.value(res, p)).reshape(-1)[0]) for o in TRAINING.values()}
