"""``open_weights``: a model's tensors from the node's executor, mapped from its shared L1, or from files.

    with open_weights("llama-8b", version="3", sha256=digest) as weights:   # leased while open
        model.load_state_dict(weights, assign=True)

The executor answers on ``<socket_dir>/prewarm.sock`` with the model's block (a memfd, passed over the
socket) and a lease; the block is mapped read-only and shared, and every tensor is a view of the
mapping: nothing is copied on the CPU, and the process reads no weight bytes from disk. The lease holds
the copy in the executor's L1 until ``close`` (or until this process dies). ``device="cuda[:N]"``
copies every tensor to that device (from the mapping pinned for the copy where CUDA allows it).

With no executor reachable and a ``fallback`` (a checkpoint directory or one safetensors file) the
client reads the files itself, as an engine would without prewarm, and logs that once. A refusal (wrong
fingerprint, unknown model) is never papered over by the fallback: it raises ``Refused``.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import socket
from collections.abc import Generator
from pathlib import Path
from typing import Any

import torch

from prewarm_client._device import from_device
from prewarm_client._ipc import MODES
from prewarm_client._protocol import (
    SOCKET_NAME,
    BlockLayout,
    ExecutorUnavailable,
    OpenRequest,
    ProtocolError,
    Refused,
    default_socket_dir,
    recv_message,
    send_message,
)
from prewarm_client._tensors import tensors_in
from prewarm_client._weights import Weights

__all__ = ["Weights", "checkpoint_files", "iter_weights", "open_weights"]

log = logging.getLogger("prewarm_client")
_CONNECT_TIMEOUT_S = 5.0
_INDEX = "model.safetensors.index.json"
_warned_fallback: set[str] = set()


def open_weights(
    model_id: str,
    *,
    version: str | None = None,
    sha256: str | None = None,
    device: str = "cpu",
    socket_dir: str | os.PathLike[str] | None = None,
    fallback: str | os.PathLike[str] | None = None,
    load: bool = True,
    rank: int | None = None,
    mode: str | None = None,
) -> Weights:
    """The model's tensors, leased from the executor (see the module docstring). Use it as a context
    manager. ``load=False``: refuse rather than wait for a model the executor does not hold (in L1, or
    in L0 with a ``mode``). ``rank``: this engine is that rank of a model the node holds across GPUs,
    and gets its shard's tensors alone. ``mode`` (CUDA): take the executor's L0 copy over CUDA IPC
    instead of its L1 block, ``"share"`` (map it: no copy; leased while open) or ``"copy"`` (clone it
    into this process's memory, after which the executor frees its copy; nothing stays leased)."""
    if mode is not None and (mode not in MODES or not device.startswith("cuda")):
        raise ValueError(f"mode is share or copy, for a cuda device (not mode={mode!r}, device={device!r})")
    request = OpenRequest(model_id, version, sha256, device, rank, mode, load)
    try:
        sock = _connect(Path(socket_dir) if socket_dir is not None else default_socket_dir())
    except ExecutorUnavailable as exc:
        if fallback is None:
            raise
        path = Path(fallback)
        if str(path) not in _warned_fallback:
            _warned_fallback.add(str(path))
            log.warning("no prewarm executor (%s): reading %s from %s", exc, model_id, path)
        return _from_files(model_id, path, device)
    try:
        if mode is not None:
            return from_device(sock, request)
        return _from_executor(sock, request)
    except BaseException:
        sock.close()
        raise


def iter_weights(model_id: str, **options: Any) -> Generator[tuple[str, torch.Tensor], None, None]:
    """``(name, tensor)`` in file order, as engines that stream weights consume them (vLLM's
    ``load_weights``); the lease is held until the iterator is exhausted or closed. Takes the same
    options as ``open_weights``; tensors are CPU views unless ``device`` says otherwise."""
    with open_weights(model_id, **options) as weights:
        yield from weights.items()


def _connect(socket_dir: Path) -> socket.socket:
    path = socket_dir / SOCKET_NAME
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(_CONNECT_TIMEOUT_S)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError, PermissionError) as exc:
        sock.close()
        raise ExecutorUnavailable(f"{path}: {exc.strerror or exc}") from exc
    except OSError:
        sock.close()
        raise
    sock.settimeout(None)  # an open may wait for a load from disk or object storage
    return sock


def _from_executor(sock: socket.socket, request: OpenRequest) -> Weights:
    send_message(sock, request.to_json())
    received = recv_message(sock)
    if received is None:
        raise ExecutorUnavailable("the executor closed the connection before answering")
    reply, fds = received
    if not reply.get("ok"):
        for fd in fds:
            os.close(fd)
        raise Refused(str(reply.get("error", "refused")), str(reply.get("reason", "refused")))
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ProtocolError(f"an open reply carries one memfd, not {len(fds)}")
    layout = BlockLayout.from_json(reply.get("layout"))
    try:
        if os.fstat(fds[0]).st_size < layout.size:
            raise ProtocolError("the block is smaller than its layout")
        # MAP_POPULATE: the page tables are filled now, in one pass, so every tensor is usable at once.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        block = mmap.mmap(fds[0], layout.size, flags=flags, prot=mmap.PROT_READ)
    finally:
        os.close(fds[0])  # the mapping keeps the memory; the fd is not needed any more
    tensors: dict[str, torch.Tensor] = {}
    shard = reply.get("shard")
    within = (int(shard[0]), int(shard[1])) if shard is not None else None
    for f in layout.weight_files:
        tensors.update(tensors_in(block, f.offset, f.length, name=f.path, within=within))
    if request.device != "cpu":
        tensors = _to_device(tensors, block, request.device)

    def small_file(path: str) -> bytes | None:
        f = layout.file(path)
        return None if f is None else block[f.offset : f.offset + f.length]

    return Weights(
        tensors,
        model=request.model,
        source="executor",
        version=reply.get("version"),
        sha256=reply.get("sha256"),
        lease=reply.get("lease"),
        served_from=reply.get("served_from"),
        wait_s=reply.get("wait_s"),
        small_file=small_file,
        connection=sock,
    )


def _to_device(tensors: dict[str, torch.Tensor], block: mmap.mmap, device: str) -> dict[str, torch.Tensor]:
    """Copy every tensor to ``device``; from the mapping registered with CUDA (read-only, pinned for the
    copy) when the driver allows it, so the copies run at the link's rate; pageable copies otherwise."""
    base = torch.frombuffer(block, dtype=torch.uint8) if len(block) else None
    registered = False
    cudart: Any = None
    if base is not None and torch.cuda.is_available():
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        read_only = 8  # cudaHostRegisterReadOnly: the mapping is PROT_READ
        registered = int(cudart.cudaHostRegister(base.data_ptr(), base.numel(), read_only)) == 0
    try:
        out = {name: t.to(device, non_blocking=registered) for name, t in tensors.items()}
        if registered:
            torch.cuda.synchronize(device)
        return out
    finally:
        if registered:
            cudart.cudaHostUnregister(base.data_ptr())  # type: ignore[union-attr]


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory in load order (the index's order, else sorted),
    or ``[path]`` for a single file."""
    if path.is_file():
        return [path]
    index = path / _INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in dict.fromkeys(weight_map.values())]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no safetensors files")
    return files


def _from_files(model_id: str, path: Path, device: str) -> Weights:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(path):
        tensors.update(load_file(str(file), device=device))
    root = path if path.is_dir() else path.parent

    def small_file(name: str) -> bytes | None:
        candidate = root / name
        return candidate.read_bytes() if candidate.is_file() else None

    return Weights(tensors, model=model_id, source="files", small_file=small_file)
