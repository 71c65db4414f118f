from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pytest

from models import Catalog, ModelSpec
from prewarm import ExecutorState, Hint, InvalidInput, Order, OrderAction, OrderReason, Tier
from scheduler import Cluster
from sim import MISPREDICTED_BY, Policy, World, order_for, simulate

GB = 10**9
T0 = 1_704_099_600.0
SETTLED = T0 + 3600  # every transfer started at T0 has landed
FAST = 10**15  # a link so fast that only the one under test takes time


def _catalog(sizes: Mapping[str, int]) -> Catalog:
    return Catalog(
        ModelSpec(id=m, version="1", uri=f"s3://b/{m}.safetensors", size_bytes=s) for m, s in sizes.items()
    )


def _cluster(
    gpus: Sequence[str] = ("80GB",),
    host: str = "100GB",
    *,
    l3: float = 1e9,
    l2: float = 7e9,
    l1: float = 50e9,
    nodes: int = 1,
    disk: str = "2TB",
) -> Cluster:
    return Cluster.from_data(
        {
            "nodes": [
                {
                    "name": f"n{k + 1}",
                    "gpus": [{"memory_bytes": g} for g in gpus],
                    "host_cache_bytes": host,
                    "disk_cache_bytes": disk,
                }
                for k in range(nodes)
            ],
            "bandwidth": {"l3_bytes_per_s": l3, "l2_bytes_per_s": l2, "l1_bytes_per_s": l1},
        }
    )


def _world(cluster: Cluster, catalog: Catalog, *, overhead: float = 0.0) -> World:
    return World(cluster, catalog, start=T0, end=T0 + 86400, hop_overhead_s=overhead)


def _request(world: World, model: str, at: float) -> str:
    world.clock.run_until(at)
    return world.request(model, at)


def _settle(world: World) -> None:
    while world.clock.step():
        pass


def _waits(world: World) -> list[float]:
    return list(world.record.req_wait)


def _l0(world: World, node: str = "n1") -> dict[str, list[int]]:
    report = world.reports(world.clock.now)[node]
    tier = report.tier(Tier.L0)
    assert tier is not None
    return {r.model: r.gpus for r in tier.resident}


def _resident(world: World, tier: Tier, node: str = "n1") -> list[str]:
    """The models ``node`` reports in ``tier`` (L1 or L2), in the report's order."""
    report = world.reports(world.clock.now)[node].tier(tier)
    assert report is not None
    return [r.model for r in report.resident]


def _order(model: str, action: OrderAction, tier: Tier, at: float, catalog: Catalog) -> Order:
    return order_for("n1", catalog[model], action, tier, at, reason=OrderReason.FORECAST)


# ------------------------------------------------------------------ GPU memory per GPU


def test_a_model_larger_than_one_gpu_takes_equal_shards_on_two() -> None:
    catalog = _catalog({"big": 140 * GB})
    world = _world(_cluster(("80GB", "80GB"), host="400GB"), catalog)
    _request(world, "big", T0)
    _settle(world)
    assert _l0(world) == {"big": [0, 1]}
    gpus = world.reports(world.clock.now)["n1"].gpus
    assert [g.used_bytes for g in gpus] == [70 * GB, 70 * GB]


def test_two_70gb_models_cannot_share_one_80gb_gpu() -> None:
    catalog = _catalog({"a": 70 * GB, "b": 70 * GB})
    world = _world(_cluster(("80GB",), host="400GB"), catalog)
    _request(world, "a", T0)
    _settle(world)
    _request(world, "b", world.clock.now + 1)
    _settle(world)
    assert _l0(world) == {"b": [0]}  # a made room for b

    roomy = _world(_cluster(("80GB", "80GB"), host="400GB"), catalog)
    _request(roomy, "a", T0)
    _settle(roomy)
    _request(roomy, "b", roomy.clock.now + 1)
    _settle(roomy)
    assert sorted(_l0(roomy).values()) == [[0], [1]]


