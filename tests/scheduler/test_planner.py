from __future__ import annotations

import gc
import sys

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
    surge_forecast,
)

from models import PriorityClass
from prewarm import ConfigError, Order, OrderAction, OrderReason, Tier
from scheduler import DEMAND_SOURCE, Cluster, ClusterState, PlannerConfig, plan, plan_detailed

CONFIG = PlannerConfig()
CAP = {Tier.L0: 80 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB}


def test_cluster_file_reads_human_sizes_and_rates() -> None:
    c = cluster("gpu-a")
    assert c.nodes[0].l0_bytes == 80 * GB
    assert c.bandwidth.l2_bytes_per_s == 7e9


def test_cluster_file_with_duplicate_nodes_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="duplicate node names"):
        Cluster.from_data({"nodes": [{"name": "a"}, {"name": "a"}]})


def test_cluster_file_with_a_gpu_of_no_memory_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"nodes\.0\.gpus\.1\.memory_bytes"):
        Cluster.from_data({"nodes": [{"name": "a", "gpus": [{"memory_bytes": "80GB"}, {"memory_bytes": 0}]}]})


def test_executor_report_overrides_configured_capacity_and_bandwidth() -> None:
    r = report("gpu-a", {}, capacity={Tier.L0: 10 * GB, Tier.L1: 20 * GB, Tier.L2: 30 * GB})
    r = r.model_copy(update={"bandwidth_bytes_per_s": {"L3->L2": 2e9, "L2->L1": 0.0}})
    node = ClusterState.merge(cluster("gpu-a"), {"gpu-a": r}).nodes["gpu-a"]
    assert node.capacity[Tier.L1] == 20 * GB
    assert node.bandwidth["L3->L2"] == 2e9
    assert node.bandwidth["L2->L1"] == 7e9  # an unmeasured hop keeps the configured figure


def test_hint_prefetches_before_any_executor_reports() -> None:
    orders = plan(
        NOW, {}, [hint("chat", eta_s=300)], catalog(spec("chat", 10 * GB)), state(cluster("a")), CONFIG
    )
    assert len(orders) == 1
    order = orders[0]
    assert order.action is OrderAction.PREFETCH
    assert order.reason is OrderReason.HINT
    assert order.tier in (Tier.L0, Tier.L1)
    # 10 GB from L3 takes ~10 s + ~1.4 s + margins: it starts well before the eta, not at once.
    assert NOW < order.not_before < NOW + 300
    assert order.deadline == NOW + 300 + 600


def test_lead_time_follows_measured_bandwidth() -> None:
    c = cluster("a")
    slow = report("a", {}, capacity=CAP).model_copy(update={"bandwidth_bytes_per_s": {"L3->L2": 0.1e9}})
    fast = plan(NOW, {}, [hint("m", eta_s=900)], catalog(spec("m", 20 * GB)), state(c), CONFIG)[0]
    slowed = plan(NOW, {}, [hint("m", eta_s=900)], catalog(spec("m", 20 * GB)), state(c, slow), CONFIG)[0]
    assert slowed.not_before < fast.not_before - 150  # 200 s instead of 20 s for the first hop


def test_same_decision_in_two_rounds_has_the_same_order_id() -> None:
    cat = catalog(spec("chat", 10 * GB))
    first = plan(NOW, {}, [hint("chat", eta_s=600)], cat, state(cluster("a")), CONFIG)
    later = plan(NOW + 20, {}, [hint("chat", eta_s=600)], cat, state(cluster("a")), CONFIG)
    assert [o.id for o in first] == [o.id for o in later]


def test_pending_prefetch_is_not_issued_twice() -> None:
    cat = catalog(spec("chat", 10 * GB))
    first = plan(NOW, {}, [hint("chat")], cat, state(cluster("a")), CONFIG)
    pending = ClusterState.merge(cluster("a"), {}, pending=first)
    assert plan(NOW + 5, {}, [hint("chat")], cat, pending, CONFIG) == []


def test_unknown_models_get_no_orders() -> None:
    forecasts = {"ghost": flat_forecast("ghost", 0.9)}
    assert plan(NOW, forecasts, [hint("ghost")], catalog(spec("m", GB)), state(cluster("a")), CONFIG) == []


