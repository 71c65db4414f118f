"""The demand store: per-(model, minute) counts on SQLAlchemy Core, SQLite (WAL) or PostgreSQL.

Tables (created on first use, all in the URL's default schema):

- ``demand_minute``: (model, minute) → requests, cold_starts, wait_ms (summed wait of the minute), for
  the retention window; range-partitioned by day on PostgreSQL
- ``demand_hour``: (model, hour) → the same, for what is older (``_retention.py``: rollup, partitions)
- ``demand_model``: model → first and last event time seen (epoch ms)
- ``ingest_offset``: (group, topic, partition) → next offset to read, and the partition's watermark
- ``ingest_counter``: (group, name) → value: records, events counted, late events counted
  (``late_counted``, part of ``events``), events too late to store (``too_late``), dead letters by reason

The consumer writes one batch in one transaction: counts, counters *and* offsets. The offset update is
a compare-and-set on the offset it read when it was assigned the partition, so a consumer that lost its
partition without noticing (a zombie) can never commit over the new owner: its transaction fails with
``OffsetConflict`` and is rolled back whole. That is what makes the counts exactly-once.

Any minute can be added to at any time, however old: a late event's minute is one more upserted row of
the same transaction, so late corrections are exactly-once too.

Readers (forecaster, scheduler) use ``series``, ``bulk``, ``models_seen`` and ``last_request``; they
see minute and hourly rows as one per-minute history (an hour spread over its minutes).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import IntegrityError as SAIntegrityError

from prewarm import StorageError, get_logger

from ._retention import (
    DAY_S,
    ROLLUP_LOCK,
    RollupResult,
    create_partitions,
    day_of,
    is_partitioned,
    migrate_to_partitions,
    partition_days,
    roll_up,
    rollup_cutoff,
    spread_hours,
)
from ._tables import demand_hour, demand_minute, demand_model, ingest_counter, ingest_offset, metadata
from ._window import Cell

__all__ = ["DemandStore", "OffsetConflict", "OffsetUpdate", "StoredOffset", "normalise_url"]

log = get_logger(__name__)

# Retries for errors a second attempt can fix: SQLite "database is locked", PostgreSQL deadlocks and
# serialization failures, a dropped connection. A batch is one transaction, so a retry is safe.
_ATTEMPTS = 5
# Partitions made ahead of time by ``maintain``: today and this many days after.
_DAYS_AHEAD = 2


class OffsetConflict(StorageError):
    """Another consumer committed this partition since we read its offset; the batch was rolled back."""


@dataclass(frozen=True, slots=True)
class StoredOffset:
    next_offset: int
    watermark_ms: int | None


@dataclass(frozen=True, slots=True)
class OffsetUpdate:
    """Move ``partition`` from ``expected`` (None: no row yet) to ``next_offset``."""

    topic: str
    partition: int
    expected: int | None
    next_offset: int
    watermark_ms: int | None


def normalise_url(url: str) -> URL:
    parsed = make_url(url)
    # SQLAlchemy's default PostgreSQL driver is psycopg2; this project ships psycopg 3.
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _transient(exc: DBAPIError) -> bool:
    if exc.connection_invalidated:
        return True
    code = getattr(exc.orig, "sqlstate", None)
    if code in ("40001", "40P01"):  # serialization failure, deadlock
        return True
    return "database is locked" in str(exc.orig) or "database is busy" in str(exc.orig)


class DemandStore:
    """Per-model per-minute demand, on any SQLAlchemy URL (SQLite in WAL mode, PostgreSQL)."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        try:
            self._url = normalise_url(url)
        except SQLAlchemyError as exc:
            raise StorageError(f"not a database URL: {url!r}") from exc
        self.dialect = self._url.get_backend_name()
        if self.dialect not in ("sqlite", "postgresql"):
            raise StorageError(f"unsupported database {self.dialect!r}: use sqlite or postgresql")
        self.engine = self._make_engine()
        # PostgreSQL: whether demand_minute is partitioned (False for a store not migrated yet), and
        # the days known to have a partition, so that a batch checks the catalogue only for new days.
        self.partitioned = False
        self._days: set[int] = set()
        if create:
            self.create()
        elif self.dialect == "postgresql":
            self._load_partitions()

    # ------------------------------------------------------------------ set-up

    def _make_engine(self) -> Engine:
        if self.dialect == "postgresql":
            return sa.create_engine(self._url, pool_pre_ping=True, pool_size=2, max_overflow=2)
        database = self._url.database
        if database and database != ":memory:":
            from pathlib import Path

            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(self._url, connect_args={"timeout": 30})

        @sa_event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take over transaction control from pysqlite, so writers can BEGIN IMMEDIATE (below)
            # and never deadlock on a read-to-write lock upgrade between two processes.
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL survives a process kill
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @sa_event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            write = conn.get_execution_options().get("prewarm_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    def create(self) -> None:
        """Create the tables if they do not exist (idempotent, safe from several processes)."""
        for attempt in range(3):
            try:
                metadata.create_all(self.engine, checkfirst=True)
                if self.dialect == "postgresql":
                    self._load_partitions()
                return
            except SQLAlchemyError as exc:
                # Two processes creating the tables at the same moment: one of them loses the race on
                # PostgreSQL's catalog (a unique violation or "already exists"); the next check sees them.
                if attempt == 2:
                    raise StorageError(f"cannot create demand tables: {exc}") from exc
                time.sleep(0.1 * (attempt + 1))

    def _load_partitions(self) -> None:
        try:
            with self.engine.connect() as conn:
                self.partitioned = is_partitioned(conn)
                self._days = partition_days(conn) if self.partitioned else set()
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot read the demand store's partitions: {exc}") from exc

    def _ensure_days(self, days: set[int]) -> int:
        """Create the partitions of ``days`` not known to exist; returns how many were created. Its own
        transaction: DDL that any writer may repeat, so it need not be part of a batch."""
        missing = days - self._days
        if not missing or not self.partitioned:
            return 0
        created = 0

        def body(conn: Connection) -> None:
            nonlocal created
            created = create_partitions(conn, missing)

        self._transaction(body, shared_lock=False)
        self._days |= missing
        return created

    def migrate(self) -> int:
        """Bring an existing store to this layout: create missing tables (``demand_hour``) and, on
        PostgreSQL, turn a plain ``demand_minute`` into the partitioned one, rows included, in one
        transaction that no writer overlaps. Idempotent; returns the minute rows moved."""
        metadata.create_all(self.engine, checkfirst=True)
        moved = 0
        if self.dialect == "postgresql":

            def body(conn: Connection) -> None:
                nonlocal moved
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(ROLLUP_LOCK)))
                moved = migrate_to_partitions(conn)

            self._transaction(body, shared_lock=False)
            self._load_partitions()
        return moved

    # ------------------------------------------------------------------ retention

    def roll_up(self, now: float, retention_s: float) -> RollupResult:
        """Roll minute rows older than the retention window up into hourly rows (``_retention.py``).

        One transaction; idempotent. The cutoff is the UTC midnight at or before ``now - retention_s``.
        """
        cutoff = rollup_cutoff(now, retention_s)
        result = RollupResult(cutoff, 0, 0, 0, 0)

        def body(conn: Connection) -> None:
            nonlocal result
            if self.dialect == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(ROLLUP_LOCK)))
            result = roll_up(conn, self.dialect, cutoff, partitioned=self.partitioned)

        self._transaction(body, shared_lock=False)
        if self.partitioned:
            self._days = {d for d in self._days if (d + 1) * DAY_S > cutoff}
        log.info("demand rolled up", extra=result.to_json())
        return result

    def maintain(self, now: float, retention_s: float) -> RollupResult:
        """The periodic upkeep: partitions for today and the next days (PostgreSQL), then ``roll_up``.

        The window counts back from the newest counted event when that is older than ``now``, so a
        replayed old trace is not rolled up as it arrives; an empty store has nothing to roll up.
        """
        today = day_of(int(now))
        created = self._ensure_days(set(range(today, today + _DAYS_AHEAD + 1)))
        newest = self._read(sa.select(sa.func.max(demand_model.c.last_ms)))[0][0]
        if newest is None:
            return RollupResult(rollup_cutoff(now, retention_s), 0, 0, 0, created)
        result = self.roll_up(min(now, newest / 1000.0), retention_s)
        return dataclasses.replace(result, partitions_created=created)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> DemandStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DemandStore({self._url.render_as_string(hide_password=True)!r})"

    # ------------------------------------------------------------------ write path

    def _insert(self, table: sa.Table) -> Any:
        return (postgresql.insert if self.dialect == "postgresql" else sqlite.insert)(table)

    def _greatest(self, a: Any, b: Any) -> Any:
        return sa.func.greatest(a, b) if self.dialect == "postgresql" else sa.func.max(a, b)

    def _least(self, a: Any, b: Any) -> Any:
        return sa.func.least(a, b) if self.dialect == "postgresql" else sa.func.min(a, b)

    def _upsert(
        self,
        conn: Connection,
        table: sa.Table,
        keys: Sequence[str],
        rows: list[dict[str, Any]],
        update: Callable[[Any], dict[str, Any]],
    ) -> None:
        """Insert ``rows``, merging each into an existing row with the same ``keys``: ``update`` gets
        the proposed row (``excluded``) and returns the new values. Callers sort ``rows``, so two
        writers on PostgreSQL lock rows in the same order and cannot deadlock."""
        if not rows:
            return
        stmt = self._insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=[table.c[k] for k in keys], set_=update(stmt.excluded)
        )
        conn.execute(stmt, rows)

    def _write(
        self, conn: Connection, cells: Mapping[tuple[str, int], Cell], last_seen: Mapping[str, int]
    ) -> None:
        m, d = demand_minute.c, demand_model.c
        self._upsert(
            conn,
            demand_minute,
            ["model", "minute"],
            [
                {
                    "model": model,
                    "minute": t,
                    "requests": c.requests,
                    "cold_starts": c.cold_starts,
                    "wait_ms": c.wait_ms,
                }
                for (model, t), c in sorted(cells.items())
            ],
            lambda new: {
                "requests": m.requests + new.requests,
                "cold_starts": m.cold_starts + new.cold_starts,
                "wait_ms": m.wait_ms + new.wait_ms,
            },
        )
        self._upsert(
            conn,
            demand_model,
            ["model"],
            [{"model": model, "first_ms": ts, "last_ms": ts} for model, ts in sorted(last_seen.items())],
            lambda new: {
                "first_ms": self._least(d.first_ms, new.first_ms),
                "last_ms": self._greatest(d.last_ms, new.last_ms),
            },
        )

    def _bump(self, conn: Connection, group: str, counters: Mapping[str, int]) -> None:
        c = ingest_counter.c
        self._upsert(
            conn,
            ingest_counter,
            ["group_id", "name"],
            [{"group_id": group, "name": k, "value": v} for k, v in sorted(counters.items()) if v],
            lambda new: {"value": c.value + new.value},
        )

    def _move_offsets(
        self, conn: Connection, group: str, updates: Sequence[OffsetUpdate], now: float
    ) -> None:
        t = ingest_offset
        for u in sorted(updates, key=lambda u: (u.topic, u.partition)):
            values = {"next_offset": u.next_offset, "watermark_ms": u.watermark_ms, "updated_at": now}
            if u.expected is None:
                try:
                    # A failed insert aborts the whole transaction, which is what a conflict wants.
                    conn.execute(
                        sa.insert(t).values(group_id=group, topic=u.topic, partition=u.partition, **values)
                    )
                except SAIntegrityError as exc:
                    raise OffsetConflict(
                        f"{u.topic}[{u.partition}] was committed by another consumer"
                    ) from exc
                continue
            result = conn.execute(
                sa.update(t)
                .where(
                    t.c.group_id == group,
                    t.c.topic == u.topic,
                    t.c.partition == u.partition,
                    t.c.next_offset == u.expected,
                )
                .values(**values)
            )
            if result.rowcount != 1:
                raise OffsetConflict(
                    f"{u.topic}[{u.partition}] moved past {u.expected}: another consumer committed it"
                )

    def commit_batch(
        self,
        group: str,
        cells: Mapping[tuple[str, int], Cell],
        last_seen_ms: Mapping[str, int],
        offsets: Sequence[OffsetUpdate],
        counters: Mapping[str, int] | None = None,
        *,
        now: float | None = None,
    ) -> None:
        """Add counts, counters and move offsets in one transaction; all or nothing.

        Raises ``OffsetConflict`` (nothing written) when another consumer moved one of the offsets.
        """
        stamp = time.time() if now is None else now

        def body(conn: Connection) -> None:
            # Offsets first: a conflict aborts before any count is written.
            self._move_offsets(conn, group, offsets, stamp)
            self._write(conn, cells, last_seen_ms)
            self._bump(conn, group, counters or {})

        self._transaction(body, days={day_of(minute) for _, minute in cells})

    def add_counts(self, cells: Mapping[tuple[str, int], Cell], last_seen_ms: Mapping[str, int]) -> None:
        """Add counts without offsets (backfills, tests): not exactly-once by itself.

        A model of ``cells`` missing from ``last_seen_ms`` is recorded as seen at the start of its
        newest minute, so that ``models_seen`` always lists every model with counts.
        """
        seen = dict(last_seen_ms)
        for model, minute in cells:
            if model not in last_seen_ms:
                seen[model] = max(seen.get(model, 0), minute * 1000)
        self._transaction(
            lambda conn: self._write(conn, cells, seen), days={day_of(minute) for _, minute in cells}
        )

    def _transaction(
        self, body: Callable[[Connection], None], *, shared_lock: bool = True, days: set[int] | None = None
    ) -> None:
        """Run ``body`` in one write transaction, retried on transient errors. On PostgreSQL a writer
        holds ``ROLLUP_LOCK`` shared (``shared_lock``), so a rollup never overlaps a batch, and the
        partitions of ``days`` (the days ``body`` writes minutes of) are made first."""
        delay = 0.05
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                if days:
                    self._ensure_days(days)
                with self.engine.connect().execution_options(prewarm_write=True) as conn, conn.begin():
                    if shared_lock and self.dialect == "postgresql":
                        conn.execute(sa.select(sa.func.pg_advisory_xact_lock_shared(ROLLUP_LOCK)))
                    body(conn)
                return
            except OffsetConflict:
                raise
            except DBAPIError as exc:
                if attempt < _ATTEMPTS and self._lost_partition(exc):
                    continue
                if attempt < _ATTEMPTS and _transient(exc):
                    log.warning(
                        "store write failed, retrying", extra={"attempt": attempt, "error": str(exc.orig)}
                    )
                    time.sleep(delay)
                    delay *= 2
                    continue
                raise StorageError(f"demand store write failed: {exc.orig}") from exc
            except SQLAlchemyError as exc:
                raise StorageError(f"demand store write failed: {exc}") from exc

    def _lost_partition(self, exc: DBAPIError) -> bool:
        """A partition this process knew of was dropped by a rollup elsewhere: find out again."""
        if not self.partitioned or getattr(exc.orig, "sqlstate", None) != "23514":
            return False
        if "no partition" not in str(exc.orig):
            return False
        self._load_partitions()
        return True

    # ------------------------------------------------------------------ offsets and counters

    def load_offsets(self, group: str, topic: str) -> dict[int, StoredOffset]:
        t = ingest_offset
        rows = self._read(
            sa.select(t.c.partition, t.c.next_offset, t.c.watermark_ms).where(
                t.c.group_id == group, t.c.topic == topic
            )
        )
        return {int(p): StoredOffset(int(o), None if w is None else int(w)) for p, o, w in rows}

    def counters(self, group: str) -> dict[str, int]:
        t = ingest_counter
        rows = self._read(sa.select(t.c.name, t.c.value).where(t.c.group_id == group))
        return {str(n): int(v) for n, v in rows}

    def groups(self) -> list[str]:
        t = ingest_offset
        return sorted(str(g) for (g,) in self._read(sa.select(t.c.group_id).distinct()))

    # ------------------------------------------------------------------ read API

    def _read(self, stmt: Any) -> list[Any]:
        try:
            with self.engine.connect() as conn:
                return list(conn.execute(stmt).all())
        except SQLAlchemyError as exc:
            raise StorageError(f"demand store read failed: {exc}") from exc

    def models_seen(self) -> list[str]:
        """Every model with at least one counted request, sorted."""
        return sorted(str(m) for (m,) in self._read(sa.select(demand_model.c.model)))

    def last_request(self, model: str) -> float | None:
        """Event time (epoch seconds) of the newest counted request of ``model``, or None."""
        rows = self._read(sa.select(demand_model.c.last_ms).where(demand_model.c.model == model))
        return rows[0][0] / 1000.0 if rows else None

    def last_requests(self) -> dict[str, float]:
        rows = self._read(sa.select(demand_model.c.model, demand_model.c.last_ms))
        return {str(m): ts / 1000.0 for m, ts in rows}

    @staticmethod
    def _grid(start: float, end: float, step: int) -> np.ndarray:
        if step <= 0 or step % 60:
            raise ValueError(f"step must be a positive multiple of 60 seconds, not {step}")
        first = int(start // step) * step
        return np.arange(first, int(np.ceil(end)), step, dtype=np.int64)

    def series(self, model: str, start: float, end: float, step: int = 60) -> pd.Series:
        """Requests of ``model`` per step in ``[start, end)``, zero-filled.

        The index holds the epoch seconds (int) at which each step starts; steps are aligned to
        multiples of ``step`` since the epoch, so the first one holds ``start``.
        """
        frame = self.bulk([model], start, end, step)
        return frame[model].rename(model)

    def bulk(self, models: Sequence[str] | None, start: float, end: float, step: int = 60) -> pd.DataFrame:
        """Requests per step for many models at once: index as in ``series``, one column per model.

        ``models=None`` means every model seen. Columns follow the order of ``models``. Minutes that
        have been rolled up into hours read as the hour's count spread evenly over its minutes.
        """
        grid = self._grid(start, end, step)
        names = list(models) if models is not None else self.models_seen()
        frame = pd.DataFrame(0, index=pd.Index(grid, name="ts"), columns=pd.Index(names), dtype=np.int64)
        if not len(grid) or not names:
            return frame
        first, stop = int(grid[0]), int(grid[-1]) + step
        t = demand_minute
        stmt = sa.select(t.c.model, t.c.minute, t.c.requests).where(t.c.minute >= first, t.c.minute < stop)
        if models is not None:
            stmt = stmt.where(t.c.model.in_(names))
        rows = self._read(stmt)
        hourly = self._hour_rows(models is not None, names, first, stop)
        if not rows and not hourly:
            return frame
        raw = pd.DataFrame(rows, columns=["model", "minute", "requests"])
        if hourly:
            raw = pd.concat([raw, self._spread(hourly, first, stop)], ignore_index=True)
        raw["ts"] = (raw["minute"].astype(np.int64) // step) * step
        summed = raw.groupby(["ts", "model"])["requests"].sum().unstack("model", fill_value=0)
        summed = summed.reindex(index=grid, columns=names, fill_value=0).astype(np.int64)
        summed.index.name = "ts"
        summed.columns = pd.Index(names)
        return summed

    def _hour_rows(self, only: bool, names: Sequence[str], first: int, stop: int) -> list[Any]:
        h = demand_hour.c
        stmt = sa.select(h.model, h.hour, h.requests).where(h.hour > first - 3600, h.hour < stop)
        if only:
            stmt = stmt.where(h.model.in_(names))
        return self._read(stmt)

    @staticmethod
    def _spread(hourly: list[Any], first: int, stop: int) -> pd.DataFrame:
        models = np.array([r[0] for r in hourly], dtype=object)
        hours = np.array([r[1] for r in hourly], dtype=np.int64)
        counts = np.array([r[2] for r in hourly], dtype=np.int64)
        rows, minute, requests = spread_hours(hours, counts, first, stop)
        return pd.DataFrame({"model": models[rows], "minute": minute, "requests": requests})

    def minutes(
        self, since: float | None = None, model: str | None = None
    ) -> Iterator[tuple[str, int, int, int, float]]:
        """Rows ``(model, minute, requests, cold_starts, wait_ms)`` of the minutes from ``since`` on
        (minute rows only: what is still within the retention window)."""
        t = demand_minute
        stmt = sa.select(t.c.model, t.c.minute, t.c.requests, t.c.cold_starts, t.c.wait_ms).order_by(
            t.c.minute, t.c.model
        )
        if since is not None:
            stmt = stmt.where(t.c.minute >= math.ceil(since))
        if model is not None:
            stmt = stmt.where(t.c.model == model)
        try:
            with self.engine.connect() as conn:
                for m, minute, req, cold, wait in conn.execute(stmt.execution_options(yield_per=5000)):
                    yield str(m), int(minute), int(req), int(cold), float(wait)
        except SQLAlchemyError as exc:
            raise StorageError(f"demand store read failed: {exc}") from exc

    def totals(self) -> dict[str, int]:
        """Requests per model over all time, hourly rollups included."""
        totals: dict[str, int] = {}
        for t in (demand_minute, demand_hour):
            for m, n in self._read(sa.select(t.c.model, sa.func.sum(t.c.requests)).group_by(t.c.model)):
                totals[str(m)] = totals.get(str(m), 0) + int(n)
        return totals

    def row_counts(self) -> dict[str, int]:
        """Rows of the minute and hourly tables (store size checks, benchmarks)."""
        return {
            t.name: int(self._read(sa.select(sa.func.count()).select_from(t))[0][0])
            for t in (demand_minute, demand_hour)
        }
