"""Faults against real processes: SIGKILL at random points, a rebalance, a broker stopped mid-stream.

The consumer runs as ``prewarm ingest run`` subprocesses, exactly as in production; the truth is what
the request-log topic holds at the end (read back from the broker), so a retried produce can never make
a correct consumer look wrong.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from ingest_helpers import (
    cli_env,
    good_events,
    make_topic,
    read_all,
    spawn_consumer,
    stored,
)
from private_broker import PrivateBroker, kafka_lib_dir
from wait_helpers import wait_for

from ingest import DemandStore, RequestLogProducer, minute_of
from prewarm import BrokerError, IngestSettings, KafkaSettings, parse_request_event

pytestmark = [pytest.mark.kafka, pytest.mark.slow]  # kafka: some tests run a private broker


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


def stop_gracefully(proc: object, timeout_s: float = 60.0) -> None:
    import subprocess

    assert isinstance(proc, subprocess.Popen)
    assert proc.poll() is None, f"consumer died early with {proc.returncode}"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=timeout_s) == 0


def settings_for(unique: str, name: str) -> IngestSettings:
    return IngestSettings(
        consumer_group=f"{name}-{unique}", batch_max_events=40, batch_max_s=0.2, ingest_session_timeout_s=6
    )


def test_consumer_killed_with_sigkill_at_random_points_restarts_to_exact_counts(
    store_url: str, store: DemandStore, kafka_settings: KafkaSettings, unique: str, tmp_path: Path
) -> None:
    make_topic(kafka_settings, partitions=3)
    ingest = settings_for(unique, "kill")
    group = ingest.consumer_group
    events, _ = good_events(3000, seed=11)
    env = cli_env(kafka_settings, ingest, store_url)
    log = tmp_path / "consumer.log"
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    producer = PacedProducer(kafka_settings, events, seconds=25)
    for _ in range(3):
        before = committed(store, group)
        proc = spawn_consumer(env, log)
        wait_for(
            lambda b=before: committed(store, group) > b or committed(store, group) >= len(events),
            90,
            "the consumer to commit",
        )
        # Elapsed time on purpose: the kill lands at a random point of the consumer's work after a commit.
        time.sleep(rng.uniform(0.0, 0.6))
        proc.kill()  # SIGKILL: no flush, no goodbye to the group
        proc.wait()
    producer.finish()
    final_log = tmp_path / "final.log"
    proc = spawn_consumer(env, final_log)
    wait_for(lambda: "partitions assigned" in final_log.read_text(), 90, "the last consumer to join")
    wait_for(lambda: committed(store, group) >= len(events), 120, "every event committed")
    stop_gracefully(proc)

    assert committed(store, group) == len(events)
    assert stored(store) == truth_from_log(kafka_settings, len(events))
    assert store.counters(group)["events"] == len(events)


def test_two_consumers_in_one_group_with_a_rebalance_count_exactly(
    store_url: str, store: DemandStore, kafka_settings: KafkaSettings, unique: str, tmp_path: Path
) -> None:
    make_topic(kafka_settings, partitions=4)
    ingest = settings_for(unique, "rebalance")
    group = ingest.consumer_group
    events, _ = good_events(3000, seed=12)
    env = cli_env(kafka_settings, ingest, store_url)
    producer = PacedProducer(kafka_settings, events, seconds=25)
    first = spawn_consumer(env, tmp_path / "first.log")
    wait_for(lambda: committed(store, group) > 0, 90, "the first consumer to commit")
    second = spawn_consumer(env, tmp_path / "second.log")

    def second_owns_partitions() -> bool:
        return (
            re.search(r"partitions assigned  partitions=\[\d", (tmp_path / "second.log").read_text())
            is not None
        )

    wait_for(second_owns_partitions, 90, "the rebalance to give the second consumer partitions")
    mark = committed(store, group)
    wait_for(
        lambda: committed(store, group) > mark or committed(store, group) >= len(events),
        60,
        "progress after the rebalance",
    )
    stop_gracefully(first)  # a second rebalance: everything to the second consumer
    producer.finish()
    wait_for(lambda: committed(store, group) >= len(events), 120, "every event committed")
    stop_gracefully(second)

    assert committed(store, group) == len(events)
    assert stored(store) == truth_from_log(kafka_settings, len(events))


@pytest.fixture
def private_broker(tmp_path: Path) -> PrivateBroker:
    lib = kafka_lib_dir()
    if lib is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("no Kafka jars in the prewarm cache: run `make stack-up` once")
        pytest.skip("no Kafka jars in the prewarm cache: run `make stack-up` once")
    return PrivateBroker(tmp_path / "kafka", lib)


def test_broker_stopped_and_restarted_mid_stream_loses_nothing(
    store_url: str, store: DemandStore, private_broker: PrivateBroker, unique: str, tmp_path: Path
) -> None:
    broker = private_broker
    broker.start()
    try:
        kafka = KafkaSettings(
            kafka_bootstrap=broker.bootstrap,
            topic_requests=f"outage-{unique}",
            topic_dlq=f"outage-{unique}.dlq",
        )
        make_topic(kafka, partitions=2)
        ingest = settings_for(unique, "outage")
        group = ingest.consumer_group
        events, _ = good_events(1200, seed=13)
        proc = spawn_consumer(cli_env(kafka, ingest, store_url), tmp_path / "consumer.log")
        producer = PacedProducer(kafka, events, seconds=10)
        wait_for(lambda: committed(store, group) > 0, 90, "the consumer to commit")
        broker.stop()  # mid-stream: the producer is still sending, the consumer is polling
        # Elapsed time on purpose: the outage lasts while the consumer keeps polling a dead broker.
        time.sleep(2)
        assert proc.poll() is None, "the consumer must survive the outage"
        broker.start()
        producer.finish()
        wait_for(lambda: committed(store, group) >= len(events), 180, "every event committed")
        stop_gracefully(proc)
        assert committed(store, group) == len(events)
        assert stored(store) == truth_from_log(kafka, len(events))
    finally:
        broker.stop()


def test_producer_gives_a_clear_error_when_the_broker_is_down_too_long(
    private_broker: PrivateBroker, unique: str
) -> None:
    broker = private_broker
    broker.start()
    kafka = KafkaSettings(kafka_bootstrap=broker.bootstrap, topic_requests=f"down-{unique}")
    make_topic(kafka, partitions=1)
    producer = RequestLogProducer(
        broker.bootstrap, kafka.topic_requests, buffer_bytes=20_000, max_block_s=2.0, kafka=kafka
    )
    producer.send({"ts": 1, "model": "m"})
    producer.flush()
    broker.stop()
    started = time.monotonic()

    def send_until_refused() -> None:
        for i in range(100_000):
            producer.send({"v": 1, "ts": i, "model": "m", "tenant": "x" * 100})

    try:
        with pytest.raises(BrokerError, match=r"down or too slow|failed"):
            send_until_refused()
        assert time.monotonic() - started < 30
    finally:
        with contextlib.suppress(BrokerError):
            producer.close(timeout_s=0)
