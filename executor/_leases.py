"""What an engine holds over the hand-off socket, and what the state report says about the tiers.

``HostLease`` (an L1 block) and ``DeviceLease`` (an L0 copy) are made by ``Executor.lease`` and
``Executor.lease_device`` and ended by ``Executor.release``; ``tier_state`` is one tier's part of the
node's state report, leases and their waits included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from executor._l0 import DeviceModel, Shard
from executor._l1 import HostBlock
from executor._l2 import L2Object
from executor._tier import Entry, ModelKey, TierCache
from models import ModelSpec
from prewarm import ResidentModel, Tier, TierState
from prewarm_client import BlockLayout

__all__ = ["DeviceLease", "HostLease", "tier_state"]


@dataclass(frozen=True)
class HostLease:
    """One engine's hold on a model's L1 block: the block, where its files lie, and how it was got.
    ``shard``: the bytes of the block that are the asking rank's (None: the whole model)."""

    id: str
    spec: ModelSpec
    block: HostBlock
    files: BlockLayout
    served_from: Tier
    wait_s: float
    shard: tuple[int, int] | None = None


@dataclass(frozen=True)
class DeviceLease:
    """One engine's hold on a model's L0 copy: the shards it was given (all, or its rank's), in
    ``mode`` share (it maps this memory) or copy (it clones it, then this copy is freed)."""

    id: str
    spec: ModelSpec
    model: DeviceModel
    shards: tuple[Shard, ...]
    mode: str
    served_from: Tier
    wait_s: float


def _describe(tier: Tier, entry: Entry[Any, Any]) -> tuple[str, str, str | None]:
    if tier is Tier.L2:
        obj: L2Object | None = entry.value
        assert obj is not None
        return obj.model, obj.version, obj.sha256
    model, version, sha = entry.key
    return model, version, sha


def tier_state(
    tier: Tier, cache: TierCache[Any, Any], leased: Mapping[ModelKey, int], waits: Mapping[ModelKey, float]
) -> TierState:
    """Capacity, bytes used and the ready residents of one tier (L0: with the GPUs of each copy)."""
    residents = []
    for entry in cache.snapshot():
        if not entry.ready:
            continue
        model, version, sha = _describe(tier, entry)
        residents.append(
            ResidentModel(
                model=model,
                version=version,
                sha256=sha,
                bytes=entry.nbytes,
                last_used=entry.last_used,
                loaded_at=entry.loaded_at,
                pins=entry.pins,
                prefetched=entry.prefetched,
                gpus=list(entry.value.gpus) if tier is Tier.L0 and entry.value is not None else [],
                leases=leased.get(entry.key, 0),
                lease_wait_s=waits.get(entry.key),
            )
        )
    return TierState(tier=tier, capacity_bytes=cache.capacity, used_bytes=cache.used, resident=residents)
