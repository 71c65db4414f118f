"""Small histories for forecaster tests: a few models, a couple of weeks, built in milliseconds."""

from __future__ import annotations

import numpy as np

from forecaster import History
from ingest._synthetic import DEFAULT_START

MONDAY = int(DEFAULT_START)  # 2024-01-01T00:00Z


def weekday_spike_history(days: int = 14, minute: int = 9 * 60, size: float = 12.0, seed: int = 0) -> History:
    """One model that fires at ``minute`` of every weekday (and barely otherwise), starting on a Monday."""
    rng = np.random.default_rng(seed)
    rate = np.full(days * 1440, 1e-4)
    for d in range(days):
        if d % 7 < 5:
            rate[d * 1440 + minute] = size
            rate[d * 1440 + minute + 1] = size * 0.3
    return History(["batch/report-0900"], MONDAY, rng.poisson(rate)[None, :].astype(np.float64))
