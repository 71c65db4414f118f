"""Orders out of the active replica: published now if due, else a date job; each through the ledger.

``Dispatcher`` is what the planning core's ``dispatch`` calls and what a timed order's job calls when
it falls due. Every publish goes through ``OrderLedger.claim`` (so no order id is sent twice, by this
replica or another), and a transient failure turns the order into a date job retried shortly; the
ledger keeps saying "unpublished" meanwhile, so a takeover in between still finds it.
``take_over`` is the publishing half of becoming active: settle what the previous holder left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from apscheduler.schedulers.base import BaseScheduler
from pydantic import ValidationError

from prewarm import BrokerError, KafkaSettings, Order, StorageError, counter, get_logger
from scheduler._kafka import OrderPublisher
from scheduler._ledger import OrderLedger, recently_published

__all__ = ["Dispatcher"]

log = get_logger(__name__)

_PUBLISHED = counter(
    "prewarm_scheduler_orders_published_total", "Orders written to Kafka, by reason.", ["reason"]
)
_EXPIRED = counter("prewarm_scheduler_orders_expired_total", "Timed orders dropped: deadline passed first.")
_RETRY_S = 2.0
# How far back a new active replica reads the orders topic for orders its predecessor sent but had not
# yet marked published: that window is at most a lease plus one Kafka round trip; minutes are cheap.
_READ_BACK_S = 300.0


class Dispatcher:
    """``job`` is the module-level job function a date job runs with an order's JSON."""

    def __init__(
        self,
        *,
        publisher: OrderPublisher,
        ledger: OrderLedger,
        scheduler: BaseScheduler,
        job: Callable[[str], None],
        clock: Callable[[], float],
    ) -> None:
        self._publisher = publisher
        self._ledger = ledger
        self._scheduler = scheduler
        self._job = job
        self._clock = clock

    def dispatch(self, orders: Sequence[Order]) -> None:
        """New orders from a planning round: due ones published now, later ones recorded and scheduled."""
        now = self._clock()
        due = [o for o in orders if o.not_before <= now]
        later = [o for o in orders if o.not_before > now]
        if later and not self._ledger.record(later):
            log.warning("not active any more: orders left to the active one", extra={"orders": len(later)})
            later = []
        for order in later:
            self.schedule(order, order.not_before)
        if due:
            self.publish(due, now)

    def publish_due(self, order: Order) -> None:
        """A timed order's job: publish it unless its deadline passed first."""
        now = self._clock()
        if order.deadline <= now:
            _EXPIRED.inc()
            log.info("timed order expired before it was due", extra={"order": order.id, "model": order.model})
            return
        self.publish([order], now)

    def publish(self, orders: Sequence[Order], now: float) -> None:
        """Publish those of ``orders`` no replica has published; on a transient failure each becomes a
        date job retried in ``_RETRY_S``."""
        try:
            with self._ledger.claim(orders) as mine:
                if mine:
                    self._publisher.publish(mine)
                    for order in mine:
                        _PUBLISHED.labels(order.reason.value).inc()
        except (BrokerError, StorageError) as exc:
            if isinstance(exc, BrokerError) and not exc.transient:
                raise
            # Not lost: retried as jobs in the persistent store (the ledger still says unpublished).
            log.warning("publishing failed, will retry", extra={"orders": len(orders), "error": str(exc)})
            for order in orders:
                self.schedule(order, now + _RETRY_S)

    def schedule(self, order: Order, at: float) -> None:
        self._scheduler.add_job(
            self._job,
            "date",
            run_date=datetime.fromtimestamp(at, UTC),
            args=[order.model_dump_json()],
            id=f"order:{order.id}",
            replace_existing=True,
        )

    def take_over(self, kafka: KafkaSettings | None) -> list[Order]:
        """Settle what a previous holder left: with ``kafka`` (replicas share the database), first mark
        published what is on the orders topic; then publish the due unpublished orders and give each
        later one its date job. Returns every order still in force, for the planner to book."""
        now = self._clock()
        if kafka is not None:
            sent = recently_published(kafka, now - _READ_BACK_S)
            if (marked := self._ledger.mark_published(sent)) > 0:
                log.info("orders found on the topic but not marked published", extra={"orders": marked})
        orders, unpublished = self._ledger.pending(now)
        known = {o.id for o in orders}
        orders += [o for o in self.job_orders() if o.id not in known]
        waiting = [o for o in orders if o.id in unpublished]
        due = [o for o in waiting if o.not_before <= now]
        if due:
            self.publish(due, now)
        for order in waiting:
            if order.not_before > now:
                self.schedule(order, order.not_before)  # its job may have gone with the previous holder
        log.info("orders taken over", extra={"published": len(due), "waiting": len(waiting) - len(due)})
        return orders

    def job_orders(self) -> list[Order]:
        """Orders waiting as date jobs (a job store written before the ledger has them only there)."""
        orders: list[Order] = []
        for job in self._scheduler.get_jobs():
            if not job.id.startswith("order:"):
                continue
            try:
                orders.append(Order.model_validate_json(job.args[0]))
            except (ValidationError, IndexError) as exc:
                log.warning(
                    "skipping a stored job that does not parse",
                    extra={"job": job.id, "error": str(exc)[:200]},
                )
        return orders
