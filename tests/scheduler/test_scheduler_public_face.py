from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import scheduler
from scheduler import Cluster

REPO = Path(__file__).resolve().parents[2]


def test_public_names_are_pinned() -> None:
    assert scheduler.__all__ == [
        "DEMAND_SOURCE",
        "Cluster",
        "ClusterState",
        "NodeSpec",
        "NodeState",
        "Placement",
        "Plan",
        "PlannerConfig",
        "Runtime",
        "SchedulerCore",
        "create_app",
        "order_id",
        "plan",
        "plan_detailed",
    ]


def test_the_planner_alone_loads_no_web_or_broker_library() -> None:
    heavy = "('fastapi', 'apscheduler', 'kafka')"
    code = f"import sys, scheduler; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_example_cluster_file_loads() -> None:
    cluster = Cluster.load(REPO / "deploy" / "examples" / "cluster.yaml")
    assert len(cluster.nodes) >= 2
    assert cluster.bandwidth.l3_bytes_per_s > 0
