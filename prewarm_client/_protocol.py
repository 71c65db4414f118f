"""The hand-off protocol between an executor and the engine processes of its node, in one place.

Both sides import this module: the executor serves it, ``open_weights`` speaks it. It is deliberately
small and versioned (``"v": 1`` in every message):

* Transport: a ``SOCK_SEQPACKET`` Unix socket ``<socket_dir>/prewarm.sock``, so every message is one
  packet (no framing to get wrong) and a peer that dies is an end of file. The directory is 0700 and the
  socket 0600; the executor also checks the peer's uid with ``SO_PEERCRED``.
* Messages: one JSON object per packet. A reply that hands over shared memory carries the memfd in the
  same packet as ``SCM_RIGHTS`` ancillary data (read-only: the executor reopens it ``O_RDONLY``).
* ``{"op": "open", "model", "version"?, "sha256"?, "device", "rank"?, "mode"?, "load"?}`` →
  ``{"ok": true, "lease", "layout", "version", "sha256", "served_from", "wait_s"}`` + one fd, or
  ``{"ok": false, "error", "reason"}``. ``version``/``sha256`` are the fingerprint the executor checks
  against what it holds; ``load: false`` asks it not to load a model that is not in L1 yet.
* ``{"op": "close", "lease"}`` → ``{"ok": true}``. Closing the connection ends every lease it holds.

A block (``BlockLayout``) holds every file of a model's entry at 4096-aligned offsets: the safetensors
files in load order, then the small files an engine needs to start (``config.json``, tokenizer files).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ALIGN",
    "ENV_SOCKET_DIR",
    "MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "SOCKET_NAME",
    "BlockLayout",
    "ExecutorUnavailable",
    "FileSlice",
    "HandoffError",
    "OpenRequest",
    "ProtocolError",
    "Refused",
    "default_socket_dir",
    "recv_message",
    "send_message",
]

PROTOCOL_VERSION = 1
SOCKET_NAME = "prewarm.sock"
ENV_SOCKET_DIR = "PREWARM_SOCKET_DIR"
ALIGN = 4096
# A layout lists a few dozen files; anything near this is not a message of ours.
MAX_MESSAGE_BYTES = 128 * 1024
_MAX_FDS = 4


class HandoffError(Exception):
    """Base of the client's errors (the client cannot use the spine's tree: it imports nothing of ours)."""


class ExecutorUnavailable(HandoffError, ConnectionError):
    """No executor answers on the socket (not running, or no socket directory)."""


class Refused(HandoffError):
    """The executor answered and said no: unknown model, wrong fingerprint, no room, another uid."""

    def __init__(self, message: str, reason: str = "refused") -> None:
        super().__init__(message)
        self.reason = reason


class ProtocolError(HandoffError, ValueError):
    """A message that is not what this protocol version says (a bug or a version skew)."""


@dataclass(frozen=True)
class FileSlice:
    """One file of an entry inside a block: ``path`` relative to the entry's root."""

    path: str
    offset: int
    length: int


@dataclass(frozen=True)
class BlockLayout:
    files: tuple[FileSlice, ...]
    size: int

    @classmethod
    def pack(cls, files: Iterable[tuple[str, int]], align: int = ALIGN) -> BlockLayout:
        """Place ``(path, length)`` files one after the other, each at an ``align``-ed offset."""
        slices: list[FileSlice] = []
        cursor = 0
        for path, length in files:
            slices.append(FileSlice(path, cursor, length))
            cursor += -(-max(length, 1) // align) * align
        return cls(tuple(slices), cursor)

    def file(self, path: str) -> FileSlice | None:
        return next((f for f in self.files if f.path == path), None)

    @property
    def weight_files(self) -> tuple[FileSlice, ...]:
        return tuple(f for f in self.files if f.path.endswith(".safetensors"))

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "files": [[f.path, f.offset, f.length] for f in self.files]}

    @classmethod
    def from_json(cls, data: Any) -> BlockLayout:
        try:
            size = int(data["size"])
            files = tuple(FileSlice(str(p), int(o), int(n)) for p, o, n in data["files"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"bad block layout: {exc}") from exc
        for f in files:
            # The client maps exactly ``size`` bytes: a slice outside it would read past the mapping.
            if f.offset < 0 or f.length < 0 or f.offset + f.length > size or f.offset % ALIGN:
                raise ProtocolError(f"file {f.path!r} at [{f.offset}, +{f.length}) is outside the block")
            if os.path.isabs(f.path) or ".." in Path(f.path).parts:
                raise ProtocolError(f"file path {f.path!r} is not relative to the entry")
        return cls(files, size)


@dataclass(frozen=True)
class OpenRequest:
    model: str
    version: str | None = None
    sha256: str | None = None
    device: str = "cpu"
    rank: int | None = None
    mode: str | None = None  # L0 over CUDA IPC: "share" or "copy"; None = the L1 block
    load: bool = True  # False: refuse instead of loading a model that is not in L1 yet

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"v": PROTOCOL_VERSION, "op": "open", "model": self.model}
        # ``is not None``: rank 0 is a rank.
        names = ("version", "sha256", "rank", "mode")
        body.update({k: getattr(self, k) for k in names if getattr(self, k) is not None})
        body["device"] = self.device
        if not self.load:
            body["load"] = False
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OpenRequest:
        def text(name: str) -> str | None:
            value = data.get(name)
            if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
                raise ProtocolError(f"{name} must be a non-empty string")
            return value

        model = text("model")
        if model is None:
            raise ProtocolError("open needs a model")
        device = text("device") or "cpu"
        if device != "cpu" and not (device == "cuda" or device.startswith("cuda:")):
            raise ProtocolError(f"device must be cpu or cuda[:N], not {device!r}")
        rank = data.get("rank")
        if rank is not None and (type(rank) is not int or rank < 0):
            raise ProtocolError("rank must be a non-negative int")
        mode = text("mode")
        if mode not in (None, "share", "copy"):
            raise ProtocolError(f"mode must be share or copy, not {mode!r}")
        load = data.get("load", True)
        if not isinstance(load, bool):
            raise ProtocolError("load must be true or false")
        return cls(model, text("version"), text("sha256"), device, rank, mode, load)


def default_socket_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$PREWARM_SOCKET_DIR``, else ``$XDG_RUNTIME_DIR/prewarm``, else ``/tmp/prewarm-<uid>``."""
    env = os.environ if env is None else env
    if env.get(ENV_SOCKET_DIR):
        return Path(env[ENV_SOCKET_DIR])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "prewarm"
    return Path(f"/tmp/prewarm-{os.getuid()}")


def send_message(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps({"v": PROTOCOL_VERSION, **message}, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One message and the fds that came with it; None at end of file (the peer closed or died)."""
    data, fds, flags, _addr = socket.recv_fds(sock, MAX_MESSAGE_BYTES + 1, _MAX_FDS)
    if not data and not fds:
        return None
    try:
        if len(data) > MAX_MESSAGE_BYTES or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ProtocolError("message too large")
        message = json.loads(data)
        if not isinstance(message, dict):
            raise ProtocolError("a message is a JSON object")
        if message.get("v") != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {message.get('v')!r}; this side speaks {PROTOCOL_VERSION}")
    except (ProtocolError, ValueError) as exc:
        for fd in fds:
            os.close(fd)
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError(f"message is not JSON: {exc}") from exc
    return message, fds
