"""Keeping the demand store bounded: minute counts for a retention window, hourly counts before it.

- ``demand_minute`` holds the counts of the last ``minute_retention_days`` (default 35: the
  forecaster's 28-day training span and a week to spare). On PostgreSQL it is range-partitioned by
  ``minute``, one partition per UTC day, named ``demand_minute_YYYYMMDD``; partitions are created
  ahead of time by ``maintain`` and on demand by the writer for any day a batch touches (a late event,
  a backfill), so an insert never finds no partition.
- ``demand_hour`` holds (model, hour) counts of everything older.

The rollup (``roll_up``) moves every minute row older than the cutoff (a UTC midnight, so hours and
partitions never straddle it) into ``demand_hour`` and removes those rows, in *one* transaction:
``DELETE`` on SQLite, ``DROP TABLE`` of whole partitions on PostgreSQL (no dead tuples, no vacuum).
It *adds* to the hourly rows, and after it no minute row older than the cutoff is left, so running it
twice changes nothing, and a minute written for an old day later (a backfill) is added by the next run.

PostgreSQL writers hold a shared advisory lock for their transaction, the rollup the exclusive one:
a rollup waits for the batches in flight, and no batch can write into a partition between the
rollup's read of it and its drop (that row would be lost). SQLite's one writer at a time does the same.

Readers see both tables as one per-minute history: ``spread_hours`` spreads each hour's count over its
60 minutes as evenly as integers allow (minute ``k`` of an hour of ``n`` gets
``(k+1)·n//60 − k·n//60``), so any sum over whole hours is exact and nothing is counted twice: a
count lives in exactly one of the tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from ._tables import demand_hour, demand_minute

__all__ = [
    "DAY_S",
    "HOUR_S",
    "ROLLUP_LOCK",
    "RollupResult",
    "create_partitions",
    "day_of",
    "is_partitioned",
    "migrate_to_partitions",
    "partition_days",
    "partition_name",
    "roll_up",
    "rollup_cutoff",
    "spread_hours",
]

DAY_S = 86_400
HOUR_S = 3_600
# pg_advisory_xact_lock key shared by writers (shared mode) and the rollup (exclusive): b"prew".
ROLLUP_LOCK = 0x70726577
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PREFIX = "demand_minute_"


@dataclass(frozen=True, slots=True)
class RollupResult:
    cutoff: int  # epoch seconds: minute rows before it are now hourly
    minute_rows: int  # minute rows rolled up (and removed)
    hour_rows: int  # hourly rows inserted or added to
    partitions_dropped: int  # PostgreSQL: whole day partitions dropped
    partitions_created: int  # PostgreSQL: partitions created ahead

    def to_json(self) -> dict[str, int]:
        return {
            "cutoff": self.cutoff,
            "minute_rows": self.minute_rows,
            "hour_rows": self.hour_rows,
            "partitions_dropped": self.partitions_dropped,
            "partitions_created": self.partitions_created,
        }


def day_of(minute: int) -> int:
    """Index of the UTC day holding ``minute`` (epoch seconds), counted from 1970-01-01."""
    return minute // DAY_S


def rollup_cutoff(now: float, retention_s: float) -> int:
    """The UTC midnight at or before ``now - retention_s``: minute rows before it are rolled up."""
    return int((now - retention_s) // DAY_S) * DAY_S


def partition_name(day: int) -> str:
    return _PREFIX + (_EPOCH + timedelta(days=day)).strftime("%Y%m%d")


def _day_of_name(name: str) -> int | None:
    stamp = name.removeprefix(_PREFIX)
    if stamp == name or len(stamp) != 8 or not stamp.isdigit():
        return None
    parsed = datetime.strptime(stamp, "%Y%m%d").replace(tzinfo=UTC)
    return (parsed - _EPOCH).days


def is_partitioned(conn: Connection) -> bool:
    """Whether ``demand_minute`` (as the search path finds it) is a partitioned table (PostgreSQL)."""
    kind = conn.execute(
        sa.text("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass('demand_minute')")
    ).scalar()
    return kind in ("p", b"p")


def partition_days(conn: Connection) -> set[int]:
    """The days that have a partition of ``demand_minute``."""
    rows = conn.execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass('demand_minute')"
        )
    ).all()
    days = {_day_of_name(str(name)) for (name,) in rows}
    return {d for d in days if d is not None}


def create_partitions(conn: Connection, days: set[int]) -> int:
    """Create the missing partitions for ``days``; returns how many were created."""
    existing = partition_days(conn)
    missing = sorted(days - existing)
    for day in missing:
        conn.exec_driver_sql(
            f'CREATE TABLE IF NOT EXISTS "{partition_name(day)}" PARTITION OF demand_minute '
            f"FOR VALUES FROM ({day * DAY_S}) TO ({(day + 1) * DAY_S})"
        )
    return len(missing)


def spread_hours(
    hours: npt.NDArray[np.int64], counts: npt.NDArray[np.int64], first: int, stop: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Hourly rows as minute rows: (row index, minute, requests) for the minutes in ``[first, stop)``.

    Each hour's count is spread over its 60 minutes as evenly as integers allow; minutes that get
    nothing are left out.
    """
    k = np.arange(60, dtype=np.int64)
    n = counts.astype(np.int64)[:, None]
    per = ((k + 1) * n) // 60 - (k * n) // 60
    minute = hours.astype(np.int64)[:, None] + 60 * k
    keep = (minute >= first) & (minute < stop) & (per > 0)
    rows = np.nonzero(keep)[0]
    return rows, minute[keep], per[keep]


