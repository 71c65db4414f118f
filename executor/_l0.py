"""L0: device memory, per GPU of the node; one buffer per model and GPU, a tensor view per safetensors entry.

One executor drives every GPU of its node (``torch.cuda.device_count()``, or the first ``l0_gpus``; a
device of ``cuda:N`` means that GPU alone). Each GPU has its own budget: ``l0_budget`` bytes, or that
fraction of the memory free on it at start-up, with ``l0_reserve_bytes`` always left for the inference
engine. The tier's accounting (``TierCache``) sees their sum; where a copy goes is decided here, when
it is placed, by the spine's rule (``prewarm.gpu_placement``) or by the GPUs an order names.

A model larger than one GPU is held across several GPUs of the node, one **shard** per GPU (its
*rank*). The placement is documented and simple, and honest about what it is: each shard is a
contiguous byte range of the model's flat buffer (every weight file at its aligned offset, as L1 holds
it) cut at tensor boundaries, so every tensor lies whole on one GPU and the shards are as even as the
tensors allow (each within one tensor of ``size / ranks``). It is not a tensor-parallel split along a
dimension: an engine rank asks for its shard (the protocol's ``rank``) and gets the whole tensors
placed there. One allocation per model and GPU (not one per tensor) keeps the caching allocator out of
the load path and lets the host-to-device copy run as a few large transfers; a shard's buffer starts at
the same offset modulo 256 as its bytes in the flat buffer, so every tensor is as aligned on the device
as in the file. When a copy leaves GPU memory its blocks are handed back to the device
(``torch.cuda.empty_cache``), so a co-located engine can allocate them.

On a machine without CUDA the ``cpu`` device stands in, through the same code: ``l0_gpus`` virtual GPUs,
each with its own budget, all on the cpu device. There a model is one page-aligned host buffer (with
room to round the last chunk up, so that L2 reads land in it directly: O_DIRECT, no host copy in
between) and its shards are slices of it.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from executor._hostmem import host_buffer, populate
from executor._safetensors import DTYPES, Layout
from executor._tier import Entry, ModelKey, TierCache, round_up
from prewarm import (
    ConfigError,
    ExecutorSettings,
    InvalidInput,
    PlacementFailed,
    Tier,
    gpu_placement,
    gpu_shards,
)

__all__ = [
    "DeviceModel",
    "Gpu",
    "L0Cache",
    "Shard",
    "gpu_capacities",
    "l0_capacity",
    "l0_devices",
    "resolve_device",
    "split_by_tensors",
]

_DEVICE_ALIGN = 256  # what CUDA's allocator guarantees for a block's start (it gives 512)


def resolve_device(name: str) -> torch.device:
    """``auto`` → the current CUDA device when there is one, else ``cpu``."""
    if name == "auto":
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but torch sees no CUDA device", setting="PREWARM_DEVICE")
    return device


def l0_devices(name: str, gpus: int | None) -> list[torch.device]:
    """The devices of the node's L0, one per GPU: every visible CUDA device (or the first ``gpus``) for
    ``auto``/``cuda``, the one named by ``cuda:N``, or ``gpus`` virtual GPUs on the cpu device."""
    primary = resolve_device(name)
    if primary.type == "cpu":
        return [primary] * (gpus or 1)
    if name not in ("auto", "cuda"):
        return [primary]
    count = torch.cuda.device_count()
    if gpus is not None and gpus > count:
        raise ConfigError(f"l0_gpus={gpus} but torch sees {count} CUDA devices", setting="l0_gpus")
    return [torch.device("cuda", i) for i in range(gpus or count)]


def _free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def l0_capacity(settings: ExecutorSettings, device: torch.device, *, share: int = 1) -> int:
    """One GPU's budget: ``l0_budget`` bytes, or that fraction of its free memory, never eating into the
    reserve. ``share``: how many virtual GPUs split this device's memory (the cpu stand-in)."""
    free = (_free_memory(device) - settings.l0_reserve_bytes) // share
    wanted = int(settings.l0_budget) if settings.l0_budget > 1 else int(settings.l0_budget * free)
    return max(0, min(wanted, free))


