from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import Catalog, ModelSpec
from prewarm import InvalidInput, OrderAction, Tier
from sim import (
    HistogramPolicy,
    IdleHistogram,
    NodeShape,
    PolicyContext,
    Requests,
    make_policy,
    run_policies,
)

GB = 10**9
DAY0 = 1_704_067_200.0  # Monday 00:00 UTC
MIN = 60.0
RANGE_S = 240 * MIN  # the fallback keep-alive: the whole 4-hour range


def _catalog(*models: str) -> Catalog:
    return Catalog(
        ModelSpec(id=m, version="1", uri=f"s3://b/{m}.safetensors", size_bytes=10 * GB) for m in models
    )


def _requests(ts: list[float], models: list[str]) -> Requests:
    order = np.argsort(np.asarray(ts), kind="stable")
    return np.asarray(ts, dtype=np.float64)[order], np.asarray(models, dtype=np.str_)[order]


def _context(history: Requests, *models: str, unlimited: bool = True, start: float = DAY0) -> PolicyContext:
    node = "unlimited" if unlimited else "n1"
    return PolicyContext(
        catalog=_catalog(*models),
        nodes={node: NodeShape(node, (80 * GB,), 256 * GB, 2000 * GB)},
        unlimited=unlimited,
        start=start,
        end=start + 86400,
        history=history,
        future=None,
        bandwidth={} if unlimited else {"L3->L2": 1e9, "L2->L1": 7e9, "L1->L0": 50e9},
        hop_overhead_s=0.5,
    )


def _hist(idle_s: list[float], range_min: int = 240) -> IdleHistogram:
    h = IdleHistogram(range_min)
    h.add_many(np.asarray(idle_s, dtype=np.float64))
    return h


# ------------------------------------------------------------------ the windows


def test_windows_are_the_5th_and_99th_percentile_bins_with_10_percent_margins() -> None:
    # 100 idle times: bins 0 (4), 10 (90), 20 (5), 60 (1). The 5th falls in bin 10, the 99th in bin 20.
    idle = [30.0] * 4 + [10 * MIN + 10] * 90 + [20.5 * MIN] * 5 + [60.2 * MIN]
    w = _hist(idle).windows()
    assert w.pattern
    assert w.prewarm_s == pytest.approx(10 * MIN * 0.9)  # lower edge of bin 10, less 10%
    assert w.keepalive_s == pytest.approx(21 * MIN * 1.1)  # upper edge of bin 20, plus 10%


def test_added_one_at_a_time_or_all_at_once_the_histogram_is_the_same() -> None:
    rng = np.random.default_rng(3)
    idle = [*rng.exponential(600.0, 200), 300 * MIN]  # one out of bounds
    one = IdleHistogram()
    for x in idle:
        one.add(x)
    many = _hist(idle)
    assert np.array_equal(one.counts, many.counts)
    assert one.out_of_bounds == many.out_of_bounds == 1
    assert one.cv() == pytest.approx(many.cv())
    assert one.cv() == pytest.approx(float(np.std(many.counts) / np.mean(many.counts)))
    assert one.windows() == many.windows()


def _reference_bins(idle_s: list[float], range_min: int) -> tuple[int, int]:
    """The p5 and p99 bins computed from scratch, as the paper reads them off the histogram."""
    bins = np.array([int(x // MIN) for x in idle_s if x // MIN < range_min], dtype=np.int64)
    cum = np.cumsum(np.bincount(bins, minlength=range_min))
    n = int(cum[-1])
    return int(np.searchsorted(cum, 0.05 * n)), int(np.searchsorted(cum, 0.99 * n))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=90 * MIN) | st.sampled_from([5 * MIN, 40 * MIN]), max_size=400),
    st.integers(min_value=1, max_value=60),
)
def test_percentile_bins_followed_one_idle_time_at_a_time_match_a_pass_over_the_bins(
    idle_s: list[float], range_min: int
) -> None:
    h = IdleHistogram(range_min)
    for i, x in enumerate(idle_s):
        h.add(x)
        if i % 7 == 0 or i == len(idle_s) - 1:
            assert h.percentile_bins() == _reference_bins(idle_s[: i + 1], range_min)


def test_a_pattern_with_no_head_keeps_the_model_from_the_request_on() -> None:
    w = _hist([20.0] * 50 + [3 * MIN] * 10).windows()  # the 5th percentile is in bin 0
    assert w.pattern
    assert w.prewarm_s == 0.0
    assert w.keepalive_s == pytest.approx(4 * MIN * 1.1)


# ------------------------------------------------------------------ the fallbacks


def test_fewer_than_10_idle_times_fall_back_to_keep_alive_for_the_range() -> None:
    nine = _hist([30 * MIN] * 9).windows()
    assert not nine.pattern
    assert (nine.prewarm_s, nine.keepalive_s) == (0.0, RANGE_S)
    assert "fewer than 10" in nine.why
    assert _hist([30 * MIN] * 10).windows().pattern


