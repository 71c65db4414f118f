"""Versioned wire schemas: what gateways, the scheduler and executors say to each other.

Every message carries ``v``; a reader refuses a version it does not know instead of guessing. Times on
the wire are epoch seconds (floats) except the request event's ``ts``, which gateways write as epoch
milliseconds or RFC 3339 and which is normalised to epoch milliseconds here.
"""

from __future__ import annotations

import enum
import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prewarm._exceptions import InvalidEvent
from prewarm._ids import ModelId

__all__ = [
    "CACHE_TIERS",
    "DEMAND_SOURCE",
    "EVENT_MAX_BYTES",
    "HOP_INTO",
    "ExecutorState",
    "GpuState",
    "Hint",
    "Order",
    "OrderAction",
    "OrderOutcome",
    "OrderReason",
    "OrderStatus",
    "RequestEvent",
    "ResidentModel",
    "Tier",
    "TierState",
    "parse_request_event",
]

EVENT_MAX_BYTES = 64 * 1024


class Tier(enum.StrEnum):
    """Where a model's weights are. Lower number = closer to the GPU."""

    L0 = "L0"  # GPU memory: ready to serve
    L1 = "L1"  # pinned host RAM
    L2 = "L2"  # local NVMe cache
    L3 = "L3"  # object storage

    @property
    def level(self) -> int:
        return _TIER_LEVEL[self._value_]  # the planner asks this in its inner loops: a dict, not parsing

    def closer(self) -> Tier:
        """One tier towards the GPU (L0 stays L0)."""
        return Tier(f"L{max(self.level - 1, 0)}")

    def farther(self) -> Tier:
        """One tier away from the GPU, the target of a demotion (L3 stays L3)."""
        return Tier(f"L{min(self.level + 1, 3)}")


_TIER_LEVEL = {"L0": 0, "L1": 1, "L2": 2, "L3": 3}

# Tiers a node holds bytes in; L3 (object storage) is unbounded and always holds every model.
CACHE_TIERS: tuple[Tier, ...] = (Tier.L0, Tier.L1, Tier.L2)
# The hop that brings a model into a tier, as ``ExecutorState.bandwidth_bytes_per_s`` names it.
HOP_INTO: dict[Tier, str] = {Tier.L2: "L3->L2", Tier.L1: "L2->L1", Tier.L0: "L1->L0"}


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


# ---------------------------------------------------------------- request event (gateway -> ingest)


