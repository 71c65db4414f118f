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
    return filled.reshape(len(history.models), -1, _BUCKET).sum(axis=2), start


def busy(history: History, min_rate: float, min_days: float) -> npt.NDArray[np.bool_]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rate = (
            np.nan_to_num(np.nanmean(history.counts[:, -DAY_MIN * 3 :], axis=1)) if history.minutes else None
        )
    if rate is None:
        return np.zeros(len(history.models), dtype=bool)
    observed = (~np.isnan(history.counts)).sum(axis=1)
    return np.asarray((rate >= min_rate) & (observed >= min_days * DAY_MIN), dtype=bool)


class ETS(Family):
    alias = "ets"

    def __init__(self, min_rate: float = 0.2, days: int = 7) -> None:
        self.min_rate, self.days = min_rate, days

    def eligible(self, history: History) -> npt.NDArray[np.bool_]:
        return busy(history, self.min_rate, 4)

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
                    ).fit()
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
