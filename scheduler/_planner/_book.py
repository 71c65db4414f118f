"""The round's books: bytes per tier on each node as this round's decisions leave them.

A book opens with what the node reports (each resident valued by what keeping it is worth), books the
orders already out but not yet reported, and makes room for a newcomer by demoting residents worth less,
one tier down. It is never over-committed. ``_Round`` carries the books and what the round has decided.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from models import Catalog
from prewarm import CACHE_TIERS, Order, OrderAction, ResidentModel, Tier, admit, effect
from scheduler._cluster import ClusterState, NodeState
from scheduler._planner._config import _INF, Placement, PlannerConfig, _Decision
from scheduler._planner._value import _Valuer
from scheduler._planner._wants import _Want


@dataclass
class _Entry:
    model: str
    bytes: int
    value: float  # what keeping it here is worth; a newcomer must be worth more to displace it
    protected: bool  # placed this round, pinned, or recently loaded/used: never a victim


class _Book:
    """Bytes per tier on one node during one round; copied before a tentative placement.

    ``put`` and ``drop`` keep a running total per tier, so asking for free room costs nothing.
    """

    def __init__(
        self,
        node: NodeState,
        capacity: dict[Tier, int],
        held: dict[Tier, dict[str, _Entry]],
        used: dict[Tier, int],
    ) -> None:
        self.node = node
        self.capacity = capacity
        self.held = held
        self._used = used  # the entries' bytes, and bytes the node reports in use but does not list

    def free(self, tier: Tier) -> int:
        return self.capacity[tier] - self._used[tier]

    def put(self, tier: Tier, key: str, entry: _Entry) -> None:
        self.drop(tier, key)
        self.held[tier][key] = entry
        self._used[tier] += entry.bytes

    def drop(self, tier: Tier, key: str) -> _Entry | None:
        entry = self.held[tier].pop(key, None)
        if entry is not None:
            self._used[tier] -= entry.bytes
        return entry

    def closest(self, model: str) -> Tier:
        return next((t for t in CACHE_TIERS if model in self.held[t]), Tier.L3)

    def holds(self, model: str, tier: Tier) -> bool:
        """Whether this node has ``model`` in ``tier`` or closer to the GPU."""
        return self.closest(model).level <= tier.level

    def copy(self) -> _Book:
        # Entries are replaced, never mutated, so copying the per-tier dicts is enough.
        return _Book(self.node, self.capacity, {t: dict(d) for t, d in self.held.items()}, dict(self._used))


@dataclass
class _Round:
    """One round: its inputs, each node's book, and what the round has decided so far."""

    now: float
    config: PlannerConfig
    catalog: Catalog
    wants: Mapping[str, list[_Want]]
    gains: Mapping[str, Mapping[Tier, float]]
    """Per model, ``_Valuer.gains``: computed once per round, for forecast wants and ``_payers`` alike."""
    valuer: _Valuer
    books: dict[str, _Book] = field(default_factory=dict)
    orders: list[Order] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    deferred: list[Placement] = field(default_factory=list)
    mispredictions: list[tuple[str, str]] = field(default_factory=list)
    moved: set[str] = field(default_factory=set)

    def held(self, model: str, tier: Tier) -> bool:
        """Whether some node has ``model`` in ``tier`` or closer: requests go to the closest copy."""
        return any(b.holds(model, tier) for b in self.books.values())

    def emit(self, decision: _Decision) -> None:
        """Order what was decided, stamped with this round's time."""
        self.orders.append(decision.to_order(self.now, self.config))


def _open_book(rnd: _Round, node: NodeState) -> _Book:
    now, config, catalog, wants = rnd.now, rnd.config, rnd.catalog, rnd.wants
    held: dict[Tier, dict[str, _Entry]] = {t: {} for t in CACHE_TIERS}
    for tier in CACHE_TIERS:
        for r in node.residents(tier):
            spec = catalog.get(r.model)
            in_catalog = spec is not None and spec.version == r.version
            value = (
                rnd.valuer.keep_value(spec, wants.get(r.model, []), node, tier, now)
                if spec is not None and in_catalog
                else 0.0
            )
            # A copy of another version still takes bytes but never counts as holding the model.
            key = r.model if in_catalog else f"{r.model}@{r.version}"
            held[tier][key] = _Entry(
                model=key,
                bytes=r.bytes,
                value=value,
                protected=_protected(r, now, config) or not in_catalog,
            )
    return _Book(
        node=node,
        capacity={t: node.capacity.get(t, 0) for t in CACHE_TIERS},
        held=held,
        used={t: node.unlisted.get(t, 0) + sum(e.bytes for e in held[t].values()) for t in CACHE_TIERS},
    )


def _protected(r: ResidentModel, now: float, config: PlannerConfig) -> bool:
    if r.pins > 0:
        return True
    recent = [t for t in (r.last_used, r.loaded_at) if t is not None]
    return any(now - t < config.min_residence_s for t in recent)


def _book_pending(rnd: _Round, cluster: ClusterState) -> None:
    """Orders already out but not yet reflected in a report hold their bytes in this round too.

    Each is booked as the executor will carry it out (``prewarm.admit`` and ``prewarm.effect``): one it
    would refuse changes nothing. A prefetch's copies are never victims this round; a demoted copy keeps
    what it was worth where it was.
    """
    for order in sorted(cluster.pending, key=lambda o: (o.not_before, o.id)):
        book = rnd.books.get(order.node)
        spec = rnd.catalog.get(order.model)
        if book is None or spec is None:
            continue
        if admit(order, rnd.now, node=order.node, spec=spec):
            continue
        held = [t for t in CACHE_TIERS if order.model in book.held[t]]
        change = effect(order.action, order.tier, held)
        moved = next((book.held[t][order.model] for t in held), None)
        if order.action is OrderAction.PREFETCH or moved is None:
            moved = _Entry(order.model, spec.size_bytes, _INF, True)
        for tier in change.fills:
            book.put(tier, order.model, moved)
        for tier in change.drops:
            book.drop(tier, order.model)


def _make_room(book: _Book, tier: Tier, need: int, value: float, moves: list[tuple[str, Tier, Tier]]) -> bool:
    """Free ``need`` bytes in ``tier`` by demoting residents worth less than ``value`` one tier down."""
    if book.free(tier) >= need:
        return True
    victims = sorted(
        (
            e
            for e in book.held[tier].values()
            if not e.protected and e.value < value and book.closest(e.model).level >= tier.level
        ),
        key=lambda e: (e.value, -e.bytes, e.model),
    )
    for victim in victims:
        if book.free(tier) >= need:
            break
        lower = tier.farther()
        if lower in CACHE_TIERS and victim.model not in book.held[lower]:
            if not _make_room(book, lower, victim.bytes, value, moves):
                continue
            book.put(lower, victim.model, replace(victim, protected=True))
        book.drop(tier, victim.model)
        moves.append((victim.model, tier, lower))
    return book.free(tier) >= need
