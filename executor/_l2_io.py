"""What L2 is made of, apart from the cache that keeps it: objects, their reads and their writes.

    L2Object    a published single file, or a checkpoint directory (its files as ``L2File``s)
    TempWrite   one file being downloaded to a temporary name; ``PartWrite`` one part of it
    L2Reader    chunked reads of one file into caller memory, each chunk checked against its digest
    ChunkDigester  the per-chunk xxh3 digests recorded on the way in

``_l2`` (the cache, its index and budget) and ``_l2_dir`` (checkpoint directories) build on these.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import xxhash

from executor import _metrics
from executor._tier import ALIGN, round_up
from prewarm import IntegrityError, StorageError

__all__ = [
    "ChunkDigester",
    "L2File",
    "L2Object",
    "L2Reader",
    "PartWrite",
    "TempWrite",
    "VerifyResult",
    "WriteSink",
    "write_at",
]

_DIRECT_RUN = 2**20  # O_DIRECT writes of a part go out once this much has landed
# Buffered writes in pieces of this size ran 2-5x faster than one 32 MiB pwrite per part (measured on
# ext4 under dirty-page throttling: the kernel copies and throttles per call, and big calls stall).
_WRITE_PIECE = 256 * 1024


class ChunkDigester:
    """xxh3-64 of each ``chunk_bytes`` piece of a stream fed in order, in pieces of any size."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._hash = xxhash.xxh3_64()
        self._fill = 0
        self.digests: list[int] = []

    def update(self, data: memoryview | bytes) -> None:
        view = memoryview(data)
        while len(view):
            take = min(len(view), self.chunk_bytes - self._fill)
            self._hash.update(view[:take])
            self._fill += take
            view = view[take:]
            if self._fill == self.chunk_bytes:
                self.digests.append(self._hash.intdigest())
                self._hash.reset()
                self._fill = 0

    def finish(self) -> list[int]:
        if self._fill:
            self.digests.append(self._hash.intdigest())
            self._hash.reset()
            self._fill = 0
        return self.digests


@dataclass(frozen=True)
class L2File:
    """One file of a checkpoint directory, as the index records it."""

    path: str  # relative to the directory
    size: int
    sha256: str
    digests: tuple[int, ...]

    def to_index(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "digests": [f"{d:016x}" for d in self.digests],
        }

    @classmethod
    def from_index(cls, raw: dict[str, Any]) -> L2File:
        return cls(
            str(raw["path"]), int(raw["size"]), str(raw["sha256"]), tuple(int(d, 16) for d in raw["digests"])
        )


@dataclass(frozen=True)
class L2Object:
    """A published L2 entry: one safetensors file, or a checkpoint directory (``members`` non-empty).

    ``sha256`` is the catalog's digest of the entry (for a checkpoint, of its file list); ``size``
    counts every file, which is what the disk budget holds. A single-file object's ``chunk``/digests
    describe the file itself; a checkpoint's files are read one by one through ``member``.
    """

    sha256: str
    path: Path  # the file, or the checkpoint's directory
    size: int
    chunk_bytes: int
    digests: tuple[int, ...]
    model: str = ""
    version: str = ""
    name: str = ""  # a single file's name in its catalog uri
    members: tuple[L2File, ...] = ()

    def chunk(self, index: int) -> tuple[int, int]:
        start = index * self.chunk_bytes
        return start, min(start + self.chunk_bytes, self.size)

    @property
    def n_chunks(self) -> int:
        return len(self.digests)

    @property
    def is_checkpoint(self) -> bool:
        return bool(self.members)

    @property
    def directory(self) -> Path:
        """What an engine can be pointed at: the checkpoint's directory, or the file's parent."""
        return self.path if self.members else self.path.parent

    def files(self) -> list[tuple[str, Path, int]]:
        """(relative path, absolute path, size) of every file, in path order."""
        if not self.members:
            return [(self.name or self.path.name, self.path, self.size)]
        return [(m.path, self.path / m.path, m.size) for m in self.members]

    def member(self, path: str) -> L2Object:
        """One file of a checkpoint as a single-file object, for ``L2Reader`` and its digests."""
        for m in self.members:
            if m.path == path:
                return L2Object(
                    m.sha256,
                    self.path / m.path,
                    m.size,
                    self.chunk_bytes,
                    m.digests,
                    self.model,
                    self.version,
                    m.path,
                )
        raise KeyError(f"{self.model} {self.version}: no file {path!r} in its L2 directory")

    def weight_members(self) -> list[L2Object]:
        """The safetensors files, in load order (by path); a single-file object is its own."""
        if not self.members:
            return [self]
        return [self.member(m.path) for m in self.members if m.path.endswith(".safetensors")]

    def to_index(self) -> dict[str, Any]:
        raw: dict[str, Any] = {
            "size": self.size,
            "chunk_bytes": self.chunk_bytes,
            "model": self.model,
            "version": self.version,
        }
        if self.members:
            raw["files"] = [m.to_index() for m in self.members]
        else:
            raw["digests"] = [f"{d:016x}" for d in self.digests]
            if self.name:
                raw["name"] = self.name
        return raw


