"""Recent demand as the planner sees it: a model requested within ``demand_window_s`` is wanted now.

A request is probably waiting for such a model, so it becomes a demand hint. A pure function of what
the demand store returned, so the runtime's I/O stays in one call. (The forecast from recent demand,
for models no trained forecaster covers, is the forecaster's: ``forecaster.recent_rate_forecasts``.)
"""

from __future__ import annotations

from collections.abc import Mapping

from prewarm import DEMAND_SOURCE, Hint

__all__ = ["demand_hints"]


def demand_hints(last_requests: Mapping[str, float], now: float, window_s: float) -> list[Hint]:
    """A demand hint for each model requested in the last ``window_s`` seconds."""
    hints = []
    for model, ts in sorted(last_requests.items()):
        if 0 <= now - ts <= window_s:
            hints.append(
                Hint(model=model, eta_s=0.0, ttl_s=window_s, source=DEMAND_SOURCE, received_at=min(ts, now))
            )
    return hints