def test_a_model_no_node_can_hold_is_refused_before_the_run() -> None:
    catalog = _catalog({"huge": 200 * GB})
    cluster = _cluster(("80GB", "80GB"), host="400GB")
    with pytest.raises(InvalidInput, match="huge"):
        simulate(_Idle(), _world(cluster, catalog), [T0 + 10], ["huge"])


# ------------------------------------------------------------------ links


def test_two_concurrent_loads_on_one_link_each_take_twice_as_long() -> None:
    catalog = _catalog({"a": 10 * GB, "b": 10 * GB})
    cluster = _cluster(("80GB", "80GB"), host="400GB", l2=FAST, l1=FAST)
    alone = _world(cluster, catalog)
    _request(alone, "a", T0)
    _settle(alone)
    both = _world(cluster, catalog)
    _request(both, "a", T0)
    _request(both, "b", T0)
    _settle(both)
    assert _waits(alone)[0] == pytest.approx(10.0, abs=1e-3)
    assert _waits(both) == pytest.approx([20.0, 20.0], abs=1e-3)


def test_a_load_that_starts_later_speeds_up_when_the_first_one_ends() -> None:
    catalog = _catalog({"a": 10 * GB, "b": 10 * GB})
    world = _world(_cluster(("80GB", "80GB"), host="400GB", l2=FAST, l1=FAST), catalog)
    _request(world, "a", T0)
    _request(world, "b", T0 + 5)
    _settle(world)
    # a: 5 GB alone, then 5 GB at half rate (10 s) -> done at 15 s. b: 5 GB shared, then 5 GB alone.
    assert _waits(world) == pytest.approx([15.0, 15.0], abs=1e-3)


def test_a_demand_load_preempts_a_speculative_prefetch_on_the_same_link() -> None:
    catalog = _catalog({"a": 10 * GB, "b": 10 * GB})
    world = _world(_cluster(("80GB", "80GB"), host="400GB", l2=FAST, l1=FAST), catalog)
    world.clock.run_until(T0)
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L0, T0, catalog), T0)
    _request(world, "b", T0)
    _settle(world)
    assert _waits(world) == pytest.approx([10.0], abs=1e-3)  # b had the link to itself
    assert set(_l0(world)) == {"a", "b"}  # a landed afterwards


def test_a_node_reports_the_models_it_loads_for_a_waiting_request_as_the_executor_does() -> None:
    catalog = _catalog({"a": 10 * GB, "b": 10 * GB})
    world = _world(_cluster(("80GB", "80GB"), host="400GB"), catalog)
    world.clock.run_until(T0)
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L0, T0, catalog), T0)  # a guess: no request's load
    _request(world, "b", T0)
    world.clock.run_until(T0 + 1)
    assert world.reports(T0 + 1)["n1"].demand_loads == ["b"]
    _settle(world)
    assert world.reports(world.clock.now)["n1"].demand_loads == []


def test_a_node_reports_the_share_of_recent_time_a_load_on_request_was_on_each_link() -> None:
    catalog = _catalog({"a": 100 * GB, "b": 60 * GB})
    world = _world(_cluster(host="1TB", l2=FAST, l1=FAST), catalog)
    world.clock.run_until(T0)
    assert world.reports(T0)["n1"].link_demand_busy["L3->L2"] == 0.0
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L2, T0, catalog), T0)  # speculative: not counted
    world.clock.run_until(T0 + 100)
    assert world.reports(T0 + 100)["n1"].link_demand_busy["L3->L2"] == 0.0
    _request(world, "b", T0 + 100)  # 60 s of download a request waits on
    world.clock.run_until(T0 + 160)
    busy = world.reports(T0 + 160)["n1"].link_demand_busy
    assert busy["L3->L2"] == pytest.approx(1 - math.exp(-60 / 600))
    assert busy["L2->L1"] < 0.001  # the fast hops took no time


