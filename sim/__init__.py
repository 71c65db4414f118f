"""Trace-driven cluster simulation: the real planner against baseline policies on a virtual clock.

    report = simulate(PrewarmPolicy(catalog, cluster, PlannerConfig(), bundle.predict), cluster, catalog,
                      trace.timestamp, trace.model, start=t0, end=t1)

``World`` plays the executors (bytes per tier per node, transfer times from bandwidth, LRU when an order
does not fit); ``Policy`` is the one interface a compared policy implements.
"""

from __future__ import annotations

from sim._histogram import HistogramPolicy, IdleHistogram, Windows
from sim._policies import (
    DEFAULT_POLICIES,
    KeepAlivePolicy,
    NodeShape,
    Policy,
    PolicyContext,
    PolicyFactory,
    PolicyInputs,
    ReactivePolicy,
    Requests,
    knob_float,
    make_policy,
    order_for,
    policy_kinds,
    register_policy,
)
from sim._prewarm import PrewarmPolicy
from sim._run import SimReport, compare, run_policies, simulate
from sim._scenario import DEFAULT_SIZES, default_cluster, virtual_catalog
from sim._sweep import DEFAULT_KNOBS, SweepPoint, SweepResult, dominated, label_grid, pareto_front, sweep
from sim._world import Served, SimNode, World

__all__ = [
    "DEFAULT_KNOBS",
    "DEFAULT_POLICIES",
    "DEFAULT_SIZES",
    "HistogramPolicy",
    "IdleHistogram",
    "KeepAlivePolicy",
    "NodeShape",
    "Policy",
    "PolicyContext",
    "PolicyFactory",
    "PolicyInputs",
    "PrewarmPolicy",
    "ReactivePolicy",
    "Requests",
    "Served",
    "SimNode",
    "SimReport",
    "SweepPoint",
    "SweepResult",
    "Windows",
    "World",
    "compare",
    "default_cluster",
    "dominated",
    "knob_float",
    "label_grid",
    "make_policy",
    "order_for",
    "pareto_front",
    "policy_kinds",
    "register_policy",
    "run_policies",
    "simulate",
    "sweep",
    "virtual_catalog",
]