def test_surge_forecast_gives_a_timed_prefetch_ahead_of_the_surge() -> None:
    surge = NOW + 1800
    cat = catalog(spec("big", 140 * GB))
    detailed = plan_detailed(NOW, {"big": surge_forecast("big", surge)}, [], cat, state(cluster("a")), CONFIG)
    [order] = [o for o in detailed.orders if o.action is OrderAction.PREFETCH]
    assert order.reason is OrderReason.FORECAST
    assert order.tier in (Tier.L1, Tier.L0)
    # 140 s from L3 and 20 s from L2, stretched by the margin: starts about 3 minutes ahead, not now.
    lead = surge - order.not_before
    assert 160 < lead < 300


@pytest.mark.parametrize(
    ("size", "l1", "l2"),
    [(20 * GB, 0, 0), (140 * GB, 100 * GB, 2000 * GB)],
    ids=["no-host-memory-or-disk", "host-memory-smaller-than-the-model"],
)
def test_a_prefetch_into_gpu_memory_passes_tiers_that_cannot_hold_the_model(
    size: int, l1: int, l2: int
) -> None:
    # A load passes through tiers that could never hold the model (the executor streams past them): the
    # copy need not find room there first, or such a node would never be prefetched to.
    cat = catalog(spec("m", size))
    surge = {"m": surge_forecast("m", NOW + 1800)}
    gpus = (80 * GB, 80 * GB)
    orders = plan(NOW, surge, [], cat, state(cluster("a", l1=l1, l2=l2, gpus=gpus)), CONFIG)
    assert [(o.action, o.tier) for o in orders] == [(OrderAction.PREFETCH, Tier.L0)]
    roomy = cluster("a", l1=200 * GB, l2=2000 * GB, gpus=gpus)
    assert orders == plan(NOW, surge, [], cat, state(roomy), CONFIG)


def test_unlikely_big_model_is_only_staged_on_disk() -> None:
    cat = catalog(spec("big", 140 * GB))
    orders = plan(NOW, {"big": flat_forecast("big", 0.01)}, [], cat, state(cluster("a")), CONFIG)
    assert [(o.action, o.tier) for o in orders] == [(OrderAction.PREFETCH, Tier.L2)]


def test_a_guess_is_staged_on_disk_only_where_it_pays_for_the_download_requests_need() -> None:
    # Host memory too small for it: the disk is the one tier open. On a link that loads on request leave
    # idle any chance stages it; on one they keep busy, a wrong guess delays them by its download.
    cat = catalog(spec("big", 140 * GB))
    staged = {}
    for busy in (0.0, 1.0):
        r = report("a", {}, capacity={Tier.L0: 80 * GB, Tier.L1: 100 * GB, Tier.L2: 2000 * GB})
        nodes = state(cluster("a", l1=100 * GB), r.model_copy(update={"link_demand_busy": {"L3->L2": busy}}))
        for p in (0.01, 0.9):
            orders = plan(NOW, {"big": flat_forecast("big", p)}, [], cat, nodes, CONFIG)
            staged[busy, p] = [o.tier for o in orders if o.action is OrderAction.PREFETCH]
    assert staged == {(0.0, 0.01): [Tier.L2], (0.0, 0.9): [Tier.L2], (1.0, 0.01): [], (1.0, 0.9): [Tier.L2]}


def test_a_node_reports_how_busy_its_links_are_with_loads_on_request() -> None:
    r = report("a", {}, capacity=CAP).model_copy(update={"link_demand_busy": {"L3->L2": 0.46}})
    node = ClusterState.merge(cluster("a"), {"a": r}).nodes["a"]
    assert node.demand_busy == {"L3->L2": 0.46}
    assert node.staging_busy == 0.5  # in tenths: nodes that differ by less are valued alike
    assert ClusterState.merge(cluster("a"), {}).nodes["a"].staging_busy == 0.0  # no report reads as idle


def test_critical_priority_earns_a_closer_tier_than_batch() -> None:
    for_class = {}
    for cls in (PriorityClass.CRITICAL, PriorityClass.BATCH):
        cat = catalog(spec("m", 140 * GB, cls))
        [order] = plan(NOW, {"m": flat_forecast("m", 0.1)}, [], cat, state(cluster("a")), CONFIG)
        for_class[cls] = order.tier
    assert for_class[PriorityClass.CRITICAL].level < for_class[PriorityClass.BATCH].level


