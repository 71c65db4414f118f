"""Invariants of the planner over generated clusters, catalogs, residents, hints and forecasts."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
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

from forecaster import ModelForecast
from models import Catalog
from prewarm import (
    Hint,
    Order,
    OrderAction,
    OrderReason,
    ResidentModel,
    Tier,
    effect,
    gpu_placement,
    gpu_shards,
)
from scheduler import DEMAND_SOURCE, Cluster, ClusterState, PlannerConfig, PlannerMemo, plan, plan_detailed
from scheduler._planner._value import _hop_times, _Valuer
from scheduler._planner._want import _Want, _Wants
from scheduler._planner._wants import (
    _forecast_wants_afresh,
    _forecast_wants_of,
    _WindowCache,
)

TIERS = (Tier.L0, Tier.L1, Tier.L2)
CONFIG = PlannerConfig()
World = tuple[Catalog, Cluster, ClusterState, list[Hint], dict[str, ModelForecast]]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def apply(
    held: dict[Tier, dict[str, int]], orders: Sequence[Order], cat: Catalog, capacity: Mapping[Tier, int]
) -> None:
    """What an executor does with the orders: the spine's ``effect``, the rule the executor follows,
    streaming past a tier on the way that could never hold the model (``executor/_hops.py``)."""
    for order in orders:
        size = cat[order.model].size_bytes
        held_now = [t for t in TIERS if order.model in held[t]]
        change = effect(order.action, order.tier, held_now, lambda t, size=size: capacity.get(t, 0) >= size)
        for t in change.fills:
            held[t][order.model] = size
        for t in change.drops:
            held[t].pop(order.model, None)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    names = [f"m{i}" for i in range(draw(st.integers(1, 7)))]
    sizes = {n: draw(st.integers(1, 60)) * GB for n in names}
    cat = catalog(*(spec(n, sizes[n]) for n in names))
    node_names = [f"n{i}" for i in range(draw(st.integers(1, 3)))]
    # Some nodes split L0 over GPUs (a model larger than one takes shards on several), some do not.
    gpus = {n: [draw(st.integers(10, 60)) * GB for _ in range(draw(st.integers(0, 3)))] for n in node_names}
    cluster = Cluster.from_data(
        {"nodes": [{"name": n, "gpus": [{"memory_bytes": g} for g in gpus[n]]} for n in node_names]}
    )
    reports = {}
    for node in node_names:
        cap = {t: draw(st.integers(0, 120)) * GB for t in TIERS}
        if gpus[node]:
            cap[Tier.L0] = sum(gpus[node])
        gpu_free = list(gpus[node])
        tiers: dict[Tier, list[ResidentModel]] = {t: [] for t in TIERS}
        # Residents that fit, placed inclusively: a model in L0 is also in L1 and L2.
        for name in names:
            level = draw(st.sampled_from([0, 1, 2, 3, 3]))
            path = [t for t in TIERS if t.level >= level]
            on = gpu_placement(sizes[name], gpus[node], gpu_free) if gpus[node] and level == 0 else ()
            if on is None:
                continue
            if all(sum(r.bytes for r in tiers[t]) + sizes[name] <= cap[t] for t in path):
                r = resident(
                    name,
                    sizes[name],
                    loaded_at=NOW - draw(st.sampled_from([10, 300, 900, 4000])),
                    last_used=draw(st.sampled_from([None, NOW - 5, NOW - 2000])),
                    prefetched=draw(st.booleans()),
                )
                for g in on:
                    gpu_free[g] -= -(-sizes[name] // len(on))
                for t in path:
                    tiers[t].append(r.model_copy(update={"gpus": list(on)}) if t is Tier.L0 else r)
        reports[node] = report(node, tiers, capacity=cap, gpus=gpus[node])
    state = ClusterState.merge(cluster, reports)
    pool = [*names, "ghost", "other/model"]
    hints = [
        hint(
            draw(st.sampled_from(pool)),
            eta_s=draw(st.sampled_from([0.0, 120.0, 1200.0])),
            confidence=draw(st.sampled_from([0.1, 0.5, 1.0])),
            source=draw(st.sampled_from(["web", DEMAND_SOURCE])),
        )
        for _ in range(draw(st.integers(0, 5)))
    ]
    forecasts: dict[str, ModelForecast] = {}
    for name in draw(st.lists(st.sampled_from(pool), max_size=4, unique=True)):
        if draw(st.booleans()):
            forecasts[name] = flat_forecast(name, draw(st.sampled_from([0.001, 0.05, 0.5])))
        else:
            forecasts[name] = surge_forecast(name, NOW + draw(st.sampled_from([0, 600, 3000])))
    return cat, cluster, state, hints, forecasts


@SETTINGS
@given(worlds())
def test_capacity_is_never_exceeded_by_applying_the_orders(world: World) -> None:
    cat, _, state, hints, forecasts = world
    orders = plan(NOW, forecasts, hints, cat, state, CONFIG)
    for name, node in state.nodes.items():
        held = {t: {r.model: r.bytes for r in node.residents(t)} for t in TIERS}
        apply(held, [o for o in orders if o.node == name], cat, node.capacity)
        for t in TIERS:
            assert sum(held[t].values()) <= node.capacity.get(t, 0), (name, t, held[t])


def apply_on_gpus(gpu_used: list[int], l0: dict[str, tuple[int, ...]], order: Order, size: int) -> None:
    """What an order does to each GPU's bytes: an L0 copy takes a shard on each GPU its order names."""
    change = effect(order.action, order.tier, [Tier.L0] if order.model in l0 else [])
    if Tier.L0 in change.drops:
        on = l0.pop(order.model)
        for g in on:
            gpu_used[g] -= -(-size // len(on))
    if Tier.L0 in change.fills:
        assert order.gpus, "an L0 copy on a node that splits L0 over GPUs names its GPUs"
        l0[order.model] = tuple(order.gpus)
        for g in order.gpus:
            gpu_used[g] += -(-size // len(order.gpus))


@SETTINGS
@given(worlds(), st.sampled_from([0.0, 0.05]))
def test_no_gpu_is_ever_over_committed_by_applying_the_orders(world: World, price: float) -> None:
    cat, _, state, hints, forecasts = world
    orders = plan(NOW, forecasts, hints, cat, state, replace(CONFIG, memory_price=price))
    for name, node in state.nodes.items():
        if not node.gpus:
            continue
        l0 = {r.model: tuple(r.gpus) for r in node.residents(Tier.L0)}
        gpu_used = list(node.gpu_used)
        for order in (o for o in orders if o.node == name):
            size = cat[order.model].size_bytes
            if order.gpus:
                assert len(order.gpus) == gpu_shards(size, node.gpus)
            apply_on_gpus(gpu_used, l0, order, size)
        assert all(u <= c for u, c in zip(gpu_used, node.gpus, strict=True)), (name, gpu_used, node.gpus)


@SETTINGS
@given(worlds())
def test_no_order_names_a_model_outside_the_catalog_or_an_unknown_node(world: World) -> None:
    cat, _, state, hints, forecasts = world
    for order in plan(NOW, forecasts, hints, cat, state, CONFIG):
        assert order.model in cat
        assert order.node in state.nodes
        assert order.deadline > order.not_before >= NOW
        # A prefetch is justified by a signal; only room for a placement, the price of memory or a
        # misprediction moves one out.
        if order.action is OrderAction.PREFETCH:
            assert order.reason in {OrderReason.FORECAST, OrderReason.HINT, OrderReason.DEMAND}
        else:
            assert order.reason in {OrderReason.CAPACITY, OrderReason.MISPREDICTION}


@SETTINGS
@given(worlds())
def test_planning_is_deterministic_and_ids_are_unique(world: World) -> None:
    cat, _, state, hints, forecasts = world
    first = plan(NOW, forecasts, hints, cat, state, CONFIG)
    assert first == plan(NOW, forecasts, hints, cat, state, CONFIG)
    assert len({o.id for o in first}) == len(first)


@SETTINGS
@given(
    st.lists(st.integers(5, 40), min_size=1, max_size=4),
    st.integers(5, 40),
)
def test_demand_pre_empts_speculative_prefetches(speculative_gb: list[int], wanted_gb: int) -> None:
    l0 = max(sum(speculative_gb), wanted_gb) * GB
    big = 1000 * GB
    names = [f"s{i}" for i in range(len(speculative_gb))]
    cat = catalog(
        *(spec(n, g * GB) for n, g in zip(names, speculative_gb, strict=True)), spec("want", wanted_gb * GB)
    )
    prefetched = [
        resident(n, g * GB, loaded_at=NOW - 300, prefetched=True)
        for n, g in zip(names, speculative_gb, strict=True)
    ]
    r = report(
        "n", {Tier.L0: prefetched, Tier.L2: prefetched}, capacity={Tier.L0: l0, Tier.L1: big, Tier.L2: big}
    )
    cluster = Cluster.from_data({"nodes": [{"name": "n"}]})
    forecasts = {n: flat_forecast(n, 0.5) for n in names}  # they are even worth something
    orders = plan(
        NOW,
        forecasts,
        [hint("want", source=DEMAND_SOURCE)],
        cat,
        ClusterState.merge(cluster, {"n": r}),
        CONFIG,
    )
    [load] = [o for o in orders if o.model == "want"]
    assert (load.action, load.tier, load.demand) == (OrderAction.PREFETCH, Tier.L0, True)
    assert all(o.action is OrderAction.DEMOTE for o in orders if o.model != "want")


@SETTINGS
@given(st.integers(3, 6), st.integers(51, 100))
def test_cascading_cold_starts_are_placed_or_queued_never_over_committed(count: int, percent: int) -> None:
    room = 100 * GB
    size = room * percent // 100  # more than half: two never fit together
    names = [f"cold{i}" for i in range(count)]
    cat = catalog(*(spec(n, size) for n in names))
    cluster = Cluster.from_data(
        {
            "nodes": [
                {
                    "name": "n",
                    "gpus": [{"memory_bytes": room}],
                    "host_cache_bytes": room,
                    "disk_cache_bytes": room,
                }
            ]
        }
    )
    state = ClusterState.merge(cluster, {})
    detailed = plan_detailed(NOW, {}, [hint(n, source=DEMAND_SOURCE) for n in names], cat, state, CONFIG)
    assert len(detailed.placements) == 1
    assert {p.model for p in detailed.placements} | {p.model for p in detailed.deferred} == set(names)
    held: dict[Tier, dict[str, int]] = {t: {} for t in TIERS}
    apply(held, detailed.orders, cat, dict.fromkeys(TIERS, room))
    assert all(sum(held[t].values()) <= room for t in TIERS)


@SETTINGS
@given(worlds(), st.lists(st.sampled_from([0.0, 0.5, 20.0, 59.0, 61.0, 300.0, 4000.0]), max_size=3))
def test_a_round_plans_the_same_whatever_rounds_ran_before_it(world: World, earlier: list[float]) -> None:
    cat, _, state, hints, forecasts = world
    for offset in earlier:
        plan(NOW + offset, forecasts, hints, cat, state, CONFIG)
    unseen = {m: replace(f) for m, f in forecasts.items()}  # equal forecasts, but new objects
    assert plan(NOW + 30, forecasts, hints, cat, state, CONFIG) == plan(
        NOW + 30, unseen, hints, cat, state, CONFIG
    )


@SETTINGS
@given(
    worlds(),
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 20.0, 59.0, 61.0, 300.0, 4000.0]), st.booleans()),
        min_size=1,
        max_size=6,
    ),
)
def test_a_memo_kept_over_rounds_plans_what_no_memo_plans(
    world: World, rounds: list[tuple[float, bool]]
) -> None:
    """Rounds as ``SchedulerCore`` runs them: ``now`` advancing, forecasts sometimes replaced by new
    (equal) objects, and each round's orders pending in the next."""
    cat, _, state, hints, forecasts = world
    memo = PlannerMemo()
    now = NOW
    out: list[Order] = []
    for step, refresh in rounds:
        now += step
        if refresh:
            forecasts = {m: replace(f) for m, f in forecasts.items()}
        current = replace(state, pending=tuple(out), recent=tuple(out))
        kept = plan_detailed(now, forecasts, hints, cat, current, CONFIG, memo=memo)
        assert kept == plan_detailed(now, forecasts, hints, cat, current, CONFIG)
        out.extend(o for o in kept.orders if o.deadline > now)


