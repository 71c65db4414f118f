"""Event-time minute windows: pure functions, checked with examples and Hypothesis invariants."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest import MinuteAggregator, Verdict, WindowPolicy, aggregate, minute_of
from prewarm import RequestEvent, Tier

NOW = 1_800_000_000.0  # epoch seconds; every test passes its own "now"


def ev(ts_ms: int, model: str = "m", **kw: object) -> RequestEvent:
    return RequestEvent.model_validate({"ts": ts_ms, "model": model, **kw})


def test_minute_of_floors_to_the_minute_start() -> None:
    assert minute_of(60_000) == 60
    assert minute_of(119_999) == 60
    assert minute_of(0) == 0


def test_cold_starts_and_wait_are_summed_per_model_minute() -> None:
    events = [
        ev(60_000, served_from="L0"),
        ev(61_000, served_from="L2", wait_ms=1500.0),
        ev(62_000, wait_ms=500.0),
        ev(62_500, model="other"),
    ]
    agg, watermark = aggregate(events, now=NOW)
    cell = agg.cells[("m", 60)]
    assert (cell.requests, cell.cold_starts, cell.wait_ms) == (3, 2, 2000.0)
    assert agg.cells[("other", 60)].requests == 1
    assert watermark == 62_500
    assert agg.last_seen_ms == {"m": 62_000, "other": 62_500}


def test_late_event_is_counted_into_its_own_minute_and_reported_late() -> None:
    policy = WindowPolicy(lateness_s=600, future_tolerance_s=300, max_lateness_s=86_400)
    newest = 100_000_000
    hour_late = newest - 3_600_000
    events = [ev(newest), ev(newest - 599_000), ev(newest - 601_000), ev(hour_late)]
    agg, watermark = aggregate(events, now=NOW, policy=policy)
    assert agg.counted == 4
    assert agg.late == 2  # 601 s and an hour behind; 599 s is ordinary reordering
    assert agg.too_late == 0
    assert agg.cells[("m", minute_of(hour_late))].requests == 1
    assert sorted(agg.late_behind_s) == [601.0, 3600.0]
    assert watermark == newest  # a late event never moves the watermark back


def test_event_later_than_the_bound_is_counted_as_too_late_not_stored() -> None:
    policy = WindowPolicy(lateness_s=600, future_tolerance_s=300, max_lateness_s=3600)
    agg = MinuteAggregator(policy)
    newest = 100_000_000
    _, watermark = agg.add(ev(newest), None, NOW)
    verdicts = [agg.add(ev(newest - behind_ms), watermark, NOW)[0] for behind_ms in (3_600_000, 3_600_001)]
    assert verdicts == [Verdict.LATE, Verdict.TOO_LATE]
    assert (agg.counted, agg.late, agg.too_late) == (2, 1, 1)
    assert agg.too_late_behind_s == [3600.001]
    assert sum(c.requests for c in agg.cells.values()) == 2


def test_default_policy_counts_a_day_late_event() -> None:
    newest = 200_000_000
    agg, _ = aggregate([ev(newest), ev(newest - 86_400_000)], now=NOW)
    assert (agg.counted, agg.late, agg.too_late) == (2, 1, 0)
    agg, _ = aggregate([ev(newest), ev(newest - 86_400_001)], now=NOW)
    assert (agg.counted, agg.too_late) == (1, 1)


def test_an_on_time_slack_wider_than_the_bound_is_never_refused() -> None:
    """``lateness_s`` set the old way (drop past it) keeps counting everything within it."""
    policy = WindowPolicy(lateness_s=7200, future_tolerance_s=0, max_lateness_s=3600)
    newest = 100_000_000
    agg, _ = aggregate([ev(newest), ev(newest - 7_000_000), ev(newest - 7_300_000)], now=NOW, policy=policy)
    assert (agg.counted, agg.late, agg.too_late) == (2, 0, 1)


def test_event_too_far_in_the_future_is_not_counted_and_does_not_move_the_watermark() -> None:
    agg = MinuteAggregator(WindowPolicy(lateness_s=600, future_tolerance_s=300))
    verdict, watermark = agg.add(ev(int((NOW + 301) * 1000)), None, NOW)
    assert verdict is Verdict.FUTURE
    assert watermark is None
    verdict, _ = agg.add(ev(int((NOW + 299) * 1000)), None, NOW)
    assert verdict is Verdict.COUNTED


def test_replayed_history_is_not_late_against_the_wall_clock() -> None:
    long_ago = 1_563_148_800_000  # 2019
    agg, _ = aggregate([ev(long_ago), ev(long_ago + 1)], now=NOW)
    assert agg.counted == 2


def test_served_from_l0_without_wait_is_not_a_cold_start() -> None:
    agg, _ = aggregate([ev(0, served_from=Tier.L0), ev(1)], now=NOW)
    assert agg.cells[("m", 0)].cold_starts == 0


timestamps = st.lists(st.integers(min_value=0, max_value=3_600_000), min_size=0, max_size=200)


@settings(max_examples=60, deadline=None)
@given(timestamps, st.integers(min_value=0, max_value=200))
def test_splitting_a_partition_into_batches_never_changes_the_counts(ts: list[int], cut: int) -> None:
    """The consumer commits a partition batch by batch, carrying the watermark: same result as one go."""
    policy = WindowPolicy(lateness_s=120, future_tolerance_s=0, max_lateness_s=900)
    events = [ev(t, model=f"m{t % 3}") for t in ts]
    now = 3_600.0
    whole, wm_whole = aggregate(events, now=now, policy=policy)
    first, wm = aggregate(events[:cut], now=now, policy=policy)
    second, wm = aggregate(events[cut:], now=now, policy=policy, watermark_ms=wm)
    # The store adds each batch's cells to what it holds.
    stored: Counter[tuple[tuple[str, int], str]] = Counter()
    for batch in (first, second):
        for key, c in batch.cells.items():
            stored.update({(key, "requests"): c.requests, (key, "cold_starts"): c.cold_starts})
    assert wm == wm_whole
    assert +stored == Counter(
        {
            (k, f): n
            for k, c in whole.cells.items()
            for f, n in (("requests", c.requests), ("cold_starts", c.cold_starts))
        }
    )
    assert (first.counted + second.counted, first.late + second.late) == (whole.counted, whole.late)
    assert first.too_late + second.too_late == whole.too_late


@settings(max_examples=60, deadline=None)
@given(timestamps)
def test_every_event_is_counted_or_too_late_exactly_once(ts: list[int]) -> None:
    agg, _ = aggregate([ev(t) for t in ts], now=3_600.0, policy=WindowPolicy(60, 0, 600))
    assert agg.counted + agg.too_late == len(ts)
    assert sum(c.requests for c in agg.cells.values()) == agg.counted
    assert len(agg.late_behind_s) == agg.late <= agg.counted
    assert len(agg.too_late_behind_s) == agg.too_late
    assert all(60 < s <= 600 for s in agg.late_behind_s)
    assert all(s > 600 for s in agg.too_late_behind_s)


@settings(max_examples=60, deadline=None)
@given(timestamps)
def test_with_a_bound_above_the_span_no_event_is_lost(ts: list[int]) -> None:
    """Timestamps over an hour in any order, a bound of a day: every event in its own minute."""
    agg, _ = aggregate([ev(t) for t in ts], now=3_600.0, policy=WindowPolicy(60, 0, 86_400))
    assert agg.too_late == 0
    assert {k[1]: c.requests for k, c in agg.cells.items()} == Counter(minute_of(t) for t in ts)
