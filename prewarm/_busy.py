"""How busy a link is with loads a request waits on, as the executor and the simulator both report it.

A link knows the running total of seconds it has spent carrying at least one demand transfer (a load a
request is waiting on). ``BusyShare`` turns that total into the share of recent time it was busy so: an
exponentially weighted mean of the 0/1 "a demand transfer is on the link" signal, with a time constant
of ``window_s``. Fed the total whenever a report is built, it is exact for any spacing of the reports.
"""

from __future__ import annotations

import math

__all__ = ["BusyShare"]

DEMAND_BUSY_WINDOW_S = 600.0
"""The time constant of ``ExecutorState.link_demand_busy``: about the last ten minutes."""


class BusyShare:
    """The share of about the last ``window_s`` seconds a link spent busy, from its running busy total."""

    def __init__(self, window_s: float = DEMAND_BUSY_WINDOW_S) -> None:
        self.window_s = window_s
        self.share = 0.0
        self._at: float | None = None
        self._total = 0.0

    def update(self, busy_total_s: float, now: float) -> float:
        """The share at ``now``, given the link's busy seconds so far (``busy_total_s``, never falling).
        The first call starts the record: no history reads as idle."""
        if self._at is None:
            self._at, self._total = now, busy_total_s
            return self.share
        elapsed = now - self._at
        if elapsed <= 0:
            return self.share
        busy = min(max((busy_total_s - self._total) / elapsed, 0.0), 1.0)
        decay = math.exp(-elapsed / self.window_s)
        self.share = self.share * decay + busy * (1.0 - decay)
        self._at, self._total = now, busy_total_s
        return self.share
