"""``prewarm bench hints``: latency from ``POST /v1/hints`` to the order being readable on the orders topic.

Against the scheduler at the configured API address; when nothing answers there, one is started in this
process on a synthetic catalog (one model per hint, so every hint yields a fresh order). The clock
starts just before the request is written and stops when a consumer already positioned at the end of
the orders topic has the order in hand.
"""

from __future__ import annotations

import secrets
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from kafka import TopicPartition
from pydantic import SecretStr

from models import Catalog, ModelSpec
from prewarm import Order, Settings, get_logger
from prewarm.kafka import broker_errors, ensure_control_topics, make_consumer
from scheduler._auth import Authenticator
from scheduler._cluster import Cluster
from scheduler._serve import BackgroundServer

__all__ = ["WARMUP", "bench_hints"]

WARMUP = 5  # hints sent before measuring: connection set-up and first-call costs are not latency

log = get_logger(__name__)


class _OrderWatch:
    """Follows the orders topic from its current end and notes when each order id arrives."""

    def __init__(self, settings: Settings) -> None:
        kafka = settings.kafka
        with broker_errors("watch orders"):
            self._consumer = make_consumer(
                kafka,
                client_id=f"{kafka.kafka_client_id}-bench-hints",
                enable_auto_commit=False,
                fetch_max_wait_ms=5,  # the measurement, not the poll interval, should dominate
            )
            partitions = self._consumer.partitions_for_topic(kafka.topic_orders) or {0}
            tps = [TopicPartition(kafka.topic_orders, p) for p in sorted(partitions)]
            self._consumer.assign(tps)
            self._consumer.seek_to_end(*tps)
            for tp in tps:
                self._consumer.position(tp)  # resolve the end now, before any hint is sent
        self.arrived: dict[str, float] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-orders", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for records in self._consumer.poll(timeout_ms=20).values():
                now = time.perf_counter()
                with self._cond:
                    for record in records:
                        self.arrived.setdefault(Order.model_validate_json(record.value).id, now)
                    self._cond.notify_all()

    def wait_for(self, order_id: str, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while order_id not in self.arrived:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self.arrived[order_id]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def _scheduler(settings: Settings, hints: int) -> Iterator[tuple[str, str, list[str], bool]]:
    """(base url, token, models to hint, started here): the configured scheduler, or one started here."""
    sched = settings.scheduler
    url = f"http://{sched.api_host}:{sched.api_port}"
    token = Authenticator(sched.hint_tokens.get_secret_value()).first_token()
    if _answers(url):
        if token is None:
            raise SystemExit("a scheduler answers at " + url + " but PREWARM_HINT_TOKENS has no token")
        models = Catalog.load(settings.core.catalog).ids() if settings.core.catalog else []
        yield url, token, models, False
        return
    from scheduler._api import create_app
    from scheduler._runtime import Runtime

    token = token or secrets.token_urlsafe(24)
    run = secrets.token_hex(4)  # names of this run only: nothing left by an earlier run can match
    # One small model per hint on a node with room for all: each hint is a fresh prefetch order.
    specs = [
        ModelSpec(id=f"bench-{run}-{i}", version="1", uri=f"file:///bench/{i}", size_bytes=2**20)
        for i in range(hints + WARMUP)
    ]
    cluster = Cluster.single_node("bench-node", l0_bytes=2**40, l1_bytes=2**40, l2_bytes=2**40)
    local = settings.model_copy(
        update={
            "scheduler": sched.model_copy(
                update={
                    "hint_tokens": SecretStr(f"bench:{token}"),
                    "hint_rate_per_s": 1e6,
                    "hint_burst": 10**6,
                }
            )
        }
    )
    # A scratch job store: the benchmark's hints and orders must never be restored by a real scheduler.
    scratch = tempfile.TemporaryDirectory(prefix="prewarm-bench-")
    jobs = f"sqlite:///{Path(scratch.name) / 'jobs.db'}"
    runtime = Runtime(local, Catalog(specs), cluster, jobstore_url=jobs).start()
    # Measure a warm scheduler: the first planning round (imports, store schema) is start-up, not latency.
    deadline = time.monotonic() + 60
    while runtime.core.plan_view()["at"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        app = create_app(
            runtime.core,
            local.scheduler,
            ready=runtime.ready,
            accept_hint=runtime.accept_hint,  # the real path: stored, then planned
            active=lambda: runtime.active,
        )
        with BackgroundServer(app, sched.api_host, sched.api_port) as server:
            yield server.url, token, [s.id for s in specs], True
    finally:
        runtime.stop()
        scratch.cleanup()


def bench_hints(settings: Settings, hints: int = 200, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Post ``hints`` hints one after another; percentiles of hint → order-on-Kafka latency."""
    ensure_control_topics(settings.kafka)
    latencies: list[float] = []
    no_order = 0
    with _scheduler(settings, hints) as (url, token, models, own):
        if not models:
            raise SystemExit("no models to hint: set PREWARM_CATALOG to the scheduler's catalog")
        # A scheduler of someone else keeps its rate limit: stay under it rather than measure 429s.
        pace = 0.0 if own else 1.0 / settings.scheduler.hint_rate_per_s
        watch = _OrderWatch(settings)
        try:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=5) as http:
                for i in range(hints + WARMUP):
                    model = models[i % len(models)]
                    started = time.perf_counter()
                    response = http.post("/v1/hints", json={"model": model, "eta_s": 0, "ttl_s": 600})
                    response.raise_for_status()
                    orders = [o["id"] for o in response.json()["orders"] if o["not_before"] <= time.time()]
                    if not orders:
                        log.warning("no order for hint %s: %s", i, response.text[:600])
                        no_order += 1
                        continue
                    arrived = watch.wait_for(orders[-1], timeout_s)
                    if arrived is None:
                        raise SystemExit(f"order {orders[-1]} never reached {settings.kafka.topic_orders}")
                    if i >= WARMUP:
                        latencies.append((arrived - started) * 1000)
                    if pace:
                        time.sleep(pace)
        finally:
            watch.close()
    if not latencies:
        raise SystemExit("no hint produced an order: every model is already where the plan wants it")
    ordered = sorted(latencies)
    return {
        "hints": len(latencies),
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
        "max_ms": round(ordered[-1], 3),
        "hints_without_order": no_order,
        "target_p99_ms": 100,
        "scheduler": url,
    }
