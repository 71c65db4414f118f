"""The command line: trace replay and synthetic load land exactly, export, stats, and the benchmark."""

from __future__ import annotations

import csv
import json
import subprocess
import threading
from pathlib import Path

import pandas as pd
import pytest
from ingest_helpers import REPO, cli_env, make_topic, prewarm_cmd
from typer.testing import CliRunner

from ingest import DemandStore, IngestConsumer, OffsetUpdate, azure2019_minute_counts, generate
from prewarm import IngestSettings, KafkaSettings
from prewarm_cli import app


def consume_all(store: DemandStore, kafka: KafkaSettings, ingest: IngestSettings, records: int) -> None:
    stop = threading.Event()
    timer = threading.Timer(90, stop.set)
    timer.start()
    try:
        summary = IngestConsumer(store, kafka, ingest).run(stop, max_records=records)
    finally:
        timer.cancel()
    assert summary.records == records


def invoke(env: dict[str, str], *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_azure_2019_sample_replays_into_the_store_with_the_files_counts(
    azure_samples: Path,
    store_url: str,
    store: DemandStore,
    kafka_settings: KafkaSettings,
    ingest_settings: IngestSettings,
    tmp_path: Path,
) -> None:
    azure = azure_samples / "invocations.csv"
    make_topic(kafka_settings, partitions=2)
    env = cli_env(kafka_settings, ingest_settings, store_url)
    subprocess.run(
        prewarm_cmd("produce", "trace", str(azure), "--format", "azure2019"),
        env=env,
        cwd=REPO,
        check=True,
        timeout=120,
    )
    expected = azure2019_minute_counts(azure)
    total = int(expected.to_numpy().sum())
    consume_all(store, kafka_settings, ingest_settings, total)

    start, end = int(expected.index[0]), int(expected.index[-1]) + 60
    got = store.bulk(list(expected.columns), start, end)
    pd.testing.assert_frame_equal(got, expected, check_names=False, check_dtype=False)
    assert store.models_seen() == sorted(expected.columns)

    out = tmp_path / "demand.csv"
    invoke(env, "ingest", "export", "--csv", str(out))
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["model", "minute", "requests", "cold_starts"]
    assert sum(int(r["requests"]) for r in rows) == total
    assert all(int(r["minute"]) % 60 == 0 for r in rows)
    later = tmp_path / "later.csv"
    invoke(env, "ingest", "export", "--since", str(start + 720 * 60), "--csv", str(later))
    with later.open() as handle:
        assert all(int(r["minute"]) >= start + 720 * 60 for r in csv.DictReader(handle))

    stats = json.loads(invoke(env, "ingest", "stats", "--json"))
    assert stats["events"] == total
    assert stats["dead_lettered"] == {}
    assert set(stats["lag"].values()) == {0}
    assert set(stats["last_event"]) == set(expected.columns)


def test_produce_synthetic_lands_with_the_generators_counts(
    tmp_path: Path, kafka_settings: KafkaSettings, ingest_settings: IngestSettings
) -> None:
    make_topic(kafka_settings, partitions=2)
    url = f"sqlite:///{tmp_path / 'demand.db'}"
    env = cli_env(kafka_settings, ingest_settings, url)
    start = 1_700_000_040  # a minute boundary, long enough ago never to be "future"
    invoke(
        env, "produce", "synthetic", "--models", "4", "--days", "0.05", "--start", str(start), "--seed", "3"
    )
    trace = generate(4, 0.05, seed=3, start=start)
    with DemandStore(url) as store:
        consume_all(store, kafka_settings, ingest_settings, len(trace.events))
        expected = trace.minute_frame()
        got = store.bulk(trace.models, start, start + 60 * trace.minutes)
    pd.testing.assert_frame_equal(got, expected, check_names=False, check_dtype=False)


def test_produce_synthetic_can_name_its_models_after_the_catalog(
    tmp_path: Path, kafka_settings: KafkaSettings, ingest_settings: IngestSettings
) -> None:
    from models import synth_catalog

    catalog = synth_catalog(tmp_path / "weights", [100_000, 100_000])
    make_topic(kafka_settings, partitions=1)
    url = f"sqlite:///{tmp_path / 'demand.db'}"
    env = cli_env(kafka_settings, ingest_settings, url) | {
        "PREWARM_CATALOG": str(tmp_path / "weights/catalog.yaml")
    }
    start = 1_700_000_040
    args = ["--models", "3", "--days", "0.05", "--start", str(start), "--seed", "3", "--catalog-ids"]
    invoke(env, "produce", "synthetic", *args)
    trace = generate(3, 0.05, seed=3, start=start)
    with DemandStore(url) as store:
        consume_all(store, kafka_settings, ingest_settings, len(trace.events))
        seen = store.models_seen()
    # The first two synthetic models take the catalog's ids; the third keeps its own name.
    names = dict(zip(trace.models, [*catalog.ids(), trace.models[2]], strict=True))
    assert seen == sorted({names[m] for m in trace.events["model"].astype(str)})
    assert "demo-00" in seen


def test_stats_text_output_names_the_group_and_partitions(
    tmp_path: Path, kafka_settings: KafkaSettings, ingest_settings: IngestSettings
) -> None:
    make_topic(kafka_settings, partitions=1)
    env = cli_env(kafka_settings, ingest_settings, f"sqlite:///{tmp_path / 'demand.db'}")
    text = invoke(env, "ingest", "stats")
    assert f"group {ingest_settings.consumer_group}" in text
    assert "partition 0: lag 0" in text


@pytest.mark.slow
def test_benchmark_reports_the_documented_keys(tmp_path: Path, kafka_bootstrap: str) -> None:
    out = tmp_path / "bench.json"
    env = {"PREWARM_KAFKA_BOOTSTRAP": kafka_bootstrap}
    invoke(env, "bench", "ingest", "--events", "3000", "--json", str(out))
    result = json.loads(out.read_text())
    assert {"events", "seconds", "events_per_s", "bare_consumer_events_per_s"} <= set(result)
    assert result["events"] == 3000
    assert result["details"]["exact"] is True


def test_stats_without_a_broker_still_reports_the_store(tmp_path: Path, unique: str) -> None:
    """Degrade, don't die: the counts come from the store; only the lag needs the broker."""
    url = f"sqlite:///{tmp_path / 'demand.db'}"
    with DemandStore(url) as store:
        store.commit_batch(
            f"g-{unique}",
            {},
            {},
            [OffsetUpdate("t", 0, None, 5, None)],
            {"events": 5, "records": 6, "dead_lettered:not_json": 1},
        )
    env = {
        "PREWARM_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        "PREWARM_DATABASE_URL": url,
        "PREWARM_TOPIC_REQUESTS": "t",
        "PREWARM_CONSUMER_GROUP": f"g-{unique}",
    }
    stats = json.loads(invoke(env, "ingest", "stats", "--json"))
    assert stats["events"] == 5
    assert stats["dead_lettered"] == {"not_json": 1}
    assert stats["lag"] == {"0": None}
    assert "lag_error" in stats