def test_room_is_made_by_demoting_one_tier_down() -> None:
    c = cluster("a", l0=20 * GB)
    old = resident("old", 15 * GB, loaded_at=NOW - 3600, last_used=NOW - 1800)
    r = report(
        "a",
        {Tier.L0: [old], Tier.L1: [], Tier.L2: [old]},
        capacity={Tier.L0: 20 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB},
    )
    cat = catalog(spec("old", 15 * GB), spec("new", 10 * GB))
    orders = plan(NOW, {}, [hint("new", source=DEMAND_SOURCE)], cat, state(c, r), CONFIG)
    assert [(o.model, o.action, o.tier, o.reason) for o in orders] == [
        ("old", OrderAction.DEMOTE, Tier.L1, OrderReason.CAPACITY),
        ("new", OrderAction.PREFETCH, Tier.L0, OrderReason.DEMAND),
    ]
    assert orders[1].demand


def test_recently_used_model_is_not_demoted_for_a_speculative_prefetch() -> None:
    c = cluster("a", l0=20 * GB, l1=20 * GB)
    hot = resident("hot", 15 * GB, loaded_at=NOW - 3600, last_used=NOW - 10)
    cap = {Tier.L0: 20 * GB, Tier.L1: 20 * GB, Tier.L2: 2000 * GB}
    r = report("a", {Tier.L0: [hot], Tier.L1: [hot], Tier.L2: [hot]}, capacity=cap)
    cat = catalog(spec("hot", 15 * GB), spec("new", 10 * GB))
    detailed = plan_detailed(NOW, {}, [hint("new", confidence=0.9)], cat, state(c, r), CONFIG)
    assert all(o.model != "hot" for o in detailed.orders)


def test_unused_prefetch_is_demoted_one_tier_after_the_misprediction_window_and_counted() -> None:
    c = cluster("a")
    stale = resident("m", 5 * GB, loaded_at=NOW - 601, prefetched=True)
    r = report("a", {Tier.L1: [stale], Tier.L2: [stale]}, capacity=CAP)
    detailed = plan_detailed(NOW, {}, [], catalog(spec("m", 5 * GB)), state(c, r), CONFIG)
    assert detailed.mispredictions == (("a", "m"),)
    [order] = detailed.orders
    assert (order.action, order.tier, order.reason) == (
        OrderAction.DEMOTE,
        Tier.L2,
        OrderReason.MISPREDICTION,
    )


def test_prefetch_inside_the_window_is_kept() -> None:
    stale = resident("m", 5 * GB, loaded_at=NOW - 300, prefetched=True)
    r = report("a", {Tier.L1: [stale], Tier.L2: [stale]}, capacity=CAP)
    assert plan(NOW, {}, [], catalog(spec("m", 5 * GB)), state(cluster("a"), r), CONFIG) == []


def test_mispredicted_model_is_not_fetched_straight_back() -> None:
    c = cluster("a")
    stale = resident("m", 5 * GB, loaded_at=NOW - 700, prefetched=True)
    r = report("a", {Tier.L1: [stale], Tier.L2: [stale]}, capacity=CAP)
    cat = catalog(spec("m", 5 * GB))
    forecasts = {"m": flat_forecast("m", 0.9)}
    first = plan(NOW, forecasts, [], cat, state(c, r), CONFIG)
    assert [o.reason for o in first] == [OrderReason.MISPREDICTION]
    gone = report("a", {Tier.L2: [stale.model_copy(update={"prefetched": False})]}, capacity=CAP)
    again = plan(NOW + 30, forecasts, [], cat, ClusterState.merge(c, {"a": gone}, recent=first), CONFIG)
    assert again == []


def test_unlikely_model_is_not_demoted_for_a_model_that_may_come_but_is_not_placed() -> None:
    # "next" may come (P ~ 0.3 in the window: not worth a prefetch) and would not fit beside "m". Room
    # is made when a placement needs it, not ahead: demoting "m" now made a cold start of its next
    # request for a load that may never come.
    c = cluster("a")
    cooled = resident("m", 40 * GB, loaded_at=NOW - 3600, last_used=NOW - 1800)
    r = report("a", {Tier.L0: [cooled], Tier.L2: [cooled]}, capacity=CAP)
    cat = catalog(spec("m", 40 * GB), spec("next", 60 * GB))
    forecasts = {"m": flat_forecast("m", 0.001), "next": flat_forecast("next", 0.03)}
    assert [o for o in plan(NOW, forecasts, [], cat, state(c, r), CONFIG) if o.model == "m"] == []


