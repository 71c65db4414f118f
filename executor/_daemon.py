"""The executor as a long-running node daemon: orders in, state out, and the local load API.

* Orders: the node follows ``prewarm.orders`` in its own consumer group and applies the records keyed
  by its name. Demand orders (a request is waiting) go to their own lane, so they never queue behind a
  long prefetch; the executor pre-empts the prefetch on the shared link. Everything else is applied in
  the order published, which keeps "demote X" ahead of "prefetch Y". An offset is committed only once
  its order was applied (``_offsets``), and the executor skips an order it has seen (by id) or whose
  deadline passed.
* State: the node's ``ExecutorState`` goes to the compacted ``prewarm.executor-state`` topic, keyed by
  node, every ``state_interval_s`` and right after each order or load.
* HTTP: the load API (``_http``), served by ``run_forever``.
* Hand-off: with a socket directory, the socket engines take L1 blocks from (``_handoff``); a lease
  opened or ended makes the next state report go out at once.
* Standalone (``kafka=None``): no orders and no state topic, only the load API and the hand-off socket
  (a node driven by its engines, or a check).

Every kafka-python call goes through the spine's ``broker_errors``, so what stops a loop is a
``BrokerError``. Only the spine, the catalog, the executor, FastAPI and kafka-python are imported: this
runs on the GPU node.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI
from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
from pydantic import ValidationError

from executor._executor import Executor
from executor._handoff import HandoffServer
from executor._http import check_binding, create_app
from executor._offsets import OffsetTracker
from models import CatalogWatcher
from prewarm import (
    BrokerError,
    KafkaSettings,
    Order,
    OrderOutcome,
    OrderStatus,
    PrewarmError,
    counter,
    get_logger,
)
from prewarm.kafka import (
    broker_errors,
    close_producer,
    ensure_control_topics,
    make_consumer,
    make_producer,
)

__all__ = ["ExecutorDaemon", "commit_due", "run_forever"]

log = get_logger(__name__)

_ORDERS_SEEN = counter(
    "prewarm_executor_daemon_orders_total", "Orders read for this node, by outcome status.", ["status"]
)


class Committer(Protocol):
    """What committing needs of a consumer (``KafkaConsumer.commit``)."""

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None: ...


def commit_due(consumer: Committer, offsets: OffsetTracker[TopicPartition]) -> None:
    """Commit what ``offsets`` says is safe and new. Call it from the consumer's own thread
    (kafka-python clients are not thread-safe); raises what the consumer raises."""
    due = offsets.due()
    if due:
        consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in due.items()})
        offsets.committed(due)


class ExecutorDaemon:
    """Kafka and HTTP around one ``Executor``. ``start``, serve ``app()``, ``stop``."""

    def __init__(
        self,
        executor: Executor,
        kafka: KafkaSettings | None,
        *,
        state_interval_s: float = 5.0,
        catalog_path: Path | None = None,
        group_prefix: str = "prewarm-executor",
        socket_dir: Path | None = None,
        api_token: str | None = None,
    ) -> None:
        """``kafka=None``: standalone, no orders in and no state out. ``socket_dir``: serve the hand-off
        socket there. ``api_token``: required for the load API's writes."""
        self.executor = executor
        self.node = executor.settings.node_name
        self._kafka = kafka
        self._state_interval_s = state_interval_s
        # A changed catalog file is picked up so new versions are served and stale copies never are.
        self._catalog = CatalogWatcher(catalog_path) if catalog_path else None
        self._group = f"{group_prefix}-{self.node}"
        self._stop = threading.Event()
        self._state_due = threading.Event()
        self._queue: queue.Queue[tuple[TopicPartition, int, Order]] = queue.Queue()
        # The committed offset never passes an unapplied order, whatever was read after it.
        self._offsets: OffsetTracker[TopicPartition] = OffsetTracker()
        self._demand_lane = ThreadPoolExecutor(2, thread_name_prefix="prewarm-demand")
        self._threads: list[threading.Thread] = []
        self._producer: KafkaProducer | None = None
        # The last few, for tests and /v1/state readers; deque.append is atomic, and three threads apply.
        self.outcomes: deque[OrderOutcome] = deque(maxlen=50)
        self.error: BrokerError | None = None
        self.api_token = api_token or None
        self.handoff = (
            HandoffServer(executor, socket_dir, changed=self._state_due.set)
            if socket_dir is not None
            else None
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ExecutorDaemon:
        loops = [(self._report, "state")]
        if self._kafka is not None:
            ensure_control_topics(self._kafka, client_id=f"{self._kafka.kafka_client_id}-executor")
            # acks=all and idempotence (make_producer's rule): a report the broker acknowledged survives
            # the loss of the partition's leader.
            self._producer = make_producer(
                self._kafka, client_id=f"{self._kafka.kafka_client_id}-executor-{self.node}", linger_ms=0
            )
            loops += [(self._consume, "orders"), (self._work, "apply")]
        if self.handoff is not None:
            self.handoff.start()
        for target, name in loops:
            thread = threading.Thread(target=target, name=f"prewarm-executor-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._state_due.set()
        log.info(
            "executor daemon started",
            extra={
                "node": self.node,
                "standalone": self._kafka is None,
                "socket": str(self.handoff.path) if self.handoff else None,
            },
        )
        return self

    def stop(self) -> None:
        self._stop.set()
        self._state_due.set()
        if self.handoff is not None:
            self.handoff.stop()
        for thread in self._threads:
            thread.join(10)
        self._demand_lane.shutdown(wait=True)
        if self._producer is not None:
            try:
                close_producer(self._producer, 5, "close the node's producer")
            except BrokerError as exc:
                log.warning("stopped with reports unsent", extra={"node": self.node, "error": str(exc)})

    def __enter__(self) -> ExecutorDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ orders

    def _consume(self) -> None:
        assert self._kafka is not None
        try:
            with broker_errors("follow orders"):
                consumer = make_consumer(
                    self._kafka,
                    self._kafka.topic_orders,
                    client_id=f"{self._kafka.kafka_client_id}-executor-{self.node}",
                    group_id=self._group,
                    enable_auto_commit=False,
                    # A new node applies what is already there: expired orders are skipped cheaply.
                    auto_offset_reset="earliest",
                    fetch_max_wait_ms=50,
                )
        except BrokerError as exc:
            self.error = exc
            log.error("cannot follow orders", extra={"error": str(exc)})
            return
        try:
            with broker_errors("follow orders"):
                self._follow(consumer)
        except BrokerError as exc:
            self.error = exc
            log.error("order consumer stopped", extra={"error": str(exc)})
        finally:
            # Best effort on the way out: what is not committed now is applied again (and skipped by id).
            with suppress(BrokerError), broker_errors("commit offsets"):
                commit_due(consumer, self._offsets)
            consumer.close()

    def _follow(self, consumer: KafkaConsumer) -> None:
        key = self.node.encode()
        while not self._stop.is_set():
            for tp, records in consumer.poll(timeout_ms=200).items():
                for record in records:
                    order = self._parse(record.value) if record.key == key else None
                    self._offsets.read(tp, record.offset, pending=order is not None)
                    if order is None:
                        continue
                    if order.demand:
                        self._demand_lane.submit(self._apply_and_mark, tp, record.offset, order)
                    else:
                        self._queue.put((tp, record.offset, order))
            commit_due(consumer, self._offsets)

    def _parse(self, value: bytes) -> Order | None:
        try:
            return Order.model_validate_json(value)
        except ValidationError as exc:
            log.warning("skipping an order that does not parse", extra={"error": str(exc)[:200]})
            _ORDERS_SEEN.labels("unreadable").inc()
            return None

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                tp, offset, order = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            self._apply_and_mark(tp, offset, order)

    def _apply_and_mark(self, tp: TopicPartition, offset: int, order: Order) -> None:
        try:
            self._apply(order)
        except Exception:
            # A bug in one order must not stop the node from taking the next ones (the executor turns
            # every expected failure into a FAILED outcome; this is for the unexpected).
            log.exception("applying an order raised", extra={"order": order.id, "model": order.model})
        finally:
            self._offsets.done(tp, offset)

    def _apply(self, order: Order) -> OrderOutcome:
        outcome = self.executor.apply(order)
        _ORDERS_SEEN.labels(outcome.status.value).inc()
        self.outcomes.append(outcome)
        if outcome.status is OrderStatus.FAILED:
            log.warning(
                "order failed", extra={"order": order.id, "model": order.model, "detail": outcome.detail}
            )
        self._state_due.set()
        return outcome

    # ------------------------------------------------------------------ state

    def _report(self) -> None:
        while not self._stop.is_set():
            self._state_due.wait(self._state_interval_s)
            self._state_due.clear()
            if self._catalog is not None and (catalog := self._catalog.poll()) is not None:
                self.executor.update_catalog(catalog)
            try:
                self.publish_state()
            except (BrokerError, PrewarmError) as exc:
                log.warning("publishing state failed", extra={"error": str(exc)})

    def publish_state(self) -> None:
        if self._producer is None or self._kafka is None:
            return  # standalone: the state is read from GET /v1/state
        state = self.executor.state()
        with broker_errors("publish state"):
            self._producer.send(
                self._kafka.topic_executor_state,
                key=self.node.encode(),
                value=state.model_dump_json().encode(),
            ).get(timeout=10)

    # ------------------------------------------------------------------ HTTP

    def app(self) -> FastAPI:
        """The local load API; a load makes the next state report go out at once."""
        return create_app(
            self.executor,
            node=self.node,
            healthy=lambda: self.error is None,
            loaded=self._state_due.set,
            token=self.api_token,
        )


def run_forever(daemon: ExecutorDaemon, host: str, port: int) -> None:
    """Start the daemon, serve its API until interrupted, stop it. Refuses (``ConfigError``) to serve
    on a non-loopback address without an API token."""
    import uvicorn

    check_binding(host, daemon.api_token)
    daemon.start()
    try:
        uvicorn.run(daemon.app(), host=host, port=port, log_level="warning", access_log=False)
    finally:
        daemon.stop()
