"""Incremental rounds plan what full rounds plan: over random sequences of hints, demand, executor
reports and planning ticks, a scheduler that plans each event incrementally hands out the same orders,
placements and deferrals as one that runs a full round for every event."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
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
    surge_forecast,
)

from forecaster import ModelForecast
from models import Catalog
from prewarm import DEMAND_SOURCE, ExecutorState, Order, ResidentModel, Tier, effect
from scheduler import Cluster, ClusterState, PlannerConfig, PlannerMemo, SchedulerCore, plan_detailed

TIERS = (Tier.L0, Tier.L1, Tier.L2)
CONFIG = PlannerConfig()

Event = tuple[str, str, float, float]  # kind, model or node, a number, another


class Executors:
    """What the nodes hold: carries out the due orders of a node, the spine's ``effect`` as the
    executor does, and reports."""

    def __init__(self, cat: Catalog, gpus: dict[str, list[int]], caps: dict[str, dict[Tier, int]]) -> None:
        self.cat = cat
        self.gpus = gpus
        self.caps = caps
        self.held: dict[str, dict[Tier, dict[str, ResidentModel]]] = {n: {t: {} for t in TIERS} for n in gpus}
        self.done: set[str] = set()
        self.loading: dict[str, set[str]] = {n: set() for n in gpus}  # loads on request not ready yet

    def place(self, node: str, r: ResidentModel, level: int) -> None:
        for t in TIERS:
            if t.level >= level:
                self.held[node][t][r.model] = r

    def carry_out(self, node: str, orders: list[Order], now: float) -> None:
        held = self.held[node]
        for order in sorted(orders, key=lambda o: (o.not_before, o.id)):
            if order.node != node or order.id in self.done or order.not_before > now or order.deadline < now:
                continue
            self.done.add(order.id)
            size = self.cat[order.model].size_bytes
            change = effect(order.action, order.tier, [t for t in TIERS if order.model in held[t]])
            for t in change.drops:
                held[t].pop(order.model, None)
            for t in change.fills:
                if sum(r.bytes for r in held[t].values()) + size > self.caps[node][t]:
                    continue  # no room after all: the executor's LRU would have made some, skip it here
                held[t][order.model] = resident(
                    order.model,
                    size,
                    loaded_at=now,
                    prefetched=not order.demand,
                    gpus=order.gpus if t is Tier.L0 else (),
                )

    def report(self, node: str, now: float) -> ExecutorState:
        state = report(
            node,
            {t: list(self.held[node][t].values()) for t in TIERS},
            capacity=self.caps[node],
            at=now,
            gpus=self.gpus[node],
        )
        return state.model_copy(update={"demand_loads": sorted(self.loading[node])})


World = tuple[Catalog, Cluster, Executors, dict[str, ModelForecast]]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    names = [f"m{i}" for i in range(draw(st.integers(2, 7)))]
    sizes = {n: draw(st.integers(1, 60)) * GB for n in names}
    cat = catalog(*(spec(n, sizes[n]) for n in names))
    node_names = [f"n{i}" for i in range(draw(st.integers(1, 3)))]
    gpus: dict[str, list[int]] = {}
    caps: dict[str, dict[Tier, int]] = {}
    for n in node_names:
        gpus[n] = [draw(st.sampled_from([40, 80])) * GB for _ in range(draw(st.integers(0, 2)))]
        caps[n] = {t: draw(st.integers(0, 150)) * GB for t in TIERS}
        if gpus[n]:
            caps[n][Tier.L0] = sum(gpus[n])
        elif caps[n][Tier.L0]:
            gpus[n] = [caps[n][Tier.L0]]  # one GPU of all of L0
    c = Cluster.from_data(
        {
            "nodes": [
                {
                    "name": n,
                    "gpus": [{"memory_bytes": g} for g in gpus[n]],
                    "host_cache_bytes": caps[n][Tier.L1],
                    "disk_cache_bytes": caps[n][Tier.L2],
                }
                for n in node_names
            ]
        }
    )
    executors = Executors(cat, gpus, caps)
    for n in node_names:
        for name in names:
            level = draw(st.sampled_from([1, 2, 3, 3]))  # disk and host copies; GPU copies come by order
            if all(
                sum(r.bytes for r in executors.held[n][t].values()) + sizes[name] <= caps[n][t]
                for t in TIERS
                if t.level >= level
            ):
                r = resident(
                    name,
                    sizes[name],
                    loaded_at=NOW - draw(st.sampled_from([10, 4000])),
                    prefetched=draw(st.booleans()),
                )
                executors.place(n, r, level)
    forecasts: dict[str, ModelForecast] = {}
    for name in draw(st.lists(st.sampled_from(names), max_size=4, unique=True)):
        if draw(st.booleans()):
            forecasts[name] = flat_forecast(name, draw(st.sampled_from([0.001, 0.05, 0.5, 0.9])))
        else:
            forecasts[name] = surge_forecast(name, NOW + draw(st.sampled_from([0, 600, 3000])))
    return cat, c, executors, forecasts


def events(models: int, nodes: int) -> st.SearchStrategy[list[Event]]:
    one = st.one_of(
        st.tuples(
            st.just("hint"),
            st.sampled_from([f"m{i}" for i in range(models)]),
            st.sampled_from([0.0, 120.0, 1200.0]),
            st.sampled_from([0.3, 0.7, 1.0]),
        ),
        st.tuples(
            st.just("demand"), st.sampled_from([f"m{i}" for i in range(models)]), st.just(0.0), st.just(1.0)
        ),
        st.tuples(
            st.just("report"), st.sampled_from([f"n{i}" for i in range(nodes)]), st.just(0.0), st.just(0.0)
        ),
        # A load on request starts or ends on the first node: its report says so.
        st.tuples(
            st.just("loading"), st.sampled_from([f"m{i}" for i in range(models)]), st.just(0.0), st.just(0.0)
        ),
        st.tuples(st.just("tick"), st.just(""), st.sampled_from([0.0, 30.0, 61.0, 700.0]), st.just(0.0)),
    )
    return st.lists(one, min_size=1, max_size=12)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[World, list[Event]]:
    world = draw(worlds())
    models, nodes = len(world[0].ids()), len(world[1].nodes)
    return world, draw(events(models, nodes))


def core(
    cat: Catalog, c: Cluster, clock: Callable[[], float], *, incremental: bool
) -> tuple[SchedulerCore, list[Order]]:
    sent: list[Order] = []
    return SchedulerCore(
        catalog=cat, cluster=c, config=CONFIG, dispatch=sent.extend, clock=clock, incremental=incremental
    ), sent


def view(c: SchedulerCore) -> dict[str, object]:
    v = c.plan_view()
    return {k: v[k] for k in ("placements", "deferred", "tiers", "upcoming")}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_incremental_rounds_hand_out_what_full_rounds_hand_out(scenario: tuple[World, list[Event]]) -> None:
    (cat, c, executors, forecasts), steps = scenario
    clock = [NOW]
    inc, inc_sent = core(cat, c, lambda: clock[0], incremental=True)
    full, full_sent = core(cat, c, lambda: clock[0], incremental=False)
    demand: list = []
    for both in (inc, full):
        for node in c.nodes:
            both.observe(executors.report(node.name, clock[0]))
        both.set_signals(forecasts=forecasts, demand=[])
        both.replan()
    assert inc_sent == full_sent
    for kind, subject, x, y in steps:
        if kind == "hint":
            h = hint(subject, eta_s=x, confidence=y, at=clock[0])
            got, want = inc.add_hint(h)[1], full.add_hint(h)[1]
        elif kind == "demand":
            demand = [*demand, hint(subject, source=DEMAND_SOURCE, ttl_s=120.0, at=clock[0])]
            got, want = inc.add_demand(demand), full.add_demand(demand)
        elif kind == "report":
            executors.carry_out(subject, inc_sent, clock[0])
            state = executors.report(subject, clock[0])
            got, want = inc.observe_and_plan(state), full.observe_and_plan(state)
        elif kind == "loading":
            executors.loading["n0"] ^= {subject}
            state = executors.report("n0", clock[0])
            got, want = inc.observe_and_plan(state), full.observe_and_plan(state)
        else:
            clock[0] += x
            got, want = inc.replan(), full.replan()
        assert got == want, (kind, subject)
        assert inc_sent == full_sent
        assert view(inc) == view(full)


def test_a_hint_after_a_full_round_is_planned_incrementally_against_its_books() -> None:
    cat = catalog(spec("a", 10 * GB), spec("b", 10 * GB), spec("c", 70 * GB))
    c = cluster("n0", "n1", l0=80 * GB)
    big = {Tier.L0: 80 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB}
    reports = {
        "n0": report("n0", {Tier.L0: [resident("c", 70 * GB, loaded_at=NOW - 4000)]}, capacity=big),
        "n1": report("n1", {Tier.L2: [resident("a", 10 * GB, loaded_at=NOW - 4000)]}, capacity=big),
    }
    state = ClusterState.merge(c, reports)
    forecasts = {"b": flat_forecast("b", 0.9)}
    memo = PlannerMemo()
    first = plan_detailed(NOW, forecasts, [], cat, state, CONFIG, memo=memo)
    assert first.full
    pending = ClusterState(nodes=state.nodes, pending=first.orders, recent=first.orders)
    hints = [hint("a")]
    incremental = plan_detailed(NOW, forecasts, hints, cat, pending, CONFIG, memo=memo, touched={"a"})
    fresh = plan_detailed(NOW, forecasts, hints, cat, pending, CONFIG)
    assert not incremental.full
    assert fresh.full
    assert incremental.orders == fresh.orders
    # The hinted model goes to GPU memory on the node whose disk holds it: one hop, not three.
    assert [(p.model, p.node, p.tier) for p in incremental.placements] == [("a", "n1", Tier.L0)]


def test_new_forecasts_make_the_next_round_a_full_one() -> None:
    cat = catalog(spec("a", 10 * GB))
    state = ClusterState.merge(cluster("n0"), {})
    memo = PlannerMemo()
    forecasts = {"a": flat_forecast("a", 0.9)}
    plan_detailed(NOW, forecasts, [], cat, state, CONFIG, memo=memo)
    assert not plan_detailed(NOW, forecasts, [], cat, state, CONFIG, memo=memo, touched=()).full
    refreshed = dict(forecasts)  # a refresh hands over a new mapping
    assert plan_detailed(NOW, refreshed, [], cat, state, CONFIG, memo=memo, touched=()).full
    # And so does a round later than the planning interval after the last full one.
    later = NOW + CONFIG.decision_interval_s + 1
    assert plan_detailed(later, refreshed, [], cat, state, CONFIG, memo=memo, touched=()).full
