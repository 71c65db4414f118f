"""Serving an ASGI app from a background thread, on a given or an ephemeral port."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

__all__ = ["BackgroundServer"]


class BackgroundServer:
    """uvicorn in a daemon thread; ``port`` is the bound one (useful with port 0)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="prewarm-api", daemon=True)
        self.host = host
        self.port = port

    def start(self, timeout: float = 10.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        sockets = [s for server in self._server.servers for s in server.sockets]
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