def test_a_request_waits_on_the_load_in_flight_instead_of_starting_another() -> None:
    catalog = _catalog({"a": 10 * GB})
    world = _world(_cluster(host="400GB", l2=FAST, l1=FAST), catalog)
    _request(world, "a", T0)
    _request(world, "a", T0 + 4)
    _settle(world)
    assert _waits(world) == pytest.approx([10.0, 6.0], abs=1e-3)
    assert world.record.bytes_moved["L3->L2"] == 10 * GB
    assert world.record.req_cold == [True, True]  # loading is not resident


def test_a_request_joining_a_prefetch_in_flight_makes_it_a_demand_load() -> None:
    catalog = _catalog({"a": 10 * GB, "b": 10 * GB})
    world = _world(_cluster(("80GB", "80GB"), host="400GB", l2=FAST, l1=FAST), catalog)
    world.clock.run_until(T0)
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L0, T0, catalog), T0)
    world.apply(_order("b", OrderAction.PREFETCH, Tier.L0, T0, catalog), T0)
    _request(world, "a", T0 + 2)
    _settle(world)
    # 2 s at half rate (1 GB each), then a alone at full rate for its last 9 GB.
    assert _waits(world) == pytest.approx([9.0], abs=1e-3)


def test_a_request_waiting_on_a_disk_copy_still_downloading_makes_that_download_a_demand_load() -> None:
    # a is being prefetched to disk when b's request pauses it; then a is requested. The request's load
    # waits for a's disk copy, so a's download must move at a demand share, not stay paused behind b.
    catalog = _catalog({"a": 10 * GB, "b": 100 * GB})
    world = _world(_cluster(("80GB", "80GB"), host="400GB", l2=FAST, l1=FAST), catalog)
    world.clock.run_until(T0)
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L2, T0, catalog), T0)
    _request(world, "b", T0 + 1)
    _request(world, "a", T0 + 2)
    _settle(world)
    # a: 1 GB alone, paused for 1 s, then 9 GB at half the link -> T0 + 20. b: 1 GB alone, 9 GB shared,
    # then its last 90 GB alone -> T0 + 110.
    assert _waits(world) == pytest.approx([109.0, 18.0], abs=1e-3)


def test_a_load_on_request_streams_past_a_disk_whose_room_is_held_by_a_download_in_flight() -> None:
    # The disk holds 100 GB, 80 of them taken by a's prefetch still downloading. b's load cannot wait
    # for that room (the executor streams a load past a full disk): it streams through, alone on the
    # link while a's download is paused.
    catalog = _catalog({"a": 80 * GB, "b": 30 * GB})
    world = _world(_cluster(host="400GB", l2=FAST, l1=FAST, disk="100GB"), catalog)
    world.clock.run_until(T0)
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L2, T0, catalog), T0)
    _request(world, "b", T0 + 1)
    _settle(world)
    assert _waits(world) == pytest.approx([30.0], abs=1e-3)
    assert world.record.queued_loads == 0
    assert _resident(world, Tier.L2) == ["a"]  # a's download went on after


def test_a_load_through_a_full_disk_does_not_displace_a_copy_the_node_reads_more_often() -> None:
    # The disk holds 100 GB; host memory cannot hold any of these models, so each load reads its disk
    # copy or object storage. a is requested five times, c once, then b once: b's load passes through a
    # disk holding a and c, and LRU would drop a (the least recently used) for it. a served more requests
    # here lately than b, so b streams past the disk and a's next load reads it from disk, not from L3.
    catalog = _catalog({"a": 60 * GB, "b": 60 * GB, "c": 30 * GB})
    world = _world(_cluster(host="50GB", disk="100GB"), catalog)
    for k in range(5):
        _request(world, "a", T0 + k)
    _request(world, "c", T0 + 1000)
    _request(world, "b", T0 + 2000)
    _request(world, "a", T0 + 3000)
    _settle(world)

    assert sorted(_resident(world, Tier.L2)) == ["a", "c"]
    assert _waits(world)[-1] == pytest.approx(60 / 7 + 60 / 50, abs=1e-3)  # disk, then host to GPU
    # A prefetch into the disk itself is weighed the same way: it fails, and a and c stay.
    failed = world.record.failed_orders
    world.apply(_order("b", OrderAction.PREFETCH, Tier.L2, world.clock.now, catalog), world.clock.now)
    _settle(world)
    assert sorted(_resident(world, Tier.L2)) == ["a", "c"]
    assert world.record.failed_orders == failed + 1


