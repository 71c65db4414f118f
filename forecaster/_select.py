"""Per-model family selection by rolling-origin backtest, calibration, and the fallbacks.

For each mature model, every candidate family is fitted on the history up to each fold origin and scored
on the following ``fold_days``: Brier score of "any request in the ``window`` minutes starting ``lead``
minutes ahead", at the best calibration factor ``c`` of ``P(any) = 1 - exp(-c·expected)``. The family
with the lowest pooled score wins and is refitted on the whole history with its ``c``.

Fallbacks, each recorded in ``Choice.reason`` and logged:
- a model with less than ``new_model_days`` of history since its first request: a prior, the median
  shape of models of similar volume at its own rate;
- less than ``short_history_days``: seasonal naive on what there is, no backtest, ``c = 1``;
- a family that fails on the full history: seasonal naive, then a constant rate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from forecaster._calendar import DAY_MIN, minute_index
from forecaster._history import History
from forecaster._scoring import SCALE_GRID, window_sums
from forecaster.families import CANDIDATES, FAMILIES, Failure, Params
from forecaster.families.prior import SLOTS, prior_params_from_slots, slot_means
from prewarm import get_logger

__all__ = [
    "Choice",
    "PartialSelection",
    "Peers",
    "SelectionConfig",
    "prior_choices",
    "recent_activity",
    "select_and_fit",
    "select_partial",
]

log = get_logger(__name__)


@dataclass(frozen=True)
class SelectionConfig:
    lead: int = 5
    window: int = 10
    folds: int = 2
    fold_days: float = 1.0
    short_history_days: float = 2.0
    tolerance: float = 0.01
    sparse_tolerance: float = 0.05
    min_positives: int = 100
    dormant_hours: float = 12.0
    state_minutes: int = 10
    dormant_expected: float = 10.0
    new_model_days: float = 1.0
    families: tuple[str, ...] = CANDIDATES
    share: float = 1.0
    """The part of the whole retrain's models these series are (a chunk): per-retrain caps are split
    in proportion (``Family.eligible``)."""


@dataclass
class Choice:
    """What was chosen for one model and why."""

    model: str
    family: str
    params: Params
    scale: float = 1.0
    scale_active: float | None = None
    scale_idle: float | None = None
    level: float = 1.0
    scores: dict[str, float] = field(default_factory=dict)
    reason: str | None = None


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Fit inside this: BLAS threads fighting over shared cores made small per-series solves 50x slower,
    and one thread is best for them."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    with threadpool_limits(1):
        yield


def _ages(counts: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """First minute with a request (``minutes`` if none) and observed days from then on."""
    n, t = counts.shape
    requested = np.nan_to_num(counts) > 0
    first = np.where(requested.any(axis=1), requested.argmax(axis=1), 0) if t else np.zeros(n, np.int64)
    observed = np.cumsum(~np.isnan(counts), axis=1) if t else np.zeros((n, 0))
    before = np.where(first > 0, observed[np.arange(n), np.maximum(first - 1, 0)], 0) if t else np.zeros(n)
    total = observed[:, -1] if t else np.zeros(n)
    return first.astype(np.int64), (total - before) / DAY_MIN


def select_and_fit(history: History, config: SelectionConfig | None = None) -> list[Choice]:
    """Choose and fit a family per model of ``history``; never raises for a bad series."""
    partial = select_partial(history, config)
    peers = Peers.of([c for c in partial.choices if c is not None])
    priors = iter(prior_choices(partial.new_models, partial.new_rates, peers))
    return [c if c is not None else next(priors) for c in partial.choices]


@dataclass(frozen=True)
class PartialSelection:
    """What ``select_partial`` fits of one set of series: a choice per model, ``None`` for a model too
    new to fit on its own, whose prior needs every other model's shape (``prior_choices``).

    ``new_rates`` holds each new model's own mean rate per minute (NaN if it has no data at all)."""

    choices: list[Choice | None]
    new_models: list[str]
    new_rates: npt.NDArray[np.float64]


