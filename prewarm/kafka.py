"""kafka-python at the boundary, shared by ingest, the scheduler and the executor daemon.

Every kafka-python call goes through ``broker_errors`` so that callers only ever see
``prewarm.BrokerError``, with ``transient`` set when waiting and retrying can help. Imported explicitly
(``from prewarm.kafka import ...``), never from ``prewarm/__init__``: ``import prewarm`` stays free of
kafka-python.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kafka.errors import KafkaError

from prewarm._exceptions import BrokerError
from prewarm._settings import KafkaSettings

__all__ = ["bootstrap_servers", "broker_errors"]

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
