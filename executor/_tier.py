"""The tier interface, in one place: a byte-budgeted, LRU, pinnable cache that L2, L1 and L0 share.

What the tier modules have in common lives here and nowhere else, so that ``_l0``, ``_l1`` and ``_l2``
are flat siblings that never import each other: the key of a cached copy (``ModelKey``), the block
alignment O_DIRECT needs (``ALIGN``, ``round_up``) and the accounting below.

Each tier module (``_l2``, ``_l1``, ``_l0``) owns what a tier *stores* (files, a host pool, device
buffers) and hands this class two callbacks: ``place`` to allocate room for an entry and ``release`` to
free it. Accounting, eviction choice, pins, the prefetch TTL and the metrics live here, so the budget
rule is written once: ``used`` counts every entry from the moment it is reserved (before any byte
moves), and a reservation that cannot fit after evicting every unpinned, ready entry fails with
``CapacityError`` instead of over-committing. Which entries give up their room is the spine's
``lru_victims``: the rule the planner and the simulator model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from executor import _metrics
from prewarm import CapacityError, PlacementFailed, Tier, held_recency, lru_victims

__all__ = ["ALIGN", "Entry", "ModelKey", "NotAdmitted", "TierCache", "round_up"]

# L1 and L0 entries are keyed by ``ModelSpec.key`` = (id, version, sha256): after the catalog moves a
# model to a new version, a lookup with the new key cannot find the old copy, whatever is still resident.
ModelKey = tuple[str, str, str | None]
ALIGN = 4096  # O_DIRECT wants offsets, lengths and addresses aligned to the logical block size

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class NotAdmitted(CapacityError):
    """A new entry was not given a place in a full tier (``prewarm.admits``): the entries it would evict
    served more requests × bytes lately. Nothing was evicted; a load on its way to memory goes on past
    the tier."""


def round_up(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


@dataclass
class Entry(Generic[K, V]):
    key: K
    nbytes: int
    loaded_at: float
    value: V | None = None
    ready: bool = False
    pins: int = 0
    last_used: float | None = None
    prefetched: bool = False  # brought in speculatively and not used yet
    doomed: str | None = None  # eviction reason, applied when the last pin goes
    hold_until: float | None = None  # its prefetch order's: counts as used then until it is used

    @property
    def recency(self) -> float:
        return held_recency(self.last_used, self.loaded_at, self.hold_until)


class TierCache(Generic[K, V]):
    """Thread-safe accounting for one tier; every method is atomic under one lock."""

    def __init__(
        self,
        tier: Tier,
        capacity: int,
        *,
        clock: Callable[[], float],
        release: Callable[[K, V | None], None],
        place: Callable[[int], V] | None = None,
        ttl_s: float | None = None,
    ) -> None:
        self.tier = tier
        self._capacity = 0
        self.capacity = capacity
        self._clock = clock
        self._release = release
        self._place = place
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._entries: dict[K, Entry[K, V]] = {}
        self._used = 0

    # -- reading

    @property
    def capacity(self) -> int:
        return self._capacity

    @capacity.setter
    def capacity(self, capacity: int) -> None:
        # L2's budget follows its filesystem: the gauge follows every change, whoever makes it.
        self._capacity = capacity
        _metrics.TIER_CAPACITY.labels(self.tier.value).set(capacity)

    @property
    def used(self) -> int:
        return self._used

    def lookup(self, key: K, *, use: bool = True) -> V | None:
        """The ready value for ``key``; ``use`` marks it used (LRU, and no longer an unused prefetch)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.ready or entry.doomed:
                return None
            if use:
                entry.last_used = self._clock()
                if entry.prefetched:
                    _metrics.prefetch_ended(
                        self.tier.value, entry.nbytes, entry.loaded_at, entry.last_used, None
                    )
                entry.prefetched = False
            return entry.value

    def hold(self, key: K, until: float) -> bool:
        """An unused prefetched entry counts as used at ``until`` for the LRU (``prewarm.held_recency``),
        until a request uses it; False when ``key`` has no such entry (gone, or used already)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.prefetched:
                return False
            entry.hold_until = until
            return True

    def unused_prefetch(self, key: K) -> bool:
        """Whether ``key`` was brought in speculatively and nothing has used it yet."""
        with self._lock:
            entry = self._entries.get(key)
            return entry is not None and entry.prefetched

    def snapshot(self) -> list[Entry[K, V]]:
        with self._lock:
            return [Entry(**vars(e)) for e in self._entries.values()]

    def __contains__(self, key: object) -> bool:
        """Any entry for ``key``: ready, loading, or pinned and on its way out."""
        with self._lock:
            return key in self._entries

    # -- changing

    def reserve(
        self,
        key: K,
        nbytes: int,
        *,
        prefetched: bool = False,
        relieves: Callable[[Entry[K, V]], bool] | None = None,
        admit: Callable[[list[tuple[K, int]]], bool] | None = None,
    ) -> V | None:
        """Account ``nbytes`` for ``key`` (evicting LRU entries if needed) and place it; returns the place.

        The entry is not visible to ``lookup`` until ``commit``; ``abort`` gives the bytes back.
        ``relieves``: which entries are worth evicting for this one (L0: those on the GPUs it goes to);
        default every entry. ``admit``: asked with the LRU victims and their bytes, when there are any,
        whether the entry is worth them; ``NotAdmitted`` (nothing evicted) when it says no. Default: always.
        """
        if nbytes > self.capacity:
            raise CapacityError(
                f"{self.tier}: {nbytes} bytes exceed the tier's budget of {self.capacity} bytes"
            )
        released: list[tuple[K, V | None]] = []
        try:
            with self._lock:
                if key in self._entries:
                    # Only reachable for an entry that is evicted but still pinned by a reader (the
                    # executor coalesces loads of one key): try again once it is released.
                    raise CapacityError(f"{self.tier}: {key!r} is still held by a reader; retry")
                candidates = [e for e in self._entries.values() if relieves is None or relieves(e)]
                victims = lru_victims(candidates, nbytes, self.capacity - self._used)
                if victims is None:
                    raise CapacityError(
                        f"{self.tier}: {nbytes} bytes do not fit: {self.capacity - self._used} free "
                        "and every other entry is in use or loading"
                    )
                if (
                    victims
                    and admit is not None
                    and not admit([(k, self._entries[k].nbytes) for k in victims])
                ):
                    raise NotAdmitted(
                        f"{self.tier}: not admitted: the {len(victims)} entries it would evict for its "
                        f"{nbytes} bytes served more requests × bytes lately"
                    )
                for victim in victims:
                    released.append(self._drop(victim, "capacity"))
                if self._place is not None:
                    # A tier that places (host pool, device) needs the victims' room back before it
                    # places, not after the lock is released; they free in microseconds.
                    for victim_key, victim_value in released:
                        self._release(victim_key, victim_value)
                    released.clear()
                value = self._place_locked(nbytes, relieves)
                self._entries[key] = Entry(key, nbytes, self._clock(), value, prefetched=prefetched)
                self._used += nbytes
                _metrics.TIER_USED.labels(self.tier.value).set(self._used)
                return value
        finally:
            # Freeing (unlinking a file, returning pool ranges) happens outside the lock.
            for victim_key, victim_value in released:
                self._release(victim_key, victim_value)

    def _place_locked(self, nbytes: int, relieves: Callable[[Entry[K, V]], bool] | None) -> V | None:
        if self._place is None:
            return None
        while True:
            try:
                return self._place(nbytes)
            except PlacementFailed:
                # Room by budget but not in one piece (or not on the right GPUs): give up the next LRU
                # entry that would help and try again.
                candidates = [e for e in self._entries.values() if relieves is None or relieves(e)]
                victims = lru_victims(candidates, 1, 0)
                if not victims:
                    raise CapacityError(
                        f"{self.tier}: no contiguous room for {nbytes} bytes and nothing left to evict"
                    ) from None
                # The allocator needs the room back now, not after the lock is released; the
                # tiers that place (host pool, device) free in microseconds.
                self._release(*self._drop(victims[0], "capacity"))

    def commit(self, key: K, value: V | None = None) -> None:
        with self._lock:
            entry = self._entries[key]
            if value is not None:
                entry.value = value
            entry.ready = True
            entry.loaded_at = self._clock()
            if entry.prefetched:
                _metrics.PREFETCH_IDLE.labels(self.tier.value).inc(entry.nbytes)

    def abort(self, key: K) -> None:
        with self._lock:
            dropped = self._drop(key, None) if key in self._entries else None
        if dropped is not None:
            self._release(*dropped)

    def pin(self, key: K) -> V | None:
        """Hold a ready entry against eviction; returns its value, or None when it is not there."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.ready or entry.doomed:
                return None
            entry.pins += 1
            return entry.value

    def revive(self, key: K) -> bool:
        """Cancel a deferred eviction: the entry is wanted again while still pinned (same key, same bytes)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.ready or entry.doomed is None:
                return False
            entry.doomed = None
            return True

    def unpin(self, key: K) -> None:
        dropped = None
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.pins = max(entry.pins - 1, 0)
            if entry.pins == 0 and entry.doomed:
                dropped = self._drop(key, entry.doomed)
        if dropped is not None:
            self._release(*dropped)

    def evict(self, key: K, reason: str) -> bool:
        """Drop ``key`` now, or when its last pin goes; False when it is not here (or still loading)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.ready:
                return False
            if entry.pins:
                entry.doomed = reason
                return True
            dropped = self._drop(key, reason)
        self._release(*dropped)
        return True

    def evict_where(self, predicate: Callable[[Entry[K, V]], bool], reason: str) -> list[K]:
        keys = [e.key for e in self.snapshot() if e.ready and predicate(e)]
        return [k for k in keys if self.evict(k, reason)]

    def expire(self) -> list[K]:
        """Evict prefetched entries that nothing used within the TTL."""
        if self._ttl_s is None:
            return []
        deadline = self._clock() - self._ttl_s
        return self.evict_where(lambda e: e.prefetched and e.loaded_at < deadline, "ttl")

    def _drop(self, key: K, reason: str | None) -> tuple[K, V | None]:
        entry = self._entries.pop(key)
        self._used -= entry.nbytes
        if entry.ready and entry.prefetched:
            _metrics.prefetch_ended(
                self.tier.value, entry.nbytes, entry.loaded_at, self._clock(), reason or "aborted"
            )
        _metrics.TIER_USED.labels(self.tier.value).set(self._used)
        if reason is not None:
            _metrics.EVICTIONS.labels(self.tier.value, reason).inc()
        return key, entry.value
