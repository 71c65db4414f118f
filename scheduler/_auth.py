"""Who may post hints, who may read the plan, and how often: bearer tokens, roles, token buckets.

Three kinds of token, each ``name:token`` (the name is the hint source, or the reader, in logs):

* a hint writer's full token (``hint_tokens``) posts hints for its source and reads;
* a publishable token (``publishable_tokens``), which a browser may hold, posts hints for its source,
  for listed models if a list is given, and reads nothing: a page's visitor must not learn the plan;
* a read token (``read_tokens``), for dashboards and operators, reads and posts nothing.

Pure and clock-injected. Tokens are compared with ``hmac.compare_digest`` against every configured token
(no early exit), so response time says nothing about how much of a token was right. Token values never
appear in a ``repr``, an exception message or a log line.
"""

from __future__ import annotations

import enum
import hmac
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

from prewarm import DEMAND_SOURCE, ConfigError, Forbidden, Unauthorized

__all__ = ["Authenticator", "Principal", "RateLimiter", "Role", "parse_token_spec"]


class Role(enum.StrEnum):
    WRITER = "writer"  # a hint writer's full token: posts hints for its source, reads
    PUBLISHABLE = "publishable"  # held by browsers: posts hints (for its models if listed), never reads
    READER = "reader"  # reads the plan, the hints and the models; posts nothing


_SETTING = {
    Role.WRITER: "PREWARM_HINT_TOKENS",
    Role.PUBLISHABLE: "PREWARM_PUBLISHABLE_TOKENS",
    Role.READER: "PREWARM_READ_TOKENS",
}


@dataclass(frozen=True)
class Principal:
    """The caller a token stands for: a hint source (writer, publishable) or a reader."""

    source: str
    role: Role = Role.WRITER
    models: frozenset[str] | None = None

    @property
    def publishable(self) -> bool:
        return self.role is Role.PUBLISHABLE

    @property
    def may_read(self) -> bool:
        return self.role is not Role.PUBLISHABLE

    @property
    def may_post(self) -> bool:
        return self.role is not Role.READER

    def may_hint(self, model: str) -> bool:
        return self.may_post and (self.models is None or model in self.models)


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


def parse_token_spec(spec: str, role: Role = Role.WRITER) -> list[_Credential]:
    """``name:token,...`` (publishable: ``source:token[:model|model...]``), or ``@file`` holding that."""
    setting = _SETTING[role]
    publishable = role is Role.PUBLISHABLE
    credentials: list[_Credential] = []
    for index, entry in enumerate(e.strip() for e in _read_spec(spec, setting).split(",")):
        if not entry:
            continue
        parts = entry.split(":")
        limit = 3 if publishable else 2
        if len(parts) < 2 or len(parts) > limit or not parts[0] or not parts[1]:
            form = "source:token[:model|model...]" if publishable else "name:token"
            # The entry itself may hold a token: name its position, never its text.
            raise ConfigError(f"{setting} entry {index + 1} is not {form}", setting=setting)
        if parts[0] == DEMAND_SOURCE and role is not Role.READER:
            # Hints from this source pre-empt every prefetch; only the scheduler itself may send them.
            raise ConfigError(
                f"{setting} entry {index + 1}: source {parts[0]!r} is reserved", setting=setting
            )
        models = None
        if publishable and len(parts) == 3 and parts[2]:
            models = frozenset(m for m in parts[2].split("|") if m)
        principal = Principal(source=parts[0], role=role, models=models)
        credentials.append(_Credential(principal=principal, token=parts[1].encode()))
    return credentials


class Authenticator:
    """Maps ``Authorization: Bearer <token>`` to a ``Principal``."""

    def __init__(self, hint_tokens: str = "", publishable_tokens: str = "", read_tokens: str = "") -> None:
        self._credentials = [
            *parse_token_spec(hint_tokens, Role.WRITER),
            *parse_token_spec(publishable_tokens, Role.PUBLISHABLE),
            *parse_token_spec(read_tokens, Role.READER),
        ]
        seen: dict[bytes, Principal] = {}
        for credential in self._credentials:
            other = seen.setdefault(credential.token, credential.principal)
            if other != credential.principal:
                # One token, two callers: which role it has would depend on the order of the settings.
                raise ConfigError(
                    f"{credential.principal.role} token of {credential.principal.source!r} is also the "
                    f"{other.role} token of {other.source!r}: give each its own",
                    setting=_SETTING[credential.principal.role],
                )

    def __repr__(self) -> str:
        return f"Authenticator({len(self._credentials)} tokens)"

    @property
    def configured(self) -> bool:
        return bool(self._credentials)

    def first_token(self) -> str | None:
        """The first full (non-publishable) token, for the benchmark client on the same host."""
        full = [c for c in self._credentials if c.principal.role is Role.WRITER]
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

    def reader(self, authorization: str | None) -> Principal:
        """The caller behind ``authorization`` if it may read the plan, hints and models."""
        principal = self.authenticate(authorization)
        if not principal.may_read:
            raise Forbidden("a publishable token may only post hints; reads need a read or hint token")
        return principal

    def writer(self, authorization: str | None) -> Principal:
        """The caller behind ``authorization`` if it may post hints (for which models: ``may_hint``)."""
        principal = self.authenticate(authorization)
        if not principal.may_post:
            raise Forbidden("a read token may not post hints")
        return principal


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
