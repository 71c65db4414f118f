"""Holt-Winters exponential smoothing (statsmodels ``ExponentialSmoothing``) with a daily season.

Fitted on the half-hour buckets of the last week (see ``_bucketed``). The next day's forecast, clipped at
zero, becomes the daily profile.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from forecaster._calendar import WEEK_MIN
from forecaster._codec import decode_array
from forecaster.families._base import Params
from forecaster.families._bucketed import BUCKET, PER_DAY, Bucketed

__all__ = ["ETS"]


class ETS(Bucketed):
    alias = "ets"
    method = "ExponentialSmoothing"
    key = "profile30"

    def _fit_series(
        self, y: npt.NDArray[np.float64], slots: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        fitted = ExponentialSmoothing(
            y, trend=None, seasonal="add", seasonal_periods=PER_DAY, initialization_method="heuristic"
        ).fit(use_brute=False)  # the brute-force start grid costs 4x, rarely changes the fit
        ahead = np.asarray(fitted.forecast(PER_DAY), dtype=np.float64)
        # The forecast starts at the slot after the last bucket; rotate so that slot 0 is 00:00 UTC.
        return np.roll(ahead, (slots[-1] + 1) % PER_DAY)

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        profile = decode_array(params[self.key])
        return np.tile(np.repeat(profile, BUCKET), 7)[:WEEK_MIN]
