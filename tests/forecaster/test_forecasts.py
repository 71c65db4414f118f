"""What the scheduler relies on: spikes are seen, forecasts are fast, degenerate series never crash."""

from __future__ import annotations

import time

import numpy as np
import pytest
from forecaster_helpers import MONDAY, weekday_spike_history
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forecaster import (
    Choice,
    ForecasterBundle,
    History,
    ModelForecast,
    SelectionConfig,
    fit_bundle,
    recent_rate_forecasts,
)
from forecaster._codec import encode_array

DAY = 86400


def test_0900_weekday_spike_is_likely_at_0900_next_weekday_and_unlikely_at_0300() -> None:
    history = weekday_spike_history(days=11)  # Mon..Thu of the second week; the next weekday is a Friday
    bundle = fit_bundle(history)
    model = history.models[0]
    friday = MONDAY + 11 * DAY
    forecast = bundle.predict(friday + 8 * 3600 + 50 * 60, horizon_s=2 * 3600)[model]
    assert forecast.p_window(friday + 9 * 3600, friday + 9 * 3600 + 600) > 0.9
    night = bundle.predict(friday + 2 * 3600 + 50 * 60, horizon_s=2 * 3600)[model]
    assert night.p_window(friday + 3 * 3600, friday + 3 * 3600 + 600) < 0.05
    saturday = bundle.predict(friday + DAY + 8 * 3600 + 50 * 60, horizon_s=2 * 3600)[model]
    assert saturday.p_window(friday + DAY + 9 * 3600, friday + DAY + 9 * 3600 + 600) < 0.2


def test_forecast_starts_at_the_bucket_of_now_and_covers_the_horizon() -> None:
    bundle = fit_bundle(weekday_spike_history(days=4))
    now = MONDAY + 4 * DAY + 125.0
    forecast = next(iter(bundle.predict(now, horizon_s=3600).values()))
    assert forecast.start == MONDAY + 4 * DAY + 120
    assert forecast.bucket_s == 60
    assert len(forecast.expected) == 60
    assert np.all((forecast.p_any >= 0) & (forecast.p_any <= 1))


def test_bucket_larger_than_a_minute_sums_minutes() -> None:
    history = weekday_spike_history(days=4)
    per_minute = fit_bundle(history)
    per_ten = ForecasterBundle.from_choices(per_minute.choices, trained_until=history.end, bucket_s=600)
    now = MONDAY + 4 * DAY + 9 * 3600
    a = per_minute.predict(now, 3600)[history.models[0]]
    b = per_ten.predict(now, 3600)[history.models[0]]
    assert np.allclose(b.expected, a.expected.reshape(6, 10).sum(axis=1))


def _random_profile_choice(i: int, rng: np.random.Generator) -> Choice:
    profile = rng.gamma(0.5, 0.2, size=1440)
    return Choice(f"m-{i:04d}", "seasonal_naive_daily", {"profile": encode_array(profile)}, scale=0.8)


def test_two_hour_forecast_for_a_thousand_models_takes_under_a_second() -> None:
    rng = np.random.default_rng(0)
    bundle = ForecasterBundle.from_choices(
        [_random_profile_choice(i, rng) for i in range(1000)], trained_until=float(MONDAY)
    )
    bundle.predict(MONDAY + 10.0, 7200)  # warm-up
    began = time.perf_counter()
    forecasts = bundle.predict(MONDAY + 3600.0, 7200)
    assert time.perf_counter() - began < 1.0
    assert len(forecasts) == 1000


def _check(bundle: ForecasterBundle, history: History) -> None:
    forecasts = bundle.predict(history.end + 30.0, 3600)
    assert set(forecasts) == set(history.models)
    for fc in forecasts.values():
        assert np.all(np.isfinite(fc.expected))
        assert np.all(fc.expected >= 0)
        assert np.all((fc.p_any >= 0) & (fc.p_any <= 1))


@pytest.mark.parametrize(
    "series",
    [
        pytest.param(np.zeros(3 * 1440), id="all-zero"),
        pytest.param(np.full(3 * 1440, 2.0), id="constant"),
        pytest.param(np.full(3 * 1440, np.nan), id="all-nan"),
        pytest.param(np.zeros(0), id="empty"),
        pytest.param(np.where(np.arange(5 * 1440) % 97 < 50, np.nan, 1.0), id="gappy"),
        pytest.param(np.concatenate([np.zeros(4 * 1440), [3.0, 1.0]]), id="launched-two-minutes-ago"),
        pytest.param(np.array([1.0, np.inf, -4.0, 2.0] * 800), id="inf-and-negative"),
        pytest.param(np.concatenate([np.full(5 * 1440, 3.0), np.zeros(1440)]), id="went-silent"),
    ],
)
def test_degenerate_series_never_crash(series: np.ndarray) -> None:
    history = History(["odd", "normal"], MONDAY, np.stack([series, np.ones_like(series)]))
    _check(fit_bundle(history), history)


