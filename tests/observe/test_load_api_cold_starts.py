"""A requested load that finds the model farther than the tier asked is a cold start, counted by model
and by the tier it was served from; one that finds it there already is not."""

from __future__ import annotations

from pathlib import Path

from executor_testkit import executor_settings, make_model, s3_settings
from fastapi.testclient import TestClient
from metrics_helpers import metric_delta

from executor import Executor
from executor._http import create_app
from models import Catalog
from prewarm import model_label


def test_a_load_from_object_storage_is_a_cold_start_and_a_load_already_in_l1_is_not(tmp_path: Path) -> None:
    spec = make_model(tmp_path / "weights", "cold-start-model", seed=3)
    executor = Executor(
        Catalog([spec]), executor=executor_settings(), s3=s3_settings(), cache_dir=tmp_path / "cache"
    )
    app = create_app(executor, node="n", healthy=lambda: True, loaded=lambda: None, token=None)
    label = model_label(spec.id)
    try:
        with TestClient(app) as http:
            with (
                metric_delta(
                    "prewarm_executor_cold_starts_total", {"model": label, "served_from": "L3"}
                ) as cold,
                metric_delta(
                    "prewarm_executor_cold_start_wait_seconds_total", {"model": label, "served_from": "L3"}
                ) as waited,
            ):
                first = http.post("/v1/load", json={"model": spec.id, "tier": "L1"})
            assert first.status_code == 200, first.text
            assert first.json()["served_from"] == "L3"
            assert cold.delta == 1
            assert 0 < waited.delta <= first.json()["wait_s"] + 1e-6
            counted = metric_delta(
                "prewarm_executor_cold_starts_total",
                *({"model": label, "served_from": t} for t in ("L0", "L1", "L2", "L3")),
            )
            again = http.post("/v1/load", json={"model": spec.id, "tier": "L1"})
            assert again.json()["served_from"] == "L1"
            assert counted.delta == 0
    finally:
        executor.close()
