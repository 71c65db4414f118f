"""Priorities on a link: a demand load (a request is waiting) pre-empts prefetch transfers.

Every transfer on a link (``L3->L2``, ``L2->L1``, ``L1->L0``) is driven chunk by chunk, and its driver
calls ``checkpoint`` before issuing the next chunk. A prefetch's checkpoint blocks while any demand
transfer is active on the same link, so the link's bandwidth goes to the waiting request; the prefetch
resumes where it stopped once the demands are done. Checkpoints sit in the driver, never in the worker
threads, so a paused prefetch holds no worker that a demand transfer needs.

A prefetch becomes a demand transfer mid-way when a request starts waiting for the same model
(``is_demand`` is re-read at each checkpoint).

A gate also keeps the seconds its link has carried at least one demand transfer (``busy_s``), which the
node reports as ``ExecutorState.link_demand_busy``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from executor import _metrics

__all__ = ["LinkGate", "Transfer"]


class Transfer:
    def __init__(self, gate: LinkGate, is_demand: Callable[[], bool]) -> None:
        self._gate = gate
        self._is_demand = is_demand
        self.registered = False

    def checkpoint(self) -> None:
        """Return when this transfer may issue its next chunk."""
        self._gate._checkpoint(self)

    @property
    def demand(self) -> bool:
        return self._is_demand()


class LinkGate:
    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._demands = 0
        self._clock = clock
        self._busy = 0.0  # seconds with a demand transfer on, up to ``_since`` while one is
        self._since = 0.0

    def busy_s(self) -> float:
        """Seconds so far, up to now, that a demand transfer was on this link."""
        with self._cond:
            return self._busy + (self._clock() - self._since if self._demands else 0.0)

    @contextlib.contextmanager
    def transfer(self, is_demand: Callable[[], bool]) -> Iterator[Transfer]:
        transfer = Transfer(self, is_demand)
        if transfer.demand:
            self._register(transfer)
        try:
            yield transfer
        finally:
            if transfer.registered:
                with self._cond:
                    self._demands -= 1
                    if not self._demands:
                        spell = self._clock() - self._since
                        self._busy += spell
                        _metrics.DEMAND_BUSY.labels(self.name).inc(spell)
                    self._cond.notify_all()

    def _register(self, transfer: Transfer) -> None:
        with self._cond:
            if not self._demands:
                self._since = self._clock()
            self._demands += 1
            transfer.registered = True

    def _checkpoint(self, transfer: Transfer) -> None:
        if transfer.registered:
            return
        if transfer.demand:
            self._register(transfer)
            return
        with self._cond:
            if not self._demands:
                return
            _metrics.PREEMPTIONS.labels(self.name).inc()
            # Re-check is_demand now and then: a request may start waiting for this very model.
            while self._demands and not transfer.demand:
                self._cond.wait(0.05)
        if transfer.demand:
            self._register(transfer)
