"""The scheduler: turns forecasts, hints and executor reports into timed prefetch/evict orders.

The planner is pure (``plan``); the hint API, the APScheduler runtime and Kafka I/O sit around it.
"""

from __future__ import annotations

from scheduler._cluster import Cluster, ClusterState, NodeSpec, NodeState
from scheduler._planner import DEMAND_SOURCE, Placement, Plan, PlannerConfig, order_id, plan, plan_detailed

__all__ = [
    "DEMAND_SOURCE",
    "Cluster",
    "ClusterState",
    "NodeSpec",
    "NodeState",
    "Placement",
    "Plan",
    "PlannerConfig",
    "order_id",
    "plan",
    "plan_detailed",
]
