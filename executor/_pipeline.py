"""The transfers between tiers: chunked, multi-threaded, overlapped, pre-emptible.

- ``probe_l3``: read and validate the safetensors header from L3 before anything is allocated.
- ``fetch_l3``: L3 → L2 (and L1 in the same pass): ranged GETs on many threads; each part lands in the
  L1 block (or a scratch buffer) and goes on to the L2 temp file from there; the sha256 and the chunk
  digests are computed in order on the driver thread while the next parts are in flight, and a load to
  L0 starts each part's device copy there too. When the disk fails mid-download (full, failing), a
  download that lands in memory anyway goes on without L2 (``bypass``); ``stream_l3`` is the same
  download past L2 from the start, for a load L2 cannot take at all.
- ``read_l2``: L2 → L1: chunks read on several threads (O_DIRECT where possible) straight into the L1
  block, each checked against its digest by the thread that read it; the caller starts the device copy
  of every chunk as soon as it lands. A model that L1 cannot hold goes L2 → L0 through a ``StagingRing``
  of a few pinned chunks instead. On the CPU device a load to L0 reads into the L0 buffer itself.
  ``chunk_targets`` picks where one file's chunks land (a checkpoint's shards each at their offset).
- ``DeviceCopier``: L1 → L0 copies of chunks, asynchronous on a dedicated CUDA stream per GPU from pinned
  memory (so they overlap the disk reads), split between the GPUs a model spans; synchronous on the CPU
  stand-in.

Every driver calls its transfer's ``checkpoint`` before issuing a chunk (see ``_priority``) and, when
anything fails, waits for the chunks already issued before returning, because they write into memory
the caller is about to give back.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Protocol

import torch

from executor import _metrics
from executor._hostmem import host_buffer
from executor._l2 import ChunkDigester, L2Object, L2Reader, PartWrite, TempWrite
from executor._l2_io import WriteSink
from executor._priority import Transfer
from executor._safetensors import Layout, header_length, parse_header
from executor._stores import ObjectStore
from executor._tier import ALIGN, round_up
from prewarm import IntegrityError, StorageError

if TYPE_CHECKING:  # only their attributes are used here: the tiers stay free to change around them
    from executor._l0 import DeviceModel
    from executor._l1 import HostBlock

__all__ = [
    "DeviceCopier",
    "RingFactory",
    "StagingRing",
    "chunk_targets",
    "fetch_l3",
    "host_view",
    "into_buffer",
    "probe_l3",
    "read_header_l2",
    "read_l2",
    "stream_l3",
]

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
    try:
        with open(obj.path, "rb") as f:
            n = header_length(f.read(8), obj.size)
            return parse_header(f.read(n), obj.size)
    except OSError as exc:
        # Evicted by another process sharing the cache: the caller fetches it again.
        raise IntegrityError(f"L2 object {obj.sha256[:12]} is gone: {exc.strerror}") from exc


def _drain(futures: deque[Future[Any]]) -> None:
    for future in futures:
        future.cancel()
    wait(futures)


class _L2Side:
    """The L2 half of one download: a ``PartWrite`` per part, and what happens when a write fails.

    ``bypass(exc)`` (None: never) says whether the download goes on without L2 after ``exc``; once it
    does, no part writes again, and the driver gives the temp write up when the parts in flight are
    done (until then their threads may still use its descriptors). Writes run on the reading threads.
    """

    def __init__(self, l2: WriteSink, tw: TempWrite, bypass: Callable[[StorageError], bool] | None) -> None:
        self.l2, self.tw, self._bypass = l2, tw, bypass
        self._lock = threading.Lock()
        self.given_up = False

    def part(self, start: int, n: int, view: memoryview, address: int) -> PartWrite | None:
        return None if self.given_up else PartWrite(self.l2, self.tw, start, n, view, address)

    def write(self, step: Callable[[], None]) -> None:
        if self.given_up:
            return
        try:
            step()
        except IntegrityError:
            raise
        except StorageError as exc:
            if not self.gives_up(exc):
                raise

    def gives_up(self, exc: StorageError) -> bool:
        """Whether the download goes on without L2 after ``exc`` (it has, if an earlier write said so)."""
        with self._lock:
            if not self.given_up and self._bypass is not None and self._bypass(exc):
                self.given_up = True
            return self.given_up


def fetch_l3(
    store: ObjectStore,
    uri: str,
    l2: WriteSink,
    tw: TempWrite,
    *,
    dest: tuple[memoryview, int] | None,
    pool: ThreadPoolExecutor,
    part_bytes: int,
    window: int,
    transfer: Transfer,
    landed: Callable[[int, int], None] | None = None,
    bypass: Callable[[StorageError], bool] | None = None,
) -> L2Object | None:
    """Stream the object into the temp write (and ``dest``, a buffer with its address); publish it in L2
    (the cache, or the checkpoint directory being written)
    when its sha256 matches. ``landed(start, end)`` runs on this thread as each part of ``dest`` is
    complete, in order: where the device copies of a download to L0 start.

    ``bypass(exc)``: an L2 write (or the publish) failed with ``exc``; True when the download goes on
    into ``dest`` alone (a full or failing disk): the temp write is abandoned, nothing is cached, the
    bytes are still checked against the sha256, and None is returned. Only with a ``dest``.
    """
    side = _L2Side(l2, tw, bypass if dest is not None else None)
    try:
        digest, digests = _pull(
            store,
            uri,
            tw.size,
            dest=dest,
            pool=pool,
            part_bytes=part_bytes,
            window=window,
            transfer=transfer,
            landed=landed,
            side=side,
        )
    except BaseException:
        l2.abandon(tw)
        raise
    if not side.given_up:
        try:
            return l2.publish(tw, digest, digests)
        except IntegrityError:
            raise
        except StorageError as exc:  # publish has given the temp write up
            if not side.gives_up(exc):
                raise
    else:
        l2.abandon(tw)
    _check(digest, tw.sha256, f"{tw.model} {tw.version}")
    return None


def stream_l3(
    store: ObjectStore,
    uri: str,
    size: int,
    sha256: str,
    *,
    dest: tuple[memoryview, int],
    pool: ThreadPoolExecutor,
    part_bytes: int,
    window: int,
    transfer: Transfer,
    landed: Callable[[int, int], None] | None = None,
    what: str = "",
) -> None:
    """``fetch_l3`` past L2, for a load L2 cannot take: the object into ``dest`` alone, checked against
    ``sha256`` (``IntegrityError`` when it does not match: the caller gives ``dest`` back)."""
    digest, _ = _pull(
        store,
        uri,
        size,
        dest=dest,
        pool=pool,
        part_bytes=part_bytes,
        window=window,
        transfer=transfer,
        landed=landed,
        side=None,
    )
    _check(digest, sha256, what or uri)


def _check(actual: str, expected: str, what: str) -> None:
    if actual != expected:
        _metrics.INTEGRITY_FAILURES.labels("L3").inc()
        raise IntegrityError(
            f"{what}: downloaded sha256 {actual[:12]}… does not match the catalog's {expected[:12]}…; "
            "nothing kept"
        )


def _pull(
    store: ObjectStore,
    uri: str,
    size: int,
    *,
    dest: tuple[memoryview, int] | None,
    pool: ThreadPoolExecutor,
    part_bytes: int,
    window: int,
    transfer: Transfer,
    landed: Callable[[int, int], None] | None,
    side: _L2Side | None,
) -> tuple[str, list[int]]:
    """Ranged GETs of ``uri`` on ``pool``'s threads into ``dest`` (or scratch buffers), each part also
    written to L2 by ``side`` when there is one; the sha256 and chunk digests, computed in order."""
    parts = [(start, min(start + part_bytes, size)) for start in range(0, size, part_bytes)]
    sha = hashlib.sha256()
    digester = ChunkDigester(side.l2.chunk_bytes) if side is not None else None

    def fetch(start: int, end: int) -> tuple[int, memoryview]:
        n = end - start
        # Into the L1 buffer when there is one (the bytes are needed there anyway), else a scratch one;
        # with the slack to the next page, so the last part can be written with O_DIRECT too.
        if dest is not None:
            view, address = dest[0][start : min(start + round_up(n), len(dest[0]))], dest[1] + start
        else:
            view, address = host_view(host_buffer(round_up(n)))
        part = side.part(start, n, view, address) if side is not None else None
        if part is None:
            store.read_range_into(uri, start, view[:n])
        else:
            assert side is not None
            # Pieces go to the L2 temp file as soon as they land, while they are still in the CPU cache.
            store.read_range_into(
                uri, start, view[:n], on_piece=lambda a, b: side.write(lambda: part.landed(a, b))
            )
            side.write(part.finish)
        return start, view[:n]

    inflight: deque[Future[tuple[int, memoryview]]] = deque()

    def consume() -> None:
        start, data = inflight.popleft().result()
        # Hash in order on this thread while later parts download (hashlib releases the GIL).
        sha.update(data)
        if digester is not None:
            digester.update(data)
        if landed is not None:
            landed(start, start + len(data))

    try:
        for start, end in parts:
            transfer.checkpoint()
            inflight.append(pool.submit(fetch, start, end))
            while len(inflight) >= window or (inflight and inflight[0].done()):
                consume()
        while inflight:
            consume()
    except BaseException:
        _drain(inflight)
        raise
    return sha.hexdigest(), digester.finish() if digester is not None else []


def read_l2(
    reader: L2Reader,
    *,
    pool: ThreadPoolExecutor,
    window: int,
    transfer: Transfer,
    target: Callable[[int], tuple[memoryview, int, Any]],
    landed: Callable[[int, Any], None],
) -> None:
    """Read every chunk of ``reader``'s object, ``window`` at a time on ``pool``'s threads.

    ``target(index)`` says where a chunk goes (memory, its address, a token); ``landed(index, token)``
    runs on this thread as each chunk arrives, in completion order: that is where device copies start.
    """
    inflight: dict[Future[int], tuple[int, Any]] = {}
    pending = deque(range(reader.obj.n_chunks))
    try:
        while pending or inflight:
            while pending and len(inflight) < window:
                transfer.checkpoint()
                index = pending.popleft()
                out, address, token = target(index)
                inflight[pool.submit(reader.read_chunk, index, out, address)] = (index, token)
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            for future in done:
                index, token = inflight.pop(future)
                future.result()
                landed(index, token)
    except BaseException:
        _drain(deque(inflight))
        raise


def into_buffer(
    dest: memoryview, address: int, obj: L2Object
) -> Callable[[int], tuple[memoryview, int, Any]]:
    """``read_l2`` targets for a buffer that holds the whole file (an L1 block)."""

    def target(index: int) -> tuple[memoryview, int, Any]:
        start, end = obj.chunk(index)
        return dest[start : min(start + round_up(end - start), len(dest))], address + start, None

    return target


class StagingRing:
    """A few chunk-sized pinned slots that carry a model from L2 to L0 when L1 cannot hold it.

    A slot is reused only after the device copy out of it has completed (its CUDA event), so the ring
    bounds host memory at ``slots × chunk`` whatever the model's size.
    """

    def __init__(self, slots: int, chunk_bytes: int, *, pinned: bool) -> None:
        self.slot_bytes = round_up(chunk_bytes)
        raw = torch.empty(slots * self.slot_bytes + ALIGN, dtype=torch.uint8, pin_memory=pinned)
        skip = (-raw.data_ptr()) % ALIGN
        self.buffer = raw[skip : skip + slots * self.slot_bytes]
        self._view, self._address = host_view(self.buffer)
        self._free: deque[tuple[int, Any]] = deque((i, None) for i in range(slots))

    def target(self, _index: int) -> tuple[memoryview, int, Any]:
        slot, event = self._free.popleft()
        if event is not None:
            event.synchronize()
        offset = slot * self.slot_bytes
        return self._view[offset : offset + self.slot_bytes], self._address + offset, slot

    def slot(self, slot: int, nbytes: int) -> torch.Tensor:
        offset = slot * self.slot_bytes
        return self.buffer[offset : offset + nbytes]

    def release(self, slot: int, event: Any) -> None:
        self._free.append((slot, event))


class RingFactory(Protocol):
    """How the executor builds a staging ring (``StagingRing`` itself, or a wrapper a test passes)."""

    def __call__(self, slots: int, chunk_bytes: int, *, pinned: bool) -> StagingRing: ...


class _Events:
    """The CUDA events of one chunk's copies (one per GPU it spans); done when all are."""

    def __init__(self, events: list[Any]) -> None:
        self._events = events

    def synchronize(self) -> None:
        for event in self._events:
            event.synchronize()


