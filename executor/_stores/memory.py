"""One object already in host or device memory, served as a store so a demotion reuses the download path."""

from __future__ import annotations

from typing import Protocol

import torch

from executor._stores.base import PIECE, ObjectStore, OnPiece

__all__ = ["FlatBytes", "MemoryStore"]


class FlatBytes(Protocol):
    """A flat uint8 tensor, or what slices like one (an L0 copy held across GPUs, gathered)."""

    def numel(self) -> int: ...

    def __getitem__(self, index: slice) -> torch.Tensor: ...


class MemoryStore(ObjectStore):
    """One object already in memory (an L1 block, or an L0 buffer on any device), so a demotion to L2
    reuses the verified L3 → L2 write path (temp file, digests, sha256 check, rename) without touching
    the network. Given the object's own memory as the destination (an L1 block), nothing is copied."""

    scheme = "memory"

    def __init__(self, buffer: FlatBytes) -> None:
        self._buffer = buffer  # flat uint8, the object's bytes

    def size(self, uri: str) -> int:
        return self._buffer.numel()

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        return bytes(self._buffer[start:end].cpu().numpy())

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        out = torch.frombuffer(dest, dtype=torch.uint8)
        source = self._buffer[start : start + len(dest)]
        if out.data_ptr() != source.data_ptr():
            out.copy_(source)  # device to host when the object is in device memory
        if on_piece is not None:
            for a in range(0, len(dest), PIECE):
                on_piece(a, min(a + PIECE, len(dest)))
