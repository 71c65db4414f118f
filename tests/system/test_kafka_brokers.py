"""Kafka as in production: three brokers, topics with three replicas and min.insync 2, one broker lost.

A throwaway KRaft cluster of three combined broker+controller nodes (``deploy/local/kafka3.sh``, the
stack's jars, 512 MB of heap each) is started for this module only; auto-creation is off there, so
prewarm creates every topic it uses. While gateways stream request events and the scheduler's order
publisher and an executor daemon work, one broker is SIGKILLed: the ingest consumer still counts every
event exactly once, both orders reach the node exactly once, and the node's state report is intact.

It runs with the local stack (``make test``) or with ``STACK_KAFKA3=1``, and ``STACK_KAFKA3=0`` opts
out; without the Kafka jars (``make stack-up`` installs them) it is skipped, or fails under ``CI=true``.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from live_builders import MB, executor_for, models
from wait_helpers import wait_for

from executor import ExecutorDaemon
from ingest import DemandStore, IngestConsumer, RequestLogProducer
from prewarm import (
    ExecutorState,
    IngestSettings,
    KafkaSettings,
    Order,
    OrderAction,
    OrderReason,
    OrderStatus,
    Tier,
)
from prewarm.kafka import ensure_control_topics, make_consumer
from scheduler._kafka import OrderPublisher, StateFollower

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KAFKA3 = REPO / "deploy" / "local" / "kafka3.sh"
EVENTS = 24_000
MODELS = 6
NODE = "node-k3"


def _skip_reason() -> str | None:
    choice = os.environ.get("STACK_KAFKA3", "")
    if choice == "0":
        return "STACK_KAFKA3=0"
    jars = subprocess.run(["bash", str(KAFKA3), "jars"], capture_output=True, text=True)
    if jars.returncode != 0:
        why = f"no Kafka jars for the three-broker cluster: {jars.stderr.strip()}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        return why
    if choice != "1" and not os.environ.get("PREWARM_KAFKA_BOOTSTRAP"):
        return "three JVMs: runs with the local stack (make test) or STACK_KAFKA3=1"
    return None


def _free_base_port() -> int:
    """A base port with the six ports after it (brokers, controllers) free right now, below the range
    the kernel hands out to outgoing connections: there, a client's or a broker's own connection could
    take one of them between this check and the broker's bind ("Address already in use")."""

    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
            return True

    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32_768  # Linux's default start
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20_000, max(ephemeral, 20_007) - 6)
        if all(free(base + i) for i in range(6)):
            return base
    raise AssertionError("no six free ports in a row on 127.0.0.1")


@dataclass
class Cluster:
    directory: Path
    bootstrap: str
    env: dict[str, str]

    def kill(self, node: int) -> None:
        """SIGKILL one node: no controlled shutdown, no leader hand-over."""
        run = subprocess.run(
            ["bash", str(KAFKA3), "kill", str(self.directory), str(node)],
            env=self.env,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr

    def admin(self) -> KafkaAdminClient:
        return KafkaAdminClient(bootstrap_servers=self.bootstrap.split(","))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = _skip_reason()
    if why is not None:
        pytest.skip(why)
    directory = tmp_path_factory.mktemp("kafka3")
    env = {**os.environ, "STACK_KAFKA3_PORT": str(_free_base_port())}
    up = subprocess.run(
        ["bash", str(KAFKA3), "up", str(directory)], env=env, capture_output=True, text=True, timeout=300
    )
    try:
        assert up.returncode == 0, f"kafka3.sh up failed:\n{up.stderr}"
        yield Cluster(directory, up.stdout.strip().splitlines()[-1], env)
    finally:
        subprocess.run(["bash", str(KAFKA3), "down", str(directory)], env=env, timeout=60, check=False)


def _topics(cluster: Cluster, names: list[str]) -> dict[str, tuple[int, set[int], str | None]]:
    """Per topic: partitions, replica counts seen across them, and its min.insync.replicas."""
    admin = cluster.admin()
    try:
        described = {t["topic"]: t["partitions"] for t in admin.describe_topics(names)}
        insync: dict[str, str | None] = {}
        for response in admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names]):
            for _code, _msg, _type, name, entries in response.resources:
                insync[name] = next((e[1] for e in entries if e[0] == "min.insync.replicas"), None)
    finally:
        admin.close()
    return {n: (len(described[n]), {len(p["replicas"]) for p in described[n]}, insync[n]) for n in names}


