"""Builders shared by the scheduler tests: catalogs, node states and forecasts without ceremony."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from forecaster import ModelForecast
from models import Catalog, ModelSpec, PriorityClass
from prewarm import ExecutorState, GpuState, Hint, ResidentModel, Tier, TierState
from scheduler import Cluster, ClusterState

GB = 10**9
NOW = 1_800_000_000.0


def spec(model: str, size: int, priority: PriorityClass = PriorityClass.STANDARD) -> ModelSpec:
    return ModelSpec(
        id=model, version="1", uri=f"file:///w/{model}.safetensors", size_bytes=size, priority=priority
    )


def catalog(*specs: ModelSpec) -> Catalog:
    return Catalog(specs)


def cluster(
    *names: str, l0: int = 80 * GB, l1: int = 200 * GB, l2: int = 2000 * GB, gpus: Sequence[int] = ()
) -> Cluster:
    """Nodes of one GPU of ``l0`` bytes, or of the GPUs ``gpus`` (bytes each) where given."""
    devices = [{"memory_bytes": g} for g in gpus] if gpus else [{"memory_bytes": l0}]
    return Cluster.from_data(
        {
            "nodes": [
                {"name": n, "gpus": devices, "host_cache_bytes": l1, "disk_cache_bytes": l2} for n in names
            ],
            "bandwidth": {"l3_bytes_per_s": "1GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"},
        }
    )


def resident(
    model: str,
    size: int,
    *,
    loaded_at: float | None = None,
    last_used: float | None = None,
    prefetched: bool = False,
    pins: int = 0,
    gpus: Sequence[int] = (),
) -> ResidentModel:
    return ResidentModel(
        model=model,
        version="1",
        bytes=size,
        loaded_at=loaded_at,
        last_used=last_used,
        prefetched=prefetched,
        pins=pins,
        gpus=list(gpus),
    )


def report(
    node: str,
    tiers: Mapping[Tier, Iterable[ResidentModel]],
    *,
    capacity: dict[Tier, int],
    at: float = NOW,
    gpus: Sequence[int] = (),
) -> ExecutorState:
    """A node's report; ``gpus``: L0 per GPU, each GPU's use counted from the L0 residents' shards."""
    states = []
    for tier in (Tier.L0, Tier.L1, Tier.L2):
        models = list(tiers.get(tier, ()))
        states.append(
            TierState(
                tier=tier,
                capacity_bytes=capacity[tier],
                used_bytes=sum(r.bytes for r in models),
                resident=models,
            )
        )
    used = [0] * len(gpus)
    for r in tiers.get(Tier.L0, ()):
        for g in r.gpus:
            used[g] += -(-r.bytes // len(r.gpus))
    gpu_states = [
        GpuState(index=i, capacity_bytes=c, used_bytes=u)
        for i, (c, u) in enumerate(zip(gpus, used, strict=True))
    ]
    return ExecutorState(node=node, at=at, tiers=states, gpus=gpu_states)


def state(c: Cluster, *reports: ExecutorState) -> ClusterState:
    return ClusterState.merge(c, {r.node: r for r in reports})


def hint(
    model: str,
    *,
    eta_s: float = 0.0,
    ttl_s: float = 600.0,
    confidence: float = 1.0,
    source: str = "web",
    at: float = NOW,
) -> Hint:
    return Hint(model=model, eta_s=eta_s, ttl_s=ttl_s, confidence=confidence, source=source, received_at=at)


def flat_forecast(
    model: str, p: float, *, start: float = NOW, buckets: int = 120, bucket_s: int = 60
) -> ModelForecast:
    return ModelForecast(
        model=model,
        start=start,
        bucket_s=bucket_s,
        expected=np.full(buckets, p),
        p_any=np.full(buckets, p),
        family="test",
    )


def steady_forecast(
    model: str, per_minute: float, *, start: float = NOW, buckets: int = 120, bucket_s: int = 60
) -> ModelForecast:
    """``per_minute`` requests a minute on average, as a Poisson process."""
    expected = np.full(buckets, per_minute * bucket_s / 60.0)
    return ModelForecast(
        model=model,
        start=start,
        bucket_s=bucket_s,
        expected=expected,
        p_any=-np.expm1(-expected),
        family="test",
    )


def surge_forecast(
    model: str, surge_at: float, *, start: float = NOW, buckets: int = 120, bucket_s: int = 60, p: float = 0.9
) -> ModelForecast:
    """No request before ``surge_at``; from then on a chance ``p`` of one in each bucket, from a Poisson
    count (whose mean is ``-ln(1 - p)``)."""
    times = start + bucket_s * np.arange(buckets)
    probs = np.where(times >= surge_at, p, 0.0)
    return ModelForecast(
        model=model, start=start, bucket_s=bucket_s, expected=-np.log1p(-probs), p_any=probs, family="test"
    )
