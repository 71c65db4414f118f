"""Waiting for another thread or process: a condition polled against a deadline, never a bare sleep.

A test that sleeps "long enough" for a consumer to commit or a report to arrive is slow when the
machine is idle and flaky when it is busy. ``wait_for`` returns as soon as the condition holds and, when
it never does, fails with what the test was waiting for. Every test imports it from here (the tests
folder is on ``sys.path`` through its rootdir conftest).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_for"]


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> None:
    """Return once ``predicate()`` is truthy; raise ``AssertionError`` naming ``what`` after ``timeout`` s.

    The predicate is tried once more at the deadline, so a condition that becomes true during the last
    interval is not reported as a timeout.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)  # the poll interval, not an ordering guess: the predicate decides
    if not predicate():
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
