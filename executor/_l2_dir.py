"""Checkpoint directories in L2: downloaded file by file into a temporary directory, renamed into place.

    tmp/<sha256>.<pid>.dir/<path>          files of a checkpoint being downloaded (never read)
    models/<model>/<version>@<sha16>/      published checkpoints, only ever created by rename

A checkpoint directory is what an engine is pointed at, so it holds the files under their own names.
The ``@<sha16>`` suffix keeps two things apart that ``<model>/<version>/`` alone would mix up: a model id
may contain ``/`` (``org/name``), so ``a`` at version ``b`` and ``a/b`` at any version would share a
directory, and a catalog that changes a version's files in place must not find the old files there.
Neither ``@`` nor a version ever appears in a model id's segments, so no two entries can collide.

Each file is hashed (sha256 and per-chunk xxh3) on its way in and checked against the catalog when it is
complete; the directory is renamed into place only when every file is, so it is complete or absent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from executor import _metrics
from executor._l2_io import L2File, L2Object, TempWrite, write_at
from prewarm import IntegrityError, StorageError

__all__ = [
    "CHECKPOINTS",
    "CheckpointWrite",
    "checkpoint_dir",
    "checkpoint_dirs",
    "fsync_dir",
    "remove_tree",
    "tree_size",
]

CHECKPOINTS = "models"


def checkpoint_dir(model: str, version: str, sha: str) -> str:
    """The directory of a checkpoint, relative to the cache root."""
    return f"{CHECKPOINTS}/{model}/{version}@{sha[:16]}"


def checkpoint_dirs(top: Path) -> list[Path]:
    """Every checkpoint directory under ``top``: the first directory on each path whose name has an
    ``@`` (model id segments never do), not looking inside it (its own subdirectories may)."""
    found = []
    for dirpath, dirnames, _ in os.walk(top):
        for name in [d for d in dirnames if "@" in d]:
            found.append(Path(dirpath) / name)
            dirnames.remove(name)
    return found


class CheckpointWrite:
    """A checkpoint being downloaded: its temporary directory, and a ``TempWrite`` per file.

    It is the write sink ``fetch_l3`` streams each file into (``write``, ``publish``, ``abandon``), so
    a checkpoint's files travel the same verified path as a single file, only to a directory.
    """

    def __init__(
        self,
        *,
        sha256: str,
        size: int,
        directory: Path,
        model: str,
        version: str,
        files: list[tuple[str, int, str]],
        chunk_bytes: int,
        direct_io: bool,
    ) -> None:
        self.sha256, self.size, self.directory = sha256, size, directory
        self.model, self.version = model, version
        self.files = files  # (path, size, sha256) as the catalog lists them
        self.chunk_bytes = chunk_bytes
        self._direct_io = direct_io
        self.done: dict[str, L2File] = {}

    def create(self) -> None:
        """Make the directory with every file at its full size, so the budget check counts it whole."""
        try:
            self.directory.mkdir(parents=True)
            for path, size, _ in self.files:
                target = self.directory / path
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as f:
                    f.truncate(size)
        except OSError as exc:
            raise StorageError(f"L2: cannot create {self.directory}: {exc.strerror}") from exc

    def begin_file(self, path: str) -> TempWrite:
        size, sha = next((s, h) for p, s, h in self.files if p == path)
        target = self.directory / path
        try:
            fd = os.open(target, os.O_WRONLY)
        except OSError as exc:
            raise StorageError(f"L2: cannot open {target}: {exc.strerror}") from exc
        direct_fd = None
        if self._direct_io:
            with contextlib.suppress(OSError):  # tmpfs and some overlay filesystems refuse O_DIRECT
                direct_fd = os.open(target, os.O_WRONLY | os.O_DIRECT)
        return TempWrite(sha, size, target, fd, self.model, self.version, direct_fd)

    # -- the write sink

    def write(self, tw: TempWrite, offset: int, data: memoryview | bytes) -> None:
        write_at(tw, offset, data)

    def publish(self, tw: TempWrite, sha_actual: str, digests: list[int]) -> L2Object:
        """fsync one file and check its sha256; it becomes visible with the directory, not now."""
        path = tw.path.relative_to(self.directory).as_posix()
        try:
            os.ftruncate(tw.fd, tw.size)  # the last O_DIRECT run was rounded up to ALIGN
            os.fsync(tw.fd)
            os.posix_fadvise(tw.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            raise StorageError(f"L2: writing {tw.path} failed: {exc.strerror}") from exc
        finally:
            tw.close()
        if sha_actual != tw.sha256:
            _metrics.INTEGRITY_FAILURES.labels("L3").inc()
            raise IntegrityError(
                f"{self.model} {self.version}: {path} downloaded with sha256 {sha_actual[:12]}…, the "
                f"catalog says {tw.sha256[:12]}…; nothing cached"
            )
        self.done[path] = L2File(path, tw.size, tw.sha256, tuple(digests))
        return L2Object(
            tw.sha256, tw.path, tw.size, self.chunk_bytes, tuple(digests), self.model, self.version, path
        )

    def abandon(self, tw: TempWrite) -> None:
        tw.close()  # the whole directory goes when the caller abandons the checkpoint

    # -- the whole

    def members(self) -> tuple[L2File, ...]:
        missing = [p for p, _, _ in self.files if p not in self.done]
        if missing:
            raise StorageError(f"L2: {self.model} {self.version}: files not downloaded: {', '.join(missing)}")
        return tuple(self.done[p] for p, _, _ in sorted(self.files))

    def sync(self) -> None:
        """fsync every directory of the tree, so the renames inside it survive a crash."""
        for dirpath, _, _ in os.walk(self.directory):
            fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: Path, stop: Path) -> None:
    """Remove a checkpoint directory, then its parents up to ``stop`` while they are empty."""
    shutil.rmtree(path, ignore_errors=True)
    parent = path.parent
    while parent != stop and stop in parent.parents:
        try:
            parent.rmdir()
        except OSError:
            break  # not empty: another version or model lives there
        parent = parent.parent


def tree_size(path: Path, *, allocated: bool = False) -> int:
    """Bytes of the files under ``path`` (0 when it is gone); ``allocated``: the bytes they occupy on the
    filesystem instead (less for a sparse file whose bytes have not all landed)."""
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = (Path(dirpath) / name).stat()
                total += st.st_blocks * 512 if allocated else st.st_size
    return total
