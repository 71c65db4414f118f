"""The consumer's msgspec decoder never accepts what the schema refuses, and reads the same fields."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest._decode import fast_fields, parse_fields
from prewarm import InvalidEvent, parse_request_event

text = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300),
)
number = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.just(0),
    st.just(1.5),
    st.just(1e400),
)
anything = st.one_of(st.none(), st.booleans(), number, text, st.lists(st.integers(), max_size=2))
model = st.one_of(
    st.sampled_from(["llama-8b", "org/model.v2", "a", "a..b", "/x", "x/", "-x", "A_b-c.d/e"]),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,20}(/[A-Za-z0-9._\-]{0,10})?", fullmatch=True),
    st.text(alphabet="ab./-_", min_size=0, max_size=140),
)
FIELDS = ("version", "tenant", "gateway", "status", "latency_ms", "served_from", "wait_ms")


VALID = {
    "version": st.one_of(st.text(max_size=130), st.text(alphabet="abc-.1", max_size=130)),
    "tenant": st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=260),
    "gateway": st.text(max_size=10),
    "status": st.one_of(st.integers(min_value=-(10**19), max_value=10**19), st.text(max_size=5)),
    "latency_ms": st.one_of(st.floats(min_value=0, max_value=1e6), st.integers(min_value=0, max_value=10**6)),
    "served_from": st.sampled_from(["L0", "L1", "L2", "L3"]),
    "wait_ms": st.one_of(st.floats(min_value=0, max_value=1e6), st.just(0), st.integers(0, 10**17)),
}


def valid_or_not(draw: Any, valid: Any) -> Any:
    # Mostly valid values, so the fast path is exercised, with a mutation now and then.
    return draw(valid) if draw(st.integers(0, 9)) else draw(anything)


@st.composite
def events(draw: Any) -> bytes:
    doc: dict[str, Any] = {"v": valid_or_not(draw, st.just(1))}
    doc["ts"] = valid_or_not(draw, st.integers(min_value=0, max_value=10**17))
    doc["model"] = valid_or_not(draw, model)
    for name in FIELDS:
        if draw(st.booleans()):
            doc[name] = valid_or_not(draw, VALID[name])
    if not draw(st.integers(0, 9)):
        keys = list(doc)
        doc = {k: doc[k] for k in draw(st.permutations(keys))}
    compact = draw(st.integers(0, 9)) > 0
    return json.dumps(doc, separators=(",", ":") if compact else None).encode()


@settings(max_examples=1500, deadline=None)
@given(events())
def test_fast_path_only_accepts_valid_events_and_agrees_with_the_schema(raw: bytes) -> None:
    fast = fast_fields(raw)
    if fast is None:
        return
    event = parse_request_event(raw)  # must not raise
    assert fast == (event.model, event.ts, event.cold_start, event.wait_ms or 0.0)


def test_canonical_producer_encoding_takes_the_fast_path() -> None:
    raw = b'{"v":1,"ts":1700000000000,"model":"org/m-1","tenant":"t","status":200,"served_from":"L2"}'
    assert fast_fields(raw) == ("org/m-1", 1700000000000, True, 0.0)
    assert fast_fields(b'{"v":1,"ts":5,"model":"m","wait_ms":12.5}') == ("m", 5, True, 12.5)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "not_json"),
        (b'{"v":1,"ts":1,"model":"a..b"}', "wrong_type"),
        (b'{"v":2,"ts":1,"model":"m"}', "unsupported_version"),
        (b'{"v":1,"model":"m"}', "missing_field"),
        (b"[1]", "not_object"),
        (b"\xff\xfe", "not_utf8"),
        (b'{"v":1,"ts":1,"model":"m","tenant":"\\ud800"}', "not_json"),  # a lone surrogate
    ],
)
def test_whatever_the_fast_path_declines_the_schema_judges(raw: bytes, reason: str) -> None:
    assert fast_fields(raw) is None
    with pytest.raises(InvalidEvent) as info:
        parse_fields(raw)
    assert info.value.reason == reason


def test_events_with_whitespace_or_other_key_orders_take_the_fast_path() -> None:
    # The regex this decoder replaced took only the producers' exact byte layout.
    assert fast_fields(b'{"v": 1, "ts": 60000, "model": "m"}') == ("m", 60000, False, 0.0)
    assert fast_fields(b'{"served_from":"L1","model":"m","ts":7}') == ("m", 7, True, 0.0)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"v":1,"ts":1.5,"model":"m"}',  # the schema truncates a float ts
        b'{"v":1,"ts":"2024-01-01T00:00:00Z","model":"m"}',  # and reads RFC 3339
    ],
)
def test_what_only_the_schema_reads_still_counts_through_it(raw: bytes) -> None:
    event = parse_request_event(raw)
    assert parse_fields(raw) == (event.model, event.ts, event.cold_start, event.wait_ms or 0.0)


def test_a_duplicate_key_reads_as_the_schema_reads_it() -> None:
    raw = b'{"v":1,"ts":1,"model":"a","model":"b"}'
    event = parse_request_event(raw)
    assert parse_fields(raw)[0] == event.model