@dataclass
class VerifyResult:
    sha256: str
    model: str
    ok: bool
    detail: str = ""


@dataclass
class TempWrite:
    """A download in progress: reserved bytes, an open temp file, and where it will be published."""

    sha256: str
    size: int
    path: Path
    fd: int
    model: str
    version: str
    # The same file opened with O_DIRECT (None where the filesystem refuses it): aligned runs of a part
    # go straight from the caller's memory to the disk, with no page-cache copy to throttle or fsync.
    direct_fd: int | None = None
    closed: bool = field(default=False)
    name: str = ""  # the file's name in its catalog uri (or in its checkpoint)

    def close(self) -> None:
        if not self.closed:
            for fd in (self.fd, self.direct_fd):
                if fd is not None:
                    os.close(fd)
            self.closed = True


def write_at(tw: TempWrite, offset: int, data: memoryview | bytes) -> None:
    """Buffered write of ``data`` at ``offset`` of the temp file."""
    view = memoryview(data)
    try:
        while len(view):
            n = os.pwrite(tw.fd, view[:_WRITE_PIECE], offset)
            view, offset = view[n:], offset + n
    except OSError as exc:
        raise StorageError(f"L2: writing {tw.path} failed: {exc.strerror}") from exc


class WriteSink(Protocol):
    """Where a download's pieces are written: the cache itself, or a checkpoint directory in progress."""

    chunk_bytes: int

    def write(self, tw: TempWrite, offset: int, data: memoryview | bytes) -> None: ...

    def publish(self, tw: TempWrite, sha_actual: str, digests: list[int]) -> L2Object: ...

    def abandon(self, tw: TempWrite) -> None: ...


class PartWrite:
    """One part of a download, ``[start, start + n)`` of the object, written as its pieces land.

    ``buffer`` holds the part (and, when the part ends the object, the slack up to the next ``ALIGN``);
    ``address`` is its address. Where the temp file takes O_DIRECT and the part is aligned, landed bytes
    go out in aligned runs of at least ``_DIRECT_RUN`` (the last run rounded up: ``publish`` truncates
    the file to its size); otherwise each piece is written buffered. On the development VM O_DIRECT
    writes of a streamed download cost 10-15 % less than buffered writes plus the final fsync.
    """

    def __init__(
        self, l2: WriteSink, tw: TempWrite, start: int, n: int, buffer: memoryview, address: int
    ) -> None:
        self._l2, self._tw, self._start, self._n, self._buffer = l2, tw, start, n, buffer
        self._direct = (
            tw.direct_fd is not None
            and (address % ALIGN, start % ALIGN) == (0, 0)
            # Rounding the last run up must not write over the next part: only the object's end may be
            # unaligned.
            and (n % ALIGN == 0 or start + n == tw.size)
            and len(buffer) >= round_up(n)
        )
        self._flushed = 0

    def landed(self, a: int, b: int) -> None:
        """``buffer[a:b]`` has landed (a retried range starts again from 0)."""
        if not self._direct:
            self._l2.write(self._tw, self._start + a, self._buffer[a:b])
            return
        self._flushed = min(self._flushed, a)
        upto = b - b % ALIGN
        if upto - self._flushed >= _DIRECT_RUN:
            self._write_direct(upto)

    def finish(self) -> None:
        """Every byte of the part has landed: write what is left."""
        if self._direct and self._flushed < self._n:
            self._write_direct(round_up(self._n))

    def _write_direct(self, upto: int) -> None:
        assert self._tw.direct_fd is not None
        view, offset = self._buffer[self._flushed : upto], self._start + self._flushed
        try:
            while len(view):
                written = os.pwrite(self._tw.direct_fd, view, offset)
                view, offset = view[written:], offset + written
        except OSError as exc:
            raise StorageError(f"L2: writing {self._tw.path} failed: {exc.strerror}") from exc
        self._flushed = upto


