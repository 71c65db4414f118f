"""The order semantics that planner, executor and simulator share: admission, effect, LRU victims,
admission by use."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prewarm import (
    CACHE_TIERS,
    Holding,
    Order,
    OrderAction,
    OrderReason,
    OrderStatus,
    Tier,
    UseCounts,
    admit,
    admits,
    closest,
    effect,
    gpu_placement,
    gpu_shards,
    held_recency,
    load_path,
    lru_victims,
    weighed,
)

NOW = 1_000_000.0


def _order(action: OrderAction = OrderAction.PREFETCH, tier: Tier = Tier.L0, **kw: object) -> Order:
    fields: dict[str, object] = {
        "id": "o-1",
        "node": "n0",
        "model": "m",
        "version": "1",
        "sha256": "ab" * 32,
        "action": action,
        "tier": tier,
        "reason": OrderReason.FORECAST,
        "not_before": NOW,
        "deadline": NOW + 60,
        "created_at": NOW,
    }
    fields.update(kw)
    return Order.model_validate(fields)


@dataclass(frozen=True)
class _Spec:
    version: str = "1"
    sha256: str | None = "ab" * 32


def _admit(
    order: Order, now: float = NOW, *, spec: _Spec | None = _Spec(), seen: str | None = None
) -> OrderStatus | None:
    refused = admit(order, now, node="n0", spec=spec, seen=seen)
    return refused.status if refused is not None else None


def test_an_order_is_admitted_only_once_for_its_node_before_its_deadline() -> None:
    assert _admit(_order()) is None
    assert _admit(_order(), seen="applied before: done") is OrderStatus.ALREADY
    assert _admit(_order(node="n1")) is OrderStatus.FAILED
    assert _admit(_order(), now=NOW + 61) is OrderStatus.EXPIRED
    assert _admit(_order(), now=NOW + 60) is None  # the deadline itself still counts


def test_an_order_for_a_model_or_version_the_catalog_does_not_hold_fails() -> None:
    assert _admit(_order(), spec=None) is OrderStatus.FAILED
    assert _admit(_order(), spec=_Spec(version="2")) is OrderStatus.FAILED
    assert _admit(_order(), spec=_Spec(sha256="cd" * 32)) is OrderStatus.FAILED
    assert _admit(_order(sha256=None), spec=_Spec(sha256="cd" * 32)) is None  # no digest asked for


def test_an_eviction_needs_no_catalog_entry_but_a_load_cannot_target_object_storage() -> None:
    assert _admit(_order(OrderAction.EVICT, Tier.L1), spec=None) is None
    assert _admit(_order(OrderAction.PREFETCH, Tier.L3)) is OrderStatus.FAILED
    assert _admit(_order(OrderAction.DEMOTE, Tier.L3)) is OrderStatus.FAILED


def test_a_load_fills_every_tier_between_its_closest_copy_and_its_target() -> None:
    assert load_path(Tier.L3, Tier.L0) == (Tier.L2, Tier.L1, Tier.L0)
    assert load_path(Tier.L2, Tier.L1) == (Tier.L1,)
    assert load_path(Tier.L1, Tier.L1) == ()
    assert closest([Tier.L2, Tier.L1]) is Tier.L1
    assert closest([]) is Tier.L3


def test_each_action_changes_the_copies_as_the_executor_does() -> None:
    prefetch = effect(OrderAction.PREFETCH, Tier.L0, [Tier.L2])
    assert (prefetch.source, prefetch.fills, prefetch.drops) == (Tier.L2, (Tier.L1, Tier.L0), ())
    assert effect(OrderAction.PREFETCH, Tier.L1, [Tier.L0, Tier.L1]).fills == ()
    # Executor.ensure(L1) on a model only L0 holds copies it down.
    assert effect(OrderAction.PREFETCH, Tier.L1, [Tier.L0]).fills == (Tier.L1,)
    demote = effect(OrderAction.DEMOTE, Tier.L2, [Tier.L0, Tier.L1])
    assert (demote.fills, demote.drops) == ((Tier.L2,), (Tier.L0, Tier.L1))
    evict = effect(OrderAction.EVICT, Tier.L1, [Tier.L0, Tier.L1, Tier.L2])
    assert (evict.fills, evict.drops) == ((), (Tier.L0, Tier.L1))
    assert effect(OrderAction.EVICT, Tier.L3, [Tier.L2]).drops == (Tier.L2,)


def test_a_load_streams_past_a_tier_that_could_never_hold_its_model() -> None:
    # A node without host memory, or with less than the model: the bytes go on to GPU memory, as the
    # executor streams them past (executor/_hops.py); the order's own tier is filled whatever it says.
    no_host = effect(OrderAction.PREFETCH, Tier.L0, [], lambda t: t is not Tier.L1)
    assert no_host.fills == (Tier.L2, Tier.L0)
    assert effect(OrderAction.PREFETCH, Tier.L1, [Tier.L2], lambda t: False).fills == (Tier.L1,)
    assert effect(OrderAction.DEMOTE, Tier.L1, [Tier.L0], lambda t: False).fills == (Tier.L1,)  # no load


held_sets = st.sets(st.sampled_from(CACHE_TIERS))
actions = st.sampled_from(list(OrderAction))


@given(actions, st.sampled_from(CACHE_TIERS), held_sets)
def test_an_order_leaves_its_model_where_its_action_says(
    action: OrderAction, tier: Tier, held: set[Tier]
) -> None:
    change = effect(action, tier, held)
    assert not set(change.fills) & held  # a copy is never filled twice
    assert set(change.drops) <= held
    after = (held | set(change.fills)) - set(change.drops)
    if action is OrderAction.EVICT:
        assert all(t.level > tier.level for t in after)
        assert after == {t for t in held if t.level > tier.level}
    else:
        assert tier in after
        if action is OrderAction.DEMOTE:
            assert closest(after) is tier
        else:
            assert closest(after).level <= tier.level


residents = st.lists(
    st.tuples(st.integers(1, 100), st.floats(0, 1e6), st.integers(0, 1), st.booleans()), max_size=12
)


@given(residents, st.integers(0, 600), st.integers(0, 100))
def test_lru_victims_free_just_enough_from_the_oldest_unpinned_ready_copies(
    drawn: list[tuple[int, float, int, bool]], need: int, free: int
) -> None:
    holdings = [Holding(i, n, r, pins, ready) for i, (n, r, pins, ready) in enumerate(drawn)]
    by_key = {h.key: h for h in holdings}
    victims = lru_victims(holdings, need, free)
    candidates = sorted((h for h in holdings if not h.pins and h.ready), key=lambda h: h.recency)
    if victims is None:
        assert free + sum(h.nbytes for h in candidates) < need
        return
    assert victims == [h.key for h in candidates[: len(victims)]]
    assert free + sum(by_key[k].nbytes for k in victims) >= need
    # Minimal: without the last one chosen it would not be enough.
    assert not victims or free + sum(by_key[k].nbytes for k in victims[:-1]) < need


def test_a_copy_counts_as_used_at_its_last_use_else_at_the_later_of_its_load_and_its_hold() -> None:
    assert held_recency(None, 10.0, None) == 10.0
    assert held_recency(None, 10.0, 610.0) == 610.0  # a prefetch's copy, held till its window ends
    assert held_recency(None, 10.0, 5.0) == 10.0  # landed after its window had ended
    assert held_recency(20.0, 10.0, 610.0) == 20.0  # used: an ordinary copy


def test_a_use_count_falls_by_e_every_decay_time_and_each_use_adds_one() -> None:
    uses: UseCounts[str] = UseCounts(tau_s=3600.0)
    uses.use("m", NOW)
    uses.use("m", NOW)
    assert uses.count("m", NOW) == pytest.approx(2.0)
    assert uses.count("m", NOW + 3600.0) == pytest.approx(2.0 / math.e)
    uses.use("m", NOW + 3600.0)
    assert uses.count("m", NOW + 7200.0) == pytest.approx((2.0 / math.e + 1.0) / math.e)
    assert uses.count("never", NOW) == 0.0


def test_a_load_through_a_full_tier_is_admitted_only_if_its_victims_served_no_more_requests_times_bytes() -> (
    None
):
    uses: UseCounts[str] = UseCounts()
    for i in range(5):
        uses.use("busy", NOW + i)  # read five times on this node lately
    uses.use("newcomer", NOW)
    gb = 10**9
    assert not admits("newcomer", 10 * gb, [("idle", 10 * gb), ("busy", 10 * gb)], uses, NOW + 10)
    assert admits("newcomer", 10 * gb, [("idle", 10 * gb)], uses, NOW + 10)  # never used here: LRU as before
    assert admits("busy", 10 * gb, [("newcomer", 10 * gb), ("idle", 10 * gb)], uses, NOW + 10)
    # A day later the five uses count for less than one use of the newcomer now.
    uses.use("newcomer", NOW + 86_400)
    assert admits("newcomer", 10 * gb, [("busy", 10 * gb)], uses, NOW + 86_400)


def test_a_large_copy_displaces_smaller_ones_read_more_often_when_it_saves_more_bytes_per_request() -> None:
    """A copy saves each request that reads it the time its own bytes take over the slower link: a 140 GB
    model read four times displaces two 16 GB ones read five times each (4 × 140 > 2 × 5 × 16), not ten
    16 GB ones (4 × 140 < 10 × 5 × 16)."""
    uses: UseCounts[str] = UseCounts()
    for i in range(4):
        uses.use("large", NOW + i)
    small = [f"small-{k}" for k in range(10)]
    for name in small:
        for i in range(5):
            uses.use(name, NOW + i)
    gb = 10**9
    assert admits("large", 140 * gb, [(name, 16 * gb) for name in small[:2]], uses, NOW + 10)
    assert not admits("large", 140 * gb, [(name, 16 * gb) for name in small], uses, NOW + 10)
    assert not admits(small[0], 16 * gb, [("large", 140 * gb)], uses, NOW + 10)


def test_every_new_disk_copy_is_weighed_but_one_that_must_be_made() -> None:
    assert weighed(Tier.L2, Tier.L0, demand=True)  # on its way to memory
    assert weighed(Tier.L2, Tier.L1, demand=False)
    assert weighed(Tier.L2, Tier.L2, demand=False)  # a prefetch or demotion into the disk
    assert not weighed(Tier.L2, Tier.L2, demand=True)  # a request waits for that disk copy
    assert not weighed(Tier.L2, Tier.L0, demand=True, streamable=False)  # memory cannot be reached without it


def test_a_new_host_copy_is_weighed_only_for_a_request_on_its_way_to_gpu_memory() -> None:
    assert weighed(Tier.L1, Tier.L0, demand=True)  # it can go through the staging ring
    assert not weighed(Tier.L1, Tier.L0, demand=False)  # an order: its scheduler made the room
    assert not weighed(Tier.L1, Tier.L0, demand=True, streamable=False)  # a download: no ring from L3
    assert not weighed(Tier.L1, Tier.L1, demand=True)  # a request waits for that host copy
    assert not weighed(Tier.L1, Tier.L1, demand=False)  # a prefetch or demotion into host memory


@given(
    size=st.integers(min_value=1, max_value=400 * 10**9),
    capacities=st.lists(st.integers(min_value=10**9, max_value=200 * 10**9), min_size=1, max_size=8),
    data=st.data(),
)
def test_a_gpu_placement_puts_equal_shards_only_on_gpus_with_room_for_them(
    size: int, capacities: list[int], data: st.DataObject
) -> None:
    free = [data.draw(st.integers(min_value=0, max_value=c)) for c in capacities]
    n = gpu_shards(size, capacities)
    placed = gpu_placement(size, capacities, free)
    if n is None:
        assert placed is None
        assert all(
            -(-size // k) > sorted(capacities, reverse=True)[k - 1] for k in range(1, len(capacities) + 1)
        )
        return
    if placed is not None:
        assert len(placed) == n == len(set(placed))
        assert all(free[i] >= -(-size // n) for i in placed)
    elif all(f == c for f, c in zip(free, capacities, strict=True)):
        raise AssertionError("an empty node that can hold the model must place it")


def test_a_copy_goes_to_the_fullest_gpus_that_hold_it_so_whole_gpus_stay_free_for_large_models() -> None:
    gb = 10**9
    caps = [80 * gb] * 4
    free = [80 * gb, 30 * gb, 80 * gb, 20 * gb]
    assert gpu_placement(14 * gb, caps, free) == (3,)  # the fullest GPU with room
    assert gpu_placement(25 * gb, caps, free) == (1,)
    assert gpu_placement(70 * gb, caps, free) == (0,)  # the first of equals
    assert gpu_placement(140 * gb, caps, free) == (0, 2)
    # Eight 14 GB models one after another fill two GPUs and leave two whole: a 140 GB model still fits.
    # (Placed on the roomiest GPUs, they would leave 52 GB on each and it would fit nowhere.)
    free = [80 * gb] * 4
    for _ in range(8):
        placed = gpu_placement(14 * gb, caps, free)
        assert placed is not None
        free[placed[0]] -= 14 * gb
    assert sorted(free) == [10 * gb, 38 * gb, 80 * gb, 80 * gb]
    assert gpu_placement(140 * gb, caps, free) == (2, 3)


def test_a_model_larger_than_one_gpu_takes_several_gpus_of_the_node() -> None:
    gb = 10**9
    assert gpu_shards(140 * gb, [80 * gb, 80 * gb]) == 2
    assert gpu_placement(140 * gb, [80 * gb, 80 * gb], [80 * gb, 80 * gb]) == (0, 1)
    assert gpu_placement(140 * gb, [80 * gb, 80 * gb], [80 * gb, 60 * gb]) is None
    assert gpu_placement(14 * gb, [80 * gb, 80 * gb], [10 * gb, 70 * gb]) == (1,)
    assert gpu_shards(200 * gb, [80 * gb, 80 * gb]) is None
