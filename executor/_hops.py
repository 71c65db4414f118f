"""The hop paths: how one load moves a model towards the GPU along the cheapest path the node has.

    L0 hit ─ L1 → L0 ─ L2 → L1 → L0 (overlapped) ─ L3 → L1 + L2 (one pass) → L0

A model that L1 cannot hold, or does not admit for a load on request from L2 (full, with host copies
that served more requests × bytes than it would: ``prewarm.admits``), goes L2 → L0 through a small
pinned staging ring. On the CPU device, where "device memory" is host RAM too, L2 → L0 reads land
straight in the L0 buffer instead (no L1 copy, no second pass over memory); L1 is filled later, from
L0, if a caller asks for it. Demotions copy down instead of re-reading: L0 → L1 from device memory,
L1 → L2 through the same verified write path as a download. A checkpoint (several files) comes L3 → L2
as one verified directory (``_checkpoints``) and goes up from there; L1 and L0 hold its shards one
after the other, never its small files, so it is never demoted to L2 from memory.

L2 is a cache, so a load does not need it: when L2 cannot take a download (its budget full or capped
below the model's size, the disk full, failing, read-only or gone: ``_l2_faults``), a load to L1 or L0
streams from L3 into memory alone, checked against its sha256 all the same, and caches nothing; a
single file that fails L2 mid-download goes on into memory without starting again (``fetch_l3``), a
checkpoint starts again past L2 (``_hops_stream``). Only a load to L2 itself fails. An L2 copy that
the disk cannot read back (EIO) is dropped and fetched again, like one that fails its digest.

``Loader`` holds what the paths share: the three tiers, a gate per link, the disk and network thread
pools, the object stores by scheme and the bandwidth estimate. Loads of one model are coalesced (a
per-model lock: the second caller finds the first caller's copy); loads of different models run in
parallel, bounded by the tier budgets, which are reserved before any byte moves. A load with
``demand=True`` pre-empts prefetch transfers on the links it uses, and upgrades a prefetch of the same
model already under way. Whatever a load reserves stays invisible until it is committed; a failed load
gives it back (``abort``), so nothing partial is ever served. The hops between host and device memory
(L1 → L0, L0 → L1) and committing what a load filled live in ``_hops_l0``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from executor import _metrics
from executor._checkpoints import fetch_checkpoint, l2_layout
from executor._hops_l0 import DeviceHops
from executor._hops_stream import CheckpointStream
from executor._l0 import DeviceModel, L0Cache
from executor._l1 import HostBlock, L1Cache, block_files, copy_small_files
from executor._l2 import L2Cache, L2Object, L2Reader, TempWrite
from executor._l2_faults import disk_fault
from executor._pipeline import (
    DeviceCopier,
    RingFactory,
    StagingRing,
    chunk_targets,
    fetch_l3,
    host_view,
    probe_l3,
    read_l2,
    stream_l3,
)
from executor._priority import LinkGate
from executor._result import Bandwidth, HopTimer, LoadResult
from executor._safetensors import Layout
from executor._stores import MemoryStore, ObjectStore, open_store
from executor._tier import ModelKey, NotAdmitted
from models import ModelSpec
from prewarm import (
    BusyShare,
    CapacityError,
    ExecutorSettings,
    IntegrityError,
    InvalidWeights,
    S3Settings,
    StorageError,
    Tier,
    get_logger,
    weighed,
)

__all__ = ["Loader"]

log = get_logger(__name__)


class Loader:
    """Every hop between the tiers of one node, and what the hops share. Thread-safe."""

    def __init__(
        self,
        *,
        settings: ExecutorSettings,
        s3: S3Settings,
        device: torch.device,
        l0: L0Cache,
        l1: L1Cache,
        l2: L2Cache,
        direct_l0: bool,
        stores: Mapping[str, ObjectStore],
        staging_ring: RingFactory,
    ) -> None:
        self.settings = settings
        self.s3_settings = s3
        self.device = device
        self.l0, self.l1, self.l2 = l0, l1, l2
        # On the CPU device L2 → L0 reads go straight into the L0 buffer; on CUDA through L1 (or the
        # staging ring) and a side stream.
        self._direct_l0 = direct_l0
        self._staging_ring = staging_ring
        self._gates = {name: LinkGate(name) for name in ("L3->L2", "L2->L1", "L1->L0")}
        self._busy = {name: BusyShare() for name in self._gates}
        self._busy_lock = threading.Lock()
        self._disk_pool = ThreadPoolExecutor(settings.read_threads, thread_name_prefix="prewarm-l2")
        self._net_pool = ThreadPoolExecutor(s3.s3_concurrency, thread_name_prefix="prewarm-l3")
        self._stores: dict[str, ObjectStore] = dict(stores)
        self._lock = threading.Lock()
        self._model_locks: dict[ModelKey, threading.Lock] = {}
        self._waiting_demands: dict[ModelKey, int] = {}
        self._bandwidth = Bandwidth()
        self._device = DeviceHops(l0, l1, self._gates["L1->L0"], settings.chunk_bytes, self._is_demand)
        self._stream = CheckpointStream(
            l0=l0,
            l1=l1,
            device=self._device,
            gate=self._gates["L3->L2"],
            pool=self._net_pool,
            s3=s3,
            direct_l0=direct_l0,
            is_demand=self._is_demand,
        )

    def load(self, spec: ModelSpec, tier: Tier, demand: bool, gpus: Sequence[int] = ()) -> LoadResult:
        """Bring ``spec`` to ``tier`` (L0, L1 or L2); a second load of the same model waits for the first.

        ``gpus``: where a new L0 copy goes (an order's GPUs, one shard each); empty: where the placement
        rule says. A copy already in L0 stays where it is."""
        key = spec.key
        if demand and spec.sha256 is not None:
            self.l2.used(spec.sha256)  # what L1's and L2's admission weigh (``prewarm.admits``)
        with self._lock:
            lock = self._model_locks.setdefault(key, threading.Lock())
            if demand:
                self._waiting_demands[key] = self._waiting_demands.get(key, 0) + 1
        try:
            with lock:
                result = self._load(spec, tier, demand, tuple(gpus))
            if demand and spec.sha256 is not None:
                self.l2.touch(spec.sha256)  # the disk copy, made now or before, served the request
            return result
        finally:
            if demand:
                with self._lock:
                    self._waiting_demands[key] -= 1
                    if not self._waiting_demands[key]:
                        del self._waiting_demands[key]

    def demand_loads(self) -> list[str]:
        """The models a request is waiting on this loader for, as the node reports them."""
        with self._lock:
            return sorted({key[0] for key in self._waiting_demands})

    def bandwidth(self) -> dict[str, float]:
        """Bytes per second per hop, as the node reports them."""
        return self._bandwidth.snapshot()

    def demand_busy(self) -> dict[str, float]:
        """Per hop, the share of about the last ten minutes a load on request was on it, as the node
        reports it (``prewarm.BusyShare`` over each gate's busy seconds)."""
        with self._busy_lock:
            now = time.monotonic()
            return {name: self._busy[name].update(gate.busy_s(), now) for name, gate in self._gates.items()}

    def close(self) -> None:
        self._disk_pool.shutdown(wait=True)
        self._net_pool.shutdown(wait=True)

    def _is_demand(self, key: ModelKey, demand: bool) -> Callable[[], bool]:
        return lambda: demand or self._waiting_demands.get(key, 0) > 0

    def _load(self, spec: ModelSpec, tier: Tier, demand: bool, gpus: tuple[int, ...]) -> LoadResult:
        key = spec.key
        assert spec.sha256 is not None
        hops = HopTimer(spec.size_bytes, self._bandwidth.observe)

        def result(served_from: Tier) -> LoadResult:
            return LoadResult(
                spec.id, spec.version, spec.sha256 or "", tier, served_from, spec.size_bytes, hops.seconds
            )

        # An entry evicted while in use is still resident: wanted again, it stays (same key, same bytes).
        self.l0.cache.revive(key)
        self.l1.cache.revive(key)
        if tier is Tier.L0 and self.l0.cache.lookup(key, use=demand) is not None:
            return result(Tier.L0)
        if tier.level <= 1:
            block = self.l1.cache.pin(key)
            if block is not None:
                try:
                    self.l1.cache.lookup(key, use=demand)
                    if tier is Tier.L0:
                        self._device.l1_to_l0(spec, block, hops, demand, gpus)
                finally:
                    self.l1.cache.unpin(key)
                return result(Tier.L1)
        if tier is Tier.L1 and self._device.l0_to_l1(spec, hops, demand):
            return result(Tier.L0)  # a demotion: copied down from the device, no disk read
        obj = self.l2.lookup(spec.sha256) or self.l2.refresh(spec.sha256)
        if tier is Tier.L2:
            if obj is not None:
                return result(Tier.L2)
            demoted_from = self._demote_to_l2(spec, hops, demand)
            if demoted_from is not None:
                return result(demoted_from)  # written from host or device memory, no download
            served = self._from_l3(spec, tier, hops, demand, gpus)
            return result(served)
        if obj is not None:
            try:
                self._l2_up(spec, obj, tier, hops, demand, gpus)
                return result(Tier.L2)
            except StorageError as exc:
                # A flipped byte on disk, the file evicted by another process sharing the directory, or
                # a disk that cannot read it back: the object is dropped and fetched again from L3 below.
                if not isinstance(exc, IntegrityError) and disk_fault(exc) is None:
                    raise
                log.warning("L2 copy unusable, re-fetching", extra={"model": spec.id, "error": str(exc)})
                self.l2.discard(spec.sha256, "integrity")
                hops.seconds.clear()
        served = self._from_l3(spec, tier, hops, demand, gpus)
        return result(served)

    def _from_l3(
        self, spec: ModelSpec, tier: Tier, hops: HopTimer, demand: bool, gpus: tuple[int, ...]
    ) -> Tier:
        """L3 → L2, and into L1 in the same pass when the target is L1 or L0; for L0 each part is copied
        on to the device as soon as it has been hashed (on the CPU device it downloads into the L0 buffer
        itself). Returns where it came from."""
        assert spec.sha256 is not None
        if spec.is_checkpoint:
            return self._checkpoint_from_l3(spec, tier, hops, demand, gpus)
        key, sha = spec.key, spec.sha256
        store = self._store(spec.uri)
        layout = probe_l3(store, spec.uri)  # the header is validated before anything is allocated
        if layout.file_bytes != spec.size_bytes:
            raise IntegrityError(
                f"{spec.id} {spec.version}: {spec.uri} has {layout.file_bytes} bytes, the catalog says "
                f"{spec.size_bytes}; nothing cached"
            )
        with self.l2.download_lock(sha):
            # Another process may have fetched it while we waited for the lock.
            obj = self.l2.refresh(sha)
            if obj is not None:
                if tier is not Tier.L2:
                    self._l2_up(spec, obj, tier, hops, demand, gpus)
                return Tier.L2
            block, device_model = self._download_targets(spec, layout, tier, demand, gpus)
            try:
                tw = self._begin_l2(
                    spec, layout.file_bytes, tier, demand, streamable=bool(block or device_model)
                )
                self._download(spec, store, tw, block, device_model, hops, demand)
            except BaseException:
                self._device.abort(key, block, device_model)
                raise
        self._device.commit(key, layout, block, device_model)
        if tier is not Tier.L0 or device_model is not None:
            return Tier.L3
        if block is None:
            self._l2_up(spec, self._published(sha), tier, hops, demand, gpus)  # L1 could not hold it
            return Tier.L3
        # L0 had no room when the download started; maybe it has now.
        pinned = self.l1.cache.pin(key)
        if pinned is None:
            raise CapacityError(f"{spec.id}: L1 copy was evicted before it reached L0")
        try:
            self._device.l1_to_l0(spec, pinned, hops, demand, gpus)
        finally:
            self.l1.cache.unpin(key)
        return Tier.L3

    def _checkpoint_from_l3(
        self, spec: ModelSpec, tier: Tier, hops: HopTimer, demand: bool, gpus: tuple[int, ...]
    ) -> Tier:
        """A checkpoint comes to L2 first, as one verified directory, and goes up from there (L1 and L0
        hold its weights only, read back from the page cache just written)."""
        assert spec.sha256 is not None
        store, served = self._store(spec.uri), Tier.L2
        why: BaseException | None = None  # what kept L2 from taking it, when it did
        with self.l2.download_lock(spec.sha256):
            obj = self.l2.refresh(spec.sha256)  # another process may have fetched it meanwhile
            if obj is None:
                is_demand = self._is_demand(spec.key, demand)
                try:
                    with hops.hop("L3->L2"), self._gates["L3->L2"].transfer(is_demand) as transfer:
                        obj = fetch_checkpoint(
                            store,
                            spec,
                            self.l2,
                            weigh=weighed(Tier.L2, tier, demand, streamable=self._streams(spec, tier)),
                            pool=self._net_pool,
                            part_bytes=self.s3_settings.s3_part_bytes,
                            window=2 * self.s3_settings.s3_concurrency,
                            transfer=transfer,
                        )
                except (CapacityError, StorageError) as exc:
                    if tier is Tier.L2 or not self.l2.bypasses.streams_past(exc, model=spec.id):
                        raise
                    hops.seconds.clear()  # what the failed L3->L2 hop moved is not kept anywhere
                    why = exc
                served = Tier.L3
        if why is not None:
            # Past L2, outside the download lock: there is nothing in L2 for other processes to wait on.
            self._stream.load(spec, store, tier, hops, demand, gpus, why)
        elif tier is not Tier.L2:
            assert obj is not None
            self._l2_up(spec, obj, tier, hops, demand, gpus)
        return served

    def _begin_l2(
        self, spec: ModelSpec, size: int, tier: Tier, demand: bool, *, streamable: bool
    ) -> TempWrite | None:
        """The temp write a download fills in L2; None when L2 cannot take it and the download lands in
        memory anyway (``streamable``): then it streams past L2 (counted and logged as a bypass)."""
        assert spec.sha256 is not None
        name = spec.weight_files()[0].path
        weigh = weighed(Tier.L2, tier, demand, streamable=streamable)
        try:
            return self.l2.begin(
                spec.sha256, size, model=spec.id, version=spec.version, name=name, weigh=weigh
            )
        except (CapacityError, StorageError) as exc:
            if tier is Tier.L2 or disk_fault(exc) is None:
                raise
            if not streamable:
                # On CUDA a model that L1 cannot hold goes to L0 through the staging ring, from L2.
                raise CapacityError(
                    f"{spec.id}: L2 cannot take it ({exc}) and L1 cannot hold it on its way to L0"
                ) from exc
            self.l2.bypasses.streams_past(exc, model=spec.id)
            return None

    def _host_admits(
        self, spec: ModelSpec, tier: Tier, demand: bool
    ) -> Callable[[list[tuple[ModelKey, int]]], bool] | None:
        """L1's admission (``prewarm.admits``) for a new host copy of ``spec`` read from L2 on its way to
        ``tier``, on the node's use counts (kept by L2, by sha256); None when the copy is not weighed
        (``prewarm.weighed``: only for a load on request to L0, which the staging ring can reach without
        it; an order's copy takes the room the scheduler made for it)."""
        if spec.sha256 is None or not weighed(Tier.L1, tier, demand):
            return None
        worth = self.l2.admits(spec.sha256, spec.size_bytes)
        return lambda victims: worth([(key[2], nbytes) for key, nbytes in victims if key[2] is not None])

    def _streams(self, spec: ModelSpec, tier: Tier) -> bool:
        """Whether a checkpoint on its way to ``tier`` (L1 or L0) can stream past L2 (``CheckpointStream``):
        to L1, or to L0 straight into the buffer (the CPU device) or through an L1 block that can hold it."""
        return tier is Tier.L1 or self._direct_l0 or spec.size_bytes <= self.l1.cache.capacity

    def _download_targets(
        self, spec: ModelSpec, layout: Layout, tier: Tier, demand: bool, gpus: tuple[int, ...]
    ) -> tuple[HostBlock | None, DeviceModel | None]:
        """Where a download lands besides L2: an L1 block for L1 and L0, plus the L0 buffer for L0. On
        the CPU device a download to L0 lands in the L0 buffer alone (host RAM either way)."""
        key, size = spec.key, spec.size_bytes
        if tier is Tier.L0 and self._direct_l0:
            with contextlib.suppress(CapacityError):  # no room in L0 now: as on CUDA, L1 first
                return None, self.l0.reserve(key, size, prefetched=not demand, layout=layout, gpus=gpus)
        if tier is Tier.L2:
            return None, None
        try:
            block = self.l1.reserve(key, size, prefetched=not demand)  # not weighed: no ring from L3
        except CapacityError as exc:
            if tier is not Tier.L0:
                raise
            _bypass_l1(exc)  # L1 cannot hold it: fetch to L2 only, then stage L2 -> L0
            return None, None
        if tier is not Tier.L0:
            return block, None
        try:
            return block, self.l0.reserve(key, size, prefetched=not demand, layout=layout, gpus=gpus)
        except CapacityError:
            return block, None  # L1 and L2 are still worth filling; L0 is tried again afterwards
        except BaseException:
            self.l1.cache.abort(key)
            raise

    def _download(
        self,
        spec: ModelSpec,
        store: ObjectStore,
        tw: TempWrite | None,
        block: HostBlock | None,
        device_model: DeviceModel | None,
        hops: HopTimer,
        demand: bool,
    ) -> None:
        """L3 into L2 (``tw``) and memory, or into memory alone (``tw`` None: past L2)."""
        dest_buffer = block.buffer if block is not None else device_model.padded if device_model else None
        copier = (
            DeviceCopier(device_model.segments()) if block is not None and device_model is not None else None
        )
        landed = None
        if copier is not None:
            assert block is not None
            source = block.buffer

            def landed(start: int, end: int) -> None:
                # Not gated on the device link: these copies are short and spread over a download
                # bounded by the network; holding L1->L0 for its whole length would stall other loads.
                copier.copy(source[start:end], start)

        hop = "L3->L0" if device_model is not None else "L3->L1" if block is not None else "L3->L2"
        dest = host_view(dest_buffer) if dest_buffer is not None else None
        part_bytes, window = self.s3_settings.s3_part_bytes, 2 * self.s3_settings.s3_concurrency
        with hops.hop(hop), self._gates["L3->L2"].transfer(self._is_demand(spec.key, demand)) as transfer:
            try:
                if tw is None:
                    assert dest is not None
                    assert spec.sha256 is not None
                    stream_l3(
                        store,
                        spec.uri,
                        spec.size_bytes,
                        spec.sha256,
                        dest=dest,
                        pool=self._net_pool,
                        part_bytes=part_bytes,
                        window=window,
                        transfer=transfer,
                        landed=landed,
                        what=f"{spec.id} {spec.version}",
                    )
                else:
                    fetch_l3(
                        store,
                        spec.uri,
                        self.l2,
                        tw,
                        dest=dest,
                        pool=self._net_pool,
                        part_bytes=part_bytes,
                        window=window,
                        transfer=transfer,
                        landed=landed,
                        bypass=lambda exc: self.l2.bypasses.streams_past(exc, model=spec.id),
                    )
            finally:
                if copier is not None:
                    copier.finish()

    def _published(self, sha: str) -> L2Object:
        obj = self.l2.lookup(sha)
        if obj is None:
            raise CapacityError(f"L2 object {sha[:12]} was evicted before it could be read")
        return obj

    def _l2_up(
        self,
        spec: ModelSpec,
        obj: L2Object,
        tier: Tier,
        hops: HopTimer,
        demand: bool,
        gpus: tuple[int, ...] = (),
    ) -> None:
        """L2 → L1, and on to L0 overlapped: each chunk is copied to the device as soon as it is read.

        When L1 cannot hold the model (bigger than its budget, or everything there in use) and the
        target is L0, the chunks go through a small pinned staging ring instead and L1 is skipped.
        On the CPU device a load to L0 skips L1 altogether: the chunks are read into the L0 buffer.
        """
        key = spec.key
        try:
            layout, files = l2_layout(obj)  # validated before anything is allocated
        except InvalidWeights as exc:
            # It was a valid file when its sha256 was checked on entry: the disk copy rotted.
            raise IntegrityError(f"L2 object {obj.sha256[:12]} has a broken header now: {exc}") from exc
        if self.l2.pin(obj.sha256) is None:
            raise IntegrityError(f"{spec.id}: L2 object vanished before it could be read")
        device_model: DeviceModel | None = None
        block: HostBlock | None = None
        # The L1 block holds the weights and, after them, the small files an engine starts from.
        small = [(rel, path, size) for rel, path, size in obj.files() if not rel.endswith(".safetensors")]
        weights = [(m.name or m.path.name, offset, m.size) for offset, m in files]
        plan = block_files(weights, [(rel, size) for rel, _path, size in small])
        try:
            if tier is not Tier.L0 or not self._direct_l0:
                try:
                    block = self.l1.reserve(
                        key,
                        layout.file_bytes,
                        prefetched=not demand,
                        block_bytes=plan.size,
                        admit=self._host_admits(spec, tier, demand),
                    )
                except CapacityError as exc:
                    if tier is not Tier.L0:
                        raise
                    log.info(
                        "model not placed in L1: staging L2 -> L0", extra={"model": spec.id, "why": str(exc)}
                    )
                    _bypass_l1(exc)
            if tier is Tier.L0:
                device_model = self.l0.reserve(
                    key, layout.file_bytes, prefetched=not demand, layout=layout, gpus=gpus
                )
            self._read_l2(files, block, device_model, hops, self._is_demand(key, demand))
            if block is not None:
                try:
                    copy_small_files(block, plan, [(rel, path) for rel, path, _size in small])
                except OSError as exc:
                    raise IntegrityError(f"{spec.id}: L2 directory unreadable now: {exc}") from exc
                block.files = plan
            self._device.commit(key, layout, block, device_model)
        except BaseException:
            self._device.abort(key, block, device_model)
            raise
        finally:
            self.l2.unpin(obj.sha256)

    def _read_l2(
        self,
        files: list[tuple[int, L2Object]],
        block: HostBlock | None,
        device_model: DeviceModel | None,
        hops: HopTimer,
        is_demand: Callable[[], bool],
    ) -> None:
        """Read every chunk of each file (at its offset in the model's buffer: one file at 0, or the
        shards of a checkpoint; threads, O_DIRECT where allowed, each chunk's digest checked by the
        thread that read it) into one of three targets:

        - an L1 block, with each chunk copied on to the device as it lands when ``device_model`` is set;
        - on the CPU device with no L1 block, straight into the L0 buffer: no copy at all;
        - otherwise a small pinned staging ring, when L1 cannot hold the model.

        Entries stay invisible until the caller commits them, so a failed chunk leaves nothing behind.
        """
        direct = self._direct_l0 and block is None and device_model is not None
        copier = DeviceCopier(device_model.segments()) if device_model is not None and not direct else None
        window = 2 * self.settings.read_threads
        with contextlib.ExitStack() as stack:
            stack.enter_context(hops.hop("L2->L0" if device_model is not None else "L2->L1"))
            disk = stack.enter_context(self._gates["L2->L1"].transfer(is_demand))
            # The device link is claimed only when bytes will cross it.
            pcie = stack.enter_context(self._gates["L1->L0"].transfer(is_demand)) if copier else None
            ring: StagingRing | None = None
            if not direct and block is None:
                chunk = max(obj.chunk_bytes for _, obj in files)
                ring = self._staging_ring(window, chunk, pinned=self.device.type == "cuda")
            try:
                for offset, obj in files:
                    reader = stack.enter_context(L2Reader(obj, direct=self.settings.l2_direct_io))
                    target, landed = chunk_targets(obj, offset, block, device_model, copier, pcie, ring)
                    read_l2(
                        reader,
                        pool=self._disk_pool,
                        window=window,
                        transfer=disk,
                        target=target,
                        landed=landed,
                    )
            finally:
                if copier is not None:
                    copier.finish()

    def _demote_to_l2(self, spec: ModelSpec, hops: HopTimer, demand: bool) -> Tier | None:
        """Write a model that L1 or L0 holds to L2, verified like a download; where it came from, or
        None when neither holds it. From L1 the block is written as it is (O_DIRECT, no copy); from L0
        in chunks through host scratch buffers."""
        assert spec.sha256 is not None
        if spec.is_checkpoint:
            return None  # L1 and L0 hold its weights, not its other files: it comes from L3
        key = spec.key
        block = self.l1.cache.pin(key)
        device_model = self.l0.cache.pin(key) if block is None else None
        if block is None and device_model is None:
            return None
        source = Tier.L1 if block is not None else Tier.L0
        try:
            if block is not None:
                store, dest = MemoryStore(block.buffer[: spec.size_bytes]), host_view(block.buffer)
            else:
                assert device_model is not None
                store, dest = MemoryStore(device_model.flat()), None
            with self.l2.download_lock(spec.sha256):
                if self.l2.refresh(spec.sha256) is not None:
                    return source
                tw = self.l2.begin(
                    spec.sha256,
                    spec.size_bytes,
                    model=spec.id,
                    version=spec.version,
                    weigh=weighed(Tier.L2, Tier.L2, demand),
                )
                hop = f"{source.value}->L2"
                with hops.hop(hop), self._gates["L3->L2"].transfer(lambda: False) as transfer:
                    fetch_l3(
                        store,
                        spec.uri,
                        self.l2,
                        tw,
                        dest=dest,
                        pool=self._net_pool,
                        part_bytes=self.settings.chunk_bytes,
                        window=2 * self.settings.read_threads,
                        transfer=transfer,
                    )
        finally:
            if block is not None:
                self.l1.cache.unpin(key)
            else:
                self.l0.cache.unpin(key)
        return source

    def _store(self, uri: str) -> ObjectStore:
        scheme = uri.partition("://")[0]
        with self._lock:
            store = self._stores.get(scheme)
            if store is None:
                store = self._stores[scheme] = open_store(uri, self.s3_settings)
            return store


def _bypass_l1(exc: CapacityError) -> None:
    """Count a load to L0 staged past L1 (``prewarm_executor_l1_bypass_total``)."""
    _metrics.L1_BYPASS.labels("not_admitted" if isinstance(exc, NotAdmitted) else "full").inc()
