"""The simulation driver: replay a request trace through a world under a policy, on a virtual clock.

    results = run_policies(events, catalog, cluster, ["reactive", "keepalive:600", "oracle"],
                           start=cut, end=cut + 48 * 3600)

Each policy starts from the state it reaches at the end of training: the last ``warmup_s`` of the
training span (at least the longest policy memory, 4 hours) is replayed through it uncounted, so a model
used minutes before the cut is not cold at the cut. In the window the policy is ticked every ``tick_s``
with the nodes' reports and the hints received since, told of every request once it is served, and its
orders are applied when due (a delayed one only if the policy ``still_wanted`` it, else replaced by what
its ``superseded`` returns). At the end the loads
requests still wait for are played out, so that every wait is known.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from models import Catalog
from prewarm import ExecutorState, Hint, InvalidInput, Order, OrderStatus, Tier, abridged, get_logger
from scheduler import Cluster, PlannerConfig
from sim._links import Clock
from sim._metrics import Record, SimMetrics, metrics
from sim._policies import (
    DEFAULT_POLICIES,
    ForecastSource,
    NodeShape,
    Policy,
    PolicyContext,
    make_policy,
    policy_kinds,
)
from sim._unlimited import UnlimitedWorld
from sim._world import World

if TYPE_CHECKING:
    from collections.abc import Mapping

    from forecaster import History

__all__ = ["WARMUP_S", "Progress", "compare", "fit_forecasts", "run_policies", "simulate"]

WARMUP_S = 4 * 3600.0
"""How much of the training span each policy replays before the cut."""

_MAX_PAST_END_S = 86400.0
"""How far the simulated window may run past the trace's last request (a trace has no declared end)."""
_WARN_PAST_END_S = 3600.0
"""A window that runs this far past the last request is simulated, with a warning."""

log = get_logger(__name__)

Progress = Callable[[str, float], None]
"""``progress(label, fraction of the window simulated)``, called now and then."""


class SimWorld(Protocol):
    """What the driver needs of a world (``World`` or ``UnlimitedWorld``)."""

    unlimited: bool
    hop_overhead_s: float
    clock: Clock
    record: Record
    catalog: Catalog
    bandwidth: dict[str, float]
    waiting: int

    @property
    def shapes(self) -> Mapping[str, NodeShape]: ...

    def fits(self, model: str) -> bool: ...

    def closest(self, node: str, model: str) -> Tier: ...

    def request(self, model: str, at: float) -> str: ...

    def apply(self, order: Order, now: float) -> OrderStatus: ...

    def reports(self, now: float) -> Mapping[str, ExecutorState]: ...

    def window_begins(self, _: None = None) -> None: ...

    def finish(self) -> None: ...


def make_world(
    catalog: Catalog, cluster: Cluster | None, *, start: float, end: float, unlimited: bool
) -> SimWorld:
    """The world a run plays in: the cluster (the default one when none is given), or the unlimited
    node."""
    from sim._scenario import default_cluster

    if unlimited:
        return UnlimitedWorld(catalog, start=start, end=end)
    return World(cluster or default_cluster(), catalog, start=start, end=end)


def _sorted(timestamps: npt.ArrayLike, models: Sequence[str] | npt.ArrayLike) -> tuple[Any, Any]:
    ts = np.asarray(timestamps, dtype=np.float64)
    names = np.asarray(models, dtype=str)
    order = np.argsort(ts, kind="stable")
    return ts[order], names[order]


