"""The no-training forecast: each model's request rate of the last hour, held flat over the horizon.

It is what the scheduler plans with for a model the trained forecaster does not cover (a fresh install,
MLflow unreachable, a model added since the last retrain). It is not one of ``FAMILIES``: a family is
fitted on weeks of history by the daily retrain, compiled into a weekly table and chosen per model by
the backtest, whereas this forecast has nothing to fit or select — it reads the last hour's counts at
planning time. Its forecasts carry ``family="recent_rate"`` so that a reader can tell them apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from forecaster._types import ModelForecast

__all__ = ["RECENT_RATE", "recent_rate_forecasts"]

RECENT_RATE = "recent_rate"
"""The ``family`` of a recent-rate forecast."""


def recent_rate_forecasts(
    counts: Mapping[str, Sequence[float] | npt.NDArray[np.float64]],
    now: float,
    *,
    count_step_s: int = 60,
    bucket_s: int = 60,
    horizon_s: int = 7200,
    recent_steps: int = 10,
) -> dict[str, ModelForecast]:
    """Flat Poisson forecasts from per-step request counts of the last hour (oldest first).

    The rate blends the whole look-back with its last ``recent_steps`` steps, so a model that just
    started being used is forecast promptly but one burst does not dominate. Models without a request
    in ``counts`` get no forecast.
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
            family=RECENT_RATE,
            daily_requests=rate * 86400.0 / count_step_s,
        )
    return out
