"""L0 over CUDA IPC: how a model's device memory in the executor is described to an engine process, and
how the engine maps it. Both sides import this module (the executor exports, the client imports).

An ``open`` with ``"mode": "share"`` or ``"copy"`` is answered, instead of an L1 block, with

    {"ok": true, "lease", "mode", "shards": [DeviceShard...], "table_bytes", ...}  + one fd

where each ``DeviceShard`` is one rank's part of the model on one GPU, carried as a ``CudaIpcHandle``,
and the fd is a small memfd holding the ``TensorTable``: where each tensor lies in those shards (a
table, not the message, because a model can have tens of thousands of tensors).

``CudaIpcHandle`` is exactly the tuple ``torch.UntypedStorage._share_cuda_()`` returns for the storage
that holds the shard (device, cudaIpcMemHandle, storage size and offset in its allocation, the
ref-counter file and offset torch uses to keep the memory alive while a consumer maps it, the event to
wait on), as JSON with the bytes in base64, plus where the shard's bytes lie in that storage. No pickle
crosses the socket: the engine rebuilds the storage with ``torch.multiprocessing.reductions.
rebuild_cuda_tensor``, the function torch's own ``multiprocessing`` uses for CUDA tensors, from these
fields. So the usual CUDA IPC rules hold: the executor's process must stay alive while an engine maps
its memory, and torch keeps a block the executor frees allocated (in its IPC "limbo") until every
engine mapping it has let go. The executor sends each GPU's UUID too: an engine with another
``CUDA_VISIBLE_DEVICES`` finds the same GPU under its own index.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from prewarm_client._protocol import PROTOCOL_VERSION, ProtocolError
from prewarm_client._tensors import DTYPES

__all__ = [
    "MODES",
    "CudaIpcHandle",
    "DeviceShard",
    "TableEntry",
    "TensorTable",
    "import_shard",
    "local_cuda_index",
    "tensors_from_table",
]

MODES = ("share", "copy")
_MAX_TABLE_BYTES = 256 * 2**20


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise ProtocolError(f"{what} must be base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise ProtocolError(f"{what} is not base64: {exc}") from exc


@dataclass(frozen=True)
class CudaIpcHandle:
    """One shard's device memory: ``_share_cuda_()``'s eight fields, then the shard within the storage."""

    device: int
    handle: bytes
    storage_bytes: int
    storage_offset: int  # the storage's offset in its cudaMalloc allocation
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes | None
    event_sync_required: bool
    offset: int  # the shard's first byte, in the storage
    length: int
    uuid: str | None = None  # the GPU's UUID, to find it under another CUDA_VISIBLE_DEVICES

    @classmethod
    def from_share_cuda(
        cls, shared: Sequence[Any], *, offset: int, length: int, uuid: str | None
    ) -> CudaIpcHandle:
        """From the tuple ``UntypedStorage._share_cuda_()`` returned."""
        device, handle, size, storage_offset, rc_handle, rc_offset, event, sync = shared
        return cls(
            int(device),
            bytes(handle),
            int(size),
            int(storage_offset),
            bytes(rc_handle),
            int(rc_offset),
            None if event is None else bytes(event),
            bool(sync),
            offset,
            length,
            uuid,
        )

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        for name in ("handle", "ref_counter_handle", "event_handle"):
            body[name] = _b64(body[name])
        return body

    @classmethod
    def from_json(cls, data: Any) -> CudaIpcHandle:
        try:
            ints = {
                n: int(data[n]) for n in ("device", "storage_bytes", "storage_offset", "offset", "length")
            }
            ints["ref_counter_offset"] = int(data["ref_counter_offset"])
            event = data.get("event_handle")
            handle = cls(
                ints["device"],
                _unb64(data["handle"], "handle"),
                ints["storage_bytes"],
                ints["storage_offset"],
                _unb64(data["ref_counter_handle"], "ref_counter_handle"),
                ints["ref_counter_offset"],
                None if event is None else _unb64(event, "event_handle"),
                bool(data["event_sync_required"]),
                ints["offset"],
                ints["length"],
                None if data.get("uuid") is None else str(data["uuid"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ProtocolError):
                raise
            raise ProtocolError(f"bad CUDA IPC handle: {exc}") from exc
        if min(ints.values()) < 0 or handle.offset + handle.length > handle.storage_bytes:
            raise ProtocolError("CUDA IPC handle: the shard lies outside its storage")
        return handle


@dataclass(frozen=True)
class DeviceShard:
    """Rank ``rank``'s part of a model: bytes ``[start, end)`` of its flat buffer, on node GPU ``gpu``."""

    rank: int
    gpu: int
    start: int
    end: int
    ipc: CudaIpcHandle | None  # None only where the memory is not handed over (the CPU stand-in)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "gpu": self.gpu,
            "start": self.start,
            "end": self.end,
            "ipc": None if self.ipc is None else self.ipc.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any) -> DeviceShard:
        try:
            shard = cls(
                int(data["rank"]),
                int(data["gpu"]),
                int(data["start"]),
                int(data["end"]),
                None if data.get("ipc") is None else CudaIpcHandle.from_json(data["ipc"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ProtocolError):
                raise
            raise ProtocolError(f"bad device shard: {exc}") from exc
        if not 0 <= shard.start <= shard.end or (shard.ipc and shard.ipc.length != shard.end - shard.start):
            raise ProtocolError(f"device shard {shard.rank}: its bytes and its handle disagree")
        return shard


@dataclass(frozen=True)
class TableEntry:
    name: str
    dtype: str  # safetensors' name for it: "BF16", "F32", ...
    shape: tuple[int, ...]
    rank: int
    offset: int  # of its first byte, in its shard

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=DTYPES[self.dtype]).element_size()


@dataclass(frozen=True)
class TensorTable:
    """Where every tensor handed over lies: which rank's shard, at which offset."""

    tensors: tuple[TableEntry, ...]

    def to_bytes(self) -> bytes:
        rows = [[t.name, t.dtype, list(t.shape), t.rank, t.offset] for t in self.tensors]
        return json.dumps({"v": PROTOCOL_VERSION, "tensors": rows}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, lengths: Mapping[int, int]) -> TensorTable:
        """Parse and check it against the shards' lengths (rank → bytes): every tensor inside its shard."""
        if len(data) > _MAX_TABLE_BYTES:
            raise ProtocolError("tensor table too large")
        try:
            body = json.loads(data)
            if body.get("v") != PROTOCOL_VERSION:
                raise ProtocolError(f"tensor table version {body.get('v')!r}")
            entries = tuple(
                TableEntry(str(n), str(d), tuple(int(x) for x in s), int(r), int(o))
                for n, d, s, r, o in body["tensors"]
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ProtocolError):
                raise
            raise ProtocolError(f"bad tensor table: {exc}") from exc
        for t in entries:
            if t.dtype not in DTYPES or min(t.shape, default=0) < 0:
                raise ProtocolError(f"tensor table: {t.name!r} has dtype {t.dtype!r}, shape {t.shape}")
            if t.rank not in lengths or t.offset < 0 or t.offset + t.nbytes > lengths[t.rank]:
                raise ProtocolError(f"tensor table: {t.name!r} lies outside shard {t.rank}")
        return cls(entries)


def tensors_from_table(
    table: TensorTable, bases: Mapping[int, torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for each entry, a view of its rank's base (a flat uint8 tensor on any device),
    copied only where its address is not a multiple of its element size."""
    for t in table.tensors:
        base = bases[t.rank]
        dtype = DTYPES[t.dtype]
        n = t.nbytes
        if n == 0:
            yield t.name, torch.empty(t.shape, dtype=dtype, device=base.device)
            continue
        raw = base[t.offset : t.offset + n]
        if raw.data_ptr() % raw.new_empty((), dtype=dtype).element_size():
            raw = raw.clone()
        yield t.name, raw.view(dtype).view(t.shape)


def local_cuda_index(ipc: CudaIpcHandle) -> int:
    """This process's index of the GPU the handle is on: by UUID when it is sent and found, else the
    executor's index (the same visible devices on both sides)."""
    if ipc.uuid is not None:
        for index in range(torch.cuda.device_count()):
            if str(getattr(torch.cuda.get_device_properties(index), "uuid", "")) == ipc.uuid:
                return index
    return ipc.device


def import_shard(ipc: CudaIpcHandle) -> torch.Tensor:
    """The shard as a flat uint8 CUDA tensor mapping the executor's memory (no copy)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    tensor: torch.Tensor = rebuild_cuda_tensor(  # type: ignore[no-untyped-call]
        torch.Tensor,
        torch.Size([ipc.length]),
        (1,),
        ipc.offset,  # the tensor's offset in its storage, in elements (bytes: uint8)
        torch.storage.TypedStorage,
        torch.uint8,
        local_cuda_index(ipc),
        ipc.handle,
        ipc.storage_bytes,
        ipc.storage_offset,
        False,
        ipc.ref_counter_handle,
        ipc.ref_counter_offset,
        ipc.event_handle,
        ipc.event_sync_required,
    )
    return tensor
