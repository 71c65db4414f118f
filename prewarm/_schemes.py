"""The URI schemes a catalog may name, in one registry that every package reads.

A catalog entry's ``uri`` says where its weights live (``s3://bucket/key``, ``file:///path``). The
catalog (``models``) validates it, the planner and the simulator read catalogs, and only the executor
ever opens one: so the list of schemes cannot live with the stores, or reading a catalog would need the
executor. It lives here instead. ``s3`` and ``file`` are built in; ``executor.register_store`` adds the
scheme of each store it registers, so a catalog naming that scheme is valid everywhere in the process.
"""

from __future__ import annotations

import re
import threading

from prewarm._exceptions import InvalidInput

__all__ = ["known_schemes", "register_scheme"]

# RFC 3986: a letter, then letters, digits, "+", "-" or "."; compared in lower case, as URIs are.
_SCHEME = re.compile(r"[a-z][a-z0-9+.\-]*")
_lock = threading.Lock()
_schemes: set[str] = {"file", "s3"}


def register_scheme(name: str) -> None:
    """Accept ``name://`` uris in catalogs from now on (idempotent)."""
    if not _SCHEME.fullmatch(name):
        raise InvalidInput(
            f"not a URI scheme: {name!r} (a lower-case letter, then letters, digits, +, - or .)",
            reason="scheme",
        )
    with _lock:
        _schemes.add(name)


def known_schemes() -> tuple[str, ...]:
    """Every scheme a catalog may name, sorted."""
    with _lock:
        return tuple(sorted(_schemes))
