"""The simulated cluster: bytes per tier per node, transfers that take the time their size and the
node's bandwidth say, and requests that wait for whatever is not yet in GPU memory.

It plays the executor's part for the real scheduler, by the executor's own rules from the spine: which
orders it carries out (``prewarm.admit``), what each does to a model's copies (``prewarm.effect``), and
which copies a full tier gives up (``prewarm.lru_victims``: least recently used, never one still
loading, dropped rather than demoted because a copy's farther tiers still hold it). The bytes an order
makes the LRU give up are the plan's over-commit. It reports an ``ExecutorState`` per node.
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
    Holding,
    Order,
    OrderOutcome,
    OrderStatus,
    ResidentModel,
    Tier,
    TierState,
    admit,
    effect,
    load_path,
    lru_victims,
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
    prefetched: bool = False  # brought in speculatively, unused so far (every copy a prefetch reserved)
    bet: bool = False  # the copy a prefetch was for: leaving while still unused, it was mispredicted


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
    lru_displaced: int = 0  # bytes ``_room`` dropped to fit a load or a demotion, whoever asked
    over_commit: int = 0  # of those, bytes dropped to apply an order (see ``World.apply``)

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

    def held_tiers(self, model: str) -> list[Tier]:
        return [t for t in CACHE_TIERS if model in self.held[t]]

    def _room(self, tier: Tier, need: int, now: float) -> bool:
        """Drop the copies ``prewarm.lru_victims`` names until ``need`` bytes of ``tier`` are free."""
        if need > self.capacity[tier]:
            return False
        residents = (
            Holding(model, c.bytes, c.last_used or c.loaded_at, ready=c.ready_at <= now)
            for model, c in self.held[tier].items()
        )
        victims = lru_victims(residents, need, self.free(tier))
        if victims is None:
            return False
        for model in victims:
            self.lru_displaced += self.held[tier][model].bytes
            self.drop(tier, model)
        return True

    def drop(self, tier: Tier, model: str) -> None:
        self.settle(self.held[tier].pop(model))

    def settle(self, copy: _Copy) -> None:
        """A prefetch whose copy leaves (or the run ends) before a request used it was mispredicted:
        counted once, on the copy in the tier it was for, however many tiers it reserved."""
        if copy.bet and copy.prefetched:
            self.mispredictions += 1
            copy.bet = False

    def load(self, model: str, size: int, to: Tier, start: float, *, prefetch: bool) -> float | None:
        """Bring ``model`` to ``to`` from its closest tier: when it will be ready, or None if it can't fit."""
        frm = self.closest(model)
        if frm.level <= to.level:
            return self.held[frm][model].ready_at
        ready = max(start, self.held[frm][model].ready_at if frm in CACHE_TIERS else start)
        for tier in load_path(frm, to):
            if not self._room(tier, size, start):
                return None
            ready += self.hop_s(size, tier)
            # Like the executor, every host and device copy a prefetch reserves is reported as one.
            speculative = prefetch and tier is not Tier.L2
            bet = speculative and tier is to
            self.held[tier][model] = _Copy(size, ready, start, prefetched=speculative, bet=bet)
            self.bytes_moved += size
        if prefetch and to in (Tier.L0, Tier.L1):
            self.prefetches += 1
        return ready

    def write_down(self, model: str, to: Tier, now: float, *, demand: bool) -> bool:
        """Copy ``model`` from its closest copy into the farther tier ``to``: a demotion's first half."""
        source = self.held[self.closest(model)][model]
        if not self._room(to, source.bytes, now):
            return False
        # Still unused if the copy it came from was (see Executor._l0_to_l1); a disk copy never is. The
        # bet stays on the copy it was made for, and is settled when that one leaves.
        unused = not demand and to is not Tier.L2 and source.prefetched
        self.held[to][model] = _Copy(source.bytes, max(now, source.ready_at), now, source.last_used, unused)
        return True

    def touch(self, model: str, now: float) -> None:
        for copy in (self.held[t].get(model) for t in CACHE_TIERS):
            if copy is not None:
                copy.last_used = now
                copy.prefetched = False

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
                        prefetched=c.prefetched,
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
        refused = admit(
            order,
            now,
            node=node.name if node is not None else "",
            spec=self.catalog.get(order.model),
            seen="applied before" if order.id in self._applied else None,
        )
        if refused is not None or node is None:
            status = refused.status if refused is not None else OrderStatus.FAILED
        else:
            status = self._carry_out(node, order, now)
        self._applied.add(order.id)
        outcome = OrderOutcome(order_id=order.id, node=order.node, model=order.model, status=status, at=now)
        self.outcomes.append(outcome)
        return outcome

    def _carry_out(self, node: SimNode, order: Order, now: float) -> OrderStatus:
        model = order.model
        change = effect(order.action, order.tier, node.held_tiers(model))
        displaced = node.lru_displaced
        ok = True
        if change.fills and change.source.level > order.tier.level:
            size = self.catalog[model].size_bytes
            ok = node.load(model, size, order.tier, now, prefetch=not order.demand) is not None
        elif change.fills:
            ok = node.write_down(model, order.tier, now, demand=order.demand)
        if ok:
            for tier in change.drops:
                node.drop(tier, model)
        else:
            node.failed_orders += 1
        node.over_commit += node.lru_displaced - displaced
        return OrderStatus.DONE if ok else OrderStatus.FAILED

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
            for tier in CACHE_TIERS:
                for copy in node.held[tier].values():
                    node.settle(copy)

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
