"""Topics as prewarm creates them (partitions, replicas, min.insync.replicas) and its producers' acks."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from prewarm import ConfigError, KafkaSettings, load_settings
from prewarm.kafka import (
    DURABLE_PRODUCER,
    create_topics,
    ensure_control_topics,
    ensure_log_topics,
    make_consumer,
    make_producer,
    new_topic,
)


def test_topics_for_one_broker_have_one_replica_and_leave_min_insync_to_the_broker() -> None:
    topic = new_topic(KafkaSettings(), "t", 4, {"cleanup.policy": "compact"})
    assert (topic.num_partitions, topic.replication_factor) == (4, 1)
    assert topic.topic_configs == {"cleanup.policy": "compact"}


def test_replicated_topics_require_all_but_one_replica_in_sync_by_default() -> None:
    topic = new_topic(KafkaSettings(kafka_replication_factor=3), "t", 12)
    assert topic.replication_factor == 3
    assert topic.topic_configs == {"min.insync.replicas": "2"}


def test_an_explicit_min_insync_replicas_is_written_on_every_topic() -> None:
    kafka = KafkaSettings(kafka_replication_factor=5, kafka_min_insync_replicas=3)
    assert new_topic(kafka, "t", 1).topic_configs == {"min.insync.replicas": "3"}


@pytest.mark.usefixtures("clean_env")
def test_min_insync_above_the_replica_count_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="kafka_replication_factor") as info:
        load_settings(overrides={"kafka_replication_factor": "2", "kafka_min_insync_replicas": "3"})
    assert info.value.setting == "PREWARM_KAFKA_MIN_INSYNC_REPLICAS"


@pytest.mark.parametrize("weaker", [{"acks": 1}, {"acks": 0}, {"enable_idempotence": False}])
def test_a_producer_with_weaker_delivery_guarantees_is_refused(weaker: dict[str, Any]) -> None:
    # Refused before any connection is tried: no broker is needed to see it.
    with pytest.raises(ValueError, match="always send with"):
        make_producer(KafkaSettings(kafka_bootstrap="127.0.0.1:1"), **weaker)


# ------------------------------------------------------------------ on the local stack's broker


def _describe(bootstrap: str, names: list[str]) -> dict[str, tuple[int, int, dict[str, str]]]:
    """(partitions, replicas of partition 0, topic configs) of each topic."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = {t["topic"]: t for t in admin.describe_topics(names)}
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
        values: dict[str, dict[str, str]] = {}
        for response in configs:
            for _code, _msg, _type, name, entries in response.resources:
                values[name] = {entry[0]: entry[1] for entry in entries}
    finally:
        admin.close()
    out = {}
    for name in names:
        parts = described[name]["partitions"]
        replicas = next(p["replicas"] for p in parts if p["partition"] == 0)
        out[name] = (len(parts), len(replicas), values[name])
    return out


def test_prewarm_creates_its_four_topics_with_the_configured_partitions(
    kafka_bootstrap: str, unique: str
) -> None:
    kafka = KafkaSettings(
        kafka_bootstrap=kafka_bootstrap,
        topic_requests=f"requests-{unique}",
        topic_dlq=f"dlq-{unique}",
        topic_orders=f"orders-{unique}",
        topic_executor_state=f"state-{unique}",
        topic_requests_partitions=6,
        topic_dlq_partitions=2,
        topic_control_partitions=3,
    )
    ensure_log_topics(kafka)
    ensure_control_topics(kafka)
    ensure_control_topics(kafka)  # the second process to start finds them and changes nothing
    topics = _describe(
        kafka_bootstrap,
        [kafka.topic_requests, kafka.topic_dlq, kafka.topic_orders, kafka.topic_executor_state],
    )
    assert {name: parts for name, (parts, _, _) in topics.items()} == {
        kafka.topic_requests: 6,
        kafka.topic_dlq: 2,
        kafka.topic_orders: 3,
        kafka.topic_executor_state: 3,
    }
    assert all(replicas == 1 for _, replicas, _ in topics.values())
    assert topics[kafka.topic_executor_state][2]["cleanup.policy"] == "compact"
    assert topics[kafka.topic_orders][2]["cleanup.policy"] == "delete"


def test_every_prewarm_producer_waits_for_all_replicas_and_is_idempotent(
    kafka_bootstrap: str, unique: str
) -> None:
    from ingest import RequestLogProducer
    from scheduler._kafka import OrderPublisher

    kafka = KafkaSettings(kafka_bootstrap=kafka_bootstrap, topic_orders=f"orders-{unique}")
    gateway = RequestLogProducer(kafka_bootstrap, f"requests-{unique}", kafka=kafka)
    publisher = OrderPublisher(kafka)
    try:
        for producer in (gateway._producer, publisher._producer):
            # kafka-python keeps acks=all as -1.
            assert producer.config["acks"] == -1
            assert producer.config["enable_idempotence"] is True
            assert producer.config["max_in_flight_requests_per_connection"] == 1
    finally:
        gateway.close()
        publisher.close()
    assert DURABLE_PRODUCER == {"acks": "all", "enable_idempotence": True}


def test_a_consumer_reads_a_partition_backlog_larger_than_kafka_pythons_default_frame_limit_in_one_connection(
    kafka_bootstrap: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    # 3 MB in one partition: a default fetch asks for 1 MiB of it, a response kafka-python 2.3 refuses
    # above 1,000,000 bytes unless the consumer allows it (``make_consumer`` does). Refused, the
    # connection is dropped and the fetch asked again: the ingest tests' read-back of 6,061 dead
    # letters got 5,721 of them in 30 s.
    kafka = KafkaSettings(kafka_bootstrap=kafka_bootstrap)
    topic = f"backlog-{unique}"
    create_topics(kafka, [new_topic(kafka, topic, 1)])
    producer = make_producer(kafka, linger_ms=50)
    try:
        for k in range(3000):
            producer.send(topic, value=k.to_bytes(4, "big") + bytes(1000))
        producer.flush(timeout=60)
    finally:
        producer.close()

    consumer = make_consumer(kafka, enable_auto_commit=False, fetch_max_wait_ms=100)
    caplog.set_level(logging.WARNING, logger="kafka")
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while len(seen) < 3000 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen += [int.from_bytes(r.value[:4], "big") for r in records]
    finally:
        consumer.close()
    assert seen == list(range(3000))
    assert not [r.getMessage() for r in caplog.records if "Invalid frame length" in r.getMessage()]
