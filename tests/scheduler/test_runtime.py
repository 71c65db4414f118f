"""The live runtime on the local stack: Kafka for orders and reports, a SQL job store for timed orders."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaProducer
from scheduler_builders import GB, catalog, report, resident, spec
from stack_settings import settings_for_stack
from wait_helpers import wait_for

from prewarm import (
    ConfigError,
    ExecutorState,
    Hint,
    Order,
    OrderAction,
    ResidentModel,
    Settings,
    Tier,
    TierState,
    load_settings,
)
from prewarm.kafka import make_consumer
from scheduler import Cluster, PlannerConfig
from scheduler._runtime import Runtime, retrain_trigger

# No margins and fast links: a hint's prefetch is due almost exactly at its eta.
INSTANT = PlannerConfig(hop_overhead_s=0.0, lead_margin_s=0.0, lead_margin_frac=0.0)
FAST = {"l3_bytes_per_s": "1TB/s", "l2_bytes_per_s": "1TB/s", "l1_bytes_per_s": "1TB/s"}


def one_node(name: str = "gpu-a") -> Cluster:
    return Cluster.from_data(
        {
            "nodes": [
                {
                    "name": name,
                    "gpus": [{"memory_bytes": "40GB"}],
                    "host_cache_bytes": "100GB",
                    "disk_cache_bytes": "1TB",
                }
            ],
            "bandwidth": FAST,
        }
    )


def read_orders(settings: Settings, want: int, timeout: float = 15.0) -> list[tuple[str, Order]]:
    consumer = make_consumer(
        settings.kafka,
        settings.kafka.topic_orders,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
    )
    got: list[tuple[str, Order]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got += [(r.key.decode(), Order.model_validate_json(r.value)) for r in records]
    finally:
        consumer.close()
    return got


@pytest.fixture
def runtime(kafka_bootstrap: str, unique: str, tmp_path: Path) -> Iterator[Runtime]:
    settings = settings_for_stack(kafka_bootstrap, unique, tmp_path)
    rt = Runtime(settings, catalog(spec("chat", GB), spec("search", GB)), one_node(), config=INSTANT)
    with rt:
        yield rt


def test_hint_order_is_on_the_orders_topic_keyed_by_node(runtime: Runtime) -> None:
    _, orders = runtime.core.add_hint(Hint(model="chat", source="web"))
    assert [o.action for o in orders] == [OrderAction.PREFETCH]
    [(key, order)] = read_orders(runtime.settings, 1)
    assert key == "gpu-a"
    assert order.id == orders[0].id


def test_executor_reports_reach_the_planner(runtime: Runtime) -> None:
    report = ExecutorState(
        node="gpu-b",
        at=time.time(),
        tiers=[TierState(tier=Tier.L1, capacity_bytes=5 * GB, used_bytes=0)],
        bandwidth_bytes_per_s={"L3->L2": 3e9},
    )
    producer = KafkaProducer(bootstrap_servers=runtime.settings.kafka.kafka_bootstrap, acks="all")
    producer.send(
        runtime.settings.kafka.topic_executor_state, key=b"gpu-b", value=report.model_dump_json().encode()
    )
    producer.flush()
    producer.close()
    wait_for(lambda: "gpu-b" in runtime.core.reports(), 10, "the report of gpu-b", interval=0.05)
    assert runtime.core.reports()["gpu-b"].bandwidth_bytes_per_s == {"L3->L2": 3e9}


def test_a_report_that_frees_room_is_planned_on_arrival_not_at_the_next_interval(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    # Planning and hint-table intervals far longer than the test: only the report can plan the hint again.
    settings = settings_for_stack(kafka_bootstrap, unique, tmp_path, plan_interval_s="3600", hint_poll_s="60")
    node = one_node()
    capacity = {Tier.L0: 40 * GB, Tier.L1: 100 * GB, Tier.L2: 1000 * GB}
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")

    def send(held: dict[Tier, list[ResidentModel]]) -> None:
        state = report("gpu-a", held, capacity=capacity, at=time.time(), gpus=[40 * GB])
        producer.send(
            settings.kafka.topic_executor_state, key=b"gpu-a", value=state.model_dump_json().encode()
        )
        producer.flush()

    # An engine holds a 40 GB model on the node's only GPU (and its host memory is full): no room for chat.
    send(
        {
            Tier.L0: [resident("big", 40 * GB, pins=1, gpus=[0])],
            Tier.L1: [resident("filler", 100 * GB, pins=1)],
        }
    )
    rt = Runtime(
        settings,
        catalog(spec("chat", 30 * GB), spec("big", 40 * GB), spec("filler", 100 * GB)),
        node,
        config=INSTANT,
    )
    with rt:
        wait_for(lambda: "gpu-a" in rt.core.reports(), 10, "the first report", interval=0.05)
        # The round the planning job runs on becoming active: the next is an hour away.
        wait_for(lambda: rt.core.plan_view()["at"] is not None, 10, "the first round", interval=0.05)
        _, orders = rt.accept_hint(Hint(model="chat", source="web", ttl_s=600))
        # Staged on disk at most: neither memory tier has room for it.
        assert not [o for o in orders if o.model == "chat" and o.tier in (Tier.L0, Tier.L1)]
        send({})  # the engine let go: everything is free
        wait_for(
            lambda: any(
                o.model == "chat" and o.tier is Tier.L0 for _, o in read_orders(settings, 9, timeout=0.5)
            ),
            10,
            "chat's prefetch, planned from the report",
        )
    producer.close()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def job_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    return str(request.getfixturevalue("postgres_url"))


def test_timed_order_due_while_the_scheduler_was_down_goes_out_after_restart(
    kafka_bootstrap: str, unique: str, tmp_path: Path, job_store_url: str
) -> None:
    settings = settings_for_stack(kafka_bootstrap, unique, tmp_path)
    settings = settings.model_copy(
        update={"store": settings.store.model_copy(update={"database_url": job_store_url})}
    )
    cat = catalog(spec(f"chat-{unique}", GB))
    first = Runtime(settings, cat, one_node(), config=INSTANT).start()
    try:
        _, [order] = first.core.add_hint(Hint(model=f"chat-{unique}", source="web", eta_s=2.0))
        assert order.not_before > time.time()
        assert f"order:{order.id}" in [job for job, _ in first.scheduled_orders()]
    finally:
        first.stop()
    # Elapsed time on purpose: the order must fall due while no scheduler runs, so no event can mark it.
    time.sleep(max(order.not_before - time.time(), 0) + 0.5)
    assert read_orders(settings, 1, timeout=1.0) == []
    with Runtime(settings, cat, one_node(), config=INSTANT) as second:
        assert wait_for_order(settings, order.id)
        assert f"order:{order.id}" not in [job for job, _ in second.scheduled_orders()]


def wait_for_order(settings: Settings, order_id: str, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    seen: list[tuple[str, Order]] = []
    while time.monotonic() < deadline:
        seen = read_orders(settings, len(seen) + 1, timeout=1.0)
        if any(o.id == order_id and key == "gpu-a" for key, o in seen):
            return True
    return False


def test_ready_only_while_started(kafka_bootstrap: str, unique: str, tmp_path: Path) -> None:
    rt = Runtime(settings_for_stack(kafka_bootstrap, unique, tmp_path), catalog(spec("chat", GB)), one_node())
    assert rt.ready()[0] is False
    with rt:
        assert rt.ready() == (True, "ok")
    assert rt.ready()[0] is False


def test_hint_benchmark_reports_percentiles(kafka_bootstrap: str, unique: str, tmp_path: Path) -> None:
    from scheduler._bench import bench_hints

    settings = settings_for_stack(kafka_bootstrap, unique, tmp_path)
    settings = settings.model_copy(
        update={"scheduler": settings.scheduler.model_copy(update={"api_port": 0})}
    )
    result = bench_hints(settings, hints=20)
    assert result["hints"] == 20
    assert 0 < result["p50_ms"] <= result["p99_ms"]


def test_restart_keeps_active_hints_and_does_not_hand_out_waiting_orders_twice(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    settings = settings_for_stack(kafka_bootstrap, unique, tmp_path)
    cat = catalog(spec("chat", GB))
    with Runtime(settings, cat, one_node(), config=INSTANT) as first:
        # The hint API's path: the hint is stored before it is planned.
        _, [order] = first.accept_hint(Hint(model="chat", source="web", eta_s=60.0))
    with Runtime(settings, cat, one_node(), config=INSTANT) as second:
        assert [h.model for h in second.core.hints()] == ["chat"]
        assert [o["id"] for o in second.core.plan_view()["upcoming"]] == [order.id]
        assert second.core.replan() == []  # the waiting order books its bytes; nothing new goes out
        assert [job for job, _ in second.scheduled_orders()] == [f"order:{order.id}"]


def test_a_changed_catalog_file_is_planned_with_at_the_next_tick(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    path = tmp_path / "catalog.yaml"
    catalog(spec("chat", GB)).save(path)
    settings = settings_for_stack(kafka_bootstrap, unique, tmp_path)
    rt = Runtime(settings, catalog(spec("chat", GB)), one_node(), config=INSTANT, catalog_path=path)
    with rt:
        catalog(spec("chat", GB), spec("search", GB)).save(path)
        os.utime(path, (time.time() + 5, time.time() + 5))  # a new mtime even within the same tick
        rt.tick()
        assert "search" in rt.core.catalog


def test_retrain_trigger_follows_the_cron_setting() -> None:
    trigger = retrain_trigger(load_settings(overrides={"retrain_cron": "15 3 * * *"}))
    fire = trigger.get_next_fire_time(None, datetime(2024, 1, 1, 12, 0, tzinfo=UTC))
    assert (fire.day, fire.hour, fire.minute) == (2, 3, 15)
    with pytest.raises(ConfigError, match="retrain_cron"):
        retrain_trigger(load_settings(overrides={"retrain_cron": "not cron"}))


def test_empty_retrain_cron_means_no_in_process_retrain() -> None:
    assert retrain_trigger(load_settings(overrides={"retrain_cron": ""})) is None


def test_retrain_job_a_former_start_stored_is_dropped_once_retrain_cron_is_empty(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    # The chart switches a running installation's retraining to a CronJob by emptying retrain_cron; the
    # job store still holds the job the scheduler's earlier starts put there.
    cat = catalog(spec("chat", GB))
    with Runtime(settings_for_stack(kafka_bootstrap, unique, tmp_path), cat, one_node()) as scheduled:
        assert scheduled.retrain_due is not None
    off = settings_for_stack(kafka_bootstrap, unique, tmp_path, retrain_cron="")
    with Runtime(off, cat, one_node()) as cronjob_owned:
        assert cronjob_owned.active
        assert cronjob_owned.retrain_due is None
