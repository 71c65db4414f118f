"""Two `prewarm scheduler run` replicas on the local stack's PostgreSQL and Kafka; the active one is
SIGKILLed while hints arrive and timed orders fall due."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from pg_schema import private_schema
from wait_helpers import wait_for

from models import Catalog, ModelSpec
from prewarm import KafkaSettings, Order
from prewarm.kafka import make_consumer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MAIN = "from prewarm_cli import main; main()"
TOKEN = "tok-ha"
TAKEOVER_S = 15.0  # the bound, from the SIGKILL to the survivor saying active


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readyz(port: int) -> dict[str, object] | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def post_hint(port: int, model: str, eta_s: float) -> httpx.Response | None:
    try:
        return httpx.post(
            f"http://127.0.0.1:{port}/v1/hints",
            json={"model": model, "eta_s": eta_s},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=5,
        )
    except httpx.HTTPError:
        return None  # the replica is gone: not accepted


def read_all_orders(bootstrap: str, topic: str, quiet_s: float = 3.0) -> list[Order]:
    """Every order on the topic, read until nothing new arrives for ``quiet_s``."""
    consumer = make_consumer(
        KafkaSettings(kafka_bootstrap=bootstrap),
        topic,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    got: list[Order] = []
    last = time.monotonic()
    try:
        while time.monotonic() - last < quiet_s:
            for records in consumer.poll(timeout_ms=200).values():
                got += [Order.model_validate_json(r.value) for r in records]
                last = time.monotonic()
    finally:
        consumer.close()
    return got


@pytest.fixture
def database(postgres_url: str, unique: str) -> Iterator[str]:
    with private_schema(postgres_url, f"ha_{unique}") as url:
        yield url


@pytest.fixture
def replicas() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in started:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_killing_the_active_replica_loses_no_hint_and_repeats_no_order(
    kafka_bootstrap: str, database: str, unique: str, tmp_path: Path, replicas: list[subprocess.Popen[bytes]]
) -> None:
    models = [f"t{i}" for i in range(12)] + [f"h{i}" for i in range(60)]
    specs = [ModelSpec(id=m, version="1", uri=f"file:///w/{m}.safetensors", size_bytes=10**8) for m in models]
    Catalog(specs).save(tmp_path / "catalog.yaml")
    node = f"node-{unique}"
    (tmp_path / "cluster.yaml").write_text(
        f"nodes:\n  - name: {node}\n    gpus: [{{memory_bytes: 80GB}}]\n"
        "    host_cache_bytes: 100GB\n    disk_cache_bytes: 1TB\n"
        "bandwidth: {l3_bytes_per_s: 1GB/s, l2_bytes_per_s: 7GB/s, l1_bytes_per_s: 50GB/s}\n"
    )
    topic = f"orders-{unique}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env |= {
        "PREWARM_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "PREWARM_TOPIC_ORDERS": topic,
        "PREWARM_TOPIC_EXECUTOR_STATE": f"state-{unique}",
        "PREWARM_DATABASE_URL": database,
        "PREWARM_DATA_DIR": str(tmp_path / "shared"),  # one data directory for both replicas
        "PREWARM_CATALOG": str(tmp_path / "catalog.yaml"),
        "PREWARM_CLUSTER": str(tmp_path / "cluster.yaml"),
        "PREWARM_HINT_TOKENS": f"shop:{TOKEN}",
        "PREWARM_PLAN_INTERVAL_S": "1",
        "PREWARM_MLFLOW_TRACKING_URI": (tmp_path / "shared" / "mlruns").as_uri(),
    }
    ports = [free_port(), free_port()]
    # Both first starts at once, on an empty schema: the tables are created by whichever gets there.
    for port in ports:
        replica_env = env | {"PREWARM_API_PORT": str(port)}  # the contract: the port comes from here
        replicas.append(
            subprocess.Popen([sys.executable, "-c", MAIN, "scheduler", "run"], cwd=REPO, env=replica_env)
        )
    # Each process imports torch, pandas and MLflow first: on shared cores that alone can take a minute.
    wait_for(lambda: all(readyz(p) is not None for p in ports), 180, "both replicas to be ready")
    states = [readyz(p) for p in ports]
    assert sorted(bool(s and s["active"]) for s in states) == [False, True], states
    active = next(i for i, s in enumerate(states) if s and s["active"])
    survivor = 1 - active

    accepted: list[str] = []  # models of hints answered 2xx, by either replica
    # Timed orders: due 3 to 25 s from now, so some fall due before the kill, some while no replica
    # is active, some after the takeover. Half go to the standby, which only stores them. Each is
    # committed to (in the ledger, then on the topic) only a planning interval or two before it is due.
    last_eta = time.time() + 10.0 + 2.0 * 11
    for i in range(12):
        response = post_hint(ports[i % 2], f"t{i}", 10.0 + 2.0 * i)
        assert response is not None, f"t{i}"
        assert response.status_code == 202, response.text
        accepted.append(f"t{i}")

    stop = threading.Event()
    failures: list[str] = []

    def keep_hinting() -> None:
        for i in range(60):
            if stop.is_set():
                return
            response = post_hint(ports[i % 2], f"h{i}", 0.0)
            if response is not None and response.status_code == 202:
                accepted.append(f"h{i}")
            elif response is not None and i % 2 == survivor:
                failures.append(f"h{i}: {response.status_code} {response.text}")
            time.sleep(0.25)

    hinter = threading.Thread(target=keep_hinting, daemon=True)
    hinter.start()
    time.sleep(2.0)  # hints keep arriving at both replicas while the active one dies
    killed_at = time.monotonic()
    replicas[active].kill()  # SIGKILL: no lease released, no job store flushed
    replicas[active].wait(10)
    wait_for(lambda: (readyz(ports[survivor]) or {}).get("active") is True, 30, "the survivor to take over")
    took = time.monotonic() - killed_at
    assert took < TAKEOVER_S, f"took over after {took:.1f}s"
    hinter.join(30)
    stop.set()
    assert failures == []

    # Every timed order has been committed to and has fallen due (the last about 32 s after its hint).
    engine = sa.create_engine(database)
    try:

        def ledger() -> list[sa.Row[tuple[str, float, float | None]]]:
            with engine.connect() as conn:
                query = "SELECT id, not_before, published_at FROM prewarm_scheduler_orders"
                return list(conn.execute(sa.text(query)))

        def all_due_published() -> bool:
            rows = ledger()
            return bool(rows) and all(r.published_at is not None for r in rows if r.not_before <= time.time())

        time.sleep(max(0.0, last_eta - time.time()) + 2.0)  # every timed hint's order is committed
        latest = max(r.not_before for r in ledger())
        time.sleep(max(0.0, latest - time.time()) + 1.0)
        wait_for(all_due_published, 30, "every due order in the ledger to be published")
        rows = ledger()
    finally:
        engine.dispose()
    orders = read_all_orders(kafka_bootstrap, topic)

    counts = Counter(o.id for o in orders)
    assert [oid for oid, n in counts.items() if n > 1] == [], "an order published twice"
    ledgered = {r.id: r for r in rows}
    only_ledger = [(r.id, r.not_before, r.published_at) for oid, r in ledgered.items() if oid not in counts]
    only_topic = [(o.id, o.model, o.not_before) for o in orders if o.id not in ledgered]
    assert (only_ledger, only_topic) == ([], []), "the ledger and the topic disagree"
    assert all(o.node == node for o in orders)
    planned = {o.model for o in orders}
    assert [m for m in accepted if m not in planned] == [], "an accepted hint was never planned"
    assert len(accepted) > 12 + 4  # hints did arrive around the kill, at both replicas