@dataclass(frozen=True)
class Peers:
    """What a new model's prior needs of the models fitted on their own: each one's week table at
    half-hour resolution (``(k, 336)``) and its mean rate per minute. Mergeable across chunks of models:
    ``Peers.merge`` in model order gives what one pass over all of them would."""

    slots: npt.NDArray[np.float64]
    rates: npt.NDArray[np.float64]

    @classmethod
    def of(cls, choices: Sequence[Choice]) -> Peers:
        slots = np.zeros((len(choices), SLOTS))
        rates = np.zeros(len(choices))
        for i, c in enumerate(choices):
            week = FAMILIES[c.family].week(c.params)
            slots[i], rates[i] = slot_means(week), week.mean()
        return cls(slots, rates)

    @classmethod
    def merge(cls, parts: Sequence[Peers]) -> Peers:
        if not parts:
            return cls(np.zeros((0, SLOTS)), np.zeros(0))
        return cls(np.concatenate([p.slots for p in parts]), np.concatenate([p.rates for p in parts]))


def select_partial(history: History, config: SelectionConfig | None = None) -> PartialSelection:
    """``select_and_fit`` but the priors of new models: what one chunk of a retrain fits by itself."""
    config = config or SelectionConfig()
    n = len(history.models)
    counts = np.array(history.counts, dtype=np.float64, copy=True)
    counts[~np.isfinite(counts) | (counts < 0)] = np.nan  # NaN, inf and negatives are "no data"
    first, age = _ages(counts)
    young = age < config.short_history_days
    for i in np.flatnonzero(first > 0):
        # The store zero-fills from the start of the query; before its first request a model did not
        # exist yet, and those zeros would drag every level and weekday estimate down after a launch.
        counts[i, : first[i]] = np.nan
    clean = History(history.models, history.start, counts)
    choices: list[Choice | None] = [None] * n

    mature = np.flatnonzero(~young)
    if mature.size:
        for i, choice in zip(mature, _backtest_select(clean.select(mature), config), strict=True):
            choices[i] = choice
    short = np.flatnonzero(young & (age >= config.new_model_days))
    if short.size:
        for i, choice in zip(short, _fit_fallback(clean.select(short), "short history"), strict=True):
            choices[i] = choice
    new = np.flatnonzero(age < config.new_model_days)
    rates = np.full(new.size, np.nan)
    for k, i in enumerate(new):
        if np.any(~np.isnan(counts[i])):
            with np.errstate(invalid="ignore"):
                rates[k] = float(np.nanmean(counts[i]))
    return PartialSelection(choices, [history.models[i] for i in new], rates)


def prior_choices(models: Sequence[str], own_rates: npt.NDArray[np.float64], peers: Peers) -> list[Choice]:
    """The priors of new models (``select_partial``'s ``None``s) from the peers of the whole retrain."""
    return [_prior(m, float(r), peers) for m, r in zip(models, own_rates, strict=True)]


