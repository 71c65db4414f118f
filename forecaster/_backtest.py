"""Fit a bundle on a history, and backtest it: train before a cut, score every origin after it.

The report is what ``prewarm forecast backtest --json`` writes and what a retrain logs to MLflow:
aggregate and per-model Brier at ``lead``/``window``, against two baselines (a per-model constant Poisson
rate fitted on the training part, and the time-of-week profile), Poisson deviance, and the reliability
table that shows whether the probabilities are calibrated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from forecaster._bundle import ForecasterBundle
from forecaster._history import History
from forecaster._idle import fit_idle_profile
from forecaster._scoring import (
    brier,
    poisson_deviance,
    reliability_of,
    reliability_tally,
    time_of_week_probability,
    window_sums,
)
from forecaster._select import Choice, SelectionConfig, one_blas_thread, recent_activity, select_and_fit
from prewarm import InvalidInput

__all__ = ["BacktestReport", "Scores", "assemble_report", "backtest", "fit_bundle", "score_rows"]


def fit_bundle(
    history: History,
    config: SelectionConfig | None = None,
    *,
    bucket_s: int = 60,
    horizon_s: int = 7200,
    idle: bool = True,
) -> ForecasterBundle:
    """Select and fit a family per model on all of ``history``; the bundle is trained until its end.

    ``idle`` also fits each model's idle-time profile (``bundle.idle``), which ``LiveForecasts`` uses."""
    with one_blas_thread():
        choices = select_and_fit(history, config)
        bundle = ForecasterBundle.from_choices(
            choices,
            trained_until=float(history.end),
            bucket_s=bucket_s,
            horizon_s=horizon_s,
            # The active/idle factors were fitted over this many minutes: predict must count the same way.
            state_minutes=(config or SelectionConfig()).state_minutes,
        )
        if idle:
            bundle.idle = fit_idle_profile(history, bundle)
    return bundle


@dataclass
class BacktestReport:
    aggregate: dict[str, Any]
    per_model: dict[str, dict[str, Any]]
    reliability: list[dict[str, float]]
    bundle: ForecasterBundle
    # Arrays kept for plots: per model, p and outcome per evaluation origin.
    p: npt.NDArray[np.float64] = field(repr=False)
    outcome: npt.NDArray[np.float64] = field(repr=False)
    test: History = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"aggregate": self.aggregate, "per_model": self.per_model, "reliability": self.reliability}


def backtest(
    history: History,
    train_until: float,
    *,
    lead: int = 5,
    window: int = 10,
    config: SelectionConfig | None = None,
    families: dict[str, str] | None = None,
) -> BacktestReport:
    """Train on ``history`` before ``train_until``, score on the rest. ``families`` (model → pattern
    family, e.g. from the synthetic generator) adds a per-family breakdown to the aggregate."""
    train, test = history.split(train_until)
    if train.minutes < 60:
        raise InvalidInput(f"less than an hour of history before --train-until {train_until}", reason="split")
    if test.minutes < lead + window:
        raise InvalidInput(
            f"less than {lead + window} minutes of history after --train-until", reason="split"
        )
    # ``lead`` and ``window`` say what is scored: the selection scores the same thing.
    config = replace(config or SelectionConfig(), lead=lead, window=window)
    began = time.perf_counter()
    bundle = fit_bundle(train, config)
    fit_s = time.perf_counter() - began

    scores = score_rows(train, test, bundle, lead, window)
    choices = [bundle.choice(m) for m in train.models]
    return assemble_report(
        scores,
        choices,
        lead=lead,
        window=window,
        state_minutes=bundle.state_minutes,
        train=(train.start, train.end),
        test_until=test.end,
        fit_seconds=fit_s,
        families=families,
        bundle=bundle,
        test=test,
    )


