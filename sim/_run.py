"""The simulation driver: replay a request trace against a policy on a virtual clock, and report."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from models import Catalog
from prewarm import Hint, Order, Tier
from scheduler import Cluster, PlannerConfig
from sim._policies import ForecastSource, NodeShape, Policy, PolicyContext, ReactivePolicy
from sim._prewarm import PrewarmPolicy
from sim._world import World

__all__ = ["SimReport", "compare", "run_policies", "simulate"]


@dataclass(frozen=True)
class SimReport:
    policy: str
    requests: int
    cold_starts: int
    wait_total_s: float
    wait_mean_s: float
    wait_p50_s: float
    wait_p95_s: float
    wait_p99_s: float
    served_from: dict[str, int]
    prefetches: int
    mispredictions: int
    queued_loads: int
    failed_orders: int
    bytes_moved: int
    over_commit_bytes: int
    """Bytes the executors' LRU had to displace to apply this policy's orders (0 for a correct plan)."""
    orders: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def simulate(
    policy: Policy,
    cluster: Cluster,
    catalog: Catalog,
    timestamps: npt.ArrayLike,
    models: Sequence[str],
    *,
    start: float,
    end: float,
    tick_s: float = 60.0,
    hints: Sequence[Hint] = (),
) -> SimReport:
    """Replay requests (``timestamps[i]`` for ``models[i]``) in ``[start, end)`` under ``policy``.

    Every ``tick_s`` the policy sees the nodes' reports and the hints received since the last tick; its
    orders are applied when their ``not_before`` comes. Requests for models outside the catalog are
    ignored (a trace may hold more than the platform serves).
    """
    ts = np.asarray(timestamps, dtype=np.float64)
    order = np.argsort(ts, kind="stable")
    world = World(cluster, catalog)
    empty: tuple[npt.NDArray[np.float64], npt.NDArray[np.str_]] = (np.array([]), np.array([], dtype=str))
    shapes = {
        n.name: NodeShape(
            n.name, tuple(g.memory_bytes for g in n.gpus), n.host_cache_bytes, n.disk_cache_bytes
        )
        for n in cluster.nodes
    }
    policy.prepare(
        PolicyContext(catalog, shapes, False, start, end, empty, None, bandwidth=cluster.bandwidth.hops())
    )
    due: list[tuple[float, int, Order]] = []
    seq = itertools.count()
    pending_hints = sorted(hints, key=lambda h: h.received_at or start)
    hint_pos = 0
    orders = 0
    i = int(np.searchsorted(ts[order], start))
    t = start
    while t < end:
        window_hints = []
        while hint_pos < len(pending_hints) and (pending_hints[hint_pos].received_at or start) <= t:
            window_hints.append(pending_hints[hint_pos])
            hint_pos += 1
        for new in policy.tick(t, world.reports(t), window_hints):
            heapq.heappush(due, (new.not_before, next(seq), new))
            orders += 1
        step_end = min(t + tick_s, end)
        while i < len(order) and ts[order[i]] < step_end:
            at = float(ts[order[i]])
            while due and due[0][0] <= at:
                when, _, o = heapq.heappop(due)
                world.apply(o, max(when, t))
            model = models[int(order[i])]
            if model in catalog:
                world.request(model, at)
            i += 1
        while due and due[0][0] < step_end:
            when, _, o = heapq.heappop(due)
            world.apply(o, max(when, t))
        t = step_end
    world.finish()
    return _report(policy.name, world, orders)


def _report(name: str, world: World, orders: int) -> SimReport:
    waits = np.array([s.wait_s for s in world.served], dtype=np.float64)
    served: dict[str, int] = {t.value: 0 for t in Tier}
    for s in world.served:
        served[s.served_from.value] += 1
    totals = world.totals()

    def pct(q: float) -> float:
        return float(np.percentile(waits, q)) if waits.size else 0.0

    return SimReport(
        policy=name,
        requests=int(waits.size),
        cold_starts=int((waits > 0).sum()),
        wait_total_s=float(waits.sum()),
        wait_mean_s=float(waits.mean()) if waits.size else 0.0,
        wait_p50_s=pct(50),
        wait_p95_s=pct(95),
        wait_p99_s=pct(99),
        served_from=served,
        prefetches=totals["prefetches"],
        mispredictions=totals["mispredictions"],
        queued_loads=totals["queued_loads"],
        failed_orders=totals["failed_orders"],
        bytes_moved=totals["bytes_moved"],
        over_commit_bytes=totals["over_commit_bytes"],
        orders=orders,
    )


def compare(
    events: Any,
    settings: Any,
    *,
    train_days: float,
    sim_hours: float,
    catalog: Catalog | None = None,
    cluster: Cluster | None = None,
    families: Sequence[str] | None = None,
) -> dict[str, SimReport]:
    """Fit the forecaster on the first ``train_days`` of ``events``, then simulate ``sim_hours`` after
    that under the reactive baseline and under prewarm, on the same cluster and catalog."""
    from forecaster import History, SelectionConfig, fit_bundle
    from sim._scenario import default_cluster, virtual_catalog

    history = History.from_events(events)
    cut = history.start + train_days * 86400
    train, _ = history.split(cut)
    config = SelectionConfig(families=tuple(families)) if families else None
    bundle = fit_bundle(
        train, config, bucket_s=settings.forecast.bucket_s, horizon_s=settings.forecast.horizon_s
    )
    catalog = catalog or virtual_catalog(history.models)
    cluster = cluster or default_cluster()
    planner = PlannerConfig.from_settings(settings.scheduler)
    return run_policies(
        events, catalog, cluster, planner, bundle.predict, start=cut, end=cut + sim_hours * 3600
    )


def run_policies(
    events: Any,
    catalog: Catalog,
    cluster: Cluster,
    planner: PlannerConfig,
    forecasts: ForecastSource | None,
    *,
    start: float,
    end: float,
) -> dict[str, SimReport]:
    """The reactive baseline and prewarm over ``events`` (``timestamp``, ``model``) in [start, end), on
    the same cluster and catalog."""
    ts = events["timestamp"].to_numpy()
    names = events["model"].astype(str).to_numpy()
    policies: list[Policy] = [ReactivePolicy(), PrewarmPolicy(planner, forecasts)]
    return {p.name: simulate(p, cluster, catalog, ts, names, start=start, end=end) for p in policies}
