"""The ingest consumer: request-log topic → per-(model, minute) counts, exactly once.

How exactly-once holds:

1. Offsets live in the demand store, not in Kafka. On every assignment the consumer reads them and
   seeks there (no stored offset: the start of the partition).
2. A batch (up to ``batch_max_events`` records or ``batch_max_s`` seconds) is aggregated in memory and
   written in *one* database transaction together with the new offsets, the partition watermarks and
   the counters. A process killed at any point leaves either the whole batch or none of it.
3. Each offset update is a compare-and-set on the offset read at assignment. A consumer that lost its
   partitions without noticing cannot commit over the new owner: its transaction is rolled back whole
   and it rewinds to what the store says.
4. On revocation the pending batch is committed before the partitions are given up, so a rebalance
   normally costs nothing; when that fails the batch is discarded and re-read by the new owner.

Dead letters are flushed (``acks=all``) before the batch commits, so none is lost.

Every ``rollup_interval_s`` the consumer also keeps the store bounded (``DemandStore.maintain``:
partitions ahead, minutes past the retention window rolled up to hours); several consumers doing so
is safe, since a rollup is idempotent and serialised against every writer.

Late events are counted into their own minute as part of the batch (``_window.py`` says how late is
late), so a late minute is written in the same transaction as the offset that reads past it: a kill
can neither lose a late correction nor apply it twice. Events beyond ``max_lateness_s`` are counted as
too late (counter and metric), never dead-lettered: they are well formed.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kafka import ConsumerRebalanceListener, TopicPartition

from prewarm import BrokerError, IngestSettings, InvalidEvent, KafkaSettings, StorageError, get_logger
from prewarm.kafka import broker_errors, ensure_log_topics, make_consumer

from ._decode import Fields, fast_fields, schema_fields
from ._dlq import DeadLetterWriter
from ._kafka import consumer_config
from ._metrics import METRICS
from ._store import DemandStore, OffsetConflict, OffsetUpdate
from ._window import MinuteAggregator, Verdict, WindowPolicy

__all__ = ["IngestConsumer", "IngestSummary", "count_records"]

log = get_logger(__name__)

# Store counter names of dead letters: this prefix, then the reason.
DEAD_LETTERED = "dead_lettered:"

_GC_GEN0_THRESHOLD = 50_000
# Consecutive failed commits (store or dead-letter topic unavailable) tolerated before giving up.
_MAX_FAILURES = 8


@dataclass(slots=True)
class _Partition:
    expected: int | None  # next offset as stored in the database (None: no row yet)
    watermark_ms: int | None  # committed watermark
    pending_watermark_ms: int | None = None
    position: int | None = None  # next offset after the last record of the pending batch

    def reset(self) -> None:
        self.pending_watermark_ms = self.watermark_ms
        self.position = None


@dataclass(slots=True)
class IngestSummary:
    """What one ``run`` committed."""

    records: int = 0
    events: int = 0
    late_counted: int = 0  # of ``events``: more than ``lateness_s`` behind the partition's watermark
    too_late: int = 0  # more than ``max_lateness_s`` behind: counted as too late, not stored
    dead_lettered: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    conflicts: int = 0
    first_record_at: float | None = None  # monotonic clock
    last_commit_at: float | None = None
    first_record_cpu: float | None = None  # process CPU time: rates that other processes cannot skew
    last_commit_cpu: float | None = None


DeadLetterSink = Callable[[Any, str, str], None]


def count_records(
    records: Iterable[Any], agg: MinuteAggregator, watermark_ms: int | None, now: float, dead: DeadLetterSink
) -> int | None:
    """Count one partition's records (in offset order) into ``agg``; returns the new watermark.

    Every record is either counted (late ones too, ``agg.late`` of them), counted as too late
    (``agg.too_late``) or handed to ``dead(record, reason, detail)``; nothing a record holds can raise
    out of here.
    """
    add = agg.add_fields
    future = Verdict.FUTURE
    for record in records:
        # The hot path: one msgspec decode and one window update per event.
        value = record.value
        fields = fast_fields(value) if value is not None else None
        if fields is None:
            fields = _parse_slowly(record, dead)
            if fields is None:
                continue
        verdict, watermark_ms = add(*fields, watermark_ms, now)
        if verdict is future:
            dead(record, "future", f"ts {fields[1]} is more than {agg.policy.future_tolerance_s}s ahead")
    return watermark_ms


def _parse_slowly(record: Any, dead: DeadLetterSink) -> Fields | None:
    """The full schema: the counted fields, or None once the record is dead-lettered."""
    try:
        if record.value is None:
            raise InvalidEvent("message has no value", reason="no_value")
        return schema_fields(record.value)
    except InvalidEvent as exc:
        dead(record, exc.reason, str(exc))
    except Exception as exc:  # no input may stop the consumer
        dead(record, "unparseable", f"{type(exc).__name__}: {exc}")
    return None


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: IngestConsumer) -> None:
        self.owner = owner

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.owner._on_revoked(revoked)

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.owner._on_assigned(assigned)


class IngestConsumer:
    """One member of the ingest consumer group. ``run`` until ``stop`` is set, then flush and close."""

    def __init__(
        self,
        store: DemandStore,
        kafka: KafkaSettings,
        ingest: IngestSettings,
        *,
        topic: str | None = None,
        group: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.topic = topic or kafka.topic_requests
        self.group = group or ingest.consumer_group
        self.settings = ingest
        self.clock = clock
        self.policy = WindowPolicy(ingest.lateness_s, ingest.future_tolerance_s, ingest.max_lateness_s)
        self._parts: dict[TopicPartition, _Partition] = {}
        self._agg = MinuteAggregator(self.policy)
        self._dead: Counter[str] = Counter()
        self._records = 0
        self._batch_started: float | None = None
        self._assign_error: BaseException | None = None
        self._failures = 0
        self._next_upkeep = time.monotonic()
        self.summary = IngestSummary()
        # A broker without auto-creation (production) would leave the group waiting for a topic forever.
        ensure_log_topics(kafka, topic=self.topic)
        self._dlq = DeadLetterWriter(kafka)
        with broker_errors(f"connect consumer group {self.group}"):
            self._consumer = make_consumer(
                kafka,
                **consumer_config(
                    kafka,
                    ingest,
                    group_id=self.group,
                    session_timeout_ms=int(ingest.ingest_session_timeout_s * 1000),
                    heartbeat_interval_ms=int(ingest.ingest_session_timeout_s * 1000 / 3),
                ),
            )
            self._consumer.subscribe([self.topic], listener=_Listener(self))

    # ------------------------------------------------------------------ rebalance callbacks

    def _on_revoked(self, revoked: list[TopicPartition]) -> None:
        # Runs inside poll(); kafka-python swallows what a listener raises, so nothing may escape.
        try:
            self.flush()
        except Exception as exc:
            log.warning(
                "could not commit before giving up partitions; batch discarded", extra={"error": str(exc)}
            )
            self._discard()
        for tp in revoked:
            self._parts.pop(tp, None)
        log.info("partitions revoked", extra={"partitions": sorted(tp.partition for tp in revoked)})

    def _on_assigned(self, assigned: list[TopicPartition]) -> None:
        try:
            self._discard()  # nothing pending may cross an assignment
            self._parts = {}
            self._seek_to_store(assigned)
        except Exception as exc:
            self._assign_error = exc
        log.info("partitions assigned", extra={"partitions": sorted(tp.partition for tp in assigned)})

    def _seek_to_store(self, partitions: list[TopicPartition]) -> None:
        stored = self.store.load_offsets(self.group, self.topic)
        for tp in partitions:
            row = stored.get(tp.partition)
            if row is None:
                self._consumer.seek_to_beginning(tp)
                self._parts[tp] = _Partition(None, None, None)
            else:
                self._consumer.seek(tp, row.next_offset)
                self._parts[tp] = _Partition(row.next_offset, row.watermark_ms, row.watermark_ms)

    # ------------------------------------------------------------------ batch

    def _discard(self) -> None:
        self._agg = MinuteAggregator(self.policy)
        self._dead = Counter()
        self._records = 0
        self._batch_started = None
        self._dlq.discard()
        for part in self._parts.values():
            part.reset()

    def _rewind(self) -> None:
        """Forget the pending batch and go back to the offsets the store holds."""
        self._discard()
        partitions = list(self._parts)
        self._parts = {}
        with broker_errors("seek"):
            self._seek_to_store(partitions)

    def _process(self, polled: dict[TopicPartition, list[Any]]) -> None:
        now = self.clock()
        for tp, records in polled.items():
            part = self._parts.get(tp)
            if part is None or not records:
                continue  # not ours any more; the new owner reads it from the store's offset
            part.pending_watermark_ms = count_records(
                records, self._agg, part.pending_watermark_ms, now, self._dead_letter
            )
            part.position = records[-1].offset + 1
            self._records += len(records)
            if self._batch_started is None:
                self._batch_started = time.monotonic()

    def _dead_letter(self, record: Any, reason: str, detail: str) -> None:
        self._dead[reason] += 1
        self._dlq.send(record, reason, detail)

    def _due(self) -> bool:
        if self._batch_started is None:
            return False
        return (
            self._records >= self.settings.batch_max_events
            or time.monotonic() - self._batch_started >= self.settings.batch_max_s
        )

    def flush(self) -> None:
        """Commit the pending batch: dead letters first, then counts + offsets in one transaction."""
        if self._records == 0:
            return
        updates = [
            OffsetUpdate(tp.topic, tp.partition, p.expected, p.position, p.pending_watermark_ms)
            for tp, p in self._parts.items()
            if p.position is not None
        ]
        counters: Counter[str] = Counter(
            records=self._records,
            events=self._agg.counted,
            late_counted=self._agg.late,
            too_late=self._agg.too_late,
        )
        for reason, n in self._dead.items():
            counters[f"{DEAD_LETTERED}{reason}"] = n
        started = time.perf_counter()
        self._dlq.flush()
        self.store.commit_batch(
            self.group, self._agg.cells, self._agg.last_seen_ms, updates, counters, now=self.clock()
        )
        for part in self._parts.values():
            if part.position is not None:
                part.expected = part.position
                part.watermark_ms = part.pending_watermark_ms
        METRICS.committed(self._agg, self._dead, time.perf_counter() - started)
        self._account()
        self._discard()
        self._update_lag()

    def _account(self) -> None:
        s = self.summary
        s.records += self._records
        s.events += self._agg.counted
        s.late_counted += self._agg.late
        s.too_late += self._agg.too_late
        s.dead_lettered.update(self._dead)
        s.batches += 1
        s.last_commit_at = time.monotonic()
        s.last_commit_cpu = time.process_time()

    def _update_lag(self) -> None:
        for tp, part in self._parts.items():
            high = self._consumer.highwater(tp)
            if high is not None and part.expected is not None:
                METRICS.lag.labels(topic=tp.topic, partition=str(tp.partition)).set(
                    max(high - part.expected, 0)
                )

    def _try_flush(self) -> None:
        try:
            self.flush()
            self._failures = 0
        except OffsetConflict as exc:
            self.summary.conflicts += 1
            METRICS.conflicts.inc()
            log.warning(
                "offset conflict: another consumer owns a partition now; rewinding", extra={"error": str(exc)}
            )
            self._rewind()
        except (StorageError, BrokerError) as exc:
            self._failures += 1
            if self._failures >= _MAX_FAILURES:
                raise
            pause = min(0.2 * 2**self._failures, 5.0)
            log.warning(
                "commit failed; rewinding and retrying",
                extra={"error": str(exc), "attempt": self._failures, "pause_s": pause},
            )
            time.sleep(pause)
            self._rewind()

    def _upkeep(self) -> None:
        """Partitions ahead and the rollup, when due; a failure waits for the next interval."""
        interval = self.settings.rollup_interval_s
        if not interval or time.monotonic() < self._next_upkeep:
            return
        self._next_upkeep = time.monotonic() + interval
        try:
            self.store.maintain(self.clock(), self.settings.minute_retention_days * 86_400)
        except StorageError as exc:
            log.warning("demand store upkeep failed; next try in one interval", extra={"error": str(exc)})

    # ------------------------------------------------------------------ loop

    def run(
        self,
        stop: threading.Event | None = None,
        *,
        max_records: int | None = None,
        idle_exit_s: float | None = None,
    ) -> IngestSummary:
        """Consume until ``stop`` is set, ``max_records`` are committed, or ``idle_exit_s`` of silence."""
        stop = stop or threading.Event()
        poll_ms = int(min(self.settings.batch_max_s, 0.5) * 1000)
        last_data = time.monotonic()
        # kafka-python allocates a few container objects per record and a batch keeps thousands alive
        # for a moment, so the default threshold (700) runs the cyclic collector every ~150 records,
        # over the whole batch each time: 25% of the consumer's CPU. None of it is cyclic garbage.
        thresholds = gc.get_threshold()
        gc.set_threshold(_GC_GEN0_THRESHOLD, thresholds[1], thresholds[2])
        try:
            while not stop.is_set():
                self._upkeep()
                polled = self._poll(poll_ms)
                if self._assign_error is not None:
                    error, self._assign_error = self._assign_error, None
                    raise StorageError(f"could not load offsets on assignment: {error}") from error
                if polled:
                    if self.summary.first_record_at is None:
                        self.summary.first_record_at = time.monotonic()
                        self.summary.first_record_cpu = time.process_time()
                    last_data = time.monotonic()
                    self._process(polled)
                if self._due() or (not polled and self._records):
                    self._try_flush()
                if max_records is not None and self.summary.records >= max_records:
                    break
                if idle_exit_s is not None and not polled and time.monotonic() - last_data >= idle_exit_s:
                    break
            self._try_flush()
        finally:
            gc.set_threshold(*thresholds)
            self.close()
        return self.summary

    def _poll(self, poll_ms: int) -> dict[TopicPartition, list[Any]]:
        """One poll; a transient broker error is logged and waited out (the client reconnects)."""
        try:
            with broker_errors(f"poll {self.topic}"):
                polled: dict[TopicPartition, list[Any]] = self._consumer.poll(timeout_ms=poll_ms)
                return polled
        except BrokerError as exc:
            if not exc.transient:
                raise
            log.warning("poll failed; retrying", extra={"error": str(exc)})
            time.sleep(poll_ms / 1000)
            return {}

    def close(self) -> None:
        try:
            with broker_errors("close consumer"):
                self._consumer.close(autocommit=False)
        finally:
            self._dlq.close()