@dataclass
class Scores:
    """The backtest scores of a set of models, one entry per model, and the reliability tallies of
    their forecasts (``p``, without recent activity, the constant baseline); ``Scores.merge`` of disjoint
    sets in model order gives what scoring them all at once would."""

    brier: npt.NDArray[np.float64]
    brier_baseline: npt.NDArray[np.float64]
    brier_time_of_week: npt.NDArray[np.float64]
    brier_without_recent: npt.NDArray[np.float64]
    deviance: npt.NDArray[np.float64]
    deviance_baseline: npt.NDArray[np.float64]
    tallies: npt.NDArray[np.float64]
    p: npt.NDArray[np.float64] = field(repr=False)
    outcome: npt.NDArray[np.float64] = field(repr=False)

    @classmethod
    def merge(cls, parts: list[Scores], order: npt.NDArray[np.int64] | None = None) -> Scores:
        """Concatenated per-model entries (reordered by ``order`` if given), summed tallies."""
        arrays = {k: np.concatenate([getattr(s, k) for s in parts]) for k in _PER_MODEL}
        if order is not None:
            arrays = {k: a[order] for k, a in arrays.items()}
        tallies = np.sum([s.tallies for s in parts], axis=0) if parts else np.zeros((3, 10, 3))
        empty = np.zeros((0, 0))
        return cls(**arrays, tallies=tallies, p=empty, outcome=empty)


_PER_MODEL = (
    "brier",
    "brier_baseline",
    "brier_time_of_week",
    "brier_without_recent",
    "deviance",
    "deviance_baseline",
)


def score_rows(train: History, test: History, bundle: ForecasterBundle, lead: int, window: int) -> Scores:
    """Score the bundle's forecasts of ``train``'s models over ``test``, each model on its own."""
    stamps = test.timestamps()
    rates = bundle.rates(stamps, train.models)
    expected = window_sums(rates, lead, window)
    sums = window_sums(test.counts, lead, window)
    outcome = np.where(np.isnan(sums), np.nan, (sums > 0).astype(np.float64))
    # What the scheduler gets when it passes ``recent`` (requests in the last state_minutes before each
    # origin, known at the origin) and what it gets without.
    full = np.concatenate([train.counts, test.counts], axis=1)
    csum = np.concatenate([np.zeros((len(train.models), 1)), np.cumsum(np.nan_to_num(full), axis=1)], axis=1)
    active = recent_activity(csum, train.minutes + np.arange(expected.shape[1]), bundle.state_minutes)
    scale_state = np.where(
        active, bundle.scales(train.models, "active")[:, None], bundle.scales(train.models, "idle")[:, None]
    )
    p = 1.0 - np.exp(-scale_state * expected)
    p_plain = 1.0 - np.exp(-bundle.scales(train.models)[:, None] * expected)

    with np.errstate(invalid="ignore"):
        const = np.nan_to_num(np.nanmean(np.where(np.isfinite(train.counts), train.counts, np.nan), axis=1))
    p_base = np.broadcast_to(1.0 - np.exp(-const[:, None] * window), p.shape)
    p_tow = time_of_week_probability(full, train.start, train.minutes, lead, window)
    return Scores(
        brier=brier(p, outcome),
        brier_baseline=brier(p_base, outcome),
        brier_time_of_week=brier(p_tow, outcome),
        brier_without_recent=brier(p_plain, outcome),
        deviance=poisson_deviance(rates, test.counts),
        deviance_baseline=poisson_deviance(np.broadcast_to(const[:, None], test.counts.shape), test.counts),
        tallies=np.stack(
            [
                reliability_tally(p, outcome),
                reliability_tally(p_plain, outcome),
                reliability_tally(np.array(p_base), outcome),
            ]
        ),
        p=p,
        outcome=outcome,
    )


