"""Calendar arithmetic shared by every family: UTC weekday and minute of day of per-minute timestamps.

Every fitted family is compiled into a *week table*, the expected requests per minute for each of the
7 × 1440 minutes of a UTC week. Prediction is then one gather per model, which is what keeps 2-hour
forecasts for 1000 models well under a second.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "DAY_MIN",
    "WEEK_MIN",
    "day_kind",
    "minute_index",
    "week_minutes",
]

DAY_MIN = 1440
WEEK_MIN = 7 * DAY_MIN
_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday; weekday 0 is Monday


def minute_index(timestamps: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Index into a flattened week table (``weekday * 1440 + minute_of_day``) of each epoch timestamp."""
    minutes = np.floor(np.asarray(timestamps, dtype=np.float64) / 60.0).astype(np.int64)
    days = np.floor_divide(minutes, DAY_MIN)
    weekday = (days + _EPOCH_WEEKDAY) % 7
    return np.asarray(weekday * DAY_MIN + (minutes - days * DAY_MIN), dtype=np.int64)


def week_minutes() -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Weekday and minute of day of each of the 10080 cells of a week table."""
    cells = np.arange(WEEK_MIN)
    return cells // DAY_MIN, cells % DAY_MIN


def day_kind(weekday: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """0 for Monday–Friday, 1 for Saturday and Sunday: the two kinds of day demand differs between."""
    return (np.asarray(weekday) >= 5).astype(np.int64)
