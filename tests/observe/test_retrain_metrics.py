"""The scheduler's retrain says how it went, and the forecaster it serves says how good and how fresh
it is: read from the metrics, on a runtime that is never started (a retrain needs no Kafka)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from metrics_helpers import metric_delta, sample
from status_builders import GB

from forecaster import History, RetrainResult, SelectionConfig, retrain
from ingest import DemandStore, generate
from models import Catalog, ModelSpec
from prewarm import ForecastError, Settings, load_settings
from scheduler import Cluster
from scheduler._runtime import Runtime


def test_retrain_outcomes_and_the_served_champion_s_skill_are_exported(tmp_path: Path) -> None:
    trace = generate(4, 8, seed=5)
    history = History(trace.models, int(trace.start), trace.counts.astype(np.float64))
    settings = load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "database_url": f"sqlite:///{tmp_path / 'scheduler.db'}",
            "history_days": 14,
            "holdout_days": 2.0,
        }
    )
    outcomes: list[str] = []

    def retrainer(s: Settings, store: DemandStore, now: float) -> RetrainResult:
        if outcomes.pop(0) == "fail":
            raise ForecastError("no models with demand history to train on")
        return retrain(s, history, history.end, track=False, config=SelectionConfig(families=("rate",)))

    catalog = Catalog(
        [ModelSpec(id=m, version="1", uri=f"file:///w/{m}", size_bytes=GB) for m in history.models]
    )
    runtime = Runtime(settings, catalog, Cluster.from_data({"nodes": [{"name": "a"}]}), retrain=retrainer)
    outcomes += ["fail", "train"]
    with metric_delta("prewarm_scheduler_retrains_total", {"outcome": "failed"}) as failed:
        runtime.retrain()
    assert failed.delta == 1
    with metric_delta("prewarm_scheduler_retrains_total", {"outcome": "unjudged"}) as unjudged:
        runtime.retrain()
    assert unjudged.delta == 1
    served = runtime.forecaster
    assert served is not None
    assert (
        sample("prewarm_scheduler_champion_brier_skill", {"against": "baseline"})
        == served.summary["brier_skill"]
    )
    assert (
        sample("prewarm_scheduler_champion_brier_skill", {"against": "time_of_week"})
        == (served.summary["brier_skill_vs_time_of_week"])
    )
    assert sample("prewarm_scheduler_champion_trained_until_timestamp_seconds") == served.trained_until
    assert (sample("prewarm_scheduler_retrain_seconds") or 0) > 0
