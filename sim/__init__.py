"""Trace-driven cluster simulation: the real planner against baseline policies on a virtual clock.

    results = run_policies(events, catalog, cluster, ["reactive", "keepalive:600", "oracle", "prewarm"],
                           start=cut, end=cut + 48 * 3600, forecasts=bundle.predict)
    results["keepalive:600"].to_json()    # the metrics of one policy

``World`` plays the executors (GPU memory per GPU, host and disk caches per node, transfers sharing a
link's bandwidth, the executor's rules from the spine); ``UnlimitedWorld`` is the serverless comparison
(one tier without limit, instant loads). ``Policy`` is the one interface a compared policy implements;
``make_policy`` builds one from its label and ``register_policy`` adds a kind. ``SimMetrics`` is the one
definition of what a run measured, for every policy.
"""

from __future__ import annotations

from sim._compiled import CompileError, compile_dir, compile_run_loop, install, is_compiled, running_compiled

install()  # before the modules it names are imported: the compiled run loop, when built

from sim._bench import SETTINGS, PolicyBench, Target, judge, run_policy_bench
from sim._bound import poisson_idle_bound
from sim._generators import roomy_cluster
from sim._hints import read_hints
from sim._histogram import HistogramPolicy, IdleHistogram, Windows
from sim._metrics import MISPREDICTED_BY, SimMetrics, metrics
from sim._oracle import OraclePolicy
from sim._policies import (
    DEFAULT_POLICIES,
    UNLIMITED_NODE,
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
from sim._run import (
    WARMUP_S,
    Progress,
    available,
    compare,
    fit_forecasts,
    make_world,
    run_policies,
    simulate,
)
from sim._scenario import DEFAULT_SIZES, LONG_TAIL_MIX, LongTail, default_cluster, long_tail, virtual_catalog
from sim._suite import SUITE_CASES, Case, ModelTruth, suite, write_case
from sim._sweep import (
    DEFAULT_KNOBS,
    Matched,
    SweepPoint,
    SweepResult,
    dominated,
    label_grid,
    pareto_front,
    sweep,
)
from sim._unlimited import UnlimitedWorld
from sim._world import World

__all__ = [
    "DEFAULT_KNOBS",
    "DEFAULT_POLICIES",
    "DEFAULT_SIZES",
    "LONG_TAIL_MIX",
    "MISPREDICTED_BY",
    "SETTINGS",
    "SUITE_CASES",
    "UNLIMITED_NODE",
    "WARMUP_S",
    "Case",
    "CompileError",
    "HistogramPolicy",
    "IdleHistogram",
    "KeepAlivePolicy",
    "LongTail",
    "Matched",
    "ModelTruth",
    "NodeShape",
    "OraclePolicy",
    "Policy",
    "PolicyBench",
    "PolicyContext",
    "PolicyFactory",
    "PolicyInputs",
    "PrewarmPolicy",
    "Progress",
    "ReactivePolicy",
    "Requests",
    "SimMetrics",
    "SweepPoint",
    "SweepResult",
    "Target",
    "UnlimitedWorld",
    "Windows",
    "World",
    "available",
    "compare",
    "compile_dir",
    "compile_run_loop",
    "default_cluster",
    "dominated",
    "fit_forecasts",
    "is_compiled",
    "judge",
    "knob_float",
    "label_grid",
    "long_tail",
    "make_policy",
    "make_world",
    "metrics",
    "order_for",
    "pareto_front",
    "poisson_idle_bound",
    "policy_kinds",
    "read_hints",
    "register_policy",
    "roomy_cluster",
    "run_policies",
    "run_policy_bench",
    "running_compiled",
    "simulate",
    "suite",
    "sweep",
    "virtual_catalog",
    "write_case",
]
