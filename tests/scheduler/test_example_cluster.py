from __future__ import annotations

from pathlib import Path

from scheduler import Cluster

REPO = Path(__file__).resolve().parents[2]


def test_example_cluster_file_loads() -> None:
    cluster = Cluster.load(REPO / "deploy" / "examples" / "cluster.yaml")
    assert len(cluster.nodes) >= 2
    assert cluster.bandwidth.l3_bytes_per_s > 0
