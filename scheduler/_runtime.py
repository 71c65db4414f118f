"""The live scheduler: APScheduler drives the planning loop, timed order publishing and daily retraining.

The job store is SQLAlchemy on ``Settings.database_url``, so a timed order outlives the process: an
order due while the scheduler was down is published as soon as it starts again (and an executor still
skips it if its deadline passed). Job functions are module-level and take only strings, because the job
store pickles a reference to the function and its arguments; they reach the live runtime through
``_CURRENT``, the one runtime running in this process.

Replicas: any number of runtimes may share one PostgreSQL database. The holder of the leader lease
(``scheduler._lease``) is the *active* replica: it alone plans, runs APScheduler jobs and publishes;
the others (*standbys*) keep APScheduler paused, serve the hint API, and take over when the lease
passes to them. Every replica stores the hints it accepts before answering (``scheduler._hintstore``)
and follows what the others stored; every order handed out is in the order ledger, marked published
in the same transaction that sends it (``scheduler._ledger``). Taking over therefore means: read back
the orders topic's last minutes, take the live hints and the ledger's orders, publish what is due and
unpublished, make sure every later one has its date job, resume APScheduler. With SQLite the lease is
always held: one process owns the file.

Orders due now are published on the caller's thread (a hint's orders are on Kafka before its HTTP
response returns); later ones become date jobs. Inputs that cost I/O (forecasts, recent demand) are
refreshed by the interval job only. The forecaster served is the registry's champion and nothing else:
a retrain that lost the comparison is not served, and the planning tick asks the registry every
``champion_poll_s`` whether the alias moved (a promotion by hand, or by another retrain).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from forecaster import (
    ForecasterBundle,
    LiveForecasts,
    ModelForecast,
    RetrainResult,
    champion_version,
    load_forecaster,
    recent_rate_forecasts,
    tracking_uri_of,
)
from forecaster import retrain as retrain_forecaster
from ingest import DemandStore
from models import Catalog, CatalogWatcher
from prewarm import (
    ConfigError,
    ExecutorState,
    Hint,
    Order,
    PrewarmError,
    Settings,
    StorageError,
    UnknownModel,
    get_logger,
)
from prewarm.kafka import ensure_control_topics
from scheduler import _metrics
from scheduler._cluster import Cluster
from scheduler._core import SchedulerCore
from scheduler._dispatch import Dispatcher
from scheduler._hintstore import HINTS_TABLE, HintFollower, HintStore
from scheduler._kafka import OrderPublisher, StateFollower
from scheduler._lease import (
    LEASE_TABLE,
    AlwaysHeld,
    LeaderLease,
    Lease,
    LeaseKeeper,
    create_tables_once,
    replica_identity,
    shares_database,
)
from scheduler._ledger import ORDERS_TABLE, OrderLedger
from scheduler._planner import PlannerConfig
from scheduler._signals import demand_hints
from scheduler._status import StatusSources

__all__ = [
    "ForecastProvider",
    "Retrainer",
    "Runtime",
    "default_cluster",
    "plan_job",
    "publish_order_job",
    "retrain_job",
    "retrain_trigger",
]

log = get_logger(__name__)

ForecastProvider = Callable[[float, Sequence[str]], Mapping[str, ModelForecast]]
"""``(now, model ids) -> forecasts``: a trained forecaster's view; models it omits use recent demand."""
Retrainer = Callable[[Settings, DemandStore, float], RetrainResult]
"""``(settings, demand store, now) -> result``: the daily retrain (``forecaster.retrain`` by default)."""

_JOBSTORE_TABLE = "prewarm_scheduler_jobs"
_PLAN_JOB = "prewarm-plan"
_RETRAIN_JOB = "prewarm-retrain"
_CHAMPION_POLL_S = 60.0
_LEDGER_KEEP_S = 86_400.0  # ledger rows outlive their deadline this long (for operators, then pruned)

_CURRENT: Runtime | None = None


