"""Periodic-event detector for cron-like series: spikes at a fixed minute of the day or of every hour.

For each kind of day (weekday, weekend) and each minute of the day, it measures how often the minute
had any request and the mean count. Minutes that fire on at least ``min_fire`` of the days of that kind,
far above the background, are spikes (a 09:00 weekday job, or minute 17 of every hour in working hours:
both are just sets of minutes of the day). Everything else is one background rate per kind of day.
The saved parameters are the spike list itself, readable by a person.
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt

from forecaster._calendar import DAY_MIN, WEEK_MIN, day_kind
from forecaster._history import History
from forecaster.families._base import Failure, Family, Params

__all__ = ["PeriodicEvent"]


class PeriodicEvent(Family):
    alias = "periodic_event"

    def __init__(
        self, min_fire: float = 0.5, min_days: int = 2, contrast: float = 20.0, min_count: float = 0.75
    ) -> None:
        self.min_fire, self.min_days, self.contrast, self.min_count = min_fire, min_days, contrast, min_count

    def fit(self, history: History) -> list[Params | Failure]:
        days, weekday = history.by_day()
        kinds = day_kind(weekday)
        n = days.shape[0]
        fire = np.zeros((n, 2, DAY_MIN))
        mean = np.zeros((n, 2, DAY_MIN))
        count = np.zeros((n, 2, DAY_MIN))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for k in (0, 1):
                rows = days[:, kinds == k]
                count[:, k] = (~np.isnan(rows)).sum(axis=1)
                fired = np.where(np.isnan(rows), np.nan, rows > 0)
                fire[:, k] = np.nan_to_num(np.nanmean(fired, axis=1))
                mean[:, k] = np.nan_to_num(np.nanmean(rows, axis=1))
        out: list[Params | Failure] = []
        for i in range(n):
            if count[i].sum() == 0:
                out.append(Failure("no observed minutes"))
                continue
            background = [0.0, 0.0]
            spikes: list[list[float]] = []
            own = [self._own_spikes(fire[i, k], mean[i, k], count[i, k]) for k in (0, 1)]
            for k in (0, 1):
                seen = count[i, k] > 0
                if not seen.any():
                    background[k] = float("nan")
                    continue
                # A minute that is a schedule on the other kind of day needs less evidence here: with two
                # weekend days in a fortnight, "fired on one of them" is all the evidence there is.
                is_spike = own[k] | (own[1 - k] & seen & (fire[i, k] >= self.min_fire))
                quiet = seen & ~is_spike
                background[k] = float(mean[i, k][quiet].mean()) if quiet.any() else 0.0
                spikes += [[k, int(m), float(mean[i, k, m])] for m in np.flatnonzero(is_spike)]
            # A kind of day never observed borrows the other kind's background (but none of its spikes).
            background = [
                b if not np.isnan(b) else next(x for x in background if not np.isnan(x)) for b in background
            ]
            out.append({"background": background, "spikes": spikes})
        return out

    def _own_spikes(
        self, fire: npt.NDArray[np.float64], mean: npt.NDArray[np.float64], count: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.bool_]:
        seen = count > 0
        if not seen.any():
            return np.zeros(fire.shape, dtype=bool)
        base_fire = float(np.median(fire[seen]))
        return np.asarray(
            seen
            & (count >= self.min_days)
            & (fire >= self.min_fire)
            & (fire >= self.contrast * max(base_fire, 1e-3))
            # A lone request on one of two weekend days is a coincidence, not a schedule.
            & (mean >= self.min_count),
            dtype=bool,
        )

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        table = np.empty((7, DAY_MIN))
        background = [max(0.0, float(b)) for b in params["background"]]
        for w in range(7):
            table[w] = background[int(w >= 5)]
        for kind, minute, value in params["spikes"]:
            for w in range(7):
                if int(w >= 5) == int(kind):
                    table[w, int(minute)] = max(0.0, float(value))
        return table.reshape(WEEK_MIN)
