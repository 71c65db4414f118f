"""The round's books: bytes per tier on each node as this round's decisions leave them, and GPU memory
per GPU.

A book opens with what the node reports (each resident valued by what keeping it is worth), books the
orders already out but not yet reported, and makes room for a newcomer by demoting residents worth less,
one tier down. It is never over-committed, nor is any one GPU: an L0 copy is placed on GPUs by
``prewarm.gpu_placement`` (a model larger than one GPU takes equal shards on several of the node), as
the executor and the simulator place it. ``_Round`` carries the books and what the round has decided.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from forecaster import ModelForecast
from models import Catalog
from prewarm import (
    CACHE_TIERS,
    Order,
    OrderAction,
    ResidentModel,
    Tier,
    admit,
    effect,
    gpu_placement,
    gpu_shards,
)
from scheduler._cluster import ClusterState, NodeState
from scheduler._planner._config import _INF, Placement, PlannerConfig, _Decision
from scheduler._planner._value import _Valuer
from scheduler._planner._want import NO_WANTS, _Wants


@dataclass
class _Entry:
    model: str
    bytes: int
    value: float  # what keeping it here is worth; a newcomer must be worth more to displace it
    protected: bool  # placed this round, pinned, or recently loaded/used: never a victim
    gpus: tuple[int, ...] = ()  # L0 only: the book's GPUs (positions) holding one shard each
    bet: bool = False  # a guess not used since (``_bet``): a waiting request's victim only

    def shard(self) -> int:
        return -(-self.bytes // max(len(self.gpus), 1))


class _Book:
    """Bytes per tier, and per GPU for L0, on one node during one round; copied before a tentative
    placement. ``put`` and ``drop`` keep running totals, so asking for free room costs nothing.
    """

    def __init__(
        self,
        node: NodeState,
        capacity: dict[Tier, int],
        held: dict[Tier, dict[str, _Entry]],
        used: dict[Tier, int],
        gpu_used: list[int],
    ) -> None:
        self.node = node
        self.capacity = capacity
        self.held = held
        self._used = used  # the entries' bytes, and bytes the node reports in use but does not list
        self.gpu_capacity = node.gpu_capacities
        self._gpu_used = gpu_used

    def free(self, tier: Tier) -> int:
        return self.capacity[tier] - self._used[tier]

    def gpu_free(self) -> list[int]:
        return [c - u for c, u in zip(self.gpu_capacity, self._gpu_used, strict=True)]

    def placement(self, size: int) -> tuple[int, ...] | None:
        """The GPUs an L0 copy of ``size`` bytes would go to now; None: no GPUs have room for it."""
        return gpu_placement(size, self.gpu_capacity, self.gpu_free())

    def can_hold(self, tier: Tier, size: int) -> bool:
        """Whether ``tier`` could ever hold ``size`` bytes, emptied (in L0: on GPUs of this node)."""
        if tier is Tier.L0:
            return gpu_shards(size, self.gpu_capacity) is not None and self.capacity[tier] >= size
        return self.capacity[tier] >= size

    def fits(self, tier: Tier, size: int) -> bool:
        """Whether ``size`` bytes fit in ``tier``'s free room now (in L0: on some GPUs)."""
        if tier is Tier.L0:
            return self.free(tier) >= size and self.placement(size) is not None
        return self.free(tier) >= size

    def gpu_ids(self, positions: Sequence[int]) -> list[int]:
        """The node's GPU indices for the book's ``positions``; [] when the node does not split L0."""
        return [self.node.gpu_ids[p] for p in positions] if self.node.gpus else []

    def put(self, tier: Tier, key: str, entry: _Entry) -> None:
        self.drop(tier, key)
        self.held[tier][key] = entry
        self._used[tier] += entry.bytes
        if tier is Tier.L0:
            for g in entry.gpus:
                self._gpu_used[g] += entry.shard()

    def drop(self, tier: Tier, key: str) -> _Entry | None:
        entry = self.held[tier].pop(key, None)
        if entry is not None:
            self._used[tier] -= entry.bytes
            if tier is Tier.L0:
                for g in entry.gpus:
                    self._gpu_used[g] -= entry.shard()
        return entry

    def put_l0(self, key: str, entry: _Entry, gpus: Sequence[int] = ()) -> None:
        """``put`` in L0 on ``gpus`` (positions), or where ``placement`` puts it, or, for a copy that
        does not fit anywhere (one the node already holds or is loading), on the roomiest GPUs."""
        chosen = tuple(gpus) or self.placement(entry.bytes) or self._roomiest(entry.bytes)
        self.put(Tier.L0, key, replace(entry, gpus=chosen))

    def _roomiest(self, size: int) -> tuple[int, ...]:
        n = gpu_shards(size, self.gpu_capacity) or len(self.gpu_capacity)
        free = self.gpu_free()
        return tuple(sorted(sorted(range(len(free)), key=lambda g: (-free[g], g))[:n]))

    def closest(self, model: str) -> Tier:
        return next((t for t in CACHE_TIERS if model in self.held[t]), Tier.L3)

    def holds(self, model: str, tier: Tier) -> bool:
        """Whether this node has ``model`` in ``tier`` or closer to the GPU (always in L3)."""
        held = self.held
        for t in CACHE_TIERS:  # closest first; asked for every model of every round, so no Tier.level
            if model in held[t]:
                return True
            if t is tier:
                return False
        return True

    def models(self) -> set[str]:
        """Every key this book holds in some tier."""
        return set().union(*self.held.values())

    def copy(self) -> _Book:
        # Entries are replaced, never mutated, so copying the per-tier dicts is enough.
        return _Book(
            self.node,
            self.capacity,
            {t: dict(d) for t, d in self.held.items()},
            dict(self._used),
            list(self._gpu_used),
        )


