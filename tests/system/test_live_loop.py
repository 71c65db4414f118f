"""The live loop on the local stack: scheduler runtime → Kafka → executor daemon → state → scheduler.

Real safetensors files (about 2 MB) on a file:// L3, the CPU standing in for L0, time compressed: a
planning round every second and a two-second misprediction window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from kafka import KafkaConsumer, KafkaProducer
from live_builders import MB, executor_for, models, tier_of
from metrics_helpers import metric_delta
from stack_settings import settings_for_stack
from wait_helpers import wait_for

from executor import Executor, ExecutorDaemon
from models import Catalog
from prewarm import (
    Hint,
    Order,
    OrderAction,
    OrderReason,
    OrderStatus,
    Settings,
    Tier,
)
from scheduler import DEMAND_SOURCE, Cluster, PlannerConfig
from scheduler._runtime import Runtime
from scheduler._serve import BackgroundServer

pytestmark = pytest.mark.slow


class Loop:
    def __init__(self, settings: Settings, cat: Catalog, executor: Executor) -> None:
        self.settings, self.catalog, self.executor = settings, cat, executor
        node = executor.settings.node_name
        # The cluster file says nothing of capacity: the executor's first report does.
        cluster = Cluster.from_data({"nodes": [{"name": node}]})
        config = PlannerConfig.from_settings(settings.scheduler, min_residence_s=0.5)
        self.daemon = ExecutorDaemon(executor, settings.kafka, state_interval_s=0.5)
        self.runtime = Runtime(settings, cat, cluster, config=config)


@pytest.fixture
def loop(kafka_bootstrap: str, unique: str, tmp_path: Path) -> Iterator[Callable[..., Loop]]:
    made: list[Loop] = []

    def make(count: int = 2, *, l0: int = 32 * MB, l1: int = 32 * MB, window_s: float = 600.0) -> Loop:
        settings = settings_for_stack(kafka_bootstrap, unique, tmp_path, misprediction_window_s=str(window_s))
        cat = models(tmp_path / "weights", count)
        executor = executor_for(f"node-{unique}", cat, tmp_path / "cache", l0=l0, l1=l1)
        built = Loop(settings, cat, executor)
        built.daemon.start()
        # Wait for the first report, so the planner knows the node's real capacity.
        built.runtime.start()
        wait_for(lambda: executor.settings.node_name in built.runtime.core.reports(), 20, "the first report")
        made.append(built)
        return built

    yield make
    for built in made:
        built.runtime.stop()
        built.daemon.stop()
        built.executor.close()


def test_hint_brings_its_model_to_l1_within_its_lead_time(loop: Callable[..., Loop]) -> None:
    live = loop()
    started = time.time()
    _, orders = live.runtime.core.add_hint(Hint(model="m0", source="web"))
    [order] = orders
    assert order.tier in (Tier.L0, Tier.L1)
    # A 2 MB model: the planner's own lead time is ~1.5 s of hop overheads plus margins.
    wait_for(lambda: tier_of(live.executor, "m0").level <= Tier.L1.level, 15, "m0 in L1 or L0")
    assert time.time() - started < 15
    assert all(o.status is OrderStatus.DONE for o in live.daemon.outcomes)
    # And the scheduler learns it from the node's report, so it does not order it again.
    wait_for(lambda: "m0" in live.runtime.core.plan_view()["tiers"], 20, "m0 in the scheduler's view")


def test_readiness_reports_a_state_follower_that_a_socket_error_stopped(
    loop: Callable[..., Loop], monkeypatch: pytest.MonkeyPatch
) -> None:
    live = loop()
    assert live.runtime.ready() == (True, "ok")
    poll = KafkaConsumer.poll

    def failing_poll(self: KafkaConsumer, *args: object, **kwargs: object) -> object:
        # Only the scheduler's follower loses its connection; the executor daemon keeps its own.
        if threading.current_thread().name == "prewarm-state-follower":
            raise ConnectionResetError("connection reset by peer")
        return poll(self, *args, **kwargs)

    monkeypatch.setattr(KafkaConsumer, "poll", failing_poll)
    wait_for(lambda: not live.runtime.ready()[0], 10, "readiness to fail")
    assert "executor state" in live.runtime.ready()[1]


def test_unused_prefetch_is_demoted_one_tier_after_the_window_and_counted(loop: Callable[..., Loop]) -> None:
    live = loop(window_s=2.0)
    with metric_delta("prewarm_scheduler_mispredictions_total") as mispredictions:
        _, [order] = live.runtime.core.add_hint(Hint(model="m1", source="web", ttl_s=1.0))
        wait_for(lambda: tier_of(live.executor, "m1") is order.tier, 15, f"m1 in {order.tier}")
        # Nobody asks for m1: after the window the planner (the rule's one owner: the executor keeps no
        # timer of its own) demotes it one tier down, not to nothing.
        lower = order.tier.farther()
        wait_for(lambda: tier_of(live.executor, "m1") is lower, 20, f"m1 demoted to {lower}")
    assert mispredictions.delta == 1
    reasons = [o["reason"] for o in live.runtime.core.model_view("m1")["recent_orders"]]
    assert OrderReason.MISPREDICTION.value in reasons


def _more_rounds_and_a_report(live: Loop, rounds: int = 2) -> None:
    """Wait for ``rounds`` more planning rounds, then for a node report made after the last of them."""
    core, node = live.runtime.core, live.executor.settings.node_name
    for _ in range(rounds):
        last = core.plan_view()["at"]
        wait_for(lambda last=last: core.plan_view()["at"] != last, 10, "the next planning round")
    planned = core.plan_view()["at"]
    wait_for(lambda: core.reports()[node].at > planned, 10, "a report after those rounds")


def test_three_cold_models_for_room_of_one_are_placed_or_queued_without_a_failed_load(
    loop: Callable[..., Loop],
) -> None:
    live = loop(3, l0=3 * MB, l1=3 * MB)
    size = live.catalog["m0"].size_bytes
    assert 1.5 * MB < size < 3 * MB  # room for one in L0 and in L1, never two
    capacity = [{"tier": t.value, "reason": "capacity"} for t in (Tier.L0, Tier.L1, Tier.L2)]
    capacity_evictions = metric_delta("prewarm_executor_evictions_total", *capacity)
    core = live.runtime.core
    core.set_signals(
        demand=[Hint(model=m, source=DEMAND_SOURCE, received_at=time.time()) for m in ("m0", "m1", "m2")]
    )
    core.replan()
    wait_for(
        lambda: any(tier_of(live.executor, m) is Tier.L0 for m in ("m0", "m1", "m2")), 20, "a model in L0"
    )
    # The planner gets a few more rounds to get it wrong, and the node reports what they did.
    _more_rounds_and_a_report(live)
    assert live.daemon.outcomes
    assert [o for o in live.daemon.outcomes if o.status is OrderStatus.FAILED] == []
    state = live.executor.state()
    for tier in (Tier.L0, Tier.L1, Tier.L2):
        ts = state.tier(tier)
        assert ts is not None
        assert ts.used_bytes <= ts.capacity_bytes
    # The bound above holds whatever the planner orders (a tier's LRU makes room); this one is the
    # planner's: it sent each model only where the room was there or made by its own orders, so no
    # load left the choice of a victim to the LRU.
    assert capacity_evictions.delta == 0


def test_load_api_returns_once_the_model_is_in_l0(loop: Callable[..., Loop]) -> None:
    live = loop()
    with BackgroundServer(live.daemon.app()) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        first = http.post("/v1/load", json={"model": "m1"})
        assert first.status_code == 200, first.text
        assert first.json()["served_from"] == "L3"
        assert tier_of(live.executor, "m1") is Tier.L0
        again = http.post("/v1/load", json={"model": "m1"}).json()
        assert again["served_from"] == "L0"
        assert again["wait_s"] < first.json()["wait_s"]
        assert http.post("/v1/load", json={"model": "ghost"}).status_code == 404
        assert http.post("/v1/load", json={"model": "../x"}).status_code == 422
        assert b"prewarm_executor_load_wait_seconds" in http.get("/metrics").content


def _publish(settings: Settings, *orders: Order) -> None:
    producer = KafkaProducer(bootstrap_servers=settings.kafka.kafka_bootstrap, acks="all")
    for order in orders:
        producer.send(
            settings.kafka.topic_orders, key=order.node.encode(), value=order.model_dump_json().encode()
        )
    producer.flush()
    producer.close()


def _order(node: str, model: str, oid: str, *, deadline: float) -> Order:
    now = time.time()
    return Order(
        id=oid,
        node=node,
        model=model,
        version="1",
        action=OrderAction.PREFETCH,
        tier=Tier.L1,
        reason=OrderReason.HINT,
        not_before=now,
        deadline=deadline,
        created_at=now,
    )


def test_daemon_applies_its_own_orders_once_and_reports_expired_ones(loop: Callable[..., Loop]) -> None:
    live = loop()
    node = live.executor.settings.node_name
    fresh = _order(node, "m0", "fresh-1", deadline=time.time() + 60)
    _publish(
        live.settings,
        _order("someone-else", "m1", "other-1", deadline=time.time() + 60),
        _order(node, "m1", "late-1", deadline=time.time() - 1),
        fresh,
        fresh,  # delivered twice: applied once
    )
    wait_for(lambda: len(live.daemon.outcomes) >= 3, 20, "three outcomes")
    by_id = [(o.order_id, o.status) for o in live.daemon.outcomes]
    assert ("late-1", OrderStatus.EXPIRED) in by_id
    assert ("fresh-1", OrderStatus.DONE) in by_id
    assert ("fresh-1", OrderStatus.ALREADY) in by_id
    assert all(oid != "other-1" for oid, _ in by_id)
    assert tier_of(live.executor, "m1") is Tier.L3
    # The expired order is reported to the scheduler in the node's state.
    wait_for(
        lambda: any(o.order_id == "late-1" for o in live.runtime.core.reports()[node].recent_outcomes),
        20,
        "the expired order in the node's report",
    )
