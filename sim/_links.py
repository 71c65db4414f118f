"""The virtual clock and the links bytes move over.

``Clock`` is one heap of timed callbacks: the driver's ticks and due orders, and the links' transfer
completions, run in time order (ties in the order they were scheduled). Nothing in the simulator reads
a real clock.

A ``Link`` is processor-shared: the n transfers on it each get rate / n, and finish times are worked out
again whenever a transfer starts or ends. Demand transfers (a request is waiting) take priority: while
one is on the link, speculative ones are paused and the demand ones share the whole rate, as the design
says demand loads pre-empt speculative prefetches on the same link.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Clock", "Link", "Transfer"]


class Clock:
    """Virtual time and what is due when."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = itertools.count()

    def at(self, when: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        heapq.heappush(self.heap, (when, next(self._seq), fn, arg))

    def next_at(self) -> float:
        return self.heap[0][0] if self.heap else float("inf")

    def run_until(self, t: float) -> None:
        """Run every callback due at or before ``t``; the clock then reads ``t``."""
        heap, pop = self.heap, heapq.heappop
        while heap and heap[0][0] <= t:
            when, _, fn, arg = pop(heap)
            if when > self.now:
                self.now = when
            fn(arg)
        if t > self.now:
            self.now = t

    def step(self) -> bool:
        """Run the next callback, whenever it is due; False when nothing is scheduled."""
        if not self.heap:
            return False
        when, _, fn, arg = heapq.heappop(self.heap)
        self.now = max(self.now, when)
        fn(arg)
        return True


class Transfer(Protocol):
    """What a link needs of a transfer: its bytes still to move, whether a request waits on it, and
    what to call when it is done."""

    left: float
    demand: bool

    def landed(self) -> None: ...


class Link:
    """One direction of bytes on one node (``L3->L2``, ``L2->L1`` or ``L1->L0``)."""

    def __init__(self, clock: Clock, name: str, rate: float) -> None:
        self.clock = clock
        self.name = name
        self.rate = rate
        self.active: list[Transfer] = []
        self._last = clock.now
        self._version = 0
        # Seconds so far with a demand transfer on the link (``busy_s``), what the node reports from.
        self._busy = 0.0

    def _share(self) -> tuple[float, bool]:
        """Rate each moving transfer gets, and whether only demand transfers move."""
        active = self.active
        if len(active) == 1:  # the common case, without counting
            return self.rate, active[0].demand
        demand = sum(1 for t in active if t.demand)
        if demand:
            return self.rate / demand, True
        return (self.rate / len(active) if active else 0.0), False

    def progress(self) -> None:
        """Move every transfer on by what the shares gave it since the last change."""
        now = self.clock.now
        elapsed = now - self._last
        self._last = now
        if elapsed <= 0 or not self.active:
            return
        share, demand_only = self._share()
        if demand_only:
            self._busy += elapsed
        moved = share * elapsed
        for t in self.active:
            if t.demand or not demand_only:
                t.left -= moved

    def left(self, transfer: Transfer) -> float:
        """Bytes ``transfer`` (on this link) still has to move now, without moving anything on."""
        share, demand_only = self._share()
        moving = transfer.demand or not demand_only
        return max(transfer.left - share * (self.clock.now - self._last), 0.0) if moving else transfer.left

    def busy_s(self) -> float:
        """Seconds so far, up to now, that the link carried at least one demand transfer."""
        if self.active and self._share()[1]:
            return self._busy + self.clock.now - self._last
        return self._busy

    def add(self, transfer: Transfer) -> None:
        self.progress()
        self.active.append(transfer)
        self._reschedule()

    def changed(self) -> None:
        """A transfer became demand (``progress`` was called before it did): shares change from now."""
        self._reschedule()

    def _reschedule(self) -> None:
        self._version += 1
        active = self.active
        if len(active) == 1:  # the common case: the one transfer moves at the full rate
            self.clock.at(self.clock.now + max(active[0].left, 0.0) / self.rate, self._due, self._version)
            return
        if not active:
            return
        share, demand_only = self._share()
        moving = [t.left for t in self.active if t.demand or not demand_only]
        self.clock.at(self.clock.now + max(min(moving), 0.0) / share, self._due, self._version)

    def _due(self, version: int) -> None:
        if version != self._version:
            return  # shares changed since this finish time was worked out
        self.progress()
        # A transfer is done within a microsecond of the link's full rate: finish times are recomputed
        # from epoch-second floats, which carry about 0.2 µs of rounding. Far on (a backlog of years on a
        # link of a few bytes a second), one step of the clock's float is more than that: what rounding
        # leaves there could never move, and its finish time would round to now again, forever.
        slack = self.rate * max(1e-6, 2.0 * math.ulp(self.clock.now))
        done = [t for t in self.active if t.left <= slack]
        if done:  # else (rounding left a few bytes) the list stays as it is
            self.active = [t for t in self.active if t.left > slack]
        self._reschedule()
        for t in done:
            t.landed()
