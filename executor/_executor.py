"""The ``Executor``: what a GPU node runs, and the API the order consumer and inference servers call.

It owns the three local tiers (``_l0``, ``_l1``, ``_l2``, over ``_tier``) and is a thin facade over
two parts: the hop paths that move a model between them (``_hops.Loader``) and order application
(``_orders.OrderBook``). Every method is thread-safe.

L0 is per GPU (``_l0``): one executor drives every GPU of its node, places a new L0 copy on the GPUs
an order names (``ensure(..., gpus=)``) or where ``prewarm.gpu_placement`` says, holds a model larger
than one GPU as whole-tensor shards across several, and reports each GPU in ``state().gpus``.

Leases: ``lease`` gives an engine process (through the hand-off socket, ``_handoff``) a model's L1
block and pins it there until ``release``; ``lease_device`` does the same for its L0 copy (share or
copy mode; a copy-mode release with ``copied`` frees the executor's copy), and a ``rank`` asks for one
shard. A leased copy is never chosen to make room (it is pinned), an order to evict or demote it is not
carried out for that tier while the lease lasts, and a catalog change makes it unservable to new
clients but leaves it to the engines that hold it.

Staleness: L1 and L0 entries are keyed by ``(model, version, sha256)`` and looked up with the key of
the catalog now in force, so after ``update_catalog`` an old copy is unreachable (and evicted as
``stale`` as soon as nothing pins it). L2 is addressed by sha256 alone: bytes with a digest are never
stale, only unused.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import torch

from executor import _metrics
from executor._hops import Loader
from executor._l0 import L0Cache, gpu_capacities
from executor._l0 import l0_devices as node_devices
from executor._l1 import HostBlock, L1Cache
from executor._l2 import L2Cache
from executor._leases import DeviceLease, HostLease, tier_state
from executor._orders import OrderBook
from executor._pipeline import RingFactory, StagingRing
from executor._result import LoadResult
from executor._stores import ObjectStore
from executor._tier import ModelKey, TierCache
from models import Catalog, ModelSpec
from prewarm import (
    CACHE_TIERS,
    CapacityError,
    ConfigError,
    ExecutorSettings,
    ExecutorState,
    GpuState,
    IntegrityError,
    InvalidInput,
    Order,
    OrderOutcome,
    S3Settings,
    Settings,
    Tier,
    TierState,
    get_logger,
)
from prewarm_client import BlockLayout

__all__ = ["DeviceLease", "Executor", "HostLease", "LoadResult"]

log = get_logger(__name__)

_V = TypeVar("_V")


class Executor:
    """The tier pipeline of one node. Build it once; ``close`` it at shutdown.

    ``direct_l0``: read L2 → L0 and download L3 → L0 straight into the L0 buffer, skipping L1. Only the
    CPU device can (its "device memory" is host RAM); the default is on there and off on CUDA, and off
    on the CPU device runs the CUDA structure (through L1 or the staging ring, with device copies).
    ``stores``: the object store to use per uri scheme, instead of the one ``open_store`` would open.
    ``staging_ring``: builds the ring a model too big for L1 is staged through (``StagingRing``).
    ``l0_devices``: the device of each GPU of L0, in the node's order, instead of the ones ``device`` and
    ``l0_gpus`` name (the GPU check puts two on one CUDA device to run the multi-GPU structure there).
    """

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
        direct_l0: bool | None = None,
        stores: Mapping[str, ObjectStore] | None = None,
        staging_ring: RingFactory | None = None,
        l0_devices: Sequence[str] | None = None,
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
        self._lock = threading.Lock()
        devices = (
            [torch.device(d) for d in l0_devices]
            if l0_devices
            else node_devices(device or self.settings.device, self.settings.l0_gpus)
        )
        self.device = devices[0]  # the first GPU: where L1 is pinned for, and what ``state`` names
        if direct_l0 is None:
            direct_l0 = self.device.type == "cpu"
        elif direct_l0 and self.device.type != "cpu":
            raise ConfigError(
                f"direct_l0 reads into the L0 buffer as host memory: only the cpu device has that, "
                f"not {self.device}",
                setting="direct_l0",
            )
        cfg = self.settings
        self.l2 = L2Cache(
            Path(cache_dir or cfg.cache_dir or Path(".prewarm/cache")),
            cfg.l2_budget_bytes,
            chunk_bytes=cfg.chunk_bytes,
            clock=clock,
            direct_io=cfg.l2_direct_io,
        )
        # An unused prefetch has one owner: the scheduler's misprediction rule, which counts it once,
        # demotes it one tier and keeps it from being fetched straight back. A TTL of its own here fired
        # first and dropped the copy behind the planner's back, so it is off unless set, as a safety net
        # for an executor that no scheduler drives (an infinite TTL never expires anything).
        ttl_s = cfg.prefetch_ttl_s if cfg.prefetch_ttl_s is not None else math.inf
        self.l1 = L1Cache(cfg.l1_budget_bytes, pinned=self.device.type == "cuda", clock=clock, ttl_s=ttl_s)
        self.l0 = L0Cache(
            list(zip(devices, gpu_capacities(cfg, devices), strict=True)), clock=clock, ttl_s=ttl_s
        )
        self._loader = Loader(
            settings=cfg,
            s3=self.s3_settings,
            device=self.device,
            l0=self.l0,
            l1=self.l1,
            l2=self.l2,
            direct_l0=direct_l0,
            stores=stores or {},
            staging_ring=staging_ring or StagingRing,
        )
        self._orders = OrderBook(self, name=cfg.node_name, clock=clock)
        self._leases: dict[str, HostLease] = {}
        self._device_leases: dict[str, DeviceLease] = {}
        self._lease_ids = itertools.count(1)
        self._lease_waits: dict[tuple[Tier, ModelKey], float] = {}  # the latest lease's wait, per tier

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
        """Evict stale versions, and prefetched entries whose TTL ran out if one is set (a few entries)."""
        current = {spec.key for spec in self._catalog}
        for cache in (self.l0.cache, self.l1.cache):
            cache.evict_where(lambda e: e.key not in current, "stale")
            cache.expire()

    # ------------------------------------------------------------------ loading

    def ensure(
        self,
        model_id: str,
        tier: Tier | str = Tier.L0,
        *,
        demand: bool = False,
        gpus: Sequence[int] = (),
        hold_until: float | None = None,
    ) -> LoadResult:
        """Bring ``model_id`` (the catalog's current version) to ``tier`` (L0, L1 or L2).

        ``demand=True`` means a request is waiting: this load pre-empts prefetches on shared links, and
        the entries it creates count as used. Otherwise the entries are prefetched (see ``prefetch_ttl_s``).
        ``gpus``: the node's GPUs a new L0 copy goes to, one shard each (an order's ``gpus``); empty:
        where ``prewarm.gpu_placement`` puts it. A copy already in L0 stays where it is.
        ``hold_until`` (a prefetch order's): the copy in ``tier``, while no request has used it, counts
        as used then for the LRU (``prewarm.held_recency``).
        """
        tier = Tier(tier)
        if tier is Tier.L3:
            raise InvalidInput("ensure targets L0, L1 or L2; L3 is where weights come from", reason="tier")
        spec = self._spec(model_id)
        self._sweep()
        result = self._loader.load(spec, tier, demand, gpus if tier is Tier.L0 else ())
        if hold_until is not None and tier is not Tier.L2:  # a copy a request used is not held
            (self.l0 if tier is Tier.L0 else self.l1).cache.hold(spec.key, hold_until)
        _metrics.HITS.labels(result.served_from.value).inc()
        log.debug("ensured", extra=result.to_json())
        return result

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

    # ------------------------------------------------------------------ leases

    def _checked_spec(self, model_id: str, version: str | None, sha256: str | None) -> ModelSpec:
        """The catalog's entry, when the engine's fingerprint matches it; ``IntegrityError`` says why not."""
        spec = self._spec(model_id)
        wrong = [
            f"{what} {asked!r} (the executor holds {held!r})"
            for what, asked, held in (("version", version, spec.version), ("sha256", sha256, spec.sha256))
            if asked is not None and asked != held
        ]
        if wrong:
            raise IntegrityError(f"{model_id}: refused, fingerprint mismatch: asked for " + ", ".join(wrong))
        return spec

    def _load_and_pin(
        self, model_id: str, spec: ModelSpec, tier: Tier, cache: TierCache[ModelKey, _V], load: bool
    ) -> tuple[_V, Tier] | None:
        """Bring ``model_id`` to ``tier`` (unless not ``load``) and pin its copy there: the copy and where
        the load served it from; None when it is not there and may not be loaded."""
        served_from = tier
        for _attempt in range(3):
            if load:
                served_from = self.ensure(model_id, tier, demand=True).served_from
            value = cache.pin(spec.key)
            if value is not None:
                return value, served_from
            if not load:
                return None
            # Evicted (or the catalog moved) between the load and the pin: load again.
        raise CapacityError(f"{model_id}: evicted from {tier} three times before it could be leased")

    def lease(
        self,
        model_id: str,
        *,
        version: str | None = None,
        sha256: str | None = None,
        load: bool = True,
        rank: int | None = None,
    ) -> HostLease | None:
        """Pin ``model_id``'s L1 block for an engine until ``release``; load it to L1 first (as a demand
        load) unless ``load`` is False, when None means it is not in L1.

        ``version`` and ``sha256`` are the engine's fingerprint: when either differs from the catalog's
        entry (the only copy the executor serves) nothing is served and ``IntegrityError`` says why.
        ``rank``: the engine is that rank of a model held across GPUs and wants its shard alone; the
        lease says which bytes of the block it is (``shard``).
        """
        started = time.perf_counter()
        spec = self._checked_spec(model_id, version, sha256)
        pinned = self._load_and_pin(model_id, spec, Tier.L1, self.l1.cache, load)
        if pinned is None:
            return None
        block, served_from = pinned
        try:
            shard = None if rank is None else self._rank_range(spec, block, rank)
        except BaseException:
            self.l1.cache.unpin(spec.key)
            raise
        self.l1.cache.lookup(spec.key, use=True)
        assert block.layout is not None  # committed blocks have one
        # A block filled from L2 knows its files; one copied down from L0 holds the weights alone, laid
        # out as every load lays them (each file at the next aligned offset, in load order).
        files = block.files or BlockLayout.pack([(f.path, f.size_bytes) for f in spec.weight_files()])
        wait = time.perf_counter() - started
        with self._lock:
            lease_id = f"{os.getpid()}-{next(self._lease_ids)}"
            lease = HostLease(lease_id, spec, block, files, served_from, wait, shard)
            self._leases[lease.id] = lease
            self._lease_waits[(Tier.L1, spec.key)] = wait
        return lease

    def _rank_range(self, spec: ModelSpec, block: HostBlock, rank: int) -> tuple[int, int]:
        """Rank ``rank``'s bytes of the model: its shard in L0 when L0 holds it, else the shard it would
        get on this node (``L0Cache.shards_for``: the same cut)."""
        model = self.l0.cache.lookup(spec.key, use=False)
        assert block.layout is not None  # committed blocks have one
        ranges = (
            [(s.start, s.end) for s in model.shards]
            if model is not None
            else self.l0.shards_for(block.layout.file_bytes, block.layout)  # the bytes L0 would place
        )
        if not 0 <= rank < len(ranges):
            raise InvalidInput(
                f"{spec.id} is held as {len(ranges)} shard(s) on this node: no rank {rank}", reason="rank"
            )
        return ranges[rank]

    def lease_device(
        self,
        model_id: str,
        *,
        version: str | None = None,
        sha256: str | None = None,
        rank: int | None = None,
        mode: str = "share",
        load: bool = True,
    ) -> DeviceLease | None:
        """Pin ``model_id``'s L0 copy for an engine (``mode`` share: it maps this memory; copy: it clones
        it, and ``release(..., copied=True)`` then frees this copy). Loads it to L0 first (demand) unless
        ``load`` is False, when None means L0 does not hold it. ``rank``: that shard alone; None: all.

        The lease works on any device; handing it over (CUDA IPC handles) is the socket's part.
        """
        if mode not in ("share", "copy"):
            raise InvalidInput(f"mode must be share or copy, not {mode!r}", reason="mode")
        started = time.perf_counter()
        spec = self._checked_spec(model_id, version, sha256)
        pinned = self._load_and_pin(model_id, spec, Tier.L0, self.l0.cache, load)
        if pinned is None:
            return None
        model, served_from = pinned
        if rank is not None and not 0 <= rank < len(model.shards):
            self.l0.cache.unpin(spec.key)
            raise InvalidInput(
                f"{model_id} is held as {len(model.shards)} shard(s) in L0: no rank {rank}", reason="rank"
            )
        self.l0.cache.lookup(spec.key, use=True)
        shards = model.shards if rank is None else (model.shards[rank],)
        wait = time.perf_counter() - started
        with self._lock:
            lease_id = f"{os.getpid()}-{next(self._lease_ids)}"
            lease = DeviceLease(lease_id, spec, model, shards, mode, served_from, wait)
            self._device_leases[lease.id] = lease
            self._lease_waits[(Tier.L0, spec.key)] = wait
        return lease

    def release(self, lease_id: str, *, copied: bool = False) -> bool:
        """End a lease; False when there is no such lease (already released). ``copied``: the engine of
        a copy-mode L0 lease has its own copy now, so this one leaves GPU memory."""
        with self._lock:
            lease = self._leases.pop(lease_id, None)
            device_lease = self._device_leases.pop(lease_id, None) if lease is None else None
        if lease is not None:
            self.l1.cache.unpin(lease.spec.key)
            return True
        if device_lease is None:
            return False
        key = device_lease.spec.key
        self.l0.cache.unpin(key)
        if copied and device_lease.mode == "copy" and key not in self._leased_keys(Tier.L0):
            # Lower tiers keep what they hold: the engine has the model, this node still has the bytes.
            self.l0.cache.evict(key, "handed_off")
        return True

    def leases(self) -> list[HostLease]:
        with self._lock:
            return list(self._leases.values())

    def device_leases(self) -> list[DeviceLease]:
        with self._lock:
            return list(self._device_leases.values())

    def _leased_keys(self, tier: Tier = Tier.L1) -> dict[ModelKey, int]:
        held: list[HostLease] | list[DeviceLease] = (
            self.leases() if tier is Tier.L1 else self.device_leases() if tier is Tier.L0 else []
        )
        counts: dict[ModelKey, int] = {}
        for lease in held:
            counts[lease.spec.key] = counts.get(lease.spec.key, 0) + 1
        return counts

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
        leased = self._leased_keys(tier)
        if any(key[0] == model_id for key in leased):
            log.info(f"leased by an engine: stays in {tier.value}", extra={"model": model_id})
        return bool(cache.evict_where(lambda e: e.key[0] == model_id and e.key not in leased, "order"))

    # ------------------------------------------------------------------ orders

    def apply(self, order: Order) -> OrderOutcome:
        """Carry out one order. Idempotent by ``order.id``; past its deadline it is skipped (EXPIRED)."""
        return self._orders.apply(order)

    # ------------------------------------------------------------------ reporting

    def state(self) -> ExecutorState:
        """Per tier: capacity, bytes used, resident models with version, last use and pins."""
        self._sweep()
        self.l2.check_budget()  # L2's capacity is what its filesystem can hold now, not only the setting
        tiers = [
            self._tier_state(Tier.L0, self.l0.cache),
            self._tier_state(Tier.L1, self.l1.cache),
            self._tier_state(Tier.L2, self.l2.cache),
        ]
        used = self.l0.used_per_gpu()
        gpus = [
            GpuState(index=gpu.index, capacity_bytes=gpu.capacity, used_bytes=used[gpu.index])
            for gpu in self.l0.gpus
        ]
        return ExecutorState(
            node=self.settings.node_name,
            at=self._clock(),
            device=str(self.device),
            tiers=tiers,
            gpus=gpus,
            bandwidth_bytes_per_s=self._loader.bandwidth(),
            link_demand_busy=self._loader.demand_busy(),
            recent_outcomes=self._orders.recent(),
            demand_loads=self._loader.demand_loads(),
        )

    def _tier_state(self, tier: Tier, cache: TierCache[Any, Any]) -> TierState:
        with self._lock:
            waits = {key: wait for (where, key), wait in self._lease_waits.items() if where is tier}
        return tier_state(tier, cache, self._leased_keys(tier), waits)

    # ------------------------------------------------------------------ maintenance

    def verify(self) -> list[Any]:
        """Re-hash every L2 object (sha256); mismatches are evicted and re-fetched on next use."""
        return self.l2.verify_all()

    def close(self) -> None:
        self._loader.close()
        if not any(e.pins for e in self.l1.cache.snapshot() + self.l0.cache.snapshot()):
            self.l1.pool.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
