"""MSTL (statsmodels): trend plus daily and, with two weeks of data, weekly seasonal components.

Like ETS it runs on half-hour buckets and only for busy series (see ``_bucketed``). The forecast is the
trend level at the origin plus the last cycle of each seasonal component, which makes it
weekly-periodic by construction: exactly what a week table holds.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from forecaster._codec import decode_array
from forecaster.families._base import Params
from forecaster.families._bucketed import BUCKET, PER_DAY, PER_WEEK, Bucketed

__all__ = ["MSTLFamily"]


class MSTLFamily(Bucketed):
    alias = "mstl"
    method = "MSTL"
    key = "table30"

    def __init__(self, min_rate: float = 0.5, days: int = 14, max_series: int = 100) -> None:
        super().__init__(min_rate, days, max_series)

    def _fit_series(
        self, y: npt.NDArray[np.float64], slots: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        from statsmodels.tsa.seasonal import MSTL

        periods = (PER_DAY, PER_WEEK) if y.size >= 2 * PER_WEEK else (PER_DAY,)
        result = MSTL(y, periods=periods).fit()
        seasonal = np.asarray(result.seasonal).reshape(y.size, -1)
        level = float(np.asarray(result.trend)[-PER_DAY:].mean())
        table = np.full(PER_WEEK, level)
        # Lay the last cycle of each component onto its slots of the week.
        daily = seasonal[-PER_DAY:, 0]
        table += np.tile(daily[np.argsort(slots[-PER_DAY:] % PER_DAY)], 7)
        if seasonal.shape[1] > 1:
            weekly = np.zeros(PER_WEEK)
            weekly[slots[-PER_WEEK:]] = seasonal[-PER_WEEK:, 1]
            table += weekly
        return table

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        return np.repeat(decode_array(params[self.key]), BUCKET)
