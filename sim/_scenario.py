"""Ready-made inputs for a simulation: a virtual catalog of realistic model sizes for the models of a
trace, and a default cluster, so a trace alone is enough to compare policies; and a long-tail fleet
(thousands of models, mostly small) for measuring the simulator at a platform's scale."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models import Catalog, ModelSpec
from scheduler import Cluster
from sim._generators import DAY, SIZE_LADDER_GB, Clock, Events, catalog_for, fleet

__all__ = ["DEFAULT_SIZES", "LONG_TAIL_MIX", "LongTail", "default_cluster", "long_tail", "virtual_catalog"]

# FP16 weights of common open models: 7B, 8B, 14B, 20B, 35B and 70B parameters.
DEFAULT_SIZES = (14 * 10**9, 16 * 10**9, 28 * 10**9, 40 * 10**9, 70 * 10**9, 140 * 10**9)


def virtual_catalog(models: Sequence[str], sizes: Sequence[int] = DEFAULT_SIZES) -> Catalog:
    """A catalog entry per model, sizes cycled in order: nothing is downloaded in a simulation."""
    return Catalog(
        ModelSpec(
            id=m, version="1", uri=f"s3://models/{m}.safetensors", size_bytes=int(sizes[i % len(sizes)])
        )
        for i, m in enumerate(models)
    )


def default_cluster(nodes: int = 2, gpus: int = 2) -> Cluster:
    """Nodes of ``gpus`` × 80 GB GPUs with 200 GB of pinned host cache and 1 TB of NVMe per GPU (2 GPUs:
    400 GB and 2 TB; 8 GPUs: 1.6 TB and 8 TB, as an 8-GPU server carries), at typical bandwidths."""
    return Cluster.from_data(
        {
            "nodes": [
                {
                    "name": f"gpu-{k}",
                    "gpus": [{"memory_bytes": "80GB"}] * gpus,
                    "host_cache_bytes": 200 * 10**9 * gpus,
                    "disk_cache_bytes": 10**12 * gpus,
                }
                for k in range(nodes)
            ],
            "bandwidth": {"l3_bytes_per_s": "1GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"},
        }
    )


LONG_TAIL_MIX = {
    1.0: 0.20,
    3.0: 0.20,
    7.0: 0.20,
    14.0: 0.15,
    16.0: 0.10,
    28.0: 0.07,
    40.0: 0.05,
    70.0: 0.02,
    140.0: 0.01,
}
"""Share of a long tail's models at each size of the suite's ladder (GB): a platform that hosts
thousands of models hosts mostly small ones (fine-tuned 0.5-8B variants, merged adapters), a few large
ones. Mean 12.7 GB a model: 10,000 models are 127 TB of weights against the 64 TB of GPU memory and
160 TB of host cache of 100 nodes of 8 × 80 GB (``default_cluster(100, 8)``)."""


@dataclass(frozen=True)
class LongTail:
    """A long-tail fleet's trace: ``events`` (``timestamp``, ``model``) from ``start - warmup_s`` to
    ``end``, and its catalog."""

    events: Any  # pandas.DataFrame
    catalog: Catalog
    start: float
    end: float


def long_tail(models: int, hours: float, *, seed: int = 0, warmup_s: float = 4 * 3600.0) -> LongTail:
    """``models`` models of the trace suite's background fleet (``sim._generators.fleet``: log-normal
    popularity of median 60 requests a day, each with its own daily cycle; about 520 requests a model
    a day), sized by ``LONG_TAIL_MIX``, over ``warmup_s`` of warm-up and ``hours`` simulated."""
    rng = np.random.default_rng(seed)
    origin = 1_800_000_000.0 - 1_800_000_000.0 % DAY  # a UTC midnight, a Tuesday
    minutes = round((warmup_s + hours * 3600.0) / 60.0)
    events = Events(Clock(origin, minutes), rng)
    fleet(events, [f"m-{i:05d}" for i in range(models)])
    shares = np.array([LONG_TAIL_MIX[gb] for gb in SIZE_LADDER_GB])
    counts = np.floor(shares / shares.sum() * models).astype(np.int64)
    counts[0] += models - int(counts.sum())
    pool = np.repeat(SIZE_LADDER_GB, counts).tolist()
    start = origin + warmup_s
    return LongTail(
        events.frame(), catalog_for(events.models, rng, pool_gb=pool), start, start + hours * 3600
    )
