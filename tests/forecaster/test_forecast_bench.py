"""``run_forecast_bench``: the forecaster's quality and speed, in the layout ``bench forecast`` publishes."""

from __future__ import annotations

import pytest

from forecaster import run_forecast_bench
from prewarm import load_settings

pytestmark = pytest.mark.usefixtures("clean_env")


def test_benchmark_without_retrain_reports_quality_speed_and_targets() -> None:
    lines: list[str] = []
    result = run_forecast_bench(
        load_settings(), models=7, days=3, train_days=2, seed=1, with_retrain=False, progress=lines.append
    )
    data = result.to_json()
    assert list(data) == ["setup", "quality", "reliability", "speed", "targets"]
    assert data["setup"] == {"models": 7, "days": 3, "train_days": 2, "seed": 1}
    assert data["quality"] is result.report.aggregate
    assert "retrain_seconds" not in data["speed"]
    assert data["speed"]["predict_models"] == 7
    assert data["speed"]["predict_horizon_s"] == 7200
    assert data["speed"]["predict_seconds_max"] >= data["speed"]["predict_seconds_median"]
    assert data["targets"] == {
        "brier_skill_ge_0.3": result.brier_skill >= 0.3,
        "beats_time_of_week": result.brier_skill_vs_time_of_week > 0,
        "retrain_under_600s": None,
        "predict_under_1s": data["speed"]["predict_seconds_max"] < 1.0,
    }
    assert lines[0].startswith("generated 7 models x 3 days in ")
    assert lines[1].startswith("backtest: brier skill ")
