"""The live scheduler: APScheduler drives the planning loop, timed order publishing and daily retraining.

The job store is SQLAlchemy on ``Settings.database_url``, so a timed order outlives the process: an
order due while the scheduler was down is published as soon as it starts again (and an executor still
skips it if its deadline passed). Job functions are module-level and take only strings, because the job
store pickles a reference to the function and its arguments; they reach the live runtime through
``_CURRENT``, the one runtime running in this process. Active hints are kept in the same store, as
do-nothing date jobs that fall due when the hint expires; on start the runtime takes back those hints
and the orders still waiting, so it neither forgets a hint nor books a node's bytes twice. One
scheduler per job store: APScheduler 3 does not coordinate two processes over one table.

Orders due now are published on the caller's thread (a hint's orders are on Kafka before its HTTP
response returns); later ones become date jobs. Inputs that cost I/O (forecasts, recent demand) are
refreshed by the interval job only. The forecaster served is the registry's champion and nothing else:
a retrain that lost the comparison is not served, and the planning tick asks the registry every
``champion_poll_s`` whether the alias moved (a promotion by hand, or by another retrain).
"""

from __future__ import annotations

import hashlib
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
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

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
from prewarm import BrokerError, ConfigError, Hint, Order, PrewarmError, Settings, counter, get_logger
from prewarm.kafka import ensure_control_topics
from scheduler._cluster import Cluster
from scheduler._core import SchedulerCore
from scheduler._kafka import OrderPublisher, StateFollower
from scheduler._planner import PlannerConfig
from scheduler._signals import demand_hints

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

_PUBLISHED = counter(
    "prewarm_scheduler_orders_published_total", "Orders written to Kafka, by reason.", ["reason"]
)
_EXPIRED = counter("prewarm_scheduler_orders_expired_total", "Timed orders dropped: deadline passed first.")
_JOBSTORE_TABLE = "prewarm_scheduler_jobs"
_PLAN_JOB = "prewarm-plan"
_RETRAIN_JOB = "prewarm-retrain"
_RETRY_S = 2.0
_CHAMPION_POLL_S = 60.0

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


def forget_hint_job(hint_json: str) -> None:
    """Job: nothing to do. The job only carries an active hint in the store until the hint expires."""


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


def retrain_trigger(settings: Settings) -> CronTrigger:
    """When the daily retrain is due: ``retrain_cron`` (a crontab line, UTC) as an APScheduler trigger.

    ``ConfigError`` if the expression is not a valid crontab line, so a bad setting stops the start-up
    instead of a job that never runs.
    """
    try:
        return CronTrigger.from_crontab(settings.forecast.retrain_cron, timezone="UTC")
    except ValueError as exc:
        raise ConfigError(f"invalid retrain_cron: {exc}", setting="PREWARM_RETRAIN_CRON") from exc