class _Books(dict[str, _Book]):
    """The round's books by node name, and which nodes hold each model (``holders``).

    Which nodes hold a model is asked for every model of a round; found by looking into every node's
    book, it was most of a round at a hundred nodes. A book is replaced here (``books[name] = trial``),
    never changed in place, once the round has opened the books (``reindex`` after the opening). The
    holders are frozen sets, replaced on change, so that a copy of the index costs one dict copy.
    """

    def __init__(self) -> None:
        super().__init__()
        self._at: dict[str, frozenset[str]] = {}
        self._gpu: dict[str, int] = {}  # per model, how many nodes hold it in L0

    def __setitem__(self, name: str, book: _Book) -> None:
        old = self.get(name)
        before = old.models() if old is not None else set()
        after = book.models()
        at = self._at
        for model in before - after:
            at[model] = at.get(model, frozenset()) - {name}
        for model in after - before:
            at[model] = at.get(model, frozenset()) | {name}
        gpu = self._gpu
        was, now = (old.held[Tier.L0].keys() if old is not None else set()), book.held[Tier.L0].keys()
        for model in was - now:
            gpu[model] -= 1
        for model in now - was:
            gpu[model] = gpu.get(model, 0) + 1
        super().__setitem__(name, book)

    def reindex(self) -> None:
        """Rebuild the index after books were changed in place (only while they are being opened)."""
        at: dict[str, set[str]] = {}
        gpu: dict[str, int] = {}
        for name, book in self.items():
            for model in book.models():
                at.setdefault(model, set()).add(name)
            for model in book.held[Tier.L0]:
                gpu[model] = gpu.get(model, 0) + 1
        self._at = {model: frozenset(names) for model, names in at.items()}
        self._gpu = gpu

    def holders(self, model: str) -> frozenset[str]:
        return self._at.get(model, frozenset())

    def in_gpu(self, model: str) -> bool:
        """Whether some node holds ``model`` in GPU memory (``_Round.held`` at L0, by the index: it is
        asked of every host copy next to each candidate placed)."""
        return self._gpu.get(model, 0) > 0

    def copy(self) -> _Books:
        """The same books and index; books are never changed in place, so they are shared."""
        out = _Books()
        dict.update(out, self)
        out._at = dict(self._at)
        out._gpu = dict(self._gpu)
        return out


