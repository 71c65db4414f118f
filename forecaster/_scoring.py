"""Scores the backtests rank and report by: window Brier, Poisson deviance, reliability, baselines.

The event that matters to the scheduler is "at least one request in the ``window`` minutes that start
``lead`` minutes after the forecast origin"; every origin minute of the evaluation span is one forecast.
All functions are vectorised over models: arrays are ``(models, minutes)``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from forecaster._calendar import DAY_MIN, day_kind

__all__ = [
    "SCALE_GRID",
    "brier",
    "poisson_deviance",
    "reliability",
    "reliability_of",
    "reliability_tally",
    "time_of_week_probability",
    "window_sums",
]

# Candidate calibration factors c in P(any) = 1 - exp(-c·expected): below 1 for clustered (bursty)
# demand, where requests come in sessions and the Poisson formula overstates "at least one"; well above
# 1 right after activity in such a session.
SCALE_GRID = np.array(
    [0.03, 0.05, 0.08, 0.12, 0.18, 0.25, 0.35, 0.5, 0.7, 0.85, 1.0, 1.25, 1.6, 2.0, 3.0, 4.0, 6.0, 10.0, 20.0]
)


def window_sums(values: npt.NDArray[np.float64], lead: int, window: int) -> npt.NDArray[np.float64]:
    """``out[:, o] = values[:, o+lead : o+lead+window].sum()`` for every origin whose window fits; NaN
    in any minute of a window makes that window NaN."""
    n, t = values.shape
    origins = t - lead - window + 1
    if origins <= 0:
        return np.zeros((n, 0))
    csum = np.concatenate([np.zeros((n, 1)), np.cumsum(np.nan_to_num(values), axis=1)], axis=1)
    gaps = np.concatenate([np.zeros((n, 1)), np.cumsum(np.isnan(values), axis=1)], axis=1)
    lo, hi = lead, lead + window
    sums = csum[:, hi : hi + origins] - csum[:, lo : lo + origins]
    holes = gaps[:, hi : hi + origins] - gaps[:, lo : lo + origins]
    return np.where(holes > 0, np.nan, sums)


def brier(p: npt.NDArray[np.float64], outcome: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Mean squared error of probabilities per model, over origins where the outcome is known (0 if none)."""
    known = ~np.isnan(outcome)
    err = np.where(known, (p - np.nan_to_num(outcome)) ** 2, 0.0)
    return np.asarray(err.sum(axis=1) / np.maximum(known.sum(axis=1), 1), dtype=np.float64)


def poisson_deviance(
    expected: npt.NDArray[np.float64], counts: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Mean unit Poisson deviance per model over the known minutes."""
    mu = np.maximum(expected, 1e-9)
    known = ~np.isnan(counts)
    y = np.nan_to_num(counts)
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where(y > 0, y * np.log(y / mu), 0.0) - (y - mu)
    dev = np.where(known, 2.0 * term, 0.0)
    return np.asarray(dev.sum(axis=1) / np.maximum(known.sum(axis=1), 1), dtype=np.float64)


def reliability(
    p: npt.NDArray[np.float64], outcome: npt.NDArray[np.float64], bins: int = 10
) -> tuple[list[dict[str, float]], float]:
    """Reliability table (per probability bin: forecasts, mean forecast, observed frequency) and the
    expected calibration error (the count-weighted mean gap between the two)."""
    return reliability_of(reliability_tally(p, outcome, bins))


def reliability_tally(
    p: npt.NDArray[np.float64], outcome: npt.NDArray[np.float64], bins: int = 10
) -> npt.NDArray[np.float64]:
    """Per probability bin: forecasts with a known outcome, their sum, and the sum of outcomes
    (``(bins, 3)``). Tallies of disjoint sets of models add up to the tally of all of them."""
    known = ~np.isnan(outcome)
    pk, ok = p[known], outcome[known]
    which = np.minimum((pk * bins).astype(np.int64), bins - 1)
    tally = np.zeros((bins, 3))
    for b in range(bins):
        sel = which == b
        tally[b] = (sel.sum(), pk[sel].sum(), ok[sel].sum())
    return tally


def reliability_of(tally: npt.NDArray[np.float64]) -> tuple[list[dict[str, float]], float]:
    """The table and calibration error ``reliability`` reports, from a (merged) ``reliability_tally``."""
    bins = tally.shape[0]
    total = max(float(tally[:, 0].sum()), 1.0)
    table: list[dict[str, float]] = []
    ece = 0.0
    for b in range(bins):
        count = int(tally[b, 0])
        if not count:
            continue
        mean_p, freq = float(tally[b, 1] / count), float(tally[b, 2] / count)
        table.append(
            {"lo": b / bins, "hi": (b + 1) / bins, "count": count, "mean_p": mean_p, "observed": freq}
        )
        ece += count / total * abs(mean_p - freq)
    return table, float(ece)


def time_of_week_probability(
    counts: npt.NDArray[np.float64], start: int, train_minutes: int, lead: int, window: int
) -> npt.NDArray[np.float64]:
    """The plain baseline anyone tries first: for each origin after the training part, the fraction of
    training days of the same kind (weekday/weekend) on which the same window had a request.

    ``counts`` spans training and evaluation (``(n, minutes)``, starting at ``start``); the result has
    one column per evaluation origin, as ``window_sums`` of the evaluation part would.
    """
    n, total = counts.shape
    hit = window_sums(counts, lead, window)  # per origin over the whole span
    hit = np.where(np.isnan(hit), np.nan, (hit > 0).astype(np.float64))
    origins = total - train_minutes - lead - window + 1
    if origins <= 0:
        return np.zeros((n, 0))
    eval_origin = train_minutes + np.arange(origins)
    kind_of = day_kind(((start // 60 + np.arange(total)) // DAY_MIN + 3) % 7)
    # A past origin is usable when its whole window lies in the training part.
    last_train_origin = train_minutes - lead - window
    acc = np.zeros((n, origins))
    seen = np.zeros((n, origins))
    for k in range(1, total // DAY_MIN + 2):
        past = eval_origin - k * DAY_MIN
        valid = (past >= 0) & (past <= last_train_origin)
        if not valid.any():
            continue
        same = np.zeros(origins, dtype=bool)
        same[valid] = kind_of[past[valid]] == kind_of[eval_origin[valid]]
        cols = np.flatnonzero(same)
        vals = hit[:, past[cols]]
        acc[:, cols] += np.nan_to_num(vals)
        seen[:, cols] += ~np.isnan(vals)
    train_hits = hit[:, : max(last_train_origin + 1, 0)]
    with np.errstate(invalid="ignore"):
        overall = np.nan_to_num(np.nanmean(train_hits, axis=1)) if train_hits.size else np.zeros(n)
    return np.where(seen > 0, acc / np.maximum(seen, 1), overall[:, None])
