"""The scheduler's Prometheus metrics that say whether prediction pays (names listed in docs/metrics.md).

Set from what the scheduler already holds: the executors' reports, the orders it hands out, the
forecaster it serves. Labels are nodes, tiers and outcomes, never models (a label per model is a series
per model; the API and the status page carry per-model detail).

- ``prewarm_scheduler_active``: 1 on the replica that holds the lease and plans, 0 on a standby.
- ``prewarm_scheduler_executor_last_report_timestamp_seconds{node}``: the ``at`` of each node's newest
  report (``time() -`` it is how long an executor has been silent).
- ``prewarm_scheduler_node_tier_used_bytes{node,tier}`` and ``..._capacity_bytes{node,tier}``: what each
  node's newest report says each tier holds and can hold.
- ``prewarm_scheduler_node_prefetch_idle_bytes{node,tier}``: of those, bytes of prefetched copies no
  request has used yet.
- ``prewarm_scheduler_prefetch_planned_lead_seconds{reason}``: for each speculative prefetch handed out,
  how long before the predicted demand its deadline puts the copy in place (the executor exports the
  lead achieved: ``prewarm_executor_prefetch_lead_seconds``).
- ``prewarm_scheduler_retrains_total{outcome}``: daily retrains this replica ran: ``promoted`` (the new
  forecaster is champion and served), ``kept_champion`` (it lost the comparison), ``unjudged`` (no
  registry: served as it is) or ``failed``.
- ``prewarm_scheduler_retrain_seconds``: how long the last retrain took.
- ``prewarm_scheduler_champion_brier_skill{against}``: backtest Brier skill of the forecaster being
  served, against the seasonal baseline (``baseline``) and the time-of-week profile (``time_of_week``);
  below 0 it forecasts worse than the baseline. Set whenever a forecaster is served (retrained here,
  or loaded from the registry after a retrain elsewhere).
- ``prewarm_scheduler_champion_trained_until_timestamp_seconds``: the end of the served forecaster's
  training data (old: the daily retrain has not landed).
"""

from __future__ import annotations

from typing import Any

from forecaster import ForecasterBundle
from prewarm import CACHE_TIERS, ExecutorState, Order, OrderAction, OrderReason, counter, gauge, histogram

__all__ = ["champion_served", "observed", "planned", "retrained", "set_active"]

ACTIVE = gauge("prewarm_scheduler_active", "1 on the replica that plans and publishes, 0 on a standby.")
LAST_REPORT = gauge(
    "prewarm_scheduler_executor_last_report_timestamp_seconds", "Time of each node's newest report.", ["node"]
)
TIER_USED = gauge(
    "prewarm_scheduler_node_tier_used_bytes", "Bytes each node's tiers hold, as reported.", ["node", "tier"]
)
TIER_CAPACITY = gauge(
    "prewarm_scheduler_node_tier_capacity_bytes",
    "Budget of each node's tiers, as reported.",
    ["node", "tier"],
)
TIER_IDLE = gauge(
    "prewarm_scheduler_node_prefetch_idle_bytes",
    "Bytes of prefetched copies not used yet, per node and tier, as reported.",
    ["node", "tier"],
)
PLANNED_LEAD = histogram(
    "prewarm_scheduler_prefetch_planned_lead_seconds",
    "How long before the predicted demand a speculative prefetch's deadline puts the copy in place.",
    ["reason"],
    buckets=(0, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600),
)
RETRAINS = counter("prewarm_scheduler_retrains_total", "Daily retrains run here, by outcome.", ["outcome"])
RETRAIN_SECONDS = gauge("prewarm_scheduler_retrain_seconds", "Duration of the last retrain run here.")
CHAMPION_SKILL = gauge(
    "prewarm_scheduler_champion_brier_skill",
    "Backtest Brier skill of the served forecaster (below 0: worse than the baseline).",
    ["against"],
)
CHAMPION_TRAINED_UNTIL = gauge(
    "prewarm_scheduler_champion_trained_until_timestamp_seconds",
    "End of the served forecaster's training data.",
)

# The backtest's aggregate keys (``forecaster.BacktestReport``) behind each ``against`` label.
_SKILLS = {"baseline": "brier_skill", "time_of_week": "brier_skill_vs_time_of_week"}
_SPECULATIVE = (OrderReason.FORECAST, OrderReason.HINT)


def set_active(active: bool) -> None:
    ACTIVE.set(1 if active else 0)


def observed(report: ExecutorState) -> None:
    """A node's newest report (older ones are not passed: the core keeps the newest)."""
    LAST_REPORT.labels(report.node).set(report.at)
    for tier in CACHE_TIERS:
        state = report.tier(tier)
        if state is None:
            continue
        TIER_USED.labels(report.node, tier.value).set(state.used_bytes)
        TIER_CAPACITY.labels(report.node, tier.value).set(state.capacity_bytes)
        idle = sum(r.bytes for r in state.resident if r.prefetched)
        TIER_IDLE.labels(report.node, tier.value).set(idle)


def planned(order: Order, predicted: float | None) -> None:
    """A new order, with the demand time its prefetch was planned for (None: not a forecast's)."""
    if order.action is OrderAction.PREFETCH and order.reason in _SPECULATIVE and predicted is not None:
        PLANNED_LEAD.labels(order.reason.value).observe(max(predicted - order.deadline, 0.0))


def retrained(outcome: str, seconds: float) -> None:
    RETRAINS.labels(outcome).inc()
    RETRAIN_SECONDS.set(seconds)


def champion_served(bundle: ForecasterBundle) -> None:
    """The forecaster now served: its backtest skill (kept in the bundle's summary) and its age."""
    summary: dict[str, Any] = bundle.summary
    for against, key in _SKILLS.items():
        value = summary.get(key)
        if isinstance(value, int | float):
            CHAMPION_SKILL.labels(against).set(float(value))
    CHAMPION_TRAINED_UNTIL.set(bundle.trained_until)
