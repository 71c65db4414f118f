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
  (the disk said ENOSPC, EDQUOT, EIO, EROFS) or ``unusable`` (the directory is gone or refused).
- ``prewarm_executor_l2_budget_bytes{budget}``: ``configured``, and ``effective``: what L2 accounts
  against, the configured budget capped at what the filesystem can hold (free space plus the cache's own
  files).
"""

from __future__ import annotations

from prewarm import counter, gauge

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
L2_BUDGET = gauge(
    "prewarm_executor_l2_budget_bytes",
    "The L2 budget: configured, and effective (capped at what the filesystem can hold).",
    ["budget"],
)
