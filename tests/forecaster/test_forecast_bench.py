"""``run_forecast_bench``: the forecaster's quality and speed, in the layout ``bench forecast`` publishes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from forecaster import _scale_bench, run_forecast_bench, run_retrain_scaling
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


def test_retrain_scaling_keeps_every_runs_mlflow_store_until_the_last_run_is_done(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run's store (~4 files a model) is not deleted while a later run creates its own: on ext4
    without a journal, inode allocation then scans past every inode freed in the last minutes, and the
    second run's tracking paid 5-6 s for the first run's clean-up at 3,000 models."""
    monkeypatch.setenv("PREWARM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)  # MLflow's file registry opens ./mlflow.db through its default client
    seen: list[tuple[Path, list[Path]]] = []

    def in_this_process(job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        store = Path(job["store"])
        seen.append((store, sorted(p for p in store.parent.iterdir() if (p / "mlruns").is_dir())))
        return _scale_bench._run(job)

    monkeypatch.setattr(_scale_bench, "_in_child", in_this_process)
    result = run_retrain_scaling(load_settings(), models=4, days=6, workers=[1, 1])
    (first, before_first), (second, before_second) = seen
    assert before_first == []
    assert before_second == [first]  # the first run's store, MLflow run and all, outlived its run
    assert first.parent == second.parent
    assert not first.parent.exists()  # and every store is gone once the last run is done
    assert result["identical"] is True
    assert [run["workers"] for run in result["runs"]] == [1, 1]