def test_unlikely_model_is_not_cooled_down_while_memory_is_free() -> None:
    cooled = resident("m", 40 * GB, loaded_at=NOW - 3600, last_used=NOW - 1800)
    r = report("a", {Tier.L0: [cooled], Tier.L1: [cooled], Tier.L2: [cooled]}, capacity=CAP)
    cat = catalog(spec("m", 40 * GB))
    assert plan(NOW, {"m": flat_forecast("m", 0.001)}, [], cat, state(cluster("a"), r), CONFIG) == []


def test_busy_model_is_not_cooled_down_while_memory_is_free() -> None:
    # A 70 GB model asked for every few minutes: holding it in an otherwise idle GPU costs nothing.
    cap = {Tier.L0: 160 * GB, Tier.L1: 400 * GB, Tier.L2: 2000 * GB}
    busy = resident("big", 70 * GB, loaded_at=NOW - 3600, last_used=NOW - 170)
    r = report("a", {Tier.L0: [busy], Tier.L1: [busy], Tier.L2: [busy]}, capacity=cap)
    cat = catalog(spec("big", 70 * GB))
    assert plan(NOW, {"big": flat_forecast("big", 0.3)}, [], cat, state(cluster("a"), r), CONFIG) == []


def test_model_used_within_the_window_is_not_cooled_even_if_the_forecast_says_no() -> None:
    c = cluster("a")
    used = resident("m", 40 * GB, loaded_at=NOW - 3600, last_used=NOW - 300)
    r = report("a", {Tier.L0: [used], Tier.L2: [used]}, capacity=CAP)
    cat = catalog(spec("m", 40 * GB), spec("next", 60 * GB))
    forecasts = {"m": flat_forecast("m", 0.001), "next": flat_forecast("next", 0.03)}
    assert [o for o in plan(NOW, forecasts, [], cat, state(c, r), CONFIG) if o.model == "m"] == []


def test_a_model_is_never_demoted_twice_in_one_round() -> None:
    # Memory priced so that neither copy of "m" is worth holding: one tier per round all the same
    # (L0 to L1 and L1 to L2 at once would throw away the copy just made).
    c = cluster("a", l0=80 * GB, l1=80 * GB)
    cap = {Tier.L0: 80 * GB, Tier.L1: 80 * GB, Tier.L2: 2000 * GB}
    cold = resident("m", 40 * GB, loaded_at=NOW - 3600, last_used=NOW - 1800)
    r = report("a", {Tier.L0: [cold], Tier.L1: [cold], Tier.L2: [cold]}, capacity=cap)
    cat = catalog(spec("m", 40 * GB))
    priced = PlannerConfig(memory_price=1.0)
    demotes = [o for o in plan(NOW, {"m": flat_forecast("m", 0.001)}, [], cat, state(c, r), priced)]
    assert [(o.action, o.tier) for o in demotes] == [(OrderAction.DEMOTE, Tier.L1)]


def test_speculative_prefetch_into_memory_needs_a_likely_request() -> None:
    cat = catalog(spec("m", 70 * GB))
    maybe = plan(NOW, {"m": flat_forecast("m", 0.05)}, [], cat, state(cluster("a")), CONFIG)  # P ~ 0.4
    likely = plan(NOW, {"m": flat_forecast("m", 0.2)}, [], cat, state(cluster("a")), CONFIG)  # P ~ 0.9
    assert [o.tier for o in maybe] == [Tier.L2]
    assert [o.tier for o in likely] == [Tier.L0]


def test_unused_gpu_copy_of_a_host_resident_is_demoted_back_not_dropped_to_disk() -> None:
    host = resident("m", 20 * GB, loaded_at=NOW - 3600, last_used=NOW - 1800)
    gpu = resident("m", 20 * GB, loaded_at=NOW - 700, prefetched=True)
    r = report("a", {Tier.L0: [gpu], Tier.L1: [host], Tier.L2: [host]}, capacity=CAP)
    detailed = plan_detailed(NOW, {}, [], catalog(spec("m", 20 * GB)), state(cluster("a"), r), CONFIG)
    assert detailed.mispredictions == (("a", "m"),)
    [order] = detailed.orders
    assert (order.action, order.tier, order.reason) == (
        OrderAction.DEMOTE,
        Tier.L1,
        OrderReason.MISPREDICTION,
    )