def _hour_floor(minute: sa.ColumnElement[int]) -> sa.ColumnElement[int]:
    # Floor, not truncation: SQL's % keeps the sign of a negative minute.
    return minute - (((minute % HOUR_S) + HOUR_S) % HOUR_S)


def roll_up(conn: Connection, dialect: str, cutoff: int, *, partitioned: bool) -> RollupResult:
    """Add the minute rows before ``cutoff`` (a UTC midnight) into ``demand_hour`` and remove them.

    Runs inside the caller's transaction, which must be the only writer (``ROLLUP_LOCK`` held
    exclusively on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite): all of it commits, or none.
    """
    if cutoff % DAY_S:
        raise ValueError(f"cutoff {cutoff} is not a UTC midnight")
    m = demand_minute.c
    old = m.minute < cutoff
    counted = sa.select(sa.func.count()).select_from(demand_minute).where(old)
    minute_rows = int(conn.execute(counted).scalar_one())
    hour_rows = 0
    if minute_rows:
        hour = _hour_floor(m.minute).label("hour")
        grouped = (
            sa.select(
                m.model,
                hour,
                sa.func.sum(m.requests),
                sa.func.sum(m.cold_starts),
                sa.func.sum(m.wait_ms),
            )
            .where(old)
            .group_by(m.model, hour)
        )
        insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(demand_hour)
        stmt = insert.from_select(["model", "hour", "requests", "cold_starts", "wait_ms"], grouped)
        h = demand_hour.c
        stmt = stmt.on_conflict_do_update(
            index_elements=[h.model, h.hour],
            set_={
                "requests": h.requests + stmt.excluded.requests,
                "cold_starts": h.cold_starts + stmt.excluded.cold_starts,
                "wait_ms": h.wait_ms + stmt.excluded.wait_ms,
            },
        )
        # The hourly rows written: one per group (psycopg reports no rowcount for INSERT ... SELECT).
        hour_rows = int(conn.execute(sa.select(sa.func.count()).select_from(grouped.subquery())).scalar_one())
        conn.execute(stmt)
    dropped = 0
    if partitioned:
        # Partitions are whole UTC days and the cutoff is a midnight: every old row is in one of these.
        for day in sorted(d for d in partition_days(conn) if (d + 1) * DAY_S <= cutoff):
            conn.exec_driver_sql(f'DROP TABLE "{partition_name(day)}"')
            dropped += 1
    elif minute_rows:
        conn.execute(sa.delete(demand_minute).where(old))
    return RollupResult(cutoff, minute_rows, hour_rows, dropped, 0)


def migrate_to_partitions(conn: Connection) -> int:
    """Turn a plain PostgreSQL ``demand_minute`` (a store from before partitioning) into the
    partitioned table, rows included; returns the rows moved. Inside the caller's transaction."""
    if is_partitioned(conn):
        return 0
    legacy = "demand_minute_unpartitioned"
    conn.exec_driver_sql(f"ALTER TABLE demand_minute RENAME TO {legacy}")
    # The primary key's index keeps its name; the new table's key needs it.
    conn.exec_driver_sql(f"ALTER TABLE {legacy} RENAME CONSTRAINT demand_minute_pkey TO {legacy}_pkey")
    demand_minute.create(conn)
    days = conn.exec_driver_sql(f"SELECT DISTINCT floor(minute::numeric / {DAY_S})::bigint FROM {legacy}")
    create_partitions(conn, {int(d) for (d,) in days})
    moved = conn.exec_driver_sql(
        f"INSERT INTO demand_minute (model, minute, requests, cold_starts, wait_ms) "
        f"SELECT model, minute, requests, cold_starts, wait_ms FROM {legacy}"
    ).rowcount
    conn.exec_driver_sql(f"DROP TABLE {legacy}")
    return int(moved or 0)
