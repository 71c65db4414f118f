"""``LiveForecasts``: the bundle conditioned on the time since each model's last request and on what was
observed since training (recent arrivals, models the bundle never saw)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forecaster import ForecasterBundle, History, LiveForecasts, fit_bundle, run_tail_bench
from forecaster._types import ModelForecast, forecasts_of

DAY = 86400.0
START = 1704067200.0  # Monday 2024-01-01
TRAIN_DAYS = 5
CUT = START + TRAIN_DAYS * DAY
PERIOD_MIN = 37  # does not divide the day: the week table cannot place the firings, the idle times can
POISSON_PER_H = 6.0


def _events(seed: int = 0) -> dict[str, np.ndarray]:
    """Seven days of three models: a 37-minute timer, a flat Poisson process, and a busy-then-gone one."""
    rng = np.random.default_rng(seed)
    span = 7 * DAY
    timer = START + 600.0 + PERIOD_MIN * 60.0 * np.arange(int(span // (PERIOD_MIN * 60)))
    timer = timer + rng.normal(0.0, 5.0, timer.size)
    poisson = np.sort(START + span * rng.random(rng.poisson(POISSON_PER_H * span / 3600)))
    busy = np.sort(START + TRAIN_DAYS * DAY * rng.random(rng.poisson(30.0 * TRAIN_DAYS * 24)))
    return {"timer/every-37m": timer, "poisson/6-per-hour": poisson, "deprecated/30-per-hour": busy}


def _frame(events: dict[str, np.ndarray], until: float) -> pd.DataFrame:
    rows = [(t, m) for m, ts in events.items() for t in ts if t < until]
    return pd.DataFrame(rows, columns=["timestamp", "model"]).sort_values("timestamp")


@pytest.fixture(scope="module")
def events() -> dict[str, np.ndarray]:
    return _events()


@pytest.fixture(scope="module")
def train(events: dict[str, np.ndarray]) -> History:
    return History.from_events(_frame(events, CUT), start=START, end=CUT)


@pytest.fixture(scope="module")
def bundle(train: History) -> ForecasterBundle:
    return fit_bundle(train)


def _p_next(forecast: ModelForecast, now: float, minutes: float) -> float:
    return forecast.p_window(now, now + 60.0 * minutes)


def test_idle_profile_finds_structure_in_a_timer_and_none_in_a_poisson_process(
    bundle: ForecasterBundle,
) -> None:
    idle = bundle.idle
    assert idle is not None
    assert np.isfinite(idle.prior[idle.index["timer/every-37m"]])
    assert np.isinf(idle.prior[idle.index["poisson/6-per-hour"]])


def test_timer_is_likely_near_its_period_after_a_request_and_unlikely_just_after(
    bundle: ForecasterBundle,
) -> None:
    live = LiveForecasts(bundle)
    fired = CUT + 3600.0 + 5.0
    live.observe("timer/every-37m", fired)
    now = fired + 55.0  # the next minute
    forecast = live(now)["timer/every-37m"]
    minute = (np.arange(len(forecast.p_any)) * 60 + forecast.start - fired) / 60.0
    just_after = forecast.p_any[(minute >= 1) & (minute < PERIOD_MIN - 3)]
    near_period = forecast.p_any[(minute >= PERIOD_MIN - 2) & (minute < PERIOD_MIN + 1)]
    assert just_after.max() < 0.05
    assert near_period.sum() > 0.6
    assert _p_next(forecast, now, 30) < 0.15 < 0.7 < _p_next(forecast, now, 40)
    # The plain bundle cannot tell: its chance is the same ~1/37 a minute at any time.
    plain = bundle.predict(now)["timer/every-37m"]
    assert plain.p_any.max() < 0.2


def test_poisson_model_is_forecast_at_its_rate_whatever_the_time_since_its_last_request(
    bundle: ForecasterBundle, events: dict[str, np.ndarray]
) -> None:
    live = LiveForecasts(bundle)
    model = "poisson/6-per-hour"
    expected = 1.0 - np.exp(-POISSON_PER_H / 6.0)  # any request in ten minutes
    seen = events[model][events[model] >= CUT]
    for at in seen[seen < CUT + 6 * 3600]:
        live.observe(model, float(at))
    last = float(seen[seen < CUT + 6 * 3600].max())
    for now in (last + 30.0, last + 600.0, CUT + 6 * 3600 + 1800.0):
        assert _p_next(live(now)[model], now, 10) == pytest.approx(expected, abs=0.08)


def test_poisson_model_probabilities_are_calibrated_on_held_out_days(
    bundle: ForecasterBundle, events: dict[str, np.ndarray]
) -> None:
    live = LiveForecasts(bundle, horizon_s=600)
    model = "poisson/6-per-hour"
    ts = np.sort(events[model])
    predicted, happened = [], []
    j = int(np.searchsorted(ts, CUT))
    for now in np.arange(CUT, CUT + 2 * DAY - 600, 300.0):
        k = int(np.searchsorted(ts, now))
        for at in ts[j:k]:
            live.observe(model, float(at))
        j = k
        predicted.append(_p_next(live(float(now))[model], float(now), 10))
        happened.append(float(np.any((ts >= now) & (ts < now + 600))))
    assert np.mean(predicted) == pytest.approx(np.mean(happened), abs=0.03)
    assert np.std(predicted) < 0.05  # no spurious spikes: a memoryless model's chance stays flat


def test_model_unseen_in_training_gets_a_positive_forecast_after_a_few_observed_requests(
    bundle: ForecasterBundle,
) -> None:
    live = LiveForecasts(bundle)
    now = CUT + 7200.0
    assert "launched/after-training" not in live(now)
    for k in range(3):
        live.observe("launched/after-training", now - 300.0 + 60.0 * k)
    forecast = live(now)["launched/after-training"]
    assert _p_next(forecast, now, 10) > 0.1
    assert forecast.family == "recent_rate"


def test_deprecated_model_probability_falls_after_it_stops(bundle: ForecasterBundle) -> None:
    live = LiveForecasts(bundle)
    model = "deprecated/30-per-hour"
    now = CUT + 2 * 3600.0  # two silent hours since training, where the bundle expects sixty requests
    before = _p_next(bundle.predict(now)[model], now, 10)
    after = _p_next(live(now)[model], now, 10)
    assert before > 0.9
    assert after < 0.3 * before


def test_flash_crowd_raises_the_probability_within_minutes(bundle: ForecasterBundle) -> None:
    live = LiveForecasts(bundle)
    model = "poisson/6-per-hour"
    now = CUT + 3 * 3600.0
    calm = _p_next(live(now)[model], now, 5)
    for k in range(20):  # twenty requests in ten minutes where one was expected
        live.observe(model, now + 30.0 * k)
    crowded = _p_next(live(now + 600.0)[model], now + 600.0, 5)
    assert crowded > 0.8 > 0.5 > calm


def test_observing_a_model_outside_the_catalog_is_harmless(bundle: ForecasterBundle) -> None:
    quiet, noisy = LiveForecasts(bundle), LiveForecasts(bundle)
    now = CUT + 600.0
    for name in ("not/in/the/catalog", "", "ü/🙂"):
        noisy.observe(name, now - 30.0)
    a, b = quiet(now), noisy(now)
    for model in bundle.models:
        np.testing.assert_allclose(a[model].p_any, b[model].p_any)
    assert set(noisy(now, models=bundle.models)) == set(bundle.models)


def test_saved_bundle_keeps_its_idle_profile_and_forecasts_the_same(
    bundle: ForecasterBundle, tmp_path: Path
) -> None:
    loaded = ForecasterBundle.load(bundle.save(tmp_path / "bundle"))
    assert loaded.idle is not None
    assert bundle.idle is not None
    np.testing.assert_array_equal(loaded.idle.prior, bundle.idle.prior)
    now = CUT + 900.0
    a, b = LiveForecasts(bundle), LiveForecasts(loaded)
    for live in (a, b):
        live.observe("timer/every-37m", now - 120.0)
    for model in bundle.models:
        np.testing.assert_allclose(a(now)[model].p_any, b(now)[model].p_any, rtol=1e-4, atol=1e-7)


def test_bundle_without_idle_profile_gets_one_from_its_training_history(
    bundle: ForecasterBundle, train: History, tmp_path: Path
) -> None:
    bare = ForecasterBundle.load(bundle.save(tmp_path / "bundle"))
    bare.idle = None
    without = LiveForecasts(bare)
    with_history = LiveForecasts(bare, history=train)
    now = CUT + 900.0
    for live in (without, with_history):
        live.observe("timer/every-37m", now - 120.0)
    assert without(now)["timer/every-37m"].family == bundle.choice("timer/every-37m").family
    assert with_history(now)["timer/every-37m"].family.endswith("+idle")


def test_forecasts_made_in_one_pass_equal_those_made_one_by_one() -> None:
    rng = np.random.default_rng(3)
    expected = rng.random((3, 12))
    p_any = -np.expm1(-expected)
    many = forecasts_of(["a", "b", "c"], 120.0, 60, expected, p_any, ["rate"] * 3)
    for i, model in enumerate("abc"):
        one = ModelForecast(model, 120.0, 60, expected[i], p_any[i], "rate")
        np.testing.assert_array_equal(many[model].log_miss, one.log_miss)
        assert many[model].p_window(150.0, 400.0) == one.p_window(150.0, 400.0)
        assert many[model].expected_in(150.0, 400.0) == one.expected_in(150.0, 400.0)


def test_tail_bench_scores_live_forecasts_better_than_the_bundle_on_timers_and_deprecations() -> None:
    bench = run_tail_bench(models=20, days=5, train_days=4, seed=1, step_minutes=10)
    data = bench.to_json()
    assert list(data) == ["setup", "scores", "calibration", "speed"]
    assert set(data["scores"]["all"]) == {"bundle", "runtime", "live"}
    for kind in ("timer", "deprecated", "session"):
        assert bench.gain(kind, 10) > 0, kind
    # A model launched after training: the bundle is blind, the live forecast as good as the runtime's.
    launch = data["scores"]["launch"]
    assert launch["live"]["10m"]["log_loss"] < 0.2 * launch["bundle"]["10m"]["log_loss"]
    assert launch["live"]["10m"]["log_loss"] == pytest.approx(launch["runtime"]["10m"]["log_loss"], abs=0.05)
    assert data["calibration"]["live"]["10m"]["ece"] < 0.05
    assert data["speed"]["live_calls"] == 288


def test_daily_use_is_the_models_rate_over_its_week_and_follows_a_deprecation(
    bundle: ForecasterBundle,
) -> None:
    # What a cold start of the model is worth per model (the planner's objective="models") reads it.
    poisson, gone = "poisson/6-per-hour", "deprecated/30-per-hour"
    assert bundle.predict(CUT)[poisson].daily_requests == pytest.approx(POISSON_PER_H * 24, rel=0.25)
    live = LiveForecasts(bundle)
    now = CUT + 2 * 3600.0  # two silent hours where sixty requests were expected
    assert live(CUT)[gone].daily_requests == pytest.approx(30.0 * 24, rel=0.25)
    assert live(now)[gone].daily_requests < 0.2 * 30.0 * 24


def test_a_model_unseen_in_training_is_used_daily_at_its_observed_rate(bundle: ForecasterBundle) -> None:
    live = LiveForecasts(bundle)
    now = CUT + 7200.0
    for k in range(3):
        live.observe("launched/after-training", now - 300.0 + 60.0 * k)
    # The recent rate blends the last hour (3 in 60 minutes) with the last ten minutes (3 in 10).
    per_minute = 0.5 * 3 / 60 + 0.5 * 3 / 10
    assert live(now)["launched/after-training"].daily_requests == pytest.approx(per_minute * 1440, rel=0.05)


def _on_off(seed: int = 0, span: float = 7 * DAY) -> np.ndarray:
    """Bursts of a request a minute for 30 minutes on average, between quiet spells of 4 hours."""
    rng = np.random.default_rng(seed)
    t, on, out = START, False, []
    while t < START + span:
        length = rng.exponential(1800.0 if on else 14400.0)
        rate = 1 / 60 if on else 0.002 / 60
        out.extend(t + length * rng.random(rng.poisson(rate * length)))
        t, on = t + length, not on
    return np.sort(np.array(out))


@pytest.fixture(scope="module")
def bursty() -> ForecasterBundle:
    """A bundle of one bursty model whose chance follows its state: no idle-time profile, so its active
    and idle factors (a request in the last ``state_minutes`` or not) say what recent activity means."""
    frame = _frame({"bursty/on-off": _on_off()}, CUT)
    bundle = fit_bundle(History.from_events(frame, start=START, end=CUT))
    assert bundle.scales(state="active")[0] > 3 * bundle.scales()[0]
    return dataclasses.replace(bundle, idle=None)


def _after_requests(bundle: ForecasterBundle, count: int) -> tuple[float, float]:
    """The live chance of a request 5-15 minutes after ``count`` requests in 8 minutes, and the bundle's
    own for a model with recent requests."""
    live, model, now = LiveForecasts(bundle), "bursty/on-off", CUT + 3 * 3600.0
    for k in range(count):
        live.observe(model, now - 480.0 + 90.0 * k)
    stated = bundle.predict(now, recent={model: count})[model]
    return live(now)[model].p_between(now + 300, now + 900), stated.p_between(now + 300, now + 900)


def test_a_burst_the_active_state_expects_is_not_read_as_a_new_level_too(bursty: ForecasterBundle) -> None:
    # Weighed against the unconditional chance, five requests in eight minutes looked like a crowd,
    # and the model was forecast sure of a request for the whole horizon (0.999 here).
    live, stated = _after_requests(bursty, 5)
    assert live == pytest.approx(stated)
    assert live < 0.7


def test_more_than_the_active_state_expects_still_raises_the_level(bursty: ForecasterBundle) -> None:
    live, stated = _after_requests(bursty, 8)
    assert live > stated + 0.2
