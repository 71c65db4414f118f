"""A group's standing: lag from committed and log-end offsets, counters from the store, no broker needed."""

from __future__ import annotations

from ingest import DemandStore, OffsetUpdate, StoredOffset, consumer_lag, ingest_stats
from prewarm import KafkaSettings


def test_lag_is_the_records_past_the_committed_offset() -> None:
    committed = {0: StoredOffset(next_offset=40, watermark_ms=None), 1: StoredOffset(10, None)}
    assert consumer_lag(committed, {0: 100, 1: 10}) == {0: 60, 1: 0}


def test_a_partition_never_committed_lags_by_its_whole_log() -> None:
    assert consumer_lag({}, {0: 7, 2: 0}) == {0: 7, 2: 0}


def test_a_log_end_behind_the_committed_offset_is_no_lag_rather_than_negative() -> None:
    assert consumer_lag({0: StoredOffset(50, None)}, {0: 20}) == {0: 0}


def test_stats_without_a_broker_report_the_store_and_why_the_lag_is_unknown(
    store: DemandStore, unique: str
) -> None:
    group = f"g-{unique}"
    store.commit_batch(
        group,
        {},
        {},
        [OffsetUpdate("t", 0, None, 5, None), OffsetUpdate("t", 3, None, 2, None)],
        {"events": 5, "records": 7, "late_counted": 2, "too_late": 1, "dead_lettered:not_json": 1},
    )
    stats = ingest_stats(store, KafkaSettings(kafka_bootstrap="127.0.0.1:1"), group, "t", timeout_s=0.5)
    assert (stats.records, stats.events, stats.late_counted, stats.too_late) == (7, 5, 2, 1)
    assert (stats.to_json()["late_counted"], stats.to_json()["too_late"]) == (2, 1)
    assert stats.dead_lettered == {"not_json": 1}
    assert stats.committed_offsets == {0: 5, 3: 2}
    assert stats.lag == {0: None, 3: None}
    assert stats.lag_error
    assert stats.to_json()["lag"] == {"0": None, "3": None}
    assert stats.to_json()["lag_error"] == stats.lag_error


def test_events_dropped_as_late_by_an_older_consumer_are_reported_as_too_late(
    store: DemandStore, unique: str
) -> None:
    """Stores written when late events were dropped keep a ``late_dropped`` counter: the same refusal."""
    group = f"g-{unique}"
    store.commit_batch(
        group, {}, {}, [OffsetUpdate("t", 0, None, 9, None)], {"records": 9, "events": 6, "late_dropped": 3}
    )
    store.commit_batch(group, {}, {}, [OffsetUpdate("t", 0, 9, 10, None)], {"records": 1, "too_late": 1})
    stats = ingest_stats(store, KafkaSettings(kafka_bootstrap="127.0.0.1:1"), group, "t", timeout_s=0.5)
    assert (stats.late_counted, stats.too_late) == (0, 4)
