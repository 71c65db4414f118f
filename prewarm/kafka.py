"""kafka-python at the boundary, shared by ingest, the scheduler and the executor daemon.

Every kafka-python call goes through ``broker_errors`` so that callers only ever see
``prewarm.BrokerError``, with ``transient`` set when waiting and retrying can help. Imported explicitly
(``from prewarm.kafka import ...``), never from ``prewarm/__init__``: ``import prewarm`` stays free of
kafka-python.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from prewarm._exceptions import BrokerError
from prewarm._settings import KafkaSettings

__all__ = [
    "DURABLE_PRODUCER",
    "bootstrap_servers",
    "broker_errors",
    "close_producer",
    "create_topics",
    "ensure_control_topics",
    "ensure_log_topics",
    "make_consumer",
    "make_producer",
    "new_topic",
]

# Not marked retriable by kafka-python, but a broker that is restarting or briefly unreachable says so.
_TRANSIENT = ("NoBrokersAvailable", "KafkaTimeoutError", "KafkaConnectionError")

DURABLE_PRODUCER: Mapping[str, Any] = {
    # Acknowledged only once every in-sync replica has the record: with min.insync.replicas on the
    # topic, an acknowledged record survives the loss of its leader.
    "acks": "all",
    # A retry after a lost acknowledgement (a leader that died after writing) must not write twice; the
    # broker drops the duplicate by producer id and sequence. kafka-python then keeps one request in
    # flight per connection, so retries cannot reorder a key's records either.
    "enable_idempotence": True,
}
"""What every prewarm producer sends with; ``make_producer`` refuses to weaken it."""


@contextmanager
def broker_errors(what: str) -> Iterator[None]:
    """Translate kafka-python (and socket) errors raised inside the block into ``BrokerError``."""
    try:
        yield
    except BrokerError:
        raise
    except KafkaError as exc:
        transient = bool(getattr(exc, "retriable", False)) or type(exc).__name__ in _TRANSIENT
        raise BrokerError(f"{what}: {type(exc).__name__}: {exc}", transient=transient) from exc
    except (OSError, ValueError) as exc:  # DNS, sockets, bad bootstrap strings
        raise BrokerError(f"{what}: {exc}", transient=isinstance(exc, OSError)) from exc


def bootstrap_servers(kafka: KafkaSettings) -> list[str]:
    return [s.strip() for s in kafka.kafka_bootstrap.split(",") if s.strip()]


def make_producer(kafka: KafkaSettings, *, client_id: str | None = None, **config: Any) -> KafkaProducer:
    """A producer with ``DURABLE_PRODUCER``'s guarantees and the caller's tuning (``linger_ms`` …)."""
    weakened = {key for key in DURABLE_PRODUCER if key in config and config[key] != DURABLE_PRODUCER[key]}
    if weakened:
        raise ValueError(f"prewarm producers always send with {dict(DURABLE_PRODUCER)}; got {config}")
    with broker_errors("connect producer"):
        return KafkaProducer(
            bootstrap_servers=bootstrap_servers(kafka),
            client_id=client_id or kafka.kafka_client_id,
            **{**config, **DURABLE_PRODUCER},
        )


def close_producer(producer: KafkaProducer, timeout_s: float, what: str) -> None:
    """Close ``producer``, waiting up to ``timeout_s`` for its records to be acknowledged, then dropping
    the rest; raises ``BrokerError`` (once closed) where records were dropped.

    kafka-python's own ``close`` flushes first and, where that flush times out (a broker that is gone),
    raises and leaves the producer open: its network thread goes on reconnecting to the gone broker for
    the life of the process, and the producer's ``__del__`` raises the same timeout later. So the
    network thread is stopped here, its buffered records failed, and the producer closed for good.
    """
    try:
        producer.close(timeout=timeout_s)
    except KafkaError as exc:
        # kafka-python has no public way to drop buffered records; its sender's force_close does.
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()
            sender.join(5)
        with suppress(KafkaError):  # the records failed above: this flush returns at once
            producer.close(timeout=0)
        raise BrokerError(
            f"{what}: records not acknowledged within {timeout_s:g}s were dropped ({type(exc).__name__})",
            transient=True,
        ) from exc


FETCH_DEFAULTS: Mapping[str, int] = {"fetch_max_bytes": 50 * 2**20, "max_partition_fetch_bytes": 2**20}
"""kafka-python's own fetch sizes, for consumers that do not tune them."""

