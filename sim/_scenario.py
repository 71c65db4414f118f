"""Ready-made inputs for a simulation: a virtual catalog of realistic model sizes for the models of a
trace, and a default cluster, so a trace alone is enough to compare policies."""

from __future__ import annotations

from collections.abc import Sequence

from models import Catalog, ModelSpec
from scheduler import Cluster

__all__ = ["DEFAULT_SIZES", "default_cluster", "virtual_catalog"]

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


def default_cluster(nodes: int = 2) -> Cluster:
    """Nodes of 2 × 80 GB GPUs, 400 GB of pinned host cache and 2 TB of NVMe, at typical bandwidths."""
    return Cluster.from_data(
        {
            "nodes": [
                {
                    "name": f"gpu-{k}",
                    "gpus": [{"memory_bytes": "80GB"}, {"memory_bytes": "80GB"}],
                    "host_cache_bytes": "400GB",
                    "disk_cache_bytes": "2TB",
                }
                for k in range(nodes)
            ],
            "bandwidth": {"l3_bytes_per_s": "1GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"},
        }
    )
