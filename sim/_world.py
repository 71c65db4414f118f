"""The simulated cluster: bytes per tier per node, transfers that take the time their size and the
node's bandwidth say, and requests that wait for whatever is not yet in GPU memory.

It plays the executor's part for the real scheduler: it applies orders exactly as ``Executor.apply``
would (prefetch along the path, demote one tier down, evict a tier and everything closer), makes room the
way an executor's own LRU would when an order does not fit (and counts those bytes: the plan's
over-commit), and reports an ``ExecutorState`` per node.
Time only moves when the driver says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from models import Catalog
from prewarm import (
    CACHE_TIERS,
    HOP_INTO,
    ExecutorState,
    Order,
    OrderAction,
    OrderOutcome,
    OrderStatus,
    ResidentModel,
    Tier,
    TierState,
)
from scheduler import Cluster

__all__ = ["Served", "SimNode", "World"]

_HOP_OVERHEAD_S = 0.5


@dataclass
class _Copy:
    bytes: int
    ready_at: float  # in transit until then; its bytes are held from the start
    loaded_at: float
    last_used: float | None = None
    prefetched: bool = False
    used_since_prefetch: bool = False


@dataclass(frozen=True)
class Served:
    """One request as the simulation saw it."""

    at: float
    model: str
    node: str
    served_from: Tier
    wait_s: float


@dataclass
class SimNode:
    name: str
    capacity: dict[Tier, int]
    bandwidth: dict[str, float]
    held: dict[Tier, dict[str, _Copy]] = field(default_factory=lambda: {t: {} for t in CACHE_TIERS})
    queued_loads: int = 0  # a request whose load had to wait for transfers in flight to free room
    failed_orders: int = 0  # a prefetch that did not fit when it was applied
    bytes_moved: int = 0
    mispredictions: int = 0
    prefetches: int = 0
    lru_displaced: int = 0  # bytes ``_room`` moved aside to fit a load or a demotion, whoever asked
    over_commit: int = 0  # of those, bytes moved aside to apply an order (see ``World.apply``)

    def used(self, tier: Tier) -> int:
        return sum(c.bytes for c in self.held[tier].values())

    def free(self, tier: Tier) -> int:
        return self.capacity[tier] - self.used(tier)

    def closest(self, model: str) -> Tier:
        return next((t for t in CACHE_TIERS if model in self.held[t]), Tier.L3)

    def hop_s(self, size: int, into: Tier) -> float:
        rate = self.bandwidth.get(HOP_INTO[into], 0.0)
        return (size / rate if rate > 0 else float("inf")) + _HOP_OVERHEAD_S

    # ------------------------------------------------------------------ moving bytes

    def _room(self, tier: Tier, need: int, now: float, keep: str) -> bool:
        """Demote least-recently-used settled copies one tier down until ``need`` bytes are free."""
        if need > self.capacity[tier]:
            return False
        victims = sorted(
            (
                (c.last_used or c.loaded_at, model)
                for model, c in self.held[tier].items()
                if model != keep and c.ready_at <= now
            ),
        )
        for _, model in victims:
            if self.free(tier) >= need:
                break
            self.lru_displaced += self.held[tier][model].bytes
            self._drop(tier, model, now, demote=True)
        return self.free(tier) >= need

    def _drop(self, tier: Tier, model: str, now: float, *, demote: bool) -> None:
        copy = self.held[tier].pop(model)
        self._settle_prefetch(copy)
        lower = tier.farther()
        fits = demote and lower in CACHE_TIERS and model not in self.held[lower]
        if fits and self._room(lower, copy.bytes, now, keep=model):
            self.held[lower][model] = _Copy(copy.bytes, now, now, copy.last_used)

    def _settle_prefetch(self, copy: _Copy) -> None:
        """A prefetched L1/L0 copy that leaves (or the run ends) without serving a request: mispredicted."""
        if copy.prefetched and not copy.used_since_prefetch:
            self.mispredictions += 1
            copy.prefetched = False

    def load(self, model: str, size: int, to: Tier, start: float, *, prefetch: bool) -> float | None:
        """Bring ``model`` to ``to`` from its closest tier: when it will be ready, or None if it can't fit."""
        frm = self.closest(model)
        if frm.level <= to.level:
            return self.held[frm][model].ready_at
        ready = max(start, self.held[frm][model].ready_at if frm in CACHE_TIERS else start)
        path = [t for t in reversed(CACHE_TIERS) if to.level <= t.level < frm.level]
        for tier in path:
            if not self._room(tier, size, start, keep=model):
                return None
            ready += self.hop_s(size, tier)
            # Only the target tier's copy is the speculative one; the path below it is staging.
            self.held[tier][model] = _Copy(size, ready, start, prefetched=prefetch and tier is to)
            self.bytes_moved += size
        if prefetch and to in (Tier.L0, Tier.L1):
            self.prefetches += 1
        return ready

    def demote(self, model: str, to: Tier, now: float) -> None:
        frm = to.closer()
        if model in self.held[frm] and self.held[frm][model].ready_at <= now:
            self._drop(frm, model, now, demote=to in CACHE_TIERS)

    def evict(self, model: str, tier: Tier, now: float) -> None:
        for t in CACHE_TIERS:
            if t.level <= tier.level and model in self.held[t]:
                self._drop(t, model, now, demote=False)

    def touch(self, model: str, now: float) -> None:
        for copy in (self.held[t].get(model) for t in CACHE_TIERS):
            if copy is not None:
                copy.last_used = now
                copy.used_since_prefetch = True

    def report(self, now: float) -> ExecutorState:
        tiers = [
            TierState(
                tier=tier,
                capacity_bytes=self.capacity[tier],
                used_bytes=self.used(tier),
                resident=[
                    ResidentModel(
                        model=model,
                        version="1",
                        bytes=c.bytes,
                        last_used=c.last_used,
                        loaded_at=c.loaded_at,
                        prefetched=c.prefetched and not c.used_since_prefetch,
                    )
                    for model, c in sorted(self.held[tier].items())
                ],
            )
            for tier in CACHE_TIERS
        ]
        return ExecutorState(node=self.name, at=now, tiers=tiers, bandwidth_bytes_per_s=dict(self.bandwidth))


