"""``open_weights(..., mode=...)``: a model's tensors from the executor's L0, over CUDA IPC.

    with open_weights("llama-8b", device="cuda", mode="share") as weights:  # the executor's memory
        model.load_state_dict(weights, assign=True)
    weights = open_weights("llama-8b", device="cuda", mode="copy", rank=1)  # rank 1's shard, cloned

The reply names each shard handed over (``prewarm_client._ipc``) and passes the tensor table as a
memfd. ``share``: every tensor is a view of the executor's memory, mapped into this process (no copy);
the lease holds the copy in the executor's L0 until ``close`` or this process's exit. ``copy``: each
shard is cloned into this process's memory on the same GPU (one device-to-device copy per shard, as
aligned as in the executor), the mapping is dropped, and the close tells the executor it may free its
copy: the model has moved into the engine, and nothing stays leased. A copy-mode engine that dies
before it says so leaves the executor's copy where it was.
"""

from __future__ import annotations

import os
import socket

import torch

from prewarm_client._ipc import DeviceShard, TensorTable, import_shard, tensors_from_table
from prewarm_client._protocol import (
    ExecutorUnavailable,
    OpenRequest,
    ProtocolError,
    Refused,
    recv_message,
    send_message,
)
from prewarm_client._weights import Weights

__all__ = ["from_device"]

_ALIGN = 256  # a shard's copy starts at the same offset modulo this as its bytes in the model


def _read_table(fd: int, length: int) -> bytes:
    chunks, offset = [], 0
    while offset < length:
        chunk = os.pread(fd, length - offset, offset)
        if not chunk:
            raise ProtocolError("the tensor table is shorter than the reply says")
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _clone(base: torch.Tensor, shard: DeviceShard) -> torch.Tensor:
    lead = shard.start % _ALIGN
    own = torch.empty(lead + base.numel(), dtype=torch.uint8, device=base.device)[lead:]
    own.copy_(base)
    return own


def from_device(sock: socket.socket, request: OpenRequest) -> Weights:
    """Send ``request`` (with a mode) and build the tensors from the reply; see the module docstring."""
    send_message(sock, request.to_json())
    received = recv_message(sock)
    if received is None:
        raise ExecutorUnavailable("the executor closed the connection before answering")
    reply, fds = received
    try:
        if not reply.get("ok"):
            raise Refused(str(reply.get("error", "refused")), str(reply.get("reason", "refused")))
        if len(fds) != 1:
            raise ProtocolError(f"an L0 reply carries one memfd (the tensor table), not {len(fds)}")
        try:
            shards = [DeviceShard.from_json(s) for s in reply["shards"]]
            table_bytes = int(reply["table_bytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"bad L0 reply: {exc}") from exc
        if any(s.ipc is None for s in shards):
            raise ProtocolError("an L0 reply without CUDA IPC handles")
        table = TensorTable.from_bytes(
            _read_table(fds[0], table_bytes), {s.rank: s.end - s.start for s in shards}
        )
    finally:
        for fd in fds:
            os.close(fd)
    mode = request.mode
    lease = reply.get("lease")
    mapped = {s.rank: import_shard(s.ipc) for s in shards if s.ipc is not None}
    if mode == "copy":
        bases = {s.rank: _clone(mapped[s.rank], s) for s in shards}
        for base in bases.values():
            torch.cuda.synchronize(base.device)
        mapped.clear()  # the executor's memory is let go here; it may free it after the close
        send_message(sock, {"op": "close", "lease": lease, "copied": True})
        recv_message(sock)
        sock.close()
        connection = None
    else:
        bases = mapped
        connection = sock
    tensors = dict(tensors_from_table(table, bases))
    return Weights(
        tensors,
        model=request.model,
        source=f"executor-l0-{mode}",
        version=reply.get("version"),
        sha256=reply.get("sha256"),
        lease=None if mode == "copy" else lease,
        served_from=reply.get("served_from"),
        wait_s=reply.get("wait_s"),
        connection=connection,
    )