def _backtest_select(history: History, config: SelectionConfig) -> list[Choice]:
    n, t = len(history.models), history.minutes
    fold_min = int(config.fold_days * DAY_MIN)
    families = [a for a in config.families if a in FAMILIES]
    sse = {a: np.zeros((n, SCALE_GRID.size)) for a in families}
    sse_active = {a: np.zeros((n, SCALE_GRID.size)) for a in families}
    usable = {a: np.ones(n, dtype=bool) for a in families}
    known = np.zeros(n)
    positives = np.zeros(n)
    known_active = np.zeros(n)
    positives_active = np.zeros(n)
    csum = np.concatenate([np.zeros((n, 1)), np.cumsum(np.nan_to_num(history.counts), axis=1)], axis=1)
    for f in range(config.folds, 0, -1):
        origin = t - f * fold_min
        if origin < DAY_MIN:
            continue
        fit_part = History(history.models, history.start, history.counts[:, :origin])
        actual = history.counts[:, origin : origin + fold_min]
        sums = window_sums(actual, config.lead, config.window)
        outcome = np.where(np.isnan(sums), np.nan, (sums > 0).astype(np.float64))
        seen = ~np.isnan(outcome)
        known += seen.sum(axis=1)
        positives += np.nan_to_num(outcome).sum(axis=1)
        active = recent_activity(csum, origin + np.arange(outcome.shape[1]), config.state_minutes)
        known_active += (seen & active).sum(axis=1)
        positives_active += (np.nan_to_num(outcome) * active).sum(axis=1)
        cells = minute_index(fit_part.end + 60 * np.arange(actual.shape[1]))
        for alias in families:
            fam = FAMILIES[alias]
            rows = np.flatnonzero(fam.eligible(fit_part, config.share))
            usable[alias][np.setdiff1d(np.arange(n), rows)] = False
            if not rows.size:
                continue
            fitted = fam.fit(fit_part.select(rows))
            rates = np.zeros((rows.size, actual.shape[1]))
            for j, params in enumerate(fitted):
                if isinstance(params, Failure):
                    usable[alias][rows[j]] = False
                else:
                    rates[j] = fam.week(params)[cells]
            expected = window_sums(rates, config.lead, config.window)
            obs = np.nan_to_num(outcome[rows])
            for k, scale in enumerate(SCALE_GRID):
                p = 1.0 - np.exp(-scale * expected)
                err = np.where(seen[rows], (p - obs) ** 2, 0.0)
                sse[alias][rows, k] += err.sum(axis=1)
                sse_active[alias][rows, k] += np.where(active[rows], err, 0.0).sum(axis=1)
    if not known.any():
        return _fit_fallback(history, "history too short for a backtest fold")
    scores = np.full((n, len(families)), np.inf)
    best_scale = np.ones((n, len(families)))
    for j, alias in enumerate(families):
        per_scale = sse[alias] / np.maximum(known, 1)[:, None]
        k = per_scale.argmin(axis=1)
        scores[:, j] = np.where(usable[alias], per_scale[np.arange(n), k], np.inf)
        best_scale[:, j] = SCALE_GRID[k]
    # Within ``tolerance`` of the best, the earlier (simpler) family wins: a day or two of validation on
    # a sparse series cannot tell families apart, and the simpler one generalises better.
    # With few positive windows the validation score is mostly noise, so the margin grows.
    best = scores.min(axis=1, keepdims=True)
    margin = np.where(positives < config.min_positives, config.sparse_tolerance, config.tolerance)[:, None]
    winner = np.argmax(scores <= best * (1.0 + margin) + 1e-12, axis=1)
    # Too few positive windows to estimate a calibration factor: keep the Poisson formula (c = 1).
    best_scale[positives < config.min_positives] = 1.0
    few_active = (positives_active < config.min_positives) | (known_active < config.min_positives)
    few_idle = (positives - positives_active < config.min_positives) | (
        known - known_active < config.min_positives
    )
    choices: list[Choice | None] = [None] * n
    for j, alias in enumerate(families):
        rows = np.flatnonzero((winner == j) & np.isfinite(scores[:, j]))
        if not rows.size:
            continue
        fitted = FAMILIES[alias].fit(history.select(rows))
        retry: list[int] = []
        for r, params in zip(rows, fitted, strict=True):
            if isinstance(params, Failure):
                log.warning(
                    "forecast family failed on the full history; falling back",
                    extra={"model": history.models[r], "family": alias, "reason": params.reason},
                )
                retry.append(int(r))
                continue
            # Separate factors for "a request in the last state_minutes" and "none": sessions make the
            # first minutes after activity far likelier than the average says, and the quiet ones less.
            c_active = float(SCALE_GRID[sse_active[alias][r].argmin()])
            c_idle = float(SCALE_GRID[(sse[alias][r] - sse_active[alias][r]).argmin()])
            choices[r] = Choice(
                model=history.models[r],
                family=alias,
                params=params,
                scale=float(best_scale[r, j]),
                scale_active=float(best_scale[r, j]) if few_active[r] else c_active,
                scale_idle=float(best_scale[r, j]) if few_idle[r] else c_idle,
                scores=_scores_of(scores[r], families),
            )
        if retry:
            for k, choice in zip(retry, _fit_fallback(history.select(retry), f"{alias} failed"), strict=True):
                choice.scores = _scores_of(scores[k], families)
                choices[k] = choice
    missing = [i for i, c in enumerate(choices) if c is None]
    if missing:
        for k, choice in zip(
            missing, _fit_fallback(history.select(missing), "no family fitted"), strict=True
        ):
            choices[k] = choice
    out = [c for c in choices if c is not None]
    _mark_dormant(history, out, config)
    return out


