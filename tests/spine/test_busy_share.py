from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prewarm import BusyShare


def test_a_link_with_no_history_reads_as_idle() -> None:
    assert BusyShare().update(1e6, now=1e6) == 0.0


@given(st.lists(st.floats(min_value=1.0, max_value=900.0), min_size=1, max_size=20))
def test_the_share_does_not_depend_on_how_often_it_is_read(gaps: list[float]) -> None:
    # Busy 40 % of the time, read after each gap: the same share as one read at the end.
    often, once = BusyShare(), BusyShare()
    often.update(0.0, 0.0)
    once.update(0.0, 0.0)
    now = 0.0
    for gap in gaps:
        now += gap
        often.update(0.4 * now, now)
    assert once.update(0.4 * now, now) == pytest.approx(often.share)
    assert often.share == pytest.approx(0.4 * (1 - math.exp(-now / 600)))


def test_a_link_busy_all_along_tends_to_one_and_recovers_when_idle() -> None:
    meter = BusyShare(window_s=600)
    meter.update(0.0, 0.0)
    assert meter.update(3600.0, 3600.0) == pytest.approx(1.0, abs=0.01)
    assert meter.update(3600.0, 3600.0 + 600) == pytest.approx(math.exp(-1), abs=0.01)
