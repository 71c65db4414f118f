"""L1: host RAM, pinned from one pre-allocated pool when CUDA is present, keyed by (model, version, sha256).

Pinning a buffer per load costs about as much as copying it (the kernel walks and locks every page), so
a CUDA node pins the whole L1 budget once, lazily on first use, and hands out 4 KiB-aligned ranges of it
with a first-fit allocator. Without CUDA the same pool is plain memory, so both paths share the code.
Alignment also serves O_DIRECT reads from L2, which land in these buffers directly.

Entries are keyed by ``ModelSpec.key`` = (id, version, sha256): after the catalog moves a model to a
new version, a lookup with the new key cannot find the old copy, whatever is still resident.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from executor._hostmem import host_buffer, populate
from executor._safetensors import Layout
from executor._tier import ALIGN, ModelKey, TierCache, round_up
from prewarm import PlacementFailed, Tier

__all__ = ["HostBlock", "HostPool", "L1Cache", "RangeAllocator"]


class RangeAllocator:
    """First-fit allocation of aligned ranges in ``[0, capacity)``; free ranges are merged. Pure."""

    def __init__(self, capacity: int, align: int = ALIGN) -> None:
        self.align = align
        self.capacity = capacity - capacity % align
        self._free: list[tuple[int, int]] = [(0, self.capacity)] if self.capacity else []  # (start, end)

    def alloc(self, nbytes: int) -> int | None:
        need = round_up(max(nbytes, 1), self.align)
        for i, (start, end) in enumerate(self._free):
            if end - start >= need:
                if end - start == need:
                    del self._free[i]
                else:
                    self._free[i] = (start + need, end)
                return start
        return None

    def free(self, start: int, nbytes: int) -> None:
        end = start + round_up(max(nbytes, 1), self.align)
        i = bisect.bisect_left(self._free, (start, end))
        self._free.insert(i, (start, end))
        # Merge with the neighbours so large models keep finding room.
        if i + 1 < len(self._free) and self._free[i][1] == self._free[i + 1][0]:
            self._free[i] = (self._free[i][0], self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][1] == self._free[i][0]:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i][1])
            del self._free[i]

    @property
    def free_bytes(self) -> int:
        return sum(end - start for start, end in self._free)


@dataclass
class HostBlock:
    """One model's bytes in L1: the whole safetensors file in ``buffer`` (flat uint8)."""

    offset: int
    nbytes: int
    buffer: torch.Tensor
    layout: Layout | None = None


class HostPool:
    """The L1 budget as one allocation, pinned when ``pinned``; ranges handed out by ``RangeAllocator``."""

    def __init__(self, capacity: int, *, pinned: bool) -> None:
        self.capacity = capacity
        self.pinned = pinned
        self._allocator = RangeAllocator(capacity)
        self._base: torch.Tensor | None = None
        self._registered: torch.Tensor | None = None
        self._lock = threading.Lock()

    def _ensure_base(self) -> torch.Tensor:
        if self._base is None:
            base = host_buffer(self._allocator.capacity)
            if self.pinned and base.numel():
                # cudaHostRegister pins exactly these pages; torch's pinned allocator would round the
                # request up to a power of two (an 80 GB budget would pin 128 GB).
                cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
                status = int(cudart.cudaHostRegister(base.data_ptr(), base.numel(), 0))
                if status != 0:
                    base = torch.empty(self._allocator.capacity, dtype=torch.uint8, pin_memory=True)
                else:
                    self._registered = base
            self._base = base
        return self._base

    def close(self) -> None:
        """Unpin (the memory itself goes with the last reference)."""
        with self._lock:
            if self._registered is not None:
                cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
                cudart.cudaHostUnregister(self._registered.data_ptr())
                self._registered = None
            self._base = None

    def prefault(self) -> None:
        """Allocate (and pin) the whole pool and fault it in now, instead of block by block on use."""
        with self._lock:
            populate(self._ensure_base())

    def alloc(self, nbytes: int) -> HostBlock:
        with self._lock:
            base = self._ensure_base()
            offset = self._allocator.alloc(nbytes)
            if offset is None:
                raise PlacementFailed(f"no contiguous {nbytes} bytes in the L1 pool")
            block = HostBlock(offset, nbytes, base[offset : offset + round_up(nbytes)])
        if not self.pinned:
            # Faulted in now, in order, by one thread, not by the reading threads inside their O_DIRECT
            # reads (see _hostmem); pages already in from an earlier block cost a page-table walk.
            populate(block.buffer)
        return block

    def free(self, block: HostBlock) -> None:
        with self._lock:
            self._allocator.free(block.offset, block.nbytes)


class L1Cache:
    """The host-RAM tier: accounting in ``cache``, memory from ``pool``."""

    def __init__(self, capacity: int, *, pinned: bool, clock: Callable[[], float], ttl_s: float) -> None:
        self.pool = HostPool(capacity, pinned=pinned)
        self.cache: TierCache[ModelKey, HostBlock] = TierCache(
            Tier.L1,
            # Accounting in aligned bytes, so the budget and the pool agree on what fits.
            self.pool._allocator.capacity,
            clock=clock,
            release=self._release,
            place=self.pool.alloc,
            ttl_s=ttl_s,
        )

    def reserve(self, key: ModelKey, nbytes: int, *, prefetched: bool) -> HostBlock:
        block = self.cache.reserve(key, round_up(nbytes), prefetched=prefetched)
        assert block is not None
        return block

    def _release(self, _key: ModelKey, block: HostBlock | None) -> None:
        if block is not None:
            self.pool.free(block)