def _leader(cluster: Cluster, topic: str, partition: int) -> int:
    admin = cluster.admin()
    try:
        parts = admin.describe_topics([topic])[0]["partitions"]
    finally:
        admin.close()
    return int(next(p["leader"] for p in parts if p["partition"] == partition))


def _order(oid: str, model: str) -> Order:
    now = time.time()
    return Order(
        id=oid,
        node=NODE,
        model=model,
        version="1",
        action=OrderAction.PREFETCH,
        tier=Tier.L1,
        reason=OrderReason.HINT,
        not_before=now,
        deadline=now + 300,
        created_at=now,
    )


def _order_ids(kafka: KafkaSettings, expected: int) -> list[str]:
    """The ids of every record of the orders topic, read from the beginning."""
    consumer = make_consumer(kafka, enable_auto_commit=False)
    try:
        tp = TopicPartition(kafka.topic_orders, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        ids: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(ids) < expected:
            for records in consumer.poll(timeout_ms=500).values():
                ids += [Order.model_validate_json(r.value).id for r in records]
        # Anything more (a duplicate) would be right behind: one more poll to see it.
        for records in consumer.poll(timeout_ms=1000).values():
            ids += [Order.model_validate_json(r.value).id for r in records]
        return ids
    finally:
        consumer.close()


def _in_l1(state: ExecutorState | None) -> set[str]:
    l1 = state.tier(Tier.L1) if state is not None else None
    return {r.model for r in l1.resident} if l1 is not None else set()


class _Reports:
    """The node's reports as the scheduler's follower delivers them."""

    def __init__(self) -> None:
        self.latest: ExecutorState | None = None
        self.count = 0

    def __call__(self, state: ExecutorState) -> None:
        if state.node == NODE:
            self.latest, self.count = state, self.count + 1


def test_losing_one_of_three_brokers_mid_stream_loses_and_duplicates_nothing(
    cluster: Cluster, tmp_path: Path, unique: str
) -> None:
    kafka = KafkaSettings(
        kafka_bootstrap=cluster.bootstrap,
        kafka_client_id=f"k3-{unique}",
        topic_requests=f"requests-{unique}",
        topic_dlq=f"requests-{unique}.dlq",
        topic_orders=f"orders-{unique}",
        topic_executor_state=f"state-{unique}",
        kafka_replication_factor=3,  # min.insync.replicas follows: 2
        topic_requests_partitions=6,
        topic_control_partitions=1,  # one orders partition: its leader is the broker to kill
    )
    ingest = IngestSettings(consumer_group=f"ingest-{unique}", batch_max_s=0.5)

    # The pieces as they run in production, each creating the topics it needs.
    store = DemandStore(f"sqlite:///{tmp_path / 'demand.db'}")
    consumer = IngestConsumer(store, kafka, ingest)
    ensure_control_topics(kafka)
    names = [kafka.topic_requests, kafka.topic_dlq, kafka.topic_orders, kafka.topic_executor_state]
    # A topic created a moment ago may not be in every broker's metadata yet, and each look may ask
    # another broker: the look that found every topic is the one judged.
    seen: dict[str, tuple[int, set[int], str | None]] = {}

    def every_topic_seen() -> bool:
        seen.update(_topics(cluster, names))
        return all(parts for parts, _, _ in seen.values())

    wait_for(every_topic_seen, 20, "the new topics")
    assert seen == {
        kafka.topic_requests: (6, {3}, "2"),
        kafka.topic_dlq: (1, {3}, "2"),
        kafka.topic_orders: (1, {3}, "2"),
        kafka.topic_executor_state: (1, {3}, "2"),
    }

    catalog = models(tmp_path / "weights", 2)
    daemon = ExecutorDaemon(
        executor_for(NODE, catalog, tmp_path / "cache", l0=8 * MB, l1=16 * MB), kafka, state_interval_s=0.5
    ).start()
    reports = _Reports()
    follower = StateFollower(kafka, reports).start()
    publisher = OrderPublisher(kafka, timeout_s=60)
    stop = threading.Event()
    ingesting = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    ingesting.start()
    victim = _leader(cluster, kafka.topic_orders, 0)
    truth: Counter[tuple[str, int]] = Counter()
    rng = random.Random(13)
    try:
        wait_for(lambda: reports.count > 0, 30, "the node's first state report")
        start_ms = int(time.time() * 1000) - 60_000
        with RequestLogProducer.from_settings(kafka, ingest) as gateway:
            for i in range(EVENTS):
                model = f"model-{rng.randrange(MODELS)}"
                ts = start_ms + i * 2  # in time order, within the last minute or two: nothing is late
                gateway.send({"v": 1, "ts": ts, "model": model})
                truth[(model, ts // 60_000 * 60)] += 1
                if i == EVENTS // 4:
                    publisher.publish([_order(f"before-{unique}", "m0")])
                if i == EVENTS // 2:
                    cluster.kill(victim)
                    # Sent while the partition's leader is gone: acknowledged once a survivor leads it.
                    publisher.publish([_order(f"after-{unique}", "m1")])
                if i % 2000 == 0:
                    time.sleep(0.2)  # a stream over seconds, not one burst before the kill
            gateway.flush(timeout_s=90)
            assert (gateway.sent, gateway.acked) == (EVENTS, EVENTS)

        wait_for(lambda: store.counters(ingest.consumer_group).get("records", 0) >= EVENTS, 120, "ingest")
        wait_for(
            lambda: {f"before-{unique}", f"after-{unique}"} <= {o.order_id for o in daemon.outcomes},
            60,
            "both orders applied",
        )
        wait_for(lambda: _in_l1(reports.latest) >= {"m0", "m1"}, 30, "a report with both models in L1")
    finally:
        stop.set()
        ingesting.join(30)
        publisher.close()
        follower.stop()
        daemon.stop()

    # Every event counted exactly once, in its own minute; no record read twice, nothing dead-lettered.
    stored = Counter({(m, minute): n for m, minute, n, _, _ in store.minutes()})
    counters = store.counters(ingest.consumer_group)
    store.close()
    assert stored == truth
    assert counters["records"] == EVENTS
    assert not [k for k in counters if k.startswith("dead_lettered")]

    # The loss was real: a survivor leads the orders partition now, and two brokers are left.
    assert _leader(cluster, kafka.topic_orders, 0) not in (victim, -1)
    admin = cluster.admin()
    try:
        assert len(admin.describe_cluster()["brokers"]) == 2
    finally:
        admin.close()

    # Each order on the topic once (idempotent retries), and applied by the node.
    assert sorted(_order_ids(kafka, 2)) == sorted([f"after-{unique}", f"before-{unique}"])
    done = {o.order_id for o in daemon.outcomes if o.status is OrderStatus.DONE}
    assert done == {f"before-{unique}", f"after-{unique}"}
    assert daemon.error is None
    assert follower.error is None

    # A scheduler that starts now (reading the compacted state topic from the beginning, as a restarted
    # replica does) sees the node's latest report, made after the broker was lost.
    fresh = _Reports()
    restarted = StateFollower(kafka, fresh).start()
    try:
        assert restarted.wait_caught_up(30)
    finally:
        restarted.stop()
    assert _in_l1(fresh.latest) == {"m0", "m1"}
    assert fresh.latest is not None
    assert reports.latest is not None
    assert fresh.latest.at >= reports.latest.at
