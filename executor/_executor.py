"""The ``Executor``: what a GPU node runs, and the API the order consumer and inference servers call.

It owns the three local tiers and moves a model towards the GPU along the cheapest path it has:

    L0 hit ─ L1 → L0 ─ L2 → L1 → L0 (overlapped) ─ L3 → L1 + L2 (one pass) → L0

A model that L1 cannot hold goes L2 → L0 through a small pinned staging ring. On the CPU device, where
"device memory" is host RAM too, L2 → L0 reads land straight in the L0 buffer instead (no L1 copy, no
second pass over memory); L1 is filled later, from L0, if a caller asks for it. Demotions copy down
instead of re-reading: L0 → L1 from device memory, L1 → L2 through the same verified write path as a
download.

Concurrency: every method is thread-safe. Loads of one model are coalesced (a per-model lock: the second
caller finds the first caller's copy); loads of different models run in parallel, bounded by the tier
budgets, which are reserved before any byte moves. A caller with ``demand=True`` pre-empts prefetch
transfers on the links it uses, and upgrades a prefetch of the same model already under way.

Staleness: L1 and L0 entries are keyed by ``(model, version, sha256)`` and looked up with the key of
the catalog now in force, so after ``update_catalog`` an old copy is unreachable (and evicted as
``stale`` as soon as nothing pins it). L2 is addressed by sha256 alone: bytes with a digest are never
stale, only unused.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from executor import _metrics
from executor._l0 import DeviceModel, L0Cache, l0_capacity, resolve_device
from executor._l1 import HostBlock, L1Cache
from executor._l2 import L2Cache, L2Object, L2Reader, TempWrite
from executor._pipeline import (
    DeviceCopier,
    StagingRing,
    fetch_l3,
    host_view,
    into_buffer,
    probe_l3,
    read_header_l2,
    read_l2,
)
from executor._priority import LinkGate
from executor._safetensors import Layout, tensor_views
from executor._stores import MemoryStore, ObjectStore, open_store
from executor._tier import Entry, ModelKey, TierCache
from models import Catalog, ModelSpec
from prewarm import (
    CACHE_TIERS,
    HOP_INTO,
    CapacityError,
    ConfigError,
    ExecutorSettings,
    ExecutorState,
    IntegrityError,
    InvalidInput,
    InvalidWeights,
    Order,
    OrderAction,
    OrderOutcome,
    OrderStatus,
    PrewarmError,
    ResidentModel,
    S3Settings,
    Settings,
    Tier,
    TierState,
    admit,
    get_logger,
)

__all__ = ["Executor", "LoadResult"]

log = get_logger(__name__)
_ORDER_MEMORY = 10_000  # order ids remembered for idempotency
_RECENT_OUTCOMES = 50


# Fused hops and the link that bounds each: object storage for L3 -> L1, the disk for L2 -> L0.
_BOUND_BY: dict[str, tuple[str, ...]] = {
    "L3->L1": (HOP_INTO[Tier.L2],),
    "L3->L0": (HOP_INTO[Tier.L2],),
    "L2->L0": (HOP_INTO[Tier.L1],),
}


@dataclass(frozen=True)
class LoadResult:
    """What ``ensure`` did. ``served_from`` is where the bytes came from (the tier itself on a hit).

    ``verified`` is always true for a result that is returned: bytes reach L1/L0 only through a sha256
    check (from L3) or per-chunk digest checks (from L2), and a failed check raises or re-fetches.
    """

    model: str
    version: str
    sha256: str
    tier: Tier
    served_from: Tier
    bytes: int
    seconds_per_hop: Mapping[str, float] = field(default_factory=dict)
    verified: bool = True

    @property
    def seconds(self) -> float:
        return sum(self.seconds_per_hop.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "served_from": self.served_from.value,
            "tier": self.tier.value,
            "bytes": self.bytes,
            "seconds_per_hop": {k: round(v, 6) for k, v in self.seconds_per_hop.items()},
            "verified": self.verified,
        }


class _Hops:
    """Times each hop of one load and feeds the metrics and the node's bandwidth estimate."""

    def __init__(self, owner: Executor, nbytes: int) -> None:
        self._owner = owner
        self._nbytes = nbytes
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def hop(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        elapsed = time.perf_counter() - start
        self.seconds[name] = elapsed
        _metrics.HOP_BYTES.labels(name).inc(self._nbytes)
        _metrics.HOP_SECONDS.labels(name).inc(elapsed)
        self._owner._observe_bandwidth(name, self._nbytes, elapsed)


class Executor:
    """The tier pipeline of one node. Build it once; ``close`` it at shutdown."""

    def __init__(
        self,
        catalog: Catalog,
        settings: Settings | None = None,
        *,
        executor: ExecutorSettings | None = None,
        s3: S3Settings | None = None,
        cache_dir: Path | None = None,
        device: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if settings is not None:
            executor = executor or settings.executor
            s3 = s3 or settings.s3
            cache_dir = cache_dir or settings.cache_dir
        # model_construct: defaults only, never the environment (settings are read once, by the caller).
        self.settings = executor or ExecutorSettings.model_construct()
        self.s3_settings = s3 or S3Settings.model_construct()
        self._clock = clock
        self._catalog = catalog
        self.device = resolve_device(device or self.settings.device)
        cfg = self.settings
        self.l2 = L2Cache(
            Path(cache_dir or cfg.cache_dir or Path(".prewarm/cache")),
            cfg.l2_budget_bytes,
            chunk_bytes=cfg.chunk_bytes,
            clock=clock,
            direct_io=cfg.l2_direct_io,
        )
        self.l1 = L1Cache(
            cfg.l1_budget_bytes, pinned=self.device.type == "cuda", clock=clock, ttl_s=cfg.prefetch_ttl_s
        )
        self.l0 = L0Cache(l0_capacity(cfg, self.device), self.device, clock=clock, ttl_s=cfg.prefetch_ttl_s)
        # On the CPU device L2 → L0 reads go straight into the L0 buffer; on CUDA through L1 (or the
        # staging ring) and a side stream. Tests turn it off to run the CUDA structure on the CPU device.
        self._direct_l0 = self.device.type == "cpu"
        self._gates = {name: LinkGate(name) for name in ("L3->L2", "L2->L1", "L1->L0")}
        self._disk_pool = ThreadPoolExecutor(cfg.read_threads, thread_name_prefix="prewarm-l2")
        self._net_pool = ThreadPoolExecutor(self.s3_settings.s3_concurrency, thread_name_prefix="prewarm-l3")
        self._stores: dict[str, ObjectStore] = {}
        self._lock = threading.Lock()
        self._model_locks: dict[ModelKey, threading.Lock] = {}
        self._waiting_demands: dict[ModelKey, int] = {}
        self._outcomes: OrderedDict[str, OrderOutcome] = OrderedDict()
        self._orders_in_flight: set[str] = set()
        self._recent: deque[OrderOutcome] = deque(maxlen=_RECENT_OUTCOMES)
        self._bandwidth: dict[str, float] = {}

    # ------------------------------------------------------------------ catalog

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    def update_catalog(self, catalog: Catalog) -> None:
        """Swap the catalog; L1/L0 copies of versions it no longer lists become unservable at once."""
        with self._lock:
            self._catalog = catalog
        self._sweep()

    def _spec(self, model_id: str) -> ModelSpec:
        spec = self._catalog[model_id]
        if spec.sha256 is None:
            raise ConfigError(
                f"catalog entry {model_id} has no sha256: the executor serves only verified weights "
                "(fill it with `prewarm models register`)",
                setting=f"models[{model_id}].sha256",
            )
        return spec

    def _sweep(self) -> None:
        """Evict stale versions and prefetched entries whose TTL ran out (cheap: a few entries)."""
        current = {spec.key for spec in self._catalog}
        for cache in (self.l0.cache, self.l1.cache):
            cache.evict_where(lambda e: e.key not in current, "stale")
            cache.expire()

    # ------------------------------------------------------------------ loading

    def ensure(self, model_id: str, tier: Tier | str = Tier.L0, *, demand: bool = False) -> LoadResult:
        """Bring ``model_id`` (the catalog's current version) to ``tier`` (L0, L1 or L2).

        ``demand=True`` means a request is waiting: this load pre-empts prefetches on shared links, and
        the entries it creates count as used. Otherwise the entries are prefetched (subject to the TTL).
        """
        tier = Tier(tier)
        if tier is Tier.L3:
            raise InvalidInput("ensure targets L0, L1 or L2; L3 is where weights come from", reason="tier")
        spec = self._spec(model_id)
        key = spec.key
        self._sweep()
        with self._lock:
            lock = self._model_locks.setdefault(key, threading.Lock())
            if demand:
                self._waiting_demands[key] = self._waiting_demands.get(key, 0) + 1
        try:
            with lock:
                result = self._ensure(spec, tier, demand)
        finally:
            if demand:
                with self._lock:
                    self._waiting_demands[key] -= 1
                    if not self._waiting_demands[key]:
                        del self._waiting_demands[key]
        _metrics.HITS.labels(result.served_from.value).inc()
        log.debug("ensured", extra=result.to_json())
        return result

    def _is_demand(self, key: ModelKey, demand: bool) -> Callable[[], bool]:
        return lambda: demand or self._waiting_demands.get(key, 0) > 0

    def _ensure(self, spec: ModelSpec, tier: Tier, demand: bool) -> LoadResult:
        key = spec.key
        assert spec.sha256 is not None
        hops = _Hops(self, spec.size_bytes)

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
                        self._l1_to_l0(spec, block, hops, demand)
                finally:
                    self.l1.cache.unpin(key)
                return result(Tier.L1)
        if tier is Tier.L1 and self._l0_to_l1(spec, hops, demand):
            return result(Tier.L0)  # a demotion: copied down from the device, no disk read
        obj = self.l2.lookup(spec.sha256) or self.l2.refresh(spec.sha256)
        if tier is Tier.L2:
            if obj is not None:
                return result(Tier.L2)
            demoted_from = self._demote_to_l2(spec, hops)
            if demoted_from is not None:
                return result(demoted_from)  # written from host or device memory, no download
            served = self._from_l3(spec, tier, hops, demand)
            return result(served)
        if obj is not None:
            try:
                self._l2_up(spec, obj, tier, hops, demand)
                return result(Tier.L2)
            except IntegrityError as exc:
                # A flipped byte on disk, or the file evicted by another process sharing the directory:
                # the object is dropped and fetched again from L3 below.
                log.warning("L2 copy unusable, re-fetching", extra={"model": spec.id, "error": str(exc)})
                self.l2.discard(spec.sha256, "integrity")
                hops.seconds.clear()
        served = self._from_l3(spec, tier, hops, demand)
        return result(served)

    def _from_l3(self, spec: ModelSpec, tier: Tier, hops: _Hops, demand: bool) -> Tier:
        """L3 → L2, and into L1 in the same pass when the target is L1 or L0; for L0 each part is copied
        on to the device as soon as it has been hashed (on the CPU device it downloads into the L0 buffer
        itself). Returns where it came from."""
        assert spec.sha256 is not None
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
                    self._l2_up(spec, obj, tier, hops, demand)
                return Tier.L2
            block, device_model = self._download_targets(spec, tier, demand)
            try:
                tw = self.l2.begin(sha, layout.file_bytes, model=spec.id, version=spec.version)
                self._download(spec, store, tw, block, device_model, hops, demand)
            except BaseException:
                self._abort(key, block, device_model)
                raise
        self._commit(key, layout, block, device_model)
        if tier is not Tier.L0 or device_model is not None:
            return Tier.L3
        if block is None:
            self._l2_up(spec, self._published(sha), tier, hops, demand)  # L1 could not hold it: staged
            return Tier.L3
        # L0 had no room when the download started; maybe it has now.
        pinned = self.l1.cache.pin(key)
        if pinned is None:
            raise CapacityError(f"{spec.id}: L1 copy was evicted before it reached L0")
        try:
            self._l1_to_l0(spec, pinned, hops, demand)
        finally:
            self.l1.cache.unpin(key)
        return Tier.L3

    def _download_targets(
        self, spec: ModelSpec, tier: Tier, demand: bool
    ) -> tuple[HostBlock | None, DeviceModel | None]:
        """Where a download lands besides L2: an L1 block for L1 and L0, plus the L0 buffer for L0. On
        the CPU device a download to L0 lands in the L0 buffer alone (host RAM either way)."""
        key, size = spec.key, spec.size_bytes
        if tier is Tier.L0 and self._direct_l0:
            with contextlib.suppress(CapacityError):  # no room in L0 now: as on CUDA, L1 first
                return None, self.l0.reserve(key, size, prefetched=not demand)
        if tier is Tier.L2:
            return None, None
        try:
            block = self.l1.reserve(key, size, prefetched=not demand)
        except CapacityError:
            if tier is not Tier.L0:
                raise
            return None, None  # L1 cannot hold it: fetch to L2 only, then stage L2 -> L0
        if tier is not Tier.L0:
            return block, None
        try:
            return block, self.l0.reserve(key, size, prefetched=not demand)
        except CapacityError:
            return block, None  # L1 and L2 are still worth filling; L0 is tried again afterwards
        except BaseException:
            self.l1.cache.abort(key)
            raise

    def _download(
        self,
        spec: ModelSpec,
        store: ObjectStore,
        tw: TempWrite,
        block: HostBlock | None,
        device_model: DeviceModel | None,
        hops: _Hops,
        demand: bool,
    ) -> None:
        dest_buffer = block.buffer if block is not None else device_model.padded if device_model else None
        copier = DeviceCopier(device_model.buffer) if block is not None and device_model is not None else None
        landed = None
        if copier is not None:
            assert block is not None
            source = block.buffer

            def landed(start: int, end: int) -> None:
                # Not gated on the device link: these copies are short and spread over a download
                # bounded by the network; holding L1->L0 for its whole length would stall other loads.
                copier.copy(source[start:end], start)

        hop = "L3->L0" if device_model is not None else "L3->L1" if block is not None else "L3->L2"
        with hops.hop(hop), self._gates["L3->L2"].transfer(self._is_demand(spec.key, demand)) as transfer:
            try:
                fetch_l3(
                    store,
                    spec.uri,
                    self.l2,
                    tw,
                    dest=host_view(dest_buffer) if dest_buffer is not None else None,
                    pool=self._net_pool,
                    part_bytes=self.s3_settings.s3_part_bytes,
                    window=2 * self.s3_settings.s3_concurrency,
                    transfer=transfer,
                    landed=landed,
                )
            finally:
                if copier is not None:
                    copier.finish()

    def _published(self, sha: str) -> L2Object:
        obj = self.l2.lookup(sha)
        if obj is None:
            raise CapacityError(f"L2 object {sha[:12]} was evicted before it could be read")
        return obj

    def _l2_up(self, spec: ModelSpec, obj: L2Object, tier: Tier, hops: _Hops, demand: bool) -> None:
        """L2 → L1, and on to L0 overlapped: each chunk is copied to the device as soon as it is read.

        When L1 cannot hold the model (bigger than its budget, or everything there in use) and the
        target is L0, the chunks go through a small pinned staging ring instead and L1 is skipped.
        On the CPU device a load to L0 skips L1 altogether: the chunks are read into the L0 buffer.
        """
        key = spec.key
        try:
            layout = read_header_l2(obj)  # validated before anything is allocated
        except InvalidWeights as exc:
            # It was a valid file when its sha256 was checked on entry: the disk copy rotted.
            raise IntegrityError(f"L2 object {obj.sha256[:12]} has a broken header now: {exc}") from exc
        if self.l2.pin(obj.sha256) is None:
            raise IntegrityError(f"{spec.id}: L2 object vanished before it could be read")
        device_model: DeviceModel | None = None
        block: HostBlock | None = None
        try:
            if tier is not Tier.L0 or not self._direct_l0:
                try:
                    block = self.l1.reserve(key, obj.size, prefetched=not demand)
                except CapacityError:
                    if tier is not Tier.L0:
                        raise
                    log.info("model does not fit L1 now: staging L2 -> L0", extra={"model": spec.id})
            if tier is Tier.L0:
                device_model = self.l0.reserve(key, obj.size, prefetched=not demand)
            self._read_l2(obj, block, device_model, hops, self._is_demand(key, demand))
            self._commit(key, layout, block, device_model)
        except BaseException:
            self._abort(key, block, device_model)
            raise
        finally:
            self.l2.unpin(obj.sha256)

    def _read_l2(
        self,
        obj: L2Object,
        block: HostBlock | None,
        device_model: DeviceModel | None,
        hops: _Hops,
        is_demand: Callable[[], bool],
    ) -> None:
        """Read every chunk of ``obj`` (threads, O_DIRECT where allowed, each chunk's digest checked by
        the thread that read it) into one of three targets:

        - an L1 block, with each chunk copied on to the device as it lands when ``device_model`` is set;
        - on the CPU device with no L1 block, straight into the L0 buffer: no copy at all;
        - otherwise a small pinned staging ring, when L1 cannot hold the model.

        Entries stay invisible until the caller commits them, so a failed chunk leaves nothing behind.
        """
        direct = self._direct_l0 and block is None and device_model is not None
        copier = DeviceCopier(device_model.buffer) if device_model is not None and not direct else None
        window = 2 * self.settings.read_threads
        with contextlib.ExitStack() as stack:
            stack.enter_context(hops.hop("L2->L0" if device_model is not None else "L2->L1"))
            disk = stack.enter_context(self._gates["L2->L1"].transfer(is_demand))
            # The device link is claimed only when bytes will cross it.
            pcie = stack.enter_context(self._gates["L1->L0"].transfer(is_demand)) if copier else None
            reader = stack.enter_context(L2Reader(obj, direct=self.settings.l2_direct_io))
            try:
                landed: Callable[[int, Any], None]
                if direct:
                    assert device_model is not None
                    assert device_model.padded is not None
                    target = into_buffer(*host_view(device_model.padded), obj)

                    def landed(index: int, token: Any) -> None:
                        return None  # already in place: nothing to copy

                elif block is not None:
                    target = into_buffer(*host_view(block.buffer), obj)

                    def landed(index: int, token: Any) -> None:
                        if copier is not None and pcie is not None:
                            start, end = obj.chunk(index)
                            pcie.checkpoint()
                            copier.copy(block.buffer[start:end], start)

                else:
                    assert copier is not None
                    assert pcie is not None
                    ring = StagingRing(window, obj.chunk_bytes, pinned=self.device.type == "cuda")

                    def landed(index: int, token: Any) -> None:
                        start, end = obj.chunk(index)
                        pcie.checkpoint()
                        ring.release(token, copier.copy(ring.slot(token, end - start), start))

                    target = ring.target
                read_l2(
                    reader, pool=self._disk_pool, window=window, transfer=disk, target=target, landed=landed
                )
            finally:
                if copier is not None:
                    copier.finish()

    def _l1_to_l0(self, spec: ModelSpec, block: HostBlock, hops: _Hops, demand: bool) -> None:
        key = spec.key
        layout = block.layout
        assert layout is not None
        device_model = self.l0.reserve(key, layout.file_bytes, prefetched=not demand)
        try:
            copier = DeviceCopier(device_model.buffer)
            with hops.hop("L1->L0"), self._gates["L1->L0"].transfer(self._is_demand(key, demand)) as transfer:
                copier.copy_all(block.buffer, layout.file_bytes, self.settings.chunk_bytes, transfer)
            self._commit(key, layout, None, device_model)
        except BaseException:
            self._abort(key, None, device_model)
            raise

    def _demote_to_l2(self, spec: ModelSpec, hops: _Hops) -> Tier | None:
        """Write a model that L1 or L0 holds to L2, verified like a download; where it came from, or
        None when neither holds it. From L1 the block is written as it is (O_DIRECT, no copy); from L0
        in chunks through host scratch buffers."""
        assert spec.sha256 is not None
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
                store, dest = MemoryStore(device_model.buffer), None
            with self.l2.download_lock(spec.sha256):
                if self.l2.refresh(spec.sha256) is not None:
                    return source
                tw = self.l2.begin(spec.sha256, spec.size_bytes, model=spec.id, version=spec.version)
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

    def _l0_to_l1(self, spec: ModelSpec, hops: _Hops, demand: bool) -> bool:
        """Copy a model down from L0 into L1 when only L0 holds it; False when L0 does not."""
        key = spec.key
        device_model = self.l0.cache.pin(key)
        if device_model is None:
            return False
        try:
            assert device_model.layout is not None  # committed entries have one
            # A copy written down is the same bet as the copy it came from, not a new one: a model that
            # served requests from L0 and is demoted to make room must not be counted as mispredicted.
            prefetched = not demand and self.l0.cache.unused_prefetch(key)
            block = self.l1.reserve(key, device_model.buffer.numel(), prefetched=prefetched)
            try:
                with hops.hop("L0->L1"):
                    size = device_model.buffer.numel()
                    block.buffer[:size].copy_(device_model.buffer)  # synchronous: the block is ready after
                self._commit(key, device_model.layout, block, None)
            except BaseException:
                self._abort(key, block, None)
                raise
        finally:
            self.l0.cache.unpin(key)
        return True

    def _commit(
        self, key: ModelKey, layout: Layout, block: HostBlock | None, device_model: DeviceModel | None
    ) -> None:
        """Make what a load filled visible: its L1 block, its L0 buffer (with a view per tensor)."""
        if block is not None:
            block.layout = layout
            self.l1.cache.commit(key, block)
        if device_model is not None:
            device_model.layout = layout
            device_model.tensors = tensor_views(device_model.buffer, layout)
            self.l0.cache.commit(key, device_model)

    def _abort(self, key: ModelKey, block: HostBlock | None, device_model: DeviceModel | None) -> None:
        """Give back what a failed load reserved; none of it was ever visible."""
        if device_model is not None:
            self.l0.cache.abort(key)
        if block is not None:
            self.l1.cache.abort(key)

    def _store(self, uri: str) -> ObjectStore:
        scheme = uri.partition("://")[0]
        with self._lock:
            store = self._stores.get(scheme)
            if store is None:
                store = self._stores[scheme] = open_store(uri, self.s3_settings)
            return store

    def _observe_bandwidth(self, hop: str, nbytes: int, seconds: float) -> None:
        if seconds <= 0:
            return
        rate = nbytes / seconds
        with self._lock:
            # A fused hop also measures the slowest link it crosses, which is the one the planner asks
            # for (HOP_INTO): a node that always streams L3 -> L1 in one pass must still report L3->L2.
            for name in (hop, *_BOUND_BY.get(hop, ())):
                old = self._bandwidth.get(name)
                # An exponential average: recent loads matter most, one outlier does not swing the planner.
                self._bandwidth[name] = rate if old is None else 0.7 * old + 0.3 * rate

    # ------------------------------------------------------------------ serving

    @contextlib.contextmanager
    def acquire(self, model_id: str) -> Iterator[Mapping[str, torch.Tensor]]:
        """The model's tensors on the device (name → tensor), held against eviction until exit.

        Loads on demand when needed. The mapping is read-only; the tensors are views of one buffer.
        """
        for _attempt in range(3):
            spec = self._spec(model_id)
            self.ensure(model_id, Tier.L0, demand=True)
            model = self.l0.cache.pin(spec.key)
            if model is not None:
                break
            # Evicted (or the catalog moved) between the load and the pin: load again.
        else:
            raise CapacityError(f"{model_id}: evicted from L0 three times before it could be used")
        self.l0.cache.lookup(spec.key, use=True)
        self.l1.cache.lookup(spec.key, use=True)
        try:
            yield MappingProxyType(dict(model.tensors))
        finally:
            self.l0.cache.unpin(spec.key)

    # ------------------------------------------------------------------ evicting

    def evict(self, model_id: str, tier: Tier | str) -> list[Tier]:
        """Drop every version of ``model_id`` from ``tier`` and every tier closer to the GPU.

        ``L3`` means every local tier. Pinned entries go when their last user releases them. Returns the
        tiers something was (or will be) dropped from.
        """
        tier = Tier(tier)
        dropped: list[Tier] = []
        for local in CACHE_TIERS:
            if local.level > tier.level:
                continue
            if self._evict_one(model_id, local):
                dropped.append(local)
        return dropped

    def _evict_one(self, model_id: str, tier: Tier) -> bool:
        if tier is Tier.L2:
            keys = self.l2.cache.evict_where(
                lambda e: e.value is not None and e.value.model == model_id, "order"
            )
            return bool(keys)
        cache: TierCache[ModelKey, Any] = self.l0.cache if tier is Tier.L0 else self.l1.cache
        return bool(cache.evict_where(lambda e: e.key[0] == model_id, "order"))

    # ------------------------------------------------------------------ orders

    def apply(self, order: Order) -> OrderOutcome:
        """Carry out one order. Idempotent by ``order.id``; past its deadline it is skipped (EXPIRED)."""
        now = self._clock()
        with self._lock:
            seen = self._outcomes.get(order.id)
            if seen is not None or order.id in self._orders_in_flight:
                detail = "applied before" if seen is not None else "being applied"
                return OrderOutcome(
                    order_id=order.id,
                    node=order.node,
                    model=order.model,
                    status=OrderStatus.ALREADY,
                    at=now,
                    served_from=seen.served_from if seen else None,
                    detail=f"{detail}: {seen.status.value}" if seen else detail,
                )
            self._orders_in_flight.add(order.id)
        start = time.perf_counter()
        served_from: Tier | None = None
        try:
            status, detail, served_from = self._apply(order, now)
        except PrewarmError as exc:
            status, detail = OrderStatus.FAILED, str(exc)
        except Exception as exc:
            # The consumer loop must keep going whatever one order does; the trace goes to the log.
            log.exception("order failed unexpectedly", extra={"order": order.id})
            status, detail = OrderStatus.FAILED, f"{type(exc).__name__}: {exc}"
        outcome = OrderOutcome(
            order_id=order.id,
            node=order.node,
            model=order.model,
            status=status,
            at=self._clock(),
            seconds=time.perf_counter() - start,
            served_from=served_from,
            detail=detail,
        )
        with self._lock:
            self._orders_in_flight.discard(order.id)
            self._outcomes[order.id] = outcome
            while len(self._outcomes) > _ORDER_MEMORY:
                self._outcomes.popitem(last=False)
            self._recent.append(outcome)
        _metrics.ORDERS.labels(order.action.value, status.value).inc()
        return outcome

    def _apply(self, order: Order, now: float) -> tuple[OrderStatus, str, Tier | None]:
        spec = self._catalog.get(order.model)
        refused = admit(
            order,
            now,
            node=self.settings.node_name,
            catalog_version=spec.version if spec is not None else None,
            catalog_sha256=spec.sha256 if spec is not None else None,
        )
        if refused is not None:
            return refused.status, refused.detail, None
        if order.action is OrderAction.EVICT:
            dropped = self.evict(order.model, order.tier)
            return OrderStatus.DONE, "dropped from " + (",".join(t.value for t in dropped) or "nothing"), None
        # PREFETCH: the target tier holds it afterwards. DEMOTE: the same, then the copies closer to the
        # GPU go (``prewarm.effect`` says what each order does; ``ensure`` takes the path it names).
        result = self.ensure(order.model, order.tier, demand=order.demand)
        if order.action is OrderAction.DEMOTE:
            for closer in CACHE_TIERS:
                if closer.level < order.tier.level:
                    self._evict_one(order.model, closer)
        return OrderStatus.DONE, "", result.served_from

    # ------------------------------------------------------------------ reporting

    def state(self) -> ExecutorState:
        """Per tier: capacity, bytes used, resident models with version, last use and pins."""
        self._sweep()
        gpu = self.device.index if self.device.type == "cuda" else None
        tiers = [
            self._tier_state(Tier.L0, self.l0.cache, gpu),
            self._tier_state(Tier.L1, self.l1.cache, None),
            self._tier_state(Tier.L2, self.l2.cache, None),
        ]
        with self._lock:
            bandwidth = dict(self._bandwidth)
            recent = list(self._recent)
        return ExecutorState(
            node=self.settings.node_name,
            at=self._clock(),
            device=str(self.device),
            tiers=tiers,
            bandwidth_bytes_per_s=bandwidth,
            recent_outcomes=recent,
        )

    def _tier_state(self, tier: Tier, cache: TierCache[Any, Any], gpu: int | None) -> TierState:
        residents = []
        for entry in cache.snapshot():
            if not entry.ready:
                continue
            model, version, sha = self._describe(tier, entry)
            residents.append(
                ResidentModel(
                    model=model,
                    version=version,
                    sha256=sha,
                    bytes=entry.nbytes,
                    last_used=entry.last_used,
                    loaded_at=entry.loaded_at,
                    pins=entry.pins,
                    prefetched=entry.prefetched,
                    gpu=gpu,
                )
            )
        return TierState(tier=tier, capacity_bytes=cache.capacity, used_bytes=cache.used, resident=residents)

    @staticmethod
    def _describe(tier: Tier, entry: Entry[Any, Any]) -> tuple[str, str, str | None]:
        if tier is Tier.L2:
            obj: L2Object | None = entry.value
            assert obj is not None
            return obj.model, obj.version, obj.sha256
        model, version, sha = entry.key
        return model, version, sha

    # ------------------------------------------------------------------ maintenance

    def verify(self) -> list[Any]:
        """Re-hash every L2 object (sha256); mismatches are evicted and re-fetched on next use."""
        return self.l2.verify_all()

    def close(self) -> None:
        self._disk_pool.shutdown(wait=True)
        self._net_pool.shutdown(wait=True)
        if not any(e.pins for e in self.l1.cache.snapshot() + self.l0.cache.snapshot()):
            self.l1.pool.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