def gpu_capacities(settings: ExecutorSettings, devices: Sequence[torch.device]) -> list[int]:
    """Each GPU's budget; virtual GPUs on one device (the cpu's) share its memory: each gets its part."""
    return [l0_capacity(settings, d, share=devices.count(d)) for d in devices]


@dataclass(frozen=True)
class Gpu:
    """One GPU of the node's L0: ``index`` is its place in the node's list (what orders and the state
    report name; the CUDA index when the executor drives every visible GPU)."""

    index: int
    device: torch.device
    capacity: int


@dataclass
class Shard:
    """Rank ``rank``'s part of a model: bytes ``[start, end)`` of its flat buffer, on GPU ``gpu``."""

    rank: int
    gpu: int
    start: int
    end: int
    buffer: torch.Tensor  # ``end - start`` bytes on the GPU's device

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class DeviceModel:
    """A model in L0: its shards (one per GPU it spans) and the tensors viewing them.

    ``buffer`` is the whole model as one flat buffer when there is one: a model on one GPU, or any model
    on the cpu stand-in (whose shards are slices of it). ``padded``: on the cpu device only, ``buffer``
    plus its slack to the next page, page-aligned; what O_DIRECT reads of the last chunk are given.
    """

    shards: tuple[Shard, ...]
    nbytes: int
    buffer: torch.Tensor | None = None
    layout: Layout | None = None
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    padded: torch.Tensor | None = None

    @property
    def gpus(self) -> list[int]:
        return [s.gpu for s in self.shards]

    def segments(self) -> torch.Tensor | list[tuple[int, torch.Tensor]]:
        """Where host → device copies go (``DeviceCopier``'s target): the flat buffer, or each shard with
        its start, so that a copy addressed in the flat buffer's offsets is split at shard boundaries."""
        if self.buffer is not None:
            return self.buffer
        return [(s.start, s.buffer) for s in self.shards]

    def copy_to(self, dest: torch.Tensor) -> None:
        """Copy every byte to ``dest`` (host memory, at least ``nbytes``); synchronous."""
        for shard in self.shards:
            dest[shard.start : shard.end].copy_(shard.buffer)

    def flat(self) -> Any:
        """The bytes as one flat uint8 sequence that slices like a tensor (what ``MemoryStore`` reads)."""
        return self.buffer if self.buffer is not None else _Gathered(self.shards, self.nbytes)

    def views(self, layout: Layout) -> dict[str, torch.Tensor]:
        """name → tensor, each a view of the shard that holds it (a copy where it is not element-aligned)."""
        views: dict[str, torch.Tensor] = {}
        for entry in layout.tensors:
            shard = self.shard_at(entry.start)
            dtype, itemsize = DTYPES[entry.dtype]
            raw = shard.buffer[entry.start - shard.start : entry.end - shard.start]
            if entry.start % itemsize:
                raw = raw.clone()  # a reinterpreting view needs an element-aligned offset
            views[entry.name] = raw.view(dtype).view(entry.shape)
        return views

    def shard_at(self, offset: int) -> Shard:
        return next(s for s in self.shards if s.start <= offset < s.end or s.end == self.nbytes == offset)


