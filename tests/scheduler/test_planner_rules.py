"""The rules that give room back (mispredictions, the price of memory) and GPU memory booked per GPU."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from scheduler_builders import (
    GB,
    NOW,
    catalog,
    cluster,
    flat_forecast,
    hint,
    report,
    resident,
    spec,
    state,
    steady_forecast,
    surge_forecast,
)

from forecaster import ModelForecast
from models import Catalog, ModelSpec, PriorityClass
from prewarm import ExecutorState, Order, OrderAction, OrderReason, Tier, iso_utc
from scheduler import (
    DEMAND_SOURCE,
    Cluster,
    ClusterState,
    PlannerConfig,
    SchedulerCore,
    plan,
    plan_detailed,
)
from scheduler._cluster import Departures
from scheduler._planner._value import _hop_times, _Valuer

CONFIG = PlannerConfig()
CAP = {Tier.L0: 80 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB}


def prefetch(model: str, tier: Tier, at: float, *, node: str = "a", oid: str | None = None) -> Order:
    return Order(
        id=oid or f"p-{model}-{tier.value}-{at}",
        node=node,
        model=model,
        version="1",
        action=OrderAction.PREFETCH,
        tier=tier,
        reason=OrderReason.FORECAST,
        not_before=at,
        deadline=at + 900,
        created_at=at,
    )


def test_misprediction_window_counts_from_the_predicted_demand_not_from_the_load() -> None:
    # Loaded 100 s ago for a demand predicted 650 s ago (a late load): the window has closed.
    late = resident("m", 5 * GB, loaded_at=NOW - 100, prefetched=True)
    r = report("a", {Tier.L1: [late], Tier.L2: [late]}, capacity=CAP)
    order = prefetch("m", Tier.L1, NOW - 700)
    judged = ClusterState.merge(cluster("a"), {"a": r}, recent=[order], predicted={order.id: NOW - 650})
    assert plan_detailed(NOW, {}, [], catalog(spec("m", 5 * GB)), judged, CONFIG).mispredictions == (
        ("a", "m"),
    )
    # Loaded 700 s ago for a demand predicted 300 s ago (an early load): it still has 300 s to serve one.
    early = resident("m", 5 * GB, loaded_at=NOW - 700, prefetched=True)
    r = report("a", {Tier.L1: [early], Tier.L2: [early]}, capacity=CAP)
    waiting = ClusterState.merge(cluster("a"), {"a": r}, recent=[order], predicted={order.id: NOW - 300})
    assert plan(NOW, {}, [], catalog(spec("m", 5 * GB)), waiting, CONFIG) == []


def test_a_mispredicted_gpu_copy_goes_to_host_memory_not_to_disk() -> None:
    gpu = resident("m", 20 * GB, loaded_at=NOW - 700, prefetched=True)
    r = report("a", {Tier.L0: [gpu], Tier.L2: [gpu]}, capacity=CAP)
    [order] = plan(NOW, {}, [], catalog(spec("m", 20 * GB)), state(cluster("a"), r), CONFIG)
    assert (order.action, order.tier, order.reason) == (
        OrderAction.DEMOTE,
        Tier.L1,
        OrderReason.MISPREDICTION,
    )


def test_a_misprediction_is_counted_once_not_again_for_the_copy_it_was_demoted_into() -> None:
    cat = catalog(spec("m", 20 * GB))
    bet = prefetch("m", Tier.L0, NOW - 1400)
    gpu = resident("m", 20 * GB, loaded_at=NOW - 1390, prefetched=True)
    first = ClusterState.merge(
        cluster("a"),
        {"a": report("a", {Tier.L0: [gpu], Tier.L2: [gpu]}, capacity=CAP)},
        recent=[bet],
        predicted={bet.id: NOW - 1300},
    )
    [demote] = plan(NOW, {}, [], cat, first, CONFIG)
    assert demote.reason is OrderReason.MISPREDICTION
    # The executor wrote the unused copy down to L1, still unused; much later it is still not a bet.
    host = resident("m", 20 * GB, loaded_at=NOW, prefetched=True)
    later = ClusterState.merge(
        cluster("a"),
        {"a": report("a", {Tier.L1: [host], Tier.L2: [host]}, capacity=CAP, at=NOW + 3000)},
        recent=[bet, demote],
        predicted={bet.id: NOW - 1300},
    )
    assert plan(NOW + 3000, {}, [], cat, later, CONFIG) == []


def test_the_host_copy_a_gpu_prefetch_left_on_its_way_is_not_a_second_bet() -> None:
    bet = prefetch("m", Tier.L0, NOW - 1400)
    copy = resident("m", 20 * GB, loaded_at=NOW - 1390, prefetched=True)
    r = report("a", {Tier.L0: [copy], Tier.L1: [copy], Tier.L2: [copy]}, capacity=CAP)
    judged = ClusterState.merge(cluster("a"), {"a": r}, recent=[bet], predicted={bet.id: NOW - 1300})
    detailed = plan_detailed(NOW, {}, [], catalog(spec("m", 20 * GB)), judged, CONFIG)
    assert [(o.action, o.tier) for o in detailed.orders] == [(OrderAction.DEMOTE, Tier.L1)]
    assert detailed.mispredictions == (("a", "m"),)


def test_a_mispredicted_model_cools_down_on_every_node_and_longer_each_time() -> None:
    cat = catalog(spec("m", 5 * GB))
    forecasts = {"m": flat_forecast("m", 0.9, start=NOW - 7200, buckets=360)}
    c = cluster("a", "b")

    def miss(at: float) -> Order:
        return Order(
            id=f"miss-{at}",
            node="a",
            model="m",
            version="1",
            action=OrderAction.EVICT,
            tier=Tier.L1,
            reason=OrderReason.MISPREDICTION,
            not_before=at,
            deadline=at + 120,
            created_at=at,
        )

    once = ClusterState.merge(c, {}, recent=[miss(NOW - 700)])
    assert [o.node for o in plan(NOW, forecasts, [], cat, once, CONFIG)] != []  # 600 s have passed
    just = ClusterState.merge(c, {}, recent=[miss(NOW - 300)])
    assert plan(NOW, forecasts, [], cat, just, CONFIG) == []  # not on node b either
    twice = ClusterState.merge(c, {}, recent=[miss(NOW - 3000), miss(NOW - 700)])
    assert plan(NOW, forecasts, [], cat, twice, CONFIG) == []  # a second miss: 1200 s
    # A request served in between means the forecast was right once: the count starts again.
    used = resident("m", 5 * GB, loaded_at=NOW - 5000, last_used=NOW - 1000)
    served = ClusterState.merge(
        c,
        {"b": report("b", {Tier.L2: [used]}, capacity=CAP)},
        recent=[miss(NOW - 3000), miss(NOW - 700)],
    )
    assert plan(NOW, forecasts, [], cat, served, CONFIG) != []


def test_nothing_is_demoted_while_everything_fits() -> None:
    # Idle for hours and unlikely to be asked for: on a GPU with room to spare they stay.
    names = [f"m{i}" for i in range(4)]
    idle = [resident(n, 15 * GB, loaded_at=NOW - 9000, last_used=NOW - 8000) for n in names]
    r = report("a", {Tier.L0: idle, Tier.L1: idle, Tier.L2: idle}, capacity=CAP)
    forecasts = {n: flat_forecast(n, 0.0001) for n in names}
    cat = catalog(*(spec(n, 15 * GB) for n in names), spec("next", 10 * GB))
    hints = [hint("next", confidence=0.3)]  # may come, worth staging, not worth making room for
    orders = plan(NOW, forecasts, hints, cat, state(cluster("a"), r), CONFIG)
    assert [o for o in orders if o.action is not OrderAction.PREFETCH] == []


def test_where_the_executor_gives_copies_up_a_copy_not_worth_its_memory_goes_before_the_lru_picks() -> None:
    # Host memory holds a busy copy and one nobody has asked for in over an hour. From one report
    # nothing wants the room, and both stay. From two, the executor gave a third copy up on its own (a
    # load on request took its room): there the idle copy is not worth what it holds at the contended
    # price, and goes to disk now rather than whatever copy the LRU would take next.
    hot = resident("hot", 50 * GB, loaded_at=NOW - 7200, last_used=NOW - 30)
    idle = resident("idle", 100 * GB, loaded_at=NOW - 9000, last_used=NOW - 5000)
    gone = resident("gone", 40 * GB, loaded_at=NOW - 900, last_used=NOW - 600)
    cap = {Tier.L0: 80 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB}
    before = report("a", {Tier.L1: [hot, idle, gone], Tier.L2: [hot, idle, gone]}, capacity=cap, at=NOW - 60)
    after = report("a", {Tier.L1: [hot, idle], Tier.L2: [hot, idle, gone]}, capacity=cap)
    cat = catalog(*(spec(r.model, r.bytes) for r in (hot, idle, gone)))
    forecasts = {"hot": flat_forecast("hot", 0.5), "idle": flat_forecast("idle", 0.0001)}
    forecasts["gone"] = flat_forecast("gone", 0.0001)

    priced = dataclasses.replace(CONFIG, contended_memory_price=0.0005)

    def released(
        *reports: ExecutorState, config: PlannerConfig = priced
    ) -> list[tuple[str, OrderAction, Tier]]:
        out = list[Order]()
        core = SchedulerCore(
            catalog=cat, cluster=cluster("a"), config=config, dispatch=out.extend, clock=lambda: NOW
        )
        core.set_signals(forecasts=forecasts)
        for r in reports:
            core.observe(r)
        core.replan()
        return [(o.model, o.action, o.tier) for o in out if o.action is not OrderAction.PREFETCH]

    assert released(after) == []
    assert released(before, after) == [("idle", OrderAction.DEMOTE, Tier.L2)]
    # The default: memory inside the budget costs nothing, contended or not.
    assert released(before, after, config=CONFIG) == []


def test_priced_memory_holds_the_cheap_memoryless_model_and_releases_the_expensive_one() -> None:
    # The same request rate, no structure: per GB-minute the 2 GB copy saves far more than the 140 GB.
    cap = {Tier.L0: 200 * GB, Tier.L1: 400 * GB, Tier.L2: 2000 * GB}
    small = resident("small", 2 * GB, loaded_at=NOW - 3600, last_used=NOW - 600)
    big = resident("big", 140 * GB, loaded_at=NOW - 3600, last_used=NOW - 600)
    r = report("a", {Tier.L0: [small, big], Tier.L1: [small, big], Tier.L2: [small, big]}, capacity=cap)
    cat = catalog(spec("small", 2 * GB), spec("big", 140 * GB))
    forecasts = {m: flat_forecast(m, 0.02) for m in ("small", "big")}
    c = cluster("a", l0=200 * GB, l1=400 * GB)
    priced = PlannerConfig(memory_price=0.01)
    orders = plan(NOW, forecasts, [], cat, state(c, r), priced)
    assert [(o.model, o.action, o.tier) for o in orders] == [("big", OrderAction.DEMOTE, Tier.L1)]
    assert plan(NOW, forecasts, [], cat, state(c, r), CONFIG) == []  # memory in the budget is free


def _unlimited_release(
    forecasts: dict[str, ModelForecast], sizes: dict[str, int], config: PlannerConfig
) -> set[str]:
    """The models a priced round on one unlimited GPU tier releases, all resident and idle."""
    cap = {Tier.L0: 10_000 * GB, Tier.L1: 0, Tier.L2: 0}
    held = [resident(m, b, loaded_at=NOW - 3600, last_used=NOW - 600) for m, b in sizes.items()]
    r = report("a", {Tier.L0: held}, capacity=cap)
    c = cluster("a", l0=10_000 * GB, l1=0, l2=0)
    orders = plan(NOW, forecasts, [], catalog(*(spec(m, b) for m, b in sizes.items())), state(c, r), config)
    return {o.model for o in orders if o.action is OrderAction.EVICT}


def test_per_request_objective_keeps_the_busy_model_and_lets_the_rare_one_go() -> None:
    # Two 20 GB memoryless models, one used 50 times as often: per request, the busy one's hold pays.
    forecasts = {"busy": flat_forecast("busy", 0.05), "rare": flat_forecast("rare", 0.001)}
    sizes = {"busy": 20 * GB, "rare": 20 * GB}
    assert _unlimited_release(forecasts, sizes, PlannerConfig(memory_price=0.01)) == {"rare"}


def test_per_model_objective_weighs_a_memoryless_model_by_its_size_not_its_use() -> None:
    # Per model (each one's cold-start rate counts the same) a Poisson model's use cancels out: the rare
    # model's one cold start weighs as much as the busy one's fifty, so both are held, or both released.
    per_model = PlannerConfig(memory_price=0.01, objective="models")
    forecasts = {
        m: dataclasses.replace(flat_forecast(m, p), daily_requests=p * 1440)
        for m, p in (("busy", 0.05), ("rare", 0.001))
    }
    sizes = {"busy": 20 * GB, "rare": 20 * GB}
    assert _unlimited_release(forecasts, sizes, per_model) == set()
    assert _unlimited_release(forecasts, sizes, dataclasses.replace(per_model, memory_price=0.05)) == set(
        sizes
    )


def _rising(model: str, lull: float, rise: float, *, lull_minutes: int) -> ModelForecast:
    """A forecast whose chance per minute is ``lull`` for ``lull_minutes``, then ``rise`` to its end."""
    p = np.concatenate([np.full(lull_minutes, lull), np.full(120 - lull_minutes, rise)])
    return ModelForecast(model=model, start=NOW, bucket_s=60, expected=p, p_any=p, family="test")


def test_priced_memory_holds_a_copy_through_a_lull_that_no_prefetch_could_bridge() -> None:
    # Each 20 GB, each released by the chance of the next minute alone. "spread": a request likely over
    # the last 90 minutes, never in one window likely enough for a prefetch (10 minutes: P ~ 0.18), so
    # released it would stay cold; held until then it pays. "sharp": its rise is one window a prefetch
    # would act on (P ~ 0.97), so it is released now and brought back then. "late": the same rise past
    # the hour the planner looks ahead for prefetches, so none is planned for it: held. "flat":
    # memoryless, as before.
    forecasts = {
        "spread": _rising("spread", 0.002, 0.02, lull_minutes=30),
        "sharp": _rising("sharp", 0.002, 0.3, lull_minutes=60),
        "late": _rising("late", 0.002, 0.3, lull_minutes=80),
        "flat": flat_forecast("flat", 0.002),
    }
    sizes = dict.fromkeys(forecasts, 20 * GB)
    assert _unlimited_release(forecasts, sizes, PlannerConfig(memory_price=0.01)) == {"sharp", "flat"}


def test_priced_memory_keeps_a_copy_requests_need_before_a_prefetch_could_bring_it_back() -> None:
    # Each 20 GB, each likely enough an hour on for a prefetch to bring it back. "brief": its rise a
    # minute away (a forecast made of yesterday's minutes has such gaps); "before": a request likely in
    # the 20 minutes before its rise (P ~ 0.64). Released, either would be fetched back for the window,
    # cold for the requests that come first. "sharp": an hour's lull, as above: released.
    forecasts = {
        "brief": _rising("brief", 0.002, 0.3, lull_minutes=1),
        "before": _rising("before", 0.05, 0.3, lull_minutes=20),
        "sharp": _rising("sharp", 0.002, 0.3, lull_minutes=60),
    }
    sizes = dict.fromkeys(forecasts, 20 * GB)
    assert _unlimited_release(forecasts, sizes, PlannerConfig(memory_price=0.01)) == {"sharp"}


def test_a_lull_is_held_through_only_while_holding_until_the_rise_pays_for_the_memory() -> None:
    forecasts = {"spread": _rising("spread", 0.002, 0.02, lull_minutes=30)}
    sizes = {"spread": 20 * GB}
    assert _unlimited_release(forecasts, sizes, PlannerConfig(memory_price=0.01)) == set()
    assert _unlimited_release(forecasts, sizes, PlannerConfig(memory_price=0.1)) == {"spread"}


def test_an_unknown_objective_is_refused() -> None:
    with pytest.raises(ValueError, match="objective"):
        PlannerConfig(objective="revenue")


def test_priced_memory_releases_a_copy_even_with_no_tier_below_it() -> None:
    # The serverless comparison: one tier, unlimited: a released copy goes back to object storage.
    cap = {Tier.L0: 10_000 * GB, Tier.L1: 0, Tier.L2: 0}
    big = resident("big", 140 * GB, loaded_at=NOW - 3600, last_used=NOW - 600)
    r = report("a", {Tier.L0: [big]}, capacity=cap)
    c = cluster("a", l0=10_000 * GB, l1=0, l2=0)
    orders = plan(
        NOW,
        {"big": flat_forecast("big", 0.0005)},
        [],
        catalog(spec("big", 140 * GB)),
        state(c, r),
        PlannerConfig(memory_price=0.01),
    )
    assert [(o.action, o.tier) for o in orders] == [(OrderAction.EVICT, Tier.L0)]


def test_a_prefetch_into_memory_pays_for_the_memory_it_holds() -> None:
    cat = catalog(spec("m", 70 * GB))
    forecasts = {"m": flat_forecast("m", 0.2)}  # P ~ 0.9 in the window
    assert [o.tier for o in plan(NOW, forecasts, [], cat, state(cluster("a")), CONFIG)] == [Tier.L0]
    dear = PlannerConfig(memory_price=1.0)
    assert [o.tier for o in plan(NOW, forecasts, [], cat, state(cluster("a")), dear)] == [Tier.L2]


def test_two_models_that_do_not_fit_one_gpu_are_booked_on_different_gpus() -> None:
    c = cluster("a", gpus=[80 * GB, 80 * GB])
    cat = catalog(spec("x", 50 * GB), spec("y", 50 * GB))
    orders = plan(NOW, {}, [hint(m, source=DEMAND_SOURCE) for m in ("x", "y")], cat, state(c), CONFIG)
    assert sorted(tuple(o.gpus) for o in orders) == [(0,), (1,)]


def test_a_model_larger_than_one_gpu_takes_shards_on_several_gpus_of_one_node() -> None:
    c = cluster("a", "b", gpus=[80 * GB, 80 * GB])
    [order] = plan(
        NOW, {}, [hint("big", source=DEMAND_SOURCE)], catalog(spec("big", 140 * GB)), state(c), CONFIG
    )
    assert (order.tier, order.gpus) == (Tier.L0, [0, 1])


def test_room_on_a_gpu_is_made_where_the_newcomer_fits_not_where_bytes_are_free_in_total() -> None:
    # 30 GB free on each GPU, 60 GB in all: a 40 GB model fits on neither until one GPU is cleared.
    cap = {Tier.L0: 160 * GB, Tier.L1: 400 * GB, Tier.L2: 2000 * GB}
    a = resident("a1", 50 * GB, loaded_at=NOW - 3600, last_used=NOW - 3000, gpus=[0])
    b = resident("b1", 50 * GB, loaded_at=NOW - 3600, last_used=NOW - 600, gpus=[1])
    r = report("a", {Tier.L0: [a, b], Tier.L2: [a, b]}, capacity=cap, gpus=[80 * GB, 80 * GB])
    c = cluster("a", gpus=[80 * GB, 80 * GB], l1=400 * GB)
    cat = catalog(spec("a1", 50 * GB), spec("b1", 50 * GB), spec("new", 40 * GB))
    forecasts = {"a1": flat_forecast("a1", 0.001), "b1": flat_forecast("b1", 0.01)}
    orders = plan(NOW, forecasts, [hint("new", source=DEMAND_SOURCE)], cat, state(c, r), CONFIG)
    assert [(o.model, o.action, o.tier, o.gpus) for o in orders] == [
        ("a1", OrderAction.DEMOTE, Tier.L1, []),
        ("new", OrderAction.PREFETCH, Tier.L0, [0]),
    ]


def test_each_order_says_in_its_note_which_rule_made_it() -> None:
    # A guess, a waiting request and the room made for it, a misprediction, the price of memory.
    cat = catalog(spec("m", 5 * GB))
    [guess] = plan(NOW, {"m": flat_forecast("m", 0.9)}, [], cat, state(cluster("a")), CONFIG)
    assert guess.note == f"forecast: P 1.00 of a request from {iso_utc(NOW)} to {iso_utc(NOW + 600)}"

    old = resident("old", 50 * GB, loaded_at=NOW - 3600, last_used=NOW - 3000, gpus=[0])
    r = report("a", {Tier.L0: [old], Tier.L2: [old]}, capacity=CAP, gpus=[80 * GB])
    cat = catalog(spec("old", 50 * GB), spec("new", 40 * GB))
    waiting = [hint("new", source=DEMAND_SOURCE)]
    orders = plan(NOW, {"old": flat_forecast("old", 0.001)}, waiting, cat, state(cluster("a"), r), CONFIG)
    assert [(o.model, o.reason, o.note) for o in orders] == [
        ("old", OrderReason.CAPACITY, "room in L0 for new"),
        ("new", OrderReason.DEMAND, "a request is waiting"),
    ]

    unused = resident("m", 5 * GB, loaded_at=NOW - 700, prefetched=True)
    r = report("a", {Tier.L1: [unused], Tier.L2: [unused]}, capacity=CAP)
    bet = prefetch("m", Tier.L1, NOW - 700)
    judged = ClusterState.merge(cluster("a"), {"a": r}, recent=[bet], predicted={bet.id: NOW - 650})
    [demote] = plan(NOW, {}, [], catalog(spec("m", 5 * GB)), judged, CONFIG)
    assert demote.note == f"misprediction: unused 600 s from its predicted request at {iso_utc(NOW - 650)}"

    idle = resident("rare", 20 * GB, loaded_at=NOW - 3600, last_used=NOW - 600)
    r = report("a", {Tier.L0: [idle]}, capacity={Tier.L0: 10_000 * GB, Tier.L1: 0, Tier.L2: 0})
    c = cluster("a", l0=10_000 * GB, l1=0, l2=0)
    forecasts = {"rare": flat_forecast("rare", 0.001)}
    priced = PlannerConfig(memory_price=0.01)
    [release] = plan(NOW, forecasts, [], catalog(spec("rare", 20 * GB)), state(c, r), priced)
    assert release.note == "the memory it holds costs more than the chance of a request pays for"


def test_a_report_without_gpus_splits_its_l0_budget_as_the_cluster_file_does() -> None:
    c = cluster("a", gpus=[80 * GB, 80 * GB])
    r = report("a", {}, capacity={Tier.L0: 80 * GB, Tier.L1: 100 * GB, Tier.L2: 1000 * GB})
    node = ClusterState.merge(c, {"a": r}).nodes["a"]
    assert node.gpus == (40 * GB, 40 * GB)
    # So a 60 GB model takes both halves.
    [order] = plan(
        NOW, {}, [hint("m", source=DEMAND_SOURCE)], catalog(spec("m", 60 * GB)), state(c, r), CONFIG
    )
    assert order.gpus == [0, 1]


def test_the_scheduler_core_keeps_when_each_prefetch_was_predicted_for_the_next_rounds() -> None:
    clock = [NOW]
    out: list[Order] = []
    core = SchedulerCore(
        catalog=catalog(spec("m", 140 * GB)),
        cluster=cluster("a", l0=160 * GB),
        config=CONFIG,
        dispatch=out.extend,
        clock=lambda: clock[0],
    )
    core.add_hint(hint("m", ttl_s=60.0))  # wanted now: a 140 GB load from object storage takes minutes
    [order] = out
    cap = {Tier.L0: 160 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB}
    loaded = resident("m", 140 * GB, loaded_at=NOW + 170, prefetched=True)
    # The window counts from the hint's expected time (now), not from the load 170 s later.
    for at, mispredicted in ((NOW + 590, False), (NOW + 601, True)):
        clock[0] = at
        core.observe(report("a", {order.tier: [loaded], Tier.L2: [loaded]}, capacity=cap, at=at))
        fresh = core.replan()
        assert any(o.reason is OrderReason.MISPREDICTION for o in fresh) is mispredicted


def staged_beside_a_kept_model() -> tuple[Catalog, ClusterState]:
    """Nodes a and b: "next" is staged on a's disk, where the GPU holds "kept", used half an hour ago
    and still worth keeping (it would have to be demoted to make room); b is empty."""
    kept = resident("kept", 60 * GB, loaded_at=NOW - 3600, last_used=NOW - 1800)
    staged = resident("next", 40 * GB, loaded_at=NOW - 3600)
    reports = [
        report("a", {Tier.L0: [kept], Tier.L1: [kept], Tier.L2: [kept, staged]}, capacity=CAP),
        report("b", {}, capacity=CAP),
    ]
    return catalog(spec("kept", 60 * GB), spec("next", 40 * GB)), state(cluster("a", "b"), *reports)


def test_a_speculative_copy_goes_to_free_room_rather_than_demote_on_the_node_that_stages_it() -> None:
    # Loading from a's disk would save hops, at the price of demoting "kept", which nothing needed.
    cat, world = staged_beside_a_kept_model()
    forecasts = {"kept": flat_forecast("kept", 0.02), "next": surge_forecast("next", NOW + 1200)}
    orders = plan(NOW, forecasts, [], cat, world, CONFIG)
    assert [(o.model, o.action, o.node, o.tier) for o in orders] == [
        ("next", OrderAction.PREFETCH, "b", Tier.L0)
    ]


def test_a_waiting_request_still_loads_from_the_closest_copy_and_makes_room_there() -> None:
    cat, world = staged_beside_a_kept_model()
    waiting = [hint("next", source=DEMAND_SOURCE)]
    orders = plan(NOW, {"kept": flat_forecast("kept", 0.02)}, waiting, cat, world, CONFIG)
    assert [(o.model, o.action, o.node) for o in orders] == [
        ("kept", OrderAction.DEMOTE, "a"),
        ("next", OrderAction.PREFETCH, "a"),
    ]


def prefetched_copy_filling_host_memory() -> tuple[Catalog, ClusterState]:
    """Node a: host memory (200 GB) holds "bet", a 150 GB copy prefetched 300 s ago for a demand
    predicted 200 s ago and not used yet (its misprediction window is still open), now worth little;
    "next" (100 GB: too big for the 80 GB GPU) is staged on disk."""
    bet = prefetch("bet", Tier.L1, NOW - 300)
    copy = resident("bet", 150 * GB, loaded_at=NOW - 290, prefetched=True)
    staged = resident("next", 100 * GB, loaded_at=NOW - 3600)
    r = report("a", {Tier.L1: [copy], Tier.L2: [copy, staged]}, capacity=CAP)
    world = ClusterState.merge(cluster("a"), {"a": r}, recent=[bet], predicted={bet.id: NOW - 200})
    return catalog(spec("bet", 150 * GB), spec("next", 100 * GB)), world


def test_an_unused_prefetched_copy_is_not_displaced_for_another_speculative_one() -> None:
    # Displaced now, "bet" would be a misprediction for certain; left alone it may still serve the
    # request it was brought for, and the misprediction rule judges it when its window has passed.
    cat, world = prefetched_copy_filling_host_memory()
    forecasts = {"bet": flat_forecast("bet", 0.01), "next": surge_forecast("next", NOW + 600, p=0.99)}
    assert plan(NOW, forecasts, [], cat, world, CONFIG) == []


def test_a_waiting_request_displaces_an_unused_prefetched_copy() -> None:
    cat, world = prefetched_copy_filling_host_memory()
    waiting = [hint("next", source=DEMAND_SOURCE)]
    orders = plan(NOW, {"bet": flat_forecast("bet", 0.01)}, waiting, cat, world, CONFIG)
    assert [(o.model, o.action, o.tier) for o in orders] == [
        ("bet", OrderAction.DEMOTE, Tier.L2),
        ("next", OrderAction.PREFETCH, Tier.L1),
    ]


@pytest.mark.parametrize(("loaded_ago", "tier"), [(10.0, Tier.L2), (7200.0, Tier.L1)])
def test_no_speculative_copy_goes_where_requests_would_evict_it_before_its_window_is_out(
    loaded_ago: float, tier: Tier
) -> None:
    # Host memory half full. Loaded in the last ten seconds, its copies say requests fill it in about
    # twenty: a copy loaded for a one-minute window would mostly be gone before its request came, so it
    # is staged on disk instead. Loaded hours ago, they say host memory keeps a copy: it goes there.
    held = [
        resident(f"r{i}", 50 * GB, loaded_at=NOW - loaded_ago + 5 * i, last_used=NOW - loaded_ago + 5 * i)
        for i in range(2)
    ]
    r = report("a", {Tier.L1: held, Tier.L2: held}, capacity=CAP)
    cat = catalog(*(spec(h.model, h.bytes) for h in held), spec("big", 100 * GB))  # too big for the GPU
    forecasts = {"big": surge_forecast("big", NOW + 1200)}
    orders = plan(NOW, forecasts, [], cat, state(cluster("a"), r), CONFIG)
    assert [(o.model, o.action, o.tier) for o in orders] == [("big", OrderAction.PREFETCH, tier)]


@pytest.mark.parametrize(("l1", "tier"), [(200 * GB, Tier.L1), (0, Tier.L2)])
def test_a_prefetch_into_memory_asks_its_copy_be_held_as_used_until_its_misprediction_window_ends(
    l1: int, tier: Tier
) -> None:
    # Too big for the GPU: host memory where there is some, else disk (which holds no bet).
    cat = catalog(spec("big", 100 * GB))
    r = report("a", {}, capacity={Tier.L0: 80 * GB, Tier.L1: l1, Tier.L2: 2000 * GB})
    result = plan_detailed(
        NOW, {"big": surge_forecast("big", NOW + 1200)}, [], cat, state(cluster("a"), r), CONFIG
    )
    [order] = result.orders
    assert (order.action, order.tier) == (OrderAction.PREFETCH, tier)
    window_end = result.predicted[order.id] + CONFIG.misprediction_window_s
    assert order.hold_until == (window_end if tier is Tier.L1 else None)


def test_the_scheduler_core_hands_out_an_order_only_in_the_rounds_just_before_it_is_due() -> None:
    # A prefetch planned an hour ahead is not committed to: requests the planner does not order may
    # take the room it counted on meanwhile. Each round plans it again, and one of the two rounds before
    # it is due hands it out, as the order a round planning every candidate times for then.
    clock = [NOW]
    out: list[Order] = []
    cat, c = catalog(spec("m", 10 * GB)), cluster("a")
    forecasts = {"m": surge_forecast("m", NOW + 3600)}
    [timed] = plan(NOW, forecasts, [], cat, state(c), CONFIG)
    core = SchedulerCore(catalog=cat, cluster=c, config=CONFIG, dispatch=out.extend, clock=lambda: clock[0])
    core.set_signals(forecasts=forecasts)
    assert core.replan() == []
    clock[0] = timed.not_before - 3 * CONFIG.decision_interval_s
    assert core.replan() == []
    clock[0] = timed.not_before - 1.5 * CONFIG.decision_interval_s
    [order] = core.replan()
    assert (order.id, order.model, order.not_before) == (timed.id, "m", timed.not_before)
    assert out == [order]


def test_departures_keep_how_long_each_copy_the_executor_gave_up_had_gone_unused() -> None:
    # Between two reports a minute apart, "lru" left host memory with no order: it had gone unused
    # since 120 s before the second report, and left about halfway between them (90 s unused). "told"
    # left by a demotion the planner ordered; "stays" did not leave; L2 is not a tier the LRU rule reads.
    lru = resident("lru", 10 * GB, loaded_at=NOW - 300, last_used=NOW - 120)
    told = resident("told", 10 * GB, loaded_at=NOW - 300, last_used=NOW - 600)
    stays = resident("stays", 10 * GB, loaded_at=NOW - 300)
    before = report("a", {Tier.L1: [lru, told, stays], Tier.L2: [lru]}, capacity=CAP, at=NOW - 60)
    after = report("a", {Tier.L1: [stays]}, capacity=CAP)
    departures = Departures(keep=2, horizon_s=600.0)
    departures.ordered(prefetch("told", Tier.L2, NOW - 30).model_copy(update={"action": OrderAction.DEMOTE}))
    departures.observe(before, after)
    assert departures.of("a", NOW) == {(Tier.L1, 1): (90.0,)}
    # The latest ``keep`` are kept, and only those within ``horizon_s`` of the time asked about: "lru"
    # seen leaving again 90 s and 150 s after NOW, 210 s and 270 s after its last use.
    for minutes in (1, 2):
        later = report("a", {Tier.L1: [lru]}, capacity=CAP, at=NOW + 60 * minutes)
        departures.observe(later, report("a", {}, capacity=CAP, at=NOW + 60 * minutes + 60))
    assert departures.of("a", NOW + 180) == {(Tier.L1, 1): (210.0, 270.0)}
    assert departures.of("a", NOW + 10_000) == {}
    assert departures.of("b", NOW) == {}


TWO_GPUS = {Tier.L0: 160 * GB, Tier.L1: 64 * GB, Tier.L2: 2000 * GB}


def turn(
    *, big_used: float = NOW - 70, small_staged: bool = True, big_bytes: int = 140 * GB, at: float = NOW
) -> tuple[ExecutorState, ExecutorState]:
    """Two reports of node a a minute apart: a big model (140 GB: too large for the node's 64 GB of host
    memory) on both its GPUs, used at ``big_used``, then a 14 GB model on GPU 0 in its place, staged in
    host memory in the second report where ``small_staged``."""
    big = resident("big", big_bytes, loaded_at=at - 600, last_used=big_used - NOW + at, gpus=(0, 1))
    small = resident("small", 14 * GB, loaded_at=at - 30, last_used=at - 20, gpus=(0,))
    host = resident("small", 14 * GB, loaded_at=at - 3600, last_used=at - 20)
    before = report(
        "a", {Tier.L0: [big], Tier.L1: [host]}, capacity=TWO_GPUS, at=at - 60, gpus=(80 * GB,) * 2
    )
    after = report(
        "a",
        {Tier.L0: [small], Tier.L1: [host] if small_staged else []},
        capacity=TWO_GPUS,
        at=at,
        gpus=(80 * GB,) * 2,
    )
    return before, after


def test_departures_count_a_turn_where_a_staged_model_displaced_a_model_too_large_for_host_memory() -> None:
    departures = Departures()
    departures.observe(*turn())
    assert departures.turns("a", NOW) == {"small": 1}
    assert departures.turns("a", NOW + 601) == {}  # ten minutes on, the turn is forgotten
    # Not a turn: the GPU copy it displaced had gone unused for ten minutes.
    quiet = Departures()
    quiet.observe(*turn(big_used=NOW - 660))
    assert quiet.turns("a", NOW) == {}
    # Not a turn: host memory can hold the model it displaced, whose reloads come from there.
    quick = Departures()
    quick.observe(*turn(big_bytes=40 * GB))
    assert quick.turns("a", NOW) == {}
    # Not a turn: no host copy sent the load to this node.
    unstaged = Departures()
    unstaged.observe(*turn(small_staged=False))
    assert unstaged.turns("a", NOW) == {}
    # Its host copy gone from the node, its turns there are over.
    departures.observe(turn()[1], turn(small_staged=False, at=NOW + 60)[1])
    assert departures.turns("a", NOW + 60) == {}


def test_a_model_taking_turns_on_a_node_loses_the_host_copy_that_sends_its_loads_there() -> None:
    # After three turns in ten minutes, "small"'s host copy on node a is demoted to disk (with its GPU
    # copy), so that its next load goes where the LRU gives up the oldest copies; after two, nothing.
    cat = catalog(spec("big", 140 * GB), spec("small", 14 * GB))
    forecasts = {"big": flat_forecast("big", 0.9), "small": flat_forecast("small", 0.5)}
    c = cluster("a", l1=64 * GB, gpus=(80 * GB, 80 * GB))
    seen = state(c, turn()[1])

    def orders(turns: int, config: PlannerConfig = CONFIG) -> list[tuple[str, OrderAction, Tier, str]]:
        node = dataclasses.replace(seen.nodes["a"], turns={"small": turns})
        taking = dataclasses.replace(seen, nodes={"a": node})
        return [
            (o.model, o.action, o.tier, o.note)
            for o in plan(NOW, forecasts, [], cat, taking, config)
            if o.action is not OrderAction.PREFETCH
        ]

    note = "turns: 3 of its loads here displaced busy models too large for host memory"
    assert orders(3) == [("small", OrderAction.DEMOTE, Tier.L2, note)]
    assert orders(2) == []
    assert orders(5, dataclasses.replace(CONFIG, turns_to_break=0)) == []


def test_the_scheduler_core_demotes_the_host_copy_after_three_turns_in_its_executors_reports() -> None:
    # The reports alone carry the turns: big back on the GPUs, then small in its place, three times.
    cat = catalog(spec("big", 140 * GB), spec("small", 14 * GB))
    forecasts = {"big": flat_forecast("big", 0.9), "small": flat_forecast("small", 0.5)}
    clock = [NOW]
    core = SchedulerCore(
        catalog=cat,
        cluster=cluster("a", l1=64 * GB, gpus=(80 * GB, 80 * GB)),
        config=CONFIG,
        dispatch=lambda orders: None,
        clock=lambda: clock[0],
    )
    core.set_signals(forecasts=forecasts)

    def demotions() -> list[tuple[str, Tier]]:
        return [(o.model, o.tier) for o in core.replan() if o.action is OrderAction.DEMOTE]

    for k in range(3):
        clock[0] = NOW + 120 * k
        for seen in turn(at=clock[0]):
            core.observe(seen)
        assert demotions() == ([("small", Tier.L2)] if k == 2 else [])


def host_memory_giving_copies_up_90_s_after_use(
    newcomer: ModelSpec, *, staged: bool = False
) -> tuple[Catalog, ExecutorState, ExecutorState]:
    """The catalog and two reports of node a a minute apart: host memory half full of two copies that
    requests use all the time, and a third given up between them, 90 s after its last use; the
    ``newcomer`` on disk in both where ``staged``."""
    hot = [resident(f"hot{i}", 50 * GB, loaded_at=NOW - 7200, last_used=NOW - 30) for i in range(2)]
    gone = resident("gone", 50 * GB, loaded_at=NOW - 200, last_used=NOW - 120)
    disk = [*hot, gone]
    if staged:
        disk.append(resident(newcomer.id, newcomer.size_bytes, loaded_at=NOW - 7200))
    before = report("a", {Tier.L1: [*hot, gone], Tier.L2: disk}, capacity=CAP, at=NOW - 60)
    after = report("a", {Tier.L1: hot, Tier.L2: disk}, capacity=CAP)
    return catalog(*(spec(r.model, r.bytes) for r in (*hot, gone)), newcomer), before, after


def orders_until_the_first(
    cat: Catalog, c: Cluster, forecasts: Mapping[str, ModelForecast], *reports: ExecutorState
) -> list[Order]:
    """What a scheduler core that has seen ``reports`` hands out in the first of its rounds, every 30 s
    from NOW for five minutes, that hands out any."""
    clock, out = [NOW], list[Order]()
    core = SchedulerCore(catalog=cat, cluster=c, config=CONFIG, dispatch=out.extend, clock=lambda: clock[0])
    core.set_signals(forecasts=dict(forecasts))
    for r in reports:
        core.observe(r)
    while not out and clock[0] < NOW + 300:
        core.replan()
        clock[0] += 30
    return out


@pytest.mark.parametrize(("p", "tier"), [(0.5, Tier.L2), (0.9, Tier.L1)])
def test_a_tier_whose_executor_gives_up_unused_copies_within_minutes_gets_only_a_busy_models_copy(
    p: float, tier: Tier
) -> None:
    # Host memory half full of two copies that requests use all the time: one report alone says
    # nothing is loaded there, so a copy would stay for hours, and "big" is staged there for its
    # window five minutes ahead. Seen from two reports, the executor gave up a third copy 90 s after
    # its last use: a copy of "big" lasts a few minutes of its window. At a chance of 0.5 a minute the
    # scheduler core stages it on disk instead; at 0.9 a minute a request comes within those minutes
    # nine times in ten, and host memory is still worth it.
    cat, before, after = host_memory_giving_copies_up_90_s_after_use(spec("big", 100 * GB))
    forecasts = {"big": surge_forecast("big", NOW + 300, p=p)}

    def first_order(*reports: ExecutorState) -> tuple[str, OrderAction, Tier]:
        [first, *_] = orders_until_the_first(cat, cluster("a"), forecasts, *reports)
        return (first.model, first.action, first.tier)

    assert first_order(after) == ("big", OrderAction.PREFETCH, Tier.L1)
    assert first_order(before, after) == ("big", OrderAction.PREFETCH, tier)


def test_a_timers_copy_is_timed_to_land_at_its_tick_where_host_memory_keeps_a_copy_only_minutes() -> None:
    # The executor gives host copies up about 90 s after their last use (seen from two reports).
    # "tick", staged on disk, comes for sure five minutes from now; its forecast also gives it 0.05 a
    # minute before that. The window from now holds the tick, so as a whole it is all but certain, and
    # its arrival is read two minutes from now. A copy landing then would be gone before the tick: it
    # is worth the chance of a request while it lasts, which the forecast's minutes give (about 0.07),
    # not the window's chance spread evenly over it (about 0.8). So it is ordered to land a minute or
    # so before the tick.
    cat, before, after = host_memory_giving_copies_up_90_s_after_use(spec("tick", 100 * GB), staged=True)
    p_any = np.zeros(120)
    p_any[:5], p_any[5] = 0.05, 0.99999
    tick = ModelForecast(model="tick", start=NOW, bucket_s=60, expected=p_any, p_any=p_any, family="test")
    [order] = orders_until_the_first(cat, cluster("a"), {"tick": tick}, before, after)
    assert (order.model, order.action, order.tier) == ("tick", OrderAction.PREFETCH, Tier.L1)
    assert NOW + 200 <= order.not_before < NOW + 300


@pytest.mark.parametrize(("model", "tier"), [("wide", Tier.L1), ("narrow", Tier.L0)])
def test_a_gpu_copy_over_every_gpu_of_a_node_is_valued_for_as_long_as_such_copies_last(
    model: str, tier: Tier
) -> None:
    # Two 80 GB GPUs, each with room. Between two reports the executor gave up a 140 GB copy over both
    # GPUs 90 s after its last use. GPU 0's copy has gone unused for an hour, GPU 1's was used 5 s ago:
    # a one-GPU copy goes to GPU 0 and lasts, but one over both GPUs goes as soon as GPU 1 needs room,
    # as the copy given up did. So a 140 GB model wanted five minutes from now, at 0.2 a minute (0.9 in
    # ten), is staged in host memory, and a 20 GB one loaded into GPU memory. Read as one tier, the hour-old
    # copy said that both would last.
    gpus = [80 * GB, 80 * GB]
    cap = {Tier.L0: 160 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB}
    idle = resident("idle", 5 * GB, loaded_at=NOW - 7200, last_used=NOW - 3600, gpus=[0])
    busy = resident("busy", 5 * GB, loaded_at=NOW - 7200, last_used=NOW - 5, gpus=[1])
    gone = resident("gone", 140 * GB, loaded_at=NOW - 200, last_used=NOW - 120, gpus=[0, 1])
    before = report("a", {Tier.L0: [idle, busy, gone]}, capacity=cap, at=NOW - 60, gpus=gpus)
    after = report("a", {Tier.L0: [idle, busy]}, capacity=cap, gpus=gpus)
    sizes = {"wide": 140 * GB, "narrow": 20 * GB}
    cat = catalog(*(spec(r.model, r.bytes) for r in (idle, busy, gone)), spec(model, sizes[model]))
    forecasts = {model: surge_forecast(model, NOW + 300, p=0.2)}
    out = orders_until_the_first(cat, cluster("a", gpus=gpus), forecasts, before, after)
    assert [(o.model, o.action, o.tier) for o in out] == [(model, OrderAction.PREFETCH, tier)]


_TIED_NODES = """
from scheduler_builders import (
    GB, NOW, catalog, cluster, flat_forecast, report, resident, spec, state, surge_forecast,
)
from prewarm import Tier
from scheduler import PlannerConfig, plan
cap = {Tier.L0: 80 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB}
sizes = {"a1": 1, "a2": 2, "a3": 3, "b6": 6}
disk = {m: resident(m, s * GB, loaded_at=NOW - 7200) for m, s in sizes.items()}
new = resident("new", 10 * GB, loaded_at=NOW - 7200)
a = report("a", {Tier.L2: [disk["a1"], disk["a2"], disk["a3"], new]}, capacity=cap)
b = report("b", {Tier.L2: [disk["b6"], new]}, capacity=cap)
cat = catalog(*(spec(m, s * GB) for m, s in sizes.items()), spec("new", 10 * GB))
forecasts = {m: flat_forecast(m, 0.001) for m in sizes} | {"new": surge_forecast("new", NOW + 600)}
orders = plan(NOW, forecasts, [], cat, state(cluster("a", "b"), a, b), PlannerConfig())
print([(o.model, o.node, o.action.value, o.tier.value) for o in orders])
"""


def test_the_node_chosen_between_equally_loaded_ones_does_not_depend_on_string_hashing() -> None:
    # Nodes a and b both stage "new" and both will be asked for the same GPU room (1 + 2 + 3 GB of
    # rarely used models against 6 GB). Summed in a set's order, which string hashing changes from one
    # process to the next, the two loads differed in their last bit in some processes, and "new" went
    # to a there and to b elsewhere: the simulator's figures changed from one run to the next.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _TIED_NODES],
            env={**env, "PYTHONHASHSEED": str(seed)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(8)
    ]
    outputs = {run.communicate(timeout=120)[0] for run in runs}
    assert all(run.returncode == 0 for run in runs)
    assert len(outputs) == 1, outputs


def full_disk(last_used: float | None) -> tuple[Catalog, ClusterState]:
    """Node a's 300 GB disk holds "old" (250 GB, downloaded an hour ago; read at ``last_used``, or never);
    "next" (60 GB) is not on the node."""
    old = resident("old", 250 * GB, loaded_at=NOW - 3600, last_used=last_used)
    capacity = {Tier.L0: 80 * GB, Tier.L1: 200 * GB, Tier.L2: 300 * GB}
    world = ClusterState.merge(cluster("a"), {"a": report("a", {Tier.L2: [old]}, capacity=capacity)})
    return catalog(spec("old", 250 * GB), spec("next", 60 * GB)), world


def _disk_moves(orders: list[Order]) -> list[tuple[str, OrderAction, Tier]]:
    return [(o.model, o.action, o.tier) for o in orders]


@pytest.mark.parametrize("last_used", [None, NOW - 3000], ids=["never read", "read before"])
def test_a_guess_evicts_no_disk_copy_on_a_full_disk(last_used: float | None) -> None:
    # A copy never read may still serve the request it was staged for (the rotation case: 8,349
    # stagings in 48 h, 89 % never read); one read before is a download from object storage the next
    # time its model is loaded. Which copies the node reads most, its executor's admission knows.
    cat, world = full_disk(last_used=last_used)
    forecasts = {"next": surge_forecast("next", NOW + 600, p=0.99)}
    assert plan(NOW, forecasts, [], cat, world, CONFIG) == []


def test_a_waiting_request_evicts_a_disk_copy_never_read() -> None:
    cat, world = full_disk(last_used=None)
    waiting = [hint("next", source=DEMAND_SOURCE)]
    assert _disk_moves(plan(NOW, {}, waiting, cat, world, CONFIG)) == [
        ("old", OrderAction.EVICT, Tier.L2),
        ("next", OrderAction.PREFETCH, Tier.L0),
    ]


def orders_with_a_disk_copy_in_the_way(per_minute: float) -> list[tuple[str, str, OrderAction, Tier]]:
    """What is ordered when "rare" (70 GB, about one request in 10 minutes; node a is the only one with
    room for it) would be staged on node a's 80 GB disk, where a copy of "served" (20 GB) takes the
    room it needs. Node b serves "served", ``per_minute`` requests a minute, from its GPU."""
    on_a = resident("served", 20 * GB, loaded_at=NOW - 3600, last_used=NOW - 600)
    on_b = resident("served", 20 * GB, loaded_at=NOW - 600, last_used=NOW - 1)
    a = report("a", {Tier.L2: [on_a]}, capacity={Tier.L0: 80 * GB, Tier.L1: 200 * GB, Tier.L2: 80 * GB})
    b = report(
        "b",
        {Tier.L0: [on_b], Tier.L2: [on_b]},
        capacity={Tier.L0: 80 * GB, Tier.L1: 10 * GB, Tier.L2: 30 * GB},
    )
    world = ClusterState.merge(cluster("a", "b"), {"a": a, "b": b})
    forecasts = {"served": steady_forecast("served", per_minute), "rare": flat_forecast("rare", 0.09)}
    cat = catalog(spec("served", 20 * GB), spec("rare", 70 * GB))
    return [(o.node, o.model, o.action, o.tier) for o in plan(NOW, forecasts, [], cat, world, CONFIG)]


@pytest.mark.parametrize("per_minute", [12.0, 0.1], ids=["busy", "seldom used"])
def test_a_models_disk_copy_is_not_evicted_for_a_guess_about_a_larger_rarer_model(per_minute: float) -> None:
    # Busy: should node b lose its GPU copy, about 80 requests would queue behind a download of "served"
    # (20 s at 1 GB/s, twelve requests a minute), not one; on azure_mix-like traces the planner evicted
    # busy models' disk copies for such guesses, their next loads coming from object storage. Seldom
    # used: the planner cannot tell how often the node reads it; the executor's admission by use can.
    assert orders_with_a_disk_copy_in_the_way(per_minute) == []


def gpu_victim_for_a_waiting_request() -> list[tuple[str, OrderAction, Tier]]:
    """What is ordered when node a's 80 GB GPU holds "busy" (20 GB, sixty requests a minute) and
    "steady" (40 GB, one request every two minutes), each with a disk copy, and a request waits for
    "new" (30 GB), which needs one of them to make room (both last used minutes ago: either may go)."""
    busy = resident("busy", 20 * GB, loaded_at=NOW - 3600, last_used=NOW - 150)
    steady = resident("steady", 40 * GB, loaded_at=NOW - 3600, last_used=NOW - 150)
    capacity = {Tier.L0: 80 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB}
    a = report("a", {Tier.L0: [busy, steady], Tier.L2: [busy, steady]}, capacity=capacity)
    world = ClusterState.merge(cluster("a"), {"a": a})
    forecasts = {"busy": steady_forecast("busy", 60.0), "steady": steady_forecast("steady", 0.5)}
    cat = catalog(spec("busy", 20 * GB), spec("steady", 40 * GB), spec("new", 30 * GB))
    orders = plan(NOW, forecasts, [hint("new", source=DEMAND_SOURCE)], cat, world, CONFIG)
    return [(o.model, o.action, o.tier) for o in orders]


def test_a_waiting_request_displaces_the_gpu_copy_fewer_requests_would_queue_behind() -> None:
    # Both will be asked for within minutes. Reloading "busy" from disk takes half as long as reloading
    # "steady", but about three requests arrive during it and wait for it too, where "steady"'s reload
    # is most likely waited for by its own request alone.
    assert gpu_victim_for_a_waiting_request() == [
        ("steady", OrderAction.DEMOTE, Tier.L1),
        ("new", OrderAction.PREFETCH, Tier.L0),
    ]


def _guessed(daily: float, window_p: float, config: PlannerConfig) -> bool:
    """Whether a round prefetches a 2 GB model used ``daily`` times a day into GPU memory on a chance
    ``window_p`` of a request in the ten minutes from 20 minutes on (nothing resident, nothing else)."""
    per_bucket = 1.0 - (1.0 - window_p) ** 0.1
    forecast = dataclasses.replace(
        surge_forecast("m", NOW + 1200, p=per_bucket, buckets=30), daily_requests=daily
    )
    c = cluster("a")
    r = report("a", {}, capacity=CAP)
    orders = plan(NOW + 900, {"m": forecast}, [], catalog(spec("m", 2 * GB)), state(c, r), config)
    return any(o.action is OrderAction.PREFETCH and o.tier is Tier.L0 for o in orders)


@pytest.mark.parametrize("daily", [24.0, 240.0, 2400.0])
def test_per_model_objective_guesses_at_the_same_odds_for_a_busy_model_as_for_an_hourly_one(
    daily: float,
) -> None:
    # A busy model's cold start weighs little per model, and so does the transfer a wrong guess about it
    # wastes: charged as an hourly model's, a model used 240 times a day was not guessed even at P = 0.99.
    per_model = PlannerConfig(objective="models")
    assert _guessed(daily, 0.9, per_model)
    assert not _guessed(daily, 0.5, per_model)


def test_per_model_objective_guesses_at_lower_odds_for_a_model_used_less_than_hourly() -> None:
    per_model = PlannerConfig(objective="models")
    # Its cold start weighs more than an hourly model's, the transfer a wrong guess wastes no more.
    assert _guessed(2.0, 0.3, per_model)
    assert not _guessed(24.0, 0.3, per_model)


def test_a_wrong_guess_is_valued_apart_for_models_of_one_weight_but_not_one_use() -> None:
    # A critical model used four times an hour weighs what a standard hourly one does (4 × 1/4), but
    # a wrong guess about it wastes a quarter as much: the figures kept for models alike are not shared.
    valuer = _Valuer(PlannerConfig(objective="models"), _hop_times(), weights={"busy": 0.25, "hourly": 1.0})
    busy, hourly = spec("busy", 2 * GB, PriorityClass.CRITICAL), spec("hourly", 2 * GB)
    node = state(cluster("a")).nodes["a"]
    assert valuer.weight(busy) == valuer.weight(hourly)
    _, wasted_hourly = valuer.tier_figures(hourly, node, Tier.L3)
    _, wasted_busy = valuer.tier_figures(busy, node, Tier.L3)
    assert wasted_busy[Tier.L0] == pytest.approx(0.25 * wasted_hourly[Tier.L0])
