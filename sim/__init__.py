"""Trace-driven cluster simulation: the real planner against baseline policies on a virtual clock.

    report = simulate(PrewarmPolicy(catalog, cluster, PlannerConfig(), bundle.predict), cluster, catalog,
                      trace.timestamp, trace.model, start=t0, end=t1)

``World`` plays the executors (bytes per tier per node, transfer times from bandwidth, LRU when an order
does not fit); ``Policy`` is the one interface a compared policy implements.
"""

from __future__ import annotations

from sim._policies import POLICIES, Policy, PrewarmPolicy, ReactivePolicy
from sim._run import SimReport, compare, run_policies, simulate
from sim._scenario import DEFAULT_SIZES, default_cluster, virtual_catalog
from sim._sweep import DEFAULT_KNOBS, SweepPoint, SweepResult, dominated, label_grid, pareto_front, sweep
from sim._world import Served, SimNode, World

__all__ = [
    "DEFAULT_KNOBS",
    "DEFAULT_SIZES",
    "POLICIES",
    "Policy",
    "PrewarmPolicy",
    "ReactivePolicy",
    "Served",
    "SimNode",
    "SimReport",
    "SweepPoint",
    "SweepResult",
    "World",
    "compare",
    "default_cluster",
    "dominated",
    "label_grid",
    "pareto_front",
    "run_policies",
    "simulate",
    "sweep",
    "virtual_catalog",
]
