"""The one interface a compared policy implements, the registry that builds policies from labels, and
the two memoryless baselines.

A policy sees the simulated cluster the way the live planner sees real executors: through their reports
(``tick``), and through each request once it has been served (``on_request``). It answers with
``prewarm.Order`` s, which the world applies at their ``not_before`` by the executor's rules. A delayed
order is confirmed with ``still_wanted`` when it comes due; one it no longer wants may be replaced then
(``superseded``), so a keep-alive keeps one timer per model, moved on by later requests, rather than an
order per request.

- ``reactive``: what platforms do without a keep-alive — nothing until a request arrives, then the world
  loads it (the executor's LRU makes room). Nothing leaves GPU memory until something needs the room.
- ``keepalive:TTL``: after each request hold the model in GPU memory for TTL seconds (default 600, the
  platforms' ten minutes), then unload it: demote it one tier (L0→L1) on a cluster, evict it from the
  only tier under ``--unlimited``.

Policies are built from labels (``kind`` or ``kind:KNOB``) by ``make_policy``; a module adds a kind with
``register_policy(kind, factory)`` when it is imported (``sim/__init__.py`` imports every policy module).
"""

from __future__ import annotations

import functools
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from models import Catalog, ModelSpec
from prewarm import ExecutorState, Hint, InvalidInput, Order, OrderAction, OrderReason, Tier

if TYPE_CHECKING:
    from forecaster import ModelForecast
    from scheduler import PlannerConfig

__all__ = [
    "DEFAULT_POLICIES",
    "UNLIMITED_NODE",
    "ForecastSource",
    "KeepAlivePolicy",
    "NodeShape",
    "Policy",
    "PolicyContext",
    "PolicyFactory",
    "PolicyInputs",
    "ReactivePolicy",
    "Requests",
    "UnloadTimer",
    "knob_float",
    "make_policy",
    "order_for",
    "policy_kinds",
    "register_policy",
]

Requests = tuple[npt.NDArray[np.float64], npt.NDArray[np.str_]]
"""(sorted timestamps, models): requests in time order."""

ForecastSource = Callable[[float], "Mapping[str, ModelForecast]"]

UNLIMITED_NODE = "unlimited"
"""The one node of an ``--unlimited`` world."""

DEFAULT_POLICIES = ("reactive", "keepalive:600", "histogram", "oracle", "prewarm")
"""What ``prewarm sim run`` compares when no ``--policy`` is given."""


@dataclass(frozen=True)
class NodeShape:
    """One node's memory as the world models it: L0 per GPU, L1 (host) and L2 (disk) per node."""

    name: str
    gpu_bytes: tuple[int, ...]
    host_bytes: int
    disk_bytes: int


@dataclass(frozen=True)
class PolicyContext:
    """What a policy is told once, before the first request (``Policy.prepare``)."""

    catalog: Catalog
    nodes: Mapping[str, NodeShape]
    unlimited: bool
    """``--unlimited``: one node ``UNLIMITED_NODE``, one tier (L0) without limit, instant loads."""
    start: float
    """The cut: the first simulated second (metrics count from here)."""
    end: float
    history: Requests
    """Every request before ``start`` (the training span)."""
    future: Requests | None
    """The simulated window's requests: given only to clairvoyant policies."""
    bandwidth: Mapping[str, float] = field(default_factory=dict)
    """Bytes per second of each link as ``prewarm.HOP_INTO`` names it (under ``--unlimited``: the default
    cluster's, so that a planner values a cold start at what a real load would cost)."""
    hop_overhead_s: float = 0.5
    """Fixed cost the world adds to each hop of a load, on top of bytes / bandwidth."""
    tick_s: float = 60.0
    """How often ``Policy.tick`` is called."""
    closest: Callable[[str, str], Tier] | None = None
    """``closest(node, model)``: the closest tier of the node holding the model now (L3: none), as the
    node itself knows; for a baseline that unloads only what is still loaded."""

    def unload(self, node: str, size: int) -> tuple[OrderAction, Tier]:
        """How a baseline takes a model of ``size`` bytes out of GPU memory on ``node``: out of the only
        tier under ``--unlimited``; on a cluster one tier down (the design's demotion) to the closest
        tier of the node that could ever hold it, host memory or else its disk, and out of GPU memory
        where neither could. A demotion to a tier too small for the model fails, as the executor's
        does, and left the copy in GPU memory: keep-alive on a node whose host memory is smaller than
        the model never unloaded it."""
        if self.unlimited:
            return OrderAction.EVICT, Tier.L0
        shape = self.nodes[node]
        if shape.host_bytes >= size:
            return OrderAction.DEMOTE, Tier.L1
        if shape.disk_bytes >= size:
            return OrderAction.DEMOTE, Tier.L2
        return OrderAction.EVICT, Tier.L0