def _mark_dormant(history: History, choices: list[Choice], config: SelectionConfig) -> None:
    """Scale down models that went silent: no request in the last ``dormant_hours`` where the fitted
    family expected at least ``dormant_expected``. Smoothing families take days to notice a deprecation;
    the chance of such a silence under the fit is below exp(-dormant_expected)."""
    span = min(history.minutes, int(config.dormant_hours * 60))
    if span <= 0:
        return
    recent = history.counts[:, -span:]
    cells = minute_index(history.end - 60 * np.arange(span, 0, -1))
    for i, choice in enumerate(choices):
        if np.nansum(recent[i]) > 0 or np.isnan(recent[i]).mean() > 0.5:
            continue
        expected = float(FAMILIES[choice.family].week(choice.params)[cells].sum())
        if expected >= config.dormant_expected:
            choice.level = 0.5 / expected
            choice.reason = (
                f"dormant: no request in {config.dormant_hours:g} h where {expected:.0f} were expected"
            )
            log.info("forecast dormant model", extra={"model": choice.model, "reason": choice.reason})


def recent_activity(
    csum: npt.NDArray[np.float64], origins: npt.NDArray[np.int64], minutes: int
) -> npt.NDArray[np.bool_]:
    """Whether each model had a request in the ``minutes`` before each origin (a column index into the
    series whose cumulative sums, with a leading zero column, are ``csum``)."""
    hi = np.clip(origins, 0, csum.shape[1] - 1)
    lo = np.clip(origins - minutes, 0, csum.shape[1] - 1)
    return np.asarray((csum[:, hi] - csum[:, lo]) > 0, dtype=bool)


def _scores_of(row: npt.NDArray[np.float64], families: list[str]) -> dict[str, float]:
    return {a: float(s) for a, s in zip(families, row, strict=True) if np.isfinite(s)}


def _fit_fallback(history: History, why: str) -> list[Choice]:
    """Seasonal naive where it fits, else a constant rate, else zero; the reason says which and why."""
    out: list[Choice | None] = [None] * len(history.models)
    pending = list(range(len(history.models)))
    for alias in ("seasonal_naive_daily", "rate"):
        if not pending:
            break
        fitted = FAMILIES[alias].fit(history.select(pending))
        still: list[int] = []
        for i, params in zip(pending, fitted, strict=True):
            if isinstance(params, Failure):
                still.append(i)
            else:
                out[i] = Choice(history.models[i], alias, params, reason=f"{why}: {alias}")
        pending = still
    for i in pending:
        out[i] = Choice(history.models[i], "rate", {"rate": 0.0}, reason=f"{why}: no observed data, rate 0")
    for choice in out:
        assert choice is not None
        log.info("forecast fallback", extra={"model": choice.model, "reason": choice.reason})
    return [c for c in out if c is not None]


def _prior(model: str, own: float, peers: Peers) -> Choice:
    """A new model: the median shape of peers of similar volume, at the model's own rate (``own``, NaN
    when it has no data: then the peers' median rate)."""
    rates = peers.rates
    if np.isnan(own):
        own = float(np.median(rates)) if rates.size else 0.0
    similar = (rates >= own / 3.0) & (rates <= own * 3.0) if own > 0 else rates > 0
    chosen = peers.slots[similar] if similar.any() else peers.slots
    reason = f"new model: prior from {len(chosen)} similar models at its own rate"
    log.info("forecast prior", extra={"model": model, "reason": reason})
    return Choice(model, "prior", prior_params_from_slots(own, chosen), reason=reason)
