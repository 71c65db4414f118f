"""What the forecaster hands the scheduler: per model, expected requests and P(at least one) per bucket."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["ModelForecast", "forecasts_of"]


@dataclass(frozen=True)
class ModelForecast:
    """A forecast for one model over ``len(expected)`` buckets starting at ``start`` (epoch seconds).

    ``p_any[i]`` is the calibrated probability of at least one request in bucket ``i``; ``expected[i]``
    the expected count. (For a model with idle-time structure, ``LiveForecasts`` gives bucket ``i``'s
    probability given no request in the buckets before it — the next request's hazard — so that
    ``p_window`` from the start is exact; for a memoryless model the two are the same.)

    ``family`` names what produced it: a ``FAMILIES`` alias (``seasonal_naive_daily``,
    ``poisson_fourier`` ...) or ``recent_rate``, the no-training forecast (``recent_rate_forecasts``);
    ``LiveForecasts`` appends ``+idle`` where the idle-time model shaped it.
    """

    model: str
    start: float
    bucket_s: int
    expected: npt.NDArray[np.float64]
    p_any: npt.NDArray[np.float64]
    family: str
    daily_requests: float = math.nan
    """The model's expected requests per day over its whole week (at its recent level, where that is
    known): how often it is used at all, which says what one of its cold starts is worth to its
    cold-start rate. NaN where the source does not say (the planner then reads it off the horizon)."""
    log_miss: npt.NDArray[np.float64] = field(init=False, repr=False, compare=False)
    """``log_miss[i]`` = log P(no request in buckets [0, i)): a window's P(any) is O(1) from it."""
    _cum_expected: npt.NDArray[np.float64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.expected.shape != self.p_any.shape or self.expected.ndim != 1:
            raise ValueError("expected and p_any must be 1-d arrays of the same length")
        # Prefix sums make every window query O(1): the planner asks thousands per round.
        miss = np.log1p(-np.clip(self.p_any, 0.0, 1.0 - 1e-12))
        object.__setattr__(self, "log_miss", np.concatenate(([0.0], np.cumsum(miss))))
        object.__setattr__(self, "_cum_expected", np.concatenate(([0.0], np.cumsum(self.expected))))

    @property
    def end(self) -> float:
        return self.start + self.bucket_s * len(self.expected)

    def _slice(self, t0: float, t1: float) -> slice:
        i0 = min(max(0, math.floor((t0 - self.start) / self.bucket_s)), len(self.expected))
        i1 = min(len(self.expected), math.ceil((t1 - self.start) / self.bucket_s))
        return slice(i0, max(i0, i1))

    def p_window(self, t0: float, t1: float) -> float:
        """P(at least one request in [t0, t1)), treating buckets as independent."""
        window = self._slice(t0, t1)
        return float(-np.expm1(self.log_miss[window.stop] - self.log_miss[window.start]))

    def p_between(self, t0: float, t1: float) -> float:
        """P(at least one request in [t0, t1)), each bucket's chance spread evenly over it: a span that
        covers part of a bucket gets that part of its chance, where ``p_window`` counts whole buckets."""
        if t1 <= t0 or not len(self.p_any):
            return 0.0
        return float(-np.expm1(self._log_miss_at(t1) - self._log_miss_at(t0)))

    def _log_miss_at(self, t: float) -> float:
        x = min(max((t - self.start) / self.bucket_s, 0.0), float(len(self.p_any)))
        i = min(int(x), len(self.p_any) - 1)
        return float(self.log_miss[i] + (x - i) * (self.log_miss[i + 1] - self.log_miss[i]))

    def expected_in(self, t0: float, t1: float) -> float:
        """Expected requests in [t0, t1)."""
        window = self._slice(t0, t1)
        return float(self._cum_expected[window.stop] - self._cum_expected[window.start])


def forecasts_of(
    models: Sequence[str],
    start: float,
    bucket_s: int,
    expected: npt.NDArray[np.float64],
    p_any: npt.NDArray[np.float64],
    families: Sequence[str],
    daily: npt.NDArray[np.float64] | None = None,
) -> dict[str, ModelForecast]:
    """One forecast per row of ``expected`` and ``p_any`` (``(models, buckets)``), the prefix sums of
    all rows computed at once: the same objects as one ``ModelForecast(...)`` per model, made in a
    fraction of the time when there are thousands of models and a forecast every few minutes."""
    if expected.shape != p_any.shape or expected.ndim != 2 or expected.shape[0] != len(models):
        raise ValueError("expected and p_any must be (len(models), buckets) arrays of the same shape")
    zero = np.zeros((len(models), 1))
    log_miss = np.concatenate([zero, np.cumsum(np.log1p(-np.clip(p_any, 0.0, 1.0 - 1e-12)), axis=1)], axis=1)
    cum_expected = np.concatenate([zero, np.cumsum(expected, axis=1)], axis=1)
    out: dict[str, ModelForecast] = {}
    for i, model in enumerate(models):
        forecast = object.__new__(ModelForecast)
        for name, value in (
            ("model", model),
            ("start", float(start)),
            ("bucket_s", bucket_s),
            ("expected", expected[i]),
            ("p_any", p_any[i]),
            ("family", families[i]),
            ("daily_requests", math.nan if daily is None else float(daily[i])),
            ("log_miss", log_miss[i]),
            ("_cum_expected", cum_expected[i]),
        ):
            object.__setattr__(forecast, name, value)
        out[model] = forecast
    return out