class World:
    """All nodes of a cluster, applying orders and serving requests on a virtual clock."""

    def __init__(self, cluster: Cluster, catalog: Catalog) -> None:
        self.catalog = catalog
        hops = cluster.bandwidth.hops()
        self.nodes = {
            spec.name: SimNode(
                name=spec.name,
                capacity=spec.capacity,
                bandwidth=dict(hops),
            )
            for spec in cluster.nodes
        }
        self.served: list[Served] = []
        self.outcomes: list[OrderOutcome] = []
        self._applied: set[str] = set()

    def apply(self, order: Order, now: float) -> OrderOutcome:
        """Apply ``order`` as an executor would.

        A planner that books its orders correctly has already ordered the demotions and evictions that
        make room, so applying one never makes the LRU displace a resident. The bytes it does displace
        are the plan's over-commit: the order asked a tier for room it did not have.
        """
        node = self.nodes.get(order.node)
        if order.id in self._applied:
            status = OrderStatus.ALREADY
        elif node is None or order.model not in self.catalog:
            status = OrderStatus.FAILED
        elif now > order.deadline:
            status = OrderStatus.EXPIRED
        else:
            size = self.catalog[order.model].size_bytes
            displaced = node.lru_displaced
            if order.action is OrderAction.PREFETCH:
                ok = node.load(order.model, size, order.tier, now, prefetch=not order.demand) is not None
                node.failed_orders += 0 if ok else 1
                status = OrderStatus.DONE if ok else OrderStatus.FAILED
            elif order.action is OrderAction.DEMOTE:
                node.demote(order.model, order.tier, now)
                status = OrderStatus.DONE
            else:
                node.evict(order.model, order.tier, now)
                status = OrderStatus.DONE
            node.over_commit += node.lru_displaced - displaced
        self._applied.add(order.id)
        outcome = OrderOutcome(order_id=order.id, node=order.node, model=order.model, status=status, at=now)
        self.outcomes.append(outcome)
        return outcome

    def request(self, model: str, now: float) -> Served:
        """A request arrives: route it to the node that has the model closest, load it if needed."""
        size = self.catalog[model].size_bytes

        def rank(node: SimNode) -> tuple[int, float, int]:
            tier = node.closest(model)
            ready = node.held[tier][model].ready_at if tier in CACHE_TIERS else now
            return (tier.level, ready, -node.free(Tier.L0))

        node = min(self.nodes.values(), key=rank)
        frm = node.closest(model)
        ready = node.load(model, size, Tier.L0, now, prefetch=False)
        at = now
        if ready is None:
            # A capacity-aware executor queues the load until transfers in flight settle and free room.
            node.queued_loads += 1
        while ready is None:
            busy = [c.ready_at for t in CACHE_TIERS for c in node.held[t].values() if c.ready_at > at]
            if not busy:
                break
            at = min(busy)
            ready = node.load(model, size, Tier.L0, at, prefetch=False)
        wait = max(0.0, (ready if ready is not None else at) - now)
        node.touch(model, now)
        served = Served(now, model, node.name, frm, wait)
        self.served.append(served)
        return served

    def reports(self, now: float) -> dict[str, ExecutorState]:
        return {name: node.report(now) for name, node in self.nodes.items()}

    def finish(self) -> None:
        """Count prefetches still unused at the end as mispredictions."""
        for node in self.nodes.values():
            for tier in (Tier.L0, Tier.L1):
                for copy in node.held[tier].values():
                    node._settle_prefetch(copy)

    def totals(self, names: Iterable[str] = ()) -> dict[str, int]:
        nodes = [self.nodes[n] for n in names] if names else list(self.nodes.values())
        return {
            "queued_loads": sum(n.queued_loads for n in nodes),
            "failed_orders": sum(n.failed_orders for n in nodes),
            "bytes_moved": sum(n.bytes_moved for n in nodes),
            "mispredictions": sum(n.mispredictions for n in nodes),
            "prefetches": sum(n.prefetches for n in nodes),
            "over_commit_bytes": sum(n.over_commit for n in nodes),
        }
