"""Late data through real processes: a spooled, out-of-order stream, malformed messages, SIGKILLs.

The scenario of issue 13: gateways ship logs through a spooling agent, so 120,000 records arrive with
event times spread over 20 minutes in no order at all, about 5% of them malformed, while the consumer
(``prewarm ingest run``, as in production) is SIGKILLed five times. With the default settings about
half of the valid events are more than ``lateness_s`` behind their partition's watermark; every one of
them must still land in its own minute, exactly once.

Its time goes to starting six consumer processes, not to the records: on a shared two-core machine a
quarter of the stream took as long as the whole (130-180 s per database either way).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pytest
from ingest_helpers import (
    NOW_MS,
    PacedProducer,
    cli_env,
    committed,
    consume_to_the_end,
    dead_letters,
    event,
    make_topic,
    sigkill_after_commits,
)

from ingest import DemandStore, ingest_stats, minute_of
from prewarm import IngestSettings, KafkaSettings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

RECORDS = 120_000
MALFORMED_SHARE = 0.05
SPREAD_MS = 20 * 60_000
MODELS = 8

Truth = Counter[tuple[str, int]]


def _malformed(i: int, future_ms: int) -> tuple[bytes, str]:
    """The ``i``-th malformed message (each one's bytes unique, so its dead letter can be found) and
    the reason the consumer must give."""
    kinds: list[tuple[bytes, str]] = [
        (b"not json %d" % i, "not_json"),
        (b"\xff\xfe\xfa %d" % i, "not_utf8"),
        (b'{"v":1,"ts":"yesterday %d","model":"m"}' % i, "wrong_type"),
        (b'{"v":1,"model":"m-%d"}' % i, "missing_field"),
        (event(future_ms + i, "model-0"), "future"),
        (b"[%d]" % i, "not_object"),
        (b'{"v":7,"ts":%d,"model":"m"}' % i, "unsupported_version"),
    ]
    return kinds[i % len(kinds)]


def spooled_stream(
    seed: int,
) -> tuple[list[tuple[bytes | None, bytes]], Truth, Truth, dict[bytes, str]]:
    """The records in the order they are sent, the truth of requests and of cold starts per
    (model, minute), and each malformed message's expected dead-letter reason."""
    rng = random.Random(seed)
    start = NOW_MS - 25 * 60_000  # the newest event is 5 minutes old: nothing valid is "future"
    future_ms = NOW_MS + 3_600_000
    requests: Truth = Counter()
    cold: Truth = Counter()
    malformed: dict[bytes, str] = {}
    records: list[tuple[bytes | None, bytes]] = []
    for i in range(RECORDS):
        if rng.random() < MALFORMED_SHARE:
            value, reason = _malformed(len(malformed), future_ms)
            malformed[value] = reason
            records.append((b"spool-%d" % rng.randrange(16), value))
            continue
        model = f"model-{rng.randrange(MODELS)}"
        ts = start + rng.randrange(SPREAD_MS)
        extra = {"served_from": "L2", "wait_ms": 250.0} if i % 11 == 0 else {}
        records.append((model.encode(), event(ts, model, **extra)))
        requests[(model, minute_of(ts))] += 1
        if extra:
            cold[(model, minute_of(ts))] += 1
    rng.shuffle(records)  # a spooling agent's backlog: no order between or within the minutes
    return records, requests, cold, malformed


def test_out_of_order_late_stream_with_kills_counts_every_event_in_its_minute_exactly_once(
    store_url: str, store: DemandStore, kafka_settings: KafkaSettings, unique: str, tmp_path: Path
) -> None:
    make_topic(kafka_settings, partitions=3)
    ingest = IngestSettings(
        consumer_group=f"late-kill-{unique}",
        batch_max_events=1000,
        batch_max_s=0.3,
        ingest_max_poll_records=500,  # batches of ~1,000 records: many commits for the kills to land among
        ingest_session_timeout_s=6,
    )
    assert (ingest.lateness_s, ingest.max_lateness_s) == (600.0, 86_400.0)  # the defaults, as shipped
    group = ingest.consumer_group
    records, requests, cold, malformed = spooled_stream(seed=13)
    valid = sum(requests.values())
    env = cli_env(kafka_settings, ingest, store_url)
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))

    producer = PacedProducer(kafka_settings, records, seconds=20)
    sigkill_after_commits(env, tmp_path / "consumer.log", store, group, RECORDS, kills=5, rng=rng)
    producer.finish()
    consume_to_the_end(env, tmp_path / "final.log", store, group, RECORDS)

    # Every valid event in its own minute, once: requests and cold starts per (model, minute).
    rows = list(store.minutes())
    assert Counter({(m, minute): n for m, minute, n, _, _ in rows}) == requests
    assert +Counter({(m, minute): c for m, minute, _, c, _ in rows}) == cold
    counters = store.counters(group)
    assert counters["records"] == RECORDS
    assert counters["events"] == valid
    # Zero dropped: about half came later than lateness_s and were counted all the same.
    assert counters.get("too_late", 0) == 0
    assert counters["late_counted"] > 0.3 * valid
    # Every malformed message dead-lettered: counted once in the store, present in the topic.
    dead = Counter(
        {
            name.removeprefix("dead_lettered:"): n
            for name, n in counters.items()
            if name.startswith("dead_lettered:")
        }
    )
    assert dead == Counter(malformed.values())
    letters = {letter.source: letter for letter in dead_letters(kafka_settings, len(malformed))}
    assert len(letters) == len(malformed)  # a kill may re-send a letter; it keeps its source
    assert {letter.value: letter.reason for letter in letters.values()} == malformed

    stats = ingest_stats(store, kafka_settings, group, kafka_settings.topic_requests)
    assert set(stats.lag.values()) == {0}
    assert sum(stats.committed_offsets.values()) == RECORDS
    assert (stats.too_late, stats.late_counted) == (0, counters["late_counted"])
    assert committed(store, group) == RECORDS
