"""Where a consumer group stands: what it counted (from the store) and how far behind the log it is.

The counts and offsets come from the demand store alone; only the lag needs the broker's log-end
offsets. Without a broker the report still has everything else and says why the lag is unknown.

``late_counted`` events are part of ``events`` (stored in their own minute, late); ``too_late`` ones
were not stored. A store written before late events were counted holds ``late_dropped``: those events
were refused the same way, so they are reported as too late.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingest._consumer import DEAD_LETTERED
from ingest._kafka import end_offsets
from ingest._store import DemandStore, StoredOffset
from prewarm import BrokerError, KafkaSettings

__all__ = ["IngestStats", "consumer_lag", "ingest_stats"]

# The counter of events refused as late by consumers that dropped everything past ``lateness_s``.
_DROPPED_BEFORE = "late_dropped"


def consumer_lag(committed: Mapping[int, StoredOffset], ends: Mapping[int, int]) -> dict[int, int]:
    """Records of each partition the group has not committed yet, by partition.

    A partition the group never committed counts from offset 0; a log-end behind the committed offset
    (a topic recreated under the group) is lag 0, not negative.
    """
    return {
        partition: max(end - (committed[partition].next_offset if partition in committed else 0), 0)
        for partition, end in sorted(ends.items())
    }


@dataclass(frozen=True)
class IngestStats:
    """What ``prewarm ingest stats`` prints. ``lag`` is None per partition when the broker was unreachable
    (``lag_error`` says why)."""

    group: str
    topic: str
    records: int
    events: int
    late_counted: int
    too_late: int
    dead_lettered: dict[str, int]
    committed_offsets: dict[int, int]
    lag: dict[int, int | None]
    last_event: dict[str, float]
    lag_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "group": self.group,
            "topic": self.topic,
            "records": self.records,
            "events": self.events,
            "late_counted": self.late_counted,
            "too_late": self.too_late,
            "dead_lettered": dict(self.dead_lettered),
            "committed_offsets": {str(p): o for p, o in self.committed_offsets.items()},
            "lag": {str(p): n for p, n in self.lag.items()},
            "last_event": dict(self.last_event),
        }
        if self.lag_error:
            payload["lag_error"] = self.lag_error
        return payload


def ingest_stats(
    store: DemandStore, kafka: KafkaSettings, group: str, topic: str, *, timeout_s: float = 5.0
) -> IngestStats:
    """The counters, offsets and last event times of ``group`` on ``topic``, and its lag per partition."""
    counters = store.counters(group)
    committed = store.load_offsets(group, topic)
    last = store.last_requests()
    lag: dict[int, int | None]
    lag_error = None
    try:
        lag = dict(consumer_lag(committed, end_offsets(kafka, topic, timeout_s=timeout_s)))
    except BrokerError as exc:
        lag_error = str(exc)
        lag = {p: None for p in sorted(committed)}
    return IngestStats(
        group=group,
        topic=topic,
        records=counters.get("records", 0),
        events=counters.get("events", 0),
        late_counted=counters.get("late_counted", 0),
        too_late=counters.get("too_late", 0) + counters.get(_DROPPED_BEFORE, 0),
        dead_lettered={
            name.removeprefix(DEAD_LETTERED): value
            for name, value in sorted(counters.items())
            if name.startswith(DEAD_LETTERED)
        },
        committed_offsets={p: o.next_offset for p, o in sorted(committed.items())},
        lag=lag,
        last_event=dict(sorted(last.items())),
        lag_error=lag_error,
    )
