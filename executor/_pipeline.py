"""The transfers between tiers: chunked, multi-threaded, overlapped, pre-emptible.

- ``probe_l3``: read and validate the safetensors header from L3 before anything is allocated.
- ``fetch_l3``: L3 → L2 (and L1 in the same pass): ranged GETs on many threads; each part is written
  to the L2 temp file and, when an L1 block is given, into it; the sha256 and the chunk digests are
  computed in order on the driver thread while the next parts are in flight.
- ``read_l2``: L2 → L1: chunks read on several threads (O_DIRECT where possible) straight into the L1
  block, each checked against its digest by the thread that read it; ``on_chunk`` lets the caller start
  the device copy of every chunk as soon as it lands.
- ``DeviceCopier``: L1 → L0 copies of chunks, asynchronous on a dedicated CUDA stream from pinned memory
  (so they overlap the disk reads), synchronous on the CPU stand-in.

Every driver calls its transfer's ``checkpoint`` before issuing a chunk (see ``_priority``) and, when
anything fails, waits for the chunks already issued before returning, because they write into memory
the caller is about to give back.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import torch

from executor._l2 import ChunkDigester, L2Cache, L2Object, L2Reader, TempWrite
from executor._l3 import ObjectStore
from executor._priority import Transfer
from executor._safetensors import Layout, header_length, parse_header

__all__ = ["DeviceCopier", "fetch_l3", "host_view", "probe_l3", "read_header_l2", "read_l2"]

_PROBE_BYTES = 64 * 1024


def host_view(buffer: torch.Tensor) -> tuple[memoryview, int]:
    """A writable memoryview over a CPU uint8 tensor and its address (for O_DIRECT alignment)."""
    array: Any = buffer.numpy()  # numpy arrays export the buffer protocol; its stubs do not say so
    return memoryview(array).cast("B"), buffer.data_ptr()


def probe_l3(store: ObjectStore, uri: str) -> Layout:
    """Size and validated layout of an object, from at most two small ranged reads."""
    size = store.size(uri)
    first = store.read_range(uri, 0, min(size, _PROBE_BYTES))
    n = header_length(first, size)
    header = first[8 : 8 + n] if 8 + n <= len(first) else first[8:] + store.read_range(uri, len(first), 8 + n)
    return parse_header(header, size)


def read_header_l2(obj: L2Object) -> Layout:
    with open(obj.path, "rb") as f:
        n = header_length(f.read(8), obj.size)
        return parse_header(f.read(n), obj.size)


def _drain(futures: deque[Future[Any]]) -> None:
    for future in futures:
        future.cancel()
    wait(futures)


def fetch_l3(
    store: ObjectStore,
    uri: str,
    l2: L2Cache,
    tw: TempWrite,
    *,
    dest: memoryview | None,
    pool: ThreadPoolExecutor,
    part_bytes: int,
    window: int,
    transfer: Transfer,
) -> L2Object:
    """Stream the object into the temp write (and ``dest``); publish it in L2 when its sha256 matches."""
    size = tw.size
    parts = [(start, min(start + part_bytes, size)) for start in range(0, size, part_bytes)]
    sha = hashlib.sha256()
    digester = ChunkDigester(l2.chunk_bytes)

    def fetch(start: int, end: int) -> memoryview:
        # Into the L1 buffer when there is one (the bytes are needed there anyway), else a scratch one.
        data = dest[start:end] if dest is not None else memoryview(bytearray(end - start))
        store.read_range_into(uri, start, data)
        l2.write(tw, start, data)
        return data

    inflight: deque[Future[memoryview]] = deque()
    try:
        for start, end in parts:
            transfer.checkpoint()
            inflight.append(pool.submit(fetch, start, end))
            # Hash in order on this thread while later parts download; this also bounds memory.
            while len(inflight) >= window or (inflight and inflight[0].done()):
                data = inflight.popleft().result()
                sha.update(data)
                digester.update(data)
        while inflight:
            data = inflight.popleft().result()
            sha.update(data)
            digester.update(data)
    except BaseException:
        _drain(inflight)
        l2.abandon(tw)
        raise
    return l2.publish(tw, sha.hexdigest(), digester.finish())


def read_l2(
    reader: L2Reader,
    dest: memoryview,
    dest_address: int,
    *,
    pool: ThreadPoolExecutor,
    window: int,
    transfer: Transfer,
    on_chunk: Callable[[int, int], None] | None = None,
) -> None:
    """Read every chunk of ``reader``'s object into ``dest``; ``on_chunk(start, end)`` as each lands."""
    obj = reader.obj
    inflight: dict[Future[int], int] = {}
    pending = deque(range(obj.n_chunks))
    try:
        while pending or inflight:
            while pending and len(inflight) < window:
                transfer.checkpoint()
                index = pending.popleft()
                inflight[pool.submit(reader.read_chunk, index, dest, dest_address)] = index
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            for future in done:
                index = inflight.pop(future)
                future.result()
                if on_chunk is not None:
                    on_chunk(*obj.chunk(index))
    except BaseException:
        _drain(deque(inflight))
        raise


class DeviceCopier:
    """Host → device copies of byte ranges; asynchronous on its own CUDA stream when the device is CUDA."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self._src = src
        self._dst = dst
        self._cuda = dst.device.type == "cuda"
        self._stream: Any = (
            torch.cuda.Stream(device=dst.device) if self._cuda else None  # type: ignore[no-untyped-call]
        )

    def copy(self, start: int, end: int) -> None:
        if self._cuda:
            with torch.cuda.stream(self._stream):
                self._dst[start:end].copy_(self._src[start:end], non_blocking=True)
        else:
            self._dst[start:end].copy_(self._src[start:end])

    def finish(self) -> None:
        """Wait until every copy has landed (the source may be freed, the views used, after this)."""
        if self._cuda:
            self._stream.synchronize()

    def copy_all(self, size: int, chunk_bytes: int, transfer: Transfer) -> None:
        try:
            for start in range(0, size, chunk_bytes):
                transfer.checkpoint()
                self.copy(start, min(start + chunk_bytes, size))
        finally:
            self.finish()
