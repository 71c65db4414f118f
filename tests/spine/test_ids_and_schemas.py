from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from prewarm import (
    EVENT_MAX_BYTES,
    Hint,
    InvalidEvent,
    Order,
    Tier,
    parse_request_event,
    validate_model_id,
)


@pytest.mark.parametrize("good", ["llama-3-8b", "meta-llama/Llama-3.1-8B", "a", "m_1.v2"])
def test_model_ids_for_paths_and_keys_are_accepted(good: str) -> None:
    assert validate_model_id(good) == good


@pytest.mark.parametrize(
    "bad", ["", "../etc", "/abs", "a/../b", "a//b", ".hidden", "a b", "x" * 129, "trailing/", "a\\b"]
)
def test_unsafe_model_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="model id"):
        validate_model_id(bad)


@given(st.text(max_size=200))
def test_no_accepted_id_can_escape_a_directory(text: str) -> None:
    try:
        validate_model_id(text)
    except ValueError:
        return
    assert not text.startswith("/")
    assert ".." not in text
    assert all(part and part[0].isalnum() for part in text.split("/"))


def test_event_accepts_epoch_ms_and_rfc3339() -> None:
    a = parse_request_event(b'{"ts": 1700000000000, "model": "m"}')
    b = parse_request_event(b'{"ts": "2023-11-14T22:13:20Z", "model": "m", "extra": 1}')
    assert a.ts == b.ts == 1_700_000_000_000


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "not_json"),
        (b"\xff\xfe{}", "not_utf8"),
        (b'{"ts": 1}', "missing_field"),
        (b'{"ts": "yesterday", "model": "m"}', "wrong_type"),
        (b'{"ts": 1, "model": "../x"}', "wrong_type"),
        (b"[1, 2]", "not_object"),
        (b'{"v": 2, "ts": 1, "model": "m"}', "unsupported_version"),
        (b'{"ts": 1, "model": "m", "pad": "' + b"x" * EVENT_MAX_BYTES + b'"}', "oversized"),
    ],
)
def test_malformed_events_are_rejected_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        parse_request_event(raw)
    assert info.value.reason == reason


def test_cold_start_is_a_request_not_served_from_gpu_memory() -> None:
    assert parse_request_event(b'{"ts": 1, "model": "m", "served_from": "L2"}').cold_start
    assert not parse_request_event(b'{"ts": 1, "model": "m", "served_from": "L0"}').cold_start


def test_hint_rejects_unknown_fields_and_out_of_range_values() -> None:
    with pytest.raises(ValidationError):
        Hint.model_validate({"model": "m", "confidence": 1.5})
    with pytest.raises(ValidationError):
        Hint.model_validate({"model": "m", "surprise": True})


def test_order_round_trips_as_json_and_refuses_unknown_versions() -> None:
    order = Order(
        id="o1",
        node="n1",
        model="m",
        version="1",
        action="prefetch",
        tier=Tier.L1,
        reason="hint",
        not_before=1.0,
        deadline=2.0,
        created_at=0.5,
    )
    assert Order.model_validate_json(order.model_dump_json()) == order
    data = json.loads(order.model_dump_json()) | {"v": 9}
    with pytest.raises(ValidationError):
        Order.model_validate(data)


def test_tiers_step_one_level() -> None:
    assert Tier.L0.farther() is Tier.L1
    assert Tier.L2.closer() is Tier.L1
    assert Tier.L3.farther() is Tier.L3
