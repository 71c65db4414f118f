"""Event decoding: msgspec's schema-validating C decoder first, the pydantic schema as the authority.

Per record, the consumer needs four fields of a request event. ``parse_request_event`` (pydantic)
builds a whole ``RequestEvent`` in ~4 µs; msgspec decodes the same bytes straight into a small struct
with the same types and bounds in ~1.7 µs, and ~2 µs with the model id check, where the hand-written
regular expression that this module replaced took ~5 µs and covered only the exact byte layout of
our own producers (docs/benchmarks.md, "event decoding").

The msgspec struct is deliberately *no wider* than the schema: ``ts`` must be a JSON integer (the
schema also takes floats and RFC 3339 strings), ``v`` exactly 1, string bounds and number bounds as
the schema's, model ids checked by the same ``validate_model_id``. Whatever msgspec declines, valid
or not, falls through to ``parse_request_event``, which decides, and which alone names the reason of
a dead letter. So the fast path can only ever accept what the schema accepts (checked with Hypothesis
in ``tests/ingest/test_ingest_decode.py``), and it never rejects anything by itself.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from prewarm import EVENT_MAX_BYTES, MAX_MODEL_ID_LENGTH, parse_request_event, validate_model_id

__all__ = ["Fields", "fast_fields", "parse_fields", "schema_fields"]

# (model, ts epoch ms, cold start, wait ms)
Fields = tuple[str, int, bool, float]

_NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class _Event(msgspec.Struct, forbid_unknown_fields=False):
    """``prewarm.RequestEvent`` as msgspec reads it: same fields, same bounds, unknown keys ignored."""

    ts: int
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_MODEL_ID_LENGTH)]
    v: Literal[1] = 1
    version: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    tenant: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    gateway: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    status: int | str | None = None
    latency_ms: _NonNegative | None = None
    served_from: Literal["L0", "L1", "L2", "L3"] | None = None
    wait_ms: _NonNegative | None = None


class _Ids:
    """Model ids already validated: each distinct id pays for the check once (bounded)."""

    def __init__(self, limit: int = 100_000) -> None:
        self.valid: set[str] = set()
        self.limit = limit

    def ok(self, model: str) -> bool:
        try:
            validate_model_id(model)
        except ValueError:
            return False
        if len(self.valid) < self.limit:
            self.valid.add(model)
        return True


_IDS = _Ids()
_DECODE = msgspec.json.Decoder(_Event).decode


def fast_fields(raw: bytes, _decode: Any = _DECODE, _known: set[str] = _IDS.valid) -> Fields | None:
    """The counted fields of an event msgspec accepts, or None when the full schema must decide."""
    if len(raw) > EVENT_MAX_BYTES:
        return None
    try:
        event = _decode(raw)
    except msgspec.DecodeError:  # invalid JSON, or a ValidationError (its subclass)
        return None
    model = event.model
    if model not in _known and not _IDS.ok(model):
        return None
    served = event.served_from
    wait = event.wait_ms
    if wait is None:
        return model, event.ts, served is not None and served != "L0", 0.0
    return model, event.ts, (served is not None and served != "L0") or wait > 0.0, float(wait)


def parse_fields(raw: bytes) -> Fields:
    """What the window needs of one message; raises ``InvalidEvent`` exactly as the schema does."""
    return fast_fields(raw) or schema_fields(raw)


def schema_fields(raw: bytes) -> Fields:
    """The same through the full schema only: for a message ``fast_fields`` has already turned down."""
    event = parse_request_event(raw)
    return event.model, event.ts, event.cold_start, event.wait_ms or 0.0
