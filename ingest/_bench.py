"""``prewarm bench ingest``: the consumer's end-to-end rate against a bare kafka-python poll loop.

One run: produce N events to a fresh topic, read them all with a bare ``KafkaConsumer`` poll loop
(same fetch settings, no parsing, no store), then ingest them with ``IngestConsumer`` into a fresh
store. Both rates are measured from the first record received to the last one done (for the consumer:
committed to the store), so the group join, which only the consumer group pays, is not in either.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from prewarm._exceptions import PrewarmError
from prewarm._settings import IngestSettings, KafkaSettings

from ._consumer import IngestConsumer
from ._kafka import broker_errors, consumer_config, create_topic
from ._producer import RequestLogProducer
from ._store import DemandStore

__all__ = ["BenchConfig", "bare_poll_rate", "produce_bench_events", "run_ingest_bench"]


@dataclass(frozen=True, slots=True)
class BenchConfig:
    events: int
    partitions: int = 1
    models: int = 50
    compression: str = "none"
    database_url: str | None = None  # None: a fresh SQLite file in a temporary directory


def produce_bench_events(
    kafka: KafkaSettings, topic: str, events: int, models: int, compression: str
) -> float:
    """Produce ``events`` realistic events (a few optional fields, 5% cold starts); returns seconds."""
    now_ms = int(time.time() * 1000)
    span_ms = 30 * 60 * 1000  # spread over the last 30 minutes, in order
    started = time.perf_counter()
    names = [f"bench-{i:04d}".encode() for i in range(models)]
    with RequestLogProducer(
        kafka.kafka_bootstrap,
        topic,
        compression=compression,
        linger_ms=50,
        batch_bytes=512 * 1024,
        kafka=kafka,
    ) as producer:
        for i in range(events):
            model = names[(i * 7919) % models]
            ts = now_ms - span_ms + (span_ms * i) // max(events, 1)
            tail = b',"served_from":"L2","wait_ms":2150.0' if i % 20 == 0 else b',"served_from":"L0"'
            value = b'{"v":1,"ts":%d,"model":"%s","gateway":"gw-1","status":200,"latency_ms":41.5%s}' % (
                ts,
                model,
                tail,
            )
            producer.send_raw(value, model)
    return time.perf_counter() - started


def bare_poll_rate(kafka: KafkaSettings, topic: str, events: int, timeout_s: float = 600.0) -> float:
    """Records per second of a plain poll loop over ``topic`` from its beginning."""
    with broker_errors(f"bare consumer on {topic}"):
        consumer = KafkaConsumer(**consumer_config(kafka))
        try:
            partitions = sorted(consumer.partitions_for_topic(topic) or ())
            tps = [TopicPartition(topic, p) for p in partitions]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            seen = 0
            first: float | None = None
            deadline = time.monotonic() + timeout_s
            while seen < events:
                if time.monotonic() > deadline:
                    raise PrewarmError(f"bare consumer saw {seen} of {events} events in {timeout_s}s")
                polled = consumer.poll(timeout_ms=500)
                if polled and first is None:
                    first = time.perf_counter()
                for records in polled.values():
                    seen += len(records)
            assert first is not None
            return events / (time.perf_counter() - first)
        finally:
            consumer.close(autocommit=False)


def run_ingest_bench(kafka: KafkaSettings, ingest: IngestSettings, config: BenchConfig) -> dict[str, Any]:
    topic = f"prewarm-bench-{uuid.uuid4().hex[:10]}"
    group = f"{topic}-group"
    create_topic(kafka, topic, config.partitions)
    bench_kafka = kafka.model_copy(update={"topic_requests": topic, "topic_dlq": f"{topic}.dlq"})
    produce_s = produce_bench_events(bench_kafka, topic, config.events, config.models, config.compression)
    bare = bare_poll_rate(bench_kafka, topic, config.events)
    with tempfile.TemporaryDirectory(prefix="prewarm-bench-") as tmp:
        url = config.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        store = DemandStore(url)
        try:
            consumer = IngestConsumer(store, bench_kafka, ingest, topic=topic, group=group)
            summary = consumer.run(max_records=config.events, idle_exit_s=60.0)
            totals = store.totals()
        finally:
            store.close()
    if summary.first_record_at is None or summary.last_commit_at is None:
        raise PrewarmError("the consumer committed nothing")
    seconds = summary.last_commit_at - summary.first_record_at
    rate = summary.records / seconds
    counted = sum(totals.values())
    return {
        "events": config.events,
        "seconds": round(seconds, 3),
        "events_per_s": round(rate, 1),
        "bare_consumer_events_per_s": round(bare, 1),
        "ratio": round(rate / bare, 3),
        "details": {
            "topic": topic,
            "partitions": config.partitions,
            "models": config.models,
            "compression": config.compression,
            "store": "sqlite (temporary file)" if config.database_url is None else store.dialect,
            "batches": summary.batches,
            "batch_max_events": ingest.batch_max_events,
            "max_poll_records": ingest.ingest_max_poll_records,
            "counted_in_store": counted,
            "exact": counted == config.events,
            "produce_seconds": round(produce_s, 3),
        },
    }
