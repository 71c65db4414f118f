"""L2: the local disk cache, content-addressed by sha256, crash-safe, verified on every read.

Layout under the cache directory::

    index.json          versioned index: per object its size, model, version and chunk digests
    index.json.lock     guards index rewrites across processes
    objects/ab/<sha256> published files, only ever created by rename
    tmp/<sha256>.<pid>.part   downloads in progress (never read)
    locks/<sha256>.lock one download per object across processes

An object enters by temp → fsync → sha256 checked against the catalog → rename → index, so nothing
partial is ever visible. Every use touches the object's mtime: that is the LRU order after a restart
and across processes sharing the directory, which share its byte budget too (``_fit_shared``).

While an object is written, per-chunk xxh3 digests are recorded; every later read
checks the chunk it just read, on the reading thread, so a flipped byte is caught on the next load at
the cost of hashing at ~10 GB/s, not of re-reading the file. ``verify_all`` re-hashes everything.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash
from filelock import FileLock, Timeout

from executor import _metrics
from executor._tier import ALIGN, TierCache, round_up
from prewarm import CapacityError, IntegrityError, StorageError, Tier, get_logger

__all__ = [
    "INDEX_VERSION",
    "ChunkDigester",
    "L2Cache",
    "L2Object",
    "L2Reader",
    "PartWrite",
    "TempWrite",
    "VerifyResult",
]

log = get_logger(__name__)
INDEX_VERSION = 1
# Buffered writes in pieces of this size ran 2-5x faster than one 32 MiB pwrite per part (measured on
# ext4 under dirty-page throttling: the kernel copies and throttles per call, and big calls stall).
_WRITE_PIECE = 256 * 1024
_DIRECT_RUN = 2**20  # O_DIRECT writes of a part go out once this much has landed


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
class L2Object:
    sha256: str
    path: Path
    size: int
    chunk_bytes: int
    digests: tuple[int, ...]
    model: str = ""
    version: str = ""

    def chunk(self, index: int) -> tuple[int, int]:
        start = index * self.chunk_bytes
        return start, min(start + self.chunk_bytes, self.size)

    @property
    def n_chunks(self) -> int:
        return len(self.digests)

    def to_index(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "chunk_bytes": self.chunk_bytes,
            "digests": [f"{d:016x}" for d in self.digests],
            "model": self.model,
            "version": self.version,
        }


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

    def close(self) -> None:
        if not self.closed:
            for fd in (self.fd, self.direct_fd):
                if fd is not None:
                    os.close(fd)
            self.closed = True


class PartWrite:
    """One part of a download, ``[start, start + n)`` of the object, written as its pieces land.

    ``buffer`` holds the part (and, when the part ends the object, the slack up to the next ``ALIGN``);
    ``address`` is its address. Where the temp file takes O_DIRECT and the part is aligned, landed bytes
    go out in aligned runs of at least ``_DIRECT_RUN`` (the last run rounded up: ``publish`` truncates
    the file to its size); otherwise each piece is written buffered. On the development VM O_DIRECT
    writes of a streamed download cost 10-15 % less than buffered writes plus the final fsync.
    """

    def __init__(
        self, l2: L2Cache, tw: TempWrite, start: int, n: int, buffer: memoryview, address: int
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
            got = os.preadv(self._fd, [out[done:n]], start + done)
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


class L2Cache:
    """The disk tier. Thread-safe; coordinates downloads with other processes through file locks."""

    def __init__(
        self,
        root: Path,
        capacity: int,
        *,
        chunk_bytes: int,
        clock: Callable[[], float],
        direct_io: bool = True,
    ) -> None:
        self.root = Path(root)
        self.chunk_bytes = chunk_bytes
        self.direct_io = direct_io and hasattr(os, "O_DIRECT")
        for sub in ("objects", "tmp", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._index_path = self.root / "index.json"
        self._index_lock = FileLock(str(self.root / "index.json.lock"))
        self.cache: TierCache[str, L2Object] = TierCache(
            Tier.L2, capacity, clock=clock, release=self._release
        )
        self._load()

    # -- the index

    def _read_index(self) -> dict[str, Any]:
        try:
            data = json.loads(self._index_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as exc:
            # The index is written atomically, so this is outside interference; objects are re-fetched.
            log.warning("L2 index unreadable, starting empty", extra={"path": str(self._index_path)})
            del exc
            return {}
        if data.get("version") != INDEX_VERSION:
            raise StorageError(
                f"L2 index {self._index_path} has version {data.get('version')!r}, this prewarm "
                f"understands {INDEX_VERSION}: remove {self.root} or run the matching prewarm"
            )
        entries = data.get("objects", {})
        return entries if isinstance(entries, dict) else {}

    def _write_index(self, entries: dict[str, Any]) -> None:
        tmp = self._index_path.with_name(f".index.json.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump({"version": INDEX_VERSION, "objects": entries}, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self._index_path)

    def object_path(self, sha: str) -> Path:
        return self.root / "objects" / sha[:2] / sha

    def _object(self, sha: str, raw: dict[str, Any]) -> L2Object:
        return L2Object(
            sha256=sha,
            path=self.object_path(sha),
            size=int(raw["size"]),
            chunk_bytes=int(raw["chunk_bytes"]),
            digests=tuple(int(d, 16) for d in raw["digests"]),
            model=str(raw.get("model", "")),
            version=str(raw.get("version", "")),
        )

    def _load(self) -> None:
        """Adopt what a previous run left: indexed objects that are intact on disk; delete the rest."""
        with self._index_lock:
            entries = self._read_index()
            kept: dict[str, Any] = {}
            for sha, raw in entries.items():
                try:
                    obj = self._object(sha, raw)
                except (KeyError, TypeError, ValueError):
                    continue
                if obj.path.is_file() and obj.path.stat().st_size == obj.size:
                    kept[sha] = raw
            on_disk = {p.name: p for p in (self.root / "objects").glob("*/*") if p.is_file()}
            for name, path in on_disk.items():
                if name not in kept:
                    # Renamed but never indexed (a crash in between): unverifiable, so gone.
                    path.unlink(missing_ok=True)
            if kept != entries:
                self._write_index(kept)
        for part in (self.root / "tmp").glob("*.part"):
            lock = FileLock(str(self.root / "locks" / f"{part.name.split('.')[0]}.lock"))
            try:
                with lock.acquire(timeout=0):
                    part.unlink(missing_ok=True)  # nobody is writing it: a crashed download
            except Timeout:
                pass
        # Least recently used first (file mtime, touched on every use), so LRU order survives a restart.
        ordered = sorted(kept.items(), key=lambda kv: _mtime(self.object_path(kv[0])))
        for sha, raw in ordered:
            self._adopt(self._object(sha, raw))

    def _adopt(self, obj: L2Object) -> None:
        if obj.sha256 in self.cache:
            return  # ours already (ready, loading, or on its way out)
        self.cache.reserve(obj.sha256, obj.size)
        self.cache.commit(obj.sha256, obj)

    def refresh(self, sha: str) -> L2Object | None:
        """Pick up an object another process published since we loaded the index."""
        found = self.cache.lookup(sha, use=False)
        if found is not None:
            return found
        with self._index_lock:
            raw = self._read_index().get(sha)
        if raw is None:
            return None
        obj = self._object(sha, raw)
        if not obj.path.is_file():
            return None
        self._adopt(obj)
        return obj

    # -- reading

    def lookup(self, sha: str) -> L2Object | None:
        obj = self.cache.lookup(sha)
        if obj is not None:
            _touch(obj.path)
        return obj

    def pin(self, sha: str) -> L2Object | None:
        return self.cache.pin(sha)

    def unpin(self, sha: str) -> None:
        self.cache.unpin(sha)

    def discard(self, sha: str, reason: str) -> None:
        self.cache.evict(sha, reason)

    # -- writing

    @contextlib.contextmanager
    def download_lock(self, sha: str) -> Iterator[None]:
        """One download of an object across processes (threads are coalesced by the executor)."""
        with FileLock(str(self.root / "locks" / f"{sha}.lock")):
            yield

    def begin(self, sha: str, size: int, *, model: str, version: str) -> TempWrite:
        """Reserve ``size`` bytes and open a temp file that nobody will ever read as an object."""
        self.cache.reserve(sha, size)
        path = self.root / "tmp" / f"{sha}.{os.getpid()}.part"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.ftruncate(fd, size)
        except OSError as exc:
            self.cache.abort(sha)
            raise StorageError(f"L2: cannot create {path}: {exc.strerror}") from exc
        direct_fd = None
        if self.direct_io:
            with contextlib.suppress(OSError):  # tmpfs and some overlay filesystems refuse O_DIRECT
                direct_fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        tw = TempWrite(sha, size, path, fd, model, version, direct_fd)
        try:
            self._fit_shared()
        except BaseException:
            self.abandon(tw)
            raise
        return tw

    def _fit_shared(self) -> None:
        """Make the whole directory fit the budget, whichever process filled it.

        Processes sharing a cache directory each keep their own accounting, so each also checks what is
        on disk: every indexed object plus every download in progress (a temp file has its full size
        from the start, so this one counts too). Over budget, the least recently used objects (file
        mtime, touched on every use) that this process is not reading or writing go; an object another
        process is reading stays readable through its open descriptor, and that process fetches it
        again next time. Objects another process removed leave this process's accounting here too.
        """
        busy = {e.key for e in self.cache.snapshot() if e.pins or not e.ready}
        victims: list[str] = []
        with self._index_lock:
            entries = self._read_index()
            used = sum(int(raw.get("size", 0)) for raw in entries.values())
            used += sum(_size(p) for p in (self.root / "tmp").glob("*.part"))
            excess = used - self.cache.capacity
            if excess > 0:
                for _, sha in sorted((_mtime(self.object_path(s)), s) for s in entries if s not in busy):
                    victims.append(sha)
                    excess -= int(entries[sha].get("size", 0))
                    if excess <= 0:
                        break
            if excess > 0:
                raise CapacityError(
                    f"L2: {self.root} is shared with other processes and holds {used} bytes in objects "
                    f"and downloads, over its budget of {self.cache.capacity}; nothing can be evicted"
                )
            for sha in victims:
                del entries[sha]
                self.object_path(sha).unlink(missing_ok=True)
            if victims:
                self._write_index(entries)
        gone = victims + [e.key for e in self.cache.snapshot() if e.ready and e.key not in entries]
        for sha in gone:
            self.cache.evict(sha, "capacity")  # the index no longer names it: nothing left to release

    def write(self, tw: TempWrite, offset: int, data: memoryview | bytes) -> None:
        view = memoryview(data)
        try:
            while len(view):
                n = os.pwrite(tw.fd, view[:_WRITE_PIECE], offset)
                view, offset = view[n:], offset + n
        except OSError as exc:
            raise StorageError(f"L2: writing {tw.path} failed: {exc.strerror}") from exc

    def publish(self, tw: TempWrite, sha_actual: str, digests: list[int]) -> L2Object:
        """fsync, check the sha256 computed on the way, rename, index: the object becomes visible."""
        try:
            os.ftruncate(tw.fd, tw.size)  # the last O_DIRECT run was rounded up to ALIGN
            os.fsync(tw.fd)
            # Written once, read later through O_DIRECT or after an eviction: no use keeping the pages.
            os.posix_fadvise(tw.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            self.abandon(tw)
            raise StorageError(f"L2: writing {tw.path} failed: {exc.strerror}") from exc
        finally:
            tw.close()
        if sha_actual != tw.sha256:
            self.abandon(tw)
            _metrics.INTEGRITY_FAILURES.labels("L3").inc()
            raise IntegrityError(
                f"{tw.model} {tw.version}: downloaded sha256 {sha_actual[:12]}… does not match the "
                f"catalog's {tw.sha256[:12]}…; nothing cached"
            )
        obj = L2Object(
            tw.sha256,
            self.object_path(tw.sha256),
            tw.size,
            self.chunk_bytes,
            tuple(digests),
            tw.model,
            tw.version,
        )
        obj.path.parent.mkdir(parents=True, exist_ok=True)
        with self._index_lock:
            tw.path.replace(obj.path)
            _fsync_dir(obj.path.parent)
            entries = self._read_index()
            entries[obj.sha256] = obj.to_index()
            self._write_index(entries)
        self.cache.commit(tw.sha256, obj)
        return obj

    def abandon(self, tw: TempWrite) -> None:
        tw.close()
        tw.path.unlink(missing_ok=True)
        self.cache.abort(tw.sha256)

    def _release(self, sha: str, obj: L2Object | None) -> None:
        if obj is None:
            return  # an aborted reservation: no file was published
        with self._index_lock:
            entries = self._read_index()
            if entries.pop(sha, None) is not None:
                self._write_index(entries)
            obj.path.unlink(missing_ok=True)

    # -- maintenance

    def verify_all(self) -> list[VerifyResult]:
        """Re-hash every object with sha256; a mismatch is evicted (the next load re-fetches it)."""
        results = []
        for entry in self.cache.snapshot():
            obj = entry.value
            if obj is None or not entry.ready:
                continue
            digest = hashlib.sha256()
            try:
                with open(obj.path, "rb") as f:
                    while block := f.read(8 * 2**20):
                        digest.update(block)
            except OSError as exc:
                results.append(VerifyResult(obj.sha256, obj.model, False, f"unreadable: {exc.strerror}"))
                self.discard(obj.sha256, "integrity")
                continue
            ok = digest.hexdigest() == obj.sha256
            if not ok:
                _metrics.INTEGRITY_FAILURES.labels("L2").inc()
                self.discard(obj.sha256, "integrity")
            results.append(VerifyResult(obj.sha256, obj.model, ok, "" if ok else "sha256 mismatch: evicted"))
        return results


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # evicted by another process meanwhile: the read will say so
        os.utime(path)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
