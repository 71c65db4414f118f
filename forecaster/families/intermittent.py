"""Intermittent demand (TSB: Teunter, Syntetos and Babai 2011) for sparse, long-tail series.

On hourly buckets, TSB smooths the probability that a bucket has any demand (updated every bucket, so
it decays when demand stops, unlike Croston) and the size of a non-zero bucket (updated only when there
is demand). The forecast is their product, flat over the horizon. Vectorised over models: one pass over
the hours.
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt

from forecaster._calendar import WEEK_MIN
from forecaster._history import History
from forecaster.families._base import Failure, Family, Params

__all__ = ["Intermittent"]


class Intermittent(Family):
    alias = "intermittent"

    def __init__(self, alpha: float = 0.05, beta: float = 0.1, bucket_min: int = 60) -> None:
        self.alpha, self.beta, self.bucket_min = alpha, beta, bucket_min

    def fit(self, history: History) -> list[Params | Failure]:
        b = self.bucket_min
        n = len(history.models)
        usable = history.minutes // b * b
        if usable < b:
            return [Failure("shorter than one bucket")] * n
        counts = history.counts[:, history.minutes - usable :].reshape(n, usable // b, b)
        seen = (~np.isnan(counts)).sum(axis=2)
        # Scale partly observed buckets up to a whole bucket; unobserved ones leave the state alone.
        demand = np.where(seen > 0, np.nansum(counts, axis=2) * b / np.maximum(seen, 1), np.nan)
        observed = ~np.isnan(demand)
        first = demand[:, : max(1, 24 * 60 // b)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows are handled by nan_to_num
            p = np.nan_to_num(np.nanmean(first > 0, axis=1), nan=0.0)
            positive = np.where(demand > 0, demand, np.nan)
            z = np.nan_to_num(np.nanmean(positive, axis=1), nan=1.0)
        for t in range(demand.shape[1]):
            d, obs = demand[:, t], observed[:, t]
            hit = obs & (d > 0)
            p = np.where(obs, p + self.alpha * (hit - p), p)
            z = np.where(hit, z + self.beta * (np.nan_to_num(d) - z), z)
        return [
            {"rate": float(p[i] * z[i] / b)} if observed[i].any() else Failure("no observed minutes")
            for i in range(n)
        ]

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        return np.full(WEEK_MIN, max(0.0, float(params["rate"])))
