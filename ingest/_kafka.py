"""kafka-python at the boundary: client construction from settings and error translation.

Every kafka-python call of this package goes through ``broker_errors`` so that callers only ever see
``prewarm.BrokerError``, with ``transient`` set when waiting and retrying can help. Producers and topics
come from the spine (``prewarm.kafka``): one rule for acks, idempotence, partitions and replicas.
"""

from __future__ import annotations

from typing import Any

from prewarm import IngestSettings, KafkaSettings
from prewarm.kafka import broker_errors, create_topics, make_consumer, make_producer, new_topic

__all__ = ["consumer_config", "create_topic", "end_offsets", "make_producer"]


def consumer_config(kafka: KafkaSettings, ingest: IngestSettings, **extra: Any) -> dict[str, Any]:
    """Fetch tuning shared by the ingest consumer and the bare baseline of the benchmark."""
    config: dict[str, Any] = {
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_records": ingest.ingest_max_poll_records,
        # Larger fetches than the defaults (fewer round trips); ``make_consumer`` lets response frames
        # grow with them.
        "fetch_max_bytes": 16 * 2**20,
        "max_partition_fetch_bytes": 4 * 2**20,
        "fetch_min_bytes": 1,
        "fetch_max_wait_ms": 200,
        # kafka-python checks each record batch's CRC32C through the ``crc32c`` C extension (a dependency
        # of this project): well under 1% of the consumer's time, where its pure-Python fallback
        # cost more than the rest of the consumer (docs/benchmarks.md).
        "check_crcs": kafka.kafka_check_crcs,
        "api_version_auto_timeout_ms": 10_000,
    }
    config.update(extra)
    return config


def create_topic(kafka: KafkaSettings, topic: str, partitions: int = 1) -> bool:
    """Create ``topic`` if missing, replicated as the settings say; returns whether it was created."""
    return bool(create_topics(kafka, [new_topic(kafka, topic, partitions)]))


def end_offsets(kafka: KafkaSettings, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """The log-end offset of every partition of ``topic``."""
    from kafka import TopicPartition

    with broker_errors(f"end offsets of {topic}"):
        consumer = make_consumer(
            kafka,
            enable_auto_commit=False,
            request_timeout_ms=int(timeout_s * 1000) + 1000,
            api_version_auto_timeout_ms=int(timeout_s * 1000),
        )
        try:
            partitions = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            ends = consumer.end_offsets(tps) if tps else {}
            return {tp.partition: int(off) for tp, off in ends.items()}
        finally:
            consumer.close()
