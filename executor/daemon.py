"""The executor as a long-running node daemon: orders in, state out, a local load API for inference servers.

* Orders: the node follows ``prewarm.orders`` in its own consumer group and applies the records keyed
  by its name. Demand orders (a request is waiting) go to their own lane, so they never queue behind a
  long prefetch; the executor pre-empts the prefetch on the shared link. Everything else is applied in
  the order published, which keeps "demote X" ahead of "prefetch Y". An offset is committed only once
  its order was applied, and the executor skips an order it has seen (by id) or whose deadline passed.
* State: the node's ``ExecutorState`` goes to the compacted ``prewarm.executor-state`` topic, keyed by
  node, every ``state_interval_s`` and right after each order or load.
* HTTP: ``POST /v1/load {"model"}`` returns once the model is in L0, with the tier it came from and the
  wait; ``GET /v1/state``, ``/healthz``, ``/metrics``.

Only the spine, the catalog, the executor and kafka-python are imported: this runs on the GPU node.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
from kafka.errors import KafkaError
from pydantic import BaseModel, ValidationError

from executor import Executor
from models import CatalogWatcher
from prewarm import (
    BrokerError,
    CapacityError,
    InvalidInput,
    KafkaSettings,
    ModelId,
    Order,
    OrderOutcome,
    OrderStatus,
    PrewarmError,
    Tier,
    UnknownModel,
    get_logger,
)
from prewarm._metrics import counter, histogram, render
from prewarm.kafka import bootstrap_servers, broker_errors, ensure_control_topics

__all__ = ["ExecutorDaemon", "LoadRequest"]

log = get_logger(__name__)

_ORDERS_SEEN = counter(
    "prewarm_executor_daemon_orders_total", "Orders read for this node, by outcome status.", ["status"]
)
_LOAD_WAIT = histogram(
    "prewarm_executor_load_wait_seconds",
    "Wait of POST /v1/load until the model was in L0, by the tier it came from.",
    ["served_from"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 180),
)


class LoadRequest(BaseModel):
    model: ModelId


class ExecutorDaemon:
    """Kafka and HTTP around one ``Executor``. ``start``, serve ``app()``, ``stop``."""

    def __init__(
        self,
        executor: Executor,
        kafka: KafkaSettings,
        *,
        state_interval_s: float = 5.0,
        catalog_path: Path | None = None,
        group_prefix: str = "prewarm-executor",
    ) -> None:
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
        # Commit bookkeeping: the next offset read per partition, and the offsets read but not yet applied.
        # The committed offset never passes an unapplied order, whatever was read after it.
        self._read_to: dict[TopicPartition, int] = {}
        self._open: dict[TopicPartition, set[int]] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._done_lock = threading.Lock()
        self._demand_lane = ThreadPoolExecutor(2, thread_name_prefix="prewarm-demand")
        self._threads: list[threading.Thread] = []
        self._producer: KafkaProducer | None = None
        # The last few, for tests and /v1/state readers; deque.append is atomic, and three threads apply.
        self.outcomes: deque[OrderOutcome] = deque(maxlen=50)
        self.error: BrokerError | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ExecutorDaemon:
        if self.executor.l1.pool.pinned:
            # Pinning the whole L1 takes seconds: once, before the first order, not inside a load. (Plain
            # memory is faulted in block by block as fast, so a CPU node commits RAM only as L1 fills.)
            self.executor.l1.pool.prefault()
        servers = bootstrap_servers(self._kafka)
        ensure_control_topics(self._kafka, client_id=f"{self._kafka.kafka_client_id}-executor")
        with broker_errors("connect state producer"):
            self._producer = KafkaProducer(
                bootstrap_servers=servers,
                client_id=f"{self._kafka.kafka_client_id}-executor-{self.node}",
                acks="all",
                linger_ms=0,
            )
        for target, name in ((self._consume, "orders"), (self._work, "apply"), (self._report, "state")):
            thread = threading.Thread(target=target, name=f"prewarm-executor-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._state_due.set()
        log.info("executor daemon started", extra={"node": self.node})
        return self

    def stop(self) -> None:
        self._stop.set()
        self._state_due.set()
        for thread in self._threads:
            thread.join(10)
        self._demand_lane.shutdown(wait=True)
        if self._producer is not None:
            self._producer.close(timeout=5)

    def __enter__(self) -> ExecutorDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ orders

    def _consume(self) -> None:
        try:
            with broker_errors("follow orders"):
                consumer = KafkaConsumer(
                    self._kafka.topic_orders,
                    bootstrap_servers=bootstrap_servers(self._kafka),
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
        key = self.node.encode()
        try:
            while not self._stop.is_set():
                for tp, records in consumer.poll(timeout_ms=200).items():
                    for record in records:
                        order = self._parse(record.value) if record.key == key else None
                        self._mark_read(tp, record.offset, pending=order is not None)
                        if order is None:
                            continue
                        if order.demand:
                            self._demand_lane.submit(self._apply_and_mark, tp, record.offset, order)
                        else:
                            self._queue.put((tp, record.offset, order))
                self._commit(consumer)
        except KafkaError as exc:
            self.error = BrokerError(f"follow orders: {exc}", transient=True)
            log.error("order consumer stopped", extra={"error": str(exc)})
        finally:
            with suppress(KafkaError):
                self._commit(consumer)
            consumer.close()

    def _parse(self, value: bytes) -> Order | None:
        try:
            return Order.model_validate_json(value)
        except ValidationError as exc:
            log.warning("skipping an order that does not parse", extra={"error": str(exc)[:200]})
            _ORDERS_SEEN.labels("unreadable").inc()
            return None

    def _mark_read(self, tp: TopicPartition, offset: int, *, pending: bool) -> None:
        with self._done_lock:
            self._read_to[tp] = max(self._read_to.get(tp, 0), offset + 1)
            if pending:
                self._open.setdefault(tp, set()).add(offset)

    def _mark_done(self, tp: TopicPartition, offset: int) -> None:
        with self._done_lock:
            self._open.get(tp, set()).discard(offset)

    def _commit(self, consumer: KafkaConsumer) -> None:
        # Committed from the consumer's own thread (kafka-python clients are not thread-safe).
        with self._done_lock:
            safe = {
                tp: min(self._open[tp]) if self._open.get(tp) else end for tp, end in self._read_to.items()
            }
            due = {tp: off for tp, off in safe.items() if self._committed.get(tp) != off}
        if due:
            consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in due.items()})
            self._committed.update(due)

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
            self._mark_done(tp, offset)

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
        assert self._producer is not None
        state = self.executor.state()
        with broker_errors("publish state"):
            self._producer.send(
                self._kafka.topic_executor_state,
                key=self.node.encode(),
                value=state.model_dump_json().encode(),
            ).get(timeout=10)

    # ------------------------------------------------------------------ HTTP

    def app(self) -> FastAPI:
        app = FastAPI(
            title=f"prewarm executor {self.node}", description="Local load API for inference servers."
        )

        @app.post("/v1/load", summary="Return once the model is in GPU memory (L0)")
        async def load(request: LoadRequest) -> JSONResponse:
            started = time.perf_counter()
            try:
                result = await run_in_threadpool(self.executor.ensure, request.model, Tier.L0, demand=True)
            except UnknownModel as exc:
                return _error(404, str(exc))
            except CapacityError as exc:
                return _error(507, str(exc))
            except InvalidInput as exc:
                return _error(422, str(exc))
            except PrewarmError as exc:
                return _error(503, str(exc))
            wait = time.perf_counter() - started
            _LOAD_WAIT.labels(result.served_from.value).observe(wait)
            self._state_due.set()
            body = {
                "model": result.model,
                "version": result.version,
                "tier": Tier.L0.value,
                "served_from": result.served_from.value,
                "wait_s": round(wait, 6),
                "seconds_per_hop": result.to_json()["seconds_per_hop"],
            }
            return JSONResponse(body)

        @app.get("/v1/state", summary="What this node holds, as published to the scheduler")
        def state() -> dict[str, Any]:
            return self.executor.state().model_dump(mode="json")

        @app.get("/healthz")
        def healthz() -> JSONResponse:
            ok = self.error is None
            return JSONResponse(
                {"status": "ok" if ok else "degraded", "node": self.node}, status_code=200 if ok else 503
            )

        @app.get("/metrics")
        def metrics() -> Response:
            return Response(render(), media_type="text/plain; version=0.0.4; charset=utf-8")

        return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": status, "message": message}, status_code=status)


def run_forever(daemon: ExecutorDaemon, host: str, port: int) -> None:
    """Start the daemon, serve its API until interrupted, stop it."""
    import uvicorn

    daemon.start()
    try:
        uvicorn.run(daemon.app(), host=host, port=port, log_level="warning", access_log=False)
    finally:
        daemon.stop()
