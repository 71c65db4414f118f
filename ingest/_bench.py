"""``prewarm bench ingest``: the consumer's end-to-end rate against a bare kafka-python poll loop.

One run: produce N events to a fresh topic, read them all with a bare ``KafkaConsumer`` poll loop
(same fetch settings, no parsing, no store), then ingest them with ``IngestConsumer`` (a fresh group)
into a fresh store; both passes are repeated ``rounds`` times, interleaved. Both rates are measured
from the first record received to the last one done (for the consumer: committed to the store), so
the group join, which only the consumer group pays, is in neither.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import TopicPartition

from prewarm import IngestSettings, KafkaSettings, PrewarmError
from prewarm.kafka import broker_errors, make_consumer

from ._consumer import IngestConsumer
from ._kafka import consumer_config, create_topic
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
    rounds: int = 3


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


def bare_poll_rate(
    kafka: KafkaSettings, ingest: IngestSettings, topic: str, events: int, timeout_s: float = 600.0
) -> tuple[float, float]:
    """(records per wall second, records per CPU second) of a plain poll loop over ``topic``, with the
    consumer's own fetch settings."""
    with broker_errors(f"bare consumer on {topic}"):
        consumer = make_consumer(kafka, **consumer_config(kafka, ingest))
        try:
            partitions = sorted(consumer.partitions_for_topic(topic) or ())
            tps = [TopicPartition(topic, p) for p in partitions]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            seen = 0
            first: float | None = None
            first_cpu = 0.0
            deadline = time.monotonic() + timeout_s
            while seen < events:
                if time.monotonic() > deadline:
                    raise PrewarmError(f"bare consumer saw {seen} of {events} events in {timeout_s}s")
                polled = consumer.poll(timeout_ms=500)
                if polled and first is None:
                    first, first_cpu = time.perf_counter(), time.process_time()
                for records in polled.values():
                    seen += len(records)
            assert first is not None
            return events / (time.perf_counter() - first), events / (time.process_time() - first_cpu)
        finally:
            consumer.close(autocommit=False)


def _ingest_once(
    kafka: KafkaSettings, ingest: IngestSettings, topic: str, group: str, config: BenchConfig, tmp: Path
) -> dict[str, Any]:
    """One ingest pass with a fresh group and store."""
    url = config.database_url or f"sqlite:///{tmp / f'{group}.db'}"
    store = DemandStore(url)
    try:
        consumer = IngestConsumer(store, kafka, ingest, topic=topic, group=group)
        summary = consumer.run(max_records=config.events, idle_exit_s=60.0)
        counted = store.counters(group).get("events", 0)  # this pass only, even in a shared store
    finally:
        store.close()
    s = summary
    if (
        s.first_record_at is None
        or s.last_commit_at is None
        or s.first_record_cpu is None
        or s.last_commit_cpu is None
    ):
        raise PrewarmError("the consumer committed nothing")
    seconds = s.last_commit_at - s.first_record_at
    return {
        "seconds": round(seconds, 3),
        "events_per_s": round(s.records / seconds, 1),
        "events_per_cpu_s": round(s.records / (s.last_commit_cpu - s.first_record_cpu), 1),
        "batches": s.batches,
        "counted": counted,
    }


def run_ingest_bench(kafka: KafkaSettings, ingest: IngestSettings, config: BenchConfig) -> dict[str, Any]:
    """Produce once, then ``rounds`` × (bare loop, ingest pass) interleaved; report the best of each.

    On a shared machine other processes steal whole seconds from one pass or another; interleaving and
    best-of-N compares the two loops under the same conditions. Every pass is in ``details``, with
    rates per CPU second of this process as well, which other processes on the machine cannot skew.
    """
    topic = f"prewarm-bench-{uuid.uuid4().hex[:10]}"
    create_topic(kafka, topic, config.partitions)
    bench_kafka = kafka.model_copy(update={"topic_requests": topic, "topic_dlq": f"{topic}.dlq"})
    produce_s = produce_bench_events(bench_kafka, topic, config.events, config.models, config.compression)
    bare: list[tuple[float, float]] = []
    passes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="prewarm-bench-") as tmp:
        for round_ in range(config.rounds):
            bare.append(bare_poll_rate(bench_kafka, ingest, topic, config.events))
            group = f"{topic}-group-{round_}"
            passes.append(_ingest_once(bench_kafka, ingest, topic, group, config, Path(tmp)))
    best = max(passes, key=lambda p: float(p["events_per_s"]))
    bare_wall = max(b[0] for b in bare)
    bare_cpu = max(b[1] for b in bare)
    best_cpu = max(float(p["events_per_cpu_s"]) for p in passes)
    return {
        "events": config.events,
        "seconds": best["seconds"],
        "events_per_s": best["events_per_s"],
        "bare_consumer_events_per_s": round(bare_wall, 1),
        "ratio": round(float(best["events_per_s"]) / bare_wall, 3),
        "details": {
            "topic": topic,
            "partitions": config.partitions,
            "models": config.models,
            "compression": config.compression,
            "store": "sqlite (temporary file)"
            if config.database_url is None
            else config.database_url.split(":")[0],
            "rounds": config.rounds,
            "ingest_passes": passes,
            "bare_passes": [{"events_per_s": round(w, 1), "events_per_cpu_s": round(c, 1)} for w, c in bare],
            "events_per_cpu_s": best_cpu,
            "bare_consumer_events_per_cpu_s": round(bare_cpu, 1),
            "cpu_ratio": round(best_cpu / bare_cpu, 3),
            "batch_max_events": ingest.batch_max_events,
            "max_poll_records": ingest.ingest_max_poll_records,
            "exact": all(p["counted"] == config.events for p in passes),
            "produce_seconds": round(produce_s, 3),
        },
    }
