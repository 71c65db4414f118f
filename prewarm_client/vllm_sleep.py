"""vLLM's sleep-mode API: move an already running vLLM engine between L1 and L0 without restarting it.

    engine = VllmSleepClient("http://127.0.0.1:8000")
    engine.sleep(level=1)      # weights to host memory, KV cache dropped: the engine's GPU memory is free
    engine.is_sleeping()       # True
    engine.wake_up()           # weights back on the GPU: serving again (``tags=["weights"]`` for part)

Level 1 is what prewarm calls L1 for a running engine: its weights sit in (the engine's) host memory and
the GPU memory is free for another model; ``wake_up`` brings them back, at the host-to-device link's
rate, with no disk read. Level 2 drops the weights as well (the engine must then be given weights again,
through ``prewarm_client.vllm`` for instance).

The three endpoints (``POST /sleep?level=N``, ``POST /wake_up[?tags=...]``, ``GET /is_sleeping``) exist
only on a server started with ``VLLM_SERVER_DEV_MODE=1`` and ``--enable-sleep-mode``; on any other a
call raises ``SleepModeUnavailable``. This module is a plain HTTP client over the standard library, so
the executor (or an operator's script) can drive an engine without importing vLLM.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from prewarm_client._protocol import HandoffError

__all__ = ["SleepModeError", "SleepModeUnavailable", "VllmSleepClient"]


class SleepModeError(HandoffError):
    """The engine answered a sleep-mode call with an error (or not at all)."""


class SleepModeUnavailable(SleepModeError):
    """The server has no sleep-mode API: not vLLM, or started without ``VLLM_SERVER_DEV_MODE=1``."""


class VllmSleepClient:
    """The sleep-mode endpoints of one vLLM server at ``base_url`` (``http://host:port``).

    ``api_key``: sent as a bearer token, as vLLM's ``--api-key`` asks. ``timeout_s``: per call; a
    sleep or wake of a large model moves all its weights across PCIe and takes seconds.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout_s: float = 300.0) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"base_url must be http(s)://host:port, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout_s = timeout_s

    def sleep(self, level: int = 1) -> None:
        """Put the engine to sleep: level 1 offloads its weights to host memory, level 2 drops them."""
        if level not in (1, 2):
            raise ValueError(f"sleep level is 1 or 2, not {level}")
        self._call("POST", "/sleep", [("level", str(level))])

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Wake the engine: everything, or only the memory ``tags`` names (vLLM's "weights", "kv_cache")."""
        self._call("POST", "/wake_up", [("tags", tag) for tag in tags or ()])

    def is_sleeping(self) -> bool:
        body = self._call("GET", "/is_sleeping", [])
        if not isinstance(body, dict) or not isinstance(body.get("is_sleeping"), bool):
            raise SleepModeError(
                f"{self.base_url}/is_sleeping answered {body!r}, not {{'is_sleeping': bool}}"
            )
        sleeping: bool = body["is_sleeping"]
        return sleeping

    def _call(self, method: str, path: str, query: list[tuple[str, str]]) -> Any:
        url = self.base_url + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
        if self._api_key:
            request.add_header("Authorization", f"Bearer {self._api_key}")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 405):
                raise SleepModeUnavailable(
                    f"{url}: {exc.code}; the server has no sleep-mode API (start vLLM with "
                    "VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode)"
                ) from exc
            raise SleepModeError(f"{method} {url}: HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise SleepModeError(f"{method} {url}: {getattr(exc, 'reason', exc)}") from exc
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data.decode(errors="replace")
