"""Signals the planner needs when no forecaster is trained: recent demand, read from the demand store.

A model requested within ``demand_window_s`` is wanted now (a request is probably waiting for it); a
model's recent rate, held flat over the horizon, is the fallback forecast. Both are pure functions of
what the store returned, so the runtime's I/O stays in one call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from forecaster import ModelForecast
from prewarm import DEMAND_SOURCE, Hint

__all__ = ["demand_hints", "rate_forecasts"]

FAMILY = "recent_rate"


def demand_hints(last_requests: Mapping[str, float], now: float, window_s: float) -> list[Hint]:
    """A demand hint for each model requested in the last ``window_s`` seconds."""
    hints = []
    for model, ts in sorted(last_requests.items()):
        if 0 <= now - ts <= window_s:
            hints.append(
                Hint(model=model, eta_s=0.0, ttl_s=window_s, source=DEMAND_SOURCE, received_at=min(ts, now))
            )
    return hints


def rate_forecasts(
    counts: Mapping[str, Sequence[float]],
    now: float,
    *,
    count_step_s: int = 60,
    bucket_s: int = 60,
    horizon_s: int = 7200,
    recent_steps: int = 10,
) -> dict[str, ModelForecast]:
    """Flat Poisson forecasts from per-step request counts of the last hour (oldest first).

    The rate blends the whole look-back with its last ``recent_steps`` steps, so a model that just
    started being used is forecast promptly but one burst does not dominate.
    """
    start = math.floor(now / bucket_s) * bucket_s
    buckets = max(1, horizon_s // bucket_s)
    out: dict[str, ModelForecast] = {}
    for model, series in counts.items():
        values = np.asarray(series, dtype=np.float64)
        if values.size == 0 or values.sum() <= 0:
            continue
        rate = 0.5 * values.mean() + 0.5 * values[-recent_steps:].mean()  # requests per count step
        expected = np.full(buckets, rate * bucket_s / count_step_s)
        out[model] = ModelForecast(
            model=model,
            start=float(start),
            bucket_s=bucket_s,
            expected=expected,
            p_any=1.0 - np.exp(-expected),
            family=FAMILY,
        )
    return out
