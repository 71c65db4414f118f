"""The status page: what prewarm believes and what it did, for operators, read-only.

Routes (registered on the hint API's app by ``register_status``):

* ``GET /status``: the page (``_status_page``), or a sign-in form without a valid session;
* ``POST /status/session``: a form with a read token (or a hint writer's; never a publishable one, as on
  the API) in, a session cookie out, then back to ``/status``;
* ``POST /status/signout``: the cookie cleared;
* ``GET /status/data``: the page's JSON, polled every few seconds, so the page updates without a
  reload. It takes the session cookie or an ``Authorization: Bearer`` read token.

A browser sends no bearer header when it navigates, hence the cookie. It holds no token: it is
``role:source:expires`` signed with HMAC-SHA256 under a key derived from the token that signed in, so
every replica that has the same tokens accepts it (no session store to share), and rotating or removing
that token ends its sessions. It is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other
site's page can make the browser send it), ``Path=/status``, ``Secure`` when the request came over
HTTPS (or through a proxy that says ``X-Forwarded-Proto: https``), and lasts ``SESSION_TTL_S``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from forecaster import ForecasterBundle
from prewarm import (
    CACHE_TIERS,
    Forbidden,
    OrderReason,
    SchedulerSettings,
    StorageError,
    Unauthorized,
    get_logger,
)
from scheduler._auth import Authenticator, Principal, Role, parse_token_spec
from scheduler._core import SchedulerCore
from scheduler._status_page import PAGE_CSS, PAGE_JS, page_html, signin_html

__all__ = ["COOKIE", "SESSION_TTL_S", "SessionSigner", "StatusSources", "register_status", "status_data"]

log = get_logger(__name__)

COOKIE = "prewarm_session"
SESSION_TTL_S = 8 * 3600
_KEY_CONTEXT = b"prewarm status session v1"
_HOUR = 3600
_NEXT_S = 2 * _HOUR
_NEXT_STEP_S = 600
MAX_MODELS = 100  # rows on the page; the API has every model
DEMAND_REFRESH_S = 15.0
_SECURITY_HEADERS = {
    # The page's script is a file of this origin; nothing inline, nothing from elsewhere.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class DemandReader(Protocol):
    """The part of ``ingest.DemandStore`` the page reads."""

    def bulk(self, models: Sequence[str] | None, start: float, end: float, step: int = 60) -> Any: ...

    def minutes(self, since: float | None = None, model: str | None = None) -> Any: ...


@dataclass(frozen=True)
class StatusSources:
    """What the page shows besides the core's state: the demand store (the last 24 h, recent cold
    starts) and the forecaster served (what it said for those 24 h). Either may be missing."""

    demand: Callable[[], DemandReader | None] = lambda: None
    forecaster: Callable[[], ForecasterBundle | None] = lambda: None
    refresh_s: float = DEMAND_REFRESH_S
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def cached_demand(
        self, ids: Sequence[str], start: float, now: float
    ) -> tuple[dict[str, list[int]], list[dict[str, Any]], str | None]:
        """``_demand``, read at most every ``refresh_s``: hourly counts move slowly, and at 10,000 models
        a day of minutes is millions of rows, too many to read at every poll of every viewer."""
        at, value = self._cache.get("demand", (-math.inf, None))
        if value is None or now - at >= self.refresh_s or self._cache.get("start") != start:
            value = _demand(self.demand(), ids, start, now)
            self._cache.update(demand=(now, value), start=start)
        return value  # type: ignore[no-any-return]


class SessionSigner:
    """Signs and checks session cookies with keys derived from the configured read and writer tokens."""

    def __init__(self, settings: SchedulerSettings, *, clock: Callable[[], float] = time.time) -> None:
        credentials = [
            *parse_token_spec(settings.hint_tokens.get_secret_value(), Role.WRITER),
            *parse_token_spec(settings.read_tokens.get_secret_value(), Role.READER),
        ]
        self._keys = {
            (c.principal.role.value, c.principal.source): hmac.new(
                c.token, _KEY_CONTEXT, hashlib.sha256
            ).digest()
            for c in credentials
        }
        self._clock = clock

    def __repr__(self) -> str:
        return f"SessionSigner({len(self._keys)} keys)"

    def sign(self, principal: Principal) -> str:
        expires = int(self._clock() + SESSION_TTL_S)
        payload = f"{principal.role.value}:{principal.source}:{expires}".encode()
        key = self._keys[(principal.role.value, principal.source)]
        mac = hmac.new(key, payload, hashlib.sha256).hexdigest()
        return base64.urlsafe_b64encode(payload).decode().rstrip("=") + "." + mac

    def check(self, cookie: str | None) -> str | None:
        """The source the cookie was signed for, or None (absent, forged, expired, token rotated)."""
        if not cookie or "." not in cookie:
            return None
        encoded, _, mac = cookie.partition(".")
        try:
            payload = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            role, source, expires = payload.decode().split(":")
            expiry = int(expires)
        except (ValueError, UnicodeDecodeError):
            return None
        key = self._keys.get((role, source))
        if key is None or expiry < self._clock():
            return None
        if not hmac.compare_digest(mac, hmac.new(key, payload, hashlib.sha256).hexdigest()):
            return None
        return source


def register_status(
    app: FastAPI,
    core: SchedulerCore,
    auth: Authenticator,
    settings: SchedulerSettings,
    *,
    sources: StatusSources | None = None,
    active: Callable[[], bool] | None = None,
    wall: Callable[[], float] = time.time,
) -> None:
    """Add the status page's routes to the hint API's ``app``."""
    signer = SessionSigner(settings, clock=wall)
    sources = sources or StatusSources()
    max_body = settings.max_body_bytes

    def session(request: Request) -> str | None:
        return signer.check(request.cookies.get(COOKIE))

    @app.get("/status", include_in_schema=False)
    def status_page(request: Request) -> HTMLResponse:
        if session(request) is None:
            return HTMLResponse(signin_html(), headers=_SECURITY_HEADERS)
        return HTMLResponse(page_html(), headers=_SECURITY_HEADERS)

    @app.get("/status/app.css", include_in_schema=False)
    def status_style() -> Response:
        return Response(PAGE_CSS, media_type="text/css", headers=_SECURITY_HEADERS)

    @app.get("/status/app.js", include_in_schema=False)
    def status_script() -> Response:
        return Response(PAGE_JS, media_type="text/javascript", headers=_SECURITY_HEADERS)

    @app.post("/status/session", include_in_schema=False)
    async def sign_in(request: Request) -> Response:
        body = await request.body()
        token = ""
        if len(body) <= max_body:
            token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        try:
            principal = auth.reader(f"Bearer {token}" if token else None)
        except (Unauthorized, Forbidden) as exc:
            # The form again, with why; the token typed is never echoed.
            return HTMLResponse(signin_html(str(exc)), status_code=403, headers=_SECURITY_HEADERS)
        response = RedirectResponse("/status", status_code=303, headers=_SECURITY_HEADERS)
        response.set_cookie(
            COOKIE,
            signer.sign(principal),
            max_age=SESSION_TTL_S,
            path="/status",
            httponly=True,
            samesite="strict",
            secure=_https(request),
        )
        log.info("status page sign-in", extra={"source": principal.source, "role": principal.role.value})
        return response

    @app.post("/status/signout", include_in_schema=False)
    def sign_out() -> Response:
        response = RedirectResponse("/status", status_code=303, headers=_SECURITY_HEADERS)
        response.delete_cookie(COOKIE, path="/status", httponly=True, samesite="strict")
        return response

    @app.get("/status/data", include_in_schema=False)
    def data(request: Request) -> JSONResponse:
        if session(request) is None:
            try:
                auth.reader(request.headers.get("authorization"))
            except Unauthorized as exc:
                return JSONResponse({"error": "unauthorized", "message": str(exc)}, status_code=401)
            except Forbidden as exc:
                return JSONResponse({"error": "forbidden", "message": str(exc)}, status_code=403)
        body = status_data(core, sources, now=core.now(), active=active() if active else True)
        return JSONResponse(body, headers={"Cache-Control": "no-store"})


def _https(request: Request) -> bool:
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


# ---------------------------------------------------------------------------------------------- data


def status_data(core: SchedulerCore, sources: StatusSources, *, now: float, active: bool) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data."""
    reports = core.reports()
    plan = core.plan_view()
    orders = core.recent_orders(200)
    hints = core.hints()
    forecasts = core.forecasts()
    tiers = plan["tiers"]
    day_start = math.floor(now / _HOUR) * _HOUR - 23 * _HOUR  # 24 whole hours, the current one last
    demand, cold, demand_error = sources.cached_demand(core.catalog.ids(), day_start, now)
    bundle = sources.forecaster()
    hinted = {h.model for h in hints}

    def expected(model: str) -> list[float]:
        forecast = forecasts.get(model)
        if forecast is None:
            return []
        return [
            round(forecast.expected_in(t, t + _NEXT_STEP_S), 3)
            for t in range(int(now), int(now + _NEXT_S), _NEXT_STEP_S)
        ]

    ids = core.catalog.ids()
    next_2h = {m: expected(m) for m in ids}

    def weight(model: str) -> float:
        return (
            sum(demand.get(model, ()))
            + sum(next_2h[model])
            + (1e9 if model in hinted or model in tiers else 0)
        )

    shown = sorted(ids, key=lambda m: (-weight(m), m))[:MAX_MODELS]
    past = _past_forecast(bundle, shown, day_start)
    models = [
        {
            "model": m,
            "tiers": tiers.get(m, {}),
            "hints": sum(1 for h in hints if h.model == m),
            "family": forecasts[m].family if m in forecasts else None,
            "demand_24h": demand.get(m, [0] * 24),
            "forecast_24h": past.get(m),
            "forecast_next_2h": next_2h[m],
        }
        for m in shown
    ]
    upcoming = plan["upcoming"]
    return {
        "at": now,
        "active": active,
        "planned_at": plan["at"],
        "models_total": len(ids),
        "models": models,
        "hour_starts": [day_start + i * _HOUR for i in range(24)],
        "next_step_s": _NEXT_STEP_S,
        "nodes": [_node(r) for _, r in sorted(reports.items())],
        "hints": [h.model_dump(mode="json") for h in hints],
        "upcoming": upcoming,
        "recent": [_order(o) for o in orders if o.not_before <= now][:50],
        "deferred": plan["deferred"],
        "mispredictions": [_order(o) for o in orders if o.reason is OrderReason.MISPREDICTION][:50],
        "cold_starts": cold,
        "demand_error": demand_error,
    }


