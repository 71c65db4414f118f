"""What the statsmodels families (ETS, MSTL) share: half-hour buckets, busy series only, one fit per series.

statsmodels fits one series at a time and costs tens of milliseconds per series even downsampled, so
these families run on 30-minute buckets of the last ``days`` days and are only offered for busy series
(``eligible``), where a smooth level-plus-season model can win. A family supplies the fit of one series;
the loop, the "two days at least" rule and the translation of statsmodels' errors into ``Failure`` are
here. Parameters hold one rate per half-hour slot; within a slot the rate is spread evenly.
"""

from __future__ import annotations

import math
import warnings
from abc import abstractmethod
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from forecaster._calendar import DAY_MIN, minute_index
from forecaster._codec import encode_array
from forecaster._history import History
from forecaster.families._base import Failure, Family, Params

__all__ = ["BUCKET", "PER_DAY", "PER_WEEK", "Bucketed"]

BUCKET = 30  # minutes
PER_DAY = DAY_MIN // BUCKET
PER_WEEK = 7 * PER_DAY


def bucketed(history: History, days: int) -> tuple[npt.NDArray[np.float64], int]:
    """Per-bucket counts (``(n, buckets)``, gaps filled with the series' mean) of the last ``days`` days,
    ending at the origin, and the epoch seconds of the first bucket."""
    usable = min(history.minutes, days * DAY_MIN) // BUCKET * BUCKET
    tail = history.counts[:, history.minutes - usable :]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fill = np.nan_to_num(np.nanmean(tail, axis=1))
    filled = np.where(np.isnan(tail), fill[:, None], tail)
    start = history.end - 60 * usable
    return filled.reshape(len(history.models), usable // BUCKET, BUCKET).sum(axis=2), start


def busy(history: History, min_rate: float, min_days: float, max_series: int) -> npt.NDArray[np.bool_]:
    """The ``max_series`` busiest series of at least ``min_rate`` per minute with ``min_days`` of data.

    The cap bounds the cost of the per-series statsmodels fits on a retrain of thousands of models;
    busy series are where a smooth level-plus-season model can beat the cheaper families."""
    n = len(history.models)
    if not history.minutes:
        return np.zeros(n, dtype=bool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rate = np.nan_to_num(np.nanmean(history.counts[:, -DAY_MIN * 3 :], axis=1))
    observed = (~np.isnan(history.counts)).sum(axis=1)
    ok = (rate >= min_rate) & (observed >= min_days * DAY_MIN)
    if ok.sum() > max_series:
        ok &= rate >= np.sort(rate[ok])[-max_series]
    return np.asarray(ok, dtype=bool)


class Bucketed(Family):
    method: ClassVar[str]  # the statsmodels class, named in the failures
    key: ClassVar[str]  # the parameter that holds the per-slot rates

    def __init__(self, min_rate: float = 0.5, days: int = 7, max_series: int = 100) -> None:
        self.min_rate, self.days, self.max_series = min_rate, days, max_series

    def eligible(self, history: History, share: float = 1.0) -> npt.NDArray[np.bool_]:
        # A chunk of a retrain gets its part of the cap: the statsmodels cost of a retrain stays what
        # it was, however the models are split (one chunk, the whole cap: the same as unchunked).
        return busy(history, self.min_rate, 4, max(1, math.ceil(self.max_series * share)))

    @abstractmethod
    def _fit_series(
        self, y: npt.NDArray[np.float64], slots: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        """Expected requests per bucket for each half-hour slot of the family's table (a day or a week),
        from one series of buckets ``y``; ``slots`` is the week slot (weekday, half-hour) of each bucket."""

    def fit(self, history: History) -> list[Params | Failure]:
        series, start = bucketed(history, self.days)
        slots = minute_index(start + 60 * BUCKET * np.arange(series.shape[1])) // BUCKET
        out: list[Params | Failure] = []
        for y in series:
            if y.size < 2 * PER_DAY:
                out.append(Failure(f"{self.method} needs two days of history"))
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    table = self._fit_series(y, slots)
            except Exception as exc:  # statsmodels raises many types; any of them means "use another family"
                out.append(Failure(f"{self.method}: {type(exc).__name__}: {exc}"))
                continue
            if not np.all(np.isfinite(table)):
                out.append(Failure(f"{self.method} produced non-finite values"))
                continue
            out.append({self.key: encode_array(np.maximum(table, 0.0) / BUCKET)})
        return out
