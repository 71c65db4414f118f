"""What an order does to a node, written once.

Five rules, each pure and each called by every party that needs it:

- **admission** (``admit``): whether a node carries an order out at all — not one it has seen, not one for
  another node, not one past its deadline, not one for a model or version its catalog does not hold;
- **effect** (``effect``): which tiers gain a copy of the model and which lose theirs;
- **LRU victims** (``lru_victims``, by ``held_recency``): which residents a full tier gives up when a load
  needs room (a prefetch's copy not used yet counts as used at its order's ``hold_until``);
- **admission by use** (``admits``, over ``UseCounts``, for the copies ``weighed`` says): whether a new
  copy takes a place in a full disk or host memory at all (a load on its way to memory streams past it
  when not);
- **GPU placement** (``gpu_shards``, ``gpu_placement``): how many GPUs of a node a model takes and which.

The executor carries orders out by these rules; the planner books the orders it has published but not yet
seen reported by the same rules; the simulator models the executor with them; and the tests check all
three against one definition. A party with its own copy of the rules measures its copy.

The executor is the reference these were taken from. A load passes through every tier between the
closest copy and its target (``load_path``); the executor may hold less than that on the way (on a CPU
device it reads L2 straight into L0; a model L1 cannot hold is staged to L0 through a small ring), never
more, so a book kept by these rules never under-counts. A tier that must make room drops its least
recently used ready, unpinned copies: they are dropped, not demoted, because tiers are inclusive — a copy
in L0 or L1 was loaded through the tiers below it, which usually still hold it. Admission by use is the
one rule the planner does not apply (it does not see a node's counts): a disk copy the executor declined
stays in its book until the next report, an over-count, never an under-count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Generic, Protocol, TypeVar

from prewarm._schemas import CACHE_TIERS, Order, OrderAction, OrderStatus, Tier

__all__ = [
    "USE_DECAY_S",
    "Admission",
    "Effect",
    "Evictable",
    "Holding",
    "UseCounts",
    "Versioned",
    "admit",
    "admits",
    "closest",
    "effect",
    "gpu_placement",
    "gpu_shards",
    "held_recency",
    "load_path",
    "lru_victims",
    "weighed",
]

K = TypeVar("K", bound=Hashable)
K_co = TypeVar("K_co", bound=Hashable, covariant=True)


# ------------------------------------------------------------------ admission


@dataclass(frozen=True)
class Admission:
    """An order a node will not carry out, and why (``status`` is ALREADY, FAILED or EXPIRED)."""

    status: OrderStatus
    detail: str


class Versioned(Protocol):
    """What admission reads of a catalog entry (a ``models.ModelSpec`` is one)."""

    @property
    def version(self) -> str: ...

    @property
    def sha256(self) -> str | None: ...


def admit(
    order: Order, now: float, *, node: str, spec: Versioned | None, seen: str | None = None
) -> Admission | None:
    """None when ``node`` carries ``order`` out at ``now``; otherwise the refusal.

    ``spec`` is what the node's catalog holds for ``order.model`` (None: the model is unknown there).
    ``seen`` describes an earlier application of the same order id (None: not seen). An eviction needs no
    catalog entry: a model dropped from the catalog can still be dropped from the node.
    """
    if seen is not None:
        return Admission(OrderStatus.ALREADY, seen)
    if order.node != node:
        return Admission(OrderStatus.FAILED, f"order is for node {order.node}, this is {node}")
    if now > order.deadline:
        return Admission(
            OrderStatus.EXPIRED, f"deadline passed {now - order.deadline:.1f}s before it was applied"
        )
    if order.action is OrderAction.EVICT:
        return None
    if order.tier not in CACHE_TIERS:
        return Admission(
            OrderStatus.FAILED, f"a {order.action.value} targets L0, L1 or L2; L3 is where weights come from"
        )
    if spec is None:
        return Admission(OrderStatus.FAILED, f"unknown model {order.model!r}")
    if spec.version != order.version or (order.sha256 and order.sha256 != spec.sha256):
        return Admission(
            OrderStatus.FAILED, f"order is for version {order.version}, the catalog has {spec.version}"
        )
    return None


# ------------------------------------------------------------------ effect


def closest(held: Collection[Tier]) -> Tier:
    """The tier closest to the GPU among ``held``; L3 (object storage holds every model) when none."""
    return next((t for t in CACHE_TIERS if t in held), Tier.L3)


def load_path(frm: Tier, to: Tier) -> tuple[Tier, ...]:
    """The tiers a load from ``frm`` to the closer tier ``to`` fills, in the order the bytes reach them
    (the farthest first); empty when ``to`` is not closer than ``frm``."""
    return tuple(t for t in reversed(CACHE_TIERS) if to.level <= t.level < frm.level)


@dataclass(frozen=True)
class Effect:
    """What an order does to one model's copies on a node."""

    source: Tier
    """Where the bytes of ``fills`` come from: the closest copy before the order, or L3."""
    fills: tuple[Tier, ...]
    """Tiers that gain a copy, in the order the bytes reach them."""
    drops: tuple[Tier, ...]
    """Tiers whose copy goes, closest to the GPU first."""


