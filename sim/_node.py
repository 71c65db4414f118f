"""What the simulated world is made of: a model's copy in one tier of one node, a load moving it hop by
hop, a node's tiers and links, and the reports a node gives of itself (built only when read)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

from models import Catalog
from prewarm import (
    CACHE_TIERS,
    HOP_INTO,
    BusyShare,
    Effect,
    ExecutorState,
    GpuState,
    Order,
    OrderAction,
    ResidentModel,
    Tier,
    TierState,
    UseCounts,
    effect,
    gpu_shards,
    held_recency,
    load_path,
)
from sim._links import Link
from sim._policies import NodeShape, build

if TYPE_CHECKING:
    from sim._world import World

__all__ = [
    "HOP_OVERHEAD_S",
    "INF",
    "Copy",
    "GpuRoom",
    "Job",
    "LazyReports",
    "Node",
    "cached_effect",
    "cached_path",
]


@functools.cache
def cached_effect(action: OrderAction, tier: Tier, held: tuple[Tier, ...]) -> Effect:
    """``prewarm.effect``, remembered: it is pure, and a world asks it once per order."""
    return effect(action, tier, held)


@functools.cache
def cached_path(frm: Tier, to: Tier) -> tuple[Tier, ...]:
    """``prewarm.load_path``, remembered (pure, and asked on every load)."""
    return load_path(frm, to)


HOP_OVERHEAD_S = 0.5
"""Fixed cost of each hop (allocation, open, engine hand-over), as the planner assumes by default."""

INF = float("inf")
"""``Copy.ready_at`` of a copy still in flight."""


@dataclass(eq=False, slots=True)  # slots: made per hop and read on every request, a little quicker
class Copy:
    """One model's bytes in one tier of one node; ``prewarm.Evictable`` for the LRU rule as it is."""

    key: str  # the model
    tier: Tier
    bytes: int
    loaded_at: float  # when its bytes began to arrive: they are held from then
    ready_at: float = INF  # infinite while in flight
    last_used: float | None = None
    prefetched: bool = False  # brought in speculatively and not used since
    bet: bool = False  # the copy a prefetch was for: leaving while still unused, it was mispredicted
    counted: bool = False  # the prefetch that made it was ordered in the window (``Job.counted``)
    staged: bool = False  # put on disk by a prefetch for the disk, and read by no load since
    hold_until: float | None = None  # the bet's order's: counts as used then until used (LRU)
    gpus: tuple[int, ...] = ()
    pins: int = 0  # hops reading from it
    job: Job | None = None  # bringing it in, while in flight
    followers: list[Job] = field(default_factory=list)  # jobs waiting for it to land
    # When it was last used, or loaded if never used: a field, not a property, because the LRU reads it
    # of every copy of a tier each time it makes room there. ``use`` keeps it and ``last_used`` in step.
    recency: float = field(init=False, default=0.0)
    # Bytes it takes on each of its GPUs (all of them with none: not in GPU memory); its GPUs never
    # change, and GPU room reads it on every copy it weighs.
    shard: int = field(init=False, default=0)
    # Its entry in the node's last report, with what that entry says that can change (last use, pins,
    # prefetched): a planner reads every report every tick, and most copies did not change in between.
    reported: tuple[tuple[float | None, int, bool], ResidentModel] | None = field(
        init=False, default=None, repr=False
    )

    def __post_init__(self) -> None:
        self.recency = held_recency(self.last_used, self.loaded_at, self.hold_until)
        self.shard = -(-self.bytes // max(len(self.gpus), 1))

    def use(self, at: float) -> None:
        self.last_used = self.recency = at

    @property
    def nbytes(self) -> int:
        return self.bytes

    @property
    def ready(self) -> bool:
        return self.ready_at != INF


@dataclass(eq=False, slots=True)
class Job:
    """One load of ``model`` on ``node`` to ``target``, hop by hop."""

    node: Node
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
    copy: Copy | None = None  # being filled by the current hop
    reading: Copy | None = None  # the copy the current hop reads from
    hop_began: float = 0.0
    link: Link | None = None  # the current hop's bytes are on it
    waiting_on: Copy | None = None  # a copy in flight it loads from once it lands
    blocked: bool = False
    blocked_on: Tier | None = None  # the tier it waits for room in, while blocked
    done: bool = False
    coming: int = 0  # GPU bytes it is to take on its node and does not hold yet (``Node.coming``)
    counted: bool = False  # a prefetch ordered in the window (its copy's guess is settled there)

    def landed(self) -> None:
        self.node.world.hop_landed(self)


GpuRoom = tuple[tuple[int, ...], list[str], float]
"""``Node.gpu_room``: the GPUs an L0 copy takes, the LRU victims that make room there, and when the most
recently used of them was last used (-inf: none)."""


class Node:
    def __init__(self, world: World, shape: NodeShape, rates: Mapping[str, float]) -> None:
        self.world = world
        self.name = shape.name
        self.shape = shape
        self.gpu_caps = list(shape.gpu_bytes)
        self.gpu_free = list(self.gpu_caps)  # per GPU, the bytes no copy's shard takes
        self.capacity = {Tier.L0: sum(self.gpu_caps), Tier.L1: shape.host_bytes, Tier.L2: shape.disk_bytes}
        self.used = dict.fromkeys(CACHE_TIERS, 0)
        self.copies: dict[Tier, dict[str, Copy]] = {t: {} for t in CACHE_TIERS}
        # The same three dicts, closest tier first: ``closest`` asks them on every request and every hop.
        self.by_tier: tuple[dict[str, Copy], ...] = tuple(self.copies[t] for t in CACHE_TIERS)
        self.uses: UseCounts[str] = UseCounts()  # the requests it served, per model: disk admission's
        self.links = {hop: Link(world.clock, hop, rate) for hop, rate in rates.items()}
        self.busy = {hop: BusyShare() for hop in self.links}
        # The record's name of the link into each tier ("node L3->L2"), made once, not per load.
        self.link_key = {tier: f"{self.name} {hop}" for tier, hop in HOP_INTO.items()}
        self.jobs: dict[str, list[Job]] = {}
        self.blocked: list[Job] = []
        self._blocked_on: dict[Tier, int] = {}  # how many blocked loads wait for room in each tier
        self._shards: dict[int, int | None] = {}
        self.on_gpu: list[dict[str, Copy]] = [{} for _ in self.gpu_caps]  # L0 copies with a shard there
        # What making room costs, as the GPUs are now: ``gpu_room(size)`` per size, and per GPU what one
        # shard's room takes there, per shard size. Routing a request asks it of every node; between two
        # routes most nodes', and most GPUs', copies have not changed. ``l0_changed`` forgets it.
        self._room: dict[int, GpuRoom | None] = {}
        # Bytes of the loads to GPU memory on their way here that do not hold their GPU memory yet (a
        # download from object storage takes minutes before its last hop takes any): routing counts them
        # as taken, so a burst of first requests does not pile onto the node that looked emptiest.
        self.coming = 0
        self.version = 0  # counts the changes to what routing reads (``gpu_room``, bytes in use, ``coming``)
        self.marked = -1  # ``Router``'s count of drains when it last marked this node changed
        self._room_victims: set[str] = set()  # every copy a remembered answer gave up (or weighed)
        self._options: list[dict[int, tuple[float, list[str]] | None]] = [{} for _ in self.gpu_caps]
        self._option_victims: list[set[str]] = [set() for _ in self.gpu_caps]

    @property
    def waiting_for(self) -> Iterable[Tier]:
        """The tiers some blocked load waits for room in."""
        return self._blocked_on.keys()

    def wait_on(self, job: Job, tier: Tier | None) -> None:
        """``job`` now waits for room in ``tier`` (None: no longer waits)."""
        if job.blocked_on is tier:
            return
        counts = self._blocked_on
        if job.blocked_on is not None:
            counts[job.blocked_on] -= 1
            if not counts[job.blocked_on]:
                del counts[job.blocked_on]
        if tier is not None:
            counts[tier] = counts.get(tier, 0) + 1
        job.blocked_on = tier

    def shards(self, size: int) -> int | None:
        """``prewarm.gpu_shards`` for this node's GPUs, remembered per size."""
        if size not in self._shards:
            self._shards[size] = gpu_shards(size, self.gpu_caps)
        return self._shards[size]

    def gpu_hold(self, copy: Copy) -> None:
        """``copy`` takes its shard on each of its GPUs."""
        shard = copy.shard
        for g in copy.gpus:
            self.gpu_free[g] -= shard
            self.on_gpu[g][copy.key] = copy
        self.l0_changed(copy.gpus)

    def gpu_release(self, copy: Copy) -> None:
        """``copy`` leaves its GPUs."""
        shard = copy.shard
        for g in copy.gpus:
            self.gpu_free[g] += shard
            del self.on_gpu[g][copy.key]
        self.l0_changed(copy.gpus)

    def l0_changed(self, gpus: Iterable[int]) -> None:
        """A GPU copy came, went, landed or changed pins on ``gpus``: what was remembered of them, and of
        the node as a whole, is stale."""
        self._forget()
        for g in gpus:
            if self._options[g]:
                self._options[g].clear()
                self._option_victims[g].clear()

    def l0_used(self, copy: Copy) -> None:
        """``copy`` (in GPU memory) was just used. A copy the LRU did not give up stays kept when it
        becomes the most recently used, so only answers that gave it up (or weighed it) go stale."""
        model = copy.key
        if model in self._room_victims:
            self._forget()
        for g in copy.gpus:
            if model in self._option_victims[g]:
                self._options[g].clear()
                self._option_victims[g].clear()

    def expect(self, job: Job, nbytes: int) -> None:
        """``job``, a load to GPU memory here, is to take ``nbytes`` more (negative: took or gave them up)."""
        job.coming += nbytes
        self.coming += nbytes
        self.version += 1
        self.world.router.node_changed(self)

    def _forget(self) -> None:
        if self._room:  # the victims are of remembered answers: none without one
            self._room.clear()
            self._room_victims.clear()
        self.version += 1
        self.world.router.node_changed(self)

    def gpu_room(self, size: int, asked: Sequence[int] = ()) -> GpuRoom | None:
        """The GPUs an L0 copy of ``size`` bytes takes, the LRU victims that make room there and when the
        most recently used of them was last used (-inf: none); None when even every evictable copy would
        not do. Answers for no particular GPUs are remembered until the GPUs' copies change."""
        if asked:
            return self._gpu_room(size, asked)
        if size in self._room:
            return self._room[size]
        found = self._room[size] = self._gpu_room(size, ())
        if found is not None:
            self._room_victims.update(found[1])
        return found

    def _gpu_room(self, size: int, asked: Sequence[int]) -> GpuRoom | None:
        """``gpu_room``, worked out.

        Where the shards fit as things are, ``gpu_placement`` chooses (the order's GPUs if it names ones
        with room). Otherwise, for each GPU ``lru_victims`` names what must go for one shard to fit, and
        the GPUs whose victims were least recently used are chosen; a victim sharded over several GPUs
        frees its shard on each of them.
        """
        n = self.shards(size)
        if n is None:
            return None
        shard = -(-size // n)
        free = self.gpu_free
        if asked:
            named = tuple(sorted(set(asked)))
            if len(named) == n and all(0 <= g < len(free) and free[g] >= shard for g in named):
                return named, [], -INF
        placed = _placement(n, shard, free)
        if placed is not None:
            return placed, [], -INF
        options: dict[int, tuple[float, list[str]]] = {}
        for g, cap in enumerate(self.gpu_caps):
            if cap < shard:
                continue
            option = self._option(g, shard, free[g])
            if option is not None:
                options[g] = option
        if n == 1:
            if not options:
                return None
            # The first GPU whose victims were least recently used: what sorting by (recency, GPU) puts
            # first. One GPU's victims are distinct already.
            g = min(options, key=lambda g: options[g][0])
            recency, victims = options[g]
            return (g,), list(victims), recency
        pick = sorted(options, key=lambda g: (options[g][0], g))[:n]
        if len(pick) < n:
            return None
        victims = list(dict.fromkeys(v for g in pick for v in options[g][1]))
        return tuple(sorted(pick)), victims, max(options[g][0] for g in pick)

    def _option(self, g: int, shard: int, free: int) -> tuple[float, list[str]] | None:
        """What room for one shard of ``shard`` bytes takes on GPU ``g`` by the LRU rule: the victims,
        and when the most recently used of them was last used (None: not even all of them would do).
        Remembered per shard size until a copy on the GPU changes."""
        known = self._options[g]
        if shard in known:
            return known[shard]
        chosen = shard_victims(self.on_gpu[g].values(), shard, free)
        option = None
        if chosen is not None:
            # Named oldest first: the last is the most recently used of them.
            victims = [c.key for c in chosen]
            option = (chosen[-1].recency if chosen else -INF, victims)
            self._option_victims[g].update(victims)
        known[shard] = option
        return option

    def closest(self, model: str) -> Copy | None:
        """The copy of ``model`` in the closest tier that holds one (ready or arriving), if any."""
        l0, l1, l2 = self.by_tier
        # A Copy is always true (no __len__ or __bool__): ``or`` stops at the first tier holding one.
        return l0.get(model) or l1.get(model) or l2.get(model)

    def report(self, now: float, catalog: Catalog) -> ExecutorState:
        """What the node's executor would report at ``now`` (``catalog``: the world's, which does not
        change during a run). An entry of a copy unchanged since the last report is that report's own
        (the models are frozen)."""

        def resident(model: str, c: Copy) -> ResidentModel:
            says = (c.last_used, c.pins, c.prefetched)
            if c.reported is not None and c.reported[0] == says:
                return c.reported[1]
            spec = catalog.get(model)
            entry = build(
                ResidentModel,
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
            c.reported = (says, entry)
            return entry

        tiers = [
            build(
                TierState,
                tier=t,
                capacity_bytes=self.capacity[t],
                used_bytes=self.used[t],
                resident=[resident(m, c) for m, c in sorted(self.copies[t].items())],
            )
            for t in CACHE_TIERS
        ]
        gpus = [
            build(GpuState, index=i, capacity_bytes=cap, used_bytes=cap - free)
            for i, (cap, free) in enumerate(zip(self.gpu_caps, self.gpu_free, strict=True))
        ]
        return build(
            ExecutorState,
            v=1,
            node=self.name,
            at=now,
            device="sim",
            tiers=tiers,
            gpus=gpus,
            bandwidth_bytes_per_s={hop: link.rate for hop, link in self.links.items()},
            link_demand_busy={h: busy.update(self.links[h].busy_s(), now) for h, busy in self.busy.items()},
            recent_outcomes=[],
            demand_loads=sorted(m for m, jobs in self.jobs.items() if any(j.demand for j in jobs)),
        )


_recency = attrgetter("recency")


def shard_victims(copies: Iterable[Copy], need: int, free: int) -> list[Copy] | None:
    """``prewarm.lru_victims`` over the copies on one GPU, each counted for its shard there (a copy
    sharded over several GPUs frees one shard on each), returning the copies themselves.

    The same rule, written out for the one caller that asks it on nearly every load: building a
    ``prewarm.Holding`` per sharded copy to hand to the general function cost more than the rule.
    """
    if need <= free:
        return []
    chosen: list[Copy] = []
    for copy in sorted(copies, key=_recency):
        if copy.pins or copy.ready_at == INF:
            continue  # pinned or still loading: never a victim
        chosen.append(copy)
        free += copy.shard
        if need <= free:
            return chosen
    return None


def _placement(n: int, shard: int, free: list[int]) -> tuple[int, ...] | None:
    """``prewarm.gpu_placement`` for a model of ``n`` shards of ``shard`` bytes, ``n`` already known (it
    is ``Node.shards``): of the GPUs with room for a shard, the ``n`` with the fewest free bytes (the
    first of equals), if there are ``n``."""
    if n == len(free):  # every GPU of the node: no choosing
        return tuple(range(n)) if min(free) >= shard else None
    roomy = [i for i, room in enumerate(free) if room >= shard]
    if len(roomy) < n:
        return None
    if n == 1:
        return (min(roomy, key=free.__getitem__),)  # the first of equals
    return tuple(sorted(sorted(roomy, key=lambda i: (free[i], i))[:n]))


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
