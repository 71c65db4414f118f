"""Event-time minute windows: pure aggregation of request events into per-(model, minute) counts.

Lateness is judged against a per-partition *watermark*, the newest event time already seen in that
partition, not against the wall clock: replaying last month's trace is not "late", but an event that
arrives behind the newest one in its partition is. The watermark is stored with the partition's offset,
so a consumer that restarts judges every event exactly as a consumer that never stopped would. Only the
"too far in the future" check uses ``now``, which is always passed in.

A late event is still counted, into its own minute: the store adds to any minute at any time, and
gateways that ship logs through a spooling agent deliver hours late after an outage. How far behind the
watermark an event is decides only how it is reported:

- up to ``lateness_s``: on time (ordinary reordering between gateways);
- up to ``max_lateness_s``: counted as a *late correction* of a minute readers may already have read
  (``MinuteAggregator.late``, and its lateness kept for the metric);
- further: *too late*, not stored, and counted as such (``too_late``). It is not a dead letter: the
  dead-letter topic is for messages that are malformed, and a too-late event is well formed.

When ``lateness_s`` is the larger of the two it wins: nothing it calls on time is ever refused.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from prewarm import RequestEvent

__all__ = ["Cell", "MinuteAggregator", "Verdict", "WindowPolicy", "aggregate", "minute_of"]

MINUTE_S = 60


def minute_of(ts_ms: int) -> int:
    """Epoch seconds of the start of the minute that holds ``ts_ms`` (epoch milliseconds)."""
    return (ts_ms // 60_000) * MINUTE_S


class Verdict(enum.Enum):
    COUNTED = "counted"  # on time: within lateness_s of the watermark (or ahead of it)
    LATE = "late"  # behind by more than lateness_s, up to max_lateness_s: counted into its own minute
    TOO_LATE = "too_late"  # behind by more than max_lateness_s: counted as too late, not stored
    FUTURE = "future"  # beyond now + tolerance: a dead letter


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    lateness_s: float = 600.0
    future_tolerance_s: float = 300.0
    max_lateness_s: float = 86_400.0


@dataclass(slots=True)
class Cell:
    """What one (model, minute) accumulates."""

    requests: int = 0
    cold_starts: int = 0
    wait_ms: float = 0.0


@dataclass(slots=True)
class MinuteAggregator:
    """Counts of one batch. The caller carries each partition's watermark (epoch ms) from call to call.

    ``counted`` is every event stored (on time and late); ``late`` is the part of it that came later
    than ``lateness_s``; ``too_late`` were not stored. ``late_behind_s`` and ``too_late_behind_s`` hold
    how far behind the watermark each of those was, for the lateness histogram.
    """

    policy: WindowPolicy = field(default_factory=WindowPolicy)
    cells: dict[tuple[str, int], Cell] = field(default_factory=dict)
    last_seen_ms: dict[str, int] = field(default_factory=dict)
    counted: int = 0
    late: int = 0
    too_late: int = 0
    late_behind_s: list[float] = field(default_factory=list)
    too_late_behind_s: list[float] = field(default_factory=list)

    def add(self, event: RequestEvent, watermark_ms: int | None, now: float) -> tuple[Verdict, int | None]:
        """Classify and count one event; returns the verdict and the partition's new watermark."""
        return self.add_fields(
            event.model, event.ts, event.cold_start, event.wait_ms or 0.0, watermark_ms, now
        )

    def add_fields(
        self, model: str, ts: int, cold: bool, wait_ms: float, watermark_ms: int | None, now: float
    ) -> tuple[Verdict, int | None]:
        """``add`` on the fields the window needs (the consumer's hot path skips the event object)."""
        if ts > (now + self.policy.future_tolerance_s) * 1000.0:
            return Verdict.FUTURE, watermark_ms  # the caller dead-letters it
        verdict = Verdict.COUNTED
        # One comparison on the hot path: only an event behind the on-time slack is looked at further.
        if watermark_ms is not None and ts < watermark_ms - self.policy.lateness_s * 1000.0:
            behind_s = (watermark_ms - ts) / 1000.0
            if behind_s > self.policy.max_lateness_s:
                self.too_late += 1
                self.too_late_behind_s.append(behind_s)
                return Verdict.TOO_LATE, watermark_ms
            self.late += 1
            self.late_behind_s.append(behind_s)
            verdict = Verdict.LATE
        key = (model, (ts // 60_000) * MINUTE_S)
        cell = self.cells.get(key)
        if cell is None:
            cell = self.cells[key] = Cell()
        cell.requests += 1
        if cold:
            cell.cold_starts += 1
        if wait_ms:
            cell.wait_ms += wait_ms
        seen = self.last_seen_ms.get(model)
        if seen is None or ts > seen:
            self.last_seen_ms[model] = ts
        self.counted += 1
        if watermark_ms is None or ts > watermark_ms:
            watermark_ms = ts
        return verdict, watermark_ms


def aggregate(
    events: Iterable[RequestEvent],
    *,
    now: float,
    watermark_ms: int | None = None,
    policy: WindowPolicy | None = None,
) -> tuple[MinuteAggregator, int | None]:
    """Aggregate events of one partition, in order; returns the counts and the final watermark."""
    agg = MinuteAggregator(policy or WindowPolicy())
    for event in events:
        _, watermark_ms = agg.add(event, watermark_ms, now)
    return agg, watermark_ms
