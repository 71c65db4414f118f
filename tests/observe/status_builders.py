"""A scheduler core with a catalog, a cluster and a node's report, for the status page's tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from models import Catalog, ModelSpec
from prewarm import ExecutorState, GpuState, Order, ResidentModel, SchedulerSettings, Tier, TierState
from scheduler import Cluster, PlannerConfig, SchedulerCore

GB = 10**9
MODELS = ("chat-7b", "search-embed", "org/vision-13b")
WRITER = "shop:s3cret-shop"
READER = "dash:rd-dash"
PUBLISHABLE = "web:pk-web"


def settings(**overrides: object) -> SchedulerSettings:
    return SchedulerSettings.model_validate(
        {"hint_tokens": WRITER, "read_tokens": READER, "publishable_tokens": PUBLISHABLE, **overrides}
    )


def core(clock: Callable[[], float] = time.time) -> tuple[SchedulerCore, list[Order]]:
    sent: list[Order] = []
    specs = [
        ModelSpec(id=m, version="1", uri=f"file:///w/{m.replace('/', '_')}.safetensors", size_bytes=GB)
        for m in MODELS
    ]
    cluster = Cluster.from_data(
        {
            "nodes": [
                {
                    "name": "gpu-a",
                    "gpus": [{"memory_bytes": 80 * GB}],
                    "host_cache_bytes": 200 * GB,
                    "disk_cache_bytes": 2000 * GB,
                }
            ],
            "bandwidth": {"l3_bytes_per_s": "1GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"},
        }
    )
    scheduler = SchedulerCore(
        catalog=Catalog(specs), cluster=cluster, config=PlannerConfig(), dispatch=sent.extend, clock=clock
    )
    return scheduler, sent


def report(at: float) -> ExecutorState:
    """gpu-a holds search-embed in L0 (on GPU 0) and a prefetched, unused chat-7b in L1."""
    l0 = [ResidentModel(model="search-embed", version="1", bytes=GB, loaded_at=at - 60, gpus=[0])]
    l1 = [ResidentModel(model="chat-7b", version="1", bytes=2 * GB, loaded_at=at - 30, prefetched=True)]
    return ExecutorState(
        node="gpu-a",
        at=at,
        tiers=[
            TierState(tier=Tier.L0, capacity_bytes=80 * GB, used_bytes=GB, resident=l0),
            TierState(tier=Tier.L1, capacity_bytes=200 * GB, used_bytes=2 * GB, resident=l1),
            TierState(tier=Tier.L2, capacity_bytes=2000 * GB, used_bytes=0, resident=[]),
        ],
        gpus=[GpuState(index=0, capacity_bytes=80 * GB, used_bytes=GB)],
    )
