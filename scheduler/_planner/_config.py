"""What the planner is told and what it answers: its knobs, its results, and how a decision becomes an
order with a stable id."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from models import ModelSpec
from prewarm import Order, OrderAction, OrderReason, SchedulerSettings, Tier

_INF = math.inf


OBJECTIVES = ("requests", "models")
"""What ``PlannerConfig.objective`` may say."""


def _default_prices() -> dict[Tier, float]:
    # Per GB·s held. Idle GPU and host memory cost nothing to fill: what a model held there really costs
    # is what it keeps out, and that is weighed by value when room is made. A fixed price here demoted a
    # busy 70 GB model every few minutes with the GPU otherwise empty. Disk keeps a token price so that
    # a model with no realistic chance of a request (P below ~0.1% for 140 GB) is not even staged.
    return {Tier.L0: 0.0, Tier.L1: 0.0, Tier.L2: 1e-6}


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the planning policy. Times in seconds."""

    window_s: float = 600.0
    """Length of the window a forecast probability is taken over, and a model is held for."""
    horizon_s: float = 3600.0
    """How far ahead forecasts are scanned for a window worth a timed prefetch."""
    step_s: float = 60.0
    """Step of that scan."""
    lead_margin_s: float = 5.0
    """Added to the transfer time when computing when a prefetch must start."""
    lead_margin_frac: float = 0.2
    """Transfer time is stretched by this fraction, for bandwidth that varies."""
    hop_overhead_s: float = 0.5
    """Fixed cost of each hop (allocation, open, engine hand-over) on top of bytes / bandwidth."""
    price_per_gb_s: Mapping[Tier, float] = field(default_factory=_default_prices)
    """Cost of holding one GB in a tier for one second, in the same unit as a weighted second waited."""
    miss_penalty: float = 2.0
    """Weighted seconds charged per second of a transfer that serves no request, times (1 - P): the hops
    into L1/L0, and a download from object storage in the share of time loads on request keep that
    link busy (``ExecutorState.link_demand_busy``; on an idle link a staged disk copy costs nothing).

    A speculative move there is made when ``P × weight > (1 - P) × miss_penalty``: for a standard model
    P > 2/3 with 2, so that mispredictions stay a small share of prefetches; 0 prefetches on any chance.
    A weight below 1 (a busy model under ``objective="models"``) weighs the charge too.
    """
    memory_price: float = 0.0
    """Weighted seconds charged per GB·minute a copy is held in L0 or L1: what memory costs.

    It prices holding and prefetching alike, so that a 2 GB model is kept warm far longer than a 140 GB
    one for the same GB-minutes: a resident is released (one tier down) when the chance per second of
    a request, times what the copy saves that request, is worth less than the price of the GB it
    holds for that second, and holding it until a later rise in its forecast would not pay or a
    prefetch could bring it back for that rise; a prefetch must pay for the GB-minutes from its load
    to the end of its window. At 0.05, for instance, a 140 GB copy stays in GPU memory (host memory
    3.3 s away, 8.3 s with the cold start) only while a request in the next minute has P > 0.57, a
    2 GB one while P > 0.02 (where its forecast is flat).

    The default, 0, is what memory costs on a live platform inside the budget given to prewarm: that
    memory is paid for whether it holds a model or not, so nothing is released while nothing wants the
    room (room is then arbitrated by value when it is made), and a cluster where everything fits never
    makes more cold starts than loading on request. Set a price where held memory has another use: GPUs
    shared with the engines' KV cache, nodes that scale down when idle, or the serverless comparison
    (``prewarm sim run --unlimited``, where idle memory is the cost being minimised); the simulator
    sweeps it as ``prewarm:X`` to draw the trade-off between idle GB-minutes and cold starts.
    """
    contended_memory_price: float = 0.0
    """``memory_price`` for host memory on a node whose executor has been giving host copies up on its
    own (the LRU, making room for loads on request: ``NodeState.unused_for``), where ``memory_price`` is
    0: an option for a platform that wants host memory back where it is contended.

    There the room is wanted, and the LRU would give it up by recency alone, however likely the copy's
    next request; a copy whose hold is worth less than this price is released to disk instead
    (``_release_priced``), on the planning interval. Nowhere else: not GPU memory, where a copy released
    is its next request's cold start, so on a cluster where everything fits nothing is released. It
    trades long waits for idle memory: at 0.0005 (the ``--unlimited`` price) the tight clusters of the
    policy suite held 5 % less host and GPU memory idle and had 6 % more requests waiting over 5 s
    (docs/benchmarks.md), so the default is 0: memory inside the budget is paid for either way.
    """
    cold_start_s: float = 5.0
    """Weighted seconds a cold start costs on top of the seconds it waits: what keeping a model in L0
    saves besides the transfer. A 2 GB model's cold start is a cold start like a 140 GB one's (the
    per-model cold-start rate counts both the same), though its transfer takes a fraction of a second."""
    objective: str = "requests"
    """Whose cold starts the planner minimises. ``requests``: every request's wait counts the same (the
    share of requests waiting, the mean wait: what a platform's users see). ``models``: every model's
    cold-start rate counts the same (the serverless literature's measure, the 75th percentile over models
    of the per-model rate): a cold start of a model used ``N`` times a day weighs
    ``reference_daily_requests / N`` of one under ``requests``, so memory goes to the rarely used models
    whose every request is cold, and a model used thousands of times a day is not held through a lull
    for one request's sake."""
    reference_daily_requests: float = 24.0
    """Under ``objective="models"``, the daily use of a model whose cold start weighs as under
    ``requests`` (one an hour); a model used less than once a day weighs as if used once."""
    decision_interval_s: float = 60.0
    """How often the planner decides again (the plan interval): a hold is judged until the next one."""
    min_residence_s: float = 120.0
    """A model loaded or used this recently is never demoted to make room for a speculative prefetch."""
    misprediction_window_s: float = 600.0
    """A prefetched model that served no request this long after its demand was predicted (the want's
    arrival, the hint's expected time) is demoted one tier down and counted as a misprediction, once."""
    cooldown_s: float = 600.0
    """A model demoted as a misprediction is not prefetched again, on any node, for this long; twice as
    long after a second misprediction with no request served in between, and so on."""
    misprediction_memory_s: float = 86_400.0
    """How long a misprediction is remembered for that doubling (by whoever keeps the orders)."""
    order_ttl_s: float = 120.0
    """Deadline of demotions and evictions, counted from when they are due."""
    id_bucket_s: float = 60.0
    """Decisions whose reason falls in the same bucket share an order id."""
    arrival_quantile: float = 0.1
    """A forecast model must be in place when this share of its window's probability has passed."""
    turns_to_break: int = 3
    """A model whose loads, sent to a node by its host copy there, displaced GPU copies in use of models
    too large for that node's host memory this many times within ten minutes (``NodeState.turns``) has
    that host copy demoted to disk with its GPU copy, so that its next load goes where the LRU gives up
    the oldest copies; 0: never."""

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")

    def price(self, tier: Tier) -> float:
        """What holding one GB in ``tier`` for one second costs: its configured price, plus the memory
        price in host and GPU memory."""
        memory = self.memory_price / 60.0 if tier in (Tier.L0, Tier.L1) else 0.0
        return self.price_per_gb_s.get(tier, 0.0) + memory

    @classmethod
    def from_settings(cls, settings: SchedulerSettings, **overrides: Any) -> PlannerConfig:
        base = cls(
            misprediction_window_s=settings.misprediction_window_s,
            cooldown_s=settings.misprediction_window_s,
            miss_penalty=settings.miss_penalty,
            memory_price=settings.memory_price,
            contended_memory_price=settings.contended_memory_price,
            objective=settings.objective,
            decision_interval_s=settings.plan_interval_s,
            order_ttl_s=max(4 * settings.plan_interval_s, 10.0),
        )
        return replace(base, **overrides)


