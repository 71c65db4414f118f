"""Record handling without a broker: no input stops the consumer; replay pacing."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest import MinuteAggregator, WindowPolicy, replay_frame
from ingest._consumer import count_records

Record = namedtuple("Record", "topic partition offset key value headers")
NOW = 1_800_000_000.0

values = st.one_of(
    st.none(),
    st.binary(max_size=300),
    st.builds(
        lambda t, m: b'{"v":1,"ts":%d,"model":"%s"}' % (t, m.encode()),
        st.integers(0, 2 * 10**12),
        st.text(max_size=8),
    ),
    st.sampled_from(
        [b"{}", b"null", b"[]", b'{"v":1,"ts":1e400,"model":"m"}', b'{"v":1,"ts":true,"model":"m"}']
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(values, max_size=40))
def test_no_record_can_stop_the_consumer(raw: list[bytes | None]) -> None:
    records = [Record("t", 0, i, None, v, []) for i, v in enumerate(raw)]
    agg = MinuteAggregator(WindowPolicy(lateness_s=60, future_tolerance_s=300, max_lateness_s=600))
    dead: list[tuple[Any, str]] = []
    count_records(records, agg, None, NOW, lambda record, reason, detail: dead.append((record, reason)))
    assert agg.counted + agg.too_late + len(dead) == len(records)
    assert all(reason for _, reason in dead)
    assert sum(c.requests for c in agg.cells.values()) == agg.counted


def test_dead_letters_carry_the_schema_reason() -> None:
    raw = [None, b"nope", b'{"v":1,"ts":1,"model":"m"}', b'{"v":1,"ts":99999999999999,"model":"m"}']
    records = [Record("t", 0, i, None, v, []) for i, v in enumerate(raw)]
    agg = MinuteAggregator(WindowPolicy())
    reasons: list[str] = []
    count_records(records, agg, None, NOW, lambda _r, reason, _d: reasons.append(reason))
    assert reasons == ["no_value", "not_json", "future"]
    assert agg.counted == 1


def test_a_too_late_event_is_counted_as_too_late_and_never_dead_lettered() -> None:
    newest = 1_700_000_000_000
    raw = [b'{"v":1,"ts":%d,"model":"m"}' % ts for ts in (newest, newest - 7_200_000, newest - 1_800_000)]
    records = [Record("t", 0, i, None, v, []) for i, v in enumerate(raw)]
    agg = MinuteAggregator(WindowPolicy(lateness_s=600, max_lateness_s=3600))
    dead: list[str] = []
    watermark = count_records(records, agg, None, NOW, lambda _r, reason, _d: dead.append(reason))
    assert dead == []
    assert (agg.counted, agg.late, agg.too_late) == (2, 1, 1)
    assert watermark == newest


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes | None]] = []

    def send_raw(self, value: bytes, key: bytes | None = None) -> None:
        self.sent.append((value, key))

    def flush(self) -> None:
        pass


def test_replay_paces_event_time_at_the_speedup_and_keeps_timestamps() -> None:
    frame = pd.DataFrame({"timestamp": [1000.0 + i for i in range(256)], "model": ["a", "b"] * 128})
    clock = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    producer = FakeProducer()
    result = replay_frame(frame, producer, speedup=10.0, clock=lambda: clock[0], sleep=sleep)  # type: ignore[arg-type]
    assert result.events == 256
    # 255 s of event time at 10x: the last paced event (index 192) is due 19.2 s in.
    assert abs(clock[0] - 19.2) < 1e-6
    assert producer.sent[0] == (b'{"v":1,"ts":1000000,"model":"a"}', b"a")
    assert producer.sent[1][1] == b"b"


def test_replay_without_speedup_never_sleeps() -> None:
    frame = pd.DataFrame({"timestamp": [0.0, 3600.0], "model": ["a", "a"]})
    producer = FakeProducer()
    result = replay_frame(frame, producer, speedup=0, sleep=lambda s: (_ for _ in ()).throw(AssertionError))  # type: ignore[arg-type]
    assert result.events == 2
