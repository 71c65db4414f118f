"""The node's local load API, for inference servers on the same machine (FastAPI).

* ``POST /v1/load {"model"}`` returns once the model is in L0, with the tier it came from and the wait;
* ``GET /v1/state`` is what the node holds, as published to the scheduler;
* ``GET /healthz`` is 503 while the node cannot follow its orders; ``GET /metrics`` is Prometheus text.

Errors map to statuses here, at the edge: an unknown model is 404, no room 507, a bad request 422, any
other prewarm error 503 (the caller may retry).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from executor._executor import Executor
from prewarm import CapacityError, InvalidInput, ModelId, PrewarmError, Tier, UnknownModel, histogram
from prewarm import render_metrics as render

__all__ = ["LoadRequest", "create_app"]

_LOAD_WAIT = histogram(
    "prewarm_executor_load_wait_seconds",
    "Wait of POST /v1/load until the model was in L0, by the tier it came from.",
    ["served_from"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 180),
)


class LoadRequest(BaseModel):
    model: ModelId


def create_app(
    executor: Executor, *, node: str, healthy: Callable[[], bool], loaded: Callable[[], None]
) -> FastAPI:
    """The API over ``executor``. ``healthy`` answers ``/healthz``; ``loaded`` is called after each load
    (the daemon reports its state then)."""
    app = FastAPI(title=f"prewarm executor {node}", description="Local load API for inference servers.")

    @app.post("/v1/load", summary="Return once the model is in GPU memory (L0)")
    async def load(request: LoadRequest) -> JSONResponse:
        started = time.perf_counter()
        try:
            result = await run_in_threadpool(executor.ensure, request.model, Tier.L0, demand=True)
        except UnknownModel as exc:
            return _error(404, str(exc))
        except CapacityError as exc:
            return _error(507, str(exc))
        except InvalidInput as exc:
            return _error(422, str(exc))
        except PrewarmError as exc:
            return _error(503, str(exc))
        wait = time.perf_counter() - started
        _LOAD_WAIT.labels(result.served_from.value).observe(wait)
        loaded()
        body = {
            "model": result.model,
            "version": result.version,
            "tier": Tier.L0.value,
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
