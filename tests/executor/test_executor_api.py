"""The Executor API: tiers, staleness, pins, TTL, orders, state and coalescing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from executor_testkit import ExecutorFactory, make_model, serves
from metrics_helpers import metric_delta

from executor import Executor, FileStore, LoadResult
from executor._pipeline import StagingRing
from executor._stores import OnPiece
from executor._tier import round_up
from models import Catalog
from prewarm import (
    CapacityError,
    ConfigError,
    Order,
    OrderAction,
    OrderReason,
    OrderStatus,
    Tier,
    UnknownModel,
)


class _Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_load_walks_down_the_tiers_and_reports_each_hop(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    first = executor.ensure("m0", Tier.L2)
    second = executor.ensure("m0", Tier.L1)
    third = executor.ensure("m0", Tier.L0)
    fourth = executor.ensure("m0", Tier.L0)

    assert [r.served_from for r in (first, second, third, fourth)] == [Tier.L3, Tier.L2, Tier.L1, Tier.L0]
    assert set(first.seconds_per_hop) == {"L3->L2"}
    assert set(second.seconds_per_hop) == {"L2->L1"}
    assert set(third.seconds_per_hop) == {"L1->L0"}
    assert fourth.seconds_per_hop == {}
    assert third.to_json().keys() == {
        "model",
        "version",
        "served_from",
        "tier",
        "bytes",
        "seconds_per_hop",
        "verified",
    }
    assert "L2->L1" in executor.state().bandwidth_bytes_per_s


def test_the_node_reports_its_download_link_busy_with_loads_on_request_and_not_with_prefetches(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    assert executor.state().link_demand_busy == {"L3->L2": 0.0, "L2->L1": 0.0, "L1->L0": 0.0}
    executor.ensure("m1", Tier.L2)  # a prefetch
    assert executor.state().link_demand_busy["L3->L2"] == 0.0
    executor.ensure("m2", Tier.L2, demand=True)  # a request waits on it
    assert executor.state().link_demand_busy["L3->L2"] > 0.0


@pytest.mark.parametrize("structure", ["cuda", "cpu-direct"])
def test_cold_load_to_l0_streams_l3_to_every_tier_in_one_pass(
    catalog: Catalog, make_executor: ExecutorFactory, structure: str
) -> None:
    # CUDA: into L1 and L2, each part copied on to the device as it is hashed. The CPU device downloads
    # into the L0 buffer itself (L1 would hold the same bytes twice in the same RAM).
    executor = make_executor(catalog, direct_l0=structure == "cpu-direct")
    result = executor.ensure("m1", Tier.L0)

    assert result.served_from is Tier.L3
    assert set(result.seconds_per_hop) == {"L3->L0"}
    # The fused pass still tells the planner how fast the object-store link is.
    assert {"L3->L0", "L3->L2"} <= set(executor.state().bandwidth_bytes_per_s)
    used = {t.tier: t.used_bytes for t in executor.state().tiers}
    assert used[Tier.L2] == catalog["m1"].size_bytes
    assert used[Tier.L1] == (0 if structure == "cpu-direct" else round_up(catalog["m1"].size_bytes))
    assert serves(executor, catalog["m1"])


def test_l2_to_l0_overlaps_and_gives_the_right_tensors(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    # The CUDA structure: read into L1, copy each chunk on as it lands.
    executor = make_executor(catalog, direct_l0=False)
    executor.ensure("m2", Tier.L2)
    result = executor.ensure("m2", Tier.L0)
    assert result.served_from is Tier.L2
    assert set(result.seconds_per_hop) == {"L2->L0"}
    l1 = executor.state().tier(Tier.L1)
    assert l1 is not None
    assert [r.model for r in l1.resident] == ["m2"]  # went through L1, not straight into L0
    assert serves(executor, catalog["m2"])


def test_stale_l1_copy_is_never_served(
    catalog: Catalog, weights_dir: Path, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    executor.ensure("m0", Tier.L0)
    v2 = make_model(weights_dir, "m0", seed=42, version="2")
    executor.update_catalog(catalog.with_spec(v2))

    result = executor.ensure("m0", Tier.L1)

    assert result.version == "2"
    assert result.served_from is Tier.L3
    assert serves(executor, v2)
    for tier in executor.state().tiers[:2]:
        assert {r.version for r in tier.resident} <= {"2"}
        assert all(r.version == "2" for r in tier.resident if r.model == "m0")


def test_stale_l0_copy_in_use_is_unservable_and_dropped_when_released(
    catalog: Catalog, weights_dir: Path, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    v2 = make_model(weights_dir, "m0", seed=7, version="2")
    with executor.acquire("m0") as old:
        executor.update_catalog(catalog.with_spec(v2))
        with executor.acquire("m0") as new:
            assert not torch.equal(old["lm_head.weight"], new["lm_head.weight"])
        assert old["lm_head.weight"].numel() > 0  # still valid memory for its holder
    versions = {r.version for r in executor.state().tiers[0].resident if r.model == "m0"}
    assert versions == {"2"}


def test_acquired_model_is_never_evicted_for_capacity(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    size = catalog["m0"].size_bytes
    executor = make_executor(catalog, l0_budget=float(size + 4096))
    with executor.acquire("m0"):
        with pytest.raises(CapacityError):
            executor.ensure("m1", Tier.L0)
        assert executor.state().tiers[0].resident[0].pins == 1
    assert executor.ensure("m1", Tier.L0).served_from in (Tier.L1, Tier.L3)
    assert [r.model for r in executor.state().tiers[0].resident] == ["m1"]


def test_unused_prefetch_expires_after_a_configured_ttl_but_used_one_stays(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    clock = _Clock()
    executor = make_executor(catalog, clock=clock, prefetch_ttl_s=60.0)
    executor.ensure("m0", Tier.L1)
    executor.ensure("m1", Tier.L1)
    with executor.acquire("m1"):
        pass
    clock.now += 61
    l1 = {r.model: r for r in executor.state().tiers[1].resident}
    assert "m0" not in l1
    assert "m1" in l1
    assert not l1["m1"].prefetched


def test_unused_prefetch_is_left_to_the_scheduler_when_no_ttl_is_set(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    # The scheduler's misprediction rule owns unused prefetches: an executor timer of its own would
    # drop them first, behind the planner's counter and cool-down.
    clock = _Clock()
    executor = make_executor(catalog, clock=clock)
    assert executor.settings.prefetch_ttl_s is None
    executor.ensure("m0", Tier.L1)
    clock.now += 7 * 86400
    executor.ensure("m1", Tier.L1)  # a sweep runs on every load
    l1 = {r.model: r for r in executor.state().tiers[1].resident}
    assert l1["m0"].prefetched


def test_a_demoted_copy_keeps_the_prefetch_status_of_the_copy_it_came_from(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    clock = _Clock()
    executor = make_executor(catalog, clock=clock)
    executor.ensure("m0", Tier.L0, demand=True)  # served a request: not a bet any more
    executor.ensure("m1", Tier.L0)  # a prefetch nothing has used
    # On the CPU device a load to L0 lands there alone: the demotion below writes L1 from L0.
    assert not executor.state().tiers[1].resident
    for model in ("m0", "m1"):
        outcome = executor.apply(_order(model, OrderAction.DEMOTE, Tier.L1, clock.now))
        assert outcome.status is OrderStatus.DONE
    l1 = {r.model: r for r in executor.state().tiers[1].resident}
    assert not l1["m0"].prefetched
    assert l1["m1"].prefetched


def test_evict_drops_tier_and_closer_ones(catalog: Catalog, make_executor: ExecutorFactory) -> None:
    executor = make_executor(catalog)
    executor.ensure("m0", Tier.L1)
    executor.ensure("m0", Tier.L0)
    assert executor.evict("m0", Tier.L1) == [Tier.L0, Tier.L1]
    used = {t.tier: t.used_bytes for t in executor.state().tiers}
    assert used[Tier.L0] == used[Tier.L1] == 0
    assert used[Tier.L2] > 0
    assert executor.ensure("m0", Tier.L1).served_from is Tier.L2


def test_unknown_model_and_missing_sha256_are_refused(
    weights_dir: Path, make_executor: ExecutorFactory
) -> None:
    spec = make_model(weights_dir, "x", seed=1).model_copy(update={"sha256": None})
    executor = make_executor(Catalog([spec]))
    with pytest.raises(UnknownModel):
        executor.ensure("nope", Tier.L1)
    with pytest.raises(ConfigError, match="no sha256"):
        executor.ensure("x", Tier.L1)


def test_concurrent_loads_of_one_model_download_once(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    reads: list[int] = []

    class Counting(FileStore):
        def read_range_into(
            self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
        ) -> None:
            reads.append(start)
            super().read_range_into(uri, start, dest, on_piece)

    executor = make_executor(catalog, stores={"file": Counting()})
    results: list[LoadResult] = []
    threads = [
        threading.Thread(target=lambda: results.append(executor.ensure("m0", Tier.L1))) for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(r.served_from for r in results) == [Tier.L1] * 5 + [Tier.L3]
    parts = -(-catalog["m0"].size_bytes // executor.s3_settings.s3_part_bytes)
    assert len(reads) == parts  # one download


def _order(model: str, action: OrderAction, tier: Tier, now: float, **kw: object) -> Order:
    fields: dict[str, object] = {
        "id": f"o-{model}-{action}-{tier}",
        "node": "node-0",
        "model": model,
        "version": "1",
        "action": action,
        "tier": tier,
        "reason": OrderReason.FORECAST,
        "not_before": now,
        "deadline": now + 60,
        "created_at": now,
    }
    fields.update(kw)
    return Order.model_validate(fields)


def test_orders_are_idempotent_and_expired_ones_are_skipped(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    clock = _Clock()
    executor: Executor = make_executor(catalog, clock=clock)
    prefetch = _order("m0", OrderAction.PREFETCH, Tier.L1, clock.now)

    done = executor.apply(prefetch)
    again = executor.apply(prefetch)
    late = executor.apply(_order("m1", OrderAction.PREFETCH, Tier.L1, clock.now - 120))
    stale = executor.apply(_order("m2", OrderAction.PREFETCH, Tier.L1, clock.now, version="0"))
    other_node = executor.apply(
        _order("m2", OrderAction.PREFETCH, Tier.L1, clock.now, node="node-9", id="o-elsewhere")
    )

    assert done.status is OrderStatus.DONE
    assert done.served_from is Tier.L3
    assert again.status is OrderStatus.ALREADY
    assert late.status is OrderStatus.EXPIRED
    assert stale.status is OrderStatus.FAILED
    assert "version" in stale.detail
    assert other_node.status is OrderStatus.FAILED
    l1 = {r.model for r in executor.state().tiers[1].resident}
    assert l1 == {"m0"}
    assert [o.order_id for o in executor.state().recent_outcomes][:1] == [prefetch.id]


def test_demote_and_evict_orders(catalog: Catalog, make_executor: ExecutorFactory) -> None:
    clock = _Clock()
    executor = make_executor(catalog, clock=clock)
    executor.ensure("m0", Tier.L0)
    demote = executor.apply(_order("m0", OrderAction.DEMOTE, Tier.L1, clock.now))
    assert demote.status is OrderStatus.DONE
    tiers = {t.tier: {r.model for r in t.resident} for t in executor.state().tiers}
    assert tiers[Tier.L0] == set()
    assert tiers[Tier.L1] == {"m0"}
    evict = executor.apply(_order("m0", OrderAction.EVICT, Tier.L3, clock.now))
    assert evict.status is OrderStatus.DONE
    assert all(not t.resident for t in executor.state().tiers)


def test_a_prefetch_orders_hold_until_is_the_recency_of_its_copy_until_a_request_uses_it(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    clock = _Clock()
    executor = make_executor(catalog, clock=clock)
    held = _order("m0", OrderAction.PREFETCH, Tier.L1, clock.now, hold_until=clock.now + 600)
    assert executor.apply(held).status is OrderStatus.DONE
    assert executor.apply(_order("m1", OrderAction.PREFETCH, Tier.L1, clock.now)).status is OrderStatus.DONE
    entries = {e.key[0]: e for e in executor.l1.cache.snapshot()}
    assert entries["m0"].recency == clock.now + 600
    assert entries["m1"].recency == entries["m1"].loaded_at  # no hold asked
    clock.now += 5
    executor.ensure("m0", Tier.L0, demand=True)  # a request uses the copy: an ordinary one from now on
    (m0,) = (e for e in executor.l1.cache.snapshot() if e.key[0] == "m0")
    assert m0.recency == clock.now


def test_state_reports_every_tier(catalog: Catalog, make_executor: ExecutorFactory) -> None:
    executor = make_executor(catalog)
    executor.ensure("m0", Tier.L0, demand=True)
    state = executor.state()
    assert [t.tier for t in state.tiers] == [Tier.L0, Tier.L1, Tier.L2]
    l0 = state.tiers[0]
    assert l0.capacity_bytes > 0
    assert l0.used_bytes == catalog["m0"].size_bytes
    (resident,) = l0.resident
    assert resident.model == "m0"
    assert resident.version == "1"
    assert not resident.prefetched
    assert resident.sha256 == catalog["m0"].sha256
    assert state.device == "cpu"


class CountingRings:
    """A staging-ring factory that keeps the rings it made: a load went through one when one was made."""

    def __init__(self) -> None:
        self.made: list[StagingRing] = []

    def __call__(self, slots: int, chunk_bytes: int, *, pinned: bool) -> StagingRing:
        self.made.append(StagingRing(slots, chunk_bytes, pinned=pinned))
        return self.made[-1]


@pytest.mark.parametrize("start_in", [Tier.L2, Tier.L3])
def test_model_bigger_than_l1_reaches_l0_through_a_staging_ring(
    catalog: Catalog, make_executor: ExecutorFactory, start_in: Tier
) -> None:
    rings = CountingRings()
    size = catalog["m0"].size_bytes
    # The CUDA structure (the CPU device reads straight into L0).
    executor = make_executor(catalog, l1_budget_bytes=size // 2, direct_l0=False, staging_ring=rings)
    if start_in is Tier.L2:
        executor.ensure("m0", Tier.L2)

    result = executor.ensure("m0", Tier.L0, demand=True)

    assert len(rings.made) == 1  # the bytes really went through the ring, not straight into L0

    assert result.served_from is start_in
    assert "L2->L0" in result.seconds_per_hop
    used = {t.tier: t.used_bytes for t in executor.state().tiers}
    assert used[Tier.L1] == 0
    assert used[Tier.L0] == size
    assert serves(executor, catalog["m0"])
    with pytest.raises(CapacityError):
        executor.ensure("m0", Tier.L1)


def test_a_load_to_l0_through_full_host_memory_keeps_the_host_copy_read_more_often(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    rings = CountingRings()
    size = round_up(catalog["m0"].size_bytes)
    # The CUDA structure; host memory holds one model.
    executor = make_executor(catalog, l1_budget_bytes=size + 10, direct_l0=False, staging_ring=rings)
    for _ in range(3):
        executor.ensure("m0", Tier.L0, demand=True)  # three requests served here
    executor.ensure("m1", Tier.L2)

    with metric_delta("prewarm_executor_l1_bypass_total", {"reason": "not_admitted"}) as declined:
        result = executor.ensure("m1", Tier.L0, demand=True)

    assert result.served_from is Tier.L2
    assert declined.delta == 1
    assert len(rings.made) == 1  # past host memory, through the staging ring
    assert {r.model for r in executor.state().tiers[1].resident} == {"m0"}
    assert serves(executor, catalog["m1"])
    # A load to host memory itself is not weighed: LRU gives up m0 for it, however often m0 was read.
    executor.ensure("m1", Tier.L1, demand=True)
    assert {r.model for r in executor.state().tiers[1].resident} == {"m1"}


def test_demotion_from_l0_copies_down_without_touching_disk(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    executor.ensure("m0", Tier.L0)
    executor._evict_one("m0", Tier.L1)  # only L0 holds it now
    executor._evict_one("m0", Tier.L2)

    result = executor.ensure("m0", Tier.L1)

    assert result.served_from is Tier.L0
    assert set(result.seconds_per_hop) == {"L0->L1"}
    executor.evict("m0", Tier.L0)
    assert serves(executor, catalog["m0"])  # from the copied-down L1 block


def test_metrics_count_hops_hits_and_evictions(catalog: Catalog, make_executor: ExecutorFactory) -> None:
    from metrics_helpers import metric_delta, sample

    executor = make_executor(catalog)
    hop_bytes = metric_delta("prewarm_executor_hop_bytes_total", {"hop": "L3->L1"})
    hop_seconds = metric_delta("prewarm_executor_hop_seconds_total", {"hop": "L3->L1"})
    hits = metric_delta("prewarm_executor_hits_total", {"tier": "L1"})
    evictions = metric_delta("prewarm_executor_evictions_total", {"reason": "order", "tier": "L1"})
    executor.ensure("m1", Tier.L1)
    executor.ensure("m1", Tier.L1)
    executor.evict("m1", Tier.L1)
    assert hop_bytes.delta > 0
    assert hop_seconds.delta > 0
    assert hits.delta == 1  # the second ensure; the first was served from L3
    assert evictions.delta == 1
    assert sample("prewarm_executor_tier_used_bytes", {"tier": "L2"}) is not None


@pytest.mark.slow
def test_two_processes_sharing_a_cache_download_once(catalog: Catalog, tmp_path: Path) -> None:
    import subprocess
    import sys

    catalog.save(tmp_path / "catalog.yaml")
    script = f"""
