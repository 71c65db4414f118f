"""The simulator's figures on small long-tail worlds, pinned: speeding up its hot paths must not move them.

``scale_reference.json`` was written by ``snapshot`` at the commit before the simulator was made fast
at 10,000 models (routing, LRU room, links), so every figure of every baseline on these worlds is the
one the old code gave. Regenerate it only for a change that means to move the figures:

    .venv/bin/python -c "import tests.sim.test_scale_reference as t; t.write_reference()"
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scheduler import Cluster
from sim import run_policies
from sim._generators import Clock, Events, catalog_for, fleet

REFERENCE = Path(__file__).with_name("scale_reference.json")
DAY = 86_400.0
START = 1_800_000_000.0 - 1_800_000_000.0 % DAY  # a UTC midnight
POLICIES = ("reactive", "keepalive:600", "histogram", "oracle")
# (models, nodes, GPUs per node, host cache): a roomy world where most loads find room, and a tight one
# where loads queue for room and the LRU has to choose across GPUs and nodes.
WORLDS = {"roomy": (300, 4, 8, "1TB"), "tight": (120, 3, 2, "200GB")}


def _world(name: str) -> tuple[Any, Any, Cluster]:
    models, nodes, gpus, host = WORLDS[name]
    rng = np.random.default_rng(3)
    events = Events(Clock(START, 10 * 60), rng)
    fleet(events, [f"m-{i:04d}" for i in range(models)], median_per_day=120.0)
    catalog = catalog_for(events.models, rng)
    cluster = Cluster.from_data(
        {
            "nodes": [
                {
                    "name": f"gpu-{k}",
                    "gpus": [{"memory_bytes": "80GB"}] * gpus,
                    "host_cache_bytes": host,
                    "disk_cache_bytes": "4TB",
                }
                for k in range(nodes)
            ],
            "bandwidth": {"l3_bytes_per_s": "2GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"},
        }
    )
    return events.frame(), catalog, cluster


def snapshot(world: str, policy: str) -> dict[str, Any]:
    """Every figure of one run, the per-model rates folded into a digest to keep the file readable."""
    frame, catalog, cluster = _world(world)
    start = START + 4 * 3600  # four hours of warm-up, six counted
    result = run_policies(frame, catalog, cluster, [policy], start=start, end=start + 6 * 3600)[policy]
    data = result.to_json()
    per_model = data.pop("model_cold_start_rate")
    blob = json.dumps(per_model, sort_keys=True).encode()
    data["model_cold_start_rate_sha256"] = hashlib.sha256(blob).hexdigest()
    # Through JSON, as the file holds it: tiers and floats compare as they were written.
    loaded: dict[str, Any] = json.loads(json.dumps(data, default=str))
    return loaded


def write_reference() -> None:
    runs = {f"{w} {p}": snapshot(w, p) for w in WORLDS for p in POLICIES}
    REFERENCE.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("world", sorted(WORLDS))
def test_baselines_figures_equal_the_pinned_reference(world: str, policy: str) -> None:
    reference = json.loads(REFERENCE.read_text())[f"{world} {policy}"]
    got = snapshot(world, policy)
    assert got["requests"] > 1000  # a world with traffic enough to exercise loads, queues and the LRU
    assert got == reference