@dataclass(frozen=True)
class Placement:
    """Where the plan puts a model (or wanted to, for a deferred one), and why."""

    model: str
    node: str
    tier: Tier
    reason: OrderReason
    not_before: float
    deadline: float
    value: float


@dataclass(frozen=True)
class Plan:
    orders: tuple[Order, ...]
    placements: tuple[Placement, ...]
    """Prefetches decided in this round."""
    deferred: tuple[Placement, ...]
    """Prefetches worth doing that did not fit anywhere this round: they wait for room."""
    mispredictions: tuple[tuple[str, str], ...]
    """(node, model) pairs demoted because the prefetch served no request within the window."""
    predicted: Mapping[str, float] = field(default_factory=dict)
    """For each prefetch ordered, by order id: when the demand it is for was predicted. Pass it back in
    ``ClusterState.predicted``: the misprediction window counts from there."""
    full: bool = True
    """A full round; False: an incremental one, that replanned only what its event touched."""


def order_id(node: str, model: str, version: str, action: OrderAction, tier: Tier, bucket: int) -> str:
    text = f"{node}|{model}|{version}|{action.value}|{tier.value}|{bucket}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True, kw_only=True)
class _Decision:
    """One thing the round decided to do to a model on a node; ``to_order`` makes it an ``Order``.

    ``key_time`` is what the order id is bucketed by: the time of the decision's reason (a window's
    arrival, a hint's expected time, a load's time), stable across rounds for the same reason.
    """

    node: str
    spec: ModelSpec
    action: OrderAction
    tier: Tier
    reason: OrderReason
    not_before: float
    deadline: float
    key_time: float
    demand: bool = False
    gpus: tuple[int, ...] = ()  # an L0 copy's GPUs (the node's indices); none: the executor chooses
    hold_until: float | None = None  # a prefetch's: its copy counts as used then until used (LRU)
    note: str = ""  # which rule made it, for whoever reads the order (``Order.note``)

    def to_order(self, now: float, config: PlannerConfig) -> Order:
        bucket = math.floor(self.key_time / config.id_bucket_s)
        spec = self.spec
        return Order(
            id=order_id(self.node, spec.id, spec.version, self.action, self.tier, bucket),
            node=self.node,
            model=spec.id,
            version=spec.version,
            sha256=spec.sha256,
            action=self.action,
            tier=self.tier,
            reason=self.reason,
            not_before=self.not_before,
            deadline=max(self.deadline, self.not_before + 1.0),
            created_at=now,
            demand=self.demand,
            gpus=list(self.gpus),
            hold_until=self.hold_until,
            note=self.note,
        )
