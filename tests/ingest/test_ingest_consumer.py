"""The consumer against the real broker, on both databases: exact counts, dead letters, late events."""

from __future__ import annotations

import random
import threading
from collections import Counter

from ingest_helpers import NOW_MS, dead_letters, event, good_events, make_topic, produce, stored
from metrics_helpers import metric_delta, sample

from ingest import DemandStore, IngestConsumer, IngestSummary
from prewarm import EVENT_MAX_BYTES, IngestSettings, KafkaSettings


def consume(
    store: DemandStore, kafka: KafkaSettings, ingest: IngestSettings, records: int, timeout_s: float = 60.0
) -> IngestSummary:
    """Run one consumer until ``records`` records are committed (or fail after ``timeout_s``)."""
    stop = threading.Event()
    timer = threading.Timer(timeout_s, stop.set)
    timer.start()
    try:
        summary = IngestConsumer(store, kafka, ingest).run(stop, max_records=records)
    finally:
        timer.cancel()
    assert summary.records >= records, f"timed out: {summary.records} of {records} records committed"
    return summary


def test_events_are_counted_exactly_per_model_and_minute(
    store: DemandStore, kafka_settings: KafkaSettings, ingest_settings: IngestSettings
) -> None:
    make_topic(kafka_settings, partitions=3)
    events, truth = good_events(600)
    produce(kafka_settings, events)
    with metric_delta("prewarm_ingest_events_total") as counted:
        summary = consume(store, kafka_settings, ingest_settings, len(events))
    assert summary.events == 600
    assert counted.delta == 600
    # The lag gauge is labelled with this test's own topic: its value is this consumer's alone.
    lag = sample("prewarm_ingest_lag_records", {"topic": kafka_settings.topic_requests, "partition": "0"})
    assert lag == 0
    assert stored(store) == truth
    assert store.counters(ingest_settings.consumer_group)["events"] == 600
    cold = sum(c for _, _, _, c, _ in store.minutes())
    assert cold == len(range(0, 600, 7))
    assert (
        sum(
            o.next_offset
            for o in store.load_offsets(
                ingest_settings.consumer_group, kafka_settings.topic_requests
            ).values()
        )
        == 600
    )


def test_a_restarted_consumer_resumes_from_the_offsets_in_the_store(
    store: DemandStore, kafka_settings: KafkaSettings, ingest_settings: IngestSettings
) -> None:
    make_topic(kafka_settings, partitions=2)
    first, truth1 = good_events(200, seed=2)
    produce(kafka_settings, first)
    consume(store, kafka_settings, ingest_settings, 200)
    second, truth2 = good_events(150, seed=3, start=NOW_MS - 500_000, span=400_000)
    produce(kafka_settings, second)
    summary = consume(store, kafka_settings, ingest_settings, 150)
    assert summary.records == 150  # nothing of the first run read again
    assert stored(store) == truth1 + truth2


