"""The synthetic generator: deterministic, every family present, patterns where the families say."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ingest._synthetic import DEFAULT_START, FAMILIES, generate


def test_same_seed_gives_the_same_trace_and_another_seed_does_not() -> None:
    a, b, c = generate(14, 2, seed=3), generate(14, 2, seed=3), generate(14, 2, seed=4)
    pd.testing.assert_frame_equal(a.events, b.events)
    assert a.families == b.families
    assert not np.array_equal(a.counts, c.counts)


def test_a_models_series_does_not_depend_on_how_many_models_are_generated() -> None:
    small, large = generate(8, 3), generate(40, 3)
    assert np.array_equal(small.counts, large.counts[:8])
    assert all(large.families[m] == f for m, f in small.families.items())


def test_every_family_appears_and_events_match_counts() -> None:
    trace = generate(len(FAMILIES), 7)
    assert sorted(trace.families.values()) == sorted(FAMILIES)
    ts = trace.events["timestamp"].to_numpy()
    assert np.all(np.diff(ts) >= 0)
    assert ts.min() >= DEFAULT_START
    assert ts.max() < DEFAULT_START + 7 * 86400
    assert len(trace.events) == int(trace.counts.sum())
    frame = trace.minute_frame()
    assert frame.shape == (7 * 1440, len(FAMILIES))
    assert frame.index[1] - frame.index[0] == 60


def test_family_patterns_show_in_the_counts() -> None:
    trace = generate(60, 14, seed=1)
    minute = np.arange(trace.minutes)
    weekend = (minute // 1440) % 7 >= 5  # DEFAULT_START is a Monday
    for i, model in enumerate(trace.models):
        family, row = trace.families[model], trace.counts[i]
        half = trace.minutes // 2
        if family == "launch":
            assert row[: int(0.3 * trace.minutes)].sum() == 0
            assert row[half:].sum() > 0
        elif family == "deprecation":
            assert row[int(0.7 * trace.minutes) :].sum() == 0
        elif family == "diurnal":
            assert row[~weekend].mean() > row[weekend].mean()
        elif family == "cron_hourly":
            by_minute = np.bincount(minute % 60, weights=row, minlength=60)
            assert by_minute.max() > 0.8 * by_minute.sum()


@pytest.mark.slow
def test_thousand_models_for_two_weeks_generate_quickly() -> None:
    import time

    began = time.perf_counter()
    trace = generate(1000, 14)
    assert time.perf_counter() - began < 20
    assert trace.counts.shape == (1000, 14 * 1440)