def _order(order: Any) -> dict[str, Any]:
    return {
        "id": order.id,
        "node": order.node,
        "model": order.model,
        "action": order.action.value,
        "tier": order.tier.value,
        "reason": order.reason.value,
        "not_before": order.not_before,
        "deadline": order.deadline,
        "note": order.note,
    }


def _node(report: Any) -> dict[str, Any]:
    tiers = []
    for tier in CACHE_TIERS:
        state = report.tier(tier)
        if state is None:
            continue
        tiers.append(
            {
                "tier": tier.value,
                "capacity_bytes": state.capacity_bytes,
                "used_bytes": state.used_bytes,
                "resident": [
                    {
                        "model": r.model,
                        "version": r.version,
                        "bytes": r.bytes,
                        "prefetched": r.prefetched,
                        "leases": r.leases,
                        "gpus": r.gpus,
                        "last_used": r.last_used,
                    }
                    for r in state.resident
                ],
            }
        )
    gpus = [
        {"index": g.index, "capacity_bytes": g.capacity_bytes, "used_bytes": g.used_bytes}
        for g in report.gpus
    ]
    return {"node": report.node, "at": report.at, "device": report.device, "tiers": tiers, "gpus": gpus}


def _demand(
    store: DemandReader | None, ids: Sequence[str], start: float, now: float
) -> tuple[dict[str, list[int]], list[dict[str, Any]], str | None]:
    """Hourly requests of the last 24 h per model, and the minutes with cold starts of the last hour."""
    if store is None:
        return {}, [], "no demand store"
    try:
        frame = store.bulk(list(ids), start, start + 24 * _HOUR, _HOUR)
        hourly = {str(m): [int(v) for v in frame[m].tolist()] for m in frame.columns}
        cold = [
            {
                "model": m,
                "minute": minute,
                "requests": req,
                "cold_starts": c,
                "wait_s": round(wait / 1000.0, 3),
            }
            for m, minute, req, c, wait in store.minutes(since=now - _HOUR)
            if c > 0
        ]
    except StorageError as exc:
        return {}, [], str(exc)
    return hourly, sorted(cold, key=lambda c: -c["minute"])[:50], None


def _past_forecast(
    bundle: ForecasterBundle | None, models: Sequence[str], start: float
) -> Mapping[str, list[float]]:
    """What the served forecaster expects per hour over the last 24 h (its seasonal profile)."""
    if bundle is None:
        return {}
    known = [m for m in models if m in set(bundle.models)]
    if not known:
        return {}
    minutes = [start + 60.0 * i for i in range(24 * 60)]
    rates = bundle.rates(minutes, known)  # (models, minutes): requests per minute
    return {
        m: [round(float(v), 2) for v in rates[i].reshape(24, 60).sum(axis=1)] for i, m in enumerate(known)
    }
