"""Backtests score what the scheduler uses; saved bundles come back identical and refuse unknown layouts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import forecaster
from forecaster import FAMILIES, ForecasterBundle, History, backtest, fit_bundle
from forecaster._history import History as _History
from prewarm import ForecastError, InvalidInput

DAY = 86400


def test_backtest_beats_constant_rate_and_time_of_week_and_is_calibrated(
    synthetic_small: tuple[History, dict[str, str]],
) -> None:
    history, families = synthetic_small
    report = backtest(history, history.start + 11 * DAY, lead=5, window=10, families=families)
    constant = _constant_rate_brier(history, 11 * DAY // 60, lead=5, window=10)
    agg = report.aggregate
    assert agg["models"] == len(history.models)
    assert agg["brier_skill"] >= 0.3
    assert agg["brier_skill_vs_time_of_week"] > 0.1
    assert agg["ece"] < 0.05
    assert agg["ece"] < agg["ece_baseline"]
    assert set(agg["by_pattern"]) == set(families.values())
    for model, row in report.per_model.items():
        assert row["family_chosen"] in FAMILIES
        # Skill is against a per-model constant rate fitted before the cut, computed here from scratch.
        assert row["brier_skill"] == pytest.approx(1 - row["brier"] / constant[model])
        assert row["pattern"] == families[model]
    json.dumps(report.to_json())  # what --json writes must serialise


def _constant_rate_brier(history: History, cut: int, *, lead: int, window: int) -> dict[str, float]:
    """Brier of "a request in the window" from each model's mean rate per minute before minute ``cut``."""
    assert not np.isnan(history.counts).any()  # the simple sums below would need gap handling
    rate = history.counts[:, :cut].mean(axis=1)
    p = 1.0 - np.exp(-rate * window)
    windows = np.lib.stride_tricks.sliding_window_view(history.counts[:, cut + lead :], window, axis=1)
    hit = windows.sum(axis=2) > 0
    brier = ((p[:, None] - hit) ** 2).mean(axis=1)
    return dict(zip(history.models, brier.tolist(), strict=True))


def test_backtest_needs_data_on_both_sides_of_the_cut(
    synthetic_small: tuple[History, dict[str, str]],
) -> None:
    history, _ = synthetic_small
    with pytest.raises(InvalidInput, match="after --train-until"):
        backtest(history, history.end - 60)
    with pytest.raises(InvalidInput, match="before --train-until"):
        backtest(history, history.start + 60)


def test_saved_bundle_loads_back_and_predicts_the_same_numbers(
    tmp_path: Path, synthetic_small: tuple[History, dict[str, str]]
) -> None:
    history, _ = synthetic_small
    head, _ = history.split(history.start + 7 * DAY)
    bundle = fit_bundle(head)
    loaded = ForecasterBundle.load(bundle.save(tmp_path / "b"))
    now = head.end + 1234.0
    a, b = bundle.predict(now), loaded.predict(now)
    assert a.keys() == b.keys()
    for model in a:
        assert a[model].family == b[model].family
        np.testing.assert_allclose(a[model].expected, b[model].expected, rtol=1e-6)
        np.testing.assert_allclose(a[model].p_any, b[model].p_any, rtol=1e-6)
    for line in (tmp_path / "b" / "params.jsonl").read_text().splitlines():
        entry = json.loads(line)
        assert entry["version"] == 1
        assert entry["family"] in FAMILIES


def test_bundle_of_unknown_version_or_family_is_refused(tmp_path: Path) -> None:
    bundle = fit_bundle(_History(["a"], 0, np.ones((1, 2 * 1440))))
    path = bundle.save(tmp_path / "b")
    header = json.loads((path / "bundle.json").read_text())
    (path / "bundle.json").write_text(json.dumps({**header, "version": 99}))
    with pytest.raises(ForecastError, match="version 99"):
        ForecasterBundle.load(path)
    (path / "bundle.json").write_text(json.dumps(header))
    entry = json.loads((path / "params.jsonl").read_text())
    (path / "params.jsonl").write_text(json.dumps({**entry, "family": "crystal_ball"}))
    with pytest.raises(ForecastError, match="crystal_ball"):
        ForecasterBundle.load(path)


def test_a_bundle_built_from_choices_builds_its_week_tables_at_its_first_forecast(
    synthetic_small: tuple[History, dict[str, str]],
) -> None:
    history, _ = synthetic_small
    head, _ = history.split(history.start + 7 * DAY)
    fitted = fit_bundle(head)
    bundle = ForecasterBundle.from_choices(fitted.choices, trained_until=fitted.trained_until)
    assert not bundle.compiled  # 40 kB a model that a retrain which only saves and logs never needs
    now = head.end + 1234.0
    a, b = bundle.predict(now), fitted.predict(now)
    assert bundle.compiled
    for model in a:
        np.testing.assert_array_equal(a[model].expected, b[model].expected)
        np.testing.assert_array_equal(a[model].p_any, b[model].p_any)
    np.testing.assert_array_equal(bundle.daily_requests(), fitted.daily_requests())


def test_a_saved_bundle_whose_parameters_do_not_compile_is_refused_at_load(tmp_path: Path) -> None:
    path = fit_bundle(_History(["a"], 0, np.ones((1, 2 * 1440)))).save(tmp_path / "b")
    entry = json.loads((path / "params.jsonl").read_text())
    (path / "params.jsonl").write_text(json.dumps({**entry, "params": {}}))
    with pytest.raises(ForecastError, match="cannot compile"):
        ForecasterBundle.load(path)  # not at the scheduler's first forecast


def test_every_family_fits_and_compiles_a_week_table(synthetic_small: tuple[History, dict[str, str]]) -> None:
    history, _ = synthetic_small
    head, _ = history.split(history.start + 8 * DAY)
    for alias, family in FAMILIES.items():
        rows = np.flatnonzero(family.eligible(head))
        if rows.size == 0:
            # ETS and MSTL only take busy series, which this small fleet has none of: fit them on the
            # two busiest anyway, so that every family's code runs here.
            rows = np.argsort(-np.nansum(head.counts, axis=1))[:2]
        fitted = family.fit(head.select(rows))
        assert len(fitted) == rows.size, alias
        for params in fitted:
            assert not isinstance(params, forecaster.families.Failure), alias
            json.dumps(params)  # parameters are plain JSON
            week = family.week(params)
            assert week.shape == (7 * 1440,), alias
            assert np.all(np.isfinite(week)), alias
            assert np.all(week >= 0), alias


def test_a_history_spanning_centuries_is_refused_before_its_matrix_is_allocated() -> None:
    events = pd.DataFrame({"timestamp": [1_709_942_400.0, 1_709_942_400.0 + 1000 * 365 * DAY], "model": "a"})
    with pytest.raises(InvalidInput, match=r"2024-03-09 00:00 UTC to .* exceed the per-minute history"):
        History.from_events(events)
