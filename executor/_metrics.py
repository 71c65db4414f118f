"""The executor's Prometheus metrics (names documented here, registered once in prewarm's registry).

- ``prewarm_executor_hop_bytes_total{hop}``: bytes moved per hop (``L3->L2``, ``L3->L1``, ``L3->L0``
  (overlapped), ``L2->L1``, ``L1->L0``, ``L2->L0`` (overlapped or staged), ``L0->L1``, ``L1->L2`` and
  ``L0->L2`` (demotions)).
- ``prewarm_executor_hop_seconds_total{hop}``: seconds spent moving them; bytes / seconds is the rate.
- ``prewarm_executor_hits_total{tier}``: ``ensure`` calls served from a tier (``L3`` = fetched).
- ``prewarm_executor_evictions_total{tier,reason}``: reasons are ``capacity`` (room for another load),
  ``ttl`` (prefetched, never used), ``stale`` (the catalog moved to another version), ``order`` (an evict
  or demote order, or ``Executor.evict``), ``integrity`` (a digest mismatch on read).
- ``prewarm_executor_tier_used_bytes{tier}``: bytes accounted per tier, reservations included.
- ``prewarm_executor_integrity_failures_total{tier}``: digest mismatches detected (then re-fetched).
- ``prewarm_executor_preemptions_total{link}``: times a prefetch paused for a demand load on a link.
- ``prewarm_executor_orders_total{action,status}``: orders applied, by outcome.
- ``prewarm_executor_l2_bypass_total{reason}``: loads that streamed L3 → L1/L0 without caching in L2,
  because L2 could not take the download: ``full`` (its budget cannot hold it: everything there in use,
  or the budget capped below the model's size), ``no_space``, ``quota``, ``io_error``, ``read_only``
  (the disk said ENOSPC, EDQUOT, EIO, EROFS) or ``unusable`` (the directory is gone or refused); or
  because L2 declined it: ``not_admitted`` (the copies it would evict served more requests × bytes lately).
- ``prewarm_executor_l1_bypass_total{reason}``: loads to L0 (on CUDA) that went through the staging ring
  without a copy in L1: ``full`` (L1 cannot hold the model now) or ``not_admitted`` (the host copies it
  would evict served more requests × bytes lately).
- ``prewarm_executor_l2_budget_bytes{budget}``: ``configured``, and ``effective``: what L2 accounts
  against, the configured budget capped at what the filesystem can hold (free space plus the cache's own
  files).
- ``prewarm_executor_tier_capacity_bytes{tier}``: each tier's budget (L2: the effective one), so that
  ``used / capacity`` says how full a tier is.
- ``prewarm_executor_load_wait_seconds{tier,served_from}``: wait of ``POST /v1/load`` (a request waiting)
  until the model was in the tier asked for, by that tier and the tier it came from.
- ``prewarm_executor_cold_starts_total{model,served_from}``: loads of ``POST /v1/load`` that found the
  model farther than the tier asked for (the request waited for a copy); ``model`` is one of the
  process's first ``TOP_MODELS`` models or ``other``.
- ``prewarm_executor_cold_start_wait_seconds_total{model,served_from}``: the seconds those waited.
- ``prewarm_executor_prefetches_total{tier,outcome}``: what became of each speculative (prefetched) copy:
  ``hit`` (used before anything took it away), ``misprediction`` (dropped unused by an order, which is the
  scheduler's misprediction demotion, or by the executor's own prefetch TTL), ``displaced`` (evicted unused
  to make room for another load) or ``stale`` (dropped unused because the catalog moved to a new version).
- ``prewarm_executor_prefetch_idle_bytes{tier}``: bytes held now by prefetched copies nothing has used yet.
- ``prewarm_executor_prefetch_idle_byte_seconds_total{tier}``: bytes × seconds those copies were held
  unused, added when each one's idleness ends (first use or drop); / 1e9 is GB·s.
- ``prewarm_executor_prefetch_lead_seconds{tier}``: for each hit, how long the copy was ready before its
  first use (the lead time the prefetch achieved; the scheduler exports the lead it planned).
"""

from __future__ import annotations

from prewarm import counter, gauge, histogram

