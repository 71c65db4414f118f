"""Fixtures of the ingest tests: a demand store on both databases, per-test topics, helpers.

``store_url`` is parametrized over a SQLite file and PostgreSQL; each PostgreSQL test gets a schema of
its own (selected through the connection's ``search_path``), so tests never see each other's rows and a
consumer subprocess given the same URL writes where the test reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ingest import DemandStore
from prewarm import IngestSettings, KafkaSettings


def _pg_schema_url(base: str, schema: str) -> str:
    url = make_url(base)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'demand.db'}"
        return
    base: str = request.getfixturevalue("postgres_url")
    schema = f"ingest_{unique}"
    admin_url = make_url(_pg_schema_url(base, "public"))
    engine = sa.create_engine(admin_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield _pg_schema_url(base, schema)
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        engine.dispose()


@pytest.fixture
def store(store_url: str) -> Iterator[DemandStore]:
    with DemandStore(store_url) as s:
        yield s


@pytest.fixture
def kafka_settings(kafka_bootstrap: str, unique: str) -> KafkaSettings:
    return KafkaSettings(
        kafka_bootstrap=kafka_bootstrap,
        topic_requests=f"test-requests-{unique}",
        topic_dlq=f"test-requests-{unique}.dlq",
        kafka_client_id=f"test-{unique}",
    )


@pytest.fixture
def ingest_settings(unique: str) -> IngestSettings:
    return IngestSettings(consumer_group=f"test-group-{unique}", batch_max_events=200, batch_max_s=0.3)