def test_malformed_event_goes_to_dead_letter_topic(
    store: DemandStore, kafka_settings: KafkaSettings, ingest_settings: IngestSettings
) -> None:
    """10% bad messages of every kind: each is a dead letter with its reason and source; the rest count."""
    make_topic(kafka_settings, partitions=2)
    good, truth = good_events(270, seed=4)
    future_ms = NOW_MS + 3_600_000
    bad: list[tuple[bytes | None, bytes, str]] = [
        (b"k", b"this is not json", "not_json"),
        (b"k", b"\xff\xfe\xfa not utf-8", "not_utf8"),
        (b"k", b'{"v":1,"ts":"yesterday","model":"m"}', "wrong_type"),
        (b"k", b'{"v":1,"ts":1700000000000,"model":42}', "wrong_type"),
        (b"k", b'{"v":1,"model":"m"}', "missing_field"),
        (b"k", b'{"v":1,"ts":1700000000000}', "missing_field"),
        (b"k", b'{"v":1,"ts":1,"model":"m","pad":"' + b"x" * EVENT_MAX_BYTES + b'"}', "oversized"),
        (b"k", event(future_ms, "model-0"), "future"),
        (b"k", b"[1,2,3]", "not_object"),
        (b"k", b'{"v":7,"ts":1,"model":"m"}', "unsupported_version"),
    ] * 3
    mixed: list[tuple[bytes | None, bytes]] = [(k, v) for k, v in good]
    rng = random.Random(5)
    for key, value, _ in bad:
        mixed.insert(rng.randrange(len(mixed) + 1), (key, value))
    produce(kafka_settings, mixed)

    summary = consume(store, kafka_settings, ingest_settings, len(mixed))

    assert stored(store) == truth
    expected = Counter(reason for _, _, reason in bad)
    assert summary.dead_lettered == expected
    letters = dead_letters(kafka_settings, len(bad))
    unique = {letter.source: letter for letter in letters}  # at-least-once: duplicates share a source
    assert Counter(letter.reason for letter in unique.values()) == expected
    by_value = {value: reason for _, value, reason in bad}
    for letter in unique.values():
        assert letter.topic == kafka_settings.topic_requests
        assert letter.partition in (0, 1)
        assert letter.offset >= 0
        assert by_value[letter.value] == letter.reason  # the original bytes, unchanged
        assert letter.detail
    counters = store.counters(ingest_settings.consumer_group)
    assert counters["dead_lettered:oversized"] == 3
    assert counters["events"] == 270


def test_late_events_are_counted_into_their_own_minute_and_only_beyond_the_bound_refused(
    store: DemandStore, kafka_settings: KafkaSettings, unique: str
) -> None:
    make_topic(kafka_settings, partitions=1)
    ingest = IngestSettings(
        consumer_group=f"late-{unique}",
        lateness_s=300,
        max_lateness_s=7200,
        batch_max_events=2,
        batch_max_s=0.2,
    )
    base = NOW_MS - 4 * 3_600_000
    newest = base + 3 * 3_600_000
    values = [
        (b"m", event(base, "m")),
        (b"m", event(newest, "m")),  # the watermark moves three hours on
        (b"m", event(newest - 299_000, "m")),  # 299 s behind: on time
        (b"m", event(newest - 301_000, "m")),  # 301 s behind: late, counted
        (b"m", event(newest - 7_000_000, "m")),  # nearly two hours behind: late, counted
        (b"m", event(newest - 7_300_000, "m")),  # beyond the bound: too late
        (b"m", event(base + 60_000, "m")),  # three hours behind: too late
    ]
    produce(kafka_settings, values)
    with (
        metric_delta("prewarm_ingest_lateness_seconds_count", {"outcome": "counted"}) as late,
        metric_delta("prewarm_ingest_lateness_seconds_count", {"outcome": "too_late"}) as refused,
        metric_delta("prewarm_ingest_lateness_seconds_sum", {"outcome": "counted"}) as late_s,
        metric_delta("prewarm_ingest_too_late_total") as too_late_total,
        metric_delta("prewarm_ingest_dead_letters_total") as dead,
    ):
        summary = consume(store, kafka_settings, ingest, len(values))
    assert (summary.events, summary.late_counted, summary.too_late) == (5, 2, 2)
    assert summary.dead_lettered == Counter()
    expected: Counter[tuple[str, int]] = Counter(
        ("m", (ts // 60_000) * 60)
        for ts in (base, newest, newest - 299_000, newest - 301_000, newest - 7_000_000)
    )
    assert stored(store) == expected
    counters = store.counters(ingest.consumer_group)
    assert (counters["late_counted"], counters["too_late"], counters["records"]) == (2, 2, 7)
    assert "dead_lettered:future" not in counters
    assert (late.delta, refused.delta, too_late_total.delta, dead.delta) == (2, 2, 2, 0)
    assert late_s.delta == 301 + 7000