# Just below 2**31 s a fractional start plus whole buckets crosses into coarser floats and rounds: the
# bucket that holds now is then not the one the grid's start falls in, and kept windows cannot be used.
ROUNDING_START = 2147483513.6357558


@SETTINGS
@given(
    st.sampled_from([30, 60, 90, 300]),
    st.lists(st.sampled_from([0.0, 0.001, 0.05, 0.3, 0.9, 0.999]), max_size=150),
    st.sampled_from([NOW, NOW - 12.345, ROUNDING_START]),
    st.lists(st.floats(-600.0, 9000.0), min_size=1, max_size=6),
    # (step, window, horizon): a horizon off the step lets a later round in the same bucket see further.
    st.sampled_from(
        [(60.0, 600.0, 3600.0), (45.0, 300.0, 1800.0), (120.0, 600.0, 7200.0), (60.0, 600.0, 3650.0)]
    ),
    st.sampled_from([0.1, 0.5]),
    st.sampled_from([None, {Tier.L1: 1e-7, Tier.L2: 1e-6}, {Tier.L2: 0.01}]),
    st.integers(1, 140),
)
@example(60, [0.3] * 120, ROUNDING_START, [765.2070772], (60.0, 600.0, 3600.0), 0.1, None, 10)
@example(30, [0.3] * 150, NOW, [0.0, 20.0], (60.0, 600.0, 3650.0), 0.1, None, 10)
def test_windows_kept_between_rounds_are_the_windows_valued_afresh(
    bucket_s: int,
    probs: list[float],
    start: float,
    offsets: list[float],
    grid: tuple[float, float, float],
    quantile: float,
    prices: dict[Tier, float] | None,
    size_gb: int,
) -> None:
    forecast = ModelForecast(
        model="m", start=start, bucket_s=bucket_s, expected=np.array(probs), p_any=np.array(probs), family="t"
    )
    step, window, horizon = grid
    config = replace(CONFIG, step_s=step, window_s=window, horizon_s=horizon, arrival_quantile=quantile)
    if prices is not None:
        config = replace(config, price_per_gb_s=prices)
    model = spec("m", size_gb * GB)
    gains = {Tier.L0: 30.0 * size_gb, Tier.L1: 28.0 * size_gb, Tier.L2: 20.0 * size_gb}
    kept = _WindowCache()
    for offset in offsets:  # one forecast object over rounds at these times, in this order
        now = start + offset
        kept_wants = _forecast_wants_of([(model, forecast)], now, config, {"m": gains}, kept)["m"]
        afresh = _forecast_wants_afresh(model, forecast, now, config, gains)
        assert list(kept_wants) == afresh
        reads_as_the_list(kept_wants, afresh, now, window)


