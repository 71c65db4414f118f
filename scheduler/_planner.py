"""The planner: forecasts, hints and the cluster's state in, timed orders out. Pure: ``now`` is passed in.

For each model the planner finds when it is next wanted (a demand signal, a hint's window, or the first
forecast window worth acting on), picks a node, and values each cache tier closer than where the model
is now::

    benefit(T) = P(request in window) × seconds of waiting saved by being in T × priority weight
    miss(T)    = (1 - P) × seconds of transfer into L1/L0 that a wrong guess wastes × ``miss_penalty``
    cost(T)    = GB × seconds held in T × the tier's price per GB·s (by default only disk has a price)

The tier with the best positive ``benefit - miss - cost`` is the target. Memory that nothing else wants
costs nothing to fill: the real cost of holding a model is the opportunity cost of what it displaces,
and that is arbitrated by value when room is made (a newcomer displaces only residents worth less, where
a resident is worth ``P × seconds saved × weight``). ``miss`` is what keeps speculation honest: a move
into host or GPU memory pays off only when ``P × weight > (1 - P) × miss_penalty`` (P > 2/3 for a
standard model with the default), so few prefetches are wasted. The prefetch starts ``lead`` seconds
before the window: the hops still to do at the node's measured bandwidth, plus a margin. Candidates are
placed most urgent first (demand, then the soonest window) into a per-node book of bytes per tier that is
never over-committed: room is made by demoting less valuable residents one tier down (L0→L1→L2, and from
L2 out to L3), or the target falls back one tier, or the candidate waits for a later round (deferred).

Hysteresis keeps the plan from thrashing: a resident is only demoted to make room when it is worth less
than the newcomer (which also pays ``miss``, a resident does not) and was neither loaded nor used within
``min_residence_s``; a resident cools down on its own only under pressure, one tier per round at most,
and only when a request in the window has become unlikely (out of GPU memory, ``P < cool_p``) or its
benefit falls below ``keep_ratio`` times a configured holding cost; and a model evicted as a
misprediction is not fetched again within ``cooldown_s``.

Order ids are a digest of (node, model, version, action, tier, time bucket of the reason), so the same
decision taken in two rounds, or by two scheduler replicas, has the same id and is applied once.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from forecaster import ModelForecast
from models import Catalog, ModelSpec
from prewarm import (
    CACHE_TIERS,
    DEMAND_SOURCE,
    Hint,
    Order,
    OrderAction,
    OrderReason,
    ResidentModel,
    SchedulerSettings,
    Tier,
    admit,
    effect,
)
from scheduler._cluster import ClusterState, NodeState

__all__ = [
    "Placement",
    "Plan",
    "PlannerConfig",
    "order_id",
    "plan",
    "plan_detailed",
]

_INF = math.inf


def _default_prices() -> dict[Tier, float]:
    # Per GB·s held. Idle GPU and host memory cost nothing to fill: what a model held there really costs
    # is what it keeps out, and that is weighed by value when room is made. A fixed price here demoted a
    # busy 70 GB model every few minutes with the GPU otherwise empty. Disk keeps a token price so that
    # a model with no realistic chance of a request (P below ~0.1% for 140 GB) is not even staged.
    return {Tier.L0: 0.0, Tier.L1: 0.0, Tier.L2: 1e-6}


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the planning policy. Times in seconds."""

    window_s: float = 600.0
    """Length of the window a forecast probability is taken over, and a model is held for."""
    horizon_s: float = 3600.0
    """How far ahead forecasts are scanned for a window worth a timed prefetch."""
    step_s: float = 60.0
    """Step of that scan."""
    lead_margin_s: float = 5.0
    """Added to the transfer time when computing when a prefetch must start."""
    lead_margin_frac: float = 0.2
    """Transfer time is stretched by this fraction, for bandwidth that varies."""
    hop_overhead_s: float = 0.5
    """Fixed cost of each hop (allocation, open, engine hand-over) on top of bytes / bandwidth."""
    price_per_gb_s: Mapping[Tier, float] = field(default_factory=_default_prices)
    """Cost of holding one GB in a tier for one second, in the same unit as a weighted second waited."""
    keep_ratio: float = 0.5
    """A resident stays while benefit ≥ keep_ratio × cost; a newcomer needs benefit > cost (hysteresis)."""
    miss_penalty: float = 2.0
    """Weighted seconds charged per second of an L1/L0 transfer that serves no request, times (1 - P).

    A speculative move there is made when ``P × weight > (1 - P) × miss_penalty``: for a standard model
    P > 2/3 with 2, so that mispredictions stay a small share of prefetches; 0 prefetches on any chance.
    """
    cool_p: float = 0.05
    """A forecast resident of L0 is demoted on its own (not to make room) when P(request in the
    window) falls below this: it keeps room for a demand load that would otherwise evict by LRU."""
    min_residence_s: float = 120.0
    """A model loaded or used this recently is never demoted to make room for a speculative prefetch."""
    misprediction_window_s: float = 600.0
    """A prefetched model unused this long after it was loaded is evicted from L1/L0 and counted."""
    cooldown_s: float = 600.0
    """A model evicted as a misprediction is not prefetched again on that node for this long."""
    order_ttl_s: float = 120.0
    """Deadline of demotions and evictions, counted from when they are due."""
    id_bucket_s: float = 60.0
    """Decisions whose reason falls in the same bucket share an order id."""
    arrival_quantile: float = 0.1
    """A forecast model must be in place when this share of its window's probability has passed."""

    @classmethod
    def from_settings(cls, settings: SchedulerSettings, **overrides: Any) -> PlannerConfig:
        base = cls(
            misprediction_window_s=settings.misprediction_window_s,
            cooldown_s=settings.misprediction_window_s,
            miss_penalty=settings.miss_penalty,
            cool_p=settings.cool_p,
            order_ttl_s=max(4 * settings.plan_interval_s, 10.0),
        )
        return replace(base, **overrides)