class _Gathered:
    """A model's shards read as one flat host sequence (a demotion to L2 from several GPUs)."""

    def __init__(self, shards: Sequence[Shard], nbytes: int) -> None:
        self._shards, self._nbytes = shards, nbytes

    def numel(self) -> int:
        return self._nbytes

    def __getitem__(self, index: slice) -> torch.Tensor:
        start, stop, _ = index.indices(self._nbytes)
        parts = [
            s.buffer[max(start, s.start) - s.start : min(stop, s.end) - s.start].cpu()
            for s in self._shards
            if s.start < stop and start < s.end
        ]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def split_by_tensors(layout: Layout | None, nbytes: int, ranks: int) -> list[tuple[int, int]]:
    """``ranks`` contiguous byte ranges covering ``[0, nbytes)``, cut at tensor starts, each as close to
    ``nbytes / ranks`` as the tensors allow (the placement of the module docstring). Fewer ranges when
    the model has fewer tensors than ranks."""
    if ranks <= 1 or layout is None:
        return [(0, nbytes)]
    # The first tensor starts a shard anyway (a shard of the header alone would hold nothing).
    starts = sorted({t.start for t in layout.tensors if 0 < t.start < nbytes})[1:]
    ranks = min(ranks, len(starts) + 1)
    cuts = [0]
    for k in range(1, ranks):
        later = [b for b in starts if b > cuts[-1]]
        # Leave a boundary for each cut still to come.
        usable = later[: len(later) - (ranks - 1 - k)]
        target = k * nbytes / ranks
        cuts.append(min(usable, key=lambda b: abs(b - target)))
    cuts.append(nbytes)
    return list(itertools.pairwise(cuts))


class _Asked(threading.local):
    """What the reserving thread asked for: where to place (GPU indices) and the model's layout."""

    gpus: tuple[int, ...] = ()
    layout: Layout | None = None


