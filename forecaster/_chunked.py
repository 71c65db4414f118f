"""A retrain's fits over chunks of models, each chunk read, fitted and scored on its own.

Selecting and fitting a family is per model but for three things, which the driver does once from
what every chunk hands back:

- a new model's prior is the median shape of every other model's fit (``Peers`` from each chunk,
  merged; the new models' own series are read again in a second, small pass to score them and fit
  their idle-time profiles);
- the reliability table pools every forecast (each chunk tallies its own, the tallies add up);
- the statsmodels families' cap of busy series per retrain, split among chunks by size
  (``Family.eligible``'s ``share``).

Chunks are fixed by ``chunk_models`` alone, never by the number of workers, and results come back in
chunk order, so one worker and many give the same selections, parameters and scores to the bit. Up to
``chunk_models`` models, one chunk holds them all and the result is the unchunked one's.

A ``SeriesSource`` says how many series there are and makes a ``SeriesChunk`` for any rows: the demand
store's (its rows read with ``bulk`` per chunk), a history already in memory, or ``SyntheticSeries``
(``ingest.generate`` one chunk at a time). A worker reads its chunk itself, and the driver takes each
chunk's results in as they come back (``Engine.imap``, in chunk order) and lets them go: per model it
keeps what the bundle and the report are made of (the fitted parameters, the idle profile, six scores,
the backtest's choice without its parameters) and, until the priors are drawn, a half-hour week table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import pandas as pd

from forecaster._backtest import BacktestReport, Scores, assemble_report, score_rows
from forecaster._bundle import ForecasterBundle
from forecaster._engine import Engine
from forecaster._history import History
from forecaster._idle import IdleProfile, fit_idle_profile, idle_edges
from forecaster._select import (
    Choice,
    Peers,
    SelectionConfig,
    one_blas_thread,
    prior_choices,
    select_partial,
)
from prewarm import ConfigError, InvalidInput

__all__ = [
    "ChunkedFit",
    "HistorySeries",
    "SeriesChunk",
    "SeriesSource",
    "StoreSeries",
    "SyntheticSeries",
    "fit_chunked",
]

_PLOTTED = 6
"""Models a chunked report keeps series of, for the backtest plots (the busiest over the test span)."""


class SeriesChunk(Protocol):
    """Some rows of a source, read when ``read`` is called (on whichever worker runs the chunk)."""

    def read(self) -> History: ...


@runtime_checkable
class SeriesSource(Protocol):
    """Per-minute series of ``rows`` models on one grid (``start``, ``minutes``), readable by rows.

    ``portable``: the chunk will be sent to another process, so it must carry how to read, not a
    connection or an object of this one."""

    @property
    def rows(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def minutes(self) -> int: ...

    def chunk(self, rows: Sequence[int], *, portable: bool) -> SeriesChunk: ...


class _Reader(Protocol):
    def bulk(self, models: Any, start: float, end: float, step: int = 60) -> pd.DataFrame: ...


@dataclass(frozen=True)
class _HistoryChunk:
    history: History
    rows: tuple[int, ...] | None = None
    """Rows of ``history`` to read (in this process); None: all of it (a copy made to be sent away)."""

    def read(self) -> History:
        return self.history if self.rows is None else self.history.select(list(self.rows))


@dataclass(frozen=True)
class HistorySeries:
    """A history already in memory, chunked by rows (each chunk a copy of its rows)."""

    history: History

    @property
    def rows(self) -> int:
        return len(self.history.models)

    @property
    def start(self) -> int:
        return self.history.start

    @property
    def minutes(self) -> int:
        return self.history.minutes

    def chunk(self, rows: Sequence[int], *, portable: bool) -> SeriesChunk:
        if portable:  # only this chunk's rows travel, not the whole history
            return _HistoryChunk(self.history.select(list(rows)))
        return _HistoryChunk(self.history, tuple(rows))


@dataclass(frozen=True)
class _ReaderChunk:
    reader: _Reader | None
    url: str | None
    models: list[str]
    start: int
    end: int

    def read(self) -> History:
        if self.reader is not None:
            return History.from_frame(self.reader.bulk(self.models, self.start, self.end, step=60))
        from ingest import DemandStore  # the store read API; only workers of a portable chunk open it

        assert self.url is not None
        store = DemandStore(self.url, create=False)
        try:
            return History.from_frame(store.bulk(self.models, self.start, self.end, step=60))
        finally:
            store.close()


@dataclass(frozen=True)
class StoreSeries:
    """The demand store's models (``models``, as ``models_seen`` lists them) over ``[start, end)``,
    zero-filled. A portable chunk opens the store at ``url`` itself (a worker has no connection)."""

    reader: _Reader
    models: list[str]
    window: tuple[int, int]
    url: str | None = None

    @property
    def rows(self) -> int:
        return len(self.models)

    @property
    def start(self) -> int:
        return self.window[0] // 60 * 60

    @property
    def minutes(self) -> int:
        return max(0, -(-(self.window[1] - self.start) // 60))

    def chunk(self, rows: Sequence[int], *, portable: bool) -> SeriesChunk:
        names = [self.models[i] for i in rows]
        if portable:
            if not self.url:
                raise ConfigError(
                    "workers in other processes need the demand store's URL", setting="PREWARM_DATABASE_URL"
                )
            return _ReaderChunk(None, self.url, names, *self.window)
        return _ReaderChunk(self.reader, None, names, *self.window)


@dataclass(frozen=True)
class _SyntheticChunk:
    models: int
    days: float
    seed: int
    origin: float
    span: range
    pick: tuple[int, ...] | None

    def read(self) -> History:
        from ingest import generate  # the synthetic generator; imported where a chunk is generated

        trace = generate(self.models, self.days, seed=self.seed, start=self.origin, only=self.span)
        history = History(trace.models, int(trace.start), trace.counts.astype(np.float64))
        return history if self.pick is None else history.select(list(self.pick))


@dataclass(frozen=True)
class SyntheticSeries:
    """``ingest.generate(models, days, seed=seed)``'s per-minute counts, generated a chunk at a time on
    the worker that fits it: a benchmark of thousands of models never holds them all."""

    models: int
    days: float
    seed: int = 0
    origin: float | None = None

    @property
    def rows(self) -> int:
        return self.models

    @property
    def start(self) -> int:
        return int(self._origin())

    @property
    def minutes(self) -> int:
        return round(self.days * 1440)

    def _origin(self) -> float:
        if self.origin is not None:
            return self.origin
        from ingest import generate

        return generate(self.models, self.days, seed=self.seed, only=range(0)).start  # its default origin

    def chunk(self, rows: Sequence[int], *, portable: bool) -> SeriesChunk:
        lo, hi = min(rows), max(rows) + 1
        pick = None if list(rows) == list(range(lo, hi)) else tuple(r - lo for r in rows)
        return _SyntheticChunk(self.models, self.days, self.seed, self._origin(), range(lo, hi), pick)


# -- work items and what they hand back ------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    config: SelectionConfig
    cut: int | None
    """Train before it, score after it (the holdout backtest); None: no backtest."""
    lead: int
    window: int


@dataclass(frozen=True)
class _Fit:
    chunk: SeriesChunk
    rows: tuple[int, ...]
    plan: _Plan


@dataclass(frozen=True)
class _Finish:
    """Second pass over the new models of one chunk, with the priors the driver gave them."""

    chunk: SeriesChunk
    rows: tuple[int, ...]
    plan: _Plan
    train_priors: tuple[Choice | None, ...]
    full_priors: tuple[Choice | None, ...]


@dataclass
class _Idle:
    rows: npt.NDArray[np.int64]
    last: npt.NDArray[np.float64]
    prior: npt.NDArray[np.float64]
    g: npt.NDArray[np.float64]
    state: npt.NDArray[np.bool_]


@dataclass
class _Scored:
    rows: npt.NDArray[np.int64]
    scores: Scores
    volume: npt.NDArray[np.float64]
    test: History
    """The first test day of the ``_PLOTTED`` busiest scored rows (rows of ``plotted``)."""
    plotted: npt.NDArray[np.int64]


@dataclass
class _Part:
    models: list[str]
    rows: tuple[int, ...]
    full: list[Choice | None]
    full_new: tuple[list[str], npt.NDArray[np.float64]]
    full_peers: Peers | None
    train: list[Choice | None] | None
    train_new: tuple[list[str], npt.NDArray[np.float64]] | None
    train_peers: Peers | None
    idle: _Idle | None
    scored: _Scored | None


def _known(choices: list[Choice | None]) -> tuple[npt.NDArray[np.int64], list[Choice]]:
    rows = np.array([i for i, c in enumerate(choices) if c is not None], dtype=np.int64)
    return rows, [c for c in choices if c is not None]


def _idle_of(
    history: History, rows: npt.NDArray[np.int64], choices: list[Choice], config: SelectionConfig
) -> _Idle:
    bundle = ForecasterBundle.from_choices(
        choices, trained_until=float(history.end), state_minutes=config.state_minutes
    )
    p = fit_idle_profile(history.select(rows), bundle)
    return _Idle(rows, p.last_minute, p.prior, p.g, p.state)


def _score(history: History, rows: npt.NDArray[np.int64], choices: list[Choice], plan: _Plan) -> _Scored:
    assert plan.cut is not None
    train, test = history.select(rows).split(plan.cut)
    bundle = ForecasterBundle.from_choices(
        choices, trained_until=float(train.end), state_minutes=plan.config.state_minutes
    )
    scores = score_rows(train, test, bundle, plan.lead, plan.window)
    volume = np.nansum(test.counts, axis=1)
    top = np.argsort(-volume, kind="stable")[:_PLOTTED]
    head = History([test.models[i] for i in top], test.start, test.counts[top, : min(test.minutes, 1440)])
    # Forecasts per origin are kept for the plotted rows only: all of them would grow with the models.
    kept = replace(scores, p=scores.p[top], outcome=scores.outcome[top])
    return _Scored(rows, kept, volume, head, top.astype(np.int64))


def _fit_task(item: _Fit) -> _Part:
    """One chunk: the full-history fit and idle profiles, and (with a cut) the backtest's fit and scores,
    for every model but the new ones, which wait for the priors (``_finish_task``)."""
    plan = item.plan
    history = item.chunk.read()
    with one_blas_thread():
        full = select_partial(history, plan.config)
        rows, known = _known(full.choices)
        idle = _idle_of(history, rows, known, plan.config) if rows.size else None
        part = _Part(
            history.models,
            item.rows,
            full.choices,
            (full.new_models, full.new_rates),
            Peers.of(known),
            None,
            None,
            None,
            idle,
            None,
        )
        if plan.cut is not None:
            train, _ = history.split(plan.cut)
            chosen = select_partial(train, replace(plan.config, lead=plan.lead, window=plan.window))
            trows, tknown = _known(chosen.choices)
            part.train, part.train_new, part.train_peers = (
                chosen.choices,
                (chosen.new_models, chosen.new_rates),
                Peers.of(tknown),
            )
            part.scored = _score(history, trows, tknown, plan) if trows.size else None
    return part


def _finish_task(item: _Finish) -> tuple[_Idle | None, _Scored | None]:
    """The new models of one chunk: idle profiles of the full fit's priors, scores of the backtest's."""
    history = item.chunk.read()
    with one_blas_thread():
        rows, known = _known(list(item.full_priors))
        idle = _idle_of(history, rows, known, item.plan.config) if rows.size else None
        trows, tknown = _known(list(item.train_priors))
        scored = _score(history, trows, tknown, item.plan) if trows.size else None
    return idle, scored


# -- the driver ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkedFit:
    bundle: ForecasterBundle
    report: BacktestReport | None
    chunks: int
    seconds: dict[str, float]


@dataclass(frozen=True)
class _Offer:
    """One of a chunk's busiest scored models: a candidate for the report's plots, with what they show
    of it (copied out of the chunk's arrays, so that nothing else of the chunk stays alive)."""

    volume: float
    row: int
    model: str
    test: npt.NDArray[np.float64]
    p: npt.NDArray[np.float64]
    outcome: npt.NDArray[np.float64]
    choice: Choice
    """What it was trained with (the backtest's fit, or its prior)."""


@dataclass
class _Gathered:
    """What the driver keeps of the chunks it has had back: per model only what the bundle and the
    report are made of, never a chunk's own results once they are taken in (``take``).

    Per model: its name, its full-history choice (the bundle), its backtest choice without parameters
    (the report reads its family, calibration, scores and reason), its peers' half-hour table (a new
    model's prior is drawn on all of them), its idle profile and six scores. The plots' models are the
    ``_PLOTTED`` busiest offered so far, with their backtest parameters and series."""

    models: list[str] = field(default_factory=list)
    full: list[Choice | None] = field(default_factory=list)
    train: list[Choice | None] = field(default_factory=list)
    full_new: list[tuple[list[str], npt.NDArray[np.float64]]] = field(default_factory=list)
    full_peers: list[Peers] = field(default_factory=list)
    train_new: list[tuple[list[str], npt.NDArray[np.float64]]] = field(default_factory=list)
    train_peers: list[Peers] = field(default_factory=list)
    idles: list[tuple[npt.NDArray[np.int64], _Idle]] = field(default_factory=list)
    scores: list[tuple[npt.NDArray[np.int64], Scores]] = field(default_factory=list)
    offers: list[_Offer] = field(default_factory=list)
    waiting: list[tuple[tuple[int, ...], _Plan]] = field(default_factory=list)
    """Per chunk with new models, their source rows: read again once the priors are known."""

    def take(self, part: _Part, plan: _Plan) -> None:
        """A first-pass chunk's results, in chunk order."""
        self.models += part.models
        self.full += part.full
        self.full_new.append(part.full_new)
        if part.full_peers is not None:
            self.full_peers.append(part.full_peers)
        new = set(part.full_new[0])
        if part.train is not None:
            # Only the plotted few need their parameters, and those are kept with their offer.
            self.train += [None if c is None else replace(c, params={}) for c in part.train]
        if part.train_new is not None:
            self.train_new.append(part.train_new)
            new.update(part.train_new[0])
        if part.train_peers is not None:
            self.train_peers.append(part.train_peers)
        rows = np.asarray(part.rows)
        if part.idle is not None:
            self.idles.append((rows[part.idle.rows], part.idle))
        if part.scored is not None:
            assert part.train is not None
            self._score(rows[part.scored.rows], part.scored, [part.train[i] for i in part.scored.rows])
        local = [i for i, m in enumerate(part.models) if m in new]
        if local:
            self.waiting.append((tuple(part.rows[i] for i in local), plan))

    def take_finished(self, item: _Finish, idle: _Idle | None, scored: _Scored | None) -> None:
        """A second-pass chunk's results (its new models'), in chunk order."""
        rows = np.asarray(item.rows)
        if idle is not None:
            self.idles.append((rows[idle.rows], idle))
        if scored is not None:
            self._score(rows[scored.rows], scored, [item.train_priors[i] for i in scored.rows])

    def _score(self, at: npt.NDArray[np.int64], scored: _Scored, choices: list[Choice | None]) -> None:
        self.scores.append((at, replace(scored.scores, p=np.zeros((0, 0)), outcome=np.zeros((0, 0)))))
        for k, r in enumerate(scored.plotted):
            choice = choices[r]
            assert choice is not None
            offer = _Offer(
                float(scored.volume[r]),
                int(at[r]),
                scored.test.models[k],
                scored.test.counts[k].copy(),
                scored.scores.p[k].copy(),
                scored.scores.outcome[k].copy(),
                choice,
            )
            self.offers.append(offer)
        # The busiest over the test span, ties to the first row: the order one pass over all would give.
        self.offers.sort(key=lambda o: (-o.volume, o.row))
        del self.offers[_PLOTTED:]


def fit_chunked(
    source: SeriesSource,
    config: SelectionConfig,
    engine: Engine,
    *,
    chunk_models: int,
    holdout_s: int | None,
    lead: int,
    window: int,
    bucket_s: int = 60,
    horizon_s: int = 7200,
) -> ChunkedFit:
    """Fit the bundle on all of ``source`` and, with ``holdout_s``, backtest on its last ``holdout_s``.

    What ``fit_bundle`` and ``backtest`` give on the same series in memory, chunk by chunk on ``engine``.
    Each chunk's results are taken in (``_Gathered``) as they come back, in chunk order, and let go."""
    n = source.rows
    if n == 0:
        raise InvalidInput("no series to fit", reason="empty")
    grid = History([], source.start, np.zeros((0, source.minutes)))
    cut = None if holdout_s is None else grid.end - holdout_s
    if cut is not None:
        train_grid, test_grid = grid.split(cut)
        if train_grid.minutes < 60 or test_grid.minutes < lead + window:
            raise InvalidInput("history too short for the holdout backtest", reason="split")
    bounds = [range(lo, min(lo + chunk_models, n)) for lo in range(0, n, chunk_models)]
    plans = [_Plan(replace(config, share=len(b) / n), cut, lead, window) for b in bounds]
    began = time.perf_counter()
    gathered = _Gathered()
    parts = engine.imap(
        _fit_task,
        (
            _Fit(source.chunk(b, portable=engine.portable), tuple(b), p)
            for b, p in zip(bounds, plans, strict=True)
        ),
    )
    for part, plan in zip(parts, plans, strict=True):
        gathered.take(part, plan)
    first_s = time.perf_counter() - began

    full_priors = _priors(gathered.full_new, gathered.full_peers)
    train_priors = _priors(gathered.train_new, gathered.train_peers) if cut is not None else {}
    gathered.full_peers, gathered.train_peers = [], []
    models = gathered.models
    finish = [
        _Finish(
            source.chunk(list(rows), portable=engine.portable),
            rows,
            plan,
            tuple(train_priors.get(models[i]) for i in rows),
            tuple(full_priors.get(models[i]) for i in rows),
        )
        for rows, plan in gathered.waiting
    ]
    mark = time.perf_counter()
    for item, (idle, scored) in zip(finish, engine.imap(_finish_task, finish), strict=True):
        gathered.take_finished(item, idle, scored)
    second_s = time.perf_counter() - mark

    mark = time.perf_counter()
    full = [c if c is not None else full_priors[m] for m, c in zip(models, gathered.full, strict=True)]
    bundle = ForecasterBundle.from_choices(
        full,
        trained_until=float(grid.end),
        bucket_s=bucket_s,
        horizon_s=horizon_s,
        state_minutes=config.state_minutes,
    )
    bundle.idle = _idle_profile(models, gathered.idles)
    report = None
    if cut is not None:
        train = [c if c is not None else train_priors[m] for m, c in zip(models, gathered.train, strict=True)]
        report = _report(
            models,
            train,
            gathered.scores,
            gathered.offers,
            plan=plans[0],
            grid=grid,
            fit_s=first_s + second_s,
        )
    assemble_s = time.perf_counter() - mark
    seconds = {
        "fit_seconds": round(first_s, 3),
        "new_models_seconds": round(second_s, 3),
        "assemble_seconds": round(assemble_s, 3),
    }
    return ChunkedFit(bundle, report, len(bounds), seconds)


def _priors(new: list[tuple[list[str], npt.NDArray[np.float64]]], peers: list[Peers]) -> dict[str, Choice]:
    """Every chunk's new models' priors, drawn on the peers of all chunks (in model order)."""
    names = [m for models, _ in new for m in models]
    if not names:
        return {}
    rates = np.concatenate([r for _, r in new])
    return {c.model: c for c in prior_choices(names, rates, Peers.merge(peers))}


def _idle_profile(models: list[str], parts: list[tuple[npt.NDArray[np.int64], _Idle]]) -> IdleProfile:
    empty = IdleProfile.empty(models)
    last, prior, g, state = empty.last_minute.copy(), empty.prior.copy(), empty.g.copy(), empty.state.copy()
    for at, part in parts:
        last[at], prior[at], g[at], state[at] = part.last, part.prior, part.g, part.state
    return IdleProfile(list(models), last, prior, g, state, idle_edges())


def _report(
    models: list[str],
    train: list[Choice],
    scored: list[tuple[npt.NDArray[np.int64], Scores]],
    chosen: list[_Offer],
    *,
    plan: _Plan,
    grid: History,
    fit_s: float,
) -> BacktestReport:
    assert plan.cut is not None
    at = np.concatenate([a for a, _ in scored])
    if sorted(at.tolist()) != list(range(len(models))):
        raise AssertionError("every model is scored exactly once")
    order = np.argsort(at, kind="stable")
    merged = Scores.merge([s for _, s in scored], order)
    train_grid, test_grid = grid.split(plan.cut)
    test = History(
        [o.model for o in chosen],
        test_grid.start,
        np.stack([o.test for o in chosen]) if chosen else np.zeros((0, 0)),
    )
    plotted = ForecasterBundle.from_choices(
        [o.choice for o in chosen],
        trained_until=float(train_grid.end),
        state_minutes=plan.config.state_minutes,
    )
    p = np.stack([o.p for o in chosen]) if chosen else np.zeros((0, 0))
    outcome = np.stack([o.outcome for o in chosen]) if chosen else np.zeros((0, 0))
    return assemble_report(
        replace(merged, p=p, outcome=outcome),
        train,
        lead=plan.lead,
        window=plan.window,
        state_minutes=plan.config.state_minutes,
        train=(train_grid.start, train_grid.end),
        test_until=test_grid.end,
        fit_seconds=fit_s,
        families=None,
        bundle=plotted,
        test=test,
    )