def reads_as_the_list(wants: _Wants, forecast_wants: list[_Want], now: float, window_s: float) -> None:
    """A model's wants, made as far as each reader goes, read as the list of every want would: with a
    hint and a waiting request added, one of them at the soonest forecast want's time (ties)."""
    soonest = min((w.t0 for w in forecast_wants), default=now)
    signals = [
        _Want("m", 0.8, soonest, soonest + 300.0, OrderReason.HINT, False, soonest),
        _Want("m", 1.0, now + 5.0, now + 65.0, OrderReason.DEMAND, True, now + 5.0),
    ]
    for listed in ([], signals):
        mixed = wants.listing([*listed, *wants.listed])
        every = [*listed, *forecast_wants]
        by_time = sorted(every, key=lambda w: w.t0)
        assert list(mixed) == every
        assert len(mixed) == len(every)
        assert list(mixed.by_time()) == by_time
        assert list(mixed.by_time(demand_first=True)) == [w for w in by_time if w.demand] + [
            w for w in by_time if not w.demand
        ]
        if every:
            assert mixed.reach() == (max(w.p for w in every), min(w.t1 - w.t0 for w in every))
        for t in (now, now + window_s, math.inf):
            begun = [w for w in every if w.t0 <= t]
            assert sorted(mixed.chances_until(t)) == sorted((w.p, w.t1 - w.t0) for w in begun)
            assert mixed.demanded_by(t) == any(w.demand for w in begun)


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from([0.0, 0.001, 0.05, 0.3, 0.9, 0.999]), min_size=90, max_size=90),
            st.integers(1, 140),
        ),
        min_size=2,  # one forecast alone is valued as the test above checks
        max_size=6,
    ),
    st.sampled_from([NOW, ROUNDING_START]),
    st.floats(-600.0, 3000.0),
    st.sampled_from([None, {Tier.L1: 1e-7, Tier.L2: 1e-6}, {Tier.L2: 0.01}]),
)
def test_windows_valued_in_one_batch_are_each_forecasts_windows_valued_alone(
    rows: list[tuple[list[float], int]],
    start: float,
    offset: float,
    prices: dict[Tier, float] | None,
) -> None:
    config = CONFIG if prices is None else replace(CONFIG, price_per_gb_s=prices)
    items = [
        (
            spec(f"m{i}", size_gb * GB),
            ModelForecast(
                model=f"m{i}", start=start, bucket_s=60, expected=np.array(p), p_any=np.array(p), family="t"
            ),
        )
        for i, (p, size_gb) in enumerate(rows)
    ]
    gains = {s.id: {Tier.L0: 30.0 * s.size_bytes / GB, Tier.L1: 28.0, Tier.L2: 2.0} for s, _ in items}
    now = start + offset
    together = _forecast_wants_of(items, now, config, gains, _WindowCache())
    assert list(together) == [s.id for s, _ in items]
    for model, forecast in items:
        alone = _forecast_wants_afresh(model, forecast, now, config, gains[model.id])
        assert list(together[model.id]) == alone
        reads_as_the_list(together[model.id], alone, now, config.window_s)