def test_a_load_through_full_host_memory_does_not_displace_the_host_copy_the_node_reads_more_often() -> None:
    # Host memory and the GPU hold one of these models each. a is requested five times, then b, staged
    # on disk, once: b's load to the GPU passes through host memory holding a, and LRU would drop a for
    # it. a served more requests here lately, so b streams through (the executor's staging ring) and a's
    # next load, after b took the GPU, reads host memory, not the disk.
    catalog = _catalog({"a": 60 * GB, "b": 60 * GB})
    world = _world(_cluster(host="100GB"), catalog)
    for k in range(5):
        _request(world, "a", T0 + k)
    world.clock.run_until(T0 + 500)
    world.apply(_order("b", OrderAction.PREFETCH, Tier.L2, T0 + 500, catalog), T0 + 500)
    _request(world, "b", T0 + 1000)
    _request(world, "a", T0 + 2000)
    _settle(world)

    assert _resident(world, Tier.L1) == ["a"]
    assert _waits(world)[-2] == pytest.approx(60 / 7 + 60 / 50, abs=1e-3)  # b: from disk, through
    assert _waits(world)[-1] == pytest.approx(60 / 50, abs=1e-3)  # a: host to GPU


def test_a_load_through_full_host_memory_displaces_a_smaller_copy_read_more_often_for_fewer_bytes() -> None:
    # a (20 GB) is requested twice, then big (70 GB), staged on disk, twice. big's first load passes
    # through host memory holding a: a was read more often (2 against 1) but its copy saved 2 × 20 GB
    # of reads from disk, fewer than one of big's 70 GB, so big's host copy takes a's place, a's next
    # load streams through, and big's second load, after a took the GPU, reads host memory.
    catalog = _catalog({"a": 20 * GB, "big": 70 * GB})
    world = _world(_cluster(host="80GB"), catalog)
    for k in range(2):
        _request(world, "a", T0 + k)
    world.clock.run_until(T0 + 500)
    world.apply(_order("big", OrderAction.PREFETCH, Tier.L2, T0 + 500, catalog), T0 + 500)
    _request(world, "big", T0 + 1000)
    _request(world, "a", T0 + 2000)
    _request(world, "big", T0 + 3000)
    _settle(world)

    assert _resident(world, Tier.L1) == ["big"]
    assert _waits(world)[-1] == pytest.approx(70 / 50, abs=1e-3)  # big: host to GPU


def test_a_request_goes_to_a_ready_disk_copy_not_to_a_prefetch_whose_download_has_not_moved() -> None:
    # n1 holds c in its GPUs and a on disk; n2 is downloading a for a prefetch, paused behind b's load.
    # Ranked as if there, n2's copy would win (less GPU memory in use); it has all its bytes to move.
    catalog = _catalog({"a": 10 * GB, "b": 100 * GB, "c": 120 * GB})
    world = _world(_cluster(("80GB", "80GB"), host="400GB", l2=FAST, l1=FAST, nodes=2), catalog)
    assert _request(world, "c", T0) == "n1"
    world.clock.run_until(SETTLED)
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L2, SETTLED, catalog), SETTLED)
    world.clock.run_until(SETTLED + 100)
    world.apply(order_for("n2", catalog["a"], OrderAction.PREFETCH, Tier.L2, SETTLED + 100), SETTLED + 100)
    assert _request(world, "b", SETTLED + 100) == "n2"
    assert _request(world, "a", SETTLED + 101) == "n1"
    _settle(world)
    assert _waits(world)[-1] == pytest.approx(0.0, abs=1e-3)


