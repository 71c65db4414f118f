"""``Weights``: what ``open_weights`` yields, a model's tensors by name, with the lease that holds them."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import torch

from prewarm_client._protocol import ProtocolError, recv_message, send_message

__all__ = ["Weights"]


class Weights(Mapping[str, torch.Tensor]):
    """A model's tensors by name, and where they came from. Close it (or leave its ``with``) to end the
    lease; the tensors stay valid afterwards (the mapping lives as long as they do), but the executor
    no longer holds the copy for you."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        *,
        model: str,
        source: str,
        version: str | None = None,
        sha256: str | None = None,
        lease: str | None = None,
        served_from: str | None = None,
        wait_s: float | None = None,
        small_file: Any = None,
        connection: socket.socket | None = None,
    ) -> None:
        self._tensors = tensors
        self.model = model
        self.source = source  # "executor" (the shared block) or "files" (the fallback)
        self.version = version
        self.sha256 = sha256
        self.lease = lease
        self.served_from = served_from  # the tier the executor had it in when asked
        self.wait_s = wait_s
        self._small_file = small_file
        self._connection = connection

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def read_file(self, path: str) -> bytes | None:
        """A small file of the entry (``config.json``, tokenizer files): from the block, or the fallback
        directory; None when the entry has none of that name."""
        data: bytes | None = self._small_file(path) if self._small_file else None
        return data

    @property
    def leased(self) -> bool:
        return self._connection is not None

    def close(self) -> None:
        """End the lease (idempotent)."""
        sock, self._connection = self._connection, None
        if sock is None:
            return
        with contextlib.suppress(OSError, ProtocolError):
            send_message(sock, {"op": "close", "lease": self.lease})
            recv_message(sock)
        sock.close()

    def __enter__(self) -> Weights:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
