"""When a model is wanted: from a waiting request, a hint's window, or a forecast window worth acting on.

A forecast is scanned on a grid of candidate windows (``_grid``) valued all at once (``_window_values``);
only windows some tier could pay for become wants. Forecasts change once per tick but a round runs on
every hint, so a forecast's windows are kept between rounds in a ``_WindowCache`` (part of the
``PlannerMemo``); ``_Windows`` says what ``now`` still changes within the forecast bucket they were made in.
"""

from __future__ import annotations

import array
import itertools
import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from forecaster import ModelForecast
from models import Catalog, ModelSpec
from prewarm import CACHE_TIERS, DEMAND_SOURCE, Hint, OrderReason, Tier
from scheduler._planner._config import _INF, PlannerConfig
from scheduler._planner._want import _Columns, _ForecastWants, _Tail, _Want, _Wants

_Grid = tuple[float, float, int]
"""First start, step and number of a forecast's candidate windows."""
_Key = tuple[object, ...]
"""What a forecast's kept windows were valued under (``_WindowCache``)."""


def _wants(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    config: PlannerConfig,
    gains: Mapping[str, Mapping[Tier, float]],
    windows: _WindowCache,
) -> dict[str, _Wants]:
    """Every signal that a catalog model will be wanted; anything about other models is ignored."""
    signals: dict[str, list[_Want]] = {}
    for hint in hints:
        if hint.model not in catalog:
            continue
        expected, expires = hint.expected_at(now), hint.expires_at(now)
        if expires <= now:
            continue
        demand = hint.source == DEMAND_SOURCE
        signals.setdefault(hint.model, []).append(
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
    known = [(spec, f) for m, f in forecasts.items() if (spec := catalog.get(m)) is not None]
    wants = {m: _Wants(listed) for m, listed in signals.items()}
    for model, found in _forecast_wants_of(known, now, config, gains, windows).items():
        listed = signals.get(model)
        wants[model] = found if listed is None else _Wants([*listed, *found.listed], found.forecast)
    return {m: w for m, w in wants.items() if w}


def _forecast_wants_of(
    items: Sequence[tuple[ModelSpec, ModelForecast]],
    now: float,
    config: PlannerConfig,
    gains: Mapping[str, Mapping[Tier, float]],
    cache: _WindowCache,
) -> dict[str, _Wants]:
    """Per model of ``items``, in their order: one want per candidate window on its forecast's bucket
    grid (so a window keeps its order id).

    A window is judged by its whole probability, but the model must be in place only at its *arrival*:
    when ``arrival_quantile`` of that probability has passed, so that a surge at the end of a window
    does not pull the prefetch to the window's start.

    Forecasts change once per tick but a round runs on every hint, so a forecast's windows are kept
    between rounds (in ``cache``) under the start of their grid, the bucket that holds ``now``, and
    everything else they depend on; ``_Windows`` says what ``now`` still changes within that bucket.
    The windows not kept are valued together, one batch per grid and forecast layout (``_value_batch``):
    a full round at a new bucket values every model's, and one at a time that was most of the round.
    """
    kept: dict[str, tuple[int, _Windows]] = {}
    # By (start, bucket, length, grid): forecasts whose windows are valued as one batch.
    batches: dict[tuple[float, int, int, _Grid], list[tuple[ModelSpec, ModelForecast, _Key]]] = {}
    prices = tuple(config.price(t) for t in CACHE_TIERS)
    for spec, forecast in items:
        grid = _grid(forecast, now, config)
        if grid is None:
            continue
        first, step, count = grid
        key: _Key = (
            spec.id,
            spec.size_bytes,
            first,
            step,
            config.window_s,
            config.arrival_quantile,
            tuple(map(gains[spec.id].__getitem__, CACHE_TIERS)),
            prices,
        )
        windows = cache.get(forecast, key)
        if windows is not None and windows.count >= count:
            kept[spec.id] = (count, windows)
        else:
            layout = (forecast.start, forecast.bucket_s, len(forecast.p_any), grid)
            batches.setdefault(layout, []).append((spec, forecast, key))
    for (_, _, _, grid), batch in batches.items():
        # One forecast (a hint's round): numpy on one row costs less than the batch's set-up.
        made = (
            _value_batch([(s, f) for s, f, _ in batch], grid, config, gains)
            if len(batch) > 1
            else [_Windows.valued(batch[0][0], batch[0][1], grid, config, gains[batch[0][0].id])]
        )
        for (spec, forecast, key), windows in zip(batch, made, strict=True):
            cache.put(forecast, key, windows)
            kept[spec.id] = (grid[2], windows)
    out: dict[str, _Wants] = {}
    for spec, forecast in items:
        if spec.id not in kept:
            out[spec.id] = _Wants([])
            continue
        count, windows = kept[spec.id]
        wants = windows.at(now, count, spec, forecast, config, gains[spec.id])
        out[spec.id] = (
            _Wants([], wants)
            if wants is not None
            else _Wants(_forecast_wants_afresh(spec, forecast, now, config, gains[spec.id]))
        )
    return out


def _forecast_wants_afresh(
    spec: ModelSpec, forecast: ModelForecast, now: float, config: PlannerConfig, gains: Mapping[Tier, float]
) -> list[_Want]:
    """One forecast's ``_forecast_wants_of`` with nothing kept: every window valued at ``now``."""
    grid = _grid(forecast, now, config)
    if grid is None:
        return []
    first, step, count = grid
    t0s = first + step * np.arange(count)
    values = _window_values(spec, forecast, t0s, now, config, gains)
    return [w for _, w in _window_wants(spec, t0s.tolist(), values, config.window_s)]


def _grid(forecast: ModelForecast, now: float, config: PlannerConfig) -> _Grid | None:
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


def _pays(p: Any, arrival: Any, t1: Any, size: Any, config: PlannerConfig, gains: Mapping[Tier, Any]) -> Any:
    """Whether some tier could pay for holding the model from ``arrival`` to ``t1`` (an upper bound; see
    ``_payers``): only such windows become wants. Element-wise on arrays (a batch: a row per model, its
    size and gains columns), or on one window's floats."""
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


def _value_batch(
    items: Sequence[tuple[ModelSpec, ModelForecast]],
    grid: _Grid,
    config: PlannerConfig,
    gains: Mapping[str, Mapping[Tier, float]],
) -> list[_Windows]:
    """``_Windows`` of forecasts that share a start, a bucket, a length and so ``grid``: every window of
    every one valued as ``_window_values`` values one forecast's (element for element the same
    arithmetic), a row per forecast, as if no window began before ``now``."""
    first, step, count = grid
    start, b, n = items[0][1].start, items[0][1].bucket_s, len(items[0][1].p_any)
    t0s = first + step * np.arange(count)
    cum = np.stack([f.log_miss for _, f in items])
    i0 = np.clip(np.floor((t0s - start) / b).astype(np.int64), 0, n)
    i1 = np.maximum(np.clip(np.ceil((t0s + config.window_s - start) / b).astype(np.int64), 0, n), i0)
    c0 = cum[:, i0]
    p = 1.0 - np.exp(cum[:, i1] - c0)
    reach = -c0 - np.log1p(-p * config.arrival_quantile)
    # The first bucket j in (i0, i1] whose cumulative chance reaches it: ``searchsorted`` on one row.
    k = np.full(p.shape, n + 1, dtype=np.int64)
    for d in range(int((i1 - i0).max(initial=0)), 0, -1):
        j = i0 + d
        hit = (j <= i1) & (-cum[:, np.minimum(j, n)] >= reach)
        k = np.where(hit, j, k)
    arrival = np.where(k <= i1, np.maximum(t0s, start + (k - 1) * b), t0s)
    sizes = np.array([spec.size_bytes for spec, _ in items], dtype=np.float64)[:, None]
    rows = {t: np.array([gains[spec.id][t] for spec, _ in items])[:, None] for t in CACHE_TIERS}
    useful = _pays(p, arrival, t0s + config.window_s, sizes, config, rows) & (p > 0)
    # The windows after the first: one want per arrival, the first window's (rows sorted by arrival).
    tail = np.where(useful[:, 1:], arrival[:, 1:], np.inf)
    order = np.argsort(tail, axis=1, kind="stable")
    ranked = np.take_along_axis(tail, order, axis=1)
    first_of = np.isfinite(ranked)
    first_of[:, 1:] &= ranked[:, 1:] != ranked[:, :-1]
    keep = np.zeros_like(first_of)
    np.put_along_axis(keep, order, first_of, axis=1)
    at_row, at_col = np.nonzero(keep)
    cols = at_col + 1
    begins = t0s[cols]
    ends = begins + config.window_s
    arrivals = arrival[at_row, cols]
    columns = _Columns(
        p=_doubles(p[at_row, cols]),
        t0=_doubles(arrivals),
        t1=_doubles(ends),
        held=_doubles(ends - arrivals),  # a want's ``t1 - t0``: the same float
        windows=array.array("q", cols.astype(np.int64).tobytes()),
        begins=_doubles(begins),
    )
    bounds = np.concatenate(([0], np.cumsum(np.bincount(at_row, minlength=len(items))))).tolist()
    starts = t0s.tolist()
    p0, a0, u0 = p[:, 0].tolist(), arrival[:, 0].tolist(), useful[:, 0].tolist()
    t1 = starts[0] + config.window_s
    out = []
    for r, (spec, _) in enumerate(items):
        kept = _Tail(spec.id, columns, bounds[r], bounds[r + 1])
        head = _Want(spec.id, p0[r], a0[r], t1, OrderReason.FORECAST, False, a0[r]) if u0[r] else None
        out.append(_Windows(starts, p0[r], a0[r], int(i0[0]), head, kept))
    return out


def _doubles(values: npt.NDArray[np.floating[Any]]) -> array.array[float]:
    return array.array("d", values.astype(np.float64).tobytes())


class _Windows:
    """A forecast's wants on one grid, valued as if no window began before ``now``; kept between rounds.

    While ``now`` stays in the grid's first bucket, every window but the first starts at or after it,
    so it is valued the same whatever ``now`` is there. The first one may have begun before ``now``:
    it then keeps its first bucket, so its probability, and its arrival becomes ``max(now, arrival)``.
    Where float rounding breaks either premise, ``at`` says so and the caller values them afresh.
    ``head``: the first window's want (None: not worth one); ``tail``: those of the others, one per
    arrival, with the windows they are of.
    """

    def __init__(
        self, t0s: list[float], p: float, arrival: float, first_bucket: int, head: _Want | None, tail: _Tail
    ) -> None:
        self.count = len(t0s)
        self._t0s = t0s
        self._p, self._arrival, self._first_bucket = p, arrival, first_bucket
        self._head = head
        self._tail = tail

    @classmethod
    def valued(
        cls,
        spec: ModelSpec,
        forecast: ModelForecast,
        grid: _Grid,
        config: PlannerConfig,
        gains: Mapping[Tier, float],
    ) -> _Windows:
        """One forecast's windows on ``grid``, valued alone (``_value_batch`` values many at once)."""
        first, step, count = grid
        t0s = (first + step * np.arange(count)).tolist()
        values = _window_values(spec, forecast, np.array(t0s), -_INF, config, gains)
        p, arrival, useful, first_buckets = values
        head = _window_want(spec, p[0], arrival[0], t0s[0] + config.window_s, useful[0])
        tail = _window_wants(spec, t0s, values, config.window_s, start=1)
        made = _Tail.of(spec.id, [w for _, w in tail], [i for i, _ in tail], [t0s[i] for i, _ in tail])
        return cls(t0s, p[0], arrival[0], first_buckets[0], head, made)

    def at(
        self,
        now: float,
        count: int,
        spec: ModelSpec,
        forecast: ModelForecast,
        config: PlannerConfig,
        gains: Mapping[Tier, float],
    ) -> _ForecastWants | None:
        """The wants of the first ``count`` windows at ``now``; None where they cannot be derived."""
        head = self._head
        t0 = self._t0s[0]
        if now > t0:  # the first window began before now: it counts from now
            first_bucket = min(
                max(math.floor((now - forecast.start) / forecast.bucket_s), 0), len(forecast.p_any)
            )
            if (count > 1 and self._t0s[1] < now) or first_bucket != self._first_bucket:
                return None
            p, arrival = self._p, max(now, self._arrival)
            if arrival != self._arrival:
                t1 = t0 + config.window_s
                head = _window_want(
                    spec, p, arrival, t1, _pays(p, arrival, t1, spec.size_bytes, config, gains)
                )
        tail = self._tail
        cut = tail.cut(count)
        # A later window arriving at the same time adds nothing. Only one of a window that starts no
        # earlier than the second can arrive then.
        twin = tail.find(head.t0, cut) if head is not None and count > 1 and head.t0 >= self._t0s[1] else -1
        return _ForecastWants(head, tail, cut, twin)


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
        entry = self._entries.get(fid)
        if entry is not None and entry[0]() is forecast:  # the same forecast at a later bucket
            self._entries[fid] = (entry[0], key, windows)
            return

        def forget(ref: weakref.ref[ModelForecast]) -> None:
            entry = self._entries.get(fid)
            if entry is not None and entry[0] is ref:
                self._entries.pop(fid, None)

        self._entries[fid] = (weakref.ref(forecast, forget), key, windows)
