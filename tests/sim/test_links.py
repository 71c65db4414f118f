"""Links: processor-shared transfers on the virtual clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sim._links import Clock, Link


@dataclass
class _Transfer:
    left: float
    clock: Clock
    demand: bool = True
    landed_at: list[float] = field(default_factory=list)

    def landed(self) -> None:
        self.landed_at.append(self.clock.now)


def _run(clock: Clock, transfers: list[_Transfer], steps: int) -> None:
    for _ in range(steps):
        if all(t.landed_at for t in transfers) or not clock.step():
            return


def test_two_transfers_share_the_rate_and_the_second_then_gets_it_all() -> None:
    clock = Clock(1_700_000_000.0)
    link = Link(clock, "L2->L1", rate=10.0)
    small, large = _Transfer(10.0, clock), _Transfer(30.0, clock)
    link.add(small)
    link.add(large)
    _run(clock, [small, large], 10)
    assert small.landed_at == [pytest.approx(1_700_000_002.0)]  # 10 bytes at 5 B/s
    assert large.landed_at == [pytest.approx(1_700_000_004.0)]  # 20 more at 10 B/s


@pytest.mark.parametrize("size", [1000.3, 777.7, 12_345.678, 3.14159])
def test_a_transfer_lands_even_where_the_clock_is_too_far_on_to_tell_a_microsecond(size: float) -> None:
    # 1.5e11 s: one step of the clock's float is 3e-5 s, so the bytes rounding leaves at a 1 B/s link
    # could never move; the link once rescheduled them at the same instant forever.
    clock = Clock(1.457e11)
    link = Link(clock, "L3->L2", rate=1.0)
    transfer = _Transfer(size, clock)
    link.add(transfer)
    _run(clock, [transfer], 1000)
    assert transfer.landed_at == [pytest.approx(1.457e11 + size, abs=1e-3)]
    assert not link.active
