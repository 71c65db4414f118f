"""Who may post hints, and how often: bearer tokens per source, publishable tokens, token buckets.

Pure and clock-injected. Tokens are compared with ``hmac.compare_digest`` against every configured token
(no early exit), so response time says nothing about how much of a token was right. Token values never
appear in a ``repr``, an exception message or a log line.
"""

from __future__ import annotations

import hmac
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

from prewarm import DEMAND_SOURCE, ConfigError, Forbidden, Unauthorized

__all__ = ["Authenticator", "Principal", "RateLimiter", "parse_token_spec"]


@dataclass(frozen=True)
class Principal:
    """The caller a token stands for. A publishable token may only post hints, for ``models`` if set."""

    source: str
    publishable: bool = False
    models: frozenset[str] | None = None

    def may_hint(self, model: str) -> bool:
        return self.models is None or model in self.models


@dataclass(frozen=True)
class _Credential:
    principal: Principal
    token: bytes = field(repr=False)


def _read_spec(spec: str, setting: str) -> str:
    """``@/path`` reads the file (one entry per line or comma-separated; ``#`` comments)."""
    if not spec.startswith("@"):
        return spec
    path = Path(spec[1:])
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror}", setting=setting) from exc
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return ",".join(line for line in lines if line)


def parse_token_spec(
    spec: str, *, publishable: bool = False, setting: str = "PREWARM_HINT_TOKENS"
) -> list[_Credential]:
    """``source:token,...`` (publishable: ``source:token[:model|model...]``), or ``@file`` holding that."""
    credentials: list[_Credential] = []
    for index, entry in enumerate(e.strip() for e in _read_spec(spec, setting).split(",")):
        if not entry:
            continue
        parts = entry.split(":")
        limit = 3 if publishable else 2
        if len(parts) < 2 or len(parts) > limit or not parts[0] or not parts[1]:
            form = "source:token[:model|model...]" if publishable else "source:token"
            # The entry itself may hold a token: name its position, never its text.
            raise ConfigError(f"{setting} entry {index + 1} is not {form}", setting=setting)
        if parts[0] == DEMAND_SOURCE:
            # Hints from this source pre-empt every prefetch; only the scheduler itself may send them.
            raise ConfigError(
                f"{setting} entry {index + 1}: source {parts[0]!r} is reserved", setting=setting
            )
        models = None
        if publishable and len(parts) == 3 and parts[2]:
            models = frozenset(m for m in parts[2].split("|") if m)
        principal = Principal(source=parts[0], publishable=publishable, models=models)
        credentials.append(_Credential(principal=principal, token=parts[1].encode()))
    return credentials


class Authenticator:
    """Maps ``Authorization: Bearer <token>`` to a ``Principal``."""

    def __init__(self, hint_tokens: str = "", publishable_tokens: str = "") -> None:
        self._credentials = parse_token_spec(hint_tokens) + parse_token_spec(
            publishable_tokens, publishable=True, setting="PREWARM_PUBLISHABLE_TOKENS"
        )

    def __repr__(self) -> str:
        return f"Authenticator({len(self._credentials)} tokens)"

    @property
    def configured(self) -> bool:
        return bool(self._credentials)

    def first_token(self) -> str | None:
        """The first full (non-publishable) token, for the benchmark client on the same host."""
        full = [c for c in self._credentials if not c.principal.publishable]
        return full[0].token.decode() if full else None

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthorized("a bearer token is required: Authorization: Bearer <token>")
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        given = presented.strip().encode()
        match: Principal | None = None
        for credential in self._credentials:
            # Compare against every token, whatever matched before: constant work per request.
            if hmac.compare_digest(given, credential.token) and match is None:
                match = credential.principal
        if match is None:
            raise Forbidden("the token is not valid")
        return match


class RateLimiter:
    """A token bucket per source: ``rate`` hints per second, bursts of ``burst``."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def acquire(self, source: str, now: float) -> float:
        """0.0 if a hint from ``source`` may pass now, else the seconds until one may."""
        with self._lock:
            tokens, last = self._buckets.get(source, (self.burst, now))
            tokens = min(self.burst, tokens + max(now - last, 0.0) * self.rate)
            if tokens >= 1.0:
                self._buckets[source] = (tokens - 1.0, now)
                return 0.0
            self._buckets[source] = (tokens, now)
            return (1.0 - tokens) / self.rate if self.rate > 0 else math.inf