@dataclass
class _Round:
    """One round: its inputs, each node's book, and what the round has decided so far."""

    now: float
    config: PlannerConfig
    catalog: Catalog
    wants: Mapping[str, _Wants]
    gains: Mapping[str, Mapping[Tier, float]]
    """Per model, ``_Valuer.gains``: computed once per round, for forecast wants and ``_payers`` alike."""
    valuer: _Valuer
    forecasts: Mapping[str, ModelForecast] = field(default_factory=dict)
    """The round's forecasts, by model: what a copy that lasts only part of its want's window is worth
    is read from them (``_placement._lasting``)."""
    books: _Books = field(default_factory=_Books)
    orders: list[Order] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    deferred: list[Placement] = field(default_factory=list)
    mispredictions: list[tuple[str, str]] = field(default_factory=list)
    moved: set[str] = field(default_factory=set)
    predicted: dict[str, float] = field(default_factory=dict)
    """For each prefetch ordered this round, by order id: when its demand was predicted."""
    open_bets: set[tuple[str, str]] = field(default_factory=set)
    """(node, model) of prefetched copies still within their misprediction window."""

    room_read: dict[str, Tier | None] = field(default_factory=dict)
    """The models whose candidate read free room (``_placement._crowded``): None where only their
    holders' books were read; where the holders were crowded, their closest tier, for which every
    node's free room was read. An incremental round looks for their candidates again when what they
    read changed."""
    lifetimes: dict[tuple[str, Tier, int], float] = field(default_factory=dict)
    """Per (node, tier, width), ``_placement._lifetime``: worked out from the node's report once a round."""
    keep_values: dict[tuple[str, Tier, tuple[float, ...]], float] = field(default_factory=dict)
    """What keeping a resident is worth, by (model, tier, the node's link rates): the same on every node
    alike, and, in an incremental round, kept from the last round for the models it does not touch."""
    _classes: list[list[str]] | None = None
    _positions: dict[str, int] | None = None

    def classes(self) -> list[list[str]]:
        """The nodes by class, in the books' order: nodes of one class (the same link rates, load on the
        link from object storage and capacities) value a model they do not hold the same. Fixed once
        the books are open."""
        if self._classes is None:
            by: dict[tuple[object, ...], list[str]] = {}
            for name, book in self.books.items():
                node = book.node
                key = (node.hop_rates, node.staging_busy, tuple(book.capacity.values()), book.gpu_capacity)
                by.setdefault(key, []).append(name)
            self._classes = list(by.values())
        return self._classes

    def position(self, name: str) -> int:
        """Where node ``name`` comes in the books' order."""
        if self._positions is None:
            self._positions = {n: i for i, n in enumerate(self.books)}
        return self._positions[name]

    def held(self, model: str, tier: Tier) -> bool:
        """Whether some node has ``model`` in ``tier`` or closer: requests go to the closest copy."""
        if tier is Tier.L0:
            return self.books.in_gpu(model)
        return any(self.books[n].holds(model, tier) for n in self.books.holders(model))

    def emit(self, decision: _Decision) -> Order:
        """Order what was decided, stamped with this round's time."""
        order = decision.to_order(self.now, self.config)
        self.orders.append(order)
        return order


def _open_book(rnd: _Round, node: NodeState) -> _Book:
    now, config, catalog, wants = rnd.now, rnd.config, rnd.catalog, rnd.wants
    held: dict[Tier, dict[str, _Entry]] = {t: {} for t in CACHE_TIERS}
    for tier in CACHE_TIERS:
        for r in node.residents(tier):
            spec = catalog.get(r.model)
            in_catalog = spec is not None and spec.version == r.version
            value = 0.0
            if spec is not None and in_catalog:
                memo = (r.model, tier, node.hop_rates)
                kept = rnd.keep_values.get(memo)
                if kept is None:
                    kept = rnd.keep_values[memo] = rnd.valuer.keep_value(
                        spec, wants.get(r.model, NO_WANTS), node, tier, now
                    )
                value = kept
            # A copy of another version still takes bytes but never counts as holding the model.
            key = r.model if in_catalog else f"{r.model}@{r.version}"
            held[tier][key] = _Entry(
                model=key,
                bytes=r.bytes,
                value=value,
                protected=_protected(r, now, config) or not in_catalog,
                bet=_bet(r, tier),
            )
    book = _Book(
        node=node,
        capacity={t: node.capacity.get(t, 0) for t in CACHE_TIERS},
        held={t: ({} if t is Tier.L0 else held[t]) for t in CACHE_TIERS},
        used={t: node.unlisted.get(t, 0) + sum(e.bytes for e in held[t].values()) for t in CACHE_TIERS},
        gpu_used=[0] * len(node.gpu_capacities),
    )
    _open_gpus(book, node, held[Tier.L0])
    return book


