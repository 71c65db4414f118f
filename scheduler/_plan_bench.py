"""``prewarm bench plan``: the planner at scale, without HTTP or Kafka.

Full planning rounds, and hint → orders through ``SchedulerCore.add_hint`` against a loaded plan, on a
synthetic catalog and cluster (``_plan_world``). The loaded plan is made by the planner itself: its
orders are carried out (the spine's ``effect``, as an executor does) and reported back until a round
orders nothing new.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from forecaster import ModelForecast
from models import Catalog, ModelSpec
from prewarm import CACHE_TIERS, ExecutorState, GpuState, Hint, Order, ResidentModel, Tier, TierState, effect
from scheduler._cluster import Cluster
from scheduler._core import SchedulerCore
from scheduler._planner import PlannerConfig

__all__ = ["bench_plan"]

_GB = 10**9
_GPU_BYTES = 80 * _GB
_HOST_BYTES = 1000 * _GB
_DISK_BYTES = 8000 * _GB
_SIZES_GB = (2, 4, 7, 14, 30, 70)  # a long tail of fine-tunes and adapters, a few large models
_BASE_P = (0.0005, 0.002, 0.01, 0.05, 0.3, 0.8)  # chance of a request per minute, at the mean
_BASE_SHARE = (0.4, 0.2, 0.15, 0.1, 0.1, 0.05)  # most models are rarely used


def _plan_world(
    models: int, nodes: int, gpus: int, now: float, seed: int
) -> tuple[Catalog, Cluster, dict[str, ModelForecast], dict[str, dict[Tier, dict[str, ResidentModel]]]]:
    """A synthetic catalog, cluster and forecasts, and each model staged on one node's disk."""
    rng = np.random.default_rng(seed)
    sizes = rng.choice(_SIZES_GB, size=models)
    base = rng.choice(_BASE_P, size=models, p=_BASE_SHARE)
    phase = rng.uniform(0, 2 * np.pi, size=models)
    specs = [
        ModelSpec(id=f"plan-{i}", version="1", uri=f"file:///bench/plan-{i}", size_bytes=int(sizes[i]) * _GB)
        for i in range(models)
    ]
    node_names = [f"node-{j:03d}" for j in range(nodes)]
    cluster = Cluster.from_data(
        {
            "nodes": [
                {
                    "name": name,
                    "gpus": [{"memory_bytes": _GPU_BYTES}] * gpus,
                    "host_cache_bytes": _HOST_BYTES,
                    "disk_cache_bytes": _DISK_BYTES,
                }
                for name in node_names
            ]
        }
    )
    minutes = np.arange(180)
    forecasts = {}
    for i, s in enumerate(specs):
        # A daily-ish swing around each model's mean: windows worth a prefetch come and go.
        p = np.clip(base[i] * (1 + 0.8 * np.sin(minutes / 20 + phase[i])), 0.0, 0.99)
        forecasts[s.id] = ModelForecast(
            model=s.id, start=now, bucket_s=60, expected=p * 1.5, p_any=p, family="bench"
        )
    held: dict[str, dict[Tier, dict[str, ResidentModel]]] = {
        n: {t: {} for t in CACHE_TIERS} for n in node_names
    }
    for i, s in enumerate(specs):
        node = node_names[i % nodes]
        held[node][Tier.L2][s.id] = ResidentModel(
            model=s.id, version="1", bytes=s.size_bytes, loaded_at=now - 86_400, last_used=now - 3600
        )
    return Catalog(specs), cluster, forecasts, held


def _carry_out(
    held: dict[Tier, dict[str, ResidentModel]], orders: Sequence[Order], catalog: Catalog, now: float
) -> None:
    """What a node's executor does with its orders (the spine's ``effect``), as if each were done."""
    for order in sorted(orders, key=lambda o: (o.not_before, o.id)):
        size = catalog[order.model].size_bytes
        change = effect(order.action, order.tier, [t for t in CACHE_TIERS if order.model in held[t]])
        for tier in change.drops:
            held[tier].pop(order.model, None)
        for tier in change.fills:
            held[tier][order.model] = ResidentModel(
                model=order.model,
                version=order.version,
                bytes=size,
                loaded_at=now - 3600,  # loaded a while ago and used since: the plan is settled
                last_used=now - 600,
                gpus=list(order.gpus) if tier is Tier.L0 else [],
            )


