"""L3: object stores behind one small interface (``base``), one module per store, and their registry.

    base     the ``ObjectStore`` interface: size, ranged reads (into a buffer), streamed sha256
    file     ``file://``, embedded mode and tests
    s3       ``s3://`` through boto3, imported only when such a store is built
    memory   one object in host or device memory, so a demotion to L2 reuses the download path

``register_store`` adds a store for another uri scheme (a registry, like vLLM's model loaders) and
registers the scheme in the spine too, so catalogs naming it are valid in every package that reads one.
"""

from __future__ import annotations

from collections.abc import Callable

from executor._stores.base import PIECE, ObjectStore, OnPiece
from executor._stores.file import FileStore
from executor._stores.memory import MemoryStore
from executor._stores.s3 import S3Store
from prewarm import ObjectStoreError, S3Settings, register_scheme

__all__ = [
    "PIECE",
    "FileStore",
    "MemoryStore",
    "ObjectStore",
    "OnPiece",
    "S3Store",
    "open_store",
    "register_store",
]

_FACTORIES: dict[str, Callable[[S3Settings], ObjectStore]] = {
    "file": lambda _settings: FileStore(),
    "s3": S3Store,
}


def register_store(scheme: str, factory: Callable[[S3Settings], ObjectStore]) -> None:
    """Serve ``scheme://`` uris with stores that ``factory`` builds; catalogs may name it from now on."""
    register_scheme(scheme)
    _FACTORIES[scheme] = factory


def open_store(uri: str, s3: S3Settings) -> ObjectStore:
    """The object store that serves ``uri`` (``s3://bucket/key`` or ``file:///path``)."""
    scheme = uri.partition("://")[0]
    factory = _FACTORIES.get(scheme)
    if factory is None:
        raise ObjectStoreError(
            f"no object store for {scheme!r} uris (known: {', '.join(sorted(_FACTORIES))})"
        )
    return factory(s3)