_LIVE_REPLAY_S = 86_400.0
"""How far back a newly served forecaster is told the demand it missed since its training."""


def _current() -> Runtime:
    if _CURRENT is None:
        raise RuntimeError("no prewarm scheduler runtime is running in this process")
    return _CURRENT


def publish_order_job(order_json: str) -> None:
    """Job: publish one timed order now that it is due."""
    _current().publish_due(Order.model_validate_json(order_json))


def plan_job() -> None:
    """Job: refresh forecasts and demand, then plan."""
    _current().tick()


def retrain_job() -> None:
    """Job: retrain the forecaster (daily)."""
    _current().retrain()


def default_cluster(settings: Settings) -> Cluster:
    """The cluster file if configured, else one node described by the executor settings."""
    if settings.scheduler.cluster is not None:
        return Cluster.load(settings.scheduler.cluster)
    ex = settings.executor
    # A fractional L0 budget is only known on the node; plan no L0 until its executor reports.
    l0 = int(ex.l0_budget) if ex.l0_budget > 1 else 0
    return Cluster.single_node(
        ex.node_name, l0_bytes=l0, l1_bytes=ex.l1_budget_bytes, l2_bytes=ex.l2_budget_bytes
    )


def retrain_trigger(settings: Settings) -> CronTrigger | None:
    """When the daily retrain is due: ``retrain_cron`` (a crontab line, UTC) as an APScheduler trigger,
    or None when it is empty: the retrain then runs elsewhere (the chart's CronJob), never in here too.

    ``ConfigError`` if the expression is not a valid crontab line, so a bad setting stops the start-up
    instead of a job that never runs.
    """
    if not settings.forecast.retrain_cron.strip():
        return None
    try:
        return CronTrigger.from_crontab(settings.forecast.retrain_cron, timezone="UTC")
    except ValueError as exc:
        raise ConfigError(f"invalid retrain_cron: {exc}", setting="PREWARM_RETRAIN_CRON") from exc


