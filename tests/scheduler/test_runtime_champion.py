"""The live scheduler serves only the champion forecaster, and picks up a promotion without a restart.

On the local stack's MLflow server: the runs, the registry and the alias are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest
from scheduler_builders import GB, catalog, cluster, spec

from forecaster import CHAMPION, History, RetrainResult, SelectionConfig, retrain
from ingest import DemandStore
from prewarm import Settings, load_settings
from scheduler._runtime import Runtime

RATE_ONLY = SelectionConfig(families=("rate",))  # scores below the full selection on this history


@pytest.fixture(scope="module")
def history() -> History:
    from ingest import generate

    trace = generate(10, 8, seed=11)
    return History(trace.models, int(trace.start), trace.counts.astype(np.float64))


@pytest.fixture
def settings(tmp_path: Path, unique: str, mlflow_uri: str, s3_endpoint: str) -> Settings:
    return load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "database_url": f"sqlite:///{tmp_path / 'scheduler.db'}",
            "history_days": 14,
            "holdout_days": 2.0,
            "mlflow_tracking_uri": mlflow_uri,
            "mlflow_experiment": f"test-{unique}",
            "registered_model": f"prewarm-forecaster-{unique}",
        }
    )


class Retrains:
    """A retrainer for the runtime that trains on a fixed history, each time with the next selection."""

    def __init__(self, history: History, *configs: SelectionConfig | None) -> None:
        self.history, self.configs, self.results = history, list(configs), list[RetrainResult]()

    def __call__(self, settings: Settings, store: DemandStore, now: float) -> RetrainResult:
        config = self.configs.pop(0)
        result = retrain(settings, self.history, self.history.end, config=config)
        self.results.append(result)
        return result


def runtime(settings: Settings, history: History, retrains: Retrains) -> Runtime:
    """A runtime that is never started: retraining and the registry need neither Kafka nor jobs."""
    return Runtime(settings, catalog(*(spec(m, GB) for m in history.models)), cluster("a"), retrain=retrains)


def same_forecasts(a: object, b: object, now: float) -> bool:
    fa, fb = a.predict(now), b.predict(now)  # type: ignore[attr-defined]
    return fa.keys() == fb.keys() and all(np.allclose(fa[m].p_any, fb[m].p_any) for m in fa)


def test_a_retrain_that_loses_the_champion_comparison_is_not_served(
    settings: Settings, history: History
) -> None:
    retrains = Retrains(history, None, RATE_ONLY)
    rt = runtime(settings, history, retrains)
    rt.retrain()
    champion = retrains.results[0]
    assert champion.decision is not None
    assert champion.decision.promoted
    assert rt.forecaster is champion.bundle
    assert champion.bundle.compiled  # built in the retrain's job, not at the first planning round
    assert rt.forecaster_version == champion.decision.model_version
    rt.retrain()
    worse = retrains.results[1]
    assert worse.decision is not None
    assert not worse.decision.promoted
    assert rt.forecaster is champion.bundle
    assert rt.forecaster_version == champion.decision.model_version


def test_a_promotion_in_the_registry_is_served_at_the_next_poll_without_a_restart(
    settings: Settings, history: History, mlflow_uri: str
) -> None:
    retrains = Retrains(history, None, RATE_ONLY)
    rt = runtime(settings, history, retrains)
    rt.retrain()
    rt.retrain()
    champion, worse = retrains.results
    assert worse.decision is not None
    assert worse.decision.model_version is not None
    assert rt.poll_champion() == champion.decision.model_version  # type: ignore[union-attr]
    # Someone promotes the other version by hand.
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    name = settings.forecast.registered_model
    client.set_registered_model_alias(name, CHAMPION, worse.decision.model_version)
    assert rt.poll_champion() == worse.decision.model_version
    assert rt.forecaster_version == worse.decision.model_version
    assert same_forecasts(rt.forecaster, worse.bundle, history.end + 300.0)


def test_a_scheduler_whose_first_retrain_loses_serves_the_registry_champion(
    settings: Settings, history: History
) -> None:
    first = Retrains(history, None)
    runtime(settings, history, first).retrain()  # another scheduler made the champion
    retrains = Retrains(history, RATE_ONLY)
    rt = runtime(settings, history, retrains)
    rt.retrain()
    assert rt.forecaster is None  # the loser is not served, even with nothing else to serve
    assert rt.poll_champion() == first.results[0].decision.model_version  # type: ignore[union-attr]
    assert same_forecasts(rt.forecaster, first.results[0].bundle, history.end + 300.0)
