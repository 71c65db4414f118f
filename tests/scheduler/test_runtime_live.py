"""The live scheduler's forecasts are conditioned on the demand counted since training, as the
simulator's prewarm policy's are: a timer that just fired is not expected again until its period."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scheduler_builders import GB, catalog, cluster, spec

from forecaster import History, fit_bundle
from ingest import Cell, DemandStore
from prewarm import load_settings
from scheduler._runtime import Runtime

DAY = 86400.0
START = 1704067200.0  # Monday 2024-01-01
CUT = START + 5 * DAY
PERIOD_S = 37 * 60.0  # does not divide the day: only the time since the last firing places the next
TIMER = "timer-37m"


def _p_next(forecast: object, now: float, minutes: float) -> float:
    return float(forecast.p_window(now, now + 60.0 * minutes))  # type: ignore[attr-defined]


def test_a_timer_counted_in_the_demand_store_is_expected_again_at_its_period_not_before(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(0)
    firings = START + 600.0 + PERIOD_S * np.arange(int(5 * DAY // PERIOD_S))
    firings += rng.normal(0.0, 5.0, firings.size)
    train = History.from_events(pd.DataFrame({"timestamp": firings, "model": TIMER}), start=START, end=CUT)
    bundle = fit_bundle(train)
    settings = load_settings(
        overrides={"data_dir": str(tmp_path), "database_url": f"sqlite:///{tmp_path / 'demand.db'}"}
    )
    store = DemandStore(settings.database_url)
    fired = CUT + 3600.0 + 10.0
    minute = int(fired // 60) * 60
    store.add_counts({(TIMER, minute): Cell(requests=1)}, {TIMER: int(fired * 1000)})
    rt = Runtime(settings, catalog(spec(TIMER, GB)), cluster("a"))

    just_after = minute + 120.0
    live = rt._live_forecasts(bundle, store, [TIMER], just_after)
    assert _p_next(live(just_after)[TIMER], just_after, 10) < 0.15
    # One source per served forecaster, kept between ticks (it is told each complete minute once).
    assert rt._live_forecasts(bundle, store, [TIMER], just_after) is live

    near_period = fired + PERIOD_S - 300.0
    live = rt._live_forecasts(bundle, store, [TIMER], near_period)
    assert _p_next(live(near_period)[TIMER], near_period, 10) > 0.5