def test_cascading_cold_start_places_one_and_queues_the_rest() -> None:
    c = cluster("a", l0=30 * GB, l1=30 * GB, l2=30 * GB)
    cat = catalog(spec("x", 25 * GB), spec("y", 25 * GB), spec("z", 25 * GB))
    hints = [hint(m, source=DEMAND_SOURCE) for m in ("x", "y", "z")]
    detailed = plan_detailed(NOW, {}, hints, cat, state(c), CONFIG)
    assert len(detailed.placements) == 1
    assert sorted(p.model for p in detailed.deferred) == sorted(
        {"x", "y", "z"} - {detailed.placements[0].model}
    )
    assert [o.action for o in detailed.orders] == [OrderAction.PREFETCH]


def test_copy_of_an_old_version_does_not_count_as_holding_the_model() -> None:
    old = resident("chat", 2 * GB, loaded_at=NOW - 3600).model_copy(update={"version": "0"})
    r = report("a", {Tier.L1: [old], Tier.L2: [old]}, capacity=CAP)
    orders = plan(NOW, {}, [hint("chat")], catalog(spec("chat", 2 * GB)), state(cluster("a"), r), CONFIG)
    assert [(o.model, o.version, o.action) for o in orders] == [("chat", "1", OrderAction.PREFETCH)]


def test_staging_spreads_models_over_nodes_instead_of_piling_them_on_one() -> None:
    names = [f"m{i}" for i in range(6)]
    cat = catalog(*(spec(n, 100 * GB) for n in names))
    forecasts = {n: flat_forecast(n, 0.01) for n in names}
    orders = plan(NOW, forecasts, [], cat, state(cluster("a", "b")), CONFIG)
    per_node = {node: sum(o.node == node for o in orders) for node in ("a", "b")}
    assert per_node == {"a": 3, "b": 3}


def test_gpu_prefetch_leaves_room_for_a_more_valuable_model_waiting_in_host_memory() -> None:
    # The next request for "big" would make the executor evict by LRU: the unused small prefetch.
    cap = {Tier.L0: 160 * GB, Tier.L1: 400 * GB, Tier.L2: 2000 * GB}
    big = resident("big", 140 * GB, loaded_at=NOW - 3600, last_used=NOW - 900)
    small = resident("small", 28 * GB, loaded_at=NOW - 3600)
    r = report("a", {Tier.L1: [big], Tier.L2: [big, small]}, capacity=cap)
    cat = catalog(spec("big", 140 * GB), spec("small", 28 * GB))
    forecasts = {m: flat_forecast(m, 0.3) for m in ("big", "small")}
    c = cluster("a", l0=160 * GB, l1=400 * GB)
    orders = plan(NOW, forecasts, [], cat, state(c, r), CONFIG)
    assert {(o.model, o.action, o.tier) for o in orders} == {
        ("small", OrderAction.PREFETCH, Tier.L1),
        ("big", OrderAction.PREFETCH, Tier.L0),
    }


def _plan_beside(
    staged: dict[str, dict[str, int]], new: tuple[str, int], rates: dict[str, float], *, l0: int, l1: int
) -> list[Order]:
    """One round on the nodes of ``staged``, each holding its models (name -> bytes) on disk, with a
    catalog of them and ``new`` and a flat forecast for each model of ``rates`` (chance a minute)."""
    cap = {Tier.L0: l0, Tier.L1: l1, Tier.L2: 2000 * GB}
    reports = [
        report(node, {Tier.L2: [resident(m, b, loaded_at=NOW - 3600) for m, b in held.items()]}, capacity=cap)
        for node, held in staged.items()
    ]
    sizes = {m: b for held in staged.values() for m, b in held.items()} | dict([new])
    cat = catalog(*(spec(m, b) for m, b in sizes.items()))
    forecasts = {m: flat_forecast(m, p) for m, p in rates.items()}
    return plan(NOW, forecasts, [], cat, state(cluster(*staged, l0=l0, l1=l1), *reports), CONFIG)