def test_silent_model_is_forecast_near_zero() -> None:
    series = np.concatenate([np.random.default_rng(1).poisson(2.0, 5 * 1440), np.zeros(1440)]).astype(float)
    history = History(["gone"], MONDAY, series[None, :])
    bundle = fit_bundle(history)
    assert bundle.predict(history.end, 3600)["gone"].expected.sum() < 1.0
    assert "dormant" in (bundle.choice("gone").reason or "")


def test_new_model_gets_a_prior_shaped_like_its_peers() -> None:
    t = np.arange(7 * 1440)
    busy_by_day = 1.0 + np.sin(2 * np.pi * (t % 1440) / 1440)
    peers = np.random.default_rng(2).poisson(np.tile(busy_by_day, (3, 1))).astype(float)
    newcomer = np.full(7 * 1440, np.nan)
    newcomer[-120:] = 1.0
    history = History(["a", "b", "c", "new"], MONDAY, np.vstack([peers, newcomer]))
    bundle = fit_bundle(history)
    assert bundle.choice("new").family == "prior"
    assert "new model" in (bundle.choice("new").reason or "")
    _check(bundle, history)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    minutes=st.integers(min_value=0, max_value=3 * 1440),
    nan_share=st.floats(min_value=0.0, max_value=1.0),
    rate=st.floats(min_value=0.0, max_value=5.0),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_any_series_gives_finite_probabilities(
    minutes: int, nan_share: float, rate: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rate, size=(2, minutes)).astype(float)
    counts[rng.random(counts.shape) < nan_share] = np.nan
    history = History(["x", "y"], MONDAY + 60 * int(rng.integers(0, 1440)), counts)
    _check(fit_bundle(history, SelectionConfig(folds=1)), history)


def test_recent_requests_raise_the_near_term_probability_and_silence_lowers_it() -> None:
    profile = np.full(1440, 0.05)
    choice = Choice(
        "chat/session-model",
        "seasonal_naive_daily",
        {"profile": encode_array(profile)},
        scale=0.3,
        scale_active=3.0,
        scale_idle=0.1,
    )
    bundle = ForecasterBundle.from_choices([choice], trained_until=float(MONDAY))
    now = MONDAY + 3600.0
    plain = bundle.predict(now, 3600)[choice.model]
    active = bundle.predict(now, 3600, recent={choice.model: 4})[choice.model]
    idle = bundle.predict(now, 3600, recent={choice.model: 0})[choice.model]
    window = (now + 300, now + 900)
    assert active.p_window(*window) > plain.p_window(*window) > idle.p_window(*window)
    np.testing.assert_allclose(active.expected, plain.expected)  # counts do not change, only P(any)
    late = slice(bundle.state_horizon_s // 60, None)  # beyond the state horizon nothing changes
    np.testing.assert_allclose(active.p_any[late], plain.p_any[late])
    unknown = bundle.predict(now, 3600, recent={"someone-else": 3})[choice.model]
    np.testing.assert_allclose(unknown.p_any, plain.p_any)


def test_recent_rate_weighs_the_last_minutes_and_leaves_out_silent_models() -> None:
    now = 1_700_000_030.0
    hour = [0.0] * 60
    steady = recent_rate_forecasts({"steady": [1.0] * 60, "silent": hour}, now, horizon_s=600)
    assert set(steady) == {"steady"}  # no request in the hour: no forecast, not a zero one
    forecast = steady["steady"]
    assert forecast.family == "recent_rate"
    assert forecast.start == now // 60 * 60
    assert forecast.end == forecast.start + 600
    np.testing.assert_allclose(forecast.expected, 1.0)  # one request a minute, per one-minute bucket
    np.testing.assert_allclose(forecast.p_any, 1.0 - np.exp(-1.0))
    # A model that only started in the last ten minutes: the hour's mean (1/min) and the last ten
    # minutes' (6/min) count half each, so it is forecast well above its hour-long mean at once.
    started = recent_rate_forecasts({"new": hour[:50] + [6.0] * 10}, now, horizon_s=600)["new"]
    np.testing.assert_allclose(started.expected, 0.5 * 1.0 + 0.5 * 6.0)


def test_p_between_gives_part_of_a_bucket_its_part_of_the_chance() -> None:
    # Minute buckets, 0.5 in the first and 0.9 in the second: p_window counts whole buckets, p_between
    # spreads each bucket's chance evenly over it.
    p_any = np.array([0.5, 0.9, 0.0])
    forecast = ModelForecast(model="m", start=0.0, bucket_s=60, expected=p_any, p_any=p_any, family="test")
    assert forecast.p_window(0.0, 30.0) == pytest.approx(0.5)
    assert forecast.p_between(0.0, 30.0) == pytest.approx(1 - 0.5**0.5)
    assert forecast.p_between(30.0, 90.0) == pytest.approx(1 - 0.5**0.5 * 0.1**0.5)
    assert forecast.p_between(0.0, 180.0) == pytest.approx(forecast.p_window(0.0, 180.0))
    assert forecast.p_between(120.0, 150.0) == 0.0
    assert forecast.p_between(90.0, 90.0) == 0.0
    assert forecast.p_between(-600.0, 0.0) == 0.0  # before the forecast: no chance it speaks for