def simulate(
    policy: Policy,
    world: SimWorld,
    timestamps: npt.ArrayLike,
    models: Sequence[str] | npt.ArrayLike,
    *,
    tick_s: float = 60.0,
    hints: Sequence[Hint] = (),
    warmup_s: float = WARMUP_S,
    progress: Progress | None = None,
) -> SimMetrics:
    """Replay requests (``timestamps[i]`` for ``models[i]``) in the world's window under ``policy``.

    Requests and hints for models outside the world's catalog are ignored (a trace or a hints file may
    hold more than the platform serves); a request for a model no node's GPUs can hold is
    ``InvalidInput``.
    """
    start, end = world.record.start, world.record.end
    ts, names = _sorted(timestamps, models)
    ids = {spec.id for spec in world.catalog}
    known = np.fromiter(map(ids.__contains__, names.tolist()), dtype=bool, count=names.size)  # hashed
    ts, names = ts[known], names[known]
    begin = start - warmup_s
    lo, cut, hi = np.searchsorted(ts, [begin, start, end], side="left")
    unfit = sorted(m for m in set(names[lo:hi].tolist()) if not world.fits(m))
    if unfit:
        raise InvalidInput(f"no node's GPUs can hold {', '.join(unfit)}", reason="capacity")
    window = (ts[cut:hi], names[cut:hi])
    policy.prepare(
        PolicyContext(
            catalog=world.catalog,
            nodes=world.shapes,
            unlimited=world.unlimited,
            start=start,
            end=end,
            history=(ts[:cut], names[:cut]),
            future=window if policy.clairvoyant else None,
            bandwidth=dict(world.bandwidth),
            hop_overhead_s=world.hop_overhead_s,
            tick_s=tick_s,
            closest=world.closest,
        )
    )
    clock, record = world.clock, world.record
    clock.now = begin
    pending = sorted(
        (h for h in hints if h.model in ids),
        key=lambda h: h.received_at if h.received_at is not None else begin,
    )
    hint_pos = 0

    def due(order: Order) -> None:
        now = clock.now
        if now >= end:
            return
        if policy.still_wanted(order, now):
            world.apply(order, now)
        else:
            schedule(policy.superseded(order, now))

    def schedule(orders: list[Order]) -> None:
        now = clock.now
        for order in orders:
            if record.start <= now < end:
                record.orders += 1
            clock.at(max(order.not_before, now), due, order)

    def tick(_: None) -> None:
        nonlocal hint_pos
        now = clock.now
        if now >= end:
            return
        fresh: list[Hint] = []
        while hint_pos < len(pending):
            at = pending[hint_pos].received_at
            if at is not None and at > now:
                break
            fresh.append(pending[hint_pos])
            hint_pos += 1
        schedule(policy.tick(now, world.reports(now), fresh))
        clock.at(now + tick_s, tick)

    clock.at(clock.now, tick)
    # Before any request at the cut (the same instant, queued first): the backlog the warm-up left.
    clock.at(start, world.window_begins)
    heap = clock.heap  # the hot loop peeks at the heap itself: a request between events costs no call
    request, on_request = world.request, policy.on_request
    every = max((hi - lo) // 50, 1)
    label = policy.name
    for k, (t, model) in enumerate(zip(ts[lo:hi].tolist(), names[lo:hi].tolist(), strict=True)):
        if heap and heap[0][0] <= t:
            clock.run_until(t)
        clock.now = t
        orders = on_request(model, t, request(model, t))
        if orders:
            schedule(orders)
        if progress is not None and k % every == 0 and t >= start:
            progress(label, (t - start) / (end - start))
    clock.run_until(end)
    # Play out the loads requests still wait for (no policy acts any more), so every wait is known.
    while world.waiting > 0 and clock.step():
        pass
    world.finish()
    if progress is not None:
        progress(label, 1.0)
    return metrics(label, record, unlimited=world.unlimited)


def run_policies(
    events: Any,
    catalog: Catalog,
    cluster: Cluster | None,
    labels: Sequence[str],
    *,
    start: float,
    end: float,
    forecasts: ForecastSource | None = None,
    planner: PlannerConfig | None = None,
    hints: Sequence[Hint] = (),
    unlimited: bool = False,
    progress: Progress | None = None,
    tick_s: float = 60.0,
    warmup_s: float = WARMUP_S,
) -> dict[str, SimMetrics]:
    """Every policy of ``labels`` over ``events`` (``timestamp``, ``model``) in [start, end), each in a
    fresh world of the same cluster (default: ``default_cluster()``) and catalog, keyed by its label."""
    _check_labels(labels)
    ts = events["timestamp"].to_numpy(dtype=np.float64)
    names = events["model"].astype(str).to_numpy()
    out: dict[str, SimMetrics] = {}
    for label in labels:
        # A source that learns from what it observes is copied per policy: two runs never share it.
        source = copy.deepcopy(forecasts) if hasattr(forecasts, "observe") else forecasts
        policy = make_policy(label, forecasts=source, planner=planner)
        world = make_world(catalog, cluster, start=start, end=end, unlimited=unlimited)
        out[label] = simulate(
            policy,
            world,
            ts,
            names,
            tick_s=tick_s,
            hints=hints,
            warmup_s=warmup_s,
            progress=progress,
        )
    return out


def _check_labels(labels: Sequence[str]) -> None:
    """Refuse a label ``make_policy`` would refuse, or one given twice, before anything runs: building a
    policy is cheap, fitting forecasts and simulating the labels before it are not."""
    if len(set(labels)) != len(labels):
        raise InvalidInput(f"policy labels repeat: {', '.join(labels)}")
    for label in labels:
        make_policy(label)


def available(labels: Sequence[str] = DEFAULT_POLICIES) -> list[str]:
    """The labels whose kind is registered (the default list names policies other modules add)."""
    kinds = set(policy_kinds())
    return [label for label in labels if label.partition(":")[0] in kinds]


def compare(
    events: Any,
    settings: Any,
    *,
    train_days: float,
    sim_hours: float,
    catalog: Catalog | None = None,
    cluster: Cluster | None = None,
    labels: Sequence[str] | None = None,
    hints: Sequence[Hint] = (),
    unlimited: bool = False,
    families: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> dict[str, SimMetrics]:
    """Fit the forecaster on the first ``train_days`` of ``events``, then simulate ``sim_hours`` after
    that under each policy of ``labels`` (default: every registered one of ``DEFAULT_POLICIES``)."""
    from forecaster import History
    from sim._scenario import virtual_catalog

    chosen = list(labels) if labels is not None else available()
    _check_labels(chosen)  # a typo in the last label is said before minutes of fitting, not after
    history = History.from_events(events)
    catalog = catalog or virtual_catalog(history.models)
    cut = _cut(events, history, catalog, train_days=train_days, sim_hours=sim_hours)
    source = fit_forecasts(events, settings, cut=cut, families=families)
    return run_policies(
        events,
        catalog,
        cluster,
        chosen,
        start=cut,
        end=cut + sim_hours * 3600,
        forecasts=source,
        planner=PlannerConfig.from_settings(settings.scheduler),
        hints=hints,
        unlimited=unlimited,
        progress=progress,
    )


def _cut(events: Any, history: History, catalog: Catalog, *, train_days: float, sim_hours: float) -> float:
    """Where training ends and the simulated window begins. A split of the trace that leaves nothing
    to learn from or nothing to simulate is refused, saying where the trace's requests are (a window
    without requests of the catalog's models measures nothing), and so is a window that runs more than
    a day past the trace's last request (an hour of it costs the clock 60 ticks and measures nothing);
    one more than an hour past it is run, with a warning."""
    if not (math.isfinite(train_days) and train_days > 0):
        raise InvalidInput(f"the training span must be a positive number of days, not {train_days}")
    if not (math.isfinite(sim_hours) and sim_hours > 0):
        raise InvalidInput(f"the simulated span must be a positive number of hours, not {sim_hours}")
    cut = history.start + train_days * 86400
    end = cut + sim_hours * 3600
    ts = np.asarray(events["timestamp"], dtype=np.float64)
    span = f"the trace's requests span {(history.end - history.start) / 86400:.2f} days"
    if not (ts < cut).any():
        raise InvalidInput(f"no request in the first {train_days:g} days to train on: {span}")
    in_window = (ts >= cut) & (ts < end)
    if not in_window.any():
        raise InvalidInput(
            f"no request in the {sim_hours:g} hours after the first {train_days:g} days: {span}; "
            "choose fewer training days or more simulated hours"
        )
    past = end - float(ts.max())
    if past > _MAX_PAST_END_S:
        most = math.floor((float(ts.max()) + _MAX_PAST_END_S - cut) / 3600)
        raise InvalidInput(
            f"the simulated window runs {past / 86400:,.1f} days past the trace's last request: {span}; "
            f"simulate at most {most:,} hours after the first {train_days:g} days"
        )
    if past > _WARN_PAST_END_S:
        log.warning(
            "the simulated window runs past the trace's last request: its idle memory counts those hours, "
            "and nothing else happens in them",
            extra={"hours_past": round(past / 3600, 1)},
        )
    names = events["model"].to_numpy()[in_window].astype(str)
    asked = set(names.tolist())
    if asked.isdisjoint(catalog.ids()):  # hashed, as ``simulate`` filters: ``np.isin`` sorts every name
        raise InvalidInput(
            f"none of the {len(names):,} requests in the simulated window is for a model of the catalog "
            f"(they are for {abridged(sorted(asked))})"
        )
    return cut


def fit_forecasts(
    events: Any, settings: Any, *, cut: float, families: Sequence[str] | None = None
) -> ForecastSource:
    """The forecaster fitted on the requests of ``events`` before ``cut``, answering with forecasts
    conditioned on what it observes after training (``forecaster.LiveForecasts``). ``run_policies``
    gives each policy its own copy, so what one policy observes never leaks into another's run.

    Only models requested before ``cut`` are trained on, as a platform's retrain knows only the models
    its demand store has seen: a model first requested after the cut is one the live forecaster meets
    as it is observed. (Trained on with a span of nothing but zeros, such a model was forecast a rate
    of 0 that its first requests took hours to lift.)"""
    from forecaster import History, LiveForecasts, SelectionConfig, fit_bundle

    history = History.from_events(events)
    train, _ = history.split(cut)
    train = train.select(np.flatnonzero(train.counts.sum(axis=1) > 0))
    config = SelectionConfig(families=tuple(families)) if families else None
    bundle = fit_bundle(
        train, config, bucket_s=settings.forecast.bucket_s, horizon_s=settings.forecast.horizon_s
    )
    return LiveForecasts(bundle)
