"""``prewarm forecast``: backtest straight from a trace file, train from the store, show a forecast."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ingest._synthetic import generate
from prewarm_cli import app

DAY = 86400


def _trace_csv(tmp_path: Path, models: int = 7, days: float = 5) -> tuple[Path, float]:
    trace = generate(models, days, seed=3)
    path = tmp_path / "trace.csv"
    trace.events.assign(model=trace.events["model"].astype(str)).to_csv(path, index=False)
    return path, trace.start


def test_backtest_from_a_requests_trace_writes_the_documented_json(tmp_path: Path) -> None:
    path, start = _trace_csv(tmp_path)
    out = tmp_path / "bt.json"
    until = "2024-01-05T00:00:00Z"  # day 4 of a trace starting Monday 2024-01-01
    assert start == 1704067200
    result = CliRunner().invoke(
        app,
        [
            "forecast",
            "backtest",
            "--trace",
            str(path),
            "--train-until",
            until,
            "--lead-minutes",
            "5",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert {"brier", "brier_baseline", "brier_skill", "poisson_deviance", "models"} <= set(
        report["aggregate"]
    )
    assert report["aggregate"]["models"] == 7
    for row in report["per_model"].values():
        assert {"family_chosen", "brier", "brier_baseline"} <= set(row)
    assert report["reliability"]


def test_backtest_of_the_azure_2019_sample_runs_on_a_single_day(tmp_path: Path, azure_samples: Path) -> None:
    out = tmp_path / "azure.json"
    result = CliRunner().invoke(
        app,
        [
            "forecast",
            "backtest",
            "--trace",
            str(azure_samples / "invocations.csv"),
            "--format",
            "azure2019",
            "--train-until",
            "2019-07-15T02:00:00Z",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["aggregate"]["models"] == 4
    # Less than two days of history: no backtest selection, the fallbacks say so.
    assert all(row["reason"] for row in report["per_model"].values())
    assert all(np.isfinite(row["brier"]) for row in report["per_model"].values())


def test_backtest_with_a_bad_time_is_a_usage_error(tmp_path: Path) -> None:
    path, _ = _trace_csv(tmp_path, models=2, days=1)
    result = CliRunner().invoke(
        app, ["forecast", "backtest", "--trace", str(path), "--train-until", "yesterday"]
    )
    assert result.exit_code == 2
    assert "--train-until" in result.output


def test_show_refuses_a_plot_file_that_is_not_a_png_before_loading_a_forecaster(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["forecast", "show", "m", "--from", str(tmp_path / "absent"), "--png", str(tmp_path / "p.jpg")]
    )
    assert result.exit_code == 2, result.output
    assert "p.jpg: the plot is drawn as a PNG, name a .png file" in result.output


@pytest.mark.usefixtures("clean_env")  # the store must be this test's SQLite file, not the stack's
def test_train_from_the_store_then_show_a_model(tmp_path: Path) -> None:
    from ingest import Cell, DemandStore

    trace = generate(4, 4, seed=5)
    store = DemandStore(f"sqlite:///{tmp_path / 'prewarm.db'}")
    cells = {
        (model, int(trace.start) + 60 * int(m)): Cell(requests=int(trace.counts[i, m]))
        for i, model in enumerate(trace.models)
        for m in np.flatnonzero(trace.counts[i])
    }
    store.add_counts(cells, {})
    store.close()
    now = trace.start + 4 * DAY
    common = ["--set", f"data_dir={tmp_path}", "--set", "holdout_days=1"]
    result = CliRunner().invoke(
        app,
        [
            *common,
            "forecast",
            "train",
            "--now",
            str(now),
            "--no-track",
            "--out",
            str(tmp_path / "b"),
            "--json",
            "-",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["models"] == 4
    shown = CliRunner().invoke(
        app,
        [
            *common,
            *("forecast", "show", trace.models[0], "--from", str(tmp_path / "b"), "--now", str(now)),
            *("--horizon-s", "600", "--png", str(tmp_path / "f.png")),
        ],
    )
    assert shown.exit_code == 0, shown.output
    assert "bucket_start" in shown.output
    assert (tmp_path / "f.png").stat().st_size > 0


def test_bench_forecast_writes_the_benchmarks_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--models", "7", "--days", "3", "--train-days", "2", "--no-retrain", "--json", str(out)]
    result = CliRunner().invoke(app, ["bench", "forecast", *args])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["setup"] == {"models": 7, "days": 3.0, "train_days": 2.0, "seed": 0}
    assert set(data["targets"]) == {
        "brier_skill_ge_0.3",
        "beats_time_of_week",
        "retrain_under_600s",
        "predict_under_1s",
    }
