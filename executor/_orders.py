"""Order application: what a node does with an order from the scheduler, and what it remembers of it.

``OrderBook.apply`` admits an order by the spine's rules (``prewarm.admit``: not seen before, for this
node, before its deadline, for the version the catalog holds), carries it out through the node's own
``ensure`` and ``evict`` (whose paths are the ones ``prewarm.effect`` names), and records the outcome:
ids are remembered for idempotency, and the last few outcomes go into the node's state report. Whatever
one order does, ``apply`` returns an outcome: the consumer loop must keep going.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Protocol

from executor import _metrics
from executor._result import LoadResult
from models import Catalog
from prewarm import (
    Order,
    OrderAction,
    OrderOutcome,
    OrderStatus,
    PrewarmError,
    Tier,
    admit,
    get_logger,
)

__all__ = ["Node", "OrderBook"]

log = get_logger(__name__)
_ORDER_MEMORY = 10_000  # order ids remembered for idempotency
_RECENT_OUTCOMES = 50


class Node(Protocol):
    """What carrying out an order needs of the executor."""

    @property
    def catalog(self) -> Catalog: ...

    def ensure(
        self,
        model_id: str,
        tier: Tier | str = ...,
        *,
        demand: bool = ...,
        gpus: Sequence[int] = ...,
        hold_until: float | None = ...,
    ) -> LoadResult: ...

    def evict(self, model_id: str, tier: Tier | str) -> list[Tier]: ...


class OrderBook:
    """The orders one node has applied or is applying. Thread-safe: several lanes apply at once."""

    def __init__(self, node: Node, *, name: str, clock: Callable[[], float]) -> None:
        self._node = node
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._outcomes: OrderedDict[str, OrderOutcome] = OrderedDict()
        self._in_flight: set[str] = set()
        self._recent: deque[OrderOutcome] = deque(maxlen=_RECENT_OUTCOMES)

    def recent(self) -> list[OrderOutcome]:
        """The last outcomes, oldest first."""
        with self._lock:
            return list(self._recent)

    def apply(self, order: Order) -> OrderOutcome:
        """Carry out one order. Idempotent by ``order.id``; past its deadline it is skipped (EXPIRED)."""
        now = self._clock()
        with self._lock:
            seen = self._outcomes.get(order.id)
            in_flight = order.id in self._in_flight
            if seen is not None or in_flight:
                detail = f"applied before: {seen.status.value}" if seen is not None else "being applied"
                refused = admit(order, now, node=self._name, spec=None, seen=detail)
                assert refused is not None
                return OrderOutcome(
                    order_id=order.id,
                    node=order.node,
                    model=order.model,
                    status=refused.status,
                    at=now,
                    served_from=seen.served_from if seen else None,
                    detail=refused.detail,
                )
            self._in_flight.add(order.id)
        start = time.perf_counter()
        served_from: Tier | None = None
        try:
            status, detail, served_from = self._carry_out(order, now)
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
            self._in_flight.discard(order.id)
            self._outcomes[order.id] = outcome
            while len(self._outcomes) > _ORDER_MEMORY:
                self._outcomes.popitem(last=False)
            self._recent.append(outcome)
        _metrics.ORDERS.labels(order.action.value, status.value).inc()
        return outcome

    def _carry_out(self, order: Order, now: float) -> tuple[OrderStatus, str, Tier | None]:
        refused = admit(order, now, node=self._name, spec=self._node.catalog.get(order.model))
        if refused is not None:
            return refused.status, refused.detail, None
        if order.action is OrderAction.EVICT:
            dropped = self._node.evict(order.model, order.tier)
            return OrderStatus.DONE, "dropped from " + (",".join(t.value for t in dropped) or "nothing"), None
        # PREFETCH: the target tier holds it afterwards. DEMOTE: the same, then the copies closer to the
        # GPU go (``prewarm.effect`` says what each order does; ``ensure`` takes the path it names).
        # An L0 copy goes to the GPUs the order names (the planner's placement), else the executor's.
        result = self._node.ensure(
            order.model, order.tier, demand=order.demand, gpus=order.gpus, hold_until=order.hold_until
        )
        if order.action is OrderAction.DEMOTE and order.tier.level > 0:
            # ``evict`` at the tier one closer drops that tier and every tier closer still.
            self._node.evict(order.model, order.tier.closer())
        return OrderStatus.DONE, "", result.served_from
