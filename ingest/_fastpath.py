"""A fast path for the request events gateways actually send, with the pydantic schema as the authority.

kafka-python's own decoding costs ~9 µs per record on this machine, and ``parse_request_event`` adds
~4 µs: too much to stay within 0.7× of a bare poll loop. Almost every event on the wire is the compact,
canonical encoding ``RequestLogProducer`` writes (``{"v":1,"ts":...,"model":"..."}`` then the optional
fields in schema order), so one compiled regular expression recognises it in about a microsecond.

The regex is deliberately *narrower* than the schema: no whitespace, printable ASCII strings without
escapes, plain non-negative numbers without leading zeros, fields in schema order. Anything else,
valid or not, falls through to ``parse_request_event``, which decides, and which alone names the
reason of a dead letter. So the fast path can only ever accept what the schema accepts (checked with
Hypothesis in ``tests/ingest/test_ingest_fastpath.py``), and it never rejects anything by itself.
"""

from __future__ import annotations

import re
from typing import Any

from prewarm import MAX_MODEL_ID_LENGTH, parse_request_event, validate_model_id

__all__ = ["Fields", "parse_fields", "schema_fields"]

# (model, ts epoch ms, cold start, wait ms)
Fields = tuple[str, int, bool, float]

# No whitespace between tokens: allowing it makes the match three times slower, and the producers of
# this package never write any. Events with whitespace are still counted, through the full parser.
_STR = rb'"[\x20\x21\x23-\x5b\x5d-\x7e]{0,%d}"'  # printable ASCII, no quote, no backslash
_NUM = rb"(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,15})?"  # non-negative, JSON-valid, finite
_INT = rb"-?(?:0|[1-9][0-9]{0,17})"


def _optional(name: bytes, value: bytes) -> bytes:
    return rb'(?:,"' + name + rb'":' + value + rb")?"


_PATTERN = (
    rb'\A\{"v":1,"ts":(0|[1-9][0-9]{0,15}),"model":"([A-Za-z0-9][A-Za-z0-9_./-]{0,%d})"'
    % (MAX_MODEL_ID_LENGTH - 1)
    + _optional(b"version", _STR % 128)
    + _optional(b"tenant", _STR % 256)
    + _optional(b"gateway", _STR % 256)
    + _optional(b"status", rb"(?:" + _INT + rb"|" + _STR % 256 + rb")")
    + _optional(b"latency_ms", _NUM)
    + _optional(b"served_from", rb'"(L[0-3])"')
    + _optional(b"wait_ms", rb"(" + _NUM + rb")")
    + rb"\}\Z"
)
_CANONICAL = re.compile(_PATTERN)


class _Ids:
    """Model ids already validated, by their bytes: each distinct id pays for validation once."""

    def __init__(self, limit: int = 100_000) -> None:
        self.valid: dict[bytes, str] = {}
        self.limit = limit

    def get(self, raw: bytes) -> str | None:
        model = self.valid.get(raw)
        if model is not None:
            return model
        model = raw.decode("ascii")
        try:
            validate_model_id(model)
        except ValueError:
            return None
        if len(self.valid) < self.limit:
            self.valid[raw] = model
        return model


_IDS = _Ids()


def fast_fields(raw: bytes, _match: Any = _CANONICAL.match, _ids: Any = _IDS.valid.get) -> Fields | None:
    """The counted fields of a canonical event, or None when the full parser must decide."""
    match = _match(raw)
    if match is None:
        return None
    ts, model_b, served, wait_b = match.groups()
    model = _ids(model_b) or _IDS.get(model_b)
    if model is None:
        return None
    if wait_b is None:
        return model, int(ts), served is not None and served != b"L0", 0.0
    wait = float(wait_b)
    return model, int(ts), (served is not None and served != b"L0") or wait > 0.0, wait


def parse_fields(raw: bytes) -> Fields:
    """What the window needs of one message; raises ``InvalidEvent`` exactly as the schema does."""
    return fast_fields(raw) or schema_fields(raw)


def schema_fields(raw: bytes) -> Fields:
    """The same through the full schema only: for a message ``fast_fields`` has already turned down."""
    event = parse_request_event(raw)
    return event.model, event.ts, event.cold_start, event.wait_ms or 0.0
