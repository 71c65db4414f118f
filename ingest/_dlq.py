"""The dead-letter topic: every event the consumer cannot count, with why and where it came from.

A dead letter is the original message bytes and key, unchanged, with headers:

    prewarm-reason            short tag: not_json, not_utf8, wrong_type, missing_field, oversized,
                              not_object, unsupported_version, future
    prewarm-detail            a human-readable message (at most 512 bytes)
    prewarm-source-topic      the topic the event was read from
    prewarm-source-partition  its partition (decimal)
    prewarm-source-offset     its offset (decimal)

Dead letters are flushed before the batch that dropped them commits its offsets, so none is lost; a
consumer killed between the two re-sends that batch's dead letters (at-least-once in the DLQ, while the
counts stay exactly-once). ``source`` (topic, partition, offset) identifies duplicates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer

from prewarm import KafkaSettings
from prewarm.kafka import broker_errors, close_producer

from ._kafka import make_producer

__all__ = ["DeadLetter", "DeadLetterWriter", "decode_dead_letter"]

H_REASON = "prewarm-reason"
H_DETAIL = "prewarm-detail"
H_TOPIC = "prewarm-source-topic"
H_PARTITION = "prewarm-source-partition"
H_OFFSET = "prewarm-source-offset"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes

    @property
    def source(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)


def decode_dead_letter(record: Any) -> DeadLetter:
    """A ``DeadLetter`` from a kafka-python ``ConsumerRecord`` of the dead-letter topic."""
    headers = {k: v for k, v in (record.headers or [])}

    def text(name: str) -> str:
        raw = headers.get(name, b"")
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)

    return DeadLetter(
        reason=text(H_REASON),
        detail=text(H_DETAIL),
        topic=text(H_TOPIC),
        partition=int(text(H_PARTITION) or -1),
        offset=int(text(H_OFFSET) or -1),
        key=record.key,
        value=record.value if record.value is not None else b"",
    )


class DeadLetterWriter:
    """Produces dead letters with ``acks=all``; ``flush`` raises ``BrokerError`` if any was lost."""

    def __init__(self, kafka: KafkaSettings, topic: str | None = None) -> None:
        self.topic = topic or kafka.topic_dlq
        self._kafka = kafka
        # Connected on the first dead letter: a healthy stream never pays for the producer's thread.
        self._producer: KafkaProducer | None = None
        self._futures: list[Any] = []

    def _connected(self) -> KafkaProducer:
        if self._producer is None:
            self._producer = make_producer(
                self._kafka, acks="all", enable_idempotence=True, linger_ms=5, max_block_ms=30_000
            )
        return self._producer

    def send(self, record: Any, reason: str, detail: str) -> None:
        headers: Sequence[tuple[str, bytes]] = [
            (H_REASON, reason.encode()),
            (H_DETAIL, detail.encode("utf-8", "replace")[:512]),
            (H_TOPIC, str(record.topic).encode()),
            (H_PARTITION, str(record.partition).encode()),
            (H_OFFSET, str(record.offset).encode()),
        ]
        with broker_errors(f"dead-letter to {self.topic}"):
            self._futures.append(
                self._connected().send(
                    self.topic, value=record.value or b"", key=record.key, headers=list(headers)
                )
            )

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until every dead letter sent so far is acknowledged."""
        if not self._futures:
            return
        futures, self._futures = self._futures, []
        with broker_errors(f"flush dead letters to {self.topic}"):
            self._connected().flush(timeout=timeout_s)
            for future in futures:
                future.get(timeout=timeout_s)

    def discard(self) -> None:
        """Forget unflushed dead letters: their batch will be read and dead-lettered again."""
        self._futures = []

    def close(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            close_producer(producer, 5, "close dead-letter producer")
