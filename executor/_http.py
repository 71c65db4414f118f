"""The node's local load API, for inference servers on the same machine (FastAPI).

* ``POST /v1/load {"model", "tier"?}`` returns once the model is in ``tier`` (L0 by default; L1 or L2),
  with the tier it came from and the wait;
* ``GET /v1/state`` is what the node holds, as published to the scheduler;
* ``GET /healthz`` is 503 while the node cannot follow its orders; ``GET /metrics`` is Prometheus text.

The API binds to 127.0.0.1 by default. With a token configured (``executor_api_token``) every write
needs ``Authorization: Bearer <token>``; bound to anything but a loopback address it will not start
without one (``check_binding``), since a load moves gigabytes and an unauthenticated one is a
denial of service for the engines on the node.

Errors map to statuses here, at the edge: an unknown model is 404, no room 507, a bad request 422, any
other prewarm error 503 (the caller may retry).
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections.abc import Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from executor import _metrics
from executor._executor import Executor
from prewarm import (
    CapacityError,
    ConfigError,
    InvalidInput,
    ModelId,
    PrewarmError,
    Tier,
    UnknownModel,
    model_label,
)
from prewarm import render_metrics as render

__all__ = ["LoadRequest", "check_binding", "create_app", "is_loopback"]


class LoadRequest(BaseModel):
    model: ModelId
    tier: Literal["L0", "L1", "L2"] = "L0"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_binding(host: str, token: str | None) -> None:
    """Refuse to serve writes to the network without a token (``ConfigError``)."""
    if not token and not is_loopback(host):
        raise ConfigError(
            f"the executor API would listen on {host} without a token: set PREWARM_EXECUTOR_API_TOKEN "
            "or bind it to 127.0.0.1",
            setting="executor_api_token",
        )


def create_app(
    executor: Executor,
    *,
    node: str,
    healthy: Callable[[], bool],
    loaded: Callable[[], None],
    token: str | None = None,
) -> FastAPI:
    """The API over ``executor``. ``healthy`` answers ``/healthz``; ``loaded`` is called after each load
    (the daemon reports its state then); ``token``, when set, is required for every write."""
    app = FastAPI(title=f"prewarm executor {node}", description="Local load API for inference servers.")
    expected = f"Bearer {token}".encode() if token else None

    @app.middleware("http")
    async def authorize(request: Request, call_next: Callable[[Request], Any]) -> Any:
        if expected is not None and request.method not in ("GET", "HEAD", "OPTIONS"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse(
                    {"error": 401, "message": "a bearer token is required for writes"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await call_next(request)

    @app.post("/v1/load", summary="Return once the model is in the tier asked for (L0 by default)")
    async def load(request: LoadRequest) -> JSONResponse:
        started = time.perf_counter()
        tier = Tier(request.tier)
        try:
            result = await run_in_threadpool(executor.ensure, request.model, tier, demand=True)
        except UnknownModel as exc:
            return _error(404, str(exc))
        except CapacityError as exc:
            return _error(507, str(exc))
        except InvalidInput as exc:
            return _error(422, str(exc))
        except PrewarmError as exc:
            return _error(503, str(exc))
        wait = time.perf_counter() - started
        served_from = result.served_from.value
        _metrics.LOAD_WAIT.labels(tier.value, served_from).observe(wait)
        if result.served_from.level > tier.level:  # not already there: the request waited for a copy
            model = model_label(result.model)
            _metrics.COLD_STARTS.labels(model, served_from).inc()
            _metrics.COLD_START_WAIT.labels(model, served_from).inc(wait)
        loaded()
        body = {
            "model": result.model,
            "version": result.version,
            "tier": tier.value,
            "served_from": result.served_from.value,
            "wait_s": round(wait, 6),
            "seconds_per_hop": result.to_json()["seconds_per_hop"],
        }
        return JSONResponse(body)

    @app.get("/v1/state", summary="What this node holds, as published to the scheduler")
    def state() -> dict[str, Any]:
        return executor.state().model_dump(mode="json")

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        ok = healthy()
        return JSONResponse(
            {"status": "ok" if ok else "degraded", "node": node}, status_code=200 if ok else 503
        )

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": status, "message": message}, status_code=status)
