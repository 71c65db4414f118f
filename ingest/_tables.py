"""The demand store's tables (SQLAlchemy Core), shared by the store and its retention upkeep.

``demand_minute`` is declared range-partitioned by ``minute`` for PostgreSQL (``_retention.py`` says
how its day partitions are made and dropped); SQLite ignores that and keeps one plain table.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["demand_hour", "demand_minute", "demand_model", "ingest_counter", "ingest_offset", "metadata"]

metadata = sa.MetaData()
demand_minute = sa.Table(
    "demand_minute",
    metadata,
    sa.Column("model", sa.String(128), primary_key=True),
    sa.Column("minute", sa.BigInteger, primary_key=True, doc="epoch seconds of the minute start"),
    sa.Column("requests", sa.BigInteger, nullable=False),
    sa.Column("cold_starts", sa.BigInteger, nullable=False),
    sa.Column("wait_ms", sa.Float, nullable=False),
    postgresql_partition_by="RANGE (minute)",
)
# Counts older than the minute table's retention window, one row per (model, hour).
demand_hour = sa.Table(
    "demand_hour",
    metadata,
    sa.Column("model", sa.String(128), primary_key=True),
    sa.Column("hour", sa.BigInteger, primary_key=True, doc="epoch seconds of the hour start"),
    sa.Column("requests", sa.BigInteger, nullable=False),
    sa.Column("cold_starts", sa.BigInteger, nullable=False),
    sa.Column("wait_ms", sa.Float, nullable=False),
)
demand_model = sa.Table(
    "demand_model",
    metadata,
    sa.Column("model", sa.String(128), primary_key=True),
    sa.Column("first_ms", sa.BigInteger, nullable=False),
    sa.Column("last_ms", sa.BigInteger, nullable=False),
)
ingest_offset = sa.Table(
    "ingest_offset",
    metadata,
    sa.Column("group_id", sa.String(255), primary_key=True),
    sa.Column("topic", sa.String(255), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("next_offset", sa.BigInteger, nullable=False),
    sa.Column("watermark_ms", sa.BigInteger, nullable=True),
    sa.Column("updated_at", sa.Float, nullable=False),
)
ingest_counter = sa.Table(
    "ingest_counter",
    metadata,
    sa.Column("group_id", sa.String(255), primary_key=True),
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)