class DeviceCopier:
    """Host → device copies into ``dst``; asynchronous on its own CUDA stream per device when on CUDA.

    ``dst`` is one flat buffer, or the segments of a model held across GPUs: ``(start, buffer)`` pairs,
    each buffer holding bytes ``[start, start + numel)`` of the model; a chunk that spans segments is
    split between them.
    """

    def __init__(self, dst: torch.Tensor | Sequence[tuple[int, torch.Tensor]]) -> None:
        self._segments = [(0, dst)] if isinstance(dst, torch.Tensor) else sorted(dst, key=lambda s: s[0])
        self._cuda = self._segments[0][1].device.type == "cuda"
        self._streams: dict[torch.device, Any] = {}
        if self._cuda:
            for _start, buffer in self._segments:
                if buffer.device not in self._streams:
                    self._streams[buffer.device] = torch.cuda.Stream(device=buffer.device)  # type: ignore[no-untyped-call]

    def copy(self, src: torch.Tensor, dst_start: int) -> Any:
        """Copy ``src`` to ``dst[dst_start:]``; returns what fires when it is done (None on the CPU)."""
        events: list[Any] = []
        end = dst_start + src.numel()
        for start, buffer in self._segments:
            lo, hi = max(dst_start, start), min(end, start + buffer.numel())
            if lo >= hi:
                continue
            dst, part = buffer[lo - start : hi - start], src[lo - dst_start : hi - dst_start]
            if not self._cuda:
                dst.copy_(part)
                continue
            stream = self._streams[buffer.device]
            with torch.cuda.stream(stream):
                dst.copy_(part, non_blocking=True)
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(stream)
            events.append(event)
        return _Events(events) if events else None

    def finish(self) -> None:
        """Wait until every copy has landed (the source may be freed, the views used, after this)."""
        for stream in self._streams.values():
            stream.synchronize()

    def copy_all(self, src: torch.Tensor, size: int, chunk_bytes: int, transfer: Transfer) -> None:
        try:
            for start in range(0, size, chunk_bytes):
                transfer.checkpoint()
                self.copy(src[start : min(start + chunk_bytes, size)], start)
        finally:
            self.finish()


