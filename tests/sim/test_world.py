from __future__ import annotations

from collections.abc import Mapping, Sequence

from models import Catalog, ModelSpec
from prewarm import ExecutorState, Hint, Order, OrderAction, OrderReason, Tier
from scheduler import Cluster
from sim import Policy, World, simulate

GB = 10**9
T0 = 1_704_099_600.0
SETTLED = T0 + 3600  # every transfer started at T0 has landed


def _catalog() -> Catalog:
    return Catalog(
        ModelSpec(id=m, version="1", uri=f"s3://b/{m}.safetensors", size_bytes=60 * GB) for m in "abc"
    )


def _cluster() -> Cluster:
    # One 80 GB GPU and 100 GB of host memory: room for one 60 GB model in each.
    return Cluster.from_data(
        {
            "nodes": [
                {
                    "name": "n1",
                    "gpus": [{"memory_bytes": "80GB"}],
                    "host_cache_bytes": "100GB",
                    "disk_cache_bytes": "2TB",
                }
            ],
            "bandwidth": {"l3_bytes_per_s": "1GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"},
        }
    )


def _world() -> World:
    return World(_cluster(), _catalog())


def _order(model: str, action: OrderAction, tier: Tier, at: float) -> Order:
    return Order(
        id=f"{model}-{action}-{tier}-{at}",
        node="n1",
        model=model,
        version="1",
        action=action,
        tier=tier,
        reason=OrderReason.FORECAST,
        not_before=at,
        deadline=at + 600,
        created_at=at,
    )


def test_an_order_into_a_tier_without_room_counts_what_the_lru_displaced() -> None:
    world = _world()
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L0, T0), T0)
    assert world.totals()["over_commit_bytes"] == 0
    world.apply(_order("b", OrderAction.PREFETCH, Tier.L0, SETTLED), SETTLED)
    # No room made for b: the LRU pushes a out of host memory (staging b) and out of the GPU.
    assert world.totals()["over_commit_bytes"] == 120 * GB
    assert "b" in world.nodes["n1"].held[Tier.L0]


def test_an_order_after_the_plans_own_eviction_displaces_nothing() -> None:
    world = _world()
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L0, T0), T0)
    world.apply(_order("a", OrderAction.EVICT, Tier.L1, SETTLED), SETTLED)
    world.apply(_order("b", OrderAction.PREFETCH, Tier.L0, SETTLED), SETTLED)
    assert "b" in world.nodes["n1"].held[Tier.L0]
    assert world.totals()["over_commit_bytes"] == 0


def test_a_load_on_request_may_displace_without_counting_as_over_commit() -> None:
    world = _world()
    world.request("a", T0)
    world.request("b", SETTLED)
    assert world.nodes["n1"].lru_displaced > 0
    assert world.totals()["over_commit_bytes"] == 0


class _CapacityBlind(Policy):
    """Prefetches every model to the GPU at once and makes no room: the plan a planner must never make."""

    name = "blind"

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        if now != T0:
            return []
        return [_order(m, OrderAction.PREFETCH, Tier.L0, T0 + 600 * k) for k, m in enumerate("abc")]


def test_a_policy_that_ignores_capacity_is_reported_as_over_committing() -> None:
    report = simulate(_CapacityBlind(), _cluster(), _catalog(), [], [], start=T0, end=T0 + 3600)
    assert report.over_commit_bytes > 0