def _report(name: str, held: dict[Tier, dict[str, ResidentModel]], gpus: int, at: float) -> ExecutorState:
    capacity = {Tier.L0: gpus * _GPU_BYTES, Tier.L1: _HOST_BYTES, Tier.L2: _DISK_BYTES}
    used = [0] * gpus
    for r in held[Tier.L0].values():
        for g in r.gpus:
            used[g] += -(-r.bytes // len(r.gpus))
    return ExecutorState(
        node=name,
        at=at,
        tiers=[
            TierState(
                tier=t,
                capacity_bytes=capacity[t],
                used_bytes=sum(r.bytes for r in held[t].values()),
                resident=list(held[t].values()),
            )
            for t in CACHE_TIERS
        ],
        gpus=[GpuState(index=g, capacity_bytes=_GPU_BYTES, used_bytes=used[g]) for g in range(gpus)],
    )


def _quantiles(seconds: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def bench_plan(
    models: int,
    nodes: int,
    gpus: int,
    *,
    rounds: int = 10,
    hints: int = 200,
    baseline_hints: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Full planning rounds and hint → orders at ``models`` models on ``nodes`` nodes of ``gpus`` GPUs.

    Every model starts staged on one node's disk; full rounds are run, and their orders carried out and
    reported, until a round orders nothing new (at most five): the loaded plan. Then ``rounds`` full
    rounds, each a minute after the last (a new forecast bucket: every window is valued again), and
    ``hints`` single hints, 50 ms apart after a full round, each on a model not in GPU memory, timed
    from ``SchedulerCore.add_hint`` to its orders; ``baseline_hints`` more through a core that plans
    every hint with a full round (how every hint was planned before incremental rounds).
    """
    now = 1_800_000_000.0
    catalog, cluster, forecasts, held = _plan_world(models, nodes, gpus, now, seed)
    clock = [now]
    sent: list[Order] = []
    config = PlannerConfig()

    def new_core(incremental: bool) -> SchedulerCore:
        core = SchedulerCore(
            catalog=catalog,
            cluster=cluster,
            config=config,
            dispatch=sent.extend,
            clock=lambda: clock[0],
            incremental=incremental,
        )
        for name in held:
            core.observe(_report(name, held[name], gpus, clock[0]))
        core.set_signals(forecasts=forecasts, demand=[])
        return core

    core = new_core(True)
    started = time.perf_counter()
    for _ in range(5):
        sent.clear()
        if not core.replan():
            break
        for name in held:
            _carry_out(held[name], [o for o in sent if o.node == name], catalog, clock[0])
            core.observe(_report(name, held[name], gpus, clock[0]))
    load_s = time.perf_counter() - started
    resident = {t.value: sum(len(held[n][t]) for n in held) for t in CACHE_TIERS}

    round_s, round_cpu_s = [], []
    for _ in range(rounds):
        clock[0] += 60.0
        t, cpu = time.perf_counter(), time.thread_time()
        core.replan()
        round_s.append(time.perf_counter() - t)
        round_cpu_s.append(time.thread_time() - cpu)

    rng = np.random.default_rng(seed + 1)
    cold = [m for m in catalog.ids() if not any(m in held[n][Tier.L0] for n in held)]
    picks = [
        cold[i] for i in rng.choice(len(cold), size=min(hints + baseline_hints, len(cold)), replace=False)
    ]
    core.replan()  # the full round the hints follow: the planning interval's
    hint_s, hint_cpu_s, with_orders = [], [], 0
    for model in picks[:hints]:
        clock[0] += 0.05
        t, cpu = time.perf_counter(), time.thread_time()
        orders = core.add_hint(Hint(model=model, eta_s=0, ttl_s=600))[1]
        hint_s.append(time.perf_counter() - t)
        hint_cpu_s.append(time.thread_time() - cpu)
        with_orders += bool(orders)
    baseline = new_core(False)
    baseline.replan()
    full_hint_s = []
    for model in picks[hints : hints + baseline_hints]:
        clock[0] += 0.05
        t = time.perf_counter()
        baseline.add_hint(Hint(model=model, eta_s=0, ttl_s=600))
        full_hint_s.append(time.perf_counter() - t)

    round_p50, round_p99 = _quantiles(round_s)
    hint_p50, hint_p99 = _quantiles(hint_s) if hint_s else (math.nan, math.nan)
    # CPU time of the planning thread: on a shared machine, what the round itself cost.
    round_cpu_p50, round_cpu_p99 = _quantiles(round_cpu_s)
    hint_cpu_p50, hint_cpu_p99 = _quantiles(hint_cpu_s) if hint_cpu_s else (math.nan, math.nan)
    out: dict[str, Any] = {
        "models": models,
        "nodes": nodes,
        "gpus": gpus,
        "round_p50_s": round(round_p50, 4),
        "round_p99_s": round(round_p99, 4),
        "hint_p50_s": round(hint_p50, 5),
        "hint_p99_s": round(hint_p99, 5),
        "round_cpu_p50_s": round(round_cpu_p50, 4),
        "round_cpu_p99_s": round(round_cpu_p99, 4),
        "hint_cpu_p50_s": round(hint_cpu_p50, 5),
        "hint_cpu_p99_s": round(hint_cpu_p99, 5),
        "rounds": len(round_s),
        "hints": len(hint_s),
        "hints_with_orders": with_orders,
        "load_s": round(load_s, 2),
        "resident": resident,
        "target_round_p99_s": 1.0,
        "target_hint_p99_s": 0.02,
    }
    if full_hint_s:
        out["hint_full_round_p50_s"] = round(statistics.median(full_hint_s), 4)
    return out
