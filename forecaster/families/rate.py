"""A constant rate, mildly weighted towards recent days: the last-resort fallback and the sanity floor.

The half-life is long on purpose: for sparse series a stable level beats a reactive one, and the
reactive choice (``intermittent``) is a separate family the backtest can pick.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from forecaster._calendar import WEEK_MIN
from forecaster._history import History
from forecaster.families._base import Failure, Family, Params, recency_weights

__all__ = ["Rate"]


class Rate(Family):
    alias = "rate"

    def __init__(self, half_life_days: float = 7.0) -> None:
        self.half_life_days = half_life_days

    def fit(self, history: History) -> list[Params | Failure]:
        weights = recency_weights(history.minutes, self.half_life_days)
        seen = ~np.isnan(history.counts)
        exposure = (seen * weights).sum(axis=1)
        total = (np.nan_to_num(history.counts) * weights).sum(axis=1)
        out: list[Params | Failure] = []
        for e, s in zip(exposure, total, strict=True):
            out.append({"rate": float(s / e)} if e > 0 else Failure("no observed minutes"))
        return out

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        return np.full(WEEK_MIN, max(0.0, float(params["rate"])))