@dataclass(frozen=True)
class Placement:
    """Where the plan puts a model (or wanted to, for a deferred one), and why."""

    model: str
    node: str
    tier: Tier
    reason: OrderReason
    not_before: float
    deadline: float
    value: float


@dataclass(frozen=True)
class Plan:
    orders: tuple[Order, ...]
    placements: tuple[Placement, ...]
    """Prefetches decided in this round."""
    deferred: tuple[Placement, ...]
    """Prefetches worth doing that did not fit anywhere this round: they wait for room."""
    mispredictions: tuple[tuple[str, str], ...]
    """(node, model) pairs evicted because the prefetch served no request within the window."""


def order_id(node: str, model: str, version: str, action: OrderAction, tier: Tier, bucket: int) -> str:
    text = f"{node}|{model}|{version}|{action.value}|{tier.value}|{bucket}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def plan(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    cluster: ClusterState,
    config: PlannerConfig,
) -> list[Order]:
    """The orders to publish now (each timed by ``not_before``) for this state of the world."""
    return list(plan_detailed(now, forecasts, hints, catalog, cluster, config).orders)


# ------------------------------------------------------------------------------------------ internals


@dataclass(frozen=True)
class _Want:
    """A model is wanted from ``t0`` to ``t1`` with probability ``p``."""

    model: str
    p: float
    t0: float
    t1: float
    reason: OrderReason
    demand: bool
    key_time: float  # what the order id is bucketed by: stable across rounds for the same reason


@dataclass
class _Entry:
    model: str
    bytes: int
    value: float  # what keeping it here is worth; a newcomer must be worth more to displace it
    protected: bool  # placed this round, pinned, or recently loaded/used: never a victim


class _Book:
    """Bytes per tier on one node during one round; copied before a tentative placement.

    ``put`` and ``drop`` keep a running total per tier, so asking for free room costs nothing.
    """

    def __init__(
        self,
        node: NodeState,
        capacity: dict[Tier, int],
        held: dict[Tier, dict[str, _Entry]],
        used: dict[Tier, int],
    ) -> None:
        self.node = node
        self.capacity = capacity
        self.held = held
        self._used = used  # the entries' bytes, and bytes the node reports in use but does not list

    def free(self, tier: Tier) -> int:
        return self.capacity[tier] - self._used[tier]

    def put(self, tier: Tier, key: str, entry: _Entry) -> None:
        self.drop(tier, key)
        self.held[tier][key] = entry
        self._used[tier] += entry.bytes

    def drop(self, tier: Tier, key: str) -> _Entry | None:
        entry = self.held[tier].pop(key, None)
        if entry is not None:
            self._used[tier] -= entry.bytes
        return entry

    def closest(self, model: str) -> Tier:
        return next((t for t in CACHE_TIERS if model in self.held[t]), Tier.L3)

    def holds(self, model: str, tier: Tier) -> bool:
        """Whether this node has ``model`` in ``tier`` or closer to the GPU."""
        return self.closest(model).level <= tier.level

    def copy(self) -> _Book:
        # Entries are replaced, never mutated, so copying the per-tier dicts is enough.
        return _Book(self.node, self.capacity, {t: dict(d) for t, d in self.held.items()}, dict(self._used))


