"""The metrics that say whether prediction pays move as the things they count happen, and keep their
label sets bounded."""

from __future__ import annotations

import time

import numpy as np
from metrics_helpers import metric_delta, sample
from status_builders import GB, core, report

from executor._tier import TierCache
from forecaster import ModelForecast
from ingest import MinuteAggregator
from ingest._metrics import METRICS
from prewarm import OTHER_MODELS, OrderAction, OrderReason, Tier, TopLabels, model_label


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def cache(capacity: int, clock: Clock) -> TierCache[str, None]:
    return TierCache(Tier.L1, capacity, clock=clock, release=lambda key, value: None)


def loaded(tiers: TierCache[str, None], key: str, nbytes: int, *, prefetched: bool) -> None:
    tiers.reserve(key, nbytes, prefetched=prefetched)
    tiers.commit(key)


def prefetches(outcome: str) -> float:
    return sample("prewarm_executor_prefetches_total", {"tier": "L1", "outcome": outcome}) or 0.0


def test_a_prefetched_copy_used_later_is_a_hit_with_its_lead_and_idle_byte_seconds() -> None:
    clock = Clock()
    tiers = cache(10 * GB, clock)
    idle = metric_delta("prewarm_executor_prefetch_idle_bytes", {"tier": "L1"})
    byte_seconds = metric_delta("prewarm_executor_prefetch_idle_byte_seconds_total", {"tier": "L1"})
    leads = metric_delta("prewarm_executor_prefetch_lead_seconds_sum", {"tier": "L1"})
    hits = prefetches("hit")
    loaded(tiers, "chat", 2 * GB, prefetched=True)
    assert idle.delta == 2 * GB  # held for a prediction, unused
    clock.t += 90
    tiers.lookup("chat")  # the first request
    assert idle.delta == 0
    assert prefetches("hit") == hits + 1
    assert leads.delta == 90
    assert byte_seconds.delta == 2 * GB * 90
    tiers.lookup("chat")  # a second use is no second hit
    assert prefetches("hit") == hits + 1


def test_an_unused_prefetch_evicted_for_room_is_displaced_and_one_dropped_by_an_order_mispredicted() -> None:
    clock = Clock()
    tiers = cache(3 * GB, clock)
    displaced, mispredicted = prefetches("displaced"), prefetches("misprediction")
    loaded(tiers, "guess-a", 2 * GB, prefetched=True)
    loaded(tiers, "guess-b", GB, prefetched=True)
    clock.t += 10
    loaded(tiers, "wanted", 2 * GB, prefetched=False)  # a demand load takes guess-a's room
    assert prefetches("displaced") == displaced + 1
    tiers.evict("guess-b", "order")  # the scheduler's misprediction demotion
    assert prefetches("misprediction") == mispredicted + 1
    tiers.evict("wanted", "order")  # a copy that served requests is no prediction's outcome
    assert prefetches("misprediction") == mispredicted + 1


def test_tier_capacity_gauge_follows_the_budget() -> None:
    tiers = cache(5 * GB, Clock())
    assert sample("prewarm_executor_tier_capacity_bytes", {"tier": "L1"}) == 5 * GB
    tiers.capacity = 4 * GB  # L2 shrinks its budget as its filesystem fills
    assert sample("prewarm_executor_tier_capacity_bytes", {"tier": "L1"}) == 4 * GB


def test_labels_past_the_top_models_fold_into_other() -> None:
    labels = TopLabels(2)
    assert [labels(m) for m in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER_MODELS, "a", OTHER_MODELS]
    assert labels.admitted == {"a", "b"}


def test_request_log_cold_starts_and_wait_are_counted_per_model() -> None:
    agg = MinuteAggregator()
    now = time.time()
    ts = int(now * 1000)
    model = f"cold-{ts}"
    for cold, wait_ms in ((True, 1500.0), (True, 500.0), (False, 0.0)):
        agg.add_fields(model, ts, cold, wait_ms, None, now)
    label = model_label(model)  # the model itself while the process has room, else "other"
    with (
        metric_delta("prewarm_ingest_cold_starts_total", {"model": label}) as cold_starts,
        metric_delta("prewarm_ingest_model_requests_total", {"model": label}) as requests,
        metric_delta("prewarm_ingest_request_wait_seconds_total", {"model": label}) as waited,
    ):
        METRICS.committed(agg, {}, 0.01)
    assert cold_starts.delta == 2
    assert requests.delta == 3
    assert waited.delta == 2.0


def test_the_scheduler_exports_each_node_s_report_age_tier_fill_and_idle_prefetch_bytes() -> None:
    scheduler, _ = core()
    at = time.time()
    scheduler.observe(report(at))
    assert sample("prewarm_scheduler_executor_last_report_timestamp_seconds", {"node": "gpu-a"}) == at
    l1 = {"node": "gpu-a", "tier": "L1"}
    assert sample("prewarm_scheduler_node_tier_used_bytes", l1) == 2 * GB
    assert sample("prewarm_scheduler_node_tier_capacity_bytes", l1) == 200 * GB
    assert sample("prewarm_scheduler_node_prefetch_idle_bytes", l1) == 2 * GB
    assert sample("prewarm_scheduler_node_prefetch_idle_bytes", {"node": "gpu-a", "tier": "L0"}) == 0


def test_a_forecast_prefetch_records_the_lead_it_was_planned_with() -> None:
    clock = Clock()
    scheduler, sent = core(clock)
    # chat-7b is surely wanted from 20 minutes on: a prefetch ordered to land before then, handed out by
    # a round shortly before it is due (the rounds before plan it without committing to it).
    buckets = 12
    expected = np.array([0.0, 0.0] + [50.0] * (buckets - 2))
    p_any = np.array([0.0, 0.0] + [0.999] * (buckets - 2))
    forecast = ModelForecast("chat-7b", clock.t, 600, expected, p_any, "test")
    scheduler.set_signals(forecasts={"chat-7b": forecast})
    assert scheduler.replan() == []
    clock.t += 18 * 60
    with (
        metric_delta(
            "prewarm_scheduler_prefetch_planned_lead_seconds_count", {"reason": "forecast"}
        ) as count,
        metric_delta("prewarm_scheduler_prefetch_planned_lead_seconds_sum", {"reason": "forecast"}) as total,
    ):
        orders = scheduler.replan()
    prefetches = [o for o in orders if o.reason is OrderReason.FORECAST and o.action is OrderAction.PREFETCH]
    assert prefetches, sent
    assert count.delta == len(prefetches)
    # The lead is how long before the predicted demand (20 to 120 minutes out) the copy is due.
    assert 0 <= total.delta / count.delta <= 7200