def effect(
    action: OrderAction, tier: Tier, held: Collection[Tier], holds: Callable[[Tier], bool] | None = None
) -> Effect:
    """How an admitted order changes the tiers that hold its model, from the tiers ``held`` now.

    - PREFETCH to ``tier``: ``tier`` holds a copy afterwards. Loaded from the closest copy along
      ``load_path`` when every copy is farther; written down from a closer copy when ``tier`` has none
      (the planner never asks that of a prefetch, but an executor does it); nothing when it has one.
    - DEMOTE to ``tier``: the same, then every copy closer than ``tier`` goes.
    - EVICT at ``tier``: the copies in ``tier`` and every tier closer go (L3: every local copy).

    ``holds``: whether a tier of the node could ever hold the model (its capacity, emptied), where the
    caller knows it: a load streams past a tier on its way that could not, as the executor does
    (``executor/_hops.py``), and fills it only if it is ``tier`` itself.
    """
    source = closest(held)
    if action is OrderAction.EVICT:
        return Effect(source, (), tuple(t for t in CACHE_TIERS if t in held and t.level <= tier.level))
    promote = source.level > tier.level
    fills = load_path(source, tier) if promote else () if tier in held else (tier,)
    if holds is not None and promote:
        fills = tuple(t for t in fills if t is tier or holds(t))
    if action is OrderAction.PREFETCH:
        return Effect(source, fills, ())
    return Effect(source, fills, tuple(t for t in CACHE_TIERS if t in held and t.level < tier.level))


# ------------------------------------------------------------------ LRU victims


class Evictable(Protocol[K_co]):
    """What the LRU rule reads of a resident copy."""

    @property
    def key(self) -> K_co: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def recency(self) -> float:
        """When it was last used, or loaded if never used: the later of that and its prefetch order's
        ``hold_until`` while it is that prefetch's copy and unused (``held_recency``)."""
        ...

    @property
    def pins(self) -> int: ...

    @property
    def ready(self) -> bool:
        """False while its bytes are still arriving."""
        ...


@dataclass(frozen=True)
class Holding(Generic[K]):
    """A plain ``Evictable``, for a caller whose copies are not one already."""

    key: K
    nbytes: int
    recency: float
    pins: int = 0
    ready: bool = True


def held_recency(last_used: float | None, loaded_at: float, hold_until: float | None) -> float:
    """A copy's ``recency`` for the LRU: when it was last used; never used, when it was loaded, or the
    ``hold_until`` of the prefetch order that brought it if that is later.

    A prefetch brings a copy for a request expected within its misprediction window. Given up to a
    load before then, it is a misprediction for certain and the request it was for a cold start; held,
    the misprediction rule still demotes it once the window has passed unused. On the ``onoff`` suite
    case's tight cluster loads on request had displaced 33 of the 66 prefetches counted as
    mispredicted before their window ended (docs/benchmarks.md, the twenty-eighth stop)."""
    if last_used is not None:
        return last_used
    return loaded_at if hold_until is None else max(loaded_at, hold_until)


_recency = attrgetter("recency")  # sorted's key in C: the simulator asks the LRU once per load


def lru_victims(residents: Iterable[Evictable[K]], need: int, free: int) -> list[K] | None:
    """The least recently used ready, unpinned residents whose removal frees ``need`` bytes, oldest
    first; [] when ``free`` already suffices; None when even all of them would not.

    Pinned copies (in use, being read) and copies still loading are never chosen. Equally recent copies
    go in the order ``residents`` lists them.
    """
    if need <= free:
        return []
    chosen: list[K] = []
    for resident in sorted(residents, key=_recency):
        if resident.pins or not resident.ready:
            continue
        chosen.append(resident.key)
        free += resident.nbytes
        if need <= free:
            return chosen
    return None


# ------------------------------------------------------------------ admission by use

USE_DECAY_S = 3600.0
"""How long a use counts in ``UseCounts``: its weight falls by e every hour."""


class UseCounts(Generic[K]):
    """How often each key was used lately: a use adds one, and every count decays by e^(-elapsed/τ).

    A use is a request the node serves for the model (the executor: a load on request, an ``acquire``, a
    lease; the simulator: a request routed to the node). Not locked: its owner guards it.
    """

    def __init__(self, tau_s: float = USE_DECAY_S) -> None:
        self.tau_s = tau_s
        self._counts: dict[K, tuple[float, float]] = {}  # key -> (count, when it was that)

    def use(self, key: K, at: float) -> None:
        self._counts[key] = (self.count(key, at) + 1.0, at)

    def count(self, key: K, at: float) -> float:
        held = self._counts.get(key)
        if held is None:
            return 0.0
        count, since = held
        return count * math.exp(min(0.0, since - at) / self.tau_s)


