"""The demand store on SQLite and PostgreSQL: read API, atomic batches, compare-and-set offsets."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from ingest import Cell, DemandStore, OffsetConflict, OffsetUpdate, StoredOffset
from prewarm import StorageError


def test_series_is_zero_filled_with_int_epoch_index(store: DemandStore) -> None:
    store.add_counts({("a", 120): Cell(3, 1, 5.0), ("a", 240): Cell(2, 0, 0.0)}, {"a": 240_500})
    series = store.series("a", 60, 300)
    assert list(series.index) == [60, 120, 180, 240]
    assert list(series) == [0, 3, 0, 2]
    assert series.dtype == "int64"
    assert series.name == "a"


def test_series_with_a_coarser_step_sums_minutes_aligned_to_the_epoch(store: DemandStore) -> None:
    store.add_counts({("a", m * 60): Cell(1, 0, 0.0) for m in range(10)}, {"a": 540_000})
    series = store.series("a", 130, 600, step=300)
    assert list(series.index) == [0, 300]
    assert list(series) == [5, 5]


def test_step_that_is_not_whole_minutes_is_refused(store: DemandStore) -> None:
    with pytest.raises(ValueError, match="multiple of 60"):
        store.series("a", 0, 600, step=90)


def test_series_of_an_unknown_model_is_all_zero(store: DemandStore) -> None:
    series = store.series("nobody", 0, 180)
    assert list(series) == [0, 0, 0]


def test_bulk_returns_one_column_per_model_in_the_order_asked(store: DemandStore) -> None:
    store.add_counts({("a", 0): Cell(1, 0, 0), ("b", 60): Cell(4, 0, 0), ("c", 0): Cell(9, 0, 0)}, {})
    frame = store.bulk(["b", "a", "zz"], 0, 120)
    assert list(frame.columns) == ["b", "a", "zz"]
    assert frame.loc[60, "b"] == 4
    assert frame.loc[0, "a"] == 1
    assert frame["zz"].sum() == 0
    everything = store.bulk(None, 0, 120)
    assert sorted(everything.columns) == ["a", "b", "c"]
    pd.testing.assert_series_equal(everything["b"], frame["b"])


def test_models_seen_and_last_request_follow_the_newest_event(store: DemandStore) -> None:
    assert store.models_seen() == []
    assert store.last_request("a") is None
    store.add_counts({("a", 0): Cell(1, 0, 0)}, {"a": 30_000})
    store.add_counts({("a", 0): Cell(1, 0, 0), ("b", 0): Cell(1, 0, 0)}, {"a": 10_000, "b": 5_000})
    assert store.models_seen() == ["a", "b"]
    assert store.last_request("a") == 30.0
    assert store.last_request("b") == 5.0


def test_batch_commits_counts_counters_and_offsets_together(store: DemandStore) -> None:
    store.commit_batch(
        "g", {("a", 0): Cell(2, 1, 10.0)}, {"a": 1_000}, [OffsetUpdate("t", 0, None, 5, 1_000)], {"events": 2}
    )
    store.commit_batch(
        "g", {("a", 0): Cell(1, 0, 0.0)}, {"a": 2_000}, [OffsetUpdate("t", 0, 5, 9, 2_000)], {"events": 1}
    )
    assert store.load_offsets("g", "t") == {0: StoredOffset(9, 2_000)}
    assert store.counters("g") == {"events": 3}
    assert list(store.minutes()) == [("a", 0, 3, 1, 10.0)]


def test_stale_offset_rolls_back_the_whole_batch(store: DemandStore) -> None:
    """A consumer that lost its partition (a zombie) must not add its counts over the new owner's."""
    store.commit_batch(
        "g", {("a", 0): Cell(1, 0, 0)}, {}, [OffsetUpdate("t", 0, None, 5, None)], {"events": 1}
    )
    store.commit_batch("g", {("a", 0): Cell(1, 0, 0)}, {}, [OffsetUpdate("t", 0, 5, 7, None)], {"events": 1})
    with pytest.raises(OffsetConflict):
        store.commit_batch(
            "g",
            {("a", 0): Cell(100, 0, 0), ("z", 0): Cell(1, 0, 0)},
            {"z": 1},
            [OffsetUpdate("t", 1, None, 3, None), OffsetUpdate("t", 0, 5, 9, None)],
            {"events": 101},
        )
    assert store.totals() == {"a": 2}
    assert store.load_offsets("g", "t") == {0: StoredOffset(7, None)}
    assert store.counters("g") == {"events": 2}
    assert store.models_seen() == []


def test_first_commit_of_a_partition_conflicts_when_someone_else_created_it(store: DemandStore) -> None:
    store.commit_batch("g", {}, {}, [OffsetUpdate("t", 0, None, 5, None)])
    with pytest.raises(OffsetConflict):
        store.commit_batch("g", {("a", 0): Cell(1, 0, 0)}, {}, [OffsetUpdate("t", 0, None, 3, None)])
    assert store.totals() == {}


def test_offsets_are_per_group_and_topic(store: DemandStore) -> None:
    store.commit_batch("g1", {}, {}, [OffsetUpdate("t", 0, None, 5, None)])
    store.commit_batch("g2", {}, {}, [OffsetUpdate("t", 0, None, 7, None)])
    store.commit_batch("g1", {}, {}, [OffsetUpdate("u", 0, None, 1, None)])
    assert store.load_offsets("g1", "t") == {0: StoredOffset(5, None)}
    assert store.load_offsets("g2", "t") == {0: StoredOffset(7, None)}
    assert store.groups() == ["g1", "g2"]


def test_export_rows_since_a_time(store: DemandStore) -> None:
    store.add_counts({("a", 0): Cell(1, 0, 0), ("a", 120): Cell(2, 1, 0), ("b", 60): Cell(3, 0, 0)}, {})
    assert [r[:4] for r in store.minutes(since=61)] == [("a", 120, 2, 1)]
    assert [r[:2] for r in store.minutes()] == [("a", 0), ("b", 60), ("a", 120)]


def test_two_stores_on_one_url_share_the_tables(store_url: str) -> None:
    with DemandStore(store_url) as one, DemandStore(store_url) as two:
        one.add_counts({("a", 0): Cell(1, 0, 0)}, {"a": 1})
        assert two.totals() == {"a": 1}


def test_sqlite_store_runs_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    with DemandStore(f"sqlite:///{path}") as s:
        s.add_counts({("a", 0): Cell(1, 0, 0)}, {})
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unsupported_database_is_a_storage_error() -> None:
    with pytest.raises(StorageError, match="unsupported"):
        DemandStore("mysql://localhost/x")
    with pytest.raises(StorageError):
        DemandStore("not a url")
