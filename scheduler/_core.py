"""The scheduler's state between planning rounds, and the one place a round is run.

Hints, the latest report of each executor, the orders already handed out and the latest forecasts live
here behind one lock. ``replan`` runs the pure planner over them and hands only *new* orders (by id) to
``dispatch``, which the runtime wires to its timed publisher and the tests to a list. Slow inputs
(forecasts, recent demand) are refreshed by the runtime's interval job and cached here, so a hint
triggers a round that costs only the planner itself.

``replan()`` (the interval job, after each forecast refresh) is a full round. A hint, a change of
demand signals or, when asked, an executor's report plans an incremental round: only the models whose
signals changed, and the nodes whose report or orders changed, are planned again, against the books
the full round left (see ``scheduler._planner._incremental`` for what that keeps exact). The merged
state of each node is kept between rounds and rebuilt only when its node reports, so that the rounds
can tell which nodes changed.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from forecaster import ModelForecast
from models import Catalog
from prewarm import (
    CACHE_TIERS,
    DEMAND_SOURCE,
    ExecutorState,
    Hint,
    Order,
    OrderAction,
    OrderReason,
    Tier,
    TopLabels,
    UnknownModel,
    counter,
    gauge,
    get_logger,
    histogram,
)
from scheduler import _metrics
from scheduler._cluster import Cluster, ClusterState, Departures, NodeState
from scheduler._planner import Plan, PlannerConfig, PlannerMemo, plan_detailed
from scheduler._trust import HintTrust

__all__ = ["SchedulerCore"]

log = get_logger(__name__)

_ORDERS = counter(
    "prewarm_scheduler_orders_total", "Orders handed out, by action and reason.", ["action", "reason"]
)
_MISPREDICTIONS = counter(
    "prewarm_scheduler_mispredictions_total", "Prefetches demoted unused after the misprediction window."
)
_PLAN_SECONDS = histogram(
    "prewarm_scheduler_plan_seconds",
    "Time of one planning round.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
_ROUNDS = counter(
    "prewarm_scheduler_rounds_total",
    "Planning rounds, by kind: full, or incremental (only what an event touched).",
    ["kind"],
)
_DEFERRED = gauge("prewarm_scheduler_deferred_models", "Prefetches worth doing that wait for room.")
_HINTS_ACTIVE = gauge("prewarm_scheduler_hints_active", "Hints whose window has not passed.")
_HINT_TRUST = gauge(
    "prewarm_scheduler_hint_trust",
    "Share of a source's judged hints whose model was asked for within the hint's window.",
    ["source"],
)
_SOURCE_LABEL = TopLabels()  # hint sources are named by clients: the first few get a series of their own


@dataclass(frozen=True)
class _Known:
    order: Order
    settled: bool  # reflected in a report or answered by an outcome: no longer books bytes
    predicted: float | None = None  # a prefetch's predicted demand: its misprediction window starts there


class SchedulerCore:
    """Thread-safe planning state. ``dispatch`` receives each new order exactly once."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        cluster: Cluster,
        config: PlannerConfig,
        dispatch: Callable[[Sequence[Order]], None],
        clock: Callable[[], float] = time.time,
        max_hints: int = 10_000,
        incremental: bool = True,
    ) -> None:
        """``incremental``: plan hints, demand changes and reports in incremental rounds (False: every
        round is a full one, as a baseline to compare with)."""
        self.catalog = catalog
        self.cluster = cluster
        self.config = config
        self._dispatch = dispatch
        self._clock = clock
        self._max_hints = max_hints
        self._incremental = incremental
        self._lock = threading.RLock()
        self._hints: list[Hint] = []
        self._demand: list[Hint] = []
        self._forecasts: Mapping[str, ModelForecast] = {}
        self._reports: dict[str, ExecutorState] = {}
        self._known: dict[str, _Known] = {}
        self._last: Plan | None = None
        self._last_at: float | None = None
        self._memo = PlannerMemo()  # forecast windows kept between rounds: a hint's round values few
        # Each node's merged state, rebuilt only when it reports: an incremental round reopens the books
        # of the nodes whose state object changed.
        self._nodes: dict[str, NodeState] = dict(ClusterState.merge(cluster, {}).nodes)
        self._touched: set[str] = set()  # models whose signals changed since the last round
        self._unsettled: set[str] = set()  # ids of the known orders not settled yet
        self._predicted: dict[str, float] = {}  # a known prefetch's predicted demand, by order id
        self._departures = Departures()  # how long copies went unused before the executors gave them up
        # How far each source's hints come true.
        self._trust = HintTrust(skip_source=DEMAND_SOURCE, max_open=max_hints)

    # ------------------------------------------------------------------ inputs

    def now(self) -> float:
        return self._clock()

    def add_hint(self, hint: Hint, *, received_at: float | None = None) -> tuple[Hint, list[Order]]:
        """Record a hint (stamped with the time it arrived: ``received_at``, else now) and plan at once;
        the new orders for its model. The runtime passes the stamp it stored the hint with."""
        if hint.model not in self.catalog:
            raise UnknownModel(hint.model)
        now = self._clock()
        stamped = hint.model_copy(update={"received_at": now if received_at is None else received_at})
        with self._lock:
            self._hints = [h for h in self._hints if h.live(now)]
            if len(self._hints) >= self._max_hints:
                self._hints.pop(0)  # the oldest goes first: a flood cannot grow memory without bound
            self._hints.append(stamped)
            self._trust.hinted(stamped)
            self._touched.add(hint.model)
            orders = self._replan_locked(now, incremental=True)
        return stamped, [o for o in orders if o.model == hint.model]

    def restore(self, hints: Sequence[Hint] = (), orders: Sequence[Order] = ()) -> None:
        """Take back what a previous process had: hints still active, and orders handed out but not due.

        Nothing is dispatched: the orders are already waiting in the job store. They book their bytes in
        the next round, so a restart neither double-books a node nor sends the same order twice.
        """
        now = self._clock()
        with self._lock:
            known = {(h.model, h.source, h.received_at) for h in self._hints}
            for hint in hints:
                fresh = (hint.model, hint.source, hint.received_at) not in known
                if fresh and hint.live(now) and hint.model in self.catalog:
                    self._hints.append(hint)
                    self._trust.hinted(hint)
                    self._touched.add(hint.model)
            for order in orders:
                if order.id not in self._known:
                    self._known[order.id] = _Known(order, settled=False)
                    self._departures.ordered(order)
                    self._unsettled.add(order.id)

    def set_signals(
        self, *, forecasts: Mapping[str, ModelForecast] | None = None, demand: Sequence[Hint] | None = None
    ) -> None:
        """Replace the cached forecasts and demand hints (refreshed by the interval job).

        New forecasts make the next round a full one; changed demand touches only its models."""
        with self._lock:
            if forecasts is not None:
                self._forecasts = dict(forecasts)
            if demand is not None:
                demand = list(demand)
                before: dict[str, list[Hint]] = {}
                after: dict[str, list[Hint]] = {}
                for h in self._demand:
                    before.setdefault(h.model, []).append(h)
                for h in demand:
                    after.setdefault(h.model, []).append(h)
                self._touched |= {m for m in before.keys() | after.keys() if before.get(m) != after.get(m)}
                self._demand = demand
                now = self._clock()
                for h in demand:
                    self._trusted_anew(self._trust.used(h.model, h.received_at or now))

    def requested(self, model: str, at: float) -> None:
        """``model`` was asked for at ``at``: what hints are judged by, with the reports' uses. (The live
        runtime's demand signals carry each model's latest request from the gateways' log; the
        simulator tells every request.)"""
        with self._lock:
            self._trusted_anew(self._trust.used(model, at))

    def add_demand(self, demand: Sequence[Hint]) -> list[Order]:
        """Replace the demand hints and plan what changed at once (an incremental round); the new
        orders."""
        with self._lock:
            self.set_signals(demand=demand)
            return self._replan_locked(self._clock(), incremental=True)

    def update_catalog(self, catalog: Catalog) -> None:
        """Plan with a new catalog from the next round on (new versions, new or retired models)."""
        with self._lock:
            self.catalog = catalog

    def observe(self, report: ExecutorState) -> None:
        """Keep the newest report of each node (the next round settles the orders it shows done)."""
        with self._lock:
            fresh = self._observe_locked(report)
        if fresh:
            _metrics.observed(report)

    def observe_and_plan(self, report: ExecutorState) -> list[Order]:
        """``observe``, then plan what the report changed at once (an incremental round: the node's
        book is opened again, and the models whose place on it changed are planned again); the new
        orders."""
        with self._lock:
            fresh = self._observe_locked(report)
            orders = self._replan_locked(self._clock(), incremental=True)
        if fresh:
            _metrics.observed(report)
        return orders

    def _observe_locked(self, report: ExecutorState) -> bool:
        """Keep ``report`` unless the node's kept one is newer; whether it was kept."""
        current = self._reports.get(report.node)
        if current is not None and current.at > report.at:
            return False
        if current is not None:
            self._departures.observe(current, report)
        self._reports[report.node] = report
        # A use of GPU or host memory is a request served; a disk copy is also "used" by a load that
        # reads it, a prefetch's included.
        for state in report.tiers:
            if state.tier in (Tier.L0, Tier.L1):
                for r in state.resident:
                    if r.last_used is not None:
                        self._trusted_anew(self._trust.used(r.model, r.last_used))
        node = ClusterState.merge(self.cluster, {report.node: report}).nodes[report.node]
        unused_for = self._departures.of(report.node, report.at)
        turns = self._departures.turns(report.node, report.at)
        self._nodes[report.node] = (
            dataclasses.replace(node, unused_for=unused_for, turns=turns) if unused_for or turns else node
        )
        return True

    def _trusted_anew(self, sources: set[str]) -> None:
        """The record of ``sources`` changed: the models they hint at are planned again."""
        if sources:
            self._touched |= {h.model for h in self._hints if h.source in sources}
            for source in sources:
                share = self._trust.share(source)
                if share is not None:
                    _HINT_TRUST.labels(_SOURCE_LABEL(source)).set(share)

    # ------------------------------------------------------------------ planning

    def replan(self) -> list[Order]:
        """One full planning round now; returns (and dispatches) the orders not handed out before."""
        with self._lock:
            return self._replan_locked(self._clock())

    def _replan_locked(self, now: float, *, incremental: bool = False) -> list[Order]:
        started = time.perf_counter()
        full = not (incremental and self._incremental)
        self._settle(now, prune=full)
        self._trusted_anew(self._trust.judge(now))
        live_hints, lapsed = _live(self._hints, now, self._last_at)
        live_demand, lapsed_demand = _live(self._demand, now, self._last_at)
        hints = [*self._trust.scaled(live_hints), *live_demand]
        # A hint that lapsed since the last round changes its model's wants: that model is touched.
        self._touched |= lapsed | lapsed_demand
        _HINTS_ACTIVE.set(len(live_hints))
        # Every round sorts the orders still out as it needs them: the set's order does not matter.
        pending = [o for o in (self._known[i].order for i in self._unsettled) if o.deadline > now]
        recent = [k.order for k in self._known.values()]
        state = ClusterState(
            nodes=self._nodes, pending=tuple(pending), recent=tuple(recent), predicted=dict(self._predicted)
        )
        touched = None if full else set(self._touched)
        self._touched.clear()
        # Orders are committed to only a round or two before they are due (``plan_detailed``'s commit_by):
        # two, so that one that falls due just after the next round, or in a round that comes late, still
        # goes out on time.
        result = plan_detailed(
            now,
            self._forecasts,
            hints,
            self.catalog,
            state,
            self.config,
            memo=self._memo,
            touched=touched,
            commit_by=now + 2 * self.config.decision_interval_s,
        )
        _ROUNDS.labels("full" if result.full else "incremental").inc()
        self._last, self._last_at = result, now
        fresh = [o for o in result.orders if o.id not in self._known]
        for order in fresh:
            predicted = result.predicted.get(order.id)
            self._known[order.id] = _Known(order, settled=False, predicted=predicted)
            self._departures.ordered(order)
            self._unsettled.add(order.id)
            if predicted is not None:
                self._predicted[order.id] = predicted
            _ORDERS.labels(order.action.value, order.reason.value).inc()
            _metrics.planned(order, result.predicted.get(order.id))
            if order.reason is OrderReason.MISPREDICTION:
                _MISPREDICTIONS.inc()
        _DEFERRED.set(len(result.deferred))
        _PLAN_SECONDS.observe(time.perf_counter() - started)
        if fresh:
            self._dispatch(fresh)
        return fresh

    def _settle(self, now: float, *, prune: bool = True) -> None:
        """Mark the orders a report shows done (or answered) settled; ``prune``: also forget the long
        past ones (a full round's chore: an incremental round looks at the unsettled orders only)."""
        if prune:
            # A prefetch is kept until its misprediction window has surely closed (it counts from the
            # predicted demand, at the latest the order's deadline) and the cool-down after it too.
            horizon = self.config.cooldown_s + self.config.misprediction_window_s
            memory = max(horizon, self.config.misprediction_memory_s)
            for oid, known in list(self._known.items()):
                # A misprediction is remembered longer: each one since the model last served a request
                # doubles its cool-down.
                keep = memory if known.order.reason is OrderReason.MISPREDICTION else horizon
                if known.order.deadline < now - keep:
                    del self._known[oid]  # long past: no longer needed even for cool-downs
                    self._unsettled.discard(oid)
                    self._predicted.pop(oid, None)
        answered = {o.order_id for r in self._reports.values() for o in r.recent_outcomes}
        for oid in list(self._unsettled):
            known = self._known[oid]
            if oid in answered or _reflected(known.order, self._reports):
                self._known[oid] = _Known(known.order, settled=True, predicted=known.predicted)
                self._unsettled.discard(oid)

    # ------------------------------------------------------------------ views (for the API)

    def hints(self) -> list[Hint]:
        now = self._clock()
        with self._lock:
            return [h for h in self._hints if h.live(now)]

    def plan_view(self) -> dict[str, Any]:
        with self._lock:
            now = self._clock()
            result, at = self._last, self._last_at
            upcoming = sorted(
                (k.order for k in self._known.values() if k.order.deadline > now and not k.settled),
                key=lambda o: (o.not_before, o.id),
            )
            return {
                "at": at,
                "placements": [_placement(p) for p in (result.placements if result else ())],
                "deferred": [_placement(p) for p in (result.deferred if result else ())],
                "tiers": self._tiers_locked(),
                "upcoming": [o.model_dump(mode="json") for o in upcoming],
            }

    def model_view(self, model: str) -> dict[str, Any]:
        spec = self.catalog[model]
        now = self._clock()
        with self._lock:
            forecast = self._forecasts.get(model)
            window = self.config.window_s
            return {
                "model": spec.model_dump(mode="json"),
                "forecast": None
                if forecast is None
                else {
                    "family": forecast.family,
                    "start": forecast.start,
                    "bucket_s": forecast.bucket_s,
                    "p_next_window": forecast.p_window(now, now + window),
                    "expected_next_window": forecast.expected_in(now, now + window),
                },
                "tiers": {node: tier for node, tier in self._tiers_locked().get(model, {}).items()},
                "hints": [h.model_dump(mode="json") for h in self._hints if h.model == model and h.live(now)],
                "recent_orders": [
                    k.order.model_dump(mode="json")
                    for k in sorted(self._known.values(), key=lambda k: k.order.created_at)
                    if k.order.model == model
                ][-20:],
            }

    def _tiers_locked(self) -> dict[str, dict[str, str]]:
        """Current tier per model per node, from the reports."""
        out: dict[str, dict[str, str]] = {}
        for node, report in self._reports.items():
            for tier in reversed(CACHE_TIERS):  # closest last, so it wins
                state = report.tier(tier)
                for r in state.resident if state else ():
                    out.setdefault(r.model, {})[node] = tier.value
        return out

    def reports(self) -> dict[str, ExecutorState]:
        with self._lock:
            return dict(self._reports)

    def forecasts(self) -> dict[str, ModelForecast]:
        """The forecasts the last rounds planned with (refreshed by the interval job)."""
        with self._lock:
            return dict(self._forecasts)

    def recent_orders(self, limit: int = 100) -> list[Order]:
        """The newest orders still remembered (handed out, settled or not), newest first."""
        with self._lock:
            known = sorted(self._known.values(), key=lambda k: (k.order.created_at, k.order.id), reverse=True)
            return [k.order for k in known[:limit]]