def admits(newcomer: K, nbytes: int, victims: Iterable[tuple[K, int]], uses: UseCounts[K], at: float) -> bool:
    """Whether a new copy of ``nbytes`` takes its place in a full disk or host cache, dropping ``victims``
    (its ``lru_victims``, each with its bytes): only when they together were read no more lately,
    request by request and byte by byte, than ``newcomer`` (Σ count × bytes of the victims ≤ its count ×
    its bytes). Otherwise nothing is dropped: a load on its way to memory streams past the tier (past the
    disk; past host memory through the staging ring), and a prefetch or demotion into the disk itself
    fails.

    LRU alone lets any load through a full disk drop the copy of a model the node reads again and again,
    which then comes back from object storage, over the slowest link, each time memory lets it go; and
    any load through full host memory drop the host copy of a busy model that GPU memory cannot keep,
    which then comes back from disk. Admission by frequency is TinyLFU's (Einziger, Friedman and Manes,
    2017), on decayed counts. It is weighed by bytes because a copy saves each request that reads it the
    time its bytes take over the slower link, so what a cache of one size saves per second is the sum of
    count × bytes over what it holds. By count alone, one busier 16 or 28 GB copy among the victims was
    enough to keep a 140 GB one out: on memoryless (draw 0) a 140 GB model requested four times an hour
    waited for the disk on 127 of its 193 requests, on 22 once weighed by bytes (docs/benchmarks.md, the
    seventeenth stop). Which new copies are weighed: ``weighed``.
    """
    held = sum(uses.count(victim, at) * size for victim, size in victims)
    return held <= uses.count(newcomer, at) * nbytes


def weighed(tier: Tier, target: Tier, demand: bool, *, streamable: bool = True) -> bool:
    """Whether a new copy in ``tier`` (L1 or L2) made for a load to ``target`` must win its place there
    (``admits``): every one that the load can do without (``streamable``: it can reach memory past this
    tier) and that no request waits for in the tier itself.

    On disk, every one but a copy a request waits for in the disk itself (``target`` L2 and ``demand``)
    or one a load to memory cannot do without (a model host memory cannot hold, on its way to a CUDA
    GPU). In host memory, only a load on request to GPU memory that reads a disk copy (the staging ring
    carries it from there; a download from object storage fills host memory in the same pass): a load
    to host memory itself makes its copy there, and an order's copy takes the room its scheduler made.

    Weighed in host memory, the loads on request of two 140 GB models through 256 GB of host memory no
    longer drop each other's host copies in turn: the host copy of the model read more often stays, the
    other streams through. Orders are not weighed there: weighed, the oracle's loads just in time were
    declined host room it had planned, and it was no longer a bound (docs/benchmarks.md, the sixteenth
    stop)."""
    if tier is Tier.L1:
        return target is Tier.L0 and demand and streamable
    return not demand if target is Tier.L2 else streamable


# ------------------------------------------------------------------ GPU placement


def gpu_shards(size: int, gpu_capacities: Sequence[int]) -> int | None:
    """How many GPUs of one node a model of ``size`` bytes takes: the fewest whose equal shards each fit
    an (empty) GPU of the node, as a tensor-parallel engine splits it. None: the node cannot hold it."""
    ordered = sorted(gpu_capacities, reverse=True)
    for n in range(1, len(ordered) + 1):
        if -(-size // n) <= ordered[n - 1]:
            return n
    return None


def gpu_placement(size: int, capacities: Sequence[int], free: Sequence[int]) -> tuple[int, ...] | None:
    """The GPUs (indices into ``capacities``/``free``) an L0 copy of ``size`` bytes goes to now: of the
    GPUs with room for one of its ``gpu_shards`` shards, the ones with the fewest free bytes (best fit,
    the first of equals); None if fewer have room than it has shards.

    Best fit keeps whole GPUs free for the models that need them: placed on the roomiest GPUs instead,
    a node's small models spread one to a GPU, and a 70 GB model then fits on none of eight 80 GB GPUs
    that hold 14 GB each, so a load displaces copies by the LRU while the node has room in total
    (docs/benchmarks.md, the twenty-seventh stop). Either rule places a copy exactly when one can be placed.

    Everyone who places a copy in L0 (the executor, the planner's book, the simulator) asks this, so a
    plan never puts two models on a GPU that can hold one.
    """
    n = gpu_shards(size, capacities)
    if n is None:
        return None
    shard = -(-size // n)
    roomy = [i for i in range(len(free)) if free[i] >= shard]
    if len(roomy) < n:
        return None
    return tuple(sorted(sorted(roomy, key=lambda i: (free[i], i))[:n]))
