"""``prewarm_client.vllm_sleep`` against a local HTTP stand-in for vLLM's sleep-mode endpoints.

This is a protocol client test: the stand-in implements the three endpoints as vLLM's
``vllm/entrypoints/serve/sleep/api_router.py`` defines them (``POST /sleep?level=N`` → 200 with an empty
body, ``POST /wake_up[?tags=...]`` → 200, ``GET /is_sleeping`` → ``{"is_sleeping": bool}``) and
records what it was sent. It proves what goes over the wire and how answers are read, not what a real
engine does with its memory (that needs vLLM on a GPU).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from prewarm_client.vllm_sleep import SleepModeError, SleepModeUnavailable, VllmSleepClient


class _StandIn(ThreadingHTTPServer):
    def __init__(self, *, dev_mode: bool = True) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.dev_mode = dev_mode
        self.sleeping = 0  # the level, 0 = awake
        self.calls: list[tuple[str, str, dict[str, list[str]], str | None]] = []


class _Handler(BaseHTTPRequestHandler):
    server: _StandIn

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _answer(self, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        if data:
            self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        self.server.calls.append((method, url.path, query, self.headers.get("Authorization")))
        if not self.server.dev_mode:  # vLLM attaches the router only in dev mode
            self._answer(404, {"detail": "Not Found"})
        elif (method, url.path) == ("POST", "/sleep"):
            self.server.sleeping = int(query.get("level", ["1"])[0])
            self._answer(200)
        elif (method, url.path) == ("POST", "/wake_up"):
            self.server.sleeping = 0
            self._answer(200)
        elif (method, url.path) == ("GET", "/is_sleeping"):
            self._answer(200, {"is_sleeping": self.server.sleeping > 0})
        else:
            self._answer(405 if url.path in ("/sleep", "/wake_up", "/is_sleeping") else 404)

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._route("POST")


def _serve(dev_mode: bool = True) -> Iterator[_StandIn]:
    server = _StandIn(dev_mode=dev_mode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def vllm() -> Iterator[_StandIn]:
    yield from _serve()


def _url(server: _StandIn) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_sleep_and_wake_move_the_engine_between_l1_and_l0_over_the_three_endpoints(vllm: _StandIn) -> None:
    engine = VllmSleepClient(_url(vllm), api_key="s3cret")

    assert engine.is_sleeping() is False
    engine.sleep(level=1)
    assert engine.is_sleeping() is True
    engine.wake_up(tags=["weights"])
    assert engine.is_sleeping() is False

    assert [(m, p, q) for m, p, q, _auth in vllm.calls] == [
        ("GET", "/is_sleeping", {}),
        ("POST", "/sleep", {"level": ["1"]}),
        ("GET", "/is_sleeping", {}),
        ("POST", "/wake_up", {"tags": ["weights"]}),
        ("GET", "/is_sleeping", {}),
    ]
    assert {auth for *_rest, auth in vllm.calls} == {"Bearer s3cret"}


def test_wake_up_without_tags_wakes_everything_and_level_two_is_sent_as_asked(vllm: _StandIn) -> None:
    engine = VllmSleepClient(_url(vllm))
    engine.sleep(level=2)
    assert vllm.sleeping == 2
    engine.wake_up()
    assert vllm.calls[-1][:3] == ("POST", "/wake_up", {})
    assert vllm.calls[-1][3] is None  # no key, no header
    with pytest.raises(ValueError, match="level"):
        engine.sleep(level=3)


def test_a_server_without_the_sleep_mode_api_says_how_to_enable_it() -> None:
    for server in _serve(dev_mode=False):
        with pytest.raises(SleepModeUnavailable, match="VLLM_SERVER_DEV_MODE=1"):
            VllmSleepClient(_url(server)).sleep()


def test_an_unreachable_engine_is_a_sleep_mode_error() -> None:
    for server in _serve():
        url = _url(server)
    with pytest.raises(SleepModeError, match="is_sleeping"):
        VllmSleepClient(url, timeout_s=2).is_sleeping()
    with pytest.raises(ValueError, match="base_url"):
        VllmSleepClient("127.0.0.1:8000")