class L2Reader:
    """Reads chunks of one object into caller memory, O_DIRECT where allowed, checking each digest.

    Thread-safe: ``pread`` carries its own offset, so the pipeline's reading threads share the fds.
    """

    def __init__(self, obj: L2Object, *, direct: bool) -> None:
        if obj.members:
            raise ValueError("a checkpoint is read file by file: open a reader on obj.member(path)")
        self.obj = obj
        try:
            self._fd = os.open(obj.path, os.O_RDONLY)
        except OSError as exc:
            # Another process sharing the cache evicted it: as good as corrupt, fetch it again.
            raise IntegrityError(f"L2 object {obj.sha256[:12]} is gone: {exc.strerror}") from exc
        self._direct_fd: int | None = None
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self._direct_fd = os.open(obj.path, os.O_RDONLY | os.O_DIRECT)
            except OSError:  # tmpfs and some overlay filesystems refuse O_DIRECT
                self._direct_fd = None
        else:
            # Buffered reads of a file we will not read again soon: tell the kernel to read ahead.
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

    @property
    def direct(self) -> bool:
        return self._direct_fd is not None

    def close(self) -> None:
        for fd in (self._fd, self._direct_fd):
            if fd is not None:
                os.close(fd)

    def __enter__(self) -> L2Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_chunk(self, index: int, out: memoryview, out_address: int) -> int:
        """Read chunk ``index`` into the start of ``out`` and check its digest; returns its length.

        ``out_address`` is ``out``'s address: O_DIRECT needs it, the file offset and the length aligned,
        so ``out`` should have room for the length rounded up to ``ALIGN``; otherwise this reads buffered.
        """
        start, end = self.obj.chunk(index)
        n = end - start
        done = 0
        want = round_up(n)
        if (
            self._direct_fd is not None
            and (out_address % ALIGN, start % ALIGN) == (0, 0)
            and len(out) >= want
        ):
            try:
                while done < n:
                    got = os.preadv(self._direct_fd, [out[done:want]], start + done)
                    if got <= 0:
                        break
                    done += got
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise StorageError(f"L2 read of {self.obj.path} failed: {exc.strerror}") from exc
                done = 0  # the filesystem took the open but refuses the read: buffered below
            done = min(done, n)
        while done < n:
            try:
                got = os.preadv(self._fd, [out[done:n]], start + done)
            except OSError as exc:
                raise StorageError(f"L2 read of {self.obj.path} failed: {exc.strerror}") from exc
            if got <= 0:
                raise IntegrityError(f"L2 object {self.obj.sha256[:12]} is shorter than its index says")
            done += got
        if xxhash.xxh3_64_intdigest(out[:n]) != self.obj.digests[index]:
            _metrics.INTEGRITY_FAILURES.labels("L2").inc()
            raise IntegrityError(
                f"L2 object {self.obj.sha256[:12]} ({self.obj.model}) chunk {index} at byte {start}: "
                "digest mismatch"
            )
        return n