def test_bin_counts_cv_below_2_falls_back() -> None:
    # k of 240 bins equally filled: CV = sqrt(240/k - 1), 2 at k = 48, below 2 from k = 49.
    def spread(k: int) -> IdleHistogram:
        return _hist([(b + 0.5) * MIN for b in range(k)] * 3)

    assert spread(48).cv() == pytest.approx(2.0)
    assert spread(48).windows().pattern
    flat = spread(49).windows()
    assert spread(49).cv() < 2.0
    assert not flat.pattern
    assert (flat.prewarm_s, flat.keepalive_s) == (0.0, RANGE_S)
    assert "CV" in flat.why


def test_mostly_out_of_bounds_falls_back_and_half_does_not() -> None:
    beyond = 5 * 3600.0  # past the 4-hour range
    most = _hist([30 * MIN] * 5 + [beyond] * 6).windows()
    assert not most.pattern
    assert (most.prewarm_s, most.keepalive_s) == (0.0, RANGE_S)
    assert "beyond the range" in most.why
    half = _hist([30 * MIN] * 5 + [beyond] * 5)
    assert half.out_of_bounds_share() == 0.5
    assert half.windows().pattern


def test_the_range_is_the_knob() -> None:
    h = _hist([90 * MIN] * 20, range_min=60)  # every idle time beyond a 1-hour range
    assert h.out_of_bounds == 20
    assert (h.windows().prewarm_s, h.windows().keepalive_s) == (0.0, 60 * MIN)
    policy = make_policy("histogram:60")
    assert isinstance(policy, HistogramPolicy)
    assert policy.range_min == 60
    assert policy.name == "histogram:60"
    assert make_policy("histogram").range_min == 240  # type: ignore[attr-defined]
    for bad in ("histogram:0", "histogram:1.5", "histogram:x"):
        with pytest.raises(InvalidInput):
            make_policy(bad)


# ------------------------------------------------------------------ the policy's orders


def _periodic(model: str, period_s: float, n: int, end: float = DAY0) -> tuple[list[float], list[str]]:
    ts = [end - period_s * (n - i) for i in range(n)]
    return ts, [model] * n


def test_after_a_request_a_patterned_model_is_unloaded_then_prewarmed_then_kept_to_the_tail() -> None:
    ts, ms = _periodic("timer", 30 * MIN, 48)
    policy = HistogramPolicy()
    policy.prepare(_context(_requests(ts, ms), "timer"))
    assert policy.histogram("timer").observed == 47
    at = DAY0  # the first simulated request, on the timer: 30 minutes after the last one
    unload, load, drop = policy.on_request("timer", at, "unlimited")
    assert (unload.action, unload.tier, unload.not_before) == (OrderAction.EVICT, Tier.L0, at)
    assert (load.action, load.tier) == (OrderAction.PREFETCH, Tier.L0)
    assert load.not_before == pytest.approx(at + 30 * MIN * 0.9)
    assert (drop.action, drop.tier) == (OrderAction.EVICT, Tier.L0)
    assert drop.not_before == pytest.approx(at + 31 * MIN * 1.1)
    assert {o.node for o in (unload, load, drop)} == {"unlimited"}


def test_on_a_cluster_unloading_demotes_to_host_memory_once_the_request_is_served() -> None:
    ts, ms = _periodic("timer", 30 * MIN, 48)
    policy = HistogramPolicy()
    policy.prepare(_context(_requests(ts, ms), "timer", unlimited=False))
    # No plan of the policy's own had it in GPU memory: the request waits for a load (10 GB from object
    # storage, a bound), and a copy in flight cannot be demoted — the unload comes when it is in.
    unload, load, drop = policy.on_request("timer", DAY0, "n1")
    assert (unload.action, unload.tier) == (drop.action, drop.tier) == (OrderAction.DEMOTE, Tier.L1)
    assert (load.action, load.tier, load.node) == (OrderAction.PREFETCH, Tier.L0, "n1")
    load_s = 10 * GB / 1e9 + 10 * GB / 7e9 + 10 * GB / 50e9 + 3 * 0.5
    assert unload.not_before == pytest.approx(DAY0 + load_s)
    # The next one on the timer finds the pre-warmed copy: unloaded right after it.
    unload, _ = policy.on_request("timer", DAY0 + 30 * MIN, "n1")  # its tail moves the timer on
    assert unload.not_before == DAY0 + 30 * MIN


def test_a_later_request_supersedes_the_earlier_plan() -> None:
    ts, ms = _periodic("timer", 30 * MIN, 48)
    policy = HistogramPolicy()
    policy.prepare(_context(_requests(ts, ms), "timer"))
    first = policy.on_request("timer", DAY0 + 10, "unlimited")
    second = policy.on_request("timer", DAY0 + 20 * MIN, "unlimited")  # early: re-plans
    assert not any(policy.still_wanted(o, o.not_before) for o in first)
    assert all(policy.still_wanted(o, o.not_before) for o in second)


