"""The one exception tree of prewarm.

    PrewarmError
    ├── ConfigError                 a setting, a catalog or a cluster file is wrong (CLI exit status 2)
    ├── InvalidInput (ValueError)   malformed input from outside; the caller rejects or dead-letters it
    │   ├── InvalidEvent            a gateway request-log event
    │   ├── InvalidHint             a business hint from a product page
    │   └── InvalidWeights          a safetensors file (header, offsets, dtypes, size)
    ├── UnknownModel (LookupError)  a model id that the catalog does not hold
    ├── StorageError                reading or writing bytes or rows failed
    │   ├── ObjectStoreError        L3 (S3 or file://); ``transient`` says whether a retry can help
    │   └── IntegrityError          bytes do not match their sha256 or chunk digest
    ├── ServiceError                a remote service failed; ``transient`` says whether a retry can help
    │   ├── BrokerError             Kafka
    │   └── TrackingError           MLflow
    ├── AccessDenied                a caller of an HTTP API may not do what it asked
    │   ├── Unauthorized            no credentials were presented (HTTP 401)
    │   └── Forbidden               the credentials are wrong or do not allow this (HTTP 403)
    ├── CapacityError               a tier cannot hold what was asked, even after demotion
    │   └── PlacementFailed         the budget allows it but no room is free in one piece (executor)
    └── ForecastError               a forecast model could not be fitted or loaded

Library errors (botocore, kafka-python, MLflow, SQLAlchemy) are translated into these where they enter
our code, with ``raise ... from exc``, so callers never see a third-party type.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AccessDenied",
    "BrokerError",
    "CapacityError",
    "ConfigError",
    "Forbidden",
    "ForecastError",
    "IntegrityError",
    "InvalidEvent",
    "InvalidHint",
    "InvalidInput",
    "InvalidWeights",
    "ObjectStoreError",
    "PlacementFailed",
    "PrewarmError",
    "ServiceError",
    "StorageError",
    "TrackingError",
    "Unauthorized",
    "UnknownModel",
    "abridged",
]


def abridged(items: Sequence[str], most: int = 5) -> str:
    """The first ``most`` of ``items`` for a message, comma-separated, with " ..." when there are more:
    a message names a few, not a file's 1,444 columns."""
    return ", ".join(items[:most]) + (" ..." if len(items) > most else "")


class PrewarmError(Exception):
    """Base of every error prewarm raises on purpose."""


class ConfigError(PrewarmError):
    """A setting, catalog entry or cluster description is invalid.

    ``setting`` names the offending key (``PREWARM_DATABASE_URL``, ``models[3].sha256``) when known.
    """

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class InvalidInput(PrewarmError, ValueError):
    """Input from outside the process is malformed. ``reason`` is a short machine-readable tag."""

    def __init__(self, message: str, *, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class InvalidEvent(InvalidInput):
    """A request-log event cannot be counted; it belongs in the dead-letter topic."""


class InvalidHint(InvalidInput):
    """A hint is malformed or refers to something it may not."""


class InvalidWeights(InvalidInput):
    """A weights file is not a well-formed safetensors file; nothing of it is cached."""


class UnknownModel(PrewarmError, LookupError):
    """The model id is not in the catalog."""

    def __init__(self, model_id: str) -> None:
        super().__init__(f"unknown model {model_id!r}")
        self.model_id = model_id


class StorageError(PrewarmError):
    """Reading or writing persistent bytes or rows failed."""


class ObjectStoreError(StorageError):
    """The L3 object store failed. ``transient`` errors are worth retrying with backoff."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class IntegrityError(StorageError):
    """Bytes do not match the digest recorded for them; the copy must be fetched again."""


class ServiceError(PrewarmError):
    """A remote service prewarm depends on failed."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class BrokerError(ServiceError):
    """The Kafka broker could not be reached or refused a request."""


class TrackingError(ServiceError):
    """The MLflow tracking server or registry failed."""


class AccessDenied(PrewarmError):
    """A caller of one of prewarm's HTTP APIs may not do what it asked."""


class Unauthorized(AccessDenied):
    """No bearer token was presented (HTTP 401)."""


class Forbidden(AccessDenied):
    """A token was presented but is wrong or does not allow this (HTTP 403)."""


class CapacityError(PrewarmError):
    """A tier cannot hold the requested bytes even after demoting what may be demoted."""


class PlacementFailed(CapacityError):
    """A tier's allocator found no room in one piece (fragmentation, device OOM) although the byte budget
    allowed the entry: the tier gives up its least recently used entry and tries again."""


class ForecastError(PrewarmError):
    """A forecast model could not be fitted, saved or loaded."""
