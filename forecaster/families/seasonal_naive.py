"""Seasonal naive: the same minute of recent days (``daily``) or of the same weekday (``weekly``).

Strict seasonal naive (one season back) is far too noisy on per-minute counts, so the profile is the
mean of the last few seasons, box-smoothed over a few minutes; that is still "what happened at this
time last time", the method every other family has to beat.
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import numpy.typing as npt

from forecaster._codec import decode_array, encode_array
from forecaster._history import History
from forecaster.families._base import Failure, Family, Params, circular_smooth, tile_days

__all__ = ["SeasonalNaive"]


class SeasonalNaive(Family):
    def __init__(
        self, period: Literal["daily", "weekly"] = "daily", seasons: int = 3, radius: int = 2
    ) -> None:
        self.period = period
        self.seasons = seasons
        self.radius = radius
        self.alias = f"seasonal_naive_{period}"

    def eligible(self, history: History, share: float = 1.0) -> npt.NDArray[np.bool_]:
        # A weekly profile needs at least one of each weekday before it means anything.
        enough = self.period == "daily" or history.minutes >= 7 * 1440
        return np.full(len(history.models), enough, dtype=bool)

    def fit(self, history: History) -> list[Params | Failure]:
        days, weekday = history.by_day()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices are expected and handled
            overall = np.nanmean(days, axis=1)  # (n, 1440)
            if self.period == "daily":
                profile = _fill(np.nanmean(days[:, -self.seasons :], axis=1), overall)
            else:
                profile = np.empty((days.shape[0], 7, days.shape[2]))
                for w in range(7):
                    rows = np.flatnonzero(weekday == w)[-self.seasons :]
                    same_kind = np.flatnonzero((weekday >= 5) == (w >= 5))
                    kind = (
                        _fill(np.nanmean(days[:, same_kind], axis=1), overall) if same_kind.size else overall
                    )
                    own = np.nanmean(days[:, rows], axis=1) if rows.size else np.full_like(overall, np.nan)
                    profile[:, w] = _fill(own, kind)
        profile = circular_smooth(np.nan_to_num(profile, nan=0.0), self.radius)
        seen = (
            ~np.all(np.isnan(history.counts), axis=1)
            if history.minutes
            else np.zeros(len(history.models), bool)
        )
        return [
            {"profile": encode_array(profile[i])} if seen[i] else Failure("no observed minutes")
            for i in range(len(history.models))
        ]

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        return np.maximum(tile_days(decode_array(params["profile"])), 0.0)


def _fill(values: npt.NDArray[np.float64], fallback: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.where(np.isnan(values), fallback, values)
