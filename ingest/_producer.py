"""The gateway-side producer of request-log events.

``RequestLogProducer`` batches (``linger_ms``), compresses (lz4 by default; zstd, gzip or none: the
``lz4`` and ``zstandard`` C extensions are dependencies, so every consumer reads them), waits for
``acks=all`` with idempotence (as every prewarm producer), and bounds what it holds: once
``buffer_bytes`` of events are sent but not yet acknowledged, ``send`` blocks, and after
``max_block_s`` of a broker that does not answer it raises ``BrokerError`` instead of growing without
limit. A delivery failure is reported by the next ``send`` or ``flush``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from prewarm import BrokerError, IngestSettings, KafkaSettings, RequestEvent
from prewarm.kafka import broker_errors, close_producer

from ._kafka import make_producer

__all__ = ["RequestLogProducer", "encode_event"]


def encode_event(event: RequestEvent | Mapping[str, Any]) -> tuple[bytes, bytes]:
    """(key, value) of one event on the wire: key = model id, value = compact JSON without nulls."""
    if isinstance(event, RequestEvent):
        return event.model.encode(), event.model_dump_json(exclude_none=True).encode()
    value = json.dumps({k: v for k, v in event.items() if v is not None}, separators=(",", ":"))
    return str(event["model"]).encode(), value.encode()


class RequestLogProducer:
    """Publish request events to the request-log topic, keyed by model id."""

    def __init__(
        self,
        bootstrap: str,
        topic: str = "prewarm.requests",
        *,
        client_id: str = "prewarm-gateway",
        compression: str = "lz4",
        linger_ms: int = 20,
        batch_bytes: int = 256 * 1024,
        buffer_bytes: int = 32 * 2**20,
        max_block_s: float = 30.0,
        kafka: KafkaSettings | None = None,
    ) -> None:
        self.topic = topic
        self.buffer_bytes = buffer_bytes
        self.max_block_s = max_block_s
        settings = kafka or KafkaSettings(kafka_bootstrap=bootstrap, kafka_client_id=client_id)
        # acks=all and idempotence (make_producer's rule): a retry after a lost ack must not write an
        # event twice, and an acknowledged one must survive its leader: the log is the ground truth.
        self._producer = make_producer(
            settings,
            compression_type=None if compression == "none" else compression,
            linger_ms=linger_ms,
            batch_size=batch_bytes,
            max_block_ms=int(max_block_s * 1000),
            delivery_timeout_ms=max(int(max_block_s * 1000), 1000) + linger_ms + 30_000,
            request_timeout_ms=30_000,
            max_request_size=4 * 2**20,
        )
        self._lock = threading.Condition()
        self._in_flight = 0
        self._error: BaseException | None = None
        self.sent = 0
        self.acked = 0

    @classmethod
    def from_settings(cls, kafka: KafkaSettings, ingest: IngestSettings) -> RequestLogProducer:
        return cls(
            kafka.kafka_bootstrap,
            kafka.topic_requests,
            client_id=kafka.kafka_client_id,
            compression=ingest.producer_compression,
            linger_ms=ingest.producer_linger_ms,
            buffer_bytes=ingest.producer_buffer_bytes,
            max_block_s=ingest.producer_max_block_s,
            kafka=kafka,
        )

    # ------------------------------------------------------------------ sending

    def send(self, event: RequestEvent | Mapping[str, Any]) -> None:
        """Queue one event (a ``RequestEvent`` or a dict of its fields)."""
        key, value = encode_event(event)
        self.send_raw(value, key)

    def send_raw(self, value: bytes, key: bytes | None = None, *, partition: int | None = None) -> None:
        """Queue bytes as they are: replays and tests of malformed input."""
        self._raise_pending()
        size = len(value) + (len(key) if key else 0)
        self._reserve(size)
        try:
            with broker_errors(f"send to {self.topic}"):
                future = self._producer.send(self.topic, value=value, key=key, partition=partition)
        except BrokerError:
            self._release(size, None)
            raise
        future.add_callback(lambda _meta: self._release(size, None))
        future.add_errback(lambda exc: self._release(size, exc))
        self.sent += 1

    def _reserve(self, size: int) -> None:
        deadline = time.monotonic() + self.max_block_s
        with self._lock:
            # One event larger than the whole buffer still goes through alone.
            while self._in_flight and self._in_flight + size > self.buffer_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerError(
                        f"broker has not acknowledged {self._in_flight} buffered bytes for "
                        f"{self.max_block_s:.0f}s: it is down or too slow",
                        transient=True,
                    )
                self._lock.wait(min(left, 0.5))
                if self._error is not None:
                    break
            self._in_flight += size

    def _release(self, size: int, exc: BaseException | None) -> None:
        with self._lock:
            self._in_flight -= size
            if exc is None:
                self.acked += 1
            elif self._error is None:
                self._error = exc
            self._lock.notify_all()

    def _raise_pending(self) -> None:
        if self._error is not None:
            exc, self._error = self._error, None
            raise BrokerError(f"delivery to {self.topic} failed: {exc}", transient=True) from exc

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued event is acknowledged (or raise ``BrokerError``)."""
        with broker_errors(f"flush to {self.topic}"):
            self._producer.flush(timeout=timeout_s if timeout_s is not None else self.max_block_s)
        self._raise_pending()

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, then close; events the broker has not acknowledged by then are dropped (and it raises)."""
        try:
            self.flush(timeout_s)
        except BrokerError:
            with suppress(BrokerError):  # the flush has waited already: drop the rest at once
                close_producer(self._producer, 0, "close producer")
            raise
        close_producer(self._producer, timeout_s if timeout_s is not None else 5.0, "close producer")

    def __enter__(self) -> RequestLogProducer:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:  # do not wait on a broker that already failed us, nor hide the error that brought us here
            with suppress(BrokerError):
                close_producer(self._producer, 0, "close producer")
