"""``file://`` objects: embedded mode and tests, through the same ranged reads as S3."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from executor._stores.base import PIECE, ObjectStore, OnPiece
from prewarm import ObjectStoreError

__all__ = ["FileStore"]


class FileStore(ObjectStore):
    """``file:///abs/path``: embedded mode and tests; the same ranged reads as S3."""

    scheme = "file"

    @staticmethod
    def path(uri: str) -> Path:
        parsed = urlparse(uri)
        if parsed.scheme != "file":
            raise ObjectStoreError(f"not a file:// uri: {uri}")
        return Path(unquote(parsed.path))

    def size(self, uri: str) -> int:
        try:
            return self.path(uri).stat().st_size
        except OSError as exc:
            raise ObjectStoreError(f"file store: cannot stat {uri}: {exc.strerror}") from exc

    def list_prefix(self, uri: str) -> list[tuple[str, int]]:
        root = self.path(uri)
        if not root.is_dir():
            return []  # a file, or nothing: like an S3 prefix with no objects under it
        found = []
        try:
            for dirpath, _, names in os.walk(root):
                for name in names:
                    path = Path(dirpath) / name
                    found.append((path.relative_to(root).as_posix(), path.stat().st_size))
        except OSError as exc:
            raise ObjectStoreError(f"file store: cannot list {uri}: {exc.strerror}") from exc
        return sorted(found)

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        try:
            fd = os.open(self.path(uri), os.O_RDONLY)
        except OSError as exc:
            raise ObjectStoreError(f"file store: cannot open {uri}: {exc.strerror}") from exc
        try:
            done = 0
            while done < len(dest):
                n = os.preadv(fd, [dest[done : done + PIECE]], start + done)
                if n <= 0:
                    raise ObjectStoreError(f"file store: {uri} is shorter than {start + len(dest)} bytes")
                if on_piece is not None:
                    on_piece(done, done + n)
                done += n
        finally:
            os.close(fd)

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        try:
            fd = os.open(self.path(uri), os.O_RDONLY)
        except OSError as exc:
            raise ObjectStoreError(f"file store: cannot open {uri}: {exc.strerror}") from exc
        try:
            data = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
        if len(data) != end - start:
            raise ObjectStoreError(f"file store: {uri} is shorter than {end} bytes")
        return data