@dataclass
class _Round:
    now: float
    config: PlannerConfig
    catalog: Catalog
    wants: Mapping[str, list[_Want]]
    gains: Mapping[str, Mapping[Tier, float]]
    """Per model, ``_gains``: computed once per round, for forecast wants and ``_payers`` alike."""
    books: dict[str, _Book] = field(default_factory=dict)
    orders: list[Order] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    deferred: list[Placement] = field(default_factory=list)
    mispredictions: list[tuple[str, str]] = field(default_factory=list)
    moved: set[str] = field(default_factory=set)

    def held(self, model: str, tier: Tier) -> bool:
        """Whether some node has ``model`` in ``tier`` or closer: requests go to the closest copy."""
        return any(b.holds(model, tier) for b in self.books.values())


def plan_detailed(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    cluster: ClusterState,
    config: PlannerConfig,
) -> Plan:
    """``plan`` with its reasoning: placements, deferred candidates and counted mispredictions."""
    nodes = list(cluster.nodes.values())
    signalled = {*forecasts, *(h.model for h in hints)}
    gains = {m: _gains(catalog[m], nodes, config) for m in signalled if m in catalog}
    wants = _wants(now, forecasts, hints, catalog, config, gains)
    rnd = _Round(now=now, config=config, catalog=catalog, wants=wants, gains=gains)
    for name in sorted(cluster.nodes):
        rnd.books[name] = _open_book(rnd, cluster.nodes[name])
    _book_pending(rnd, cluster)
    _evict_mispredictions(rnd)
    cooling = _cooldowns(cluster, now, config) | set(rnd.mispredictions)

    candidates = []
    for model, model_wants in wants.items():
        spec = catalog[model]
        worth = _payers(spec, model_wants, rnd)
        options = _best_candidate(rnd, spec, worth, cooling) if worth else []
        if options:
            candidates.append(options)
    # Demand first, then the soonest start, then the most value per byte.
    candidates.sort(
        key=lambda cs: (
            not cs[0].want.demand,
            cs[0].not_before,
            -cs[0].value / cs[0].spec.size_bytes,
            cs[0].spec.id,
        )
    )
    # Expected requests over the horizon times bytes: what a model adds to its node's load.
    traffic = {
        m: f.expected_in(now, now + config.horizon_s) * catalog[m].size_bytes
        for m, f in forecasts.items()
        if m in catalog
    }
    loads: dict[str, float] = {}
    for options in candidates:
        # The node is chosen now, against the books as earlier placements left them: chosen up front,
        # every tie went to the same node and one node held the whole catalog while the other idled.
        chosen = options[0] if len(options) == 1 else _least_loaded(rnd, options, traffic, loads)
        _place(rnd, chosen)
        loads.pop(chosen.node, None)  # only that node's book changed
    soon = now + config.window_s
    wanted = sorted(m for m, ws in wants.items() if any(w.t0 <= soon for w in ws))
    _cool_down(rnd, forecasts, hints, wanted)
    return Plan(
        orders=tuple(rnd.orders),
        placements=tuple(rnd.placements),
        deferred=tuple(rnd.deferred),
        mispredictions=tuple(rnd.mispredictions),
    )


