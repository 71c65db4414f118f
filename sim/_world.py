"""The simulated cluster: GPU memory per GPU, host and disk caches per node, transfers that share their
link, and requests that wait for whatever is not yet in GPU memory.

It plays the executors' part by the executor's own rules from the spine: which orders it carries out
(``prewarm.admit``), what each does to a model's copies (``prewarm.effect``, ``prewarm.load_path``),
which copies a full tier gives up (``prewarm.lru_victims``: least recently used, never one still loading
or being read from) and which GPUs an L0 copy takes (``prewarm.gpu_shards``, ``prewarm.gpu_placement``:
a model larger than one GPU takes equal shards on several GPUs of one node). The bytes the LRU gives up
to carry out an order are that order's over-commit.

A load is a job of hops along ``load_path``, each of which reserves its tier's bytes when it starts and
moves them over the link into that tier (``L3->L2`` and ``L2->L1`` per node; ``L1->L0`` per node too:
the node's host-to-device bandwidth, shared by its GPUs) after a fixed overhead. Hops are
store-and-forward: the next starts when the previous has landed. A demand load (a request waits on it)
that finds no room waits until a transfer lands or a copy leaves; a speculative one fails. A request
for a model whose load to GPU memory is in flight waits for that load, and makes it a demand load.
Demotions write down to the farther tier at once (device-to-host copies do not use these links).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from models import Catalog
from prewarm import (
    CACHE_TIERS,
    HOP_INTO,
    ExecutorState,
    GpuState,
    Holding,
    Order,
    OrderAction,
    OrderStatus,
    ResidentModel,
    Tier,
    TierState,
    admit,
    effect,
    gpu_placement,
    gpu_shards,
    load_path,
    lru_victims,
)
from scheduler import Cluster
from sim._links import Clock, Link
from sim._metrics import MISPREDICTION_WINDOW_S, Record
from sim._policies import NodeShape

__all__ = ["HOP_OVERHEAD_S", "LazyReports", "World"]

HOP_OVERHEAD_S = 0.5
"""Fixed cost of each hop (allocation, open, engine hand-over), as the planner assumes by default."""

_INF = float("inf")


@dataclass(eq=False)
class _Copy:
    tier: Tier
    bytes: int
    loaded_at: float  # when its bytes began to arrive: they are held from then
    ready_at: float = _INF  # infinite while in flight
    last_used: float | None = None
    prefetched: bool = False  # brought in speculatively and not used since
    bet: bool = False  # the copy a prefetch was for: leaving while still unused, it was mispredicted
    counted: bool = False  # that prefetch was made in the window
    gpus: tuple[int, ...] = ()
    pins: int = 0  # hops reading from it
    job: _Job | None = None  # bringing it in, while in flight
    followers: list[_Job] = field(default_factory=list)  # jobs waiting for it to land


@dataclass(eq=False)
class _Job:
    """One load of ``model`` on ``node`` to ``target``, hop by hop."""

    node: _Node
    model: str
    size: int
    target: Tier
    hops: list[Tier]  # still to fill, farthest first
    demand: bool
    order: Order | None  # the order it carries out (None: a load on request)
    source: Tier
    gpus: tuple[int, ...] = ()  # GPUs the order asked for
    waiters: list[tuple[int, float]] = field(default_factory=list)  # (record row or -1, arrival)
    left: float = 0.0  # bytes of the current hop still to move (the link's Transfer protocol)
    copy: _Copy | None = None  # being filled by the current hop
    reading: _Copy | None = None  # the copy the current hop reads from
    hop_began: float = 0.0
    link: Link | None = None  # the current hop's bytes are on it
    waiting_on: _Copy | None = None  # a copy in flight it loads from once it lands
    blocked: bool = False
    done: bool = False

    def landed(self) -> None:
        self.node.world.hop_landed(self)


class _Node:
    def __init__(self, world: World, shape: NodeShape, rates: Mapping[str, float]) -> None:
        self.world = world
        self.name = shape.name
        self.shape = shape
        self.gpu_caps = list(shape.gpu_bytes)
        self.gpu_used = [0] * len(self.gpu_caps)
        self.capacity = {Tier.L0: sum(self.gpu_caps), Tier.L1: shape.host_bytes, Tier.L2: shape.disk_bytes}
        self.used = dict.fromkeys(CACHE_TIERS, 0)
        self.copies: dict[Tier, dict[str, _Copy]] = {t: {} for t in CACHE_TIERS}
        self.links = {hop: Link(world.clock, hop, rate) for hop, rate in rates.items()}
        self.jobs: dict[str, list[_Job]] = {}
        self.blocked: list[_Job] = []

    def closest(self, model: str) -> _Copy | None:
        for tier in CACHE_TIERS:
            copy = self.copies[tier].get(model)
            if copy is not None:
                return copy
        return None

    def report(self, now: float, catalog: Catalog) -> ExecutorState:
        def resident(model: str, c: _Copy) -> ResidentModel:
            spec = catalog.get(model)
            return ResidentModel.model_construct(
                model=model,
                version=spec.version if spec else "1",
                sha256=spec.sha256 if spec else None,
                bytes=c.bytes,
                last_used=c.last_used,
                loaded_at=c.loaded_at,
                pins=c.pins,
                prefetched=c.prefetched,
                gpus=list(c.gpus),
            )

        tiers = [
            TierState.model_construct(
                tier=t,
                capacity_bytes=self.capacity[t],
                used_bytes=self.used[t],
                resident=[resident(m, c) for m, c in sorted(self.copies[t].items())],
            )
            for t in CACHE_TIERS
        ]
        gpus = [
            GpuState.model_construct(index=i, capacity_bytes=cap, used_bytes=used)
            for i, (cap, used) in enumerate(zip(self.gpu_caps, self.gpu_used, strict=True))
        ]
        return ExecutorState.model_construct(
            node=self.name,
            at=now,
            device="sim",
            tiers=tiers,
            gpus=gpus,
            bandwidth_bytes_per_s={hop: link.rate for hop, link in self.links.items()},
            recent_outcomes=[],
        )


class LazyReports(Mapping[str, ExecutorState]):
    """The nodes' reports, each built when first read: most policies never read them."""

    def __init__(self, names: Iterable[str], build: Callable[[str], ExecutorState]) -> None:
        self._names = tuple(names)
        self._build = build
        self._built: dict[str, ExecutorState] = {}

    def __getitem__(self, name: str) -> ExecutorState:
        if name not in self._built:
            if name not in self._names:
                raise KeyError(name)
            self._built[name] = self._build(name)
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class World:
    """All nodes of a cluster on one virtual clock, counting into one ``Record``."""

    unlimited = False

    def __init__(
        self,
        cluster: Cluster,
        catalog: Catalog,
        *,
        start: float = -_INF,
        end: float = _INF,
        clock: Clock | None = None,
        hop_overhead_s: float = HOP_OVERHEAD_S,
    ) -> None:
        self.catalog = catalog
        self.clock = clock or Clock(start if start > -_INF else 0.0)
        self.record = Record(start, end)
        self.hop_overhead_s = hop_overhead_s
        self.bandwidth = cluster.bandwidth.hops()
        self.shapes = {
            n.name: NodeShape(
                n.name, tuple(g.memory_bytes for g in n.gpus), n.host_cache_bytes, n.disk_cache_bytes
            )
            for n in cluster.nodes
        }
        self.nodes = {name: _Node(self, shape, self.bandwidth) for name, shape in self.shapes.items()}
        for node in self.nodes.values():
            for hop, link in node.links.items():
                self.record.link_rate[f"{node.name} {hop}"] = link.rate
        self._l0: dict[str, dict[str, _Copy]] = {}  # model -> node -> its L0 copy (ready or loading)
        self._inbound: dict[str, _Job] = {}  # model -> a job bringing it to L0 somewhere
        self._applied: set[str] = set()
        self.waiting = 0  # requests in the window still waiting for their load

    # ------------------------------------------------------------------ requests

    def closest(self, node: str, model: str) -> Tier:
        """The closest tier of ``node`` holding ``model`` now (ready or arriving); L3 when none."""
        copy = self.nodes[node].closest(model)
        return copy.tier if copy is not None else Tier.L3

    def fits(self, model: str) -> bool:
        """Whether some node's GPUs can hold ``model`` at all."""
        size = self.catalog[model].size_bytes
        return any(gpu_shards(size, n.gpu_caps) is not None for n in self.nodes.values())

    def request(self, model: str, at: float) -> str:
        """A request arrives: served at once from a ready GPU copy, else it waits for a load (the one in
        flight, or one from the node whose copy is closest). Returns the node that serves it."""
        record = self.record
        counted = record.start <= at < record.end
        on = self._l0.get(model)
        if on:
            for name, copy in on.items():
                if copy.ready_at <= at:
                    self._touch(self.nodes[name], model, at)
                    if counted:
                        record.request(at, model, False, Tier.L0)
                    return name
        job = self._inbound.get(model)
        if job is None:
            job = self._route(model, at)
        row = record.request(at, model, True, job.source) if counted else -1
        if counted:
            self.waiting += 1
        job.waiters.append((row, at))
        self._touch(job.node, model, at)
        self._make_demand(job)
        return job.node.name

    def _route(self, model: str, at: float) -> _Job:
        size = self.catalog[model].size_bytes

        def rank(node: _Node) -> tuple[int, int, int]:
            copy = node.closest(model)
            if copy is None:
                return (Tier.L3.level, 0, -sum(node.gpu_caps) + sum(node.gpu_used))
            return (copy.tier.level, copy.ready_at > at, -node.capacity[Tier.L0] + node.used[Tier.L0])

        able = [n for n in self.nodes.values() if gpu_shards(size, n.gpu_caps) is not None]
        node = min(able, key=rank)
        job = self._job(node, model, Tier.L0, demand=True, order=None)
        self._start(job)
        return job

    def _touch(self, node: _Node, model: str, at: float) -> None:
        for tier in CACHE_TIERS:
            copy = node.copies[tier].get(model)
            if copy is not None:
                copy.last_used = at
                copy.prefetched = False

    def _make_demand(self, job: _Job | None) -> None:
        """A request waits on ``job``: it, and the loads it waits for, pre-empt speculative transfers."""
        while job is not None and not job.demand:
            if job.link is not None:
                job.link.progress()  # what it moved so far, it moved at the speculative share
            job.demand = True
            if job.link is not None:
                job.link.changed()
            upstream = job.reading if job.reading is not None else job.waiting_on
            job = upstream.job if upstream is not None else None

    # ------------------------------------------------------------------ jobs

    def _job(self, node: _Node, model: str, target: Tier, *, demand: bool, order: Order | None) -> _Job:
        size = self.catalog[model].size_bytes
        source = node.closest(model)
        frm = source.tier if source is not None else Tier.L3
        job = _Job(
            node=node,
            model=model,
            size=size,
            target=target,
            hops=list(load_path(frm, target)),
            demand=demand,
            order=order,
            source=frm,
            gpus=tuple(order.gpus) if order is not None else (),
        )
        # What a load asks of each link it will cross, counted when it is asked for: under a link that
        # cannot keep up this is more than the link moves, and the difference is the backlog.
        now = self.clock.now
        for tier in job.hops:
            self.record.asked(f"{node.name} {HOP_INTO[tier]}", size, now)
        node.jobs.setdefault(model, []).append(job)
        if target is Tier.L0:
            self._inbound.setdefault(model, job)
        return job

    def _start(self, job: _Job) -> None:
        """Start the job's next hop, once the copy it reads from has landed and its tier has room."""
        node, now = job.node, self.clock.now
        source = node.closest(job.model)
        if source is not None and job.hops and source.tier.level <= job.hops[0].level:
            # Another load brought a closer copy meanwhile: go on from there.
            job.hops = list(load_path(source.tier, job.target))
        if not job.hops:
            if source is not None and source.ready_at == _INF:
                job.waiting_on = source  # the copy it needs is someone else's load in flight
                source.followers.append(job)
            else:
                self._finish(job)
            return
        if source is not None and source.ready_at == _INF:
            job.waiting_on = source  # still arriving: go on when it lands
            source.followers.append(job)
            return
        job.waiting_on = None
        tier = job.hops[0]
        if node.capacity[tier] < job.size and tier is not Tier.L0:
            copy = None  # this cache cannot hold it at all: streamed through, as the executor's ring does
        else:
            placed = self._room(node, tier, job)
            if placed is None:
                if job.demand:
                    if not job.blocked:
                        job.blocked = True
                        node.blocked.append(job)
                        if self.record.counts(now):
                            self.record.queued_loads += 1
                else:
                    if job.order is not None and self.record.counts(now):
                        self.record.failed_orders += 1
                    self._drop_job(job)
                return
            copy = self._hold(node, tier, job, placed)
        if job.blocked:
            job.blocked = False
            node.blocked.remove(job)
        job.copy, job.reading, job.hop_began = copy, source, now
        if source is not None:
            source.pins += 1
        self.clock.at(now + self.hop_overhead_s, self._enqueue, job)

    def _enqueue(self, job: _Job) -> None:
        link = job.node.links[HOP_INTO[job.hops[0]]]
        job.left, job.link = float(job.size), link
        link.add(job)

    def hop_landed(self, job: _Job) -> None:
        """The current hop's bytes are in: the copy is ready, the next hop may start."""
        now, node = self.clock.now, job.node
        tier = job.hops.pop(0)
        job.left, job.link = 0.0, None
        self.record.moved(HOP_INTO[tier], job.size, now)
        if job.reading is not None:
            job.reading.pins -= 1
            job.reading = None
        copy = job.copy
        if copy is not None:
            copy.ready_at, copy.job = now, None
            if job.demand:
                copy.last_used = now
            if tier is Tier.L0 and self.record.counts(now):
                self.record.gpu_seconds_loading += (now - job.hop_began) * len(copy.gpus)
            followers, copy.followers = copy.followers, []
            for follower in followers:
                self._start(follower)
        job.copy = None
        self._start(job)
        self._retry(node)

    def _finish(self, job: _Job) -> None:
        job.done = True
        self._drop_job(job)
        now = self.clock.now
        for row, at in job.waiters:
            if row >= 0:
                self.record.req_wait[row] = now - at
                self.waiting -= 1

    def _drop_job(self, job: _Job) -> None:
        jobs = job.node.jobs.get(job.model, [])
        if job in jobs:
            jobs.remove(job)
        if self._inbound.get(job.model) is job:
            del self._inbound[job.model]
            for other in (j for n in self.nodes.values() for j in n.jobs.get(job.model, [])):
                if other.target is Tier.L0:
                    self._inbound[job.model] = other
                    break

    def _retry(self, node: _Node) -> None:
        for job in list(node.blocked):
            if job.blocked:
                self._start(job)

    # ------------------------------------------------------------------ bytes in tiers

    def _room(self, node: _Node, tier: Tier, job: _Job) -> tuple[int, ...] | None:
        """Make room for ``job``'s copy in ``tier`` by the LRU rule: the GPUs an L0 copy goes to (() for
        the other tiers), or None when even every evictable copy would not make enough."""
        displaced = 0
        if tier is Tier.L0:
            found = self._gpu_room(node, job)
            if found is None:
                return None
            gpus, victims = found
        else:
            free = node.capacity[tier] - node.used[tier]
            chosen = [] if job.size <= free else lru_victims(self._holdings(node, tier), job.size, free)
            if chosen is None:
                return None
            gpus, victims = (), chosen
        for model in victims:
            displaced += node.copies[tier][model].bytes
            self.drop(node, tier, model)
        if job.order is not None and self.record.counts(self.clock.now):
            self.record.over_commit_bytes += displaced
        return gpus

    def _holdings(self, node: _Node, tier: Tier) -> list[Holding[str]]:
        now = self.clock.now
        return [
            Holding(m, c.bytes, c.last_used or c.loaded_at, pins=c.pins, ready=c.ready_at <= now)
            for m, c in node.copies[tier].items()
        ]

    def _gpu_room(self, node: _Node, job: _Job) -> tuple[tuple[int, ...], list[str]] | None:
        """The GPUs an L0 copy takes and the LRU victims that make room there.

        Where the shards fit as things are, ``gpu_placement`` chooses (the order's GPUs if it names ones
        with room). Otherwise, for each GPU ``lru_victims`` names what must go for one shard to fit, and
        the GPUs whose victims were least recently used are chosen; a victim sharded over several GPUs
        frees its shard on each of them.
        """
        n = gpu_shards(job.size, node.gpu_caps)
        if n is None:
            return None
        shard = -(-job.size // n)
        free = [cap - used for cap, used in zip(node.gpu_caps, node.gpu_used, strict=True)]
        asked = tuple(sorted(set(job.gpus)))
        if len(asked) == n and all(0 <= g < len(free) and free[g] >= shard for g in asked):
            return asked, []
        placed = gpu_placement(job.size, node.gpu_caps, free)
        if placed is not None:
            return placed, []
        now = self.clock.now
        options: dict[int, tuple[float, list[str]]] = {}
        for g, cap in enumerate(node.gpu_caps):
            if cap < shard:
                continue
            here = [
                Holding(m, -(-c.bytes // len(c.gpus)), c.last_used or c.loaded_at, c.pins, c.ready_at <= now)
                for m, c in node.copies[Tier.L0].items()
                if g in c.gpus
            ]
            victims = lru_victims(here, shard, free[g])
            if victims is not None:
                recency = {h.key: h.recency for h in here}
                options[g] = (max((recency[v] for v in victims), default=-_INF), victims)
        pick = sorted(options, key=lambda g: (options[g][0], g))[:n]
        if len(pick) < n:
            return None
        return tuple(sorted(pick)), list(dict.fromkeys(v for g in pick for v in options[g][1]))

    def _hold(self, node: _Node, tier: Tier, job: _Job, gpus: tuple[int, ...]) -> _Copy:
        now = self.clock.now
        speculative = not job.demand and tier is not Tier.L2  # the executor reports host and GPU copies
        copy = _Copy(
            tier=tier,
            bytes=job.size,
            loaded_at=now,
            last_used=now if job.demand else None,
            prefetched=speculative,
            bet=speculative and tier is job.target,
            counted=self.record.counts(now),
            gpus=gpus,
            job=job,
        )
        if tier is Tier.L0:
            shard = -(-job.size // max(len(gpus), 1))
            for g in gpus:
                node.gpu_used[g] += shard
            self._l0.setdefault(job.model, {})[node.name] = copy
        node.copies[tier][job.model] = copy
        node.used[tier] += job.size
        return copy

    def drop(self, node: _Node, tier: Tier, model: str) -> None:
        """``model``'s copy leaves ``tier`` of ``node``: its residence is counted, its bet settled."""
        copy = node.copies[tier].pop(model)
        node.used[tier] -= copy.bytes
        now = self.clock.now
        if tier is Tier.L0:
            shard = -(-copy.bytes // max(len(copy.gpus), 1))
            for g in copy.gpus:
                node.gpu_used[g] -= shard
            on = self._l0.get(model)
            if on is not None:
                on.pop(node.name, None)
                if not on:
                    del self._l0[model]
        if copy.ready_at <= now:
            self.record.resident(tier, copy.bytes, copy.ready_at, now)
        if copy.bet and copy.prefetched and copy.counted and self.record.counts(now):
            self.record.mispredictions += 1

    def _write_down(self, node: _Node, model: str, to: Tier, order: Order) -> bool:
        """Copy ``model`` from its closest copy into the farther tier ``to``: a demotion's first half."""
        source = node.closest(model)
        if source is None or source.ready_at > self.clock.now:
            return False
        probe = _Job(node, model, source.bytes, to, [to], order.demand, order, source.tier)
        if self._room(node, to, probe) is None:
            return False
        now = self.clock.now
        # Still unused if the copy it came from was; a disk copy never is. The bet stays on the copy
        # it was made for, and is settled when that one leaves.
        unused = not order.demand and to is not Tier.L2 and source.prefetched
        copy = _Copy(to, source.bytes, now, now, source.last_used, unused)
        node.copies[to][model] = copy
        node.used[to] += copy.bytes
        return True

    # ------------------------------------------------------------------ orders

    def apply(self, order: Order, now: float) -> OrderStatus:
        """Apply ``order`` as an executor would (see the module docstring)."""
        node = self.nodes.get(order.node)
        refused = admit(
            order,
            now,
            node=node.name if node is not None else "",
            spec=self.catalog.get(order.model),
            seen="applied before" if order.id in self._applied else None,
        )
        self._applied.add(order.id)
        if refused is not None or node is None:
            return refused.status if refused is not None else OrderStatus.FAILED
        status = self._carry_out(node, order)
        if status is OrderStatus.FAILED and self.record.counts(now):
            self.record.failed_orders += 1
        self._retry(node)
        return status

    def _carry_out(self, node: _Node, order: Order) -> OrderStatus:
        model = order.model
        held = [t for t in CACHE_TIERS if model in node.copies[t]]
        change = effect(order.action, order.tier, held)
        now = self.clock.now
        if any(node.copies[t][model].ready_at > now for t in change.drops):
            return OrderStatus.FAILED  # a copy still loading is not dropped: its load finishes first
        if change.fills and change.source.level > order.tier.level:
            if any(j.target.level <= order.tier.level for j in node.jobs.get(model, [])):
                return OrderStatus.DONE  # already on its way there
            if order.tier is Tier.L0 and gpu_shards(self.catalog[model].size_bytes, node.gpu_caps) is None:
                return OrderStatus.FAILED
            job = self._job(node, model, order.tier, demand=order.demand, order=order)
            speculative = order.action is OrderAction.PREFETCH and not order.demand
            if speculative and order.tier in (Tier.L0, Tier.L1) and self.record.counts(now):
                self.record.prefetches += 1
            self._start(job)
        elif change.fills and not self._write_down(node, model, order.tier, order):
            return OrderStatus.FAILED
        for tier in change.drops:
            self.drop(node, tier, model)
        return OrderStatus.DONE

    # ------------------------------------------------------------------ reports and the end

    def reports(self, now: float) -> Mapping[str, ExecutorState]:
        return LazyReports(self.nodes, lambda name: self.nodes[name].report(now, self.catalog))

    def finish(self) -> None:
        """Count what is still resident at the window's end, and prefetches left unused long enough."""
        end = self.record.end
        for node in self.nodes.values():
            for tier in CACHE_TIERS:
                for copy in node.copies[tier].values():
                    if copy.ready_at <= end:
                        self.record.resident(tier, copy.bytes, copy.ready_at, end)
                    if (
                        copy.bet
                        and copy.prefetched
                        and copy.counted
                        and copy.ready_at <= end - MISPREDICTION_WINDOW_S
                    ):
                        self.record.mispredictions += 1