class Runtime:
    """Planning state + Kafka + APScheduler + the leader lease. ``start`` it, serve ``core`` over HTTP
    (with ``accept_hint`` as the hint hook), ``stop`` it."""

    def __init__(
        self,
        settings: Settings,
        catalog: Catalog,
        cluster: Cluster | None = None,
        *,
        config: PlannerConfig | None = None,
        forecasts: ForecastProvider | None = None,
        retrain: Retrainer | None = None,
        clock: Callable[[], float] = time.time,
        jobstore_url: str | None = None,
        catalog_path: Path | None = None,
        champion_poll_s: float = _CHAMPION_POLL_S,
    ) -> None:
        """``jobstore_url`` defaults to ``settings.database_url``; a benchmark passes a scratch one.
        With ``catalog_path`` the catalog is re-read at each planning tick after the file changed.
        ``champion_poll_s``: how often a planning tick asks the registry which forecaster is champion."""
        self._catalog = CatalogWatcher(catalog_path) if catalog_path else None
        self.settings = settings
        self.replica = replica_identity(settings.scheduler.replica_id)
        self._jobstore_url = jobstore_url or settings.database_url
        self._clock = clock
        self._forecasts = forecasts
        self._retrain = retrain or retrain_forecaster
        self.core = SchedulerCore(
            catalog=catalog,
            cluster=cluster or default_cluster(settings),
            config=config or PlannerConfig.from_settings(settings.scheduler),
            dispatch=self._dispatch,
            clock=clock,
        )
        self._publisher: OrderPublisher | None = None
        self._follower: StateFollower | None = None
        self._scheduler: BackgroundScheduler | None = None
        self._store: DemandStore | None = None
        self._engine: Engine | None = None
        self._hints: HintStore | None = None
        self._ledger: OrderLedger | None = None
        self._dispatcher: Dispatcher | None = None
        self._keeper: LeaseKeeper | None = None
        self._hint_follower: HintFollower | None = None
        self._shared = False  # the job store is shared with other replicas (not SQLite)
        # Held while a hint is stored and planned, and while the follower takes in stored ones: a hint
        # this replica is still accepting is never taken in twice.
        self._hint_lock = threading.Lock()
        # The champion once loaded or trained, and its registry version (None: not from the registry).
        # One tuple, replaced whole: the retrain job and the planning tick run on different threads.
        self._served: tuple[ForecasterBundle | None, str | None] = (None, None)
        self._live: tuple[ForecasterBundle, LiveForecasts, float] | None = None
        self._champion_poll_s = champion_poll_s
        self._champion_asked_at = -math.inf
        self._started = threading.Event()
        self._active = threading.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Runtime:
        """Connect, create the tables if this is the first start, and try the lease once: when this
        returns the runtime is either active or a standby (``active`` says which)."""
        global _CURRENT
        if _CURRENT is not None and _CURRENT is not self:
            raise ConfigError("another scheduler runtime is already running in this process")
        kafka = self.settings.kafka
        ensure_control_topics(kafka)
        self._publisher = OrderPublisher(kafka)
        self._follower = StateFollower(kafka, self._on_report).start()
        # Plan with what the nodes last said, if they said anything: a restart does not start blind.
        self._follower.wait_caught_up(timeout=5.0)
        engine = self._engine = _job_engine(self._jobstore_url)
        jobstore = SQLAlchemyJobStore(engine=engine, tablename=_JOBSTORE_TABLE)
        create_tables_once(engine, [jobstore.jobs_t, LEASE_TABLE, HINTS_TABLE, ORDERS_TABLE])
        sched = self.settings.scheduler
        self._shared = shares_database(engine)
        lease: Lease = (
            LeaderLease(engine, self.replica, sched.lease_ttl_s) if self._shared else AlwaysHeld(self.replica)
        )
        self._hints = HintStore(engine)
        self._ledger = OrderLedger(engine, self.replica, lease.holds)
        self._scheduler = BackgroundScheduler(
            jobstores={"default": jobstore},
            executors={"default": ThreadPoolExecutor(4)},
            # Missed while down: run once, however late; the order's own deadline decides if it still counts.
            job_defaults={"coalesce": True, "misfire_grace_time": None, "max_instances": 1},
            timezone=UTC,
        )
        self._dispatcher = Dispatcher(
            publisher=self._publisher,
            ledger=self._ledger,
            scheduler=self._scheduler,
            job=publish_order_job,
            clock=self._clock,
        )
        _CURRENT = self
        self._scheduler.start(paused=True)  # jobs run only once this replica holds the lease
        self.core.restore(self._hints.live(self._clock()))  # a standby answers with every live hint
        self._keeper = LeaseKeeper(
            lease,
            ttl_s=sched.lease_ttl_s,
            renew_s=sched.lease_renew_s,
            on_acquired=self._take_over,
            on_lost=self._stand_by,
        ).start()
        if self._shared:  # alone on SQLite, every hint stored was accepted here
            self._hint_follower = HintFollower(
                self._hints, self._take_in_hints, poll_s=sched.hint_poll_s, clock=self._clock
            ).start()
        self._started.set()
        log.info(
            "scheduler runtime started",
            extra={"nodes": len(self.core.cluster.nodes), "replica": self.replica, "active": self.active},
        )
        return self

    def stop(self) -> None:
        global _CURRENT
        self._started.clear()
        if self._keeper is not None:
            self._keeper.stop()
        if self._hint_follower is not None:
            self._hint_follower.stop()
        if self._scheduler is not None and self._scheduler.running:
            # Wait for jobs already running: a due order's job has left the job store when it starts,
            # so one cut off by closing the publisher under it would be lost.
            self._scheduler.shutdown(wait=True)
        if self._keeper is not None and self._keeper.held:
            self._active.clear()
            _metrics.set_active(False)
            self._keeper.lease.release()  # after the last publish: a standby takes over at its next try
        if self._follower is not None:
            self._follower.stop()
        if self._publisher is not None:
            self._publisher.close()
        if self._store is not None:
            self._store.close()
        if self._engine is not None:
            self._engine.dispose()
        if _CURRENT is self:
            _CURRENT = None

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def active(self) -> bool:
        """Whether this replica holds the lease and has taken over: it plans and publishes."""
        return self._active.is_set()

    def ready(self) -> tuple[bool, str]:
        """Ready to serve the hint API: an active replica and a standby both are."""
        if not self._started.is_set():
            return False, "the runtime is not started"
        if self._follower is not None and self._follower.error is not None:
            return False, f"executor state: {self._follower.error}"
        if self._keeper is not None and self._keeper.error is not None:
            return False, f"leader lease: {self._keeper.error}"
        return True, "ok" if self.active else "ok, standby"

    # ------------------------------------------------------------------ hints, on every replica

    def accept_hint(self, hint: Hint) -> tuple[Hint, list[Order]]:
        """The hint API's hook: stamp the hint, store it, then plan it if this replica is active. A
        standby answers with no orders: the active replica plans the stored hint within ``hint_poll_s``.
        ``UnknownModel`` for a model not in the catalog; ``StorageError`` if it could not be stored
        (so it is refused rather than kept only in the memory of one replica)."""
        if hint.model not in self.core.catalog:
            raise UnknownModel(hint.model)
        stamped = hint.model_copy(update={"received_at": self._clock()})
        with self._hint_lock:
            if self._hints is not None:
                self._hints.add(stamped, self._clock())
            if self.active:
                return self.core.add_hint(hint, received_at=stamped.received_at)
            self.core.restore([stamped])
        return stamped, []

    def _take_in_hints(self, hints: list[Hint]) -> None:
        """Hints another replica (or this one) stored: known at once, planned if this one is active."""
        with self._hint_lock:
            self.core.restore(hints)
        if self.active:
            self.core.replan()

    def _on_report(self, report: ExecutorState) -> None:
        """A node's state from the state topic: kept, and on the active replica, once the topic's backlog
        is read, planned at once in an incremental round (the node's book and what changed on it), so a
        finished load or a freed GPU is acted on without waiting for the planning interval."""
        follower = self._follower
        if self.active and follower is not None and follower.caught_up:
            self.core.observe_and_plan(report)
        else:
            self.core.observe(report)

    # ------------------------------------------------------------------ becoming active, and not

    def _take_over(self) -> None:
        """Won the lease: settle the orders the previous holder left, then run the jobs."""
        assert self._scheduler is not None
        assert self._dispatcher is not None
        assert self._hints is not None
        orders = self._dispatcher.take_over(self.settings.kafka if self._shared else None)
        with self._hint_lock:
            self.core.restore(self._hints.live(self._clock()), orders)
        self._active.set()
        _metrics.set_active(True)
        self._scheduler.resume()  # jobs that fell due while no replica was active run now
        self._scheduler.add_job(
            plan_job,
            "interval",
            seconds=self.settings.scheduler.plan_interval_s,
            id=_PLAN_JOB,
            replace_existing=True,
            next_run_time=datetime.now(UTC),
        )
        trigger = retrain_trigger(self.settings)
        if trigger is not None:
            self._scheduler.add_job(retrain_job, trigger, id=_RETRAIN_JOB, replace_existing=True)
        elif self._scheduler.get_job(_RETRAIN_JOB) is not None:
            # The job store is persistent: a start that had a schedule left its job there, and it would
            # still fire next to the CronJob that now owns retraining.
            self._scheduler.remove_job(_RETRAIN_JOB)
        log.info("active: planning and publishing", extra={"replica": self.replica})

    def _stand_by(self) -> None:
        self._active.clear()
        _metrics.set_active(False)
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.pause()
        log.info("standby: serving hints, not planning", extra={"replica": self.replica})

    # ------------------------------------------------------------------ orders

    def _dispatch(self, orders: Sequence[Order]) -> None:
        if self._dispatcher is None:
            raise RuntimeError("the runtime is not started: nothing can publish its orders")
        self._dispatcher.dispatch(orders)

    def publish_due(self, order: Order) -> None:
        assert self._dispatcher is not None
        self._dispatcher.publish_due(order)

    def _prune(self, now: float) -> None:
        """Drop expired hints and long-past orders from the shared tables (the active replica's chore)."""
        assert self._hints is not None
        assert self._ledger is not None
        try:
            self._hints.prune(now)
            self._ledger.prune(now - _LEDGER_KEEP_S)
        except StorageError as exc:
            log.warning("pruning the scheduler's tables failed", extra={"error": str(exc)})

    # ------------------------------------------------------------------ planning inputs

    def tick(self) -> None:
        now = self._clock()
        self._prune(now)
        if self._catalog is not None and (catalog := self._catalog.poll()) is not None:
            self.core.update_catalog(catalog)
        try:
            forecasts, demand = self._signals(now)
        except PrewarmError as exc:
            # Degrade, don't die: plan with the last signals and the hints we have.
            log.warning("refreshing forecasts and demand failed", extra={"error": str(exc)})
        else:
            self.core.set_signals(forecasts=forecasts, demand=demand)
        self.core.replan()

    def _demand_store(self) -> DemandStore:
        if self._store is None:
            self._store = DemandStore(self.settings.database_url)
        return self._store

    def status_sources(self) -> StatusSources:
        """What the status page reads besides the core: the demand store and the forecaster served."""
        return StatusSources(demand=self._demand_store, forecaster=lambda: self.forecaster)

    def _signals(self, now: float) -> tuple[dict[str, ModelForecast], list[Hint]]:
        models = self.core.catalog.ids()
        store = self._demand_store()
        window = self.settings.scheduler.demand_window_s
        last = {m: t for m, t in store.last_requests().items() if m in self.core.catalog}
        frame = store.bulk(models, now - 3600, now, 60)
        counts = {m: frame[m].to_numpy() for m in models}
        horizon = self.settings.forecast.horizon_s
        # Recent demand first, then the trained forecaster on top for every model it knows.
        forecasts = recent_rate_forecasts(counts, now, horizon_s=horizon)
        trained: Mapping[str, ModelForecast] = {}
        if self._forecasts is not None:
            trained = self._forecasts(now, models)
        else:
            bundle = self._champion(now)
            if bundle is not None:
                trained = self._live_forecasts(bundle, store, models, now)(now, models)
        forecasts.update({m: f for m, f in trained.items() if m in self.core.catalog})
        return forecasts, demand_hints(last, now, window)

    def _live_forecasts(
        self, bundle: ForecasterBundle, store: DemandStore, models: Sequence[str], now: float
    ) -> LiveForecasts:
        """The champion's forecasts conditioned on what the demand store has counted since it was
        trained (time since each model's last request, shifts in rate, models it never saw), as the
        simulator's prewarm policy gets them. Each complete minute is told once, at its middle; a new
        champion starts afresh from the end of its training (at most ``_LIVE_REPLAY_S`` back)."""
        if self._live is None or self._live[0] is not bundle:
            since = bundle.trained_until
            live = LiveForecasts(bundle, since=since, horizon_s=self.settings.forecast.horizon_s)
            self._live = (bundle, live, max(since, now - _LIVE_REPLAY_S))
        _, live, told = self._live
        upto = math.floor(now / 60) * 60  # the current minute is still being counted
        if upto > told:
            frame = store.bulk(models, told, upto, 60)
            minutes = frame.index.to_numpy(dtype=np.float64)
            for model in frame.columns:
                column = frame[model].to_numpy()
                for row in np.flatnonzero(column):
                    for _ in range(int(column[row])):
                        live.observe(str(model), float(minutes[row]) + 30.0)
            self._live = (bundle, live, float(upto))
        return live

    @property
    def forecaster(self) -> ForecasterBundle | None:
        """The forecaster being served: the registry's champion (or a retrain no registry judged)."""
        return self._served[0]

    @property
    def forecaster_version(self) -> str | None:
        """The registry version of the forecaster being served; None before one is, or for a bundle
        that never went through the registry (a retrain without tracking)."""
        return self._served[1]

    def _champion(self, now: float) -> ForecasterBundle | None:
        """The registry's champion forecaster: asked for every ``champion_poll_s`` and loaded when the
        alias has moved (a retrain here or elsewhere promoted one, or someone promoted one by hand).

        Until one exists (a fresh install, MLflow down) the planner runs on hints and recent demand, and
        what it served last stays served while the registry cannot be reached.
        """
        if now - self._champion_asked_at >= self._champion_poll_s:
            self.poll_champion(now)
        return self._served[0]

    def poll_champion(self, now: float | None = None) -> str | None:
        """Ask the registry which version is champion now and serve it if it is not served yet;
        returns the version served."""
        self._champion_asked_at = self._clock() if now is None else now
        name = self.settings.forecast.registered_model
        tracking = tracking_uri_of(self.settings)
        served = self._served[1]
        try:
            version = champion_version(name, tracking_uri=tracking)
            if version is None or version == served:
                return served
            bundle = load_forecaster(f"models:/{name}/{version}", tracking_uri=tracking)
        except (PrewarmError, OSError) as exc:
            log.info(
                "no champion forecaster to load; planning with what is served",
                extra={"why": str(exc)[:200], "served": served},
            )
            return served
        self._served = (bundle, version)
        _metrics.champion_served(bundle)
        log.info("champion forecaster loaded", extra={"model": name, "version": version})
        return version

    def retrain(self) -> None:
        """The daily retrain. Its bundle is served at once if it became champion (or if no registry
        judged it); one that lost the comparison is not: the champion stays served."""
        started = time.perf_counter()
        try:
            result = self._retrain(self.settings, self._demand_store(), self._clock())
        except PrewarmError as exc:
            log.error("daily retrain failed", extra={"error": str(exc)})
            _metrics.retrained("failed", time.perf_counter() - started)
            return
        decision = result.decision
        seconds = round(time.perf_counter() - started, 1)
        outcome = "unjudged" if decision is None else "promoted" if decision.promoted else "kept_champion"
        _metrics.retrained(outcome, time.perf_counter() - started)
        if decision is None or decision.promoted:
            # Its week tables are built here, in the retrain's job, not at the first planning round.
            self._served = (result.bundle.compile(), decision.model_version if decision is not None else None)
            _metrics.champion_served(result.bundle)
            log.info("daily retrain done, serving it", extra={"seconds": seconds})
        else:
            log.info(
                "daily retrain done; the champion stays served",
                extra={"seconds": seconds, "reason": decision.reason},
            )
            if self._served[0] is None:
                self._champion_asked_at = -math.inf  # load the champion that won at the next tick

    @property
    def retrain_due(self) -> datetime | None:
        """When this replica's in-process retrain runs next; None on a standby, before ``start``, or
        when ``retrain_cron`` is empty (retraining is another process's job)."""
        if self._scheduler is None or not self.active:
            return None
        job = self._scheduler.get_job(_RETRAIN_JOB)
        return job.next_run_time if job is not None else None

    def scheduled_orders(self) -> list[tuple[str, datetime | None]]:
        """(job id, next run) of the timed orders waiting in the job store."""
        assert self._scheduler is not None
        return [(j.id, j.next_run_time) for j in self._scheduler.get_jobs() if j.id.startswith("order:")]


def _job_engine(url: str) -> Engine:
    """One engine for the job store, the lease, the hints and the ledger. PostgreSQL (shared by the
    replicas) or SQLite (one process); the embedded SQLite file's directory is created first."""
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, pool_pre_ping=True)
    if engine.dialect.name not in ("postgresql", "sqlite"):
        engine.dispose()
        raise ConfigError(
            f"the scheduler's job store must be PostgreSQL or SQLite, not {engine.dialect.name}",
            setting="PREWARM_DATABASE_URL",
        )
    return engine
