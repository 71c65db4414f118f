"""The scheduler: turns forecasts, hints and executor reports into timed prefetch/evict orders.

    orders = plan(now, forecasts, hints, catalog, ClusterState.merge(cluster, reports), PlannerConfig())

``plan`` is pure (the simulator calls it with a virtual clock). Around it: ``SchedulerCore`` (planning
state shared by the API and the runtime), ``create_app`` (the hint API), ``Runtime`` (APScheduler with a
persistent job store, Kafka in and out), ``bench_hints`` (``prewarm bench hints``) and ``bench_plan``
(``prewarm bench plan``). Those are imported
on first use, so a user of the planner alone never loads FastAPI, APScheduler or kafka-python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prewarm import DEMAND_SOURCE
from scheduler._cluster import Cluster, ClusterState, NodeSpec, NodeState
from scheduler._planner import Placement, Plan, PlannerConfig, PlannerMemo, order_id, plan, plan_detailed

if TYPE_CHECKING:
    from scheduler._api import create_app
    from scheduler._bench import bench_hints
    from scheduler._core import SchedulerCore
    from scheduler._plan_bench import bench_plan
    from scheduler._runtime import Runtime

__all__ = [
    "DEMAND_SOURCE",
    "Cluster",
    "ClusterState",
    "NodeSpec",
    "NodeState",
    "Placement",
    "Plan",
    "PlannerConfig",
    "PlannerMemo",
    "Runtime",
    "SchedulerCore",
    "bench_hints",
    "bench_plan",
    "create_app",
    "order_id",
    "plan",
    "plan_detailed",
]


def __getattr__(name: str) -> Any:
    # Plain import statements, not importlib, so that the import contract sees these edges too.
    if name == "create_app":
        from scheduler._api import create_app

        return create_app
    if name == "SchedulerCore":
        from scheduler._core import SchedulerCore

        return SchedulerCore
    if name == "Runtime":
        from scheduler._runtime import Runtime

        return Runtime
    if name == "bench_hints":
        from scheduler._bench import bench_hints

        return bench_hints
    if name == "bench_plan":
        from scheduler._plan_bench import bench_plan

        return bench_plan
    raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
