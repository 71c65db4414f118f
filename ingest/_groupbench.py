"""``prewarm bench ingest --consumers 1,2``: ingest throughput by the number of consumer processes.

For each consumer count C (interleaved over ``rounds``), C processes join one fresh consumer group on
the bench topic (produced once, ``partitions`` partitions) and count it into one fresh store; the
parent waits until the store has counted every record, then stops them. Reported per count:

- ``events_per_s``: all events over the span from the first record any process received to the
  last commit of any process (the group's throughput, rebalances included: processes start together
  behind a barrier, so the second member's join costs at most one heartbeat interval of the first
  member working alone, ~2 s at the 6 s session the bench uses);
- ``cpu_seconds``: the CPU the consumer processes spent over that span, summed; with the broker on
  the same machine, events per CPU second is the number other processes cannot skew;
- ``exact``: the store's event counter and per-model totals equal what was produced.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from prewarm import IngestSettings, KafkaSettings, PrewarmError

from ._kafka import create_topic

__all__ = ["run_group_bench"]

_SESSION_S = 6.0  # the shortest session the settings allow: rebalances are noticed within 2 s


def _consumer_process(
    kafka: KafkaSettings,
    ingest: IngestSettings,
    url: str,
    topic: str,
    group: str,
    barrier: Any,
    stop: Any,
    results: Any,
) -> None:
    """One group member: wait for the others, consume until told to stop, report its summary."""
    from ._consumer import IngestConsumer
    from ._store import DemandStore

    store = DemandStore(url)
    try:
        consumer = IngestConsumer(store, kafka, ingest, topic=topic, group=group)
        barrier.wait(timeout=120)
        local_stop = threading.Event()

        def relay() -> None:
            stop.wait()
            local_stop.set()

        threading.Thread(target=relay, daemon=True).start()
        summary = consumer.run(local_stop)
    finally:
        store.close()
    results.put(
        {
            "records": summary.records,
            "batches": summary.batches,
            "conflicts": summary.conflicts,
            "first_record_at": summary.first_record_at,
            "last_commit_at": summary.last_commit_at,
            "cpu_seconds": (summary.last_commit_cpu or 0.0) - (summary.first_record_cpu or 0.0),
        }
    )


def _one_run(
    kafka: KafkaSettings,
    ingest: IngestSettings,
    topic: str,
    url: str,
    consumers: int,
    events: int,
    timeout_s: float,
) -> dict[str, Any]:
    from ._store import DemandStore

    ctx = mp.get_context("spawn")  # no forked copies of Kafka or database connections
    group = f"{topic}-c{consumers}-{uuid.uuid4().hex[:6]}"
    barrier, stop, results = ctx.Barrier(consumers), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_consumer_process,
            args=(kafka, ingest, url, topic, group, barrier, stop, results),
            daemon=True,
        )
        for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    reports: list[dict[str, Any]] = []
    with DemandStore(url) as store:
        try:
            deadline = time.monotonic() + timeout_s
            while store.counters(group).get("records", 0) < events:
                if time.monotonic() > deadline or not any(p.is_alive() for p in procs):
                    raise PrewarmError(
                        f"{consumers} consumers counted {store.counters(group).get('records', 0)} "
                        f"of {events} records in {timeout_s:.0f}s"
                    )
                time.sleep(0.2)
            stop.set()
            reports = [results.get(timeout=60) for _ in procs]
        finally:
            stop.set()
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()
        counted = store.counters(group).get("events", 0)
    firsts = [r["first_record_at"] for r in reports if r["first_record_at"] is not None]
    lasts = [r["last_commit_at"] for r in reports if r["last_commit_at"] is not None]
    span = max(lasts) - min(firsts)
    cpu = sum(float(r["cpu_seconds"]) for r in reports)
    return {
        "consumers": consumers,
        "seconds": round(span, 3),
        "events_per_s": round(events / span, 1),
        "cpu_seconds": round(cpu, 3),
        "events_per_cpu_s": round(events / cpu, 1) if cpu > 0 else None,
        "exact": counted == events,
        "per_consumer_records": sorted(int(r["records"]) for r in reports),
        "conflicts": sum(int(r["conflicts"]) for r in reports),
    }


def run_group_bench(
    kafka: KafkaSettings,
    ingest: IngestSettings,
    *,
    events: int,
    partitions: int,
    consumers: tuple[int, ...],
    models: int = 50,
    compression: str = "lz4",
    rounds: int = 1,
    database_url: str | None = None,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Produce ``events`` once to a fresh ``partitions``-partition topic, then ingest it with each
    consumer count of ``consumers`` (``rounds`` times, interleaved; the best run of each is reported)."""
    from ._bench import produce_bench_events

    if any(c < 1 for c in consumers):
        raise PrewarmError("consumer counts must be at least 1")
    topic = f"prewarm-bench-{uuid.uuid4().hex[:10]}"
    create_topic(kafka, topic, partitions)
    bench_kafka = kafka.model_copy(update={"topic_requests": topic, "topic_dlq": f"{topic}.dlq"})
    bench_ingest = ingest.model_copy(update={"ingest_session_timeout_s": _SESSION_S, "rollup_interval_s": 0})
    produce_s = produce_bench_events(bench_kafka, topic, events, models, compression)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="prewarm-bench-") as tmp:
        for round_ in range(rounds):
            for count in consumers:
                url = database_url or f"sqlite:///{Path(tmp) / f'c{count}-r{round_}.db'}"
                runs.append(_one_run(bench_kafka, bench_ingest, topic, url, count, events, timeout_s))
    best = {
        count: max((r for r in runs if r["consumers"] == count), key=lambda r: float(r["events_per_s"]))
        for count in consumers
    }
    return {
        "events": events,
        "partitions": partitions,
        "compression": compression,
        "store": "sqlite (temporary file)" if database_url is None else database_url.split(":")[0],
        "runs": [best[c] for c in consumers],
        "all_runs": runs,
        "exact": all(r["exact"] for r in runs),
        "produce_seconds": round(produce_s, 3),
    }
