"""What the executor asks of L3, whatever serves it: an object's size, a byte range of it, its sha256.

Ranges are what make a download parallel: the pipeline issues ``s3_concurrency`` ranged reads of
``s3_part_bytes`` at a time, and each lands straight in its destination buffer.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from prewarm import ObjectStoreError

__all__ = ["PIECE", "ObjectStore", "OnPiece"]

_HASH_BLOCK = 8 * 2**20
# Ranges are received in pieces of this size and handed on (to the L2 writer) while still in the CPU
# cache; writing whole 32 MiB parts from cold memory ran at half the rate of boto3's download_file.
PIECE = 1 * 2**20
OnPiece = Callable[[int, int], None]


class ObjectStore(ABC):
    """What L3 offers. Implementations are thread-safe: ranges are read from many threads at once."""

    scheme: str

    @abstractmethod
    def size(self, uri: str) -> int:
        """The object's size in bytes."""

    @abstractmethod
    def read_range(self, uri: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; exactly ``end - start`` of them or an ``ObjectStoreError``."""

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        """Bytes ``[start, start + len(dest))`` straight into ``dest`` (an L1 buffer): no extra copy.

        ``on_piece(a, b)`` is called as ``dest[a:b]`` lands, in pieces of about ``PIECE`` bytes, so the
        caller can write them on while they are still in the CPU cache. A retried range repeats pieces.
        """
        dest[:] = self.read_range(uri, start, start + len(dest))
        if on_piece is not None:
            for a in range(0, len(dest), PIECE):
                on_piece(a, min(a + PIECE, len(dest)))

    def list_prefix(self, uri: str) -> list[tuple[str, int]]:
        """Every object under the directory or prefix ``uri``: (path relative to it, size), by path.

        What a checkpoint entry is made of; an empty list when nothing is there.
        """
        raise ObjectStoreError(f"{self.scheme}:// stores cannot list a prefix ({uri})")

    def iter_bytes(self, uri: str, block: int = _HASH_BLOCK) -> Iterator[bytes]:
        size = self.size(uri)
        for start in range(0, size, block):
            yield self.read_range(uri, start, min(start + block, size))

    def sha256(self, uri: str) -> str:
        """Streamed: memory stays at one block whatever the object's size."""
        digest = hashlib.sha256()
        for block in self.iter_bytes(uri):
            digest.update(block)
        return digest.hexdigest()
