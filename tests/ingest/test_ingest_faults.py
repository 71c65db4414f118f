"""Faults against real processes: SIGKILL at random points, a rebalance, a broker stopped mid-stream.

The consumer runs as ``prewarm ingest run`` subprocesses, exactly as in production; the truth is what
the request-log topic holds at the end (read back from the broker), so a retried produce can never make
a correct consumer look wrong.
"""

from __future__ import annotations

import gc
import os
import random
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from ingest_helpers import (
    PacedProducer,
    cli_env,
    committed,
    consume_to_the_end,
    good_events,
    make_topic,
    sigkill_after_commits,
    spawn_consumer,
    stop_gracefully,
    stored,
    truth_from_log,
)
from private_broker import PrivateBroker, kafka_lib_dir
from wait_helpers import wait_for

from ingest import DemandStore, RequestLogProducer
from prewarm import BrokerError, IngestSettings, KafkaSettings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]  # kafka: some tests run a private broker


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
    sigkill_after_commits(env, log, store, group, len(events), kills=3, rng=rng)
    producer.finish()
    consume_to_the_end(env, tmp_path / "final.log", store, group, len(events))

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


def test_producer_gives_a_clear_error_when_the_broker_is_down_too_long_and_then_closes_for_good(
    private_broker: PrivateBroker, unique: str
) -> None:
    broker = private_broker
    broker.start()
    client_id = f"down-{unique}"
    kafka = KafkaSettings(
        kafka_bootstrap=broker.bootstrap, topic_requests=f"down-{unique}", kafka_client_id=client_id
    )
    make_topic(kafka, partitions=1)
    producer = RequestLogProducer(
        broker.bootstrap, kafka.topic_requests, buffer_bytes=20_000, max_block_s=2.0, kafka=kafka
    )
    producer.send({"ts": 1, "model": "m"})
    producer.flush()
    broker.stop()
    started = time.monotonic()

    def send_until_refused(producer: RequestLogProducer) -> None:
        for i in range(100_000):
            producer.send({"v": 1, "ts": i, "model": "m", "tenant": "x" * 100})

    try:
        with pytest.raises(BrokerError, match=r"down or too slow|failed"):
            send_until_refused(producer)
        assert time.monotonic() - started < 30
    finally:
        with pytest.raises(BrokerError):  # events are still buffered: closing says they were dropped
            producer.close(timeout_s=0)

    # Closed for good: no network thread is left reconnecting to the gone broker, and collecting the
    # producer raises nothing (kafka-python's own close leaves both behind when its flush times out).
    assert not [t.name for t in threading.enumerate() if t.name.startswith(f"{client_id}-")]
    unraisable: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        del producer
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert unraisable == []
