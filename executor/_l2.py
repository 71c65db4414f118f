"""L2: the local disk cache, content-addressed by sha256, crash-safe, verified on every read.

Layout under the cache directory::

    index.json          versioned index: per object its size, model, version and chunk digests
    index.json.lock     guards index rewrites across processes
    objects/ab/<sha256> published files, only ever created by rename
    models/<model>/<version>@<sha16>/   published checkpoint directories (``_l2_dir``)
    tmp/<sha256>.<pid>.part   downloads in progress (never read); ``.dir`` for a checkpoint
    locks/<sha256>.lock one download per object across processes

An object enters by temp → fsync → sha256 checked against the catalog → rename → index, so nothing
partial is ever visible; a checkpoint likewise, each file checked, the directory renamed when all are.
Every use touches the object's mtime: that is the LRU order after a restart
and across processes sharing the directory, which share its byte budget too (``_fit_shared``).

A new copy that must win its place (``weigh``) takes one in a full L2 only if the objects it would
evict served no more requests × bytes on this node lately than it (``prewarm.admits`` over ``used``'s
counts);
otherwise nothing is evicted, and a load on its way to memory streams past L2 while a prefetch or a
demotion into L2 itself fails. The loader weighs every copy but one that must be made (``_hops``).
The counts live in memory: a restarted executor weighs nothing until it has served requests again,
which leaves plain LRU meanwhile.

While an object is written, per-chunk xxh3 digests are recorded; every later read
checks the chunk it just read, on the reading thread, so a flipped byte is caught on the next load at
the cost of hashing at ~10 GB/s, not of re-reading the file. ``verify_all`` re-hashes everything.

A full or failing disk does not stop loads (``_l2_faults``): the budget is capped at what the filesystem
can hold (``DiskBudget``, asked again before every download), a directory that cannot be used at all
leaves L2 empty with a budget of 0, and a download L2 cannot take is left to the caller to stream past
it; an L2 write that fails leaves no file behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from executor import _metrics
from executor._l2_dir import (
    CHECKPOINTS,
    CheckpointWrite,
    checkpoint_dir,
    checkpoint_dirs,
    fsync_dir,
    remove_tree,
    tree_size,
)
from executor._l2_faults import Bypasses, DiskBudget, disk_fault
from executor._l2_io import (
    ChunkDigester,
    L2File,
    L2Object,
    L2Reader,
    PartWrite,
    TempWrite,
    VerifyResult,
    write_at,
)
from executor._tier import TierCache
from prewarm import CapacityError, IntegrityError, StorageError, Tier, UseCounts, admits, get_logger

__all__ = [
    "INDEX_VERSION",
    "CheckpointWrite",
    "ChunkDigester",
    "L2Cache",
    "L2File",
    "L2Object",
    "L2Reader",
    "PartWrite",
    "TempWrite",
    "VerifyResult",
]

log = get_logger(__name__)
# 2: entries may be checkpoint directories. An index of version 1 (single files only) is read as is.
INDEX_VERSION = 2
_READABLE = (1, 2)


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
        self._index_path = self.root / "index.json"
        self._index_lock = FileLock(str(self.root / "index.json.lock"))
        self.budget = DiskBudget(self.root, capacity)
        self.bypasses = Bypasses(self.root)
        self.cache: TierCache[str, L2Object] = TierCache(
            Tier.L2, capacity, clock=clock, release=self._release
        )
        self._clock = clock
        self._uses: UseCounts[str] = UseCounts()  # by sha256: requests this node served per object
        self._uses_lock = threading.Lock()
        # Why the directory cannot be used at all (None: it can). The node still serves: loads stream
        # past L2, which stays empty with a budget of 0, until the executor is restarted on a good disk.
        self.fault: OSError | None = None
        try:
            for sub in ("objects", "tmp", "locks"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            self._load()
        except OSError as exc:
            if disk_fault(exc) is None:
                raise
            self.fault = exc
            self.cache.capacity = self.budget.unusable()
            log.error(
                "L2 directory unusable: loads stream from L3 without caching",
                extra={"dir": str(self.root), "error": exc.strerror},
            )
            return
        self._cap_budget()

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
        if data.get("version") not in _READABLE:
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

    def _entry_path(self, sha: str, raw: dict[str, Any]) -> Path:
        """Where an index entry lives: its file, or its checkpoint directory."""
        if "files" in raw:
            return self.root / checkpoint_dir(str(raw["model"]), str(raw["version"]), sha)
        return self.object_path(sha)

    def _object(self, sha: str, raw: dict[str, Any]) -> L2Object:
        members = tuple(L2File.from_index(f) for f in raw["files"]) if "files" in raw else ()
        return L2Object(
            sha256=sha,
            path=self._entry_path(sha, raw),
            size=int(raw["size"]),
            chunk_bytes=int(raw["chunk_bytes"]),
            digests=() if members else tuple(int(d, 16) for d in raw["digests"]),
            model=str(raw.get("model", "")),
            version=str(raw.get("version", "")),
            name=str(raw.get("name", "")),
            members=members,
        )

    @staticmethod
    def intact(obj: L2Object) -> bool:
        """Every file there at its size (a stat each): what a restart, or a use of a directory, checks."""
        try:
            return all(path.stat().st_size == size for _, path, size in obj.files())
        except OSError:
            return False

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
                if self.intact(obj):
                    kept[sha] = raw
            on_disk = {p.name: p for p in (self.root / "objects").glob("*/*") if p.is_file()}
            for name, path in on_disk.items():
                if name not in kept:
                    # Renamed but never indexed (a crash in between): unverifiable, so gone.
                    path.unlink(missing_ok=True)
            indexed = {self._entry_path(sha, raw) for sha, raw in kept.items() if "files" in raw}
            for path in checkpoint_dirs(self.root / CHECKPOINTS):
                if path not in indexed:
                    remove_tree(path, self.root / CHECKPOINTS)  # the same, for a checkpoint directory
            if kept != entries:
                self._write_index(kept)
        for part in [*(self.root / "tmp").glob("*.part"), *(self.root / "tmp").glob("*.dir")]:
            lock = FileLock(str(self.root / "locks" / f"{part.name.split('.')[0]}.lock"))
            try:
                with lock.acquire(timeout=0):
                    self._remove(part)  # nobody is writing it: a crashed download
            except Timeout:
                pass
        # Least recently used first (file mtime, touched on every use), so LRU order survives a restart.
        ordered = sorted(kept.items(), key=lambda kv: _mtime(self._entry_path(*kv)))
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
        if self.fault is not None:
            return None
        try:
            with self._index_lock:
                raw = self._read_index().get(sha)
        except OSError:
            return None  # a disk that refuses even the lock file: as good as absent (the load says why)
        if raw is None:
            return None
        obj = self._object(sha, raw)
        if not self.intact(obj):
            return None
        self._adopt(obj)
        return obj

    # -- reading

    def lookup(self, sha: str) -> L2Object | None:
        obj = self.cache.lookup(sha)
        if obj is not None and obj.members and not self.intact(obj):
            # An engine may be pointed at the directory as it is, so a file cut short there (or removed)
            # is looked for on every use, not only when the bytes are read: the entry goes, and the
            # caller fetches it again.
            log.warning(
                "L2 checkpoint damaged, re-fetching", extra={"model": obj.model, "dir": str(obj.path)}
            )
            _metrics.INTEGRITY_FAILURES.labels("L2").inc()
            self.discard(sha, "integrity")
            return None
        if obj is not None:
            _touch(obj.path)
        return obj

    def used(self, sha: str) -> None:
        """The node is serving a request for the model whose weights are ``sha``, from whichever tier: it
        counts for admission. Called before the request's load, which the count weighs (``touch`` after)."""
        with self._uses_lock:
            self._uses.use(sha, self._clock())

    def touch(self, sha: str) -> None:
        """A request was served from whichever tier: the copy here, if there is one (the load may just
        have made it), becomes the most recently used and is reported used (``last_used``), which the
        planner reads to tell a disk copy a request used from one staged on a guess and never read. The
        file's mtime, the order across processes and restarts, moves only when the copy is read."""
        self.cache.lookup(sha, use=True)

    def admits(self, sha: str, nbytes: int) -> Callable[[list[tuple[str, int]]], bool]:
        """Whether a new copy of the weights ``sha`` (``nbytes``) is worth dropping the copies of the
        weights it is asked with, each with its bytes (``prewarm.admits``, on this node's use counts); L1
        asks it too, by its entries' sha256."""

        def worth(victims: list[tuple[str, int]]) -> bool:
            with self._uses_lock:
                return admits(sha, nbytes, victims, self._uses, self._clock())

        return worth

    def pin(self, sha: str) -> L2Object | None:
        return self.cache.pin(sha)

    def unpin(self, sha: str) -> None:
        self.cache.unpin(sha)

    def discard(self, sha: str, reason: str) -> None:
        self.cache.evict(sha, reason)

    # -- writing

    @contextlib.contextmanager
    def download_lock(self, sha: str) -> Iterator[None]:
        """One download of an object across processes (threads are coalesced by the executor).

        Where the disk refuses even the lock file (read-only, full, failing, gone), the caller goes on
        without it: whatever it then writes to L2 fails the same way and the load streams past L2,
        so there is no download of this object to coordinate."""
        lock = FileLock(str(self.root / "locks" / f"{sha}.lock"))
        try:
            lock.acquire()
        except OSError as exc:
            if disk_fault(exc) is None:
                raise
            yield
            return
        try:
            yield
        finally:
            lock.release()

    def begin(
        self, sha: str, size: int, *, model: str, version: str, name: str = "", weigh: bool = False
    ) -> TempWrite:
        """Reserve ``size`` bytes and open a temp file that nobody will ever read as an object.

        ``CapacityError`` when the budget (capped at what the disk holds) cannot take it, or (``weigh``)
        when the objects it would evict served more requests × bytes lately (``NotAdmitted``);
        ``StorageError`` when the disk refuses. Either way nothing is left behind, and ``disk_fault``
        names the cause."""
        self._usable()
        self.cache.reserve(sha, size, admit=self.admits(sha, size) if weigh else None)
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
        tw = TempWrite(sha, size, path, fd, model, version, direct_fd, name=name)
        try:
            self._fit_shared()
        except OSError as exc:
            self.abandon(tw)
            raise StorageError(f"L2: {self.root} refused the index or an eviction: {exc.strerror}") from exc
        except BaseException:
            self.abandon(tw)
            raise
        return tw

    def _usable(self) -> None:
        """Refuse a download into a directory that cannot be used; cap the budget at the disk."""
        if self.fault is not None:
            raise StorageError(f"L2: {self.root} is unusable: {self.fault.strerror}") from self.fault
        try:
            self._cap_budget()
        except OSError as exc:
            raise StorageError(f"L2: {self.root} refused its index: {exc.strerror}") from exc

    def check_budget(self) -> int:
        """The effective budget now (what the state report says), the free space asked again."""
        if self.fault is None:
            with contextlib.suppress(OSError):  # a disk that refuses the index keeps the last figure
                self._cap_budget()
        return self.cache.capacity

    def _cap_budget(self) -> None:
        """Account against no more than the filesystem can hold: free space plus what the cache's files
        occupy there (every indexed entry, and what downloads in progress have written so far: a temp
        file is sparse until its bytes land, so the rest of it is still counted as free)."""
        with self._index_lock:
            held = sum(int(raw.get("size", 0)) for raw in self._read_index().values())
        held += sum(_allocated(p) for p in (self.root / "tmp").glob("*.part"))
        held += sum(tree_size(p, allocated=True) for p in (self.root / "tmp").glob("*.dir"))
        self.cache.capacity = self.budget.effective(held)

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
            used += sum(tree_size(p) for p in (self.root / "tmp").glob("*.dir"))
            excess = used - self.cache.capacity
            if excess > 0:
                lru = sorted((_mtime(self._entry_path(s, r)), s) for s, r in entries.items() if s not in busy)
                for _, sha in lru:
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
                self._remove(self._entry_path(sha, entries.pop(sha)))
            if victims:
                self._write_index(entries)
        gone = victims + [e.key for e in self.cache.snapshot() if e.ready and e.key not in entries]
        for sha in gone:
            self.cache.evict(sha, "capacity")  # the index no longer names it: nothing left to release

    def write(self, tw: TempWrite, offset: int, data: memoryview | bytes) -> None:
        write_at(tw, offset, data)

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
            self.abandon(tw)  # publish is called with the download lock held: abandon is safe here
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
            tw.name,
        )

        def rename() -> None:
            obj.path.parent.mkdir(parents=True, exist_ok=True)
            tw.path.replace(obj.path)

        return self._install(obj, rename, lambda: self.abandon(tw))

    def abandon(self, tw: TempWrite) -> None:
        tw.close()
        with contextlib.suppress(OSError):  # a failing disk may refuse this too: the next start cleans
            tw.path.unlink(missing_ok=True)
        self.cache.abort(tw.sha256)

    # -- checkpoint directories

    def begin_checkpoint(
        self, sha: str, files: list[tuple[str, int, str]], *, model: str, version: str, weigh: bool = False
    ) -> CheckpointWrite:
        """Reserve every file's bytes and make the temporary directory they will be written into
        (``weigh``: as for ``begin``)."""
        size = sum(f[1] for f in files)
        self._usable()
        self.cache.reserve(sha, size, admit=self.admits(sha, size) if weigh else None)
        cw = CheckpointWrite(
            sha256=sha,
            size=size,
            directory=self.root / "tmp" / f"{sha}.{os.getpid()}.dir",
            model=model,
            version=version,
            files=files,
            chunk_bytes=self.chunk_bytes,
            direct_io=self.direct_io,
        )
        try:
            cw.create()
            self._fit_shared()
        except OSError as exc:
            self.abandon_checkpoint(cw)
            raise StorageError(f"L2: {self.root} refused the index or an eviction: {exc.strerror}") from exc
        except BaseException:
            self.abandon_checkpoint(cw)
            raise
        return cw

    def publish_checkpoint(self, cw: CheckpointWrite) -> L2Object:
        """Every file is verified: rename the directory into place and index it."""
        try:
            members = cw.members()
            cw.sync()
        except BaseException:
            self.abandon_checkpoint(cw)
            raise
        obj = L2Object(
            cw.sha256,
            self.root / checkpoint_dir(cw.model, cw.version, cw.sha256),
            cw.size,
            self.chunk_bytes,
            (),
            cw.model,
            cw.version,
            members=members,
        )

        def rename() -> None:
            if obj.path.exists():
                remove_tree(obj.path, self.root / CHECKPOINTS)  # unindexed leftovers of a crash
            obj.path.parent.mkdir(parents=True, exist_ok=True)
            cw.directory.replace(obj.path)

        return self._install(obj, rename, lambda: self.abandon_checkpoint(cw))

    def _install(self, obj: L2Object, rename: Callable[[], None], abandon: Callable[[], None]) -> L2Object:
        """Put a verified download (file or directory) in place with ``rename`` and index it, under the
        index lock: a copy renamed but not indexed is removed again (it is not an object), and on any
        disk error the download is ``abandon``ed and a ``StorageError`` raised."""
        try:
            with self._index_lock:
                rename()
                try:
                    fsync_dir(obj.path.parent)
                    entries = self._read_index()
                    entries[obj.sha256] = obj.to_index()
                    self._write_index(entries)
                except OSError:
                    self._remove(obj.path)
                    raise
        except OSError as exc:
            abandon()
            raise StorageError(f"L2: publishing {obj.path} failed: {exc.strerror}") from exc
        self.cache.commit(obj.sha256, obj)
        self.bypasses.recovered()
        return obj

    def abandon_checkpoint(self, cw: CheckpointWrite) -> None:
        remove_tree(cw.directory, cw.directory.parent)
        self.cache.abort(cw.sha256)

    def _remove(self, path: Path) -> None:
        """Delete a published object or directory, or a download's leftovers."""
        if path.is_dir():
            remove_tree(path, self.root / CHECKPOINTS)  # its empty parents go too, up to models/
        else:
            path.unlink(missing_ok=True)

    def _release(self, sha: str, obj: L2Object | None) -> None:
        if obj is None:
            return  # an aborted reservation: no file was published
        try:
            with self._index_lock:
                entries = self._read_index()
                if entries.pop(sha, None) is not None:
                    self._write_index(entries)
                self._remove(obj.path)
        except OSError as exc:
            # A failing or read-only disk: the entry leaves the accounting all the same; what is left
            # on disk is indexed and intact (adopted again at start) or not (deleted at start).
            log.warning(
                "L2: could not remove an evicted entry", extra={"path": str(obj.path), "error": str(exc)}
            )

    # -- maintenance

    def verify_all(self) -> list[VerifyResult]:
        """Re-hash every object with sha256; a mismatch is evicted (the next load re-fetches it)."""
        results = []
        for entry in self.cache.snapshot():
            obj = entry.value
            if obj is None or not entry.ready:
                continue
            expected = {m.path: m.sha256 for m in obj.members} if obj.members else {"": obj.sha256}
            bad = []
            try:
                for rel, path, _ in obj.files():
                    if _sha256_of(path) != expected[rel if obj.members else ""]:
                        bad.append(rel)
            except OSError as exc:
                results.append(VerifyResult(obj.sha256, obj.model, False, f"unreadable: {exc.strerror}"))
                self.discard(obj.sha256, "integrity")
                continue
            if bad:
                _metrics.INTEGRITY_FAILURES.labels("L2").inc()
                self.discard(obj.sha256, "integrity")
            where = f" ({', '.join(bad)})" if obj.members else ""
            results.append(
                VerifyResult(
                    obj.sha256, obj.model, not bad, f"sha256 mismatch{where}: evicted" if bad else ""
                )
            )
        return results


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * 2**20):
            digest.update(block)
    return digest.hexdigest()


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # evicted by another process meanwhile: the read will say so
        os.utime(path)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _allocated(path: Path) -> int:
    """Bytes a (possibly sparse) file occupies on its filesystem."""
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