def _open_gpus(book: _Book, node: NodeState, l0: dict[str, _Entry]) -> None:
    """Place the L0 residents on their GPUs: where the node says they are, else where
    ``prewarm.gpu_placement`` would have put them; then add the bytes in use that no resident explains."""
    used = dict(book._used)
    position = {gpu: p for p, gpu in enumerate(node.gpu_ids)} if node.gpus else {}
    reported = {r.model if r.model in l0 else f"{r.model}@{r.version}": r for r in node.residents(Tier.L0)}
    unplaced = []
    for key, entry in l0.items():
        r = reported.get(key)
        gpus = tuple(position[g] for g in r.gpus if g in position) if r is not None and position else ()
        if r is not None and gpus and len(gpus) == len(r.gpus):
            book.put(Tier.L0, key, replace(entry, gpus=gpus))
        else:
            unplaced.append((key, entry))
    for key, entry in sorted(unplaced, key=lambda kv: (-kv[1].bytes, kv[0])):
        book.put_l0(key, entry)
    extra = [max(u - b, 0) for u, b in zip(node.gpu_used, book._gpu_used, strict=False)]
    if not node.gpu_used and book.gpu_capacity:
        unlisted = node.unlisted.get(Tier.L0, 0)
        total = sum(book.gpu_capacity)
        extra = [unlisted * c // total for c in book.gpu_capacity]
    for g, more in enumerate(extra):
        book._gpu_used[g] += more
    book._used = used  # the tier's total was counted from the report already


_BET_TIERS = (Tier.L0, Tier.L1)
"""The tiers the misprediction rule judges a prefetched copy in."""


def _bet(r: ResidentModel, tier: Tier) -> bool:
    """Whether a resident is a guess not used since: a copy prefetched into GPU or host memory and not
    used yet, or a disk copy no load has read since it was downloaded. Either is displaced for a
    waiting request only (``_victims``). On a full disk, guesses that displace each other are
    downloads no request reads: on the suite's rotation case 89 % of 8,349 disk stagings in 48 hours,
    each evicting another (the thirteenth stop, docs/benchmarks.md)."""
    if tier is Tier.L2:
        return r.last_used is None
    return r.prefetched and tier in _BET_TIERS


def _protected(r: ResidentModel, now: float, config: PlannerConfig) -> bool:
    if r.pins > 0:
        return True
    window = config.min_residence_s
    used, loaded = r.last_used, r.loaded_at
    return (used is not None and now - used < window) or (loaded is not None and now - loaded < window)


def _book_pending(rnd: _Round, cluster: ClusterState, books: Mapping[str, _Book] | None = None) -> None:
    """Orders already out but not yet reflected in a report hold their bytes in this round too.

    Each is booked as the executor will carry it out (``prewarm.admit`` and ``prewarm.effect``): one it
    would refuse changes nothing. A prefetch's copies are never victims this round; a demoted copy keeps
    what it was worth where it was. An L0 copy goes on the GPUs its order names.
    """
    books = rnd.books if books is None else books  # these books only: the others are booked already
    for order in sorted(cluster.pending, key=lambda o: (o.not_before, o.id)):
        book = books.get(order.node)
        spec = rnd.catalog.get(order.model)
        if book is None or spec is None:
            continue
        if admit(order, rnd.now, node=order.node, spec=spec):
            continue
        held = [t for t in CACHE_TIERS if order.model in book.held[t]]
        # A tier that could never hold the model is streamed past, as ``_place_in`` planned it.
        change = effect(
            order.action, order.tier, held, functools.partial(book.can_hold, size=spec.size_bytes)
        )
        moved = next((book.held[t][order.model] for t in held), None)
        if order.action is OrderAction.PREFETCH or moved is None:
            moved = _Entry(order.model, spec.size_bytes, _INF, True)
        for tier in change.fills:
            if tier is Tier.L0:
                position = {gpu: p for p, gpu in enumerate(book.node.gpu_ids)} if book.node.gpus else {}
                gpus = [position[g] for g in order.gpus if g in position]
                book.put_l0(order.model, moved, gpus if len(gpus) == len(order.gpus) else ())
            else:
                book.put(tier, order.model, replace(moved, gpus=()))
        for tier in change.drops:
            book.drop(tier, order.model)


def _room_note(tier: Tier, newcomer: str) -> str:
    """The note of an order that demotes or evicts a copy to make room for ``newcomer`` in ``tier``."""
    return f"room in {tier.name} for {newcomer}"


def _victims(book: _Book, tier: Tier, value: float) -> list[_Entry]:
    """Residents of ``tier`` that a newcomer worth ``value`` may displace, least valuable first.

    A guess not used yet (``_bet``) is displaced for a waiting request only (worth ``_INF``), never
    for another speculative copy: displaced unused, it is a misprediction for certain, where left alone
    it may still serve the request it was brought for, and the misprediction rule demotes it when its
    window has passed (in at most ``misprediction_window_s``; a disk copy, when a load on request
    needs the room). One bet does not pay for another."""
    speculative = value < _INF
    return sorted(
        (
            e
            for e in book.held[tier].values()
            if not e.protected
            and e.value < value
            and not (speculative and e.bet)
            and book.closest(e.model).level >= tier.level
        ),
        key=lambda e: (e.value, -e.bytes, e.model),
    )


def _demote(
    book: _Book, victim: _Entry, tier: Tier, value: float, moves: list[tuple[str, Tier, Tier]]
) -> bool:
    """Move ``victim`` from ``tier`` one tier down (making room there too); False if it cannot go."""
    lower = tier.farther()
    if lower in CACHE_TIERS and victim.model not in book.held[lower]:
        if not _make_room(book, lower, victim.bytes, value, moves):
            return False
        book.put(lower, victim.model, replace(victim, protected=True, gpus=()))
    book.drop(tier, victim.model)
    moves.append((victim.model, tier, lower))
    return True


def _make_room(book: _Book, tier: Tier, need: int, value: float, moves: list[tuple[str, Tier, Tier]]) -> bool:
    """Free ``need`` bytes in ``tier`` by demoting residents worth less than ``value`` one tier down;
    in L0, on GPUs where an L0 copy of ``need`` bytes can then be placed.

    On a full disk only a waiting request (``value`` infinite) makes room: a guess evicts no disk copy.
    A disk copy evicted is a download from object storage the next time its model is loaded, minutes
    long with every request behind it, and the planner cannot tell which copies the node reads: the
    executor can, and its admission by use (``prewarm.admits``) keeps the copies read most. Valued by
    the forecast's chances over the window, the copies of models whose demand moves through the day
    were evicted for guesses about the next ones, over and over (moving_peak- and azure_mix-like traces
    whose catalogue is several disks: docs/benchmarks.md, the fifteenth stop)."""
    if tier is Tier.L0:
        return _make_gpu_room(book, need, value, moves)
    if book.free(tier) >= need:
        return True
    if tier is Tier.L2 and value < _INF:
        return False
    for victim in _victims(book, tier, value):
        if book.free(tier) >= need:
            break
        _demote(book, victim, tier, value, moves)
    return book.free(tier) >= need


def _make_gpu_room(book: _Book, need: int, value: float, moves: list[tuple[str, Tier, Tier]]) -> bool:
    """``_make_room`` in GPU memory: the copy takes ``prewarm.gpu_shards`` GPUs with a shard's room
    each, so the GPUs that are cheapest to clear are cleared (by the most valuable victim each needs,
    then the bytes moved), least valuable victims first on each."""
    if book.fits(Tier.L0, need):
        return True
    n = gpu_shards(need, book.gpu_capacity)
    if n is None or book.capacity[Tier.L0] < need:
        return False
    shard = -(-need // n)
    victims = _victims(book, Tier.L0, value)
    free = book.gpu_free()
    plans: list[tuple[tuple[float, int], int, list[_Entry]]] = []
    for g, capacity in enumerate(book.gpu_capacity):
        if capacity < shard:
            continue
        chosen: list[_Entry] = []
        room = free[g]
        for victim in victims:
            if room >= shard:
                break
            if g in victim.gpus:
                chosen.append(victim)
                room += victim.shard()
        if room >= shard:
            cost = (max((v.value for v in chosen), default=-_INF), sum(v.bytes for v in chosen))
            plans.append((cost, g, chosen))
    if len(plans) < n:
        return False
    plans.sort(key=lambda p: (p[0], p[1]))
    for _, _, chosen in plans[:n]:
        for victim in chosen:
            if victim.model in book.held[Tier.L0]:
                _demote(book, victim, Tier.L0, value, moves)
    # Room by GPU, and in the tier as a whole (bytes the node reports in use that no GPU explains).
    while not book.fits(Tier.L0, need):
        rest = [v for v in victims if v.model in book.held[Tier.L0]]
        if not rest or not _demote(book, rest[0], Tier.L0, value, moves):
            return False
    return True