def _placement(p: Any) -> dict[str, Any]:
    return {
        "model": p.model,
        "node": p.node,
        "tier": p.tier.value,
        "reason": p.reason.value,
        "not_before": p.not_before,
        "deadline": p.deadline,
    }


def _reflected(order: Order, reports: Mapping[str, ExecutorState]) -> bool:
    """The node's latest report, newer than the order, shows the order's effect."""
    report = reports.get(order.node)
    if report is None or report.at < order.not_before:
        return False
    held = {
        t
        for t in CACHE_TIERS
        if (state := report.tier(t)) and any(r.model == order.model for r in state.resident)
    }
    if order.action is OrderAction.PREFETCH:
        return any(t.level <= order.tier.level for t in held)
    if order.action is OrderAction.DEMOTE:
        return order.tier.closer() not in held
    return not any(t.level <= order.tier.level for t in held) or order.tier is Tier.L3


def _live(hints: Sequence[Hint], now: float, last: float | None) -> tuple[list[Hint], set[str]]:
    """The hints still live at ``now``, and the models of those that lapsed since ``last`` (the last
    round; none before the first), in one pass: a round's hints may be thousands."""
    live: list[Hint] = []
    lapsed: set[str] = set()
    for h in hints:
        if h.live(now):
            live.append(h)
        elif last is not None and h.live(last):
            lapsed.add(h.model)
    return live, lapsed
