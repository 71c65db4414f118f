"""The hint API: product pages say a model will be wanted; operators read the plan.

Every route but ``/healthz``, ``/readyz``, ``/metrics`` and the API document itself needs a bearer token
(roles in ``_auth``; the status page under ``/status`` takes a session cookie signed in with a read token
instead, see ``_status``): ``POST /v1/hints`` a hint writer's full token or a publishable one; the reads
(``GET /v1/hints``, ``/v1/plan``, ``/v1/models/{id}``) a read token or a hint writer's, never a
publishable one, since a browser's token is in every visitor's hands and the plan is not public.
Every error is JSON ``{"error", "message"}``: 401 no token, 403 wrong token or not allowed, 404 unknown
model, 405 (with an ``Allow`` that lists every method of the path), 413 body too large, 422 invalid,
429 rate-limited (with ``Retry-After``). ``_openapi`` declares all of it in the document, which the
schemathesis test holds the server to. No response ever holds a token.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from prewarm import (
    Forbidden,
    Hint,
    ModelId,
    Order,
    SchedulerSettings,
    StorageError,
    Unauthorized,
    UnknownModel,
    __version__,
    counter,
    get_logger,
    render_metrics,
)
from scheduler._auth import Authenticator, Principal, RateLimiter
from scheduler._core import SchedulerCore
from scheduler._openapi import (
    ERROR_CODES,
    Health,
    HintAccepted,
    HintList,
    ModelView,
    PlanView,
    Readiness,
    errors,
)
from scheduler._status import StatusSources, register_status

__all__ = ["create_app"]

log = get_logger(__name__)

_HINTS = counter(
    "prewarm_scheduler_hints_total", "Hint requests by source and HTTP status.", ["source", "status"]
)
# Declares the scheme in the document and nothing else: the routes check the header themselves, so that
# a missing token and a wrong one get their own status and message.
_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="`Authorization: Bearer <token>`: a hint writer's, publishable or read token",
)
# What a client may send: the Hint wire schema minus the field the scheduler stamps itself.
_HINT_BODY_SCHEMA = {
    k: v for k, v in Hint.model_json_schema().items() if k not in {"title", "description"}
} | {"properties": {k: v for k, v in Hint.model_json_schema()["properties"].items() if k != "received_at"}}


class _ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": ERROR_CODES.get(status, "error"), "message": message}
    return JSONResponse(body, status_code=status, headers=headers)


def create_app(
    core: SchedulerCore,
    settings: SchedulerSettings,
    *,
    ready: Callable[[], tuple[bool, str]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    accept_hint: Callable[[Hint], tuple[Hint, list[Order]]] | None = None,
    active: Callable[[], bool] | None = None,
    status: StatusSources | None = None,
) -> FastAPI:
    """The ASGI app over ``core``. ``ready`` says whether the runtime behind it is up (for /readyz).
    ``accept_hint`` takes a valid hint (default ``core.add_hint``): the runtime's stores it before it
    plans, so a 202 means the hint survives this replica. ``active`` says whether this replica is the
    one that plans (default: always). ``status``: the demand store and forecaster the status page
    (``/status``, ``_status``) reads besides the core."""
    add_hint = accept_hint or core.add_hint
    auth = Authenticator(
        settings.hint_tokens.get_secret_value(),
        settings.publishable_tokens.get_secret_value(),
        settings.read_tokens.get_secret_value(),
    )
    limiter = RateLimiter(settings.hint_rate_per_s, settings.hint_burst)
    max_body = settings.max_body_bytes
    app = FastAPI(
        title="prewarm scheduler",
        version=__version__,
        description="Business hints in; the prefetch plan out. Every route but /healthz, /readyz and "
        "/metrics needs a bearer token.",
        # Swagger UI and ReDoc load their scripts from a public CDN: off a platform's network they show
        # nothing, and on it they run third-party code on the API's origin. The document stays.
        docs_url=None,
        redoc_url=None,
    )
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )

    @app.exception_handler(_ApiError)
    async def _api_error(request: Request, exc: _ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route on the path only; a path has one route
            # per method here.
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return _error(exc.status_code, str(exc.detail), headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, _describe(exc.errors()))

    def reader(
        request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]
    ) -> Principal:
        try:
            return auth.reader(request.headers.get("authorization"))
        except Unauthorized as exc:
            raise _ApiError(401, str(exc), {"WWW-Authenticate": "Bearer"}) from None
        except Forbidden as exc:
            raise _ApiError(403, str(exc)) from None

    @app.post(
        "/v1/hints",
        status_code=202,
        summary="Say that a model will probably be wanted soon",
        dependencies=[Security(_BEARER)],
        openapi_extra={
            "requestBody": {
                "required": True,
                "description": f"A hint, at most {max_body} bytes (413 beyond).",
                "content": {"application/json": {"schema": _HINT_BODY_SCHEMA}},
                "x-max-body-bytes": max_body,
            },
        },
        response_model=HintAccepted,
        responses=errors(401, 403, 404, 413, 422, 429, 503),
    )
    async def post_hint(request: Request) -> JSONResponse:
        source = "-"
        try:
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > max_body:
                raise _ApiError(413, f"body larger than {max_body} bytes")
            try:
                principal = auth.writer(request.headers.get("authorization"))
            except Unauthorized as exc:
                raise _ApiError(401, str(exc), {"WWW-Authenticate": "Bearer"}) from None
            except Forbidden as exc:
                raise _ApiError(403, str(exc)) from None
            source = principal.source
            wait = limiter.acquire(source, clock())
            if wait > 0:
                retry = str(max(1, math.ceil(wait)))
                raise _ApiError(429, f"source {source!r} is over its hint rate", {"Retry-After": retry})
            raw = await _read_limited(request, max_body)
            hint = _parse_hint(raw, source)
            if not principal.may_hint(hint.model):
                raise _ApiError(403, f"this token may not post hints for {hint.model!r}")
            try:
                stamped, orders = add_hint(hint)
            except UnknownModel as exc:
                raise _ApiError(404, str(exc)) from None
            except StorageError as exc:  # not stored: refused, so the client retries (maybe elsewhere)
                log.error("a hint could not be stored", extra={"model": hint.model, "error": str(exc)})
                raise _ApiError(
                    503, "the hint could not be stored; try again", {"Retry-After": "1"}
                ) from None
        except _ApiError as exc:
            _HINTS.labels(source, str(exc.status)).inc()
            raise
        _HINTS.labels(source, "202").inc()
        body = {
            "hint": stamped.model_dump(mode="json"),
            "orders": [o.model_dump(mode="json") for o in orders],
        }
        return JSONResponse(body, status_code=202)

    # The reads answer JSONResponse, not the views' models: ``response_model`` only documents them.
    @app.get(
        "/v1/hints",
        summary="Hints whose window has not passed",
        response_model=HintList,
        responses=errors(401, 403),
        dependencies=[Depends(reader)],
    )
    def get_hints() -> JSONResponse:
        return JSONResponse({"hints": [h.model_dump(mode="json") for h in core.hints()]})

    @app.get(
        "/v1/plan",
        summary="Planned tier per model, deferred prefetches and upcoming orders",
        response_model=PlanView,
        responses=errors(401, 403),
        dependencies=[Depends(reader)],
    )
    def get_plan() -> JSONResponse:
        return JSONResponse(core.plan_view())

    @app.get(
        "/v1/models/{model_id:path}",
        summary="Forecast, tier per node and recent orders of one model",
        response_model=ModelView,
        responses=errors(401, 403, 404, 422),
        dependencies=[Depends(reader)],
    )
    def get_model(
        model_id: Annotated[ModelId, Path(description="a catalog id; may hold '/' (org/name)")],
    ) -> JSONResponse:
        try:
            return JSONResponse(core.model_view(model_id))
        except UnknownModel as exc:
            raise _ApiError(404, str(exc)) from None

    @app.get("/healthz", summary="The process is alive", response_model=Health)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        summary="The replica takes hints; `active` says whether it is the one that plans and publishes",
        response_model=Readiness,
        responses={503: {"model": Readiness, "description": "Not ready: the message says why."}},
    )
    def readyz() -> JSONResponse:
        ok, why = ready() if ready is not None else (True, "ok")
        body = {
            "status": "ready" if ok else "not_ready",
            "message": why,
            "active": active() if active else True,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    def metrics() -> Response:
        return Response(render_metrics(), media_type="text/plain; version=0.0.4; charset=utf-8")

    register_status(app, core, auth, settings, sources=status, active=active)
    return app


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app answers on the request's path."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route.methods or set()
    return sorted(methods)


async def _read_limited(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it passes ``limit`` (a chunked body declares no length)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _ApiError(413, f"body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_hint(raw: bytes, source: str) -> Hint:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _ApiError(422, f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _ApiError(422, "body must be a JSON object")
    if "received_at" in data:
        raise _ApiError(422, "received_at: set by the scheduler, not by clients")
    claimed = data.setdefault("source", source)
    if claimed != source:
        raise _ApiError(403, f"this token is for source {source!r}, not {claimed!r}")
    try:
        return Hint.model_validate(data)
    except ValidationError as exc:
        raise _ApiError(422, _describe(exc.errors())) from None


def _describe(errors: Any) -> str:
    parts = []
    for err in list(errors)[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"