class RequestEvent(_Wire):
    """One inference request seen by a gateway. Kafka key: the model id. Unknown fields are ignored."""

    v: Literal[1] = 1
    ts: int = Field(description="event time, epoch milliseconds (RFC 3339 accepted on input)")
    model: ModelId
    version: str | None = Field(default=None, max_length=128)
    tenant: str | None = Field(default=None, max_length=256)
    gateway: str | None = Field(default=None, max_length=256)
    status: int | str | None = None
    latency_ms: float | None = Field(default=None, ge=0)
    served_from: Tier | None = None
    wait_ms: float | None = Field(default=None, ge=0, description="time the request waited for a load")

    @field_validator("ts", mode="before")
    @classmethod
    def _ts_to_epoch_ms(cls, value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError("ts must be epoch milliseconds or an RFC 3339 string")
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError("ts must be finite")
            return int(value)
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError as exc:
                raise ValueError(f"ts {value!r} is not RFC 3339") from exc
            if parsed.tzinfo is None:
                raise ValueError(f"ts {value!r} has no time zone")
            return int(parsed.timestamp() * 1000)
        raise ValueError("ts must be epoch milliseconds or an RFC 3339 string")

    @property
    def ts_s(self) -> float:
        return self.ts / 1000.0

    @property
    def cold_start(self) -> bool:
        """The request waited for weights that were not in GPU memory."""
        return (self.served_from is not None and self.served_from is not Tier.L0) or bool(self.wait_ms)


def parse_request_event(raw: bytes) -> RequestEvent:
    """Decode one Kafka message value, or raise ``InvalidEvent`` with a short ``reason`` tag."""
    if len(raw) > EVENT_MAX_BYTES:
        raise InvalidEvent(f"event of {len(raw)} bytes exceeds {EVENT_MAX_BYTES}", reason="oversized")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEvent(f"not UTF-8: {exc}", reason="not_utf8") from exc
    try:
        return RequestEvent.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        kind = first["type"]
        if kind == "json_invalid":
            reason = "not_json"
        elif kind == "missing":
            reason = "missing_field"
        elif kind == "model_type":
            reason = "not_object"
        elif first["loc"][:1] == ("v",):
            reason = "unsupported_version"
        else:
            reason = "wrong_type"
        where = ".".join(str(p) for p in first["loc"]) or "event"
        raise InvalidEvent(f"{where}: {first['msg']}", reason=reason) from exc


# ---------------------------------------------------------------- hint (product page -> scheduler)


# A hint from this source means a request is waiting now: it pre-empts every speculative prefetch.
DEMAND_SOURCE = "demand"


class Hint(_Wire):
    """A business hint: the model will probably be wanted ``eta_s`` seconds from now."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    v: Literal[1] = 1
    model: ModelId
    eta_s: Annotated[float, Field(ge=0, le=86_400)] = 0.0
    ttl_s: Annotated[float, Field(gt=0, le=86_400)] = 600.0
    confidence: Annotated[float, Field(gt=0, le=1)] = 1.0
    source: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")] = "api"
    received_at: float | None = Field(default=None, description="set by the scheduler, epoch seconds")

    def expected_at(self, now: float) -> float:
        """When the model is expected. A hint not stamped with ``received_at`` yet counts from when it
        is received, which for whoever holds it unstamped is ``now``."""
        return (self.received_at if self.received_at is not None else now) + self.eta_s

    def expires_at(self, now: float) -> float:
        return self.expected_at(now) + self.ttl_s

    def live(self, now: float) -> bool:
        """Whether the hint still covers some time after ``now``."""
        return self.expires_at(now) > now


# ---------------------------------------------------------------- orders (scheduler -> executor)


class OrderAction(enum.StrEnum):
    PREFETCH = "prefetch"  # bring the model to ``tier`` (from wherever it is now)
    DEMOTE = "demote"  # move the model one tier away from the GPU, to ``tier``
    EVICT = "evict"  # drop the model from ``tier`` and every tier closer to the GPU


class OrderReason(enum.StrEnum):
    FORECAST = "forecast"
    HINT = "hint"
    DEMAND = "demand"
    MISPREDICTION = "misprediction"
    CAPACITY = "capacity"


class Order(_Wire):
    """A timed instruction to one node. Idempotent by ``id``; skipped once ``deadline`` has passed."""

    v: Literal[1] = 1
    id: Annotated[str, Field(min_length=1, max_length=128)]
    node: Annotated[str, Field(min_length=1, max_length=128)]
    model: ModelId
    version: str
    sha256: str | None = None
    action: OrderAction
    tier: Tier
    reason: OrderReason
    not_before: float = Field(description="epoch seconds; the order is published at this time")
    deadline: float = Field(description="epoch seconds; an executor skips the order after this")
    created_at: float
    demand: bool = Field(default=False, description="a request is waiting: pre-empts prefetches")
    hold_until: float | None = Field(
        default=None,
        description="epoch seconds; a prefetch's copy that no request has used yet counts as used at "
        "this time for the LRU (the end of its misprediction window), so loads give up older copies "
        "first; empty: as used when loaded",
    )
    gpus: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="GPUs of the node an L0 copy goes to, one shard each (see prewarm.gpu_placement); "
        "empty: the executor chooses",
    )
    note: str = ""


class OrderStatus(enum.StrEnum):
    DONE = "done"
    ALREADY = "already"  # the same order id was applied before
    EXPIRED = "expired"  # deadline passed before the executor got to it
    FAILED = "failed"


class OrderOutcome(_Wire):
    v: Literal[1] = 1
    order_id: str
    node: str
    model: ModelId
    status: OrderStatus
    at: float
    seconds: float = 0.0
    served_from: Tier | None = None
    detail: str = ""


# ---------------------------------------------------------------- executor state (executor -> scheduler)


class ResidentModel(_Wire):
    model: ModelId
    version: str
    sha256: str | None = None
    bytes: int = Field(ge=0)
    last_used: float | None = None
    loaded_at: float | None = None
    pins: int = Field(default=0, ge=0)
    prefetched: bool = Field(default=False, description="brought in speculatively and not used yet")
    gpus: list[int] = Field(default_factory=list, description="L0 only: the GPUs holding its shards")
    leases: int = Field(
        default=0, ge=0, description="engines holding it over the hand-off socket (among pins)"
    )
    lease_wait_s: float | None = Field(
        default=None, ge=0, description="the latest lease's wait, from the engine's open to the reply"
    )

    @property
    def unused_since(self) -> float | None:
        """When it was last used, or loaded if never used (the LRU's order); None when the report says
        neither."""
        return self.last_used if self.last_used is not None else self.loaded_at


class TierState(_Wire):
    tier: Tier
    capacity_bytes: int = Field(ge=0)
    used_bytes: int = Field(ge=0)
    resident: list[ResidentModel] = Field(default_factory=list)

    @property
    def free_bytes(self) -> int:
        return max(self.capacity_bytes - self.used_bytes, 0)


class GpuState(_Wire):
    """One GPU's share of a node's L0."""

    index: int = Field(ge=0)
    capacity_bytes: int = Field(ge=0)
    used_bytes: int = Field(ge=0)

    @property
    def free_bytes(self) -> int:
        return max(self.capacity_bytes - self.used_bytes, 0)


class ExecutorState(_Wire):
    """What one node holds and how fast it moves bytes. Kafka key: the node name (compacted topic)."""

    v: Literal[1] = 1
    node: Annotated[str, Field(min_length=1, max_length=128)]
    at: float
    device: str = "cpu"
    tiers: list[TierState]
    gpus: list[GpuState] = Field(
        default_factory=list, description="L0 per GPU; the L0 tier state is their sum"
    )
    bandwidth_bytes_per_s: dict[str, float] = Field(
        default_factory=dict, description="measured per hop: 'L3->L2', 'L2->L1', 'L1->L0'"
    )
    link_demand_busy: dict[str, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=dict,
        description="per hop, the share of about the last ten minutes (prewarm.BusyShare) it spent "
        "carrying at least one load a request waited on",
    )
    recent_outcomes: list[OrderOutcome] = Field(default_factory=list)
    demand_loads: list[ModelId] = Field(
        default_factory=list,
        description="models this node is loading for a request that waits on them, before their copy "
        "is ready (a planner places no speculative copy of them elsewhere)",
    )

    def tier(self, tier: Tier) -> TierState | None:
        return next((t for t in self.tiers if t.tier is tier), None)