@pytest.mark.parametrize(
    ("host", "n2_full", "loads_on"),
    [("50GB", False, "n2"), ("50GB", True, "n1"), ("100GB", False, "n1")],
)
def test_a_host_copy_draws_its_load_unless_that_pushes_a_copy_too_large_for_host_memory_to_disk(
    host: str, n2_full: bool, loads_on: str
) -> None:
    # x is staged in n1's host memory; y fills n1's GPU, and loading x there displaces it. Where n1's
    # host memory cannot hold y, y's next load would come from disk: x loads on n2 while its GPU has
    # room, and y stays. Where n2 is full too, or n1's host memory can keep y, the host copy decides.
    # (On a cluster whose GPUs hold every model, a 140 GB model pushed a node's small models to its
    # host memory; their reloads there pushed it out to disk, and on to the next node.)
    catalog = _catalog({"x": 30 * GB, "y": 60 * GB, "z": 70 * GB})
    world = _world(_cluster(("80GB",), host=host, nodes=2), catalog)
    world.apply(_order("x", OrderAction.PREFETCH, Tier.L1, T0, catalog), T0)
    assert _request(world, "y", T0 + 1) == "n1"
    if n2_full:
        assert _request(world, "z", T0 + 2) == "n2"
    world.clock.run_until(SETTLED)

    assert _request(world, "x", SETTLED) == loads_on
    _settle(world)
    assert _l0(world, "n1") == ({"y": [0]} if loads_on == "n2" else {"x": [0]})


def test_first_requests_arriving_together_are_not_piled_onto_the_node_that_looked_emptiest() -> None:
    # Both downloads take a minute before either takes GPU memory. Counting only the bytes already in
    # GPU memory, both nodes look empty and b follows a to n1, where it would displace a when it lands.
    catalog = _catalog({"a": 70 * GB, "b": 70 * GB})
    world = _world(_cluster(("80GB",), host="400GB", nodes=2), catalog)
    assert _request(world, "a", T0) == "n1"
    assert _request(world, "b", T0 + 1) == "n2"
    _settle(world)
    assert _l0(world, "n1") == {"a": [0]}
    assert _l0(world, "n2") == {"b": [0]}


def test_hop_overhead_is_added_to_each_hop() -> None:
    catalog = _catalog({"a": 14 * GB})
    world = _world(_cluster(host="400GB"), catalog, overhead=0.5)
    _request(world, "a", T0)
    _settle(world)
    assert _waits(world)[0] == pytest.approx(14 / 1 + 14 / 7 + 14 / 50 + 3 * 0.5, abs=1e-3)


# ------------------------------------------------------------------ orders and over-commit


def _sixty() -> tuple[Cluster, Catalog]:
    # One 80 GB GPU and 100 GB of host memory: room for one 60 GB model in each.
    return _cluster(), _catalog({m: 60 * GB for m in "abc"})


def test_an_order_into_a_tier_without_room_counts_what_the_lru_displaced() -> None:
    cluster, catalog = _sixty()
    world = _world(cluster, catalog)
    world.clock.run_until(T0)
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L0, T0, catalog), T0)
    _settle(world)
    assert world.record.over_commit_bytes == 0
    world.apply(_order("b", OrderAction.PREFETCH, Tier.L0, SETTLED, catalog), SETTLED)
    _settle(world)
    # No room made for b: the LRU pushes a out of host memory (staging b) and out of the GPU.
    assert world.record.over_commit_bytes == 120 * GB
    assert set(_l0(world)) == {"b"}


def test_an_order_after_the_plans_own_eviction_displaces_nothing() -> None:
    cluster, catalog = _sixty()
    world = _world(cluster, catalog)
    world.clock.run_until(T0)
    world.apply(_order("a", OrderAction.PREFETCH, Tier.L0, T0, catalog), T0)
    _settle(world)
    world.apply(_order("a", OrderAction.EVICT, Tier.L1, SETTLED, catalog), SETTLED)
    world.apply(_order("b", OrderAction.PREFETCH, Tier.L0, SETTLED, catalog), SETTLED)
    _settle(world)
    assert set(_l0(world)) == {"b"}
    assert world.record.over_commit_bytes == 0