import sys
from pathlib import Path
from executor import Executor
from executor_testkit import executor_settings, s3_settings
from models import Catalog
from prewarm import Tier
ex = Executor(Catalog.load(Path({str(tmp_path / "catalog.yaml")!r})), executor=executor_settings(),
              s3=s3_settings(), cache_dir=Path({str(tmp_path / "shared")!r}))
print(ex.ensure("m2", Tier.L1).served_from.value)
ex.close()
"""
    env_path = str(Path(__file__).parent)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            text=True,
            env={**__import__("os").environ, "PYTHONPATH": env_path},
        )
        for _ in range(2)
    ]
    served = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert all(p.returncode == 0 for p in procs)
    # One fetched it from L3; the other waited on the file lock and read the published copy.
    assert served == ["L2", "L3"]
    shared = tmp_path / "shared"
    assert len([p for p in (shared / "objects").rglob("*") if p.is_file()]) == 1
    assert list((shared / "tmp").iterdir()) == []


def test_model_evicted_while_in_use_stays_if_wanted_again(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    with executor.acquire("m0") as tensors:
        assert executor.evict("m0", Tier.L0) == [Tier.L0]  # deferred: a request holds it
        assert executor.ensure("m0", Tier.L0, demand=True).served_from is Tier.L0
        assert tensors["lm_head.weight"].numel() > 0
    assert [r.model for r in executor.state().tiers[0].resident] == ["m0"]
    executor.evict("m0", Tier.L0)
    assert executor.state().tiers[0].resident == []


@pytest.mark.parametrize("held_in", [Tier.L1, Tier.L0])
def test_demotion_to_l2_writes_from_memory_without_downloading(
    catalog: Catalog, make_executor: ExecutorFactory, held_in: Tier
) -> None:
    reads: list[int] = []

    class Counting(FileStore):
        armed = False  # reads for real until armed; then records what is asked and reads nothing

        def read_range_into(
            self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
        ) -> None:
            if not self.armed:
                return super().read_range_into(uri, start, dest, on_piece)
            reads.append(start)

    store = Counting()
    executor = make_executor(catalog, stores={"file": store})
    executor.ensure("m1", held_in)
    executor._evict_one("m1", Tier.L2)
    if held_in is Tier.L0:
        executor._evict_one("m1", Tier.L1)  # only the device holds it
    store.armed = True

    result = executor.ensure("m1", Tier.L2)

    assert result.served_from is held_in
    assert set(result.seconds_per_hop) == {f"{held_in.value}->L2"}
    assert reads == []
    assert executor.verify()[0].ok  # the sha256 of what was written matches the catalog
