"""Synthetic traffic → Kafka → ingest → demand store → forecaster → scheduler → orders → executor.

Three days of history with a daily surge that, today, begins a minute or two from now. The forecaster
is retrained on what ingest counted, the scheduler plans from its forecast, and the executor must hold
the surge model in L1 or L0 before the surge begins. CPU stands in for L0; the surge model is 2 MB.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from live_builders import MB, executor_for, models, tier_of
from stack_settings import settings_for_stack
from wait_helpers import wait_for

import forecaster
from executor import ExecutorDaemon
from ingest import DemandStore, IngestConsumer, RequestLogProducer, replay_frame
from prewarm import Settings, Tier
from scheduler import Cluster
from scheduler._runtime import Runtime

pytestmark = pytest.mark.slow


def history(surge_at: float, now: float, days: int = 3) -> pd.DataFrame:
    """m0: 20 requests a minute for 15 minutes each day at the surge time; m1: one every 5 minutes."""
    rows = [
        (surge_at - d * 86400 + minute * 60 + k * 2.9, "m0")
        for d in range(1, days + 1)
        for minute in range(15)
        for k in range(20)
    ]
    rows += [(float(t), "m1") for t in np.arange(now - days * 86400, now - 120, 300.0)]
    return pd.DataFrame(rows, columns=["timestamp", "model"]).sort_values("timestamp", ignore_index=True)


def ingest_all(settings: Settings, frame: pd.DataFrame, group: str) -> None:
    producer = RequestLogProducer.from_settings(settings.kafka, settings.ingest)
    replay_frame(frame, producer)
    producer.flush()
    producer.close()
    store = DemandStore(settings.database_url)
    consumer = IngestConsumer(store, settings.kafka, settings.ingest, group=group)
    summary = consumer.run(max_records=len(frame), idle_exit_s=10)
    store.close()
    assert summary.records == len(frame)


def test_daily_surge_model_is_in_l1_or_l0_before_the_surge(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    now = time.time()
    surge_at = (math.floor(now / 60) + 2) * 60  # a minute boundary 60-120 s away
    settings = settings_for_stack(
        kafka_bootstrap, unique, tmp_path, topic_requests=f"requests-{unique}", history_days="3"
    )
    ingest_all(settings, history(surge_at, now), group=f"ingest-{unique}")

    cat = models(tmp_path / "weights", 2)
    executor = executor_for(f"node-{unique}", cat, tmp_path / "cache", l0=32 * MB, l1=32 * MB)
    daemon = ExecutorDaemon(executor, settings.kafka, state_interval_s=0.5).start()

    def retrain(s: Settings, store: Any, at: float) -> Any:
        # Tracking is the forecaster's concern and has its own tests; here only the bundle matters.
        return forecaster.retrain(s, store, at, track=False)

    cluster = Cluster.from_data({"nodes": [{"name": executor.settings.node_name}]})
    runtime = Runtime(settings, cat, cluster, retrain=retrain).start()
    try:
        assert tier_of(executor, "m0") is Tier.L3
        runtime.retrain()  # the daily cron job, run now
        runtime.tick()
        forecast = runtime.core.model_view("m0")["forecast"]
        assert forecast is not None
        assert forecast["family"] != "recent_rate"  # the trained forecaster, not the fallback
        held: Callable[[], bool] = lambda: tier_of(executor, "m0").level <= Tier.L1.level  # noqa: E731
        wait_for(held, max(surge_at - time.time() - 1, 1), "the surge model in L1 or L0")
        assert time.time() < surge_at
    finally:
        runtime.stop()
        daemon.stop()
        executor.close()
