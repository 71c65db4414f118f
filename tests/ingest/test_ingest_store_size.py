"""The store-size benchmark: rows counted from the generator match a real store's, before and after
a rollup, and the generator's counts-only stream is the same series as ``generate``."""

from __future__ import annotations

import numpy as np

from ingest import generate, minute_counts, run_store_size_bench


def test_counts_only_stream_yields_the_series_generate_makes() -> None:
    trace = generate(12, 2.0, seed=3)
    streamed = list(minute_counts(12, 2.0, seed=3))
    assert [model for model, _ in streamed] == trace.models
    for i, (_, row) in enumerate(streamed):
        np.testing.assert_array_equal(row, trace.counts[i])


def test_counted_rows_are_the_rows_a_real_store_holds_with_and_without_rollups() -> None:
    result = run_store_size_bench(models=15, days=3, retention_days=1, sample_models=15)
    sample = result["sample"]
    assert result["rows"]["minute_all"] == sample["rows_before"]["demand_minute"]
    assert result["rows"]["minute_recent"] == sample["rows_after"]["demand_minute"]
    assert result["rows"]["hour_old"] == sample["rows_after"]["demand_hour"]
    assert 0 < result["bytes_with_rollups"] < result["bytes_without_rollups"]
    assert result["bytes_per_minute_row"] > 0