HOP_BYTES = counter("prewarm_executor_hop_bytes_total", "Bytes moved per hop.", ["hop"])
HOP_SECONDS = counter("prewarm_executor_hop_seconds_total", "Seconds spent moving bytes per hop.", ["hop"])
HITS = counter("prewarm_executor_hits_total", "Loads served from each tier.", ["tier"])
EVICTIONS = counter("prewarm_executor_evictions_total", "Evictions per tier and reason.", ["tier", "reason"])
TIER_USED = gauge("prewarm_executor_tier_used_bytes", "Bytes accounted per tier.", ["tier"])
INTEGRITY_FAILURES = counter(
    "prewarm_executor_integrity_failures_total", "Digest mismatches detected per tier.", ["tier"]
)
PREEMPTIONS = counter(
    "prewarm_executor_preemptions_total", "Prefetch transfers paused for a demand load.", ["link"]
)
ORDERS = counter(
    "prewarm_executor_orders_total", "Orders applied, by action and status.", ["action", "status"]
)
L2_BYPASS = counter(
    "prewarm_executor_l2_bypass_total", "Loads that streamed past L2 without caching, by reason.", ["reason"]
)
L1_BYPASS = counter(
    "prewarm_executor_l1_bypass_total",
    "Loads to L0 staged past L1 without a host copy, by reason.",
    ["reason"],
)
DEMAND_BUSY = counter(
    "prewarm_executor_link_demand_busy_seconds_total",
    "Seconds a link carried at least one load a request waited on (counted when the spell ends); its "
    "rate is the share of time requests keep the link busy, which the planner prices downloads by.",
    ["link"],
)
L2_BUDGET = gauge(
    "prewarm_executor_l2_budget_bytes",
    "The L2 budget: configured, and effective (capped at what the filesystem can hold).",
    ["budget"],
)
TIER_CAPACITY = gauge(
    "prewarm_executor_tier_capacity_bytes", "Budget of each tier (L2: effective).", ["tier"]
)
LOAD_WAIT = histogram(
    "prewarm_executor_load_wait_seconds",
    "Wait of POST /v1/load until the model was in the tier asked for, by that tier and where it came from.",
    ["tier", "served_from"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 180),
)
COLD_STARTS = counter(
    "prewarm_executor_cold_starts_total",
    "Requested loads that found the model farther than the tier asked for (top models, others 'other').",
    ["model", "served_from"],
)
COLD_START_WAIT = counter(
    "prewarm_executor_cold_start_wait_seconds_total",
    "Seconds requested loads waited for a copy, by model (top models) and tier served from.",
    ["model", "served_from"],
)
PREFETCHES = counter(
    "prewarm_executor_prefetches_total",
    "Prefetched copies by what became of them: hit, misprediction, displaced, stale.",
    ["tier", "outcome"],
)
PREFETCH_IDLE = gauge(
    "prewarm_executor_prefetch_idle_bytes", "Bytes held by prefetched copies not used yet.", ["tier"]
)
PREFETCH_IDLE_BYTE_SECONDS = counter(
    "prewarm_executor_prefetch_idle_byte_seconds_total",
    "Bytes x seconds prefetched copies were held before their first use or their drop.",
    ["tier"],
)
PREFETCH_LEAD = histogram(
    "prewarm_executor_prefetch_lead_seconds",
    "How long a prefetched copy was ready before its first use.",
    ["tier"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600),
)

# What an eviction of a copy nothing had used says about the prefetch that brought it.
_UNUSED_OUTCOME = {
    "order": "misprediction",
    "ttl": "misprediction",
    "capacity": "displaced",
    "stale": "stale",
}


def prefetch_ended(tier: str, nbytes: int, ready_at: float, now: float, dropped_for: str | None) -> None:
    """A prefetched, ready copy stops being idle: used (``dropped_for`` None) or dropped for that reason."""
    held = max(now - ready_at, 0.0)
    PREFETCH_IDLE.labels(tier).dec(nbytes)
    PREFETCH_IDLE_BYTE_SECONDS.labels(tier).inc(nbytes * held)
    if dropped_for is None:
        PREFETCHES.labels(tier, "hit").inc()
        PREFETCH_LEAD.labels(tier).observe(held)
    elif (outcome := _UNUSED_OUTCOME.get(dropped_for)) is not None:
        PREFETCHES.labels(tier, outcome).inc()
