"""Prometheus metrics of the ingest consumer (incremented only after a batch has committed).

prewarm_ingest_records_total                 records read and committed (good, too late and dead)
prewarm_ingest_events_total                  events counted into the store (on time and late)
prewarm_ingest_late_counted_total            of those, events more than lateness_s behind the watermark
prewarm_ingest_too_late_total                events more than max_lateness_s behind: not stored
prewarm_ingest_lateness_seconds{outcome}     how far behind the watermark each late event was
                                             (outcome: counted | too_late)
prewarm_ingest_dead_letters_total{reason}    events sent to the dead-letter topic
prewarm_ingest_offset_conflicts_total        batches rolled back because another consumer moved on
prewarm_ingest_commit_seconds                time to flush dead letters and commit one batch
prewarm_ingest_lag_records{topic,partition}  log-end offset minus committed offset
prewarm_ingest_last_event_timestamp_seconds{model}  newest counted event time per model
prewarm_ingest_model_requests_total{model}   requests counted, per model
prewarm_ingest_cold_starts_total{model}      of those, requests the gateway logged as cold starts
                                             (served from L1 or farther, or with a load wait)
prewarm_ingest_request_wait_seconds_total{model}  seconds requests waited for a load (``wait_ms``)

``model`` is one of the process's first ``TOP_MODELS`` models or ``other`` (``prewarm.model_label``):
a label per model would be a series per model; per-model detail is the scheduler's API. For ``other``
the last-event gauge holds the newest time of any model folded into it.
"""

from __future__ import annotations

from collections.abc import Mapping

from prewarm import OTHER_MODELS, counter, gauge, histogram, model_label

from ._window import MinuteAggregator

__all__ = ["METRICS"]

# From the default on-time slack (10 min) to a spooling agent's backlog of days; the one-day bucket is
# the default bound, so what lies above it is what was refused.
_HOUR = 3600
_LATENESS_BUCKETS_S = (
    60,
    300,
    600,
    1800,
    _HOUR,
    3 * _HOUR,
    6 * _HOUR,
    12 * _HOUR,
    24 * _HOUR,
    48 * _HOUR,
    168 * _HOUR,
)


class _IngestMetrics:
    def __init__(self) -> None:
        self.records = counter("prewarm_ingest_records_total", "Records read and committed.")
        self.events = counter("prewarm_ingest_events_total", "Events counted into the demand store.")
        self.late = counter("prewarm_ingest_late_counted_total", "Late events counted into their own minute.")
        self.too_late = counter(
            "prewarm_ingest_too_late_total", "Events later than max_lateness_s, counted but not stored."
        )
        self.lateness = histogram(
            "prewarm_ingest_lateness_seconds",
            "How far behind its partition's watermark a late event was.",
            ["outcome"],
            buckets=_LATENESS_BUCKETS_S,
        )
        self.dead = counter("prewarm_ingest_dead_letters_total", "Events dead-lettered.", ["reason"])
        self.conflicts = counter("prewarm_ingest_offset_conflicts_total", "Batches rolled back on conflict.")
        self.commit = histogram(
            "prewarm_ingest_commit_seconds",
            "Dead-letter flush and store commit of one batch.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.lag = gauge(
            "prewarm_ingest_lag_records", "Log-end minus committed offset.", ["topic", "partition"]
        )
        self.last_event = gauge(
            "prewarm_ingest_last_event_timestamp_seconds", "Newest counted event time.", ["model"]
        )
        self.model_requests = counter(
            "prewarm_ingest_model_requests_total", "Requests counted, by model (top models).", ["model"]
        )
        self.cold_starts = counter(
            "prewarm_ingest_cold_starts_total",
            "Requests logged as cold starts, by model (top models).",
            ["model"],
        )
        self.wait = counter(
            "prewarm_ingest_request_wait_seconds_total",
            "Seconds requests waited for a load, by model (top models).",
            ["model"],
        )
        self._other_newest = 0.0

    def committed(self, agg: MinuteAggregator, dead: Mapping[str, int], seconds: float) -> None:
        self.records.inc(agg.counted + agg.too_late + sum(dead.values()))
        self.events.inc(agg.counted)
        self.late.inc(agg.late)
        self.too_late.inc(agg.too_late)
        for outcome, behind in (("counted", agg.late_behind_s), ("too_late", agg.too_late_behind_s)):
            if behind:
                observe = self.lateness.labels(outcome=outcome).observe
                for seconds_behind in behind:
                    observe(seconds_behind)
        for reason, n in dead.items():
            self.dead.labels(reason=reason).inc(n)
        self.commit.observe(seconds)
        for model, ts_ms in agg.last_seen_ms.items():
            label = model_label(model)
            if label == OTHER_MODELS:
                # Many models share this sample: it keeps the newest time of any of them.
                self._other_newest = max(self._other_newest, ts_ms / 1000.0)
                self.last_event.labels(model=label).set(self._other_newest)
            else:
                self.last_event.labels(model=label).set(ts_ms / 1000.0)
        per_model: dict[str, list[float]] = {}
        for (model, _minute), cell in agg.cells.items():
            sums = per_model.setdefault(model_label(model), [0, 0, 0.0])
            sums[0] += cell.requests
            sums[1] += cell.cold_starts
            sums[2] += cell.wait_ms
        for label, (requests, cold, wait_ms) in per_model.items():
            self.model_requests.labels(model=label).inc(requests)
            if cold:
                self.cold_starts.labels(model=label).inc(cold)
            if wait_ms:
                self.wait.labels(model=label).inc(wait_ms / 1000.0)


METRICS = _IngestMetrics()