def _wants(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    config: PlannerConfig,
    gains: Mapping[str, Mapping[Tier, float]],
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
            wants.setdefault(model, []).extend(_forecast_wants(spec, forecast, now, config, gains[model]))
    return {m: w for m, w in wants.items() if w}


def _gains(spec: ModelSpec, nodes: Sequence[NodeState], config: PlannerConfig) -> dict[Tier, float]:
    """Per tier, the most a certain request could be worth: waiting saved from L3 on the slowest node."""
    return {
        tier: spec.priority.weight
        * max((_raw_lead(n, spec.size_bytes, Tier.L3, tier, config) for n in nodes), default=0.0)
        for tier in CACHE_TIERS
    }


def _forecast_wants(
    spec: ModelSpec, forecast: ModelForecast, now: float, config: PlannerConfig, gains: Mapping[Tier, float]
) -> list[_Want]:
    """One want per candidate window on the forecast's bucket grid (so a window keeps its order id).

    A window is judged by its whole probability, but the model must be in place only at its *arrival*:
    when ``arrival_quantile`` of that probability has passed, so that a surge at the end of a window
    does not pull the prefetch to the window's start.

    Forecasts change once per tick but a round runs on every hint, so a forecast's windows are kept
    between rounds (``_WINDOWS``) under the start of their grid, the bucket that holds ``now``, and
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
        tuple(config.price_per_gb_s.get(t, 0.0) for t in CACHE_TIERS),
    )
    windows = _WINDOWS.get(forecast, key)
    if windows is None or windows.count < count:
        t0s = first + step * np.arange(count)
        values = _window_values(spec, forecast, t0s, -_INF, config, gains)
        windows = _Windows(spec, t0s.tolist(), values, config)
        _WINDOWS.put(forecast, key, windows)
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
        useful = useful | (p * gains[tier] > held_gb_s * config.price_per_gb_s.get(tier, 0.0))
    return useful


def _window_want(spec: ModelSpec, p: float, arrival: float, t1: float, useful: bool) -> _Want | None:
    if p <= 0 or not useful:
        return None
    return _Want(
        model=spec.id, p=p, t0=arrival, t1=t1, reason=OrderReason.FORECAST, demand=False, key_time=arrival
    )


def _window_wants(
    spec: ModelSpec, t0s: Sequence[float], values: _Values, window_s: float, start: int = 0
) -> list[tuple[int, _Want]]:
    """(window, want) for each window from ``start`` on worth one, but one per arrival: the first."""
    p, arrival, useful, _ = values
    out: list[tuple[int, _Want]] = []
    seen: set[float] = set()
    for i in range(start, len(t0s)):
        want = _window_want(spec, p[i], arrival[i], t0s[i] + window_s, useful[i])
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


_WINDOWS = _WindowCache()


def _raw_lead(node: NodeState, size: int, frm: Tier, to: Tier, config: PlannerConfig) -> float:
    """Seconds to move ``size`` bytes from tier ``frm`` to the closer tier ``to``."""
    return _hops_s(node.hop_rates, config.hop_overhead_s, size, frm.level, to.level)


@functools.lru_cache(maxsize=65_536)
def _hops_s(rates: tuple[float, ...], overhead: float, size: int, frm: int, to: int) -> float:
    # Called for every (model, node, tier) of every round with few distinct arguments: memoised.
    return sum(
        (size / rate if rate > 0 else _INF) + overhead
        for level, rate in enumerate(rates)
        if to <= level < frm
    )


def _lead(node: NodeState, size: int, frm: Tier, to: Tier, config: PlannerConfig) -> float:
    raw = _raw_lead(node, size, frm, to, config)
    return raw * (1 + config.lead_margin_frac) + config.lead_margin_s if raw > 0 else 0.0


def _net(
    spec: ModelSpec,
    want: _Want,
    node: NodeState,
    frm: Tier,
    to: Tier,
    config: PlannerConfig,
    *,
    move: bool = True,
) -> float:
    """benefit - cost of having ``spec`` in ``to`` (rather than ``frm``) for the wanted window.

    ``move``: the bytes still have to travel, so a wrong guess wastes the hops into L1/L0 (the staged
    disk copy stays useful either way); a resident already there (``move=False``) risks nothing.
    """
    saved = _raw_lead(node, spec.size_bytes, frm, to, config)
    benefit = want.p * saved * spec.priority.weight
    held = (want.t1 - want.t0) + _lead(node, spec.size_bytes, frm, to, config)
    cost = spec.size_bytes / 1e9 * held * config.price_per_gb_s.get(to, 0.0)
    if move and to.level < Tier.L2.level:
        wasted = _raw_lead(node, spec.size_bytes, Tier.L2 if frm.level > 2 else frm, to, config)
        cost += (1.0 - want.p) * wasted * config.miss_penalty
    return benefit - cost


def _keep_value(
    spec: ModelSpec, wants: Sequence[_Want], node: NodeState, tier: Tier, now: float, config: PlannerConfig
) -> float:
    """What holding a resident in ``tier`` over the coming window is worth (0 with no signal)."""
    current = [w for w in wants if w.t0 <= now + config.window_s]
    if any(w.demand for w in current):
        return _INF
    best = 0.0
    for want in current:
        best = max(best, _net(spec, want, node, tier.farther(), tier, config, move=False))
    return best


def _open_book(rnd: _Round, node: NodeState) -> _Book:
    now, config, catalog, wants = rnd.now, rnd.config, rnd.catalog, rnd.wants
    held: dict[Tier, dict[str, _Entry]] = {t: {} for t in CACHE_TIERS}
    for tier in CACHE_TIERS:
        for r in node.residents(tier):
            spec = catalog.get(r.model)
            in_catalog = spec is not None and spec.version == r.version
            value = (
                _keep_value(spec, wants.get(r.model, []), node, tier, now, config)
                if spec is not None and in_catalog
                else 0.0
            )
            # A copy of another version still takes bytes but never counts as holding the model.
            key = r.model if in_catalog else f"{r.model}@{r.version}"
            held[tier][key] = _Entry(
                model=key,
                bytes=r.bytes,
                value=value,
                protected=_protected(r, now, config) or not in_catalog,
            )
    return _Book(
        node=node,
        capacity={t: node.capacity.get(t, 0) for t in CACHE_TIERS},
        held=held,
        used={t: node.unlisted.get(t, 0) + sum(e.bytes for e in held[t].values()) for t in CACHE_TIERS},
    )


def _protected(r: ResidentModel, now: float, config: PlannerConfig) -> bool:
    if r.pins > 0:
        return True
    recent = [t for t in (r.last_used, r.loaded_at) if t is not None]
    return any(now - t < config.min_residence_s for t in recent)


def _book_pending(rnd: _Round, cluster: ClusterState) -> None:
    """Orders already out but not yet reflected in a report hold their bytes in this round too.

    Each is booked as the executor will carry it out (``prewarm.admit`` and ``prewarm.effect``): one it
    would refuse changes nothing. A prefetch's copies are never victims this round; a demoted copy keeps
    what it was worth where it was.
    """
    for order in sorted(cluster.pending, key=lambda o: (o.not_before, o.id)):
        book = rnd.books.get(order.node)
        spec = rnd.catalog.get(order.model)
        if book is None or spec is None:
            continue
        if admit(order, rnd.now, node=order.node, catalog_version=spec.version, catalog_sha256=spec.sha256):
            continue
        held = [t for t in CACHE_TIERS if order.model in book.held[t]]
        change = effect(order.action, order.tier, held)
        moved = next((book.held[t][order.model] for t in held), None)
        if order.action is OrderAction.PREFETCH or moved is None:
            moved = _Entry(order.model, spec.size_bytes, _INF, True)
        for tier in change.fills:
            book.put(tier, order.model, moved)
        for tier in change.drops:
            book.drop(tier, order.model)


def _cooldowns(cluster: ClusterState, now: float, config: PlannerConfig) -> set[tuple[str, str]]:
    return {
        (o.node, o.model)
        for o in (*cluster.recent, *cluster.pending)
        if o.reason is OrderReason.MISPREDICTION and now - o.not_before < config.cooldown_s
    }


def _evict_mispredictions(rnd: _Round) -> None:
    now, config, wants = rnd.now, rnd.config, rnd.wants
    for name, book in rnd.books.items():
        for tier in (Tier.L0, Tier.L1):
            for r in book.node.residents(tier):
                spec = rnd.catalog.get(r.model)
                if spec is None or spec.version != r.version or not r.prefetched or r.pins:
                    continue
                if r.loaded_at is None or now - r.loaded_at < config.misprediction_window_s:
                    continue
                # A hint or a waiting request that still covers now keeps it: that is not a misprediction.
                if any(w.reason is not OrderReason.FORECAST and w.t0 <= now for w in wants.get(r.model, [])):
                    continue
                if (name, r.model) in rnd.mispredictions:
                    continue
                rnd.mispredictions.append((name, r.model))
                # Only the speculative copy goes. A GPU copy promoted from a host copy that was already
                # there is demoted back to it: dropping that L1 copy too would turn the wrong guess
                # into a slow disk load for the next real request. Otherwise EVICT at L1 drops L1 and
                # L0 and keeps the verified copy on local disk.
                keep_l1 = tier is Tier.L0 and any(
                    h.model == r.model and h.version == r.version and not h.prefetched
                    for h in book.node.residents(Tier.L1)
                )
                action, at = (OrderAction.DEMOTE, Tier.L1) if keep_l1 else (OrderAction.EVICT, Tier.L1)
                rnd.orders.append(
                    _order(
                        rnd,
                        name,
                        spec,
                        action,
                        at,
                        OrderReason.MISPREDICTION,
                        now,
                        now + config.order_ttl_s,
                        r.loaded_at,
                    )
                )
                for t in (Tier.L0,) if keep_l1 else (Tier.L0, Tier.L1):
                    book.drop(t, r.model)


@dataclass(frozen=True)
class _Candidate:
    spec: ModelSpec
    want: _Want
    node: str
    frm: Tier
    tier: Tier
    value: float
    not_before: float


def _payers(spec: ModelSpec, wants: Sequence[_Want], rnd: _Round) -> list[_Want]:
    """The wants for which some tier on some node may be worth its cost: an upper bound, to prune.

    Benefit is at most the waiting saved from L3 on the slowest node; holding costs at least the window.
    """

    def exempt(w: _Want) -> bool:
        # Demand always pays; forecast wants were pruned by the same bound when they were made.
        return w.demand or w.reason is OrderReason.FORECAST

    if all(exempt(w) for w in wants):
        return list(wants)  # the common case: no hint to bound, no gains to compute
    gains = rnd.gains[spec.id]
    gb = spec.size_bytes / 1e9
    prices = {tier: rnd.config.price_per_gb_s.get(tier, 0.0) for tier in CACHE_TIERS}
    return [
        w
        for w in wants
        if exempt(w) or any(w.p * gains[t] > (w.t1 - w.t0) * gb * prices[t] for t in CACHE_TIERS)
    ]


def _best_candidate(
    rnd: _Round, spec: ModelSpec, wants: Sequence[_Want], cooling: set[tuple[str, str]]
) -> list[_Candidate]:
    """The tier and want to act on for ``spec``, one option per equally good node; none: nothing to do."""
    per_node: list[tuple[_Candidate, _Book]] = []
    ordered = sorted(wants, key=lambda w: (not w.demand, w.t0))
    for name, book in rnd.books.items():
        if (name, spec.id) in cooling and not any(w.demand for w in wants):
            continue
        frm = book.closest(spec.id)
        best: _Candidate | None = None
        for want in ordered:
            # The soonest want with any worthwhile tier wins (_tier_key): later ones need not be valued.
            if best is not None and not want.demand and want.t0 > best.want.t0:
                break
            for tier in CACHE_TIERS:
                if tier.level >= frm.level or book.capacity[tier] < spec.size_bytes:
                    continue
                net = _INF if want.demand else _net(spec, want, book.node, frm, tier, rnd.config)
                if net <= 0:
                    continue
                lead = _lead(book.node, spec.size_bytes, frm, tier, rnd.config)
                cand = _Candidate(spec, want, name, frm, tier, net, max(rnd.now, want.t0 - lead))
                # A waiting request first; then the soonest want (a later one is planned in a later
                # round); then the tier worth most, the closer one on a tie.
                if best is None or _tier_key(cand) > _tier_key(best):
                    best = cand
        if best is not None:
            per_node.append((best, book))
    if not per_node:
        return []
    # A node that already holds the model closer wins (fewer hops), then value; among the nodes left,
    # the least loaded when it is placed (see plan_detailed and _least_loaded).
    top = max((-c.frm.level, c.value) for c, _ in per_node)
    options = [c for c, _ in per_node if (-c.frm.level, c.value) == top]
    # Already somewhere at least as close on some node: nothing to do for this model.
    if rnd.held(spec.id, options[0].tier):
        return []
    return options


def _tier_key(c: _Candidate) -> tuple[bool, float, float, int]:
    return (c.want.demand, -c.want.t0, c.value, -c.tier.level)


def _place(rnd: _Round, cand: _Candidate) -> None:
    book = rnd.books[cand.node]
    spec = cand.spec
    value = _INF if cand.want.demand else cand.value
    # Try the target, then each tier one step farther that is still closer than where the model is; none
    # for a model demoted this round to make room for something worth more: fetching it back would thrash.
    tier: Tier | None = None if spec.id in rnd.moved else cand.tier
    while tier is not None and tier.level < cand.frm.level:
        trial = book.copy()
        moves: list[tuple[str, Tier, Tier]] = []
        path = [t for t in CACHE_TIERS if tier.level <= t.level < cand.frm.level]
        fits = all(_make_room(trial, t, spec.size_bytes, value, moves) for t in path)
        if fits and tier is Tier.L0 and not cand.want.demand:
            # Only GPU memory: reserving host memory the same way (measured) dropped more useful L1
            # prefetches than wasted ones, and a 20 s disk reload is worth the risk of a miss there.
            # Compared on the last hop alone, as the waiting model's worth is: the candidate's value
            # also counts the hops from disk, which the waiting model has already made.
            last_hop = _net(spec, cand.want, book.node, Tier.L1, Tier.L0, rnd.config)
            fits = trial.free(Tier.L0) - spec.size_bytes >= _reserve(rnd, trial, Tier.L0, last_hop, spec.id)
        if fits:
            for t in path:
                trial.put(t, spec.id, _Entry(spec.id, spec.size_bytes, value, True))
            rnd.books[cand.node] = trial
            _emit_placement(rnd, cand, tier, moves)
            return
        nxt = tier.farther()
        tier = nxt if nxt in CACHE_TIERS else None
        # A speculative fallback must still be worth its cost; a waiting request takes any tier.
        if (
            tier is not None
            and not cand.want.demand
            and _net(spec, cand.want, book.node, cand.frm, tier, rnd.config) <= 0
        ):
            tier = None
    rnd.deferred.append(
        Placement(spec.id, cand.node, cand.tier, cand.want.reason, cand.not_before, cand.want.t1, value)
    )


def _least_loaded(
    rnd: _Round, options: Sequence[_Candidate], traffic: Mapping[str, float], loads: dict[str, float]
) -> _Candidate:
    """Of equally good nodes, the one whose models will draw the least GPU traffic, then the most room.

    Requests go to the node holding a model closest, so where a model is staged decides which GPU it
    competes for: two busy 140 GB models on one node's 160 GB take turns, each turn a reload. Load is
    the forecast's expected requests over the horizon times bytes, summed over the node's models.
    ``loads`` keeps each node's figure between calls; the caller drops a node's once its book changes.
    """
    for c in options:
        if c.node not in loads:
            book = rnd.books[c.node]
            models = {m for t in CACHE_TIERS for m in book.held[t]}
            loads[c.node] = sum(traffic.get(m, 0.0) for m in models)
    return max(options, key=lambda c: (c.value, -loads[c.node], rnd.books[c.node].free(c.tier), c.node))


def _reserve(rnd: _Round, book: _Book, tier: Tier, value: float, newcomer: str) -> int:
    """Bytes of ``tier`` a speculative prefetch worth ``value`` must leave free on this node.

    A model worth more in ``tier`` that no node holds there, but this node holds one tier farther, is
    what the next request here loads, and the executor's LRU then evicts the least recently used copy:
    the speculative one, which nothing has used yet. So that room is not the prefetch's to take: on a
    single node whose GPU a 140 GB model shares, most prefetches were evicted this way within seconds
    of arriving, unused.
    """
    lower = tier.farther()
    if lower not in CACHE_TIERS:
        return 0
    soon = rnd.now + rnd.config.window_s
    reserve = 0
    for model in book.held[lower]:
        spec = rnd.catalog.get(model)
        if spec is None or model == newcomer or spec.size_bytes <= reserve:
            continue
        if rnd.held(model, tier):
            continue
        saved = _raw_lead(book.node, spec.size_bytes, lower, tier, rnd.config)
        if any(w.p * saved * spec.priority.weight > value for w in rnd.wants.get(model, []) if w.t0 <= soon):
            reserve = spec.size_bytes
    return reserve


def _make_room(book: _Book, tier: Tier, need: int, value: float, moves: list[tuple[str, Tier, Tier]]) -> bool:
    """Free ``need`` bytes in ``tier`` by demoting residents worth less than ``value`` one tier down."""
    if book.free(tier) >= need:
        return True
    victims = sorted(
        (
            e
            for e in book.held[tier].values()
            if not e.protected and e.value < value and book.closest(e.model).level >= tier.level
        ),
        key=lambda e: (e.value, -e.bytes, e.model),
    )
    for victim in victims:
        if book.free(tier) >= need:
            break
        lower = tier.farther()
        if lower in CACHE_TIERS and victim.model not in book.held[lower]:
            if not _make_room(book, lower, victim.bytes, value, moves):
                continue
            book.put(lower, victim.model, replace(victim, protected=True))
        book.drop(tier, victim.model)
        moves.append((victim.model, tier, lower))
    return book.free(tier) >= need


def _emit_placement(rnd: _Round, cand: _Candidate, tier: Tier, moves: list[tuple[str, Tier, Tier]]) -> None:
    spec, want = cand.spec, cand.want
    lead = _lead(rnd.books[cand.node].node, spec.size_bytes, cand.frm, tier, rnd.config)
    not_before = max(rnd.now, want.t0 - lead)
    for model, frm, to in moves:
        rnd.moved.add(model)
        victim = rnd.catalog[model]
        # Make room when the prefetch starts, not before: a timed prefetch keeps the victim useful till then.
        action, at = (OrderAction.DEMOTE, to) if to in CACHE_TIERS else (OrderAction.EVICT, frm)
        rnd.orders.append(
            _order(
                rnd,
                cand.node,
                victim,
                action,
                at,
                OrderReason.CAPACITY,
                not_before,
                want.t1 if want.t1 > not_before else not_before + rnd.config.order_ttl_s,
                want.key_time,
            )
        )
    rnd.orders.append(
        _order(
            rnd,
            cand.node,
            spec,
            OrderAction.PREFETCH,
            tier,
            want.reason,
            not_before,
            want.t1,
            want.key_time,
            demand=want.demand,
        )
    )
    rnd.placements.append(Placement(spec.id, cand.node, tier, want.reason, not_before, want.t1, cand.value))


def _order(
    rnd: _Round,
    node: str,
    spec: ModelSpec,
    action: OrderAction,
    tier: Tier,
    reason: OrderReason,
    not_before: float,
    deadline: float,
    key_time: float,
    *,
    demand: bool = False,
) -> Order:
    bucket = math.floor(key_time / rnd.config.id_bucket_s)
    return Order(
        id=order_id(node, spec.id, spec.version, action, tier, bucket),
        node=node,
        model=spec.id,
        version=spec.version,
        sha256=spec.sha256,
        action=action,
        tier=tier,
        reason=reason,
        not_before=not_before,
        deadline=max(deadline, not_before + 1.0),
        created_at=rnd.now,
        demand=demand,
    )


def _headroom(rnd: _Round, tier: Tier, wanted: Sequence[str]) -> int:
    """Bytes the biggest wanted model that no node holds in ``tier`` or closer would need there.

    A model some node already holds that close is served there (requests go to the closest copy), so
    it puts no pressure on the others.
    """
    return max(
        (rnd.catalog[m].size_bytes for m in wanted if m in rnd.catalog and not rnd.held(m, tier)),
        default=0,
    )


def _cool_down(
    rnd: _Round, forecasts: Mapping[str, ModelForecast], hints: Sequence[Hint], wanted: Sequence[str]
) -> None:
    """Demote a forecast model out of GPU memory once a request has become unlikely.

    Idle memory costs nothing, so a model that may still be wanted is left where it is and only moved
    to make room for something worth more (``_make_room``). A model in L0 with ``P < cool_p`` goes to
    L1, so that a demand load finds room without the executor's LRU picking a victim blindly; undoing
    a wrong call costs a few seconds. Host memory cools only with a configured holding price (benefit
    below ``keep_ratio`` of it): a wrong demotion to disk costs a 20 s reload of a 140 GB model, and on
    noisy forecasts cooling there served more requests from disk than leaving it to room-making and the
    executor's LRU did. At most one demotion per model per round: L0→L1 and L1→L2 in the same round
    would throw away the copy just made. A tier cools only under pressure: when the biggest model wanted
    in the coming window would not fit in its free room. Only models with a forecast cool down: with no
    signal at all the planner leaves a resident alone.
    """
    now, config = rnd.now, rnd.config
    hinted = {h.model for h in hints}
    cooled: set[str] = set()
    headroom = {tier: _headroom(rnd, tier, wanted) for tier in (Tier.L0, Tier.L1)}
    for name, book in rnd.books.items():
        # Used within the window: whatever the forecast says, recent use is the better evidence (a
        # seasonal forecast read P≈0 for a model asked for every ten minutes); only room-making moves it.
        recent = {
            r.model
            for t in (Tier.L0, Tier.L1)
            for r in book.node.residents(t)
            if r.last_used is not None and now - r.last_used < config.window_s
        }
        for tier in (Tier.L0, Tier.L1):
            lower = tier.farther()
            # No pressure, nothing to cool: while the biggest model that may come in fits in free room,
            # a demand load evicts nobody, and an unlikely resident may still save a request.
            if book.free(tier) >= headroom[tier]:
                continue
            for entry in list(book.held[tier].values()):
                forecast = forecasts.get(entry.model)
                spec = rnd.catalog.get(entry.model)
                if forecast is None or spec is None or entry.protected or entry.model in hinted:
                    continue
                if entry.model in cooled or entry.model in rnd.moved or entry.model in recent:
                    continue
                if book.closest(entry.model).level < tier.level:
                    continue
                p = forecast.p_window(now, now + config.window_s)
                if tier is not Tier.L0 or p >= config.cool_p:
                    price = config.price_per_gb_s.get(tier, 0.0)
                    cost = spec.size_bytes / 1e9 * config.window_s * price
                    saved = _raw_lead(book.node, spec.size_bytes, lower, tier, config)
                    if cost <= 0 or p * saved * spec.priority.weight >= config.keep_ratio * cost:
                        continue
                if entry.model not in book.held[lower]:
                    if book.free(lower) < entry.bytes:
                        continue
                    book.put(lower, entry.model, replace(entry, protected=True))
                book.drop(tier, entry.model)
                cooled.add(entry.model)
                rnd.orders.append(
                    _order(
                        rnd,
                        name,
                        spec,
                        OrderAction.DEMOTE,
                        lower,
                        OrderReason.FORECAST,
                        now,
                        now + config.order_ttl_s,
                        now,
                    )
                )
