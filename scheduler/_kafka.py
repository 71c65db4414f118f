"""Kafka at the scheduler's edge: orders out (keyed by node), executor reports in (compacted, by node).

kafka-python errors are translated here into ``prewarm.BrokerError`` (``transient`` when a retry can
help), so the rest of the scheduler never sees a kafka type.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from pydantic import ValidationError

from prewarm import ExecutorState, KafkaSettings, Order, get_logger
from prewarm.kafka import broker_errors, close_producer, make_consumer, make_producer

__all__ = ["OrderPublisher", "StateFollower"]

log = get_logger(__name__)

_FOLLOW = "follow executor state"


class OrderPublisher:
    """Publishes orders to the orders topic, keyed by node so that each node reads its own in order."""

    def __init__(self, kafka: KafkaSettings, *, timeout_s: float = 10.0) -> None:
        self.topic = kafka.topic_orders
        self._timeout_s = timeout_s
        # acks=all and idempotence (make_producer's rule): an acknowledged order survives the loss of its
        # partition's leader, and with one request in flight a retry never reorders a node's orders.
        self._producer = make_producer(
            kafka,
            client_id=f"{kafka.kafka_client_id}-scheduler",
            linger_ms=0,  # an order is latency-critical; batching buys nothing at this rate
            key_serializer=str.encode,
            value_serializer=str.encode,
        )

    def publish(self, orders: Sequence[Order], *, wait: bool = True) -> None:
        """Send ``orders``; with ``wait`` return once the broker has acknowledged every one."""
        with broker_errors("publish orders"):
            futures = [self._producer.send(self.topic, key=o.node, value=o.model_dump_json()) for o in orders]
            if wait:
                for future in futures:
                    future.get(timeout=self._timeout_s)

    def close(self) -> None:
        close_producer(self._producer, self._timeout_s, "close order producer")


class StateFollower:
    """Reads the executor-state topic from the beginning, then follows it, in a daemon thread.

    No consumer group: every scheduler replica (and every restart) reads the whole compacted topic.
    A report that does not parse is logged and skipped; one bad executor does not blind the scheduler.
    Any error that ends the loop is kept in ``error``, which the scheduler's readiness reports.
    """

    def __init__(self, kafka: KafkaSettings, on_state: Callable[[ExecutorState], None]) -> None:
        self._kafka = kafka
        self._on_state = on_state
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prewarm-state-follower", daemon=True)
        self.error: Exception | None = None
        """What ended the loop: a ``BrokerError`` from the broker, else the error itself."""

    def start(self) -> StateFollower:
        self._thread.start()
        return self

    def wait_caught_up(self, timeout: float) -> bool:
        return self._caught_up.wait(timeout)

    @property
    def caught_up(self) -> bool:
        """Whether the backlog the topic held at start has been read."""
        return self._caught_up.is_set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _consumer(self) -> KafkaConsumer:
        topic = self._kafka.topic_executor_state
        with broker_errors(_FOLLOW):
            consumer = make_consumer(
                self._kafka,
                client_id=f"{self._kafka.kafka_client_id}-scheduler-state",
                enable_auto_commit=False,
                fetch_max_wait_ms=100,
            )
            partitions = consumer.partitions_for_topic(topic) or {0}
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            return consumer

    def _run(self) -> None:
        consumer: KafkaConsumer | None = None
        try:
            consumer = self._consumer()
            self._follow(consumer)
        except Exception as exc:
            # Whatever ends the loop must reach readiness: a thread that dies quietly leaves the planner
            # on reports that no longer change while /readyz still says ok.
            self.error = exc
            log.error("executor state follower stopped", extra={"error": f"{type(exc).__name__}: {exc}"})
        finally:
            if consumer is not None:
                consumer.close()

    def _follow(self, consumer: KafkaConsumer) -> None:
        # Only the consumer's calls are the broker's: an error in delivering a report is ours.
        with broker_errors(_FOLLOW):
            ends: dict[Any, int] = consumer.end_offsets(list(consumer.assignment()))
        while not self._stop.is_set():
            with broker_errors(_FOLLOW):
                batches = consumer.poll(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    self._deliver(record.value)
            if not self._caught_up.is_set():
                with broker_errors(_FOLLOW):
                    caught_up = all(consumer.position(tp) >= end for tp, end in ends.items())
                if caught_up:
                    self._caught_up.set()

    def _deliver(self, value: bytes | None) -> None:
        if value is None:  # a tombstone: a node left the cluster
            return
        try:
            state = ExecutorState.model_validate_json(value)
        except ValidationError as exc:
            log.warning("skipping an executor report that does not parse", extra={"error": str(exc)[:200]})
            return
        self._on_state(state)