def test_a_memoryless_model_falls_back_to_keep_alive_for_the_range() -> None:
    rng = np.random.default_rng(11)
    gaps = rng.exponential(40 * MIN, 200)
    ts = list(DAY0 - np.cumsum(gaps)[::-1])
    policy = HistogramPolicy()
    policy.prepare(_context(_requests(ts, ["poisson"] * len(ts)), "poisson"))
    w = policy.histogram("poisson").windows()
    assert not w.pattern
    assert "CV" in w.why
    (keep,) = policy.on_request("poisson", DAY0 + 60, "unlimited")
    assert keep.action is OrderAction.EVICT
    assert keep.not_before == pytest.approx(DAY0 + 60 + RANGE_S)


def test_history_is_learned_per_model_and_warm_up_requests_are_not_counted_twice() -> None:
    a_ts, a_ms = _periodic("a", 30 * MIN, 20)
    b_ts, b_ms = _periodic("b", 7 * MIN, 50)
    policy = HistogramPolicy()
    policy.prepare(_context(_requests(a_ts + b_ts, a_ms + b_ms), "a", "b"))
    assert policy.histogram("a").observed == 19
    assert policy.histogram("b").observed == 49
    assert int(policy.histogram("b").counts[7]) == 49
    policy.on_request("a", a_ts[-1], "unlimited")  # the warm-up replays the training span's end
    assert policy.histogram("a").observed == 19
    policy.on_request("a", DAY0 + 5 * MIN, "unlimited")  # the first simulated request: learned online
    assert policy.histogram("a").observed == 20
    assert int(policy.histogram("a").counts[35]) == 1  # 30 min + the 5 min after the cut


def test_models_outside_the_catalog_get_no_orders() -> None:
    policy = HistogramPolicy()
    policy.prepare(_context(_requests([], []), "a"))
    assert policy.on_request("unknown", DAY0, "unlimited") == []


# ------------------------------------------------------------------ in the simulator, --unlimited


def _events(ts: np.ndarray, model: str) -> pd.DataFrame:
    return pd.DataFrame({"timestamp": np.sort(ts), "model": model})


def _unlimited(events: pd.DataFrame, model: str, labels: list[str]) -> dict[str, dict[str, Any]]:
    start = DAY0 + 7 * 86400  # a week of training, then a day simulated
    results = run_policies(
        events, _catalog(model), None, labels, start=start, end=start + 86400, unlimited=True
    )
    return {label: m.to_json() for label, m in results.items()}


def test_a_timer_model_is_prewarmed_with_no_cold_start_and_far_less_idle_memory_than_keepalive() -> None:
    rng = np.random.default_rng(5)
    beats = DAY0 + 30 * MIN * np.arange(8 * 48) + rng.uniform(-30, 30, 8 * 48)  # every 30 min, ±30 s
    out = _unlimited(_events(beats, "timer"), "timer", ["histogram", "keepalive:600"])
    histogram, keepalive = out["histogram"], out["keepalive:600"]
    assert histogram["requests"] == keepalive["requests"] == 48
    assert histogram["cold_starts"] == 0
    assert keepalive["cold_starts"] == 48  # a 10-minute keep-alive never sees the next beat
    # Pre-warmed 27 min after each beat (p5 bin 29 min, less 10%), idle ~4 min a beat instead of 10.
    assert histogram["idle_gb_minutes"]["L0"] < 0.5 * keepalive["idle_gb_minutes"]["L0"]
    assert set(histogram["idle_gb_minutes"]) == {"L0"}


def test_a_memoryless_model_is_kept_alive_for_the_range_as_the_closed_form_says() -> None:
    rng = np.random.default_rng(8)
    arrivals = DAY0 + np.cumsum(rng.exponential(60 * MIN, 8 * 24 * 3))
    arrivals = arrivals[arrivals < DAY0 + 8 * 86400]
    start, end = DAY0 + 7 * 86400, DAY0 + 8 * 86400
    out = _unlimited(_events(arrivals, "poisson"), "poisson", ["histogram"])["histogram"]
    # Keep-alive for the 4-hour range after every request: resident from each request until the next
    # one or 4 hours later, whichever is first; cold when the last request was more than 4 hours ago.
    before = arrivals[arrivals < start][-1]
    window = arrivals[(arrivals >= start) & (arrivals < end)]
    times = np.r_[before, window]
    held_until = np.minimum(np.r_[times[1:], end], times + RANGE_S)
    resident_s = np.clip(held_until, start, end) - np.clip(times, start, end)
    assert out["requests"] == window.size > 10
    assert out["cold_starts"] == int((np.diff(times) > RANGE_S).sum())
    assert out["idle_gb_minutes"]["L0"] == pytest.approx(resident_s.sum() * 10 / 60)
