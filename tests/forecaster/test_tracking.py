"""Retrains in MLflow: runs are logged, ``champion`` moves only for a better model, and loads back."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from forecaster import CHAMPION, ForecasterBundle, History, SelectionConfig, load_forecaster, retrain
from forecaster._tracking import PER_MODEL_COLUMNS
from prewarm import Settings, TrackingError, load_settings

DAY = 86400


def _settings(tmp_path: Path, name: str) -> Settings:
    return load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "history_days": 14,
            "holdout_days": 2.0,
            "mlflow_experiment": f"test-{name}",
            "registered_model": f"prewarm-forecaster-{name}",
        }
    )


@pytest.fixture(scope="module")
def history() -> History:
    from ingest._synthetic import generate

    trace = generate(10, 8, seed=11)
    return History(trace.models, int(trace.start), trace.counts.astype(np.float64))


def _same_forecasts(a: object, b: object, now: float) -> None:
    fa, fb = a.predict(now), b.predict(now)  # type: ignore[attr-defined]
    assert fa.keys() == fb.keys()
    for model in fa:
        np.testing.assert_allclose(fa[model].expected, fb[model].expected, rtol=1e-6)
        np.testing.assert_allclose(fa[model].p_any, fb[model].p_any, rtol=1e-6)


def test_worse_retrain_leaves_the_champion_alias_where_it_was(
    tmp_path: Path, history: History, unique: str
) -> None:
    settings = _settings(tmp_path, unique)
    uri = (tmp_path / "mlruns").as_uri()
    first = retrain(settings, history, history.end, tracking_uri=uri)
    assert first.decision is not None
    assert first.decision.promoted
    worse = retrain(
        settings, history, history.end, tracking_uri=uri, config=SelectionConfig(families=("rate",))
    )
    assert worse.decision is not None
    assert not worse.decision.promoted
    assert "does not beat" in worse.decision.reason
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    name = settings.forecast.registered_model
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == first.decision.model_version
    tags = client.get_run(worse.decision.run_id).data.tags
    assert tags["prewarm.champion_decision"].startswith("kept:")


def test_logging_a_retrain_keeps_no_copy_of_the_bundle_it_checked(
    tmp_path: Path, history: History, unique: str
) -> None:
    result = retrain(
        _settings(tmp_path, unique), history, history.end, tracking_uri=(tmp_path / "m").as_uri()
    )
    assert result.decision is not None
    gc.collect()
    # The logged pyfunc was loaded back and asked for a forecast; MLflow keeps the last model it loaded
    # from code in a module global, and with it that bundle's tables, unless the check lets go of them.
    copies = [
        o
        for o in gc.get_objects()
        if isinstance(o, ForecasterBundle) and o is not result.bundle and o.models == result.bundle.models
    ]
    assert copies == []
    assert not result.bundle.compiled  # the driver saved and logged it without building its tables


def test_retrain_run_has_params_metrics_json_and_plots(tmp_path: Path, history: History, unique: str) -> None:
    settings = _settings(tmp_path, unique)
    uri = (tmp_path / "mlruns").as_uri()
    result = retrain(settings, history, history.end, tracking_uri=uri)
    assert result.decision is not None
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(result.decision.run_id)
    assert run.data.params["models"] == "10"
    assert "agg.brier_skill" in run.data.metrics
    assert not any(k.startswith("model.") for k in run.data.metrics)  # per model: a table, not metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "backtest")}
    assert {
        "backtest/reliability.png",
        "backtest/forecast_vs_actual.png",
        "backtest/backtest.json",
        "backtest/per_model.csv",
    } <= artifacts
    table = pd.read_csv(client.download_artifacts(run.info.run_id, "backtest/per_model.csv", str(tmp_path)))
    assert list(table.columns) == ["model", *PER_MODEL_COLUMNS]
    assert sorted(table["model"]) == sorted(history.models)
    assert table["brier"].notna().all()
    params = {a.path for a in client.list_artifacts(run.info.run_id, "params")}
    assert {"params/bundle.json", "params/params.jsonl"} <= params
    local = load_forecaster(f"models:/{settings.forecast.registered_model}@{CHAMPION}", tracking_uri=uri)
    _same_forecasts(result.bundle, local, history.end + 600.0)


def test_tracking_leaves_the_process_environment_and_mlflow_defaults_as_it_found_them(
    tmp_path: Path, history: History, unique: str
) -> None:
    # The scheduler retrains in a job thread: nothing it does may redirect the rest of the process.
    rate_only = SelectionConfig(families=("rate",))
    # A first retrain sets up what MLflow and its dependencies set up once per process (imports, telemetry).
    warm = (tmp_path / "warm").as_uri()
    retrain(_settings(tmp_path, f"{unique}-warm"), history, history.end, tracking_uri=warm, config=rate_only)
    environment, default_uri = dict(os.environ), mlflow.get_tracking_uri()
    settings = _settings(tmp_path, unique)
    uri = (tmp_path / "mlruns").as_uri()
    result = retrain(settings, history, history.end, tracking_uri=uri, config=rate_only)
    assert result.decision is not None
    loaded = load_forecaster(f"models:/{settings.forecast.registered_model}/1", tracking_uri=uri)
    _same_forecasts(result.bundle, loaded, history.end + 600.0)
    assert dict(os.environ) == environment
    assert mlflow.get_tracking_uri() == default_uri


def test_unreachable_tracking_server_is_a_transient_tracking_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # MLflow's own HTTP retries would back off for minutes before giving up.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with pytest.raises(TrackingError) as caught:
        load_forecaster("models:/nope@champion", tracking_uri="http://127.0.0.1:9")
    assert caught.value.transient


def test_champion_logged_to_the_server_loads_back_and_predicts_the_same_numbers(
    tmp_path: Path, history: History, unique: str, mlflow_uri: str, s3_endpoint: str
) -> None:
    settings = _settings(tmp_path, unique)
    result = retrain(settings, history, history.end, tracking_uri=mlflow_uri)
    assert result.decision is not None
    assert result.decision.promoted
    uri = f"models:/{settings.forecast.registered_model}@{CHAMPION}"
    loaded = load_forecaster(uri, tracking_uri=mlflow_uri)
    _same_forecasts(result.bundle, loaded, history.end + 300.0)
    # The idle-time profile travels with the champion: LiveForecasts on the server's copy is the same.
    assert loaded.idle is not None
    assert result.bundle.idle is not None
    np.testing.assert_array_equal(loaded.idle.prior, result.bundle.idle.prior)
    # The generic pyfunc face gives the same numbers too (model code, not a pickle).
    mlflow.set_tracking_uri(mlflow_uri)
    frame = mlflow.pyfunc.load_model(uri).predict(
        pd.DataFrame({"now": [history.end + 300.0], "horizon_s": [600]})
    )
    first = history.models[0]
    expected = result.bundle.predict(history.end + 300.0, 600)[first].p_any
    got = frame[frame["model"] == first]["p_any"].to_numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6)
