"""MSTL (statsmodels): trend plus daily and, with two weeks of data, weekly seasonal components.

Like ETS it runs on 30-minute buckets and only for busy series. The forecast is the trend level at the
origin plus the last cycle of each seasonal component, which makes it weekly-periodic by construction:
exactly what a week table holds.
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt

from forecaster._calendar import DAY_MIN, minute_index
from forecaster._codec import decode_array, encode_array
from forecaster._history import History
from forecaster.families._base import Failure, Family, Params
from forecaster.families.ets import bucketed, busy

__all__ = ["MSTLFamily"]

_BUCKET = 30
_PER_DAY = DAY_MIN // _BUCKET
_PER_WEEK = 7 * _PER_DAY


class MSTLFamily(Family):
    alias = "mstl"

    def __init__(self, min_rate: float = 0.5, days: int = 14, max_series: int = 100) -> None:
        self.min_rate, self.days, self.max_series = min_rate, days, max_series

    def eligible(self, history: History) -> npt.NDArray[np.bool_]:
        return busy(history, self.min_rate, 4, self.max_series)

    def fit(self, history: History) -> list[Params | Failure]:
        from statsmodels.tsa.seasonal import MSTL

        series, start = bucketed(history, self.days)
        # Slot (weekday, half-hour) of every bucket, to lay the last cycle onto the week.
        slots = minute_index(start + 60 * _BUCKET * np.arange(series.shape[1])) // _BUCKET
        out: list[Params | Failure] = []
        for y in series:
            if y.size < 2 * _PER_DAY:
                out.append(Failure("MSTL needs two days of history"))
                continue
            periods = (_PER_DAY, _PER_WEEK) if y.size >= 2 * _PER_WEEK else (_PER_DAY,)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = MSTL(y, periods=periods).fit()
            except Exception as exc:  # statsmodels raises many types; any means "use another family"
                out.append(Failure(f"MSTL: {type(exc).__name__}: {exc}"))
                continue
            seasonal = np.asarray(result.seasonal).reshape(y.size, -1)
            level = float(np.asarray(result.trend)[-_PER_DAY:].mean())
            table = np.full(_PER_WEEK, level)
            daily = seasonal[-_PER_DAY:, 0]
            table += np.tile(daily[np.argsort(slots[-_PER_DAY:] % _PER_DAY)], 7)
            if seasonal.shape[1] > 1:
                weekly = np.zeros(_PER_WEEK)
                weekly[slots[-_PER_WEEK:]] = seasonal[-_PER_WEEK:, 1]
                table += weekly
            if not np.all(np.isfinite(table)):
                out.append(Failure("MSTL produced non-finite components"))
                continue
            out.append({"table30": encode_array(np.maximum(table, 0.0) / _BUCKET)})
        return out

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        return np.repeat(decode_array(params["table30"]), _BUCKET)
