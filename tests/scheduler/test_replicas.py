"""What keeps scheduler replicas apart, on the local stack's PostgreSQL: the leader lease, first-start
table creation, the order ledger's claims and the stored hints. (Two whole replicas, killed mid-stream:
tests/system/test_scheduler_ha.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from apscheduler.schedulers.background import BackgroundScheduler
from fastapi.testclient import TestClient
from pg_schema import private_schema
from scheduler_builders import GB, catalog, cluster, spec
from sqlalchemy.engine import Engine

from prewarm import ConfigError, Hint, KafkaSettings, Order, OrderAction, OrderReason, Tier, load_settings
from prewarm.kafka import ensure_control_topics
from scheduler import PlannerConfig, SchedulerCore, create_app
from scheduler._dispatch import Dispatcher
from scheduler._hintstore import HINTS_TABLE, HintFollower, HintStore
from scheduler._kafka import OrderPublisher
from scheduler._lease import (
    LEASE_TABLE,
    AlwaysHeld,
    LeaderLease,
    LeaseKeeper,
    create_tables_once,
    replica_identity,
)
from scheduler._ledger import ORDERS_TABLE, OrderLedger, recently_published

TABLES = [LEASE_TABLE, HINTS_TABLE, ORDERS_TABLE]


@pytest.fixture
def engine(postgres_url: str, unique: str) -> Iterator[Engine]:
    with private_schema(postgres_url, f"rep_{unique}") as url:
        eng = sa.create_engine(url)
        create_tables_once(eng, TABLES)
        yield eng
        eng.dispose()


def order(oid: str, *, not_before: float = 0.0) -> Order:
    return Order(
        id=oid,
        node="gpu-a",
        model="chat",
        version="1",
        action=OrderAction.PREFETCH,
        tier=Tier.L1,
        reason=OrderReason.HINT,
        not_before=not_before,
        deadline=time.time() + 600,
        created_at=time.time(),
    )


def test_only_one_replica_holds_the_lease_until_it_expires(engine: Engine) -> None:
    a, b = LeaderLease(engine, "a", ttl_s=1.0), LeaderLease(engine, "b", ttl_s=1.0)
    assert a.try_acquire() is True
    assert b.try_acquire() is False
    assert a.try_acquire() is True  # renewing
    assert a.current_holder() == "a"
    time.sleep(1.2)  # a stops renewing (as if SIGKILLed): the lease expires by the database's clock
    assert b.try_acquire() is True
    assert a.try_acquire() is False
    with engine.connect() as conn:
        assert b.holds(conn)
        assert not a.holds(conn)


def test_a_released_lease_is_taken_at_the_next_try(engine: Engine) -> None:
    a, b = LeaderLease(engine, "a", ttl_s=60.0), LeaderLease(engine, "b", ttl_s=60.0)
    assert a.try_acquire()
    a.release()
    assert b.try_acquire()


def test_keeper_reports_winning_and_losing_the_lease(engine: Engine) -> None:
    events: list[str] = []
    mine = LeaderLease(engine, "mine", ttl_s=2.0)
    keeper = LeaseKeeper(
        mine,
        ttl_s=2.0,
        renew_s=0.2,
        on_acquired=lambda: events.append("won"),
        on_lost=lambda: events.append("lost"),
    ).start()
    try:
        assert keeper.held
        assert events == ["won"]
        # Someone takes the row over (an operator, or a replica after a long pause of ours).
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE prewarm_scheduler_lease SET holder = 'other'"))
        deadline = time.monotonic() + 5
        while keeper.held and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not keeper.held
        assert events == ["won", "lost"]
    finally:
        keeper.stop()


def test_two_first_starts_create_the_tables_at_once(postgres_url: str, unique: str) -> None:
    with private_schema(postgres_url, f"first_{unique}") as url:
        engines = [sa.create_engine(url) for _ in range(4)]
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(engines))

        def start(eng: Engine) -> None:
            barrier.wait()
            try:
                create_tables_once(eng, TABLES)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert set(sa.inspect(engines[0]).get_table_names()) >= {t.name for t in TABLES}
        for eng in engines:
            eng.dispose()


def test_an_order_claimed_by_two_replicas_is_published_by_one(engine: Engine) -> None:
    a_lease = LeaderLease(engine, "a", ttl_s=60.0)
    assert a_lease.try_acquire()
    a = OrderLedger(engine, "a", a_lease.holds)
    # b believes it holds the lease too (a stale holder): only the row lock stands between them.
    b = OrderLedger(engine, "b", lambda conn: True)
    first = order("o1")
    got_b: list[list[Order]] = []
    with a.claim([first]) as mine:
        assert [o.id for o in mine] == ["o1"]
        rival = threading.Thread(target=lambda: got_b.append(_claim(b, [first])))
        rival.start()
        time.sleep(0.3)  # b waits on a's row while a "sends"
        assert got_b == []
    rival.join(10)
    assert got_b == [[]]  # a committed: published once, b has nothing to send


def test_a_claim_cut_off_before_its_commit_leaves_the_order_to_the_next_holder(engine: Engine) -> None:
    a = OrderLedger(engine, "a", lambda conn: True)
    with pytest.raises(RuntimeError, match="send failed"):
        _claim(a, [order("o2")], then=RuntimeError("the Kafka send failed"))  # rolled back
    orders, unpublished = a.pending(time.time())
    assert [o.id for o in orders] == []
    assert unpublished == set()
    b = OrderLedger(engine, "b", lambda conn: True)
    assert [o.id for o in _claim(b, [order("o2")])] == ["o2"]


def test_without_the_lease_nothing_is_recorded_or_claimed(engine: Engine) -> None:
    a_lease = LeaderLease(engine, "a", ttl_s=60.0)
    assert LeaderLease(engine, "other", ttl_s=60.0).try_acquire()
    a = OrderLedger(engine, "a", a_lease.holds)
    assert a.record([order("o3", not_before=time.time() + 60)]) is False
    assert _claim(a, [order("o3")]) == []
    assert a.pending(time.time()) == ([], set())


def test_orders_found_on_the_topic_are_recorded_published_with_a_row_where_the_ledger_had_none(
    engine: Engine,
) -> None:
    ledger = OrderLedger(engine, "a", lambda conn: True)
    assert ledger.record([order("o4", not_before=time.time() + 60), order("o5", not_before=time.time() + 60)])
    # o6 is on the topic twice and has no row: its claim's rollback took the row with it.
    assert ledger.mark_published([order("o4"), order("o6"), order("o6")]) == 2
    orders, unpublished = ledger.pending(time.time())
    assert {o.id for o in orders} == {"o4", "o5", "o6"}
    assert unpublished == {"o5"}
    assert ledger.mark_published([order("o4"), order("o6")]) == 0  # already recorded as published


def test_a_claim_cut_off_after_its_send_is_not_sent_again_when_the_next_holder_plans_it_again(
    engine: Engine,
) -> None:
    a = OrderLedger(engine, "a", lambda conn: True)
    sent = order("o7")  # due at once: recorded and claimed in the one transaction
    with pytest.raises(RuntimeError, match="killed"):
        _claim(a, [sent], then=RuntimeError("killed after the send, before the commit"))
    assert a.pending(time.time()) == ([], set())
    b = OrderLedger(engine, "b", lambda conn: True)
    b.mark_published([sent])  # the takeover's read of the orders topic
    assert _claim(b, [sent]) == []  # the same hint planned again: the same id, not sent twice


def test_a_takeover_reads_back_an_order_sent_before_the_kill_so_planning_it_again_sends_nothing(
    engine: Engine, kafka_bootstrap: str, unique: str
) -> None:
    kafka = KafkaSettings(
        kafka_bootstrap=kafka_bootstrap,
        topic_orders=f"orders-{unique}",
        topic_executor_state=f"state-{unique}",
    )
    ensure_control_topics(kafka)
    publisher = OrderPublisher(kafka)
    a = OrderLedger(engine, "a", lambda conn: True)
    sent = order("o10")
    try:
        with pytest.raises(RuntimeError, match="killed"):  # after the broker's ack
            _claim(a, [sent], send=publisher.publish, then=RuntimeError("killed before the commit"))
        dispatcher = Dispatcher(
            publisher=publisher,
            ledger=OrderLedger(engine, "b", lambda conn: True),
            scheduler=BackgroundScheduler(),
            job=lambda order_json: None,
            clock=time.time,
        )
        assert dispatcher.take_over(kafka) == [sent]  # still in force: the planner books it
        dispatcher.dispatch([sent])  # the same hint, planned again by the new holder
        assert [o.id for o in recently_published(kafka, time.time() - 60)] == ["o10"]
    finally:
        publisher.close()


def test_an_id_twice_in_one_batch_is_claimed_once(engine: Engine) -> None:
    ledger = OrderLedger(engine, "a", lambda conn: True)
    assert [o.id for o in _claim(ledger, [order("o8"), order("o8"), order("o9")])] == ["o8", "o9"]


def test_each_stored_hint_is_handed_to_the_follower_once(engine: Engine) -> None:
    store = HintStore(engine)
    now = time.time()
    got: list[list[str]] = []
    follower = HintFollower(store, lambda hs: got.append([h.model for h in hs]), poll_s=60, clock=time.time)
    store.add(Hint(model="a", source="web", received_at=now), now)
    assert [h.model for h in follower.poll()] == ["a"]
    store.add(Hint(model="b", source="web", received_at=now), now)
    follower.poll()
    follower.poll()  # the overlap window reads "b" again: not handed over twice
    assert got == [["a"], ["b"]]
    store.add(Hint(model="gone", source="web", ttl_s=1.0, received_at=now - 10), now)
    assert sorted(h.model for h in store.live(now)) == ["a", "b"]
    assert store.prune(now) == 1


def test_sqlite_lease_is_always_held_and_replicas_are_told_apart() -> None:
    assert AlwaysHeld("x").try_acquire()
    assert replica_identity("set-by-hand") == "set-by-hand"
    assert replica_identity() != replica_identity()  # same host, same process: still two names


def test_readyz_says_whether_this_replica_is_the_active_one(tmp_path: Path) -> None:
    settings = load_settings(overrides={"data_dir": str(tmp_path)})
    core = SchedulerCore(
        catalog=catalog(spec("chat", GB)),
        cluster=cluster("a"),
        config=PlannerConfig(),
        dispatch=lambda o: None,
    )
    active = False
    client = TestClient(
        create_app(core, settings.scheduler, ready=lambda: (True, "ok"), active=lambda: active)
    )
    assert client.get("/readyz").json() == {"status": "ready", "message": "ok", "active": False}
    active = True
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["active"] is True


def _claim(
    ledger: OrderLedger,
    orders: list[Order],
    then: Exception | None = None,
    send: Callable[[list[Order]], None] | None = None,
) -> list[Order]:
    """Claim ``orders`` and ``send`` what is claimed; with ``then``, fail inside the claim after the send
    (as a failed Kafka send, or a process killed before its commit, would)."""
    with ledger.claim(orders) as mine:
        if send is not None:
            send(mine)
        if then is not None:
            raise then
        return mine


def test_a_lease_renewed_less_than_twice_per_lifetime_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match="lease_renew_s"):
        load_settings(overrides={"lease_ttl_s": "4", "lease_renew_s": "3"})
    assert load_settings(overrides={"lease_ttl_s": "4", "lease_renew_s": "2"}).scheduler.lease_renew_s == 2
