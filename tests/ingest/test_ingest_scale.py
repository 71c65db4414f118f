"""Ingest scaled by partitions: several consumer processes in one group count a 4-partition topic
exactly, and the group benchmark reports a rate per consumer count."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ingest_helpers import (
    PacedProducer,
    cli_env,
    committed,
    good_events,
    make_topic,
    spawn_consumer,
    stop_gracefully,
    stored,
    truth_from_log,
)
from wait_helpers import wait_for

from ingest import DemandStore, run_group_bench
from prewarm import IngestSettings, KafkaSettings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_three_consumer_processes_on_four_partitions_share_them_and_count_exactly(
    store_url: str, store: DemandStore, kafka_settings: KafkaSettings, unique: str, tmp_path: Path
) -> None:
    make_topic(kafka_settings, partitions=4)
    ingest = IngestSettings(
        consumer_group=f"scale-{unique}", batch_max_events=100, batch_max_s=0.2, ingest_session_timeout_s=6
    )
    group = ingest.consumer_group
    env = cli_env(kafka_settings, ingest, store_url)
    logs = [tmp_path / f"consumer-{i}.log" for i in range(3)]
    procs = [spawn_consumer(env, log) for log in logs]

    def owns_partitions(log: Path) -> bool:
        return re.search(r"partitions assigned  partitions=\[\d", log.read_text()) is not None

    # Every process a member with partitions of its own before the stream starts.
    wait_for(lambda: all(log.exists() and owns_partitions(log) for log in logs), 120, "three owners")
    events, _ = good_events(6000, models=12, seed=21)
    producer = PacedProducer(kafka_settings, events, seconds=8)
    producer.finish()
    wait_for(lambda: committed(store, group) >= len(events), 120, "every event committed")
    for proc in procs:
        stop_gracefully(proc)

    assert committed(store, group) == len(events)
    assert store.counters(group)["events"] == len(events)
    assert stored(store) == truth_from_log(kafka_settings, len(events))
    assert sorted(store.load_offsets(group, kafka_settings.topic_requests)) == [0, 1, 2, 3]


def test_group_bench_reports_each_consumer_count_with_exact_counts(
    kafka_settings: KafkaSettings, ingest_settings: IngestSettings
) -> None:
    result = run_group_bench(
        kafka_settings, ingest_settings, events=4000, partitions=4, consumers=(1, 2), compression="zstd"
    )
    assert [r["consumers"] for r in result["runs"]] == [1, 2]
    assert result["exact"] is True
    for run in result["runs"]:
        assert run["events_per_s"] > 0
        assert run["cpu_seconds"] > 0
        assert sum(run["per_consumer_records"]) == 4000
    assert len(result["runs"][1]["per_consumer_records"]) == 2
