"""When a model is wanted: from a waiting request, a hint's window, or a forecast window worth acting on.

A forecast is scanned on a grid of candidate windows (``_grid``) valued all at once (``_window_values``);
only windows some tier could pay for become wants. Forecasts change once per tick but a round runs on
every hint, so a forecast's windows are kept between rounds in a ``_WindowCache`` (part of the
``PlannerMemo``); ``_Windows`` says what ``now`` still changes within the forecast bucket they were made in.
"""

from __future__ import annotations

import bisect
import itertools
import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from forecaster import ModelForecast
from models import Catalog, ModelSpec
from prewarm import CACHE_TIERS, DEMAND_SOURCE, Hint, OrderReason, Tier
from scheduler._planner._config import _INF, PlannerConfig


class _Want(NamedTuple):
    """A model is wanted from ``t0`` to ``t1`` with probability ``p``. (A tuple: a round makes tens of
    thousands, and a frozen dataclass took a third of the round to build them.)"""

    model: str
    p: float
    t0: float
    t1: float
    reason: OrderReason
    demand: bool
    key_time: float  # what the order id is bucketed by: stable across rounds for the same reason


def _wants(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    config: PlannerConfig,
    gains: Mapping[str, Mapping[Tier, float]],
    windows: _WindowCache,
) -> dict[str, list[_Want]]:
    """Every signal that a catalog model will be wanted; anything about other models is ignored."""
    wants: dict[str, list[_Want]] = {}
    for hint in hints:
        if hint.model not in catalog:
            continue
        expected, expires = hint.expected_at(now), hint.expires_at(now)
        if expires <= now:
            continue
        demand = hint.source == DEMAND_SOURCE
        wants.setdefault(hint.model, []).append(
            _Want(
                model=hint.model,
                p=hint.confidence,
                t0=max(expected, now),
                t1=expires,
                reason=OrderReason.DEMAND if demand else OrderReason.HINT,
                demand=demand,
                key_time=expected,
            )
        )
    for model, forecast in forecasts.items():
        spec = catalog.get(model)
        if spec is not None:
            wants.setdefault(model, []).extend(
                _forecast_wants(spec, forecast, now, config, gains[model], windows)
            )
    return {m: w for m, w in wants.items() if w}


def _forecast_wants(
    spec: ModelSpec,
    forecast: ModelForecast,
    now: float,
    config: PlannerConfig,
    gains: Mapping[Tier, float],
    cache: _WindowCache,
) -> list[_Want]:
    """One want per candidate window on the forecast's bucket grid (so a window keeps its order id).

    A window is judged by its whole probability, but the model must be in place only at its *arrival*:
    when ``arrival_quantile`` of that probability has passed, so that a surge at the end of a window
    does not pull the prefetch to the window's start.

    Forecasts change once per tick but a round runs on every hint, so a forecast's windows are kept
    between rounds (in ``cache``) under the start of their grid, the bucket that holds ``now``, and
    everything else they depend on; ``_Windows`` says what ``now`` still changes within that bucket.
    """
    grid = _grid(forecast, now, config)
    if grid is None:
        return []
    first, step, count = grid
    key = (
        spec.id,
        spec.size_bytes,
        first,
        step,
        config.window_s,
        config.arrival_quantile,
        tuple(gains[t] for t in CACHE_TIERS),
        tuple(config.price(t) for t in CACHE_TIERS),
    )
    windows = cache.get(forecast, key)
    if windows is None or windows.count < count:
        t0s = first + step * np.arange(count)
        values = _window_values(spec, forecast, t0s, -_INF, config, gains)
        windows = _Windows(spec, t0s.tolist(), values, config)
        cache.put(forecast, key, windows)
    wants = windows.at(now, count, spec, forecast, config, gains)
    return wants if wants is not None else _forecast_wants_afresh(spec, forecast, now, config, gains)


def _forecast_wants_afresh(
    spec: ModelSpec, forecast: ModelForecast, now: float, config: PlannerConfig, gains: Mapping[Tier, float]
) -> list[_Want]:
    """``_forecast_wants`` with nothing kept: every window valued at ``now``."""
    grid = _grid(forecast, now, config)
    if grid is None:
        return []
    first, step, count = grid
    t0s = first + step * np.arange(count)
    values = _window_values(spec, forecast, t0s, now, config, gains)
    return [w for _, w in _window_wants(spec, t0s.tolist(), values, config.window_s)]