def test_a_load_on_request_may_displace_without_counting_as_over_commit() -> None:
    cluster, catalog = _sixty()
    world = _world(cluster, catalog)
    _request(world, "a", T0)
    _settle(world)
    _request(world, "b", SETTLED)
    _settle(world)
    assert set(_l0(world)) == {"b"}
    assert world.record.over_commit_bytes == 0


@pytest.mark.parametrize("held", [True, False])
def test_a_load_on_request_gives_up_a_prefetch_held_till_its_window_ends_only_after_older_copies(
    held: bool,
) -> None:
    # Two GPUs and three 60 GB models. "b" is prefetched after "a" was used, "a" is used again, then
    # a request for "c" needs one GPU: by last use "b" would go; held as used till its window ends,
    # "a" goes instead (as the executor's tiers do: ``prewarm.held_recency``).
    catalog = _catalog({m: 60 * GB for m in "abc"})
    world = _world(_cluster(("80GB", "80GB"), host="400GB"), catalog)
    _request(world, "a", T0)
    _settle(world)
    prefetch = _order("b", OrderAction.PREFETCH, Tier.L0, SETTLED, catalog)
    world.apply(prefetch.model_copy(update={"hold_until": SETTLED + 600 if held else None}), SETTLED)
    _settle(world)
    _request(world, "a", SETTLED + 100)
    _request(world, "c", SETTLED + 200)
    _settle(world)
    assert set(_l0(world)) == ({"b", "c"} if held else {"a", "c"})


@pytest.mark.parametrize("by", ["displaced", "order", "end"])
def test_a_mispredicted_prefetch_is_counted_by_what_took_its_copy_away(by: str) -> None:
    # Two GPUs and three 60 GB models; "b" is prefetched and never asked for. A request for "c" after
    # "a" was used again makes the LRU evict it; a demotion is the scheduler taking it back; left alone,
    # it is still unused when the simulated span ends.
    catalog = _catalog({m: 60 * GB for m in "abc"})
    world = _world(_cluster(("80GB", "80GB"), host="400GB"), catalog)
    _request(world, "a", T0)
    _settle(world)
    world.apply(_order("b", OrderAction.PREFETCH, Tier.L0, SETTLED, catalog), SETTLED)
    _settle(world)
    if by == "displaced":
        _request(world, "a", SETTLED + 100)
        _request(world, "c", SETTLED + 200)
    elif by == "order":
        world.clock.run_until(SETTLED + 700)
        world.apply(_order("b", OrderAction.DEMOTE, Tier.L1, SETTLED + 700, catalog), SETTLED + 700)
    _settle(world)
    world.finish()
    assert world.record.mispredicted_by == {k: int(k == by) for k in MISPREDICTED_BY}
    assert world.record.mispredictions == 1


def test_a_copy_still_loading_is_not_demoted() -> None:
    cluster, catalog = _sixty()
    world = _world(cluster, catalog)
    _request(world, "a", T0)
    world.clock.run_until(T0 + 69)  # in the hop into GPU memory by now, not landed
    status = world.apply(_order("a", OrderAction.DEMOTE, Tier.L1, T0 + 69, catalog), T0 + 69)
    assert status.value == "failed"
    _settle(world)
    assert set(_l0(world)) == {"a"}


class _Idle(Policy):
    name = "idle"

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        return []


class _CapacityBlind(Policy):
    """Prefetches every model to the GPU at once and makes no room: the plan a planner must never make."""

    name = "blind"

    def prepare(self, ctx) -> None:  # type: ignore[no-untyped-def]
        self.catalog = ctx.catalog

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        if now != T0:
            return []
        return [
            order_for("n1", self.catalog[m], OrderAction.PREFETCH, Tier.L0, T0 + 600 * k)
            for k, m in enumerate("abc")
        ]


def test_a_policy_that_ignores_capacity_is_reported_as_over_committing() -> None:
    cluster, catalog = _sixty()
    world = World(cluster, catalog, start=T0, end=T0 + 3600)
    report = simulate(_CapacityBlind(), world, [], [], warmup_s=0)
    assert report.over_commit_bytes > 0


# ------------------------------------------------------------------ stability