class Policy(ABC):
    """A policy the simulator compares. ``name`` is its label as given on the command line."""

    name: str
    clairvoyant: ClassVar[bool] = False
    """True: ``prepare`` is given the simulated window's requests (``PolicyContext.future``)."""

    def prepare(self, ctx: PolicyContext) -> None:  # noqa: B027 - optional hook, empty by default
        """Called once, before anything else."""

    def on_request(self, model: str, at: float, node: str) -> list[Order]:
        """Called after each request is served (also during the warm-up before the cut)."""
        return []

    def still_wanted(self, order: Order, now: float) -> bool:
        """Asked when a delayed order comes due: False drops it unapplied."""
        return True

    def superseded(self, order: Order, now: float) -> list[Order]:
        """Asked when ``still_wanted`` dropped ``order``: the orders that replace it, applied when due."""
        return []

    @abstractmethod
    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        """Called every planning interval with the nodes' reports and the hints received since the last
        tick: orders to apply, each when its ``not_before`` is reached."""


_ids = itertools.count()


def order_for(
    node: str,
    spec: ModelSpec,
    action: OrderAction,
    tier: Tier,
    at: float,
    *,
    gpus: Sequence[int] = (),
    reason: OrderReason = OrderReason.FORECAST,
    demand: bool = False,
    ttl_s: float = 600.0,
) -> Order:
    """An order for ``spec`` on ``node`` due at ``at`` (deadline ``at + ttl_s``), with an id no other
    order of this process has."""
    return unvalidated(
        Order,
        {
            "v": 1,
            "id": f"sim-{next(_ids)}",
            "node": node,
            "model": spec.id,
            "version": spec.version,
            "sha256": spec.sha256,
            "action": action,
            "tier": tier,
            "reason": reason,
            "not_before": at,
            "deadline": at + ttl_s,
            "created_at": at,
            "demand": demand,
            "gpus": list(gpus),
            "note": "",
        },
    )


_M = TypeVar("_M", bound=BaseModel)


@functools.cache
def _defaults(
    cls: type[BaseModel],
) -> tuple[frozenset[str], dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]:
    """A model's plain defaults, and its default factories (called per instance: their values are
    mutable). A field with neither is required."""
    plain: dict[str, Any] = {}
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, info in cls.model_fields.items():
        if info.default_factory is not None:
            factories.append((name, info.default_factory))  # type: ignore[arg-type]
        elif not info.is_required():
            plain[name] = info.default
    required = frozenset(cls.model_fields) - set(plain) - {name for name, _ in factories}
    return required, plain, tuple(factories)


def build(cls: type[_M], **fields: Any) -> _M:
    """``unvalidated(cls, fields)`` with the fields as keywords."""
    return unvalidated(cls, fields)


def unvalidated(cls: type[_M], fields: dict[str, Any]) -> _M:
    """A pydantic model from fields already known to be valid; fields left out take their defaults.

    The baselines make orders by the hundred thousand and a planner reads reports every tick:
    validating them (or ``model_construct``, which resolves defaults field by field) costs more than the
    simulation.
    """
    required, plain, factories = _defaults(cls)
    if not required.issubset(fields):
        raise TypeError(f"{cls.__name__} needs the fields {sorted(required - set(fields))}")
    given = fields
    fields = {**plain, **given}
    for name, factory in factories:
        if name not in given:
            fields[name] = factory()
    model = cls.__new__(cls)
    object.__setattr__(model, "__dict__", fields)
    object.__setattr__(model, "__pydantic_fields_set__", set(given))
    object.__setattr__(model, "__pydantic_extra__", None)
    object.__setattr__(model, "__pydantic_private__", None)
    return model


class UnloadTimer:
    """One unload order per model on its way, moved on by later plans rather than ordered anew.

    ``set`` says when (and on which node) a model's unload is now due; it returns an order only when none
    is on its way or the one on its way comes later. When that order comes due, ``due`` says whether it is
    the unload as planned now (and takes it off its way); if it is not, ``moved`` gives the order at the
    planned time that replaces it (``Policy.superseded``). ``make(model, node, due)`` builds an order.
    """

    def __init__(self, make: Callable[[str, str, float], Order]) -> None:
        self._make = make
        self._plan: dict[str, tuple[float, str]] = {}  # model -> (when, node) its unload is due now
        self._armed: dict[str, Order] = {}  # model -> its earliest unload on its way

    def set(self, model: str, due: float, node: str) -> list[Order]:
        self._plan[model] = (due, node)
        armed = self._armed.get(model)
        return [] if armed is not None and armed.not_before <= due else [self._arm(model)]

    def owns(self, order: Order) -> bool:
        """Whether ``order`` is the unload on its way (an earlier one it replaced is not)."""
        return order is self._armed.get(order.model)

    def due(self, order: Order) -> bool:
        """Whether ``order`` (one this timer ``owns``) is the unload as planned now; then it is done."""
        if (order.not_before, order.node) != self._plan[order.model]:
            return False
        del self._armed[order.model]
        return True

    def moved(self, order: Order) -> list[Order]:
        """The order that replaces ``order``, which ``due`` refused: at the time planned now."""
        return [self._arm(order.model)] if self.owns(order) else []

    def _arm(self, model: str) -> Order:
        due, node = self._plan[model]
        order = self._armed[model] = self._make(model, node, due)
        return order