def assemble_report(
    scores: Scores,
    choices: list[Choice],
    *,
    lead: int,
    window: int,
    state_minutes: int,
    train: tuple[int, int],
    test_until: int,
    fit_seconds: float,
    families: dict[str, str] | None,
    bundle: ForecasterBundle,
    test: History,
) -> BacktestReport:
    """The report of scored models (``choices``: what each was trained with, in the order of ``scores``).

    ``bundle`` and ``test`` are kept for the plots (a retrain on chunks keeps only the plotted models)."""
    b_model, b_base, b_tow = scores.brier, scores.brier_baseline, scores.brier_time_of_week
    b_plain, dev, dev_base = scores.brier_without_recent, scores.deviance, scores.deviance_baseline
    table, ece = reliability_of(scores.tallies[0])
    _, ece_plain = reliability_of(scores.tallies[1])
    _, ece_base = reliability_of(scores.tallies[2])
    models = [c.model for c in choices]

    per_model: dict[str, dict[str, Any]] = {}
    for i, choice in enumerate(choices):
        per_model[choice.model] = {
            "family_chosen": choice.family,
            "brier": float(b_model[i]),
            "brier_baseline": float(b_base[i]),
            "brier_time_of_week": float(b_tow[i]),
            "brier_skill": _skill(b_model[i], b_base[i]),
            "brier_without_recent": float(b_plain[i]),
            "poisson_deviance": float(dev[i]),
            "poisson_deviance_baseline": float(dev_base[i]),
            "scale": choice.scale,
            "scale_active": choice.scale_active,
            "scale_idle": choice.scale_idle,
            "validation_scores": choice.scores,
            "reason": choice.reason,
        }
        if families is not None:
            per_model[choice.model]["pattern"] = families.get(choice.model)
    aggregate = _aggregate(b_model, b_base, b_tow, dev, dev_base)
    aggregate.update(
        {
            "ece": ece,
            "ece_baseline": ece_base,
            "brier_without_recent": float(b_plain.mean()),
            "brier_skill_without_recent": _skill(float(b_plain.mean()), float(b_base.mean())),
            "brier_skill_vs_time_of_week_without_recent": _skill(float(b_plain.mean()), float(b_tow.mean())),
            "ece_without_recent": ece_plain,
            "state_minutes": state_minutes,
            "lead_minutes": lead,
            "window_minutes": window,
            "train_start": train[0],
            "train_until": train[1],
            "test_until": test_until,
            "fit_seconds": round(fit_seconds, 3),
            "families_chosen": _counts(c.family for c in choices),
        }
    )
    if families is not None:
        aggregate["by_pattern"] = {
            name: _aggregate(*(a[rows] for a in (b_model, b_base, b_tow, dev, dev_base)))
            | {
                "brier_without_recent": float(b_plain[rows].mean()),
                "brier_skill_without_recent": _skill(float(b_plain[rows].mean()), float(b_base[rows].mean())),
                "families_chosen": _counts(choices[i].family for i in rows),
            }
            for name in sorted(set(families.values()))
            if (
                rows := np.array([i for i, m in enumerate(models) if families.get(m) == name], dtype=int)
            ).size
        }
    return BacktestReport(aggregate, per_model, table, bundle, scores.p, scores.outcome, test)


def _skill(model: float, base: float) -> float:
    return float(1.0 - model / base) if base > 0 else 0.0


def _aggregate(
    b_model: npt.NDArray[np.float64],
    b_base: npt.NDArray[np.float64],
    b_tow: npt.NDArray[np.float64],
    dev: npt.NDArray[np.float64],
    dev_base: npt.NDArray[np.float64],
) -> dict[str, Any]:
    brier_m, brier_b, brier_t = float(b_model.mean()), float(b_base.mean()), float(b_tow.mean())
    return {
        "brier": brier_m,
        "brier_baseline": brier_b,
        "brier_skill": _skill(brier_m, brier_b),
        "brier_time_of_week": brier_t,
        "brier_skill_vs_time_of_week": _skill(brier_m, brier_t),
        "poisson_deviance": float(dev.mean()),
        "poisson_deviance_baseline": float(dev_base.mean()),
        "models": int(b_model.size),
    }


def _counts(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))