class L0Cache:
    """The device tier: accounting in ``cache`` (the sum over GPUs), placement and memory per GPU here."""

    def __init__(
        self,
        gpus: Sequence[tuple[torch.device, int]],
        *,
        clock: Callable[[], float],
        ttl_s: float,
    ) -> None:
        if not gpus:
            raise ConfigError("L0 needs at least one GPU (or the cpu standing in)", setting="l0_gpus")
        self.gpus = tuple(Gpu(i, device, capacity) for i, (device, capacity) in enumerate(gpus))
        self.device = self.gpus[0].device
        self._used = [0] * len(self.gpus)
        self._lock = threading.Lock()
        self._asked = _Asked()
        self.cache: TierCache[ModelKey, DeviceModel] = TierCache(
            Tier.L0,
            sum(g.capacity for g in self.gpus),
            clock=clock,
            release=self._release,
            place=self._place,
            ttl_s=ttl_s,
        )

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def used_per_gpu(self) -> list[int]:
        with self._lock:
            return list(self._used)

    def shards_for(self, nbytes: int, layout: Layout | None) -> list[tuple[int, int]]:
        """How a model of ``nbytes`` would be cut on this node (``gpu_shards`` ranks, at tensor starts)."""
        ranks = gpu_shards(nbytes, [g.capacity for g in self.gpus]) or 1
        return split_by_tensors(layout, nbytes, ranks)

    def reserve(
        self,
        key: ModelKey,
        nbytes: int,
        *,
        prefetched: bool,
        layout: Layout | None = None,
        gpus: Sequence[int] = (),
    ) -> DeviceModel:
        """Account and place ``nbytes`` (evicting LRU copies if needed): on ``gpus`` when given (an
        order's), else where ``gpu_placement`` says. ``layout`` lets a model span GPUs at tensor
        boundaries; without it a model goes to one GPU."""
        wanted = tuple(gpus)
        bad = [g for g in wanted if not 0 <= g < len(self.gpus)] or len(set(wanted)) != len(wanted)
        if bad:
            raise InvalidInput(
                f"GPUs {list(wanted)} are not distinct GPUs of this node (0-{len(self.gpus) - 1})"
            )
        self._asked.gpus, self._asked.layout = wanted, layout
        try:
            model = self.cache.reserve(key, nbytes, prefetched=prefetched, relieves=self._relieves)
        finally:
            self._asked.gpus, self._asked.layout = (), None
        assert model is not None
        return model

    def _relieves(self, entry: Entry[ModelKey, DeviceModel]) -> bool:
        """Whether evicting ``entry`` frees room where the reservation under way must go."""
        wanted = self._asked.gpus
        return not wanted or entry.value is None or any(g in wanted for g in entry.value.gpus)

    def _place(self, nbytes: int) -> DeviceModel:
        wanted, layout = self._asked.gpus, self._asked.layout
        with self._lock:
            free = [g.capacity - used for g, used in zip(self.gpus, self._used, strict=True)]
            if wanted:
                targets: tuple[int, ...] | None = wanted  # rank r on the order's r-th GPU
            elif layout is None:
                targets = (max(range(len(free)), key=lambda i: (free[i], -i)),)
            else:
                targets = gpu_placement(nbytes, [g.capacity for g in self.gpus], free)
            if targets is None:
                raise PlacementFailed(f"no GPU of this node has room for {nbytes} bytes now")
            ranges = split_by_tensors(layout, nbytes, len(targets))
            if not wanted:
                # Shards differ by up to a tensor: the biggest goes to the roomiest GPU.
                by_room = sorted(targets[: len(ranges)], key=lambda g: (-free[g], g))
                by_size = sorted(range(len(ranges)), key=lambda r: (ranges[r][0] - ranges[r][1], r))
                pairs = dict(zip(by_size, by_room, strict=True))
                targets = tuple(pairs[r] for r in range(len(ranges)))
            targets = targets[: len(ranges)]
            short = [g for g, (lo, hi) in zip(targets, ranges, strict=True) if free[g] < hi - lo]
            if short:
                raise PlacementFailed(f"GPUs {short} have no room for their shard of {nbytes} bytes")
            model = self._allocate(nbytes, list(zip(targets, ranges, strict=True)))
            for shard in model.shards:
                self._used[shard.gpu] += shard.nbytes
        return model

    def _allocate(self, nbytes: int, placed: list[tuple[int, tuple[int, int]]]) -> DeviceModel:
        if not self.is_cuda:
            padded = host_buffer(round_up(nbytes))
            # Faulted in now, by one thread in order: cheaper than faults taken by the reading threads
            # inside their O_DIRECT reads (1.9-2.2 against 0.9-1.9 GB/s for a cold 1 GiB L2 -> L0).
            populate(padded)
            flat = padded[:nbytes]
            shards = tuple(
                Shard(rank, gpu, lo, hi, flat[lo:hi]) for rank, (gpu, (lo, hi)) in enumerate(placed)
            )
            return DeviceModel(shards, nbytes, buffer=flat, padded=padded)
        shards_list: list[Shard] = []
        try:
            for rank, (gpu, (lo, hi)) in enumerate(placed):
                lead = lo % _DEVICE_ALIGN  # the shard's bytes as aligned as they are in the flat buffer
                raw = torch.empty(lead + hi - lo, dtype=torch.uint8, device=self.gpus[gpu].device)
                shards_list.append(Shard(rank, gpu, lo, hi, raw[lead:]))
        except torch.cuda.OutOfMemoryError as exc:
            # Budget allowed it but the engine or fragmentation holds the memory: evict and retry.
            shards_list.clear()
            torch.cuda.empty_cache()
            raise PlacementFailed(str(exc)) from exc
        shards = tuple(shards_list)
        return DeviceModel(shards, nbytes, buffer=shards[0].buffer if len(shards) == 1 else None)

    def _release(self, _key: ModelKey, model: DeviceModel | None) -> None:
        # Dropping the last reference returns the blocks to torch's caching allocator, and empty_cache
        # returns them to the device, for the engine. An engine still holding views (a pinned entry, or
        # a CUDA IPC mapping, which torch keeps alive in this process until the engine lets go) keeps
        # its memory, which is why serving pins entries.
        if model is None:
            return
        with self._lock:
            for shard in model.shards:
                self._used[shard.gpu] -= shard.nbytes
        model.tensors = {}
        model.shards, model.buffer, model.padded = (), None, None
        if self.is_cuda:
            torch.cuda.empty_cache()
            # Blocks an engine mapped over CUDA IPC wait in torch's limbo until it lets go: free those
            # whose engines have.
            torch.cuda.ipc_collect()  # type: ignore[no-untyped-call]
