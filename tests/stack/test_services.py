"""The local stack (deploy/local/) serves what the rest of the suite relies on, over real connections."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

REPO = Path(__file__).resolve().parents[2]


def _s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def test_message_round_trips_through_kafka_and_the_group_offset_is_committed(
    kafka_bootstrap: str, unique: str
) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = f"stack-test-{unique}"
    group = f"stack-test-{unique}"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        # The topic does not exist yet: the broker creates it on first use (auto.create.topics.enable).
        sent = producer.send(topic, key=b"model-a", value=b"hello " + unique.encode()).get(timeout=60)
    finally:
        producer.close()

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        received: list[Any] = []
        deadline = time.monotonic() + 60
        while not received and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                received.extend(records)
        assert [(r.key, r.value) for r in received] == [(b"model-a", b"hello " + unique.encode())]
        consumer.commit()
        partition = TopicPartition(topic, sent.partition)
        assert consumer.committed(partition) == sent.offset + 1
        # num.partitions=4 on the broker: auto-created topics get four partitions.
        assert consumer.partitions_for_topic(topic) == {0, 1, 2, 3}
    finally:
        consumer.close()

    # A fresh consumer of the same group reads the committed offset back from the broker.
    reader = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
    try:
        assert reader.committed(TopicPartition(topic, sent.partition)) == sent.offset + 1
    finally:
        reader.close()


def test_object_is_put_listed_range_read_and_deleted_through_s3(
    s3_endpoint: str, s3_bucket: str, unique: str
) -> None:
    s3 = _s3_client(s3_endpoint)
    key = f"stack-test/{unique}/blob.bin"
    body = os.urandom(256 * 1024)

    s3.put_object(Bucket=s3_bucket, Key=key, Body=body)

    listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix=f"stack-test/{unique}/")
    assert [(o["Key"], o["Size"]) for o in listed["Contents"]] == [(key, len(body))]

    part = s3.get_object(Bucket=s3_bucket, Key=key, Range="bytes=1000-1999")
    assert part["ContentRange"] == f"bytes 1000-1999/{len(body)}"
    assert part["Body"].read() == body[1000:2000]

    s3.delete_object(Bucket=s3_bucket, Key=key)
    assert s3.list_objects_v2(Bucket=s3_bucket, Prefix=f"stack-test/{unique}/").get("KeyCount") == 0
    with pytest.raises(ClientError) as missing:
        s3.head_object(Bucket=s3_bucket, Key=key)
    assert missing.value.response["Error"]["Code"] in {"404", "NoSuchKey"}


def test_rows_written_through_sqlalchemy_are_read_back_from_postgres(postgres_url: str, unique: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url)
    table = f"stack_test_{unique}"
    try:
        with engine.begin() as conn:
            assert conn.execute(sa.text("SELECT current_database()")).scalar_one() == "prewarm"
            conn.execute(sa.text(f"CREATE TABLE {table} (model text PRIMARY KEY, hits bigint NOT NULL)"))
            conn.execute(
                sa.text(f"INSERT INTO {table} (model, hits) VALUES (:model, :hits)"),
                [{"model": "llama-3-8b", "hits": 3}, {"model": "mistral-7b", "hits": 5}],
            )
        # A second connection sees the committed rows: they went through the server, not a session cache.
        with engine.connect() as conn:
            rows = conn.execute(sa.text(f"SELECT model, hits FROM {table} ORDER BY model")).all()
        assert [tuple(r) for r in rows] == [("llama-3-8b", 3), ("mistral-7b", 5)]
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


def test_mlflow_run_stores_its_artifact_in_the_s3_bucket(
    mlflow_uri: str, s3_endpoint: str, unique: str, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment_id = client.create_experiment(f"stack-test-{unique}")
    run = client.create_run(experiment_id)
    run_id = run.info.run_id
    text = f"forecast notes {unique}\n"
    client.log_param(run_id, "family", "seasonal-naive")
    client.log_metric(run_id, "mae", 1.25)
    client.log_text(run_id, text, "notes/readme.txt")
    client.set_terminated(run_id)

    finished = client.get_run(run_id)
    assert finished.data.params == {"family": "seasonal-naive"}
    assert finished.data.metrics == {"mae": 1.25}
    downloaded = client.download_artifacts(run_id, "notes/readme.txt", str(tmp_path))
    assert Path(downloaded).read_text() == text

    # The server proxies artifacts into the S3 server: the bytes are in its bucket under the run's id.
    bucket = os.environ.get("STACK_MLFLOW_BUCKET", "prewarm-mlflow")
    s3 = _s3_client(s3_endpoint)
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="artifacts/")
        for o in page.get("Contents", [])
        if o["Key"].endswith(f"/{run_id}/artifacts/notes/readme.txt")
    ]
    assert len(keys) == 1
    assert s3.get_object(Bucket=bucket, Key=keys[0])["Body"].read() == text.encode()


def _run_pytest_on(test_file: Path, ci: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["CI"] = ci
    # Port 1: nothing listens there, so the fixture finds the service unreachable.
    env["PREWARM_KAFKA_BOOTSTRAP"] = "127.0.0.1:1"
    # The generated file lives outside tests/, so the project's conftest is loaded as a plugin.
    plugins = ["-p", "tests.conftest", "-p", "no:cacheprovider"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, "-q", str(test_file)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_unreachable_service_fails_the_test_under_ci_and_skips_it_elsewhere(tmp_path: Path) -> None:
    test_file = tmp_path / "test_needs_kafka.py"
    test_file.write_text(
        textwrap.dedent(
            """
            def test_needs_kafka(kafka_bootstrap):
                pass
            """
        )
    )

    under_ci = _run_pytest_on(test_file, ci="true")
    assert under_ci.returncode == 1, under_ci.stdout + under_ci.stderr
    assert "required service unavailable" in under_ci.stdout
    # pytest reports a failure inside a fixture as an error; either way the run is red, never skipped.
    assert re.search(r"^1 (failed|error)\b", under_ci.stdout.splitlines()[-1]), under_ci.stdout

    on_a_laptop = _run_pytest_on(test_file, ci="")
    assert on_a_laptop.returncode == 0, on_a_laptop.stdout + on_a_laptop.stderr
    assert "1 skipped" in on_a_laptop.stdout