class Runtime:
    """Planning state + Kafka + APScheduler. ``start`` it, serve ``core`` over HTTP, ``stop`` it."""

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
            on_hint=self._remember_hint,
        )
        self._publisher: OrderPublisher | None = None
        self._follower: StateFollower | None = None
        self._scheduler: BackgroundScheduler | None = None
        self._store: DemandStore | None = None
        # The champion once loaded or trained, and its registry version (None: not from the registry).
        # One tuple, replaced whole: the retrain job and the planning tick run on different threads.
        self._served: tuple[ForecasterBundle | None, str | None] = (None, None)
        self._live: tuple[ForecasterBundle, LiveForecasts, float] | None = None
        self._champion_poll_s = champion_poll_s
        self._champion_asked_at = -math.inf
        self._started = threading.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Runtime:
        global _CURRENT
        if _CURRENT is not None and _CURRENT is not self:
            raise ConfigError("another scheduler runtime is already running in this process")
        kafka = self.settings.kafka
        ensure_control_topics(kafka)
        self._publisher = OrderPublisher(kafka)
        self._follower = StateFollower(kafka, self.core.observe).start()
        # Plan with what the nodes last said, if they said anything: a restart does not start blind.
        self._follower.wait_caught_up(timeout=5.0)
        _prepare_sqlite(self._jobstore_url)
        self._scheduler = BackgroundScheduler(
            jobstores={"default": SQLAlchemyJobStore(url=self._jobstore_url, tablename=_JOBSTORE_TABLE)},
            executors={"default": ThreadPoolExecutor(4)},
            # Missed while down: run once, however late; the order's own deadline decides if it still counts.
            job_defaults={"coalesce": True, "misfire_grace_time": None, "max_instances": 1},
            timezone=UTC,
        )
        _CURRENT = self
        self._scheduler.start()  # orders that fell due while no scheduler ran are published now
        self._restore()
        self._scheduler.add_job(
            plan_job,
            "interval",
            seconds=self.settings.scheduler.plan_interval_s,
            id=_PLAN_JOB,
            replace_existing=True,
            next_run_time=datetime.now(UTC),
        )
        trigger = retrain_trigger(self.settings)
        self._scheduler.add_job(retrain_job, trigger, id=_RETRAIN_JOB, replace_existing=True)
        self._started.set()
        log.info("scheduler runtime started", extra={"nodes": len(self.core.cluster.nodes)})
        return self

    def stop(self) -> None:
        global _CURRENT
        self._started.clear()
        if self._scheduler is not None and self._scheduler.running:
            # Wait for jobs already running: a due order's job has left the job store when it starts,
            # so one cut off by closing the publisher under it would be lost.
            self._scheduler.shutdown(wait=True)
        if self._follower is not None:
            self._follower.stop()
        if self._publisher is not None:
            self._publisher.close()
        if self._store is not None:
            self._store.close()
        if _CURRENT is self:
            _CURRENT = None

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ready(self) -> tuple[bool, str]:
        if not self._started.is_set():
            return False, "the runtime is not started"
        if self._follower is not None and self._follower.error is not None:
            return False, f"executor state: {self._follower.error}"
        return True, "ok"

    # ------------------------------------------------------------------ what survives a restart

    def _remember_hint(self, hint: Hint) -> None:
        if self._scheduler is None or not self._scheduler.running:
            return
        text = hint.model_dump_json()
        try:
            self._scheduler.add_job(
                forget_hint_job,
                "date",
                run_date=datetime.fromtimestamp(hint.expires_at(time.time()), UTC),
                args=[text],
                id=f"hint:{hashlib.sha256(text.encode()).hexdigest()[:32]}",
                replace_existing=True,
            )
        except SQLAlchemyError as exc:
            # The hint is planned already; only its survival of a restart is lost.
            log.warning("could not persist a hint", extra={"model": hint.model, "error": str(exc)[:200]})

    def _restore(self) -> None:
        assert self._scheduler is not None
        hints: list[Hint] = []
        orders: list[Order] = []
        for job in self._scheduler.get_jobs():
            try:
                if job.id.startswith("hint:"):
                    hints.append(Hint.model_validate_json(job.args[0]))
                elif job.id.startswith("order:"):
                    orders.append(Order.model_validate_json(job.args[0]))
            except (ValidationError, IndexError) as exc:
                log.warning(
                    "skipping a stored job that does not parse",
                    extra={"job": job.id, "error": str(exc)[:200]},
                )
        self.core.restore(hints, orders)
        if hints or orders:
            log.info("restored from the job store", extra={"hints": len(hints), "orders": len(orders)})

    # ------------------------------------------------------------------ orders

    def _dispatch(self, orders: Sequence[Order]) -> None:
        now = self._clock()
        due = [o for o in orders if o.not_before <= now]
        later = [o for o in orders if o.not_before > now]
        if due:
            try:
                self._publish(due)
            except BrokerError as exc:
                # Not lost: retried as jobs in the persistent store.
                log.warning("publishing failed, will retry", extra={"orders": len(due), "error": str(exc)})
                later += due
        for order in later:
            self._schedule(order, max(order.not_before, now + (_RETRY_S if order in due else 0.0)))

    def _schedule(self, order: Order, at: float) -> None:
        assert self._scheduler is not None
        self._scheduler.add_job(
            publish_order_job,
            "date",
            run_date=datetime.fromtimestamp(at, UTC),
            args=[order.model_dump_json()],
            id=f"order:{order.id}",
            replace_existing=True,
        )

    def _publish(self, orders: Sequence[Order]) -> None:
        assert self._publisher is not None
        self._publisher.publish(orders)
        for order in orders:
            _PUBLISHED.labels(order.reason.value).inc()

    def publish_due(self, order: Order) -> None:
        now = self._clock()
        if order.deadline <= now:
            _EXPIRED.inc()
            log.info("timed order expired before it was due", extra={"order": order.id, "model": order.model})
            return
        try:
            self._publish([order])
        except BrokerError as exc:
            if not exc.transient:
                raise
            log.warning("publishing a timed order failed, retrying", extra={"order": order.id})
            self._schedule(order, now + _RETRY_S)

    # ------------------------------------------------------------------ planning inputs

    def tick(self) -> None:
        now = self._clock()
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
            return
        decision = result.decision
        seconds = round(time.perf_counter() - started, 1)
        if decision is None or decision.promoted:
            self._served = (result.bundle, decision.model_version if decision is not None else None)
            log.info("daily retrain done, serving it", extra={"seconds": seconds})
        else:
            log.info(
                "daily retrain done; the champion stays served",
                extra={"seconds": seconds, "reason": decision.reason},
            )
            if self._served[0] is None:
                self._champion_asked_at = -math.inf  # load the champion that won at the next tick

    def scheduled_orders(self) -> list[tuple[str, datetime | None]]:
        """(job id, next run) of the timed orders waiting in the job store."""
        assert self._scheduler is not None
        return [(j.id, j.next_run_time) for j in self._scheduler.get_jobs() if j.id.startswith("order:")]


def _prepare_sqlite(url: str) -> None:
    """The embedded SQLite file's directory must exist before SQLAlchemy opens it."""
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
