"""What the hint API's OpenAPI document declares: bodies, the error body, and which errors each route sends.

The document is a promise that clients and ``tests/scheduler/test_api_schema.py`` (schemathesis, against
the real server) hold the server to: every status a route can answer is listed with the route, every
constraint the server enforces on an input is in its schema (model ids through ``ModelId``'s own JSON
Schema), and every error is ``application/json`` ``{"error", "message"}``. The bodies here describe what
``SchedulerCore``'s views return; they are never used to build a response, only to say what one is.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from models import ModelSpec
from prewarm import Hint, Order, OrderReason, Tier

__all__ = [
    "ERROR_CODES",
    "ErrorBody",
    "Health",
    "HintAccepted",
    "HintList",
    "ModelView",
    "PlanView",
    "Readiness",
    "errors",
]

ERROR_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    422: "invalid",
    429: "rate_limited",
    503: "not_ready",
}

_WHY = {
    401: "No bearer token, or an Authorization header that is not `Bearer <token>`.",
    403: "The token is not valid, or its role does not allow this (a publishable token reads nothing, "
    "a read token posts nothing, a publishable token hints only its models and its source).",
    404: "No such model in the catalog.",
    413: "The body is larger than the scheduler's `max_body_bytes`.",
    422: "The request is not valid: the message says which field and why.",
    429: "The source is over its hint rate; `Retry-After` says when to try again.",
    503: "The scheduler cannot do this now; try again later.",
}

_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "The scheme to authenticate with.",
            "required": True,
            "schema": {"type": "string", "const": "Bearer"},
        }
    },
    429: {
        "Retry-After": {
            "description": "Whole seconds until the source may post again.",
            "required": True,
            "schema": {"type": "string", "pattern": "^[1-9][0-9]*$"},
        }
    },
}


class ErrorBody(BaseModel):
    """Every error the API answers, whatever the status."""

    model_config = ConfigDict(extra="forbid")

    error: Literal[
        "bad_request",
        "unauthorized",
        "forbidden",
        "not_found",
        "method_not_allowed",
        "too_large",
        "invalid",
        "rate_limited",
        "not_ready",
    ] = Field(description="machine-readable: one word per status")
    message: str = Field(description="for people; never holds a token")


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entries of a route that can answer ``statuses``."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorBody, "description": _WHY[status]}
        if status in _HEADERS:
            entry["headers"] = _HEADERS[status]
        out[status] = entry
    return out


class HintList(BaseModel):
    hints: list[Hint] = Field(description="hints whose window has not passed")


class HintAccepted(BaseModel):
    hint: Hint = Field(description="the hint as planned, stamped with its source and received_at")
    orders: list[Order] = Field(description="orders the hint caused at once (often none)")


class PlacementView(BaseModel):
    model: str
    node: str
    tier: Tier
    reason: OrderReason
    not_before: float
    deadline: float


class PlanView(BaseModel):
    at: float | None = Field(description="when the last planning round ran; null before the first")
    placements: list[PlacementView]
    deferred: list[PlacementView] = Field(description="prefetches the plan wants but has no room for yet")
    tiers: dict[str, dict[str, Tier]] = Field(description="model -> node -> closest tier, as reported")
    upcoming: list[Order] = Field(description="orders handed out whose effect is not reported yet")


class ForecastView(BaseModel):
    family: str
    start: float
    bucket_s: float
    p_next_window: float
    expected_next_window: float


class ModelView(BaseModel):
    model: ModelSpec
    forecast: ForecastView | None
    tiers: dict[str, Tier] = Field(description="node -> closest tier, as reported")
    hints: list[Hint]
    recent_orders: list[Order] = Field(description="the last 20 orders for the model, oldest first")


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    """Open to more fields: a probe reads ``status`` and the code."""

    status: Literal["ready", "not_ready"]
    message: str
    active: bool = Field(description="whether this replica is the one that plans and publishes")
