"""``prewarm bench store``: the demand store's size after D simulated days of N models, with and
without rollups.

Writing 30 days of 10,000 models (over 100 million minute rows) is hours of work for one database on
a laptop, and what it would show is rows × bytes per row. So the benchmark counts the rows *exactly*
for every model (the synthetic generator's series, model by model, never all in memory) and measures
the bytes per row on a real store holding the first ``sample_models`` of them in full:

1. every model's counts: minute rows (non-zero minutes), and with rollups at ``retention_days`` the
   minute rows after the cutoff plus the non-zero (model, hour) rows before it;
2. the sample written to a fresh store (SQLite file or the configured PostgreSQL), measured per table
   (SQLite ``dbstat``, PostgreSQL ``pg_total_relation_size``), then rolled up and measured again;
3. the sizes at N models = rows × the sample's bytes per row of each table.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from ._retention import DAY_S, rollup_cutoff
from ._store import DemandStore, normalise_url
from ._synthetic import DEFAULT_START, minute_counts
from ._window import Cell

__all__ = ["run_store_size_bench", "table_bytes"]


def table_bytes(store: DemandStore) -> dict[str, int]:
    """Bytes on disk of ``demand_minute`` (all partitions) and ``demand_hour``, indexes included."""
    with store.engine.connect() as conn:
        if store.dialect == "sqlite":
            rows = conn.exec_driver_sql(
                "SELECT s.tbl_name, SUM(d.pgsize) FROM dbstat d JOIN sqlite_schema s ON s.name = d.name "
                "WHERE s.tbl_name IN ('demand_minute', 'demand_hour') GROUP BY s.tbl_name"
            ).all()
            sizes = {str(name): int(size) for name, size in rows}
        else:
            minute = conn.exec_driver_sql(
                "SELECT COALESCE(SUM(pg_total_relation_size(relid)), 0) "
                "FROM pg_partition_tree(to_regclass('demand_minute'))"
                if store.partitioned
                else "SELECT pg_total_relation_size(to_regclass('demand_minute'))"
            ).scalar()
            hour = conn.exec_driver_sql("SELECT pg_total_relation_size(to_regclass('demand_hour'))").scalar()
            sizes = {"demand_minute": int(minute or 0), "demand_hour": int(hour or 0)}
    return {"demand_minute": sizes.get("demand_minute", 0), "demand_hour": sizes.get("demand_hour", 0)}


@contextlib.contextmanager
def _scratch(database_url: str | None) -> Iterator[str]:
    """A store URL of its own: a temporary SQLite file, or a fresh schema of the given PostgreSQL
    database (dropped afterwards), so the benchmark never touches a store's own rows."""
    if database_url is None or normalise_url(database_url).get_backend_name() == "sqlite":
        with tempfile.TemporaryDirectory(prefix="prewarm-size-") as tmp:
            yield f"sqlite:///{Path(tmp) / 'size.db'}"
        return
    base = normalise_url(database_url)
    schema = f"prewarm_size_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        yield base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False
        )
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


def _compact(store: DemandStore) -> None:
    """Return freed pages, so a measured size is what the rows need (SQLite VACUUM; PostgreSQL drops
    whole partitions, and ``VACUUM FULL`` of the hourly table is not what production would run)."""
    if store.dialect == "sqlite":
        raw = store.engine.raw_connection()  # VACUUM cannot run inside the BEGIN the engine issues
        try:
            raw.driver_connection.execute("VACUUM")  # type: ignore[union-attr]
        finally:
            raw.close()


def _write_sample(store: DemandStore, series: list[tuple[str, np.ndarray]], start: float) -> None:
    """The sample's non-zero minutes, one day of all sample models per batch."""
    minutes = len(series[0][1]) if series else 0
    for day0 in range(0, minutes, 1440):
        cells: dict[tuple[str, int], Cell] = {}
        for model, row in series:
            chunk = row[day0 : day0 + 1440]
            for offset in np.nonzero(chunk)[0]:
                minute = int(start) + 60 * (day0 + int(offset))
                cells[(model, minute)] = Cell(int(chunk[offset]), 0, 0.0)
        if cells:
            store.add_counts(cells, {})


def run_store_size_bench(
    *,
    models: int = 10_000,
    days: float = 30.0,
    retention_days: float = 7.0,
    sample_models: int = 50,
    database_url: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Rows at ``models`` counted exactly, bytes per row measured on ``sample_models``; see above."""
    started = time.perf_counter()
    start = DEFAULT_START
    now = start + days * DAY_S
    cutoff = rollup_cutoff(now, retention_days * DAY_S)
    cut = int((cutoff - start) // 60)  # minute index of the cutoff
    rows = {"minute_all": 0, "minute_recent": 0, "hour_old": 0}
    sample: list[tuple[str, np.ndarray]] = []
    for model, row in minute_counts(models, days, seed=seed, start=start):
        rows["minute_all"] += int(np.count_nonzero(row))
        if cut > 0:
            head = row[: max(cut, 0)]
            rows["minute_recent"] += int(np.count_nonzero(row[cut:]))
            whole = len(head) // 60 * 60
            rows["hour_old"] += int(np.count_nonzero(head[:whole].reshape(-1, 60).sum(axis=1)))
        else:
            rows["minute_recent"] += int(np.count_nonzero(row))
        if len(sample) < sample_models:
            sample.append((model, row))
    counted_s = time.perf_counter() - started

    with _scratch(database_url) as url, DemandStore(url) as store:
        mark = time.perf_counter()
        _write_sample(store, sample, start)
        write_s = time.perf_counter() - mark
        _compact(store)
        before = table_bytes(store)
        sample_rows = store.row_counts()
        store.roll_up(now, retention_days * DAY_S)
        _compact(store)
        after = table_bytes(store)
        rolled_rows = store.row_counts()
    per_minute = before["demand_minute"] / max(sample_rows["demand_minute"], 1)
    per_hour = after["demand_hour"] / max(rolled_rows["demand_hour"], 1)
    without = rows["minute_all"] * per_minute
    with_rollups = rows["minute_recent"] * per_minute + rows["hour_old"] * per_hour
    return {
        "models": models,
        "days": days,
        "retention_days": retention_days,
        "store": "sqlite" if database_url is None else database_url.split(":")[0].split("+")[0],
        "rows": rows,
        "bytes_per_minute_row": round(per_minute, 1),
        "bytes_per_hour_row": round(per_hour, 1),
        "bytes_without_rollups": int(without),
        "bytes_with_rollups": int(with_rollups),
        "ratio": round(with_rollups / without, 4) if without else None,
        # Past the window, each further day adds only hourly rows: the store grows ~60x slower.
        "bytes_per_day_after_window": int(rows["hour_old"] / max((cutoff - start) / DAY_S, 1) * per_hour),
        "sample": {
            "models": len(sample),
            "rows_before": sample_rows,
            "rows_after": rolled_rows,
            "bytes_before": before,
            "bytes_after": after,
            "write_seconds": round(write_s, 2),
        },
        "count_seconds": round(counted_s, 2),
    }