def test_a_cluster_that_cannot_keep_up_is_reported_unstable() -> None:
    # Ten 60 GB models round robin every 5 s on one GPU that holds one of them, over a 1 GB/s
    # host-to-device link: a load takes 60 s, the requests ask for one every 5 s.
    catalog = _catalog({f"m{k}": 60 * GB for k in range(10)})
    cluster = _cluster(("80GB",), host="1TB", l1=1e9)
    times = [T0 + 5 * k for k in range(1440)]
    names = [f"m{k % 10}" for k in range(1440)]
    world = World(cluster, catalog, start=T0, end=T0 + 7200)
    overloaded = simulate(_Idle(), world, times, names, warmup_s=0)
    assert not overloaded.stable
    assert overloaded.offered_load >= 0.99
    assert overloaded.busiest_link == "n1 L1->L0"
    assert math.isfinite(overloaded.wait_max_s)  # waits are still reported

    light = simulate(_Idle(), World(cluster, catalog, start=T0, end=T0 + 7200), times[::30], names[::30])
    assert light.stable
    assert light.offered_load < 1.0


def test_a_backlog_of_loads_on_request_from_before_the_window_makes_a_cluster_unstable() -> None:
    # Three 40 GB models asked for 10 minutes before the window over a 10 MB/s link: 12,000 s of loads,
    # of which 600 s are done at the cut, asked again in the window, in which the link moves 36 GB.
    # The window's requests wait on those loads and ask nothing more: the backlog is the cut's.
    catalog = _catalog({f"m{k}": 40 * GB for k in range(3)})
    cluster = _cluster(("80GB",), host="1TB", l3=10e6)
    times = [T0 - 600, T0 - 600, T0 - 600, T0 + 60, T0 + 60, T0 + 60]
    names = ["m0", "m1", "m2"] * 2
    world = World(cluster, catalog, start=T0, end=T0 + 3600)
    result = simulate(_Idle(), world, times, names, warmup_s=900)
    assert not result.stable
    assert result.offered_load == pytest.approx((120 * GB - 600 * 10e6) / (3600 * 10e6), rel=0.01)
    assert result.busiest_link == "n1 L3->L2"


class _FirstTick(Policy):
    """Prefetches ``models`` into ``tier`` at its first tick, and orders nothing after."""

    name = "first-tick"

    def __init__(self, catalog: Catalog, models: Sequence[str], tier: Tier) -> None:
        self.catalog, self.models, self.tier, self.done = catalog, models, tier, False

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        if self.done:
            return []
        self.done = True
        return [_order(m, OrderAction.PREFETCH, self.tier, now, self.catalog) for m in self.models]


def _hoarder(catalog: Catalog) -> Policy:
    """Stages every model but ``s`` on disk at the first tick."""
    return _FirstTick(catalog, [m for m in catalog.ids() if m != "s"], Tier.L2)


def test_copies_staged_on_disk_on_a_guess_are_counted_and_so_are_those_no_load_read() -> None:
    # The hoarder stages big0..big2 on disk; requests read big0 only. big1 and big2 are unread.
    catalog = _catalog({"s": GB, **{f"big{k}": 50 * GB for k in range(3)}})
    world = World(_cluster(("80GB",)), catalog, start=T0, end=T0 + 7200)
    result = simulate(_hoarder(catalog), world, [T0 + 1800, T0 + 1900], ["big0", "s"], warmup_s=0)
    assert (result.prefetches, result.disk_stagings, result.disk_stagings_unread) == (0, 3, 2)


@pytest.mark.parametrize(("ordered_before_start_s", "counted"), [(10.0, 0), (0.0, 1)])
def test_an_unused_prefetch_is_a_misprediction_of_the_window_its_order_was_counted_in(
    ordered_before_start_s: float, counted: int
) -> None:
    # 50 GB over a 1 GB/s link: ordered 10 s before the window, it lands 40 s into it, and goes unused.
    catalog = _catalog({"s": GB, "big": 50 * GB})
    world = World(_cluster(("80GB",)), catalog, start=T0, end=T0 + 7200)
    policy = _FirstTick(catalog, ["big"], Tier.L0)
    result = simulate(policy, world, [T0 + 1800], ["s"], warmup_s=ordered_before_start_s)
    assert (result.prefetches, result.mispredictions) == (counted, counted)


