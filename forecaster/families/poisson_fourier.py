"""Poisson regression on calendar features: Fourier terms of the time of day, split by kind of day.

``log λ(t) = b + Σ_k a_k·sin/cos(2πkτ) + weekend·(c + Σ_j d_j·sin/cos(2πjτ))`` with τ the fraction of
the UTC day, fitted on 15-minute buckets (exposure-weighted, so gaps only lower the weight of a bucket)
with recency weights, so launches and deprecations pull the level within a few days. The fitted
coefficients are the whole model: a dozen-odd numbers of JSON per series.

It is the same penalised Poisson GLM as scikit-learn's ``PoissonRegressor``, but fitted by a batched
Newton method over all series at once: every series shares the design matrix, so one BLAS product per
iteration serves a thousand series (scikit-learn's per-series fit measured ~1 s a series here, which
alone would blow the 10-minute retrain budget).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from forecaster._calendar import DAY_MIN, day_kind, minute_index, week_minutes
from forecaster._history import History
from forecaster.families._base import Failure, Family, Params, recency_weights

__all__ = ["PoissonFourier", "fourier_features", "poisson_glm"]


def fourier_features(
    weekday: npt.NDArray[np.int64], minute_of_day: npt.ArrayLike, k_day: int, k_weekend: int
) -> npt.NDArray[np.float64]:
    tau = 2 * np.pi * np.asarray(minute_of_day, dtype=np.float64) / DAY_MIN
    weekend = day_kind(weekday).astype(np.float64)
    cols = []
    for k in range(1, k_day + 1):
        cols += [np.sin(k * tau), np.cos(k * tau)]
    cols.append(weekend)
    for j in range(1, k_weekend + 1):
        cols += [weekend * np.sin(j * tau), weekend * np.cos(j * tau)]
    return np.stack(cols, axis=1)


class PoissonFourier(Family):
    """``alias="poisson_fourier_recent"`` with a one-day half-life is the variant that follows launches."""

    def __init__(
        self,
        k_day: int = 6,
        k_weekend: int = 3,
        bucket_min: int = 15,
        half_life_days: float = 3.0,
        alpha: float = 1e-4,
        alias: str = "poisson_fourier",
    ) -> None:
        self.alias = alias
        self.k_day, self.k_weekend, self.bucket_min = k_day, k_weekend, bucket_min
        self.half_life_days, self.alpha = half_life_days, alpha

    def fit(self, history: History) -> list[Params | Failure]:
        b = self.bucket_min
        usable = history.minutes // b * b
        if usable < b:
            return [Failure("shorter than one bucket")] * len(history.models)
        offset = history.minutes - usable  # drop the oldest minutes so buckets end at the origin
        counts = history.counts[:, offset:].reshape(len(history.models), usable // b, b)
        exposure = (~np.isnan(counts)).sum(axis=2).astype(np.float64)
        total = np.nansum(counts, axis=2)
        stamps = history.start + 60 * (offset + np.arange(usable // b) * b)
        cells = minute_index(stamps)
        features = fourier_features(cells // DAY_MIN, cells % DAY_MIN + b / 2.0, self.k_day, self.k_weekend)
        recency = recency_weights(usable // b * b, self.half_life_days)[::b]
        keep = exposure > 0
        rate = np.where(keep, total / np.maximum(exposure, 1.0), 0.0)  # per minute
        weight = recency[None, :] * exposure
        coef, ok = poisson_glm(features, rate, weight, self.alpha)
        out: list[Params | Failure] = []
        for i in range(len(history.models)):
            if not keep[i].any():
                out.append(Failure("no observed minutes"))
            elif rate[i].max() <= 0:
                out.append({"intercept": -30.0, "coef": [0.0] * features.shape[1]})
            elif not ok[i]:
                out.append(Failure("Poisson regression did not converge"))
            else:
                out.append({"intercept": float(coef[i, 0]), "coef": [float(c) for c in coef[i, 1:]]})
        return out

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        features = _week_features(self.k_day, self.k_weekend)
        eta = features @ np.asarray(params["coef"], dtype=np.float64) + float(params["intercept"])
        return np.exp(np.clip(eta, -50.0, 20.0))


_FEATURE_CACHE: dict[tuple[int, int], npt.NDArray[np.float64]] = {}


def _week_features(k_day: int, k_weekend: int) -> npt.NDArray[np.float64]:
    key = (k_day, k_weekend)
    if key not in _FEATURE_CACHE:
        weekday, minute = week_minutes()
        _FEATURE_CACHE[key] = fourier_features(weekday, minute.astype(np.float64) + 0.5, k_day, k_weekend)
    return _FEATURE_CACHE[key]


def poisson_glm(
    features: npt.NDArray[np.float64],
    rate: npt.NDArray[np.float64],
    weight: npt.NDArray[np.float64],
    alpha: float,
    max_iter: int = 30,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Fit ``log E[rate] = b + features @ a`` per row of ``rate``/``weight`` (one series per row).

    Minimises ``Σ_t w_t (μ_t - y_t log μ_t) / Σ_t w_t + alpha/2 · |a|²`` by damped Newton steps,
    batched over series. Returns ``(n, 1 + p)`` coefficients (intercept first) and which series converged.
    """
    n, t = rate.shape
    x = np.concatenate([np.ones((t, 1)), features], axis=1)
    p = x.shape[1]
    xx = (x[:, :, None] * x[:, None, :]).reshape(t, p * p)
    w = weight / np.maximum(weight.sum(axis=1, keepdims=True), 1e-12)
    penalty = np.full(p, alpha)
    penalty[0] = 1e-8  # the intercept is (almost) free
    mean = np.maximum((w * rate).sum(axis=1), 1e-12)
    beta = np.zeros((n, p))
    beta[:, 0] = np.log(mean)

    def objective(b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        eta = np.clip(_by_blocks(b, x.T), -50.0, 30.0)
        return np.asarray((w * (np.exp(eta) - rate * eta)).sum(axis=1) + 0.5 * (penalty * b * b).sum(axis=1))

    current = objective(beta)
    converged = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        mu = np.exp(np.clip(_by_blocks(beta, x.T), -50.0, 30.0))
        grad = _by_blocks(w * (mu - rate), x) + penalty * beta
        hess = _by_blocks(w * mu, xx).reshape(n, p, p) + np.diag(penalty + 1e-10)
        try:
            step = np.linalg.solve(hess, grad[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            step = grad / np.maximum(np.diagonal(hess, axis1=1, axis2=2), 1e-9)
        size = np.ones(n)
        trial = beta - step
        value = objective(trial)
        for _ in range(8):  # halve the step where it does not improve (damped Newton)
            worse = ~(value <= current + 1e-12)
            if not worse.any():
                break
            size = np.where(worse, size / 2, size)
            trial = np.where(worse[:, None], beta - size[:, None] * step, trial)
            value = np.where(worse, objective(trial), value)
        # A converged series stops moving: its fit must not depend on which other series share the
        # batch (a retrain fits chunks of models, and any chunking must give the same coefficients).
        live = ~converged
        improved = (value <= current + 1e-12) & live
        beta = np.where(improved[:, None], trial, beta)
        converged |= live & (np.abs(current - value) < 1e-9 * np.maximum(1.0, np.abs(current)))
        current = np.where(improved, value, current)
        if converged.all():
            break
    return beta, np.asarray(np.isfinite(beta).all(axis=1), dtype=bool)


_BLOCK = 64


def _by_blocks(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``a @ b`` computed ``_BLOCK`` rows at a time, the last block padded with zeros.

    BLAS picks its kernels (and so the order it adds in) by the shapes it is given: with every product
    of one shape, a series' coefficients are the same to the bit whichever series share its batch."""
    n = a.shape[0]
    out = np.empty((n, b.shape[1]))
    for lo in range(0, n, _BLOCK):
        block = a[lo : lo + _BLOCK]
        rows = block.shape[0]
        if rows < _BLOCK:
            block = np.concatenate([block, np.zeros((_BLOCK - rows, a.shape[1]))])
        out[lo : lo + rows] = (np.ascontiguousarray(block) @ b)[:rows]
    return out
