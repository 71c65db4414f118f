"""Which order offsets a node may commit: pure bookkeeping, no Kafka, no I/O.

The daemon reads every record of the orders topic but applies only those keyed by its node, on several
lanes at once (demand orders overtake prefetches), so orders finish out of the order they were read.
A committed offset says "everything before this is done": it may never pass an order read but not yet
applied, whatever was read or finished after it, or a restart would skip that order. Records that are
not ours count as done the moment they are read.

Per partition the tracker keeps the next offset to read and the set of offsets still pending; what is
safe to commit is the lowest pending offset, or the next to read when none is. ``due`` returns only the
partitions whose safe offset moved since the last ``committed``, so an idle node commits nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

__all__ = ["OffsetTracker"]

P = TypeVar("P", bound=Hashable)


class OffsetTracker(Generic[P]):
    """Read, pending and done offsets per partition ``P``. Thread-safe: lanes finish on their threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_to: dict[P, int] = {}
        self._pending: dict[P, set[int]] = {}
        self._committed: dict[P, int] = {}

    def read(self, partition: P, offset: int, *, pending: bool) -> None:
        """``offset`` was read; ``pending`` when it is an order still to apply (not another node's)."""
        with self._lock:
            self._read_to[partition] = max(self._read_to.get(partition, 0), offset + 1)
            if pending:
                self._pending.setdefault(partition, set()).add(offset)

    def done(self, partition: P, offset: int) -> None:
        """The order at ``offset`` was applied (or failed: either way it is not to be read again)."""
        with self._lock:
            self._pending.get(partition, set()).discard(offset)

    def safe(self) -> dict[P, int]:
        """Per partition, the highest offset that may be committed now."""
        with self._lock:
            return self._safe()

    def due(self) -> dict[P, int]:
        """The safe offsets that differ from what was last committed: what to commit now."""
        with self._lock:
            return {p: off for p, off in self._safe().items() if self._committed.get(p) != off}

    def committed(self, offsets: Mapping[P, int]) -> None:
        """``offsets`` (from ``due``) are committed now."""
        with self._lock:
            self._committed.update(offsets)

    def _safe(self) -> dict[P, int]:
        return {p: min(self._pending[p]) if self._pending.get(p) else end for p, end in self._read_to.items()}
