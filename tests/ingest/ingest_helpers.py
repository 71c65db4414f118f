"""Helpers of the ingest tests (a plain module: conftest.py holds only fixtures)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kafka import TopicPartition
from wait_helpers import wait_for

from ingest import DeadLetter, DemandStore, RequestLogProducer, decode_dead_letter, encode_event, minute_of
from ingest._kafka import create_topic
from prewarm import IngestSettings, KafkaSettings, parse_request_event
from prewarm.kafka import make_consumer

REPO = Path(__file__).resolve().parents[2]
NOW_MS = int(time.time() * 1000)

# ---------------------------------------------------------------- helpers


def make_topic(kafka: KafkaSettings, partitions: int = 3) -> None:
    create_topic(kafka, kafka.topic_requests, partitions)
    create_topic(kafka, kafka.topic_dlq, 1)


def event(ts_ms: int, model: str, **extra: Any) -> bytes:
    """A request event as gateways encode it (compact JSON: the consumer's fast path)."""
    return encode_event({"v": 1, "ts": ts_ms, "model": model, **extra})[1]


def produce(kafka: KafkaSettings, values: Sequence[tuple[bytes | None, bytes]]) -> None:
    """Send (key, value) pairs in order and wait for every ack."""
    with RequestLogProducer(
        kafka.kafka_bootstrap, kafka.topic_requests, compression="none", kafka=kafka
    ) as p:
        for key, value in values:
            p.send_raw(value, key)


def read_all(kafka: KafkaSettings, topic: str, expected: int, timeout_s: float = 30.0) -> list[Any]:
    """Every record of ``topic`` from the beginning to its end, once at least ``expected`` have arrived.
    Read to the end offsets, not to ``expected`` records: a topic a killed writer re-sent to holds
    duplicates, and stopping at ``expected`` records left distinct ones unread."""
    consumer = make_consumer(kafka, enable_auto_commit=False, consumer_timeout_ms=1000)
    try:
        deadline = time.monotonic() + timeout_s
        partitions: set[int] = set()

        def known() -> bool:
            partitions.update(consumer.partitions_for_topic(topic) or ())
            return bool(partitions)

        wait_for(known, timeout_s, f"the partitions of {topic}", interval=0.2)
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
            if len(records) >= expected:
                ends = consumer.end_offsets(tps)
                if all(consumer.position(tp) >= ends[tp] for tp in tps):
                    break
        return records
    finally:
        consumer.close()


def dead_letters(kafka: KafkaSettings, expected: int) -> list[DeadLetter]:
    return [decode_dead_letter(r) for r in read_all(kafka, kafka.topic_dlq, expected)]


def cli_env(kafka: KafkaSettings, ingest: IngestSettings, store_url: str) -> dict[str, str]:
    """The environment of a ``prewarm`` subprocess that talks to the same topic, group and store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update(
        PREWARM_KAFKA_BOOTSTRAP=kafka.kafka_bootstrap,
        PREWARM_TOPIC_REQUESTS=kafka.topic_requests,
        PREWARM_TOPIC_DLQ=kafka.topic_dlq,
        PREWARM_CONSUMER_GROUP=ingest.consumer_group,
        PREWARM_BATCH_MAX_EVENTS=str(ingest.batch_max_events),
        PREWARM_BATCH_MAX_S=str(ingest.batch_max_s),
        PREWARM_INGEST_MAX_POLL_RECORDS=str(ingest.ingest_max_poll_records),
        PREWARM_LATENESS_S=str(ingest.lateness_s),
        PREWARM_MAX_LATENESS_S=str(ingest.max_lateness_s),
        PREWARM_DATABASE_URL=store_url,
        PREWARM_INGEST_SESSION_TIMEOUT_S=str(ingest.ingest_session_timeout_s),
        PREWARM_LOG_LEVEL="INFO",
    )
    return env


def prewarm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", "from prewarm_cli import main; main()", *args]


def spawn_consumer(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    handle = log.open("ab")
    return subprocess.Popen(
        prewarm_cmd("ingest", "run", *args), env=env, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT
    )


def good_events(
    n: int, models: int = 5, seed: int = 1, start: int = NOW_MS - 3_600_000, span: int = 3_000_000
) -> tuple[list[tuple[bytes | None, bytes]], Counter[tuple[str, int]]]:
    """``n`` valid events in time order from ``start`` (ms) over ``span`` ms, and the truth per minute."""
    rng = random.Random(seed)
    truth: Counter[tuple[str, int]] = Counter()
    out: list[tuple[bytes | None, bytes]] = []
    for i in range(n):
        model = f"model-{rng.randrange(models)}"
        ts = start + i * (span // n)
        extra = {"served_from": "L2", "wait_ms": 100.0} if i % 7 == 0 else {}
        out.append((model.encode(), event(ts, model, **extra)))
        truth[(model, (ts // 60_000) * 60)] += 1
    return out, truth


def stored(store: DemandStore) -> Counter[tuple[str, int]]:
    """What the store holds, in the shape of ``good_events``' truth."""
    return Counter({(m, minute): req for m, minute, req, _, _ in store.minutes()})


# ---------------------------------------------------------------- live streams and consumer processes


class PacedProducer(threading.Thread):
    """Produces ``values`` in ``chunks`` spread over ``seconds``, so consumers see a live stream."""

    def __init__(
        self,
        kafka: KafkaSettings,
        values: Sequence[tuple[bytes | None, bytes]],
        seconds: float,
        chunks: int = 30,
    ) -> None:
        super().__init__(daemon=True)
        self.kafka, self.values, self.seconds, self.chunks = kafka, values, seconds, chunks
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            size = max(len(self.values) // self.chunks, 1)
            with RequestLogProducer(
                self.kafka.kafka_bootstrap, self.kafka.topic_requests, max_block_s=120, kafka=self.kafka
            ) as producer:
                for i in range(0, len(self.values), size):
                    for key, value in self.values[i : i + size]:
                        producer.send_raw(value, key)
                    time.sleep(self.seconds / self.chunks)  # elapsed time on purpose: a paced stream
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.join(timeout=180)
        assert not self.is_alive(), "producer did not finish"
        assert self.error is None, f"producer failed: {self.error!r}"


def truth_from_log(kafka: KafkaSettings, expected: int) -> Counter[tuple[str, int]]:
    truth: Counter[tuple[str, int]] = Counter()
    records = read_all(kafka, kafka.topic_requests, expected)
    for record in records:
        event = parse_request_event(record.value)
        truth[(event.model, minute_of(event.ts))] += 1
    assert sum(truth.values()) >= expected
    return truth


def committed(store: DemandStore, group: str) -> int:
    return store.counters(group).get("records", 0)


def stop_gracefully(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    assert proc.poll() is None, f"consumer died early with {proc.returncode}"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=timeout_s) == 0


def sigkill_after_commits(
    env: dict[str, str],
    log: Path,
    store: DemandStore,
    group: str,
    total: int,
    kills: int,
    rng: random.Random,
) -> None:
    """Start ``prewarm ingest run`` ``kills`` times; SIGKILL each at a random point after it committed."""
    for _ in range(kills):
        before = committed(store, group)
        proc = spawn_consumer(env, log)
        wait_for(
            lambda b=before: committed(store, group) > b or committed(store, group) >= total,
            90,
            "the consumer to commit",
        )
        # Elapsed time on purpose: the kill lands at a random point of the consumer's work after a commit.
        time.sleep(rng.uniform(0.0, 0.6))
        proc.kill()  # SIGKILL: no flush, no goodbye to the group
        proc.wait()


def consume_to_the_end(env: dict[str, str], log: Path, store: DemandStore, group: str, total: int) -> None:
    """One last consumer that runs until ``total`` records are committed, then stops gracefully."""
    proc = spawn_consumer(env, log)
    wait_for(lambda: "partitions assigned" in log.read_text(), 90, "the last consumer to join")
    wait_for(lambda: committed(store, group) >= total, 180, "every record committed")
    stop_gracefully(proc)
