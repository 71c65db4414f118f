"""Holt-Winters exponential smoothing (statsmodels ``ExponentialSmoothing``) with a daily season.

Fitted on 30-minute buckets of the last week only: statsmodels fits one series at a time and costs tens
of milliseconds per series even downsampled, so it is only offered for busy series (``eligible``), where
a smooth level-plus-season model can win. The next day's forecast, clipped at zero, becomes the daily
profile; within a bucket the rate is spread evenly.
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt

from forecaster._calendar import DAY_MIN, WEEK_MIN, minute_index
from forecaster._codec import decode_array, encode_array
from forecaster._history import History
from forecaster.families._base import Failure, Family, Params

__all__ = ["ETS", "bucketed"]

_BUCKET = 30
_PER_DAY = DAY_MIN // _BUCKET


def bucketed(history: History, days: int) -> tuple[npt.NDArray[np.float64], int]:
    """Per-bucket counts (``(n, buckets)``, gaps filled with the series' mean) of the last ``days`` days,
    ending at the origin, and the epoch seconds of the first bucket."""
    usable = min(history.minutes, days * DAY_MIN) // _BUCKET * _BUCKET
    tail = history.counts[:, history.minutes - usable :]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fill = np.nan_to_num(np.nanmean(tail, axis=1))
    filled = np.where(np.isnan(tail), fill[:, None], tail)
    start = history.end - 60 * usable
    return filled.reshape(len(history.models), usable // _BUCKET, _BUCKET).sum(axis=2), start


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


class ETS(Family):
    alias = "ets"

    def __init__(self, min_rate: float = 0.5, days: int = 7, max_series: int = 100) -> None:
        self.min_rate, self.days, self.max_series = min_rate, days, max_series

    def eligible(self, history: History) -> npt.NDArray[np.bool_]:
        return busy(history, self.min_rate, 4, self.max_series)

    def fit(self, history: History) -> list[Params | Failure]:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        series, start = bucketed(history, self.days)
        out: list[Params | Failure] = []
        for y in series:
            if y.size < 2 * _PER_DAY:
                out.append(Failure("ETS needs two days of history"))
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fitted = ExponentialSmoothing(
                        y,
                        trend=None,
                        seasonal="add",
                        seasonal_periods=_PER_DAY,
                        initialization_method="heuristic",
                    ).fit(use_brute=False)  # the brute-force start grid costs 4x, rarely changes the fit
                    ahead = np.asarray(fitted.forecast(_PER_DAY), dtype=np.float64)
            except Exception as exc:  # statsmodels raises many types; any of them means "use another family"
                out.append(Failure(f"ExponentialSmoothing: {type(exc).__name__}: {exc}"))
                continue
            if not np.all(np.isfinite(ahead)):
                out.append(Failure("ExponentialSmoothing produced non-finite forecasts"))
                continue
            # Rotate so that slot 0 is 00:00 UTC, whatever time of day the history ended at.
            first_slot = int(minute_index([history.end])[0] % DAY_MIN) // _BUCKET
            profile = np.roll(np.maximum(ahead, 0.0), first_slot) / _BUCKET
            out.append({"profile30": encode_array(profile)})
        del start
        return out

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        profile = decode_array(params["profile30"])
        return np.tile(np.repeat(profile, _BUCKET), 7)[:WEEK_MIN]
