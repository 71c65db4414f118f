"""The executor's half of L0 over CUDA IPC: a leased L0 copy described for an engine process.

``describe`` turns a ``DeviceLease`` into what the socket sends (``prewarm_client._ipc``'s
``DeviceShard`` per shard, and the ``TensorTable``); ``export`` adds each shard's CUDA IPC handle, from
``torch.UntypedStorage._share_cuda_()`` on the storage that holds it (the call
``torch.multiprocessing``'s reductions make for a CUDA tensor). ``table_memfd`` puts the table in a
memfd, passed read-only with the reply (``SCM_RIGHTS``) like an L1 block.

Only CUDA memory can be handed over: on the cpu stand-in ``export`` refuses with ``InvalidInput``
(reason ``mode``) and the socket says so, while ``describe`` (the table, the shards) runs the same on
either device.
"""

from __future__ import annotations

import os

import torch

from executor._l0 import Shard
from executor._leases import DeviceLease
from prewarm import InvalidInput
from prewarm_client import CudaIpcHandle, DeviceShard, TableEntry, TensorTable

__all__ = ["describe", "export", "table_memfd"]


def describe(lease: DeviceLease) -> tuple[list[DeviceShard], TensorTable]:
    """The leased shards (no handles yet) and where each of their tensors lies, offsets within shards."""
    model = lease.model
    assert model.layout is not None  # committed entries have one
    ranks = {shard.rank for shard in lease.shards}
    entries = []
    for t in model.layout.tensors:
        shard = model.shard_at(t.start)
        if shard.rank in ranks:
            entries.append(TableEntry(t.name, t.dtype, t.shape, shard.rank, t.start - shard.start))
    shards = [DeviceShard(s.rank, s.gpu, s.start, s.end, None) for s in lease.shards]
    return shards, TensorTable(tuple(entries))


def _gpu_uuid(device: torch.device) -> str | None:
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return None if uuid is None else str(uuid)


def _handle(shard: Shard) -> CudaIpcHandle:
    buffer = shard.buffer
    if buffer.device.type != "cuda":
        raise InvalidInput(
            f"L0 over CUDA IPC needs a CUDA executor; this one's L0 is on {buffer.device} "
            "(ask without a mode for the L1 block)",
            reason="mode",
        )
    shared = buffer.untyped_storage()._share_cuda_()  # type: ignore[no-untyped-call]
    return CudaIpcHandle.from_share_cuda(
        shared, offset=int(buffer.storage_offset()), length=shard.nbytes, uuid=_gpu_uuid(buffer.device)
    )


def export(lease: DeviceLease) -> tuple[list[DeviceShard], TensorTable]:
    """``describe`` with each shard's CUDA IPC handle; ``InvalidInput`` (reason ``mode``) off CUDA."""
    shards, table = describe(lease)
    by_rank = {s.rank: s for s in lease.shards}
    return [DeviceShard(s.rank, s.gpu, s.start, s.end, _handle(by_rank[s.rank])) for s in shards], table


def table_memfd(table: TensorTable) -> tuple[int, int]:
    """A read-only descriptor of a memfd holding the table, and its length; the caller closes it."""
    data = table.to_bytes()
    fd = os.memfd_create("prewarm-l0-table", os.MFD_CLOEXEC)
    try:
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], written)
        readonly = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)
    return readonly, len(data)