def chunk_targets(
    obj: L2Object,
    offset: int,
    block: HostBlock | None,
    device_model: DeviceModel | None,
    copier: DeviceCopier | None,
    pcie: Any,
    ring: StagingRing | None,
) -> tuple[Callable[[int], tuple[memoryview, int, Any]], Callable[[int, Any], None]]:
    """Where ``read_l2`` puts the chunks of one L2 file that sits at ``offset`` of the model's buffer,
    and what it does as each lands: nothing when they land in the L0 buffer itself (the CPU device);
    copy on to the device from an L1 block, when ``copier`` is set; or copy out of the staging ring."""
    if ring is None and block is None:
        assert device_model is not None
        assert device_model.padded is not None
        view, address = host_view(device_model.padded)

        def in_place(index: int, token: Any) -> None:
            return None  # already in place: nothing to copy

        return into_buffer(view[offset:], address + offset, obj), in_place
    if block is not None:
        view, address = host_view(block.buffer)

        def to_device(index: int, token: Any) -> None:
            if copier is not None and pcie is not None:
                start, end = obj.chunk(index)
                pcie.checkpoint()
                copier.copy(block.buffer[offset + start : offset + end], offset + start)

        return into_buffer(view[offset:], address + offset, obj), to_device
    assert ring is not None
    assert copier is not None
    assert pcie is not None

    def staged(index: int, token: Any) -> None:
        start, end = obj.chunk(index)
        pcie.checkpoint()
        ring.release(token, copier.copy(ring.slot(token, end - start), offset + start))

    return ring.target, staged
