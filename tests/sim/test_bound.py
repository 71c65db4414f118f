"""The least idle memory any causal policy needs on Poisson traffic for a p75 target (``sim._bound``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import poisson_idle_bound, run_policies, suite


def _grid_minimum(sizes: list[float], target: float, percentile: float) -> float:
    """Brute force over rate vectors on a grid: the cheapest one whose percentile meets the target."""
    levels = np.linspace(0.0, 1.0, 21)
    rates = np.array(list(itertools.product(levels, repeat=len(sizes))))
    meets = np.percentile(rates, percentile, axis=1) <= target + 1e-9
    return float(((1.0 - rates[meets]) @ np.asarray(sizes)).min())


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([1.0, 2.0, 7.0, 40.0, 140.0]), min_size=1, max_size=4),
    target=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.85, 1.0]),
    percentile=st.sampled_from([50.0, 75.0, 90.0]),
)
def test_bound_is_the_cheapest_rate_assignment_that_meets_the_percentile(
    sizes: list[float], target: float, percentile: float
) -> None:
    bound = poisson_idle_bound(sizes, 1.0, target, percentile)
    grid = _grid_minimum(sizes, target, percentile)
    # The grid's best is feasible, so the true minimum is at most it; and any feasible vector rounded
    # down to the grid stays feasible and costs at most one step (0.05) × the sizes more.
    assert grid - 0.05 * sum(sizes) - 1e-9 <= bound <= grid + 1e-9


def test_bound_keeps_the_smallest_models_warm() -> None:
    # Four models, p75 at position 2.25: the two smallest and the third share x, the largest has y.
    # Meeting 0 needs x = 0 and y = 0 (the largest counts a quarter): everything resident.
    assert poisson_idle_bound([1, 2, 3, 100], 60.0, 0.0) == pytest.approx(106 * 60.0)
    # At 0.25 the largest can be given up (y = 1, x = 0): the three small ones stay resident.
    assert poisson_idle_bound([1, 2, 3, 100], 60.0, 0.25) == pytest.approx(6 * 60.0)
    assert poisson_idle_bound([5.0], 10.0, 0.4) == pytest.approx(0.6 * 5 * 10)
    assert poisson_idle_bound([], 10.0, 0.4) == 0.0


def test_bound_rejects_a_rate_outside_zero_one() -> None:
    with pytest.raises(ValueError, match="cold-start rate"):
        poisson_idle_bound([1.0], 1.0, 1.5)


def test_no_keepalive_beats_the_bound_on_the_memoryless_case() -> None:
    """The simulator agrees with the argument behind the bound: on the suite's Poisson-only case, fixed
    keep-alive at every TTL spends at least the bound's idle memory for the p75 it reaches."""
    case = suite(["memoryless"])[0]
    labels = ["keepalive:60", "keepalive:600", "keepalive:3600", "keepalive:14400", "reactive"]
    results = run_policies(
        case.events, case.catalog, None, labels, start=case.cut, end=case.end, hints=(), unlimited=True
    )
    window = case.events[(case.events.timestamp >= case.cut) & (case.events.timestamp < case.end)]
    sizes = [case.catalog[m].size_bytes / 1e9 for m in window.model.unique()]
    for label, m in results.items():
        bound = poisson_idle_bound(sizes, case.sim_hours * 60.0, m.p75_model_cold_start_rate)
        # A run's rates scatter around their expectations, hence a little slack.
        assert m.idle_gb_minutes["L0"] >= 0.9 * bound, label
