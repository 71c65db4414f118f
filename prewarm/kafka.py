"""kafka-python at the boundary, shared by ingest, the scheduler and the executor daemon.

Every kafka-python call goes through ``broker_errors`` so that callers only ever see
``prewarm.BrokerError``, with ``transient`` set when waiting and retrying can help. Imported explicitly
(``from prewarm.kafka import ...``), never from ``prewarm/__init__``: ``import prewarm`` stays free of
kafka-python.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from prewarm._exceptions import BrokerError
from prewarm._settings import KafkaSettings

__all__ = ["bootstrap_servers", "broker_errors", "create_topics", "ensure_control_topics"]

# Not marked retriable by kafka-python, but a broker that is restarting or briefly unreachable says so.
_TRANSIENT = ("NoBrokersAvailable", "KafkaTimeoutError", "KafkaConnectionError")


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


def ensure_control_topics(kafka: KafkaSettings, *, partitions: int = 1, client_id: str | None = None) -> None:
    """The orders topic and the compacted executor-state topic, whichever process starts first.

    Compacted: the latest report per node survives, so a restarted scheduler knows every node at once
    instead of waiting for each to report again.
    """
    create_topics(
        kafka,
        [
            NewTopic(kafka.topic_orders, num_partitions=partitions, replication_factor=1),
            NewTopic(
                kafka.topic_executor_state,
                num_partitions=partitions,
                replication_factor=1,
                topic_configs={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"},
            ),
        ],
        client_id=client_id,
    )