def test_a_busy_model_is_staged_away_from_the_node_of_another_busy_one() -> None:
    # Requests go where a model is staged: two busy models on one node would take turns on its GPU,
    # even though the other node has less free disk (it holds cold models).
    cold = {f"cold{i}": 100 * GB for i in range(5)}
    rates = dict.fromkeys(cold, 0.0001) | {"busy1": 0.02, "busy2": 0.02}
    orders = _plan_beside(
        {"a": cold, "b": {"busy1": 140 * GB}}, ("busy2", 140 * GB), rates, l0=80 * GB, l1=200 * GB
    )
    assert [(o.model, o.node, o.tier) for o in orders] == [("busy2", "a", Tier.L2)]


def test_rarely_used_models_staged_on_a_node_count_for_the_gpu_room_they_will_ask_for() -> None:
    # Node a has four rarely used 70 GB models staged, node b one busy 7 GB model. Counted by requests
    # times bytes, b looks the busier and every rare model piled onto a, whose GPUs they would then
    # share while b's stood empty; counted by the GPU room each will ask for within the horizon
    # (bytes times the chance of a request), a is the fuller.
    rare = {f"rare{i}": 70 * GB for i in range(4)}
    rates = dict.fromkeys([*rare, "new"], 0.01) | {"busy": 0.5}  # 0.6 an hour; 30 an hour
    orders = _plan_beside(
        {"a": rare, "b": {"busy": 7 * GB}}, ("new", 70 * GB), rates, l0=160 * GB, l1=400 * GB
    )
    assert {o.node for o in orders if o.model == "new"} == {"b"}


def test_a_new_forecast_is_never_planned_from_the_windows_kept_for_the_old_one() -> None:
    cat = catalog(spec("big", 140 * GB))
    for surge in (NOW + 3000, NOW + 1200, NOW + 2400):
        # The previous forecast is dropped here, so the new one may even take over its id().
        detailed = plan_detailed(
            NOW, {"big": surge_forecast("big", surge)}, [], cat, state(cluster("a")), CONFIG
        )
        [order] = [o for o in detailed.orders if o.action is OrderAction.PREFETCH]
        assert 160 < surge - order.not_before < 300


def test_a_planning_round_sets_off_no_garbage_collection_and_leaves_the_collector_as_it_was() -> None:
    cat = catalog(*(spec(f"m{i}", (1 + i % 7) * GB) for i in range(300)))
    forecasts = {m: flat_forecast(m, 0.4) for m in cat.ids()}
    world, config = state(cluster("a", "b")), PlannerConfig()
    collections: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        # Which code the collection interrupted: the frames under this callback.
        frame, names = sys._getframe(1), set()
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        if phase == "start" and "_full_round" in names:  # the round, inside its pause
            collections.append(phase)

    gc.callbacks.append(seen)
    try:
        gc.collect()
        collections.clear()
        was = gc.get_threshold()
        gc.set_threshold(10)  # a collection every few allocations, were the collector running
        try:
            orders = plan(NOW, forecasts, [], cat, world, config)
        finally:
            gc.set_threshold(*was)
        assert orders
        assert collections == []
        assert gc.isenabled()
        gc.disable()
        try:
            plan(NOW, forecasts, [], cat, world, config)
            assert not gc.isenabled()  # a caller that had it off keeps it off
        finally:
            gc.enable()
    finally:
        gc.callbacks.remove(seen)


def test_no_guess_places_a_second_copy_of_a_model_a_node_is_loading_for_a_waiting_request() -> None:
    # The load on request's copy is not ready, so no report lists it yet: a guess about the model put a
    # copy on another node, which requests, sent where the model is loaded, never used.
    c, cat = cluster("a", "b"), catalog(spec("m", 28 * GB))
    forecasts = {"m": flat_forecast("m", 0.95)}
    idle = [report(n, {}, capacity=CAP) for n in ("a", "b")]
    assert [o.model for o in plan(NOW, forecasts, [], cat, state(c, *idle), CONFIG)] == ["m"]
    loading = idle[0].model_copy(update={"demand_loads": ["m"]})
    assert plan(NOW, forecasts, [], cat, state(c, loading, idle[1]), CONFIG) == []