def test_a_backlog_of_prefetches_no_request_waits_on_does_not_make_a_cluster_unstable() -> None:
    # 1.5 TB ordered onto disk over a 0.1 GB/s link: 15,000 s of downloads in a 2-hour window. Loads
    # on request pre-empt them, so the requests (1 GB every 10 minutes) still find the link free.
    catalog = _catalog({"s": GB, **{f"big{k}": 150 * GB for k in range(10)}})
    cluster = _cluster(("80GB",), l3=0.1e9)
    times = [T0 + 600 * k + 1 for k in range(12)]
    world = World(cluster, catalog, start=T0, end=T0 + 7200)
    result = simulate(_hoarder(catalog), world, times, ["s"] * 12, warmup_s=0)
    assert world.record.bytes_moved["L3->L2"] < 0.75e12  # the backlog was there
    assert result.stable
    assert result.offered_load < 0.05  # 12 GB asked of 720 GB


def test_the_nodes_own_placement_is_the_spines() -> None:
    """``sim._node._placement`` is ``prewarm.gpu_placement`` with the shard count known: equal answers
    on every mix of GPU sizes and free bytes, ties included."""
    import random

    from prewarm import gpu_placement, gpu_shards
    from sim._node import _placement

    rng = random.Random(7)
    for _ in range(5000):
        caps = [rng.choice((24, 40, 80)) * GB for _ in range(rng.randint(1, 8))]
        free = [rng.choice((0, cap // 4, cap // 2, cap)) for cap in caps]
        size = rng.randint(1, sum(caps) + GB)
        n = gpu_shards(size, caps)
        if n is not None:
            assert _placement(n, -(-size // n), free) == gpu_placement(size, caps, free)


def test_the_lru_over_one_gpus_shards_is_the_spines() -> None:
    """``sim._node.shard_victims`` is ``prewarm.lru_victims`` over a GPU's copies, a sharded copy counted
    for its shard: the same victims in the same order, ties in recency, pins and loads included."""
    import random

    from prewarm import Holding, lru_victims
    from sim._node import INF, Copy, shard_victims

    rng = random.Random(11)
    for _ in range(3000):
        copies = [
            Copy(
                key=f"m{k}",
                tier=Tier.L0,
                bytes=rng.randint(1, 80) * GB,
                loaded_at=float(rng.randint(0, 5)),
                ready_at=INF if rng.random() < 0.2 else 0.0,
                last_used=float(rng.randint(0, 5)) if rng.random() < 0.7 else None,
                gpus=tuple(range(rng.choice((1, 1, 2, 4)))),
                pins=int(rng.random() < 0.2),
            )
            for k in range(rng.randint(0, 6))
        ]
        need, free = rng.randint(1, 200) * GB, rng.randint(0, 80) * GB
        held = [Holding(c.key, c.shard, c.recency, c.pins, c.ready) for c in copies]
        chosen = shard_victims(copies, need, free)
        assert (None if chosen is None else [c.key for c in chosen]) == lru_victims(held, need, free)


def test_a_gpu_copy_given_up_within_a_minute_of_its_use_counts_as_a_warm_displacement() -> None:
    # One 80 GB GPU, two 60 GB models, loads that take no time: each load displaces the other. b comes
    # 10 s after a was used, a again an hour after b: only the first copy given up was still warm.
    world = _world(_cluster(l3=FAST, l2=FAST, l1=FAST), _catalog({"a": 60 * GB, "b": 60 * GB}))
    _request(world, "a", T0)
    _settle(world)
    used = world.clock.now
    _request(world, "b", used + 10)
    _settle(world)
    assert world.record.warm_displacements == 1
    _request(world, "a", world.clock.now + 3600)
    _settle(world)
    assert world.record.warm_displacements == 1
    assert set(_l0(world)) == {"a"}