FRAME_HEADROOM_BYTES = 2**20
"""Room above a fetch's data for the response's own framing (headers, per-partition fields)."""


def make_consumer(
    kafka: KafkaSettings, *topics: str, client_id: str | None = None, **config: Any
) -> KafkaConsumer:
    """A consumer of ``topics`` (or of partitions the caller assigns) with the caller's settings, whose
    response frames may be as large as the fetches it asks for.

    kafka-python 2.3 refuses any response frame above ``receive_message_max_bytes``, by default
    1,000,000 bytes, while its fetches ask for up to 1 MiB per partition: a consumer that meets a
    partition with a megabyte of backlog gets ``InvalidReceiveError``, drops the connection and asks
    again, a reconnect and a metadata refresh per refusal (dpkp/kafka-python#3074, fixed after 2.3). The limit
    here is the larger of the fetch's sizes (``fetch_max_bytes``, ``max_partition_fetch_bytes``) plus
    ``FRAME_HEADROOM_BYTES``, which also covers a record batch larger than both (returned whole, up to
    the broker's ``message.max.bytes``, 1 MB by default); a caller may still set it."""
    frame = max(config.get(key, size) for key, size in FETCH_DEFAULTS.items()) + FRAME_HEADROOM_BYTES
    settings = {"receive_message_max_bytes": frame, **config}
    return KafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap_servers(kafka),
        client_id=client_id or kafka.kafka_client_id,
        **settings,
    )


def new_topic(
    kafka: KafkaSettings, name: str, partitions: int, configs: Mapping[str, str] | None = None
) -> NewTopic:
    """A topic as prewarm creates it: the settings' replication, and min.insync.replicas once replicated."""
    topic_configs = dict(configs or {})
    if kafka.kafka_replication_factor > 1:
        topic_configs.setdefault("min.insync.replicas", str(kafka.min_insync_replicas))
    return NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=kafka.kafka_replication_factor,
        topic_configs=topic_configs,
    )


def create_topics(
    kafka: KafkaSettings, topics: Sequence[NewTopic], *, client_id: str | None = None
) -> list[str]:
    """Create each topic that does not exist yet; the names of those created."""
    created: list[str] = []
    with broker_errors(f"create topics {', '.join(t.name for t in topics)}"):
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap_servers(kafka), client_id=client_id or kafka.kafka_client_id
        )
        try:
            for topic in topics:
                try:
                    admin.create_topics([topic])
                    created.append(topic.name)
                except TopicAlreadyExistsError:
                    pass
        finally:
            admin.close()
    return created


def ensure_control_topics(kafka: KafkaSettings, *, client_id: str | None = None) -> None:
    """The orders topic and the compacted executor-state topic, whichever process starts first.

    Compacted: the latest report per node survives, so a restarted scheduler knows every node at once
    instead of waiting for each to report again.
    """
    partitions = kafka.topic_control_partitions
    create_topics(
        kafka,
        [
            new_topic(kafka, kafka.topic_orders, partitions),
            new_topic(
                kafka,
                kafka.topic_executor_state,
                partitions,
                {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"},
            ),
        ],
        client_id=client_id,
    )


def ensure_log_topics(
    kafka: KafkaSettings, *, topic: str | None = None, client_id: str | None = None
) -> None:
    """The request log (``topic``, default the setting) and the dead-letter topic.

    Created by prewarm rather than left to the broker's auto-creation, which production clusters turn
    off and which would use the broker's partition count and a single replica.
    """
    create_topics(
        kafka,
        [
            new_topic(kafka, topic or kafka.topic_requests, kafka.topic_requests_partitions),
            new_topic(kafka, kafka.topic_dlq, kafka.topic_dlq_partitions),
        ],
        client_id=client_id,
    )
