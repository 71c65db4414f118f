"""A bounded demand store: minutes past the retention window become hourly rows, readers see both."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ingest import Cell, DemandStore, OffsetUpdate
from ingest._retention import partition_name, spread_hours

DAY = 86_400
# 2024-01-10T00:00Z, a few days of data before it.
T0 = 1_704_844_800


def _fill(store: DemandStore, days: int = 4) -> dict[tuple[str, int], Cell]:
    """Every 7th minute of ``days`` days before T0, for two models; returns what was written."""
    cells = {
        (model, T0 - days * DAY + m * 60): Cell(1 + (m % 5) * k, m % 2, 10.0 * k)
        for k, model in ((1, "a"), (2, "b"))
        for m in range(0, days * 1440, 7)
    }
    store.add_counts(cells, {"a": T0 * 1000, "b": T0 * 1000})
    return cells


def test_rollup_moves_minutes_older_than_the_window_into_hours_and_keeps_totals(
    store: DemandStore,
) -> None:
    cells = _fill(store)
    totals = store.totals()
    result = store.roll_up(now=T0 + 3600, retention_s=2 * DAY)
    assert result.cutoff == T0 - 2 * DAY  # the midnight at or before now - retention
    old = [k for k in cells if k[1] < result.cutoff]
    assert result.minute_rows == len(old)
    assert store.totals() == totals
    rows = store.row_counts()
    assert rows["demand_minute"] == len(cells) - len(old)
    assert rows["demand_hour"] == result.hour_rows == 2 * 2 * 24
    assert min(minute for _, minute, *_ in store.minutes()) >= result.cutoff


def test_rollup_twice_changes_nothing(store: DemandStore) -> None:
    _fill(store)
    store.roll_up(now=T0, retention_s=2 * DAY)
    frame = store.bulk(None, T0 - 4 * DAY, T0)
    again = store.roll_up(now=T0, retention_s=2 * DAY)
    assert (again.minute_rows, again.hour_rows) == (0, 0)
    assert store.bulk(None, T0 - 4 * DAY, T0).equals(frame)


def test_readers_see_hourly_rows_spread_over_their_minutes(store: DemandStore) -> None:
    cells = _fill(store)
    before = store.bulk(["a", "b"], T0 - 4 * DAY, T0, step=3600)
    store.roll_up(now=T0, retention_s=2 * DAY)
    after_hourly = store.bulk(["a", "b"], T0 - 4 * DAY, T0, step=3600)
    assert after_hourly.equals(before)  # whole hours sum exactly
    minutes = store.bulk(["a"], T0 - 4 * DAY, T0)
    hour = T0 - 3 * DAY
    spread = minutes.loc[hour : hour + 3599, "a"]
    expected = sum(c.requests for (m, t), c in cells.items() if m == "a" and hour <= t < hour + 3600)
    assert int(spread.sum()) == expected
    assert spread.max() - spread.min() <= 1  # as even as integers allow
    recent = T0 - DAY
    assert minutes.loc[recent, "a"] == cells.get(("a", recent), Cell(0, 0, 0)).requests


def test_a_late_minute_for_a_rolled_up_day_is_added_by_the_next_rollup(store: DemandStore) -> None:
    _fill(store)
    store.roll_up(now=T0, retention_s=2 * DAY)
    old_minute = T0 - 3 * DAY + 60
    store.add_counts({("a", old_minute): Cell(5, 0, 0.0)}, {})
    totals = store.totals()
    store.roll_up(now=T0, retention_s=2 * DAY)
    assert store.totals() == totals
    assert store.row_counts()["demand_minute"] == len(list(store.minutes(since=T0 - 2 * DAY)))


def test_batches_after_a_rollup_still_commit(store: DemandStore) -> None:
    _fill(store)
    store.roll_up(now=T0, retention_s=2 * DAY)
    store.commit_batch(
        "g",
        {("a", T0 - 3 * DAY): Cell(1, 0, 0.0), ("a", T0 + 60): Cell(2, 0, 0.0)},
        {"a": (T0 + 60) * 1000},
        [OffsetUpdate("t", 0, None, 10, None)],
        {"events": 3},
    )
    assert store.counters("g")["events"] == 3
    assert store.series("a", T0 + 60, T0 + 120).iloc[0] == 2


def test_spread_is_even_and_sums_to_the_hour() -> None:
    rows, minute, requests = spread_hours(np.array([0, 3600]), np.array([61, 3]), first=0, stop=7200)
    assert requests[rows == 0].sum() == 61
    assert requests[rows == 1].sum() == 3
    assert set(requests[rows == 0]) == {1, 2}
    assert list(minute[rows == 1]) == [3600 + 19 * 60, 3600 + 39 * 60, 3600 + 59 * 60]


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_postgres_minute_table_is_partitioned_by_day_and_rollup_drops_partitions(
    store_url: str,
) -> None:
    assert make_url(store_url).get_backend_name() == "postgresql"
    with DemandStore(store_url) as store:
        assert store.partitioned
        _fill(store)
        made = store.maintain(now=T0, retention_s=2 * DAY)
        assert made.partitions_created == 3  # today and two days ahead
        assert made.partitions_dropped == 2
        with store.engine.connect() as conn:
            names = set(
                conn.execute(
                    sa.text(
                        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                        "WHERE i.inhparent = to_regclass('demand_minute')"
                    )
                ).scalars()
            )
        day = T0 // DAY
        assert names == {partition_name(d) for d in range(day - 2, day + 3)}


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_postgres_store_from_before_partitioning_migrates_with_its_rows(store_url: str) -> None:
    assert make_url(store_url).get_backend_name() == "postgresql"
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:  # the layout of the store before this change
        conn.exec_driver_sql(
            "CREATE TABLE demand_minute (model VARCHAR(128) NOT NULL, minute BIGINT NOT NULL, "
            "requests BIGINT NOT NULL, cold_starts BIGINT NOT NULL, wait_ms FLOAT NOT NULL, "
            "PRIMARY KEY (model, minute))"
        )
        conn.exec_driver_sql(
            f"INSERT INTO demand_minute VALUES ('a', {T0 - DAY}, 3, 0, 0), ('a', {T0}, 4, 1, 5)"
        )
    engine.dispose()
    with DemandStore(store_url) as store:
        assert not store.partitioned
        assert store.migrate() == 2
        assert store.partitioned
        assert store.migrate() == 0
        assert store.totals() == {"a": 7}
        store.add_counts({("a", T0 + 2 * DAY): Cell(1, 0, 0.0)}, {})
        assert store.totals() == {"a": 8}


def test_upkeep_counts_the_window_back_from_the_newest_event_not_past_it(store: DemandStore) -> None:
    cells = _fill(store)  # newest event at T0
    much_later = T0 + 400 * DAY  # a replayed old trace: the wall clock is far ahead of the data
    result = store.maintain(now=much_later, retention_s=2 * DAY)
    assert result.cutoff == T0 - 2 * DAY
    assert store.row_counts()["demand_minute"] == len([k for k in cells if k[1] >= T0 - 2 * DAY])