def _grid(forecast: ModelForecast, now: float, config: PlannerConfig) -> tuple[float, float, int] | None:
    """First start, step and number of the candidate windows within the horizon; None: there are none.

    The grid starts at the forecast bucket that holds ``now`` (its first bucket, before it starts).
    """
    n, b = len(forecast.p_any), forecast.bucket_s
    if n == 0:
        return None
    first = forecast.start + math.floor((max(now, forecast.start) - forecast.start) / b) * b
    step = max(config.step_s, float(b))
    last = min(now + config.horizon_s, forecast.end - 1e-9)
    if last < first:
        return None
    return first, step, int((last - first) // step) + 1


_Values = tuple[list[float], list[float], list[bool], list[int]]
"""Per window: P(a request in it), its arrival, whether some tier could pay for it, its first bucket."""


def _window_values(
    spec: ModelSpec,
    forecast: ModelForecast,
    t0s: npt.NDArray[np.floating[Any]],
    now: float,
    config: PlannerConfig,
    gains: Mapping[Tier, float],
) -> _Values:
    """The windows starting at ``t0s``, each counted from ``now`` at the earliest: all at once, from
    cumulative log-probabilities of no request."""
    n, b = len(forecast.p_any), forecast.bucket_s
    cum = forecast.log_miss  # log P(no request in buckets [0, i)), computed once per forecast
    neg = -cum  # non-decreasing, for searchsorted
    begin = np.maximum(t0s, now)
    i0 = np.clip(np.floor((begin - forecast.start) / b).astype(np.int64), 0, n)
    i1 = np.maximum(np.clip(np.ceil((t0s + config.window_s - forecast.start) / b).astype(np.int64), 0, n), i0)
    p = 1.0 - np.exp(cum[i1] - cum[i0])
    # First bucket j in [i0, i1) by whose end the chance of a request reached p × quantile.
    reach = neg[i0] - np.log1p(-p * config.arrival_quantile)
    k = np.maximum(np.searchsorted(neg, reach, side="left"), i0 + 1)
    arrival = np.where(k <= i1, np.maximum(begin, forecast.start + (k - 1) * b), begin)
    useful = _pays(p, arrival, t0s + config.window_s, spec.size_bytes, config, gains)
    return p.tolist(), arrival.tolist(), useful.tolist(), i0.tolist()


def _pays(
    p: Any, arrival: Any, t1: Any, size: int, config: PlannerConfig, gains: Mapping[Tier, float]
) -> Any:
    """Whether some tier could pay for holding the model from ``arrival`` to ``t1`` (an upper bound; see
    ``_payers``): only such windows become wants. Element-wise on arrays, or on one window's floats."""
    held_gb_s = (t1 - arrival) * size / 1e9
    useful: Any = False
    for tier in CACHE_TIERS:
        useful = useful | (p * gains[tier] > held_gb_s * config.price(tier))
    return useful


def _window_want(spec: ModelSpec, p: float, arrival: float, t1: float, useful: bool) -> _Want | None:
    if p <= 0 or not useful:
        return None
    return _Want(spec.id, p, arrival, t1, OrderReason.FORECAST, False, arrival)


def _window_wants(
    spec: ModelSpec, t0s: Sequence[float], values: _Values, window_s: float, start: int = 0
) -> list[tuple[int, _Want]]:
    """(window, want) for each window from ``start`` on worth one, but one per arrival: the first."""
    p, arrival, useful, _ = values
    out: list[tuple[int, _Want]] = []
    seen: set[float] = set()
    # Most windows are worth nothing: skip them before building anything (the planner's hot loop).
    for i in itertools.compress(range(start, len(t0s)), useful[start:]):
        want = _window_want(spec, p[i], arrival[i], t0s[i] + window_s, True)
        if want is not None and want.t0 not in seen:
            seen.add(want.t0)
            out.append((i, want))
    return out


class _Windows:
    """A forecast's wants on one grid, valued as if no window began before ``now``; kept between rounds.

    While ``now`` stays in the grid's first bucket, every window but the first starts at or after it,
    so it is valued the same whatever ``now`` is there. The first one may have begun before ``now``:
    it then keeps its first bucket, so its probability, and its arrival becomes ``max(now, arrival)``.
    Where float rounding breaks either premise, ``at`` says so and the caller values them afresh.
    """

    def __init__(self, spec: ModelSpec, t0s: list[float], values: _Values, config: PlannerConfig) -> None:
        self.count = len(t0s)
        self._t0s = t0s
        self._p, self._arrival, useful, first_buckets = values
        self._first_bucket = first_buckets[0]
        self._head = _window_want(spec, self._p[0], self._arrival[0], t0s[0] + config.window_s, useful[0])
        tail = _window_wants(spec, t0s, values, config.window_s, start=1)
        self._tail_windows = [i for i, _ in tail]
        self._tail = [w for _, w in tail]
        self._tail_at = {w.t0: pos for pos, w in enumerate(self._tail)}

    def at(
        self,
        now: float,
        count: int,
        spec: ModelSpec,
        forecast: ModelForecast,
        config: PlannerConfig,
        gains: Mapping[Tier, float],
    ) -> list[_Want] | None:
        """The wants of the first ``count`` windows at ``now``; None where they cannot be derived."""
        head = self._head
        t0 = self._t0s[0]
        if now > t0:  # the first window began before now: it counts from now
            first_bucket = min(
                max(math.floor((now - forecast.start) / forecast.bucket_s), 0), len(forecast.p_any)
            )
            if (count > 1 and self._t0s[1] < now) or first_bucket != self._first_bucket:
                return None
            p, arrival = self._p[0], max(now, self._arrival[0])
            if arrival != self._arrival[0]:
                t1 = t0 + config.window_s
                head = _window_want(
                    spec, p, arrival, t1, _pays(p, arrival, t1, spec.size_bytes, config, gains)
                )
        cut = bisect.bisect_left(self._tail_windows, count)
        tail = self._tail[:cut]
        if head is None:
            return tail
        twin = self._tail_at.get(head.t0)  # a later window arriving at the same time adds nothing
        if twin is not None and twin < cut:
            del tail[twin]
        return [head, *tail]


class _WindowCache:
    """The last ``_Windows`` of each forecast object still alive, with the key they were made under.

    Held by the object's identity, weakly: a forecast replaced by a new one (even an equal one) is a
    miss, and its entry goes with it. A memo: what a round plans does not depend on what it holds.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[ModelForecast], tuple[object, ...], _Windows]] = {}

    def get(self, forecast: ModelForecast, key: tuple[object, ...]) -> _Windows | None:
        entry = self._entries.get(id(forecast))
        if entry is None or entry[0]() is not forecast or entry[1] != key:
            return None
        return entry[2]

    def put(self, forecast: ModelForecast, key: tuple[object, ...], windows: _Windows) -> None:
        fid = id(forecast)

        def forget(ref: weakref.ref[ModelForecast]) -> None:
            entry = self._entries.get(fid)
            if entry is not None and entry[0] is ref:
                self._entries.pop(fid, None)

        self._entries[fid] = (weakref.ref(forecast, forget), key, windows)
