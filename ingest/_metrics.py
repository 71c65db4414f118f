"""Prometheus metrics of the ingest consumer (incremented only after a batch has committed).

prewarm_ingest_records_total                 records read and committed (good, late and dead)
prewarm_ingest_events_total                  events counted into the store
prewarm_ingest_late_dropped_total            events older than the partition watermark - lateness
prewarm_ingest_dead_letters_total{reason}    events sent to the dead-letter topic
prewarm_ingest_offset_conflicts_total        batches rolled back because another consumer moved on
prewarm_ingest_commit_seconds                time to flush dead letters and commit one batch
prewarm_ingest_lag_records{topic,partition}  log-end offset minus committed offset
prewarm_ingest_last_event_timestamp_seconds{model}  newest counted event time per model
"""

from __future__ import annotations

from collections.abc import Mapping

from prewarm import counter, gauge, histogram

from ._window import MinuteAggregator

__all__ = ["METRICS"]


class _IngestMetrics:
    def __init__(self) -> None:
        self.records = counter("prewarm_ingest_records_total", "Records read and committed.")
        self.events = counter("prewarm_ingest_events_total", "Events counted into the demand store.")
        self.late = counter("prewarm_ingest_late_dropped_total", "Late events dropped.")
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

    def committed(self, agg: MinuteAggregator, dead: Mapping[str, int], seconds: float) -> None:
        self.records.inc(agg.counted + agg.late + sum(dead.values()))
        self.events.inc(agg.counted)
        self.late.inc(agg.late)
        for reason, n in dead.items():
            self.dead.labels(reason=reason).inc(n)
        self.commit.observe(seconds)
        for model, ts_ms in agg.last_seen_ms.items():
            self.last_event.labels(model=model).set(ts_ms / 1000.0)


METRICS = _IngestMetrics()