class ReactivePolicy(Policy):
    """Load on request (the world does that for every policy), and nothing else."""

    def __init__(self, name: str = "reactive") -> None:
        self.name = name

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        return []


class KeepAlivePolicy(Policy):
    """After each request, hold the model in GPU memory ``ttl_s`` seconds, then unload it.

    One timer per model (``UnloadTimer``): the first request orders the unload, later ones move its time
    on. An order per request was most of the policy's cost on a busy model, and all but the last were
    dropped unapplied.
    """

    def __init__(self, ttl_s: float = 600.0, name: str | None = None) -> None:
        if ttl_s < 0:
            raise InvalidInput(f"keep-alive TTL must be ≥ 0 seconds, got {ttl_s:g}")
        self.ttl_s = ttl_s
        self.name = name or f"keepalive:{ttl_s:g}"
        self._ctx: PolicyContext | None = None
        self._timer = UnloadTimer(self._unload)

    def prepare(self, ctx: PolicyContext) -> None:
        self._ctx = ctx

    def on_request(self, model: str, at: float, node: str) -> list[Order]:
        # Due just after at + TTL: a request exactly TTL after this one still finds it (a timer every
        # TTL seconds stays warm), though orders due at an instant are applied before its requests.
        return self._timer.set(model, math.nextafter(at + self.ttl_s, math.inf), node)

    def _unload(self, model: str, node: str, due: float) -> Order:
        if self._ctx is None:
            raise RuntimeError("KeepAlivePolicy.prepare was not called")
        spec = self._ctx.catalog[model]
        action, tier = self._ctx.unload(node, spec.size_bytes)
        return order_for(node, spec, action, tier, due, reason=OrderReason.CAPACITY)

    def still_wanted(self, order: Order, now: float) -> bool:
        if not (self._timer.owns(order) and self._timer.due(order)):
            return False  # a later request moved the timer on: replaced (``superseded``)
        # A demotion of a model the LRU already moved out of GPU memory would load it back from disk.
        closest = self._ctx.closest if self._ctx is not None else None
        return closest is None or closest(order.node, order.model) is Tier.L0

    def superseded(self, order: Order, now: float) -> list[Order]:
        return self._timer.moved(order)

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        return []


# ------------------------------------------------------------------ registry


@dataclass(frozen=True)
class PolicyInputs:
    """What a factory may use beyond its label: the forecasts and planner knobs of the run."""

    forecasts: ForecastSource | None = None
    planner: PlannerConfig | None = None


PolicyFactory = Callable[[str, "str | None", PolicyInputs], Policy]
"""``factory(label, knob, inputs)``: the policy for ``label`` (``kind`` or ``kind:knob``; knob None when
absent). It raises ``InvalidInput`` for a knob it cannot use. ``sim.compare`` and ``sim.run_policies`` first
build each label once with empty inputs, to refuse a bad knob before anything is fitted or run: building
must be cheap, and must not need the forecasts."""

_REGISTRY: dict[str, PolicyFactory] = {}


def register_policy(kind: str, factory: PolicyFactory) -> None:
    """Make ``make_policy`` build labels of ``kind`` with ``factory`` (a later registration replaces an
    earlier one, so a module can be reloaded)."""
    _REGISTRY[kind] = factory


def policy_kinds() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_policy(
    label: str, *, forecasts: ForecastSource | None = None, planner: PlannerConfig | None = None
) -> Policy:
    """The policy a label names (``reactive``, ``keepalive:600``, ``prewarm:0.01`` ...), named by it."""
    kind, sep, knob = label.partition(":")
    factory = _REGISTRY.get(kind)
    if factory is None:
        raise InvalidInput(f"unknown policy {kind!r}: known are {', '.join(policy_kinds())}")
    if sep and not knob:
        raise InvalidInput(f"policy {label!r}: empty knob after ':'")
    policy = factory(label, knob if sep else None, PolicyInputs(forecasts=forecasts, planner=planner))
    policy.name = label
    return policy


def knob_float(label: str, knob: str | None, default: float) -> float:
    """A numeric knob, or ``default`` when absent; ``InvalidInput`` naming the label otherwise."""
    if knob is None:
        return default
    try:
        value = float(knob)
    except ValueError:
        raise InvalidInput(f"policy {label!r}: knob {knob!r} is not a number") from None
    if not np.isfinite(value):
        raise InvalidInput(f"policy {label!r}: knob {knob!r} is not finite")
    return value


def _reactive(label: str, knob: str | None, inputs: PolicyInputs) -> Policy:
    if knob is not None:
        raise InvalidInput(f"policy {label!r}: reactive takes no knob")
    return ReactivePolicy(label)


def _keepalive(label: str, knob: str | None, inputs: PolicyInputs) -> Policy:
    return KeepAlivePolicy(knob_float(label, knob, 600.0), name=label)


register_policy("reactive", _reactive)
register_policy("keepalive", _keepalive)
