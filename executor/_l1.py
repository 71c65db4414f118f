"""L1: host RAM in shared memory, one memfd per model, pinned when CUDA is present, keyed by
(model, version, sha256).

Each block is its own memfd (``_hostmem.shared_buffer``) so that the hand-off socket can give an engine
process exactly one model's bytes, read-only, and so that a block's memory outlives the executor's use
of it for as long as an engine maps it (the executor never reuses memory an engine may still read). The
budget is accounted by ``TierCache`` in 4 KiB-aligned bytes, as before; the kernel places the pages.

On a CUDA node each block is registered with ``cudaHostRegister`` when it is allocated. That walks and
locks its pages, which is why the pool used to be one allocation pinned once; per block it costs about a
page-table walk per page, 512 × less in hugetlb pages (where the node reserves them), and it is paid
once per model brought into L1, not per load to L0. ``Portable``: every CUDA context of the executor
(one per GPU) sees the block as pinned.

Entries are keyed by ``ModelSpec.key`` = (id, version, sha256): after the catalog moves a model to a
new version, a lookup with the new key cannot find the old copy, whatever is still resident.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from executor._hostmem import SharedBuffer, populate, shared_buffer
from executor._safetensors import Layout
from executor._tier import ALIGN, ModelKey, TierCache, round_up
from prewarm import PlacementFailed, Tier, get_logger
from prewarm_client import BlockLayout, FileSlice

__all__ = ["HostBlock", "HostPool", "L1Cache", "block_files", "copy_small_files"]

log = get_logger(__name__)
_CUDA_HOST_REGISTER_PORTABLE = 1


@dataclass
class HostBlock:
    """One model's bytes in L1. ``buffer`` is the block's flat uint8 mapping (``nbytes`` rounded up to
    the page, so the last O_DIRECT read fits); ``layout`` the safetensors layout of a single-file entry
    (what L1 → L0 copies), ``files`` where each file of the entry lies in the block (what an engine is
    told over the hand-off socket). Both are set when the load commits."""

    nbytes: int
    buffer: torch.Tensor
    shared: SharedBuffer
    layout: Layout | None = None
    files: BlockLayout | None = None
    pinned: bool = False


class HostPool:
    """Where L1 blocks come from: a memfd each, registered with CUDA when ``pinned``."""

    def __init__(self, capacity: int, *, pinned: bool) -> None:
        self.capacity = capacity - capacity % ALIGN
        self.pinned = pinned
        self._lock = threading.Lock()
        self._live: dict[int, HostBlock] = {}  # by id(): to unpin what is left at close
        self.allocations = 0  # blocks ever allocated (tests: "L1 was never touched")

    def alloc(self, nbytes: int) -> HostBlock:
        try:
            shared = shared_buffer(round_up(nbytes))
        except OSError as exc:
            if exc.errno in (errno.ENOMEM, errno.ENOSPC):
                # Room by budget but not in the machine: the tier gives up an LRU entry and retries.
                raise PlacementFailed(f"no memory for a {nbytes}-byte L1 block: {exc.strerror}") from exc
            raise
        block = HostBlock(nbytes, shared.tensor[: round_up(nbytes)], shared)
        if self.pinned:
            block.pinned = self._register(block)
        else:
            # Faulted in now, in order, by one thread, not by the reading threads inside their O_DIRECT
            # reads (see _hostmem).
            populate(block.buffer)
        with self._lock:
            self._live[id(block)] = block
            self.allocations += 1
        return block

    def free(self, block: HostBlock) -> None:
        with self._lock:
            self._live.pop(id(block), None)
        self._unregister(block)
        block.shared.close()

    def close(self) -> None:
        """Unpin what is still allocated (the memory itself goes with the last mapping)."""
        with self._lock:
            live, self._live = list(self._live.values()), {}
        for block in live:
            self._unregister(block)

    @staticmethod
    def _register(block: HostBlock) -> bool:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        base = block.shared.tensor
        status = int(cudart.cudaHostRegister(base.data_ptr(), base.numel(), _CUDA_HOST_REGISTER_PORTABLE))
        if status != 0:
            # Still correct, only slower: copies from pageable memory go through the driver's bounce buffer.
            log.warning("cudaHostRegister failed; this L1 block is not pinned", extra={"status": status})
        return status == 0

    @staticmethod
    def _unregister(block: HostBlock) -> None:
        if block.pinned:
            cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
            cudart.cudaHostUnregister(block.shared.tensor.data_ptr())
            block.pinned = False


class L1Cache:
    """The host-RAM tier: accounting in ``cache``, memory from ``pool``."""

    def __init__(self, capacity: int, *, pinned: bool, clock: Callable[[], float], ttl_s: float) -> None:
        self.pool = HostPool(capacity, pinned=pinned)
        self.cache: TierCache[ModelKey, HostBlock] = TierCache(
            Tier.L1,
            # Accounting in aligned bytes, so the budget and the pool agree on what fits.
            self.pool.capacity,
            clock=clock,
            release=self._release,
            place=self._place,
            ttl_s=ttl_s,
        )
        self._slack = threading.local()  # per reserving thread: room beyond the accounted bytes

    def reserve(
        self,
        key: ModelKey,
        nbytes: int,
        *,
        prefetched: bool,
        block_bytes: int = 0,
        admit: Callable[[list[tuple[ModelKey, int]]], bool] | None = None,
    ) -> HostBlock:
        """Account ``nbytes`` (the weights) and allocate a block of at least ``block_bytes``: a
        checkpoint's small files ride in its block but not in the tier's accounting, as the planner
        counts an entry's weights only. ``admit``: as ``TierCache.reserve`` (``NotAdmitted``)."""
        self._slack.extra = max(0, round_up(block_bytes) - round_up(nbytes))
        try:
            block = self.cache.reserve(key, round_up(nbytes), prefetched=prefetched, admit=admit)
        finally:
            self._slack.extra = 0
        assert block is not None
        return block

    def _place(self, nbytes: int) -> HostBlock:
        return self.pool.alloc(nbytes + getattr(self._slack, "extra", 0))

    def _release(self, _key: ModelKey, block: HostBlock | None) -> None:
        if block is not None:
            self.pool.free(block)


def block_files(weights: Sequence[tuple[str, int, int]], small: Sequence[tuple[str, int]]) -> BlockLayout:
    """Where each file of an entry lies in its block: the safetensors files where the loader reads them
    (``(path, offset, length)``: each at an aligned offset, in load order), then the small files an
    engine starts from (``config.json``, tokenizer files), packed after them."""
    slices = [FileSlice(path, offset, length) for path, offset, length in weights]
    end = max((round_up(f.offset + f.length) for f in slices), default=0)
    tail = BlockLayout.pack(small)
    slices += [FileSlice(f.path, end + f.offset, f.length) for f in tail.files]
    return BlockLayout(tuple(slices), end + tail.size)


def copy_small_files(block: HostBlock, files: BlockLayout, sources: Sequence[tuple[str, Path]]) -> None:
    """Copy the small files (kilobytes: a config, a tokenizer) into the block at their places."""
    view = block.buffer.numpy()
    for path, source in sources:
        where = files.file(path)
        assert where is not None
        data = source.read_bytes()
        if len(data) != where.length:
            raise OSError(f"{source} changed size in L2 ({len(data)} bytes, {where.length} expected)")
        view[where.offset : where.offset + where.length] = memoryview(data)