REASONS = {True: OrderReason.DEMAND, False: OrderReason.FORECAST}


@SETTINGS
@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0), st.floats(-120.0, 1200.0), st.floats(0.0, 900.0), st.booleans()),
        max_size=8,
    ),
    st.sampled_from(TIERS),
    st.integers(1, 140),
    st.sampled_from([0.0, 0.05, 2.0]),
)
def test_what_keeping_a_resident_is_worth_is_its_best_current_want_net_of_its_cost(
    drawn: list[tuple[float, float, float, bool]], tier: Tier, size_gb: int, memory_price: float
) -> None:
    config = replace(CONFIG, memory_price=memory_price)
    valuer = _Valuer(config, _hop_times())
    node = state(cluster("n")).nodes["n"]
    model = spec("m", size_gb * GB)
    wants = [_Want("m", p, NOW + t0, NOW + t0 + span, REASONS[d], d, NOW + t0) for p, t0, span, d in drawn]
    current = [w for w in wants if w.t0 <= NOW + config.window_s]  # what a resident is held for now
    expected = (
        math.inf
        if any(w.demand for w in current)
        else max([0.0, *(valuer.net(model, w, node, tier.farther(), tier, move=False) for w in current)])
    )
    assert valuer.keep_value(model, _Wants(wants), node, tier, NOW) == expected


def test_a_full_round_makes_only_the_forecast_wants_it_reads() -> None:
    """A round reads a model's forecast wants soonest first until one is worth acting on, and a
    resident's only for the coming window: the rest stay columns (at 10,000 models a round that made
    every want made 600,000 of them and read a few thousand)."""
    models = [spec(f"m{i:03}", 10 * GB) for i in range(200)]
    forecasts = {m.id: flat_forecast(m.id, 0.05) for m in models}
    memo = PlannerMemo()
    plan_detailed(NOW, forecasts, [], catalog(*models), state(cluster("a", "b")), CONFIG, memo=memo)
    assert memo.kept is not None
    tails = [w.forecast.tail for w in memo.kept.wants.values() if w.forecast is not None]
    rows = sum(len(t) for t in tails)
    made = sum(len(t._made) for t in tails)
    assert len(tails) == len(models)
    assert rows >= 40 * len(models)  # every window of the horizon is worth a want
    assert made <= rows // 20
