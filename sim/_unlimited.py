"""The standard serverless comparison (``--unlimited``): one node, one tier (L0) without limit, instant
loads, as 'Serverless in the Wild' (ATC'20) measures keep-alive policies.

A cold start is a request whose model is not resident; idle memory is resident bytes × time, all of
it idle (requests are instantaneous). Orders follow ``prewarm.effect``, of which only the L0 part exists
here: a prefetch to L0 makes a model resident at once, a demotion or eviction of L0 unloads it, and
anything about L1 or L2 does nothing. The reports say so: GPU memory unlimited, host memory and disk
without room, every hop instant (``INSTANT_BYTES_PER_S``). A planner then places nothing in tiers this
world does not keep, and values a copy by the cold start it spares, as this comparison counts it.
(Reported as unlimited tiers behind the default cluster's links, they drew prewarm's planner into
releasing copies to host memory and staging guesses on disk, both nothing here: on a Pareto-renewal
model asked for every 4-45 minutes, every request was cold.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from models import Catalog
from prewarm import (
    CACHE_TIERS,
    HOP_INTO,
    ExecutorState,
    GpuState,
    Order,
    OrderStatus,
    ResidentModel,
    Tier,
    TierState,
    admit,
)
from sim._links import Clock
from sim._metrics import MISPREDICTION_WINDOW_S, Record
from sim._node import LazyReports, cached_effect
from sim._policies import UNLIMITED_NODE, NodeShape, build

__all__ = ["INSTANT_BYTES_PER_S", "UNLIMITED_BYTES", "UnlimitedWorld"]

UNLIMITED_BYTES = 2**60
"""What the reports give as GPU memory's capacity: more than any catalog holds."""

INSTANT_BYTES_PER_S = 1e18
"""What the reports give as every hop's bandwidth: 140 GB in a tenth of a microsecond."""

_LOAD = "L3->L0"  # the one (instant) link of this world, for bytes_moved


@dataclass(eq=False)
class _Resident:
    since: float
    last_used: float | None
    prefetched: bool = False
    counted: bool = False  # a prefetch made in the window


class UnlimitedWorld:
    """One node without limits; the same interface as ``World`` for the driver."""

    unlimited = True
    hop_overhead_s = 0.0

    def __init__(
        self,
        catalog: Catalog,
        *,
        start: float = float("-inf"),
        end: float = float("inf"),
        clock: Clock | None = None,
    ) -> None:
        self.catalog = catalog
        self.bandwidth = dict.fromkeys(HOP_INTO.values(), INSTANT_BYTES_PER_S)
        self.clock = clock or Clock(start if start > float("-inf") else 0.0)
        self.record = Record(start, end, tiers=(Tier.L0,))
        self.shapes = {UNLIMITED_NODE: NodeShape(UNLIMITED_NODE, (UNLIMITED_BYTES,), 0, 0)}
        self._size = {spec.id: spec.size_bytes for spec in catalog}
        self._resident: dict[str, _Resident] = {}
        self._applied: set[str] = set()
        self.waiting = 0  # nothing ever waits here

    def closest(self, node: str, model: str) -> Tier:
        return Tier.L0 if model in self._resident else Tier.L3

    def fits(self, model: str) -> bool:
        return True

    def request(self, model: str, at: float) -> str:
        record = self.record
        counted = record.start <= at < record.end
        copy = self._resident.get(model)
        if copy is not None:
            copy.last_used, copy.prefetched = at, False
            if counted:
                record.request(at, model, False, Tier.L0)
            return UNLIMITED_NODE
        self._resident[model] = _Resident(at, at)
        if counted:
            row = record.request(at, model, True, Tier.L3)
            record.req_wait[row] = 0.0  # loads are instant here: only the count of cold starts matters
        record.moved(_LOAD, self._size[model], at)
        return UNLIMITED_NODE

    def apply(self, order: Order, now: float) -> OrderStatus:
        refused = admit(
            order,
            now,
            node=UNLIMITED_NODE,
            spec=self.catalog.get(order.model),
            seen="applied before" if order.id in self._applied else None,
        )
        self._applied.add(order.id)
        if refused is not None:
            return refused.status
        model = order.model
        change = cached_effect(order.action, order.tier, (Tier.L0,) if model in self._resident else ())
        if Tier.L0 in change.drops:
            self._unload(model, now)
        if Tier.L0 in change.fills:
            speculative = not order.demand
            counted = self.record.counts(now)
            self._resident[model] = _Resident(now, now if order.demand else None, speculative, counted)
            self.record.moved(_LOAD, self._size[model], now)
            if speculative and counted:
                self.record.prefetches += 1
        return OrderStatus.DONE

    def _unload(self, model: str, now: float) -> None:
        copy = self._resident.pop(model)
        self.record.resident(Tier.L0, self._size[model], copy.since, now)
        if copy.prefetched and copy.counted and self.record.counts(now):
            self.record.mispredicted("order")

    def reports(self, now: float) -> Mapping[str, ExecutorState]:
        return LazyReports((UNLIMITED_NODE,), lambda _: self._report(now))

    def _report(self, now: float) -> ExecutorState:
        residents = [
            build(
                ResidentModel,
                model=m,
                version=self.catalog[m].version,
                sha256=self.catalog[m].sha256,
                bytes=self._size[m],
                last_used=c.last_used,
                loaded_at=c.since,
                pins=0,
                prefetched=c.prefetched,
                gpus=[0],
            )
            for m, c in sorted(self._resident.items())
        ]
        used = sum(self._size[m] for m in self._resident)
        tiers = [
            build(
                TierState,
                tier=t,
                capacity_bytes=UNLIMITED_BYTES if t is Tier.L0 else 0,
                used_bytes=used if t is Tier.L0 else 0,
                resident=residents if t is Tier.L0 else [],
            )
            for t in CACHE_TIERS
        ]
        state = build(
            ExecutorState,
            v=1,
            node=UNLIMITED_NODE,
            at=now,
            device="sim",
            tiers=tiers,
            gpus=[build(GpuState, index=0, capacity_bytes=UNLIMITED_BYTES, used_bytes=used)],
            bandwidth_bytes_per_s=dict(self.bandwidth),
            recent_outcomes=[],
        )
        return state

    def window_begins(self, _: None = None) -> None:
        """Nothing is ever in flight: loads are instant."""

    def finish(self) -> None:
        end = self.record.end
        for model, copy in self._resident.items():
            self.record.resident(Tier.L0, self._size[model], copy.since, end)
            if copy.prefetched and copy.counted and copy.since <= end - MISPREDICTION_WINDOW_S:
                self.record.mispredicted("end")
