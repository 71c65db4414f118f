"""Every order the active replica hands out, and whether it reached Kafka: the order ledger.

``prewarm_scheduler_orders`` holds one row per order id. An order is recorded when it is planned (a
later one before its date job is added) and marked published in the same transaction that sends it:

    BEGIN; check the lease; INSERT the row if new; UPDATE published_at WHERE published_at IS NULL
    RETURNING id; send those to Kafka and wait for the acks; COMMIT

The UPDATE's row lock is held until the acks are in, so a second replica claiming the same order waits
and then finds it published; a replica killed before its COMMIT leaves the row unpublished (or, for an
order due at once, no row at all), and the next active replica publishes it. The one window left, killed
after the send but before the COMMIT, is closed at takeover: ``recently_published`` reads the orders
topic's last minutes and ``mark_published`` records those orders as published, a row for each, before
anything is sent. The row matters even where none was left: order ids are the planner's (the same
decision gets the same id), so the new holder planning the same hint again would otherwise send it a
second time. Executors skipping an order id they already applied is the last line, not the first.

On SQLite (one process) the rows are claimed, sent, then marked, without holding SQLite's single write
lock across a Kafka round trip.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa
from kafka import TopicPartition
from pydantic import ValidationError
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from prewarm import BrokerError, KafkaSettings, Order, StorageError, get_logger
from prewarm.kafka import broker_errors, make_consumer

__all__ = ["ORDERS_TABLE", "OrderLedger", "recently_published"]

log = get_logger(__name__)

_METADATA = sa.MetaData()
ORDERS_TABLE = sa.Table(
    "prewarm_scheduler_orders",
    _METADATA,
    sa.Column("id", sa.String(128), primary_key=True),  # the wire schema's bound
    sa.Column("node", sa.String(256), nullable=False),
    sa.Column("not_before", sa.Float, nullable=False),
    sa.Column("deadline", sa.Float, nullable=False, index=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("planned_by", sa.String(256), nullable=False),
    sa.Column("published_at", sa.Float, nullable=True),
    sa.Column("published_by", sa.String(256), nullable=True),
)
# A claim waits this long for a row another replica is publishing, then gives up (the caller retries):
# far longer than one Kafka round trip, far shorter than a stuck holder's transaction.
_LOCK_TIMEOUT = "2s"


class OrderLedger:
    """The ledger over ``engine``. ``fence(conn)`` says, inside the transaction, whether this replica
    still holds the lease; nothing is recorded or claimed when it does not."""

    def __init__(self, engine: Engine, holder: str, fence: Callable[[Connection], bool]) -> None:
        self._engine = engine
        self._holder = holder
        self._fence = fence
        self._locking = engine.dialect.name == "postgresql"
        self.table = ORDERS_TABLE

    def record(self, orders: Sequence[Order]) -> bool:
        """Record planned orders (an id already there is left as it is); False if the lease is lost."""
        try:
            with self._engine.begin() as conn:
                if not self._fence(conn):
                    return False
                self._insert(conn, orders)
                return True
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot record orders: {_brief(exc)}") from exc

    @contextmanager
    def claim(self, orders: Sequence[Order]) -> Iterator[list[Order]]:
        """The orders of ``orders`` not published yet, to publish inside the block; they count as
        published when the block ends without an exception. None while the lease is not held."""
        orders = _unique(orders)  # an id twice in one batch is still one order, sent once
        ids = [o.id for o in orders]
        t = self.table
        unpublished = sa.and_(t.c.id.in_(ids), t.c.published_at.is_(None))
        try:
            if self._locking:
                with self._engine.begin() as conn:
                    conn.execute(sa.text(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'"))
                    if not self._fence(conn):
                        yield []
                        return
                    self._insert(conn, orders)
                    mark = sa.update(t).where(unpublished).values(self._published()).returning(t.c.id)
                    mine = set(conn.execute(mark).scalars())
                    yield [o for o in orders if o.id in mine]
                return
            with self._engine.begin() as conn:
                self._insert(conn, orders)
                mine = set(conn.execute(sa.select(t.c.id).where(unpublished)).scalars())
            chosen = [o for o in orders if o.id in mine]
            yield chosen
            if chosen:
                with self._engine.begin() as conn:
                    conn.execute(sa.update(t).where(t.c.id.in_(mine)).values(self._published()))
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot claim orders for publishing: {_brief(exc)}") from exc

    def pending(self, now: float) -> tuple[list[Order], set[str]]:
        """Orders whose deadline has not passed (what the active replica had handed out), and the ids
        among them not published yet."""
        t = self.table
        query = sa.select(t.c.body, t.c.published_at).where(t.c.deadline > now).order_by(t.c.not_before)
        try:
            with self._engine.connect() as conn:
                rows = list(conn.execute(query))
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot read the order ledger: {_brief(exc)}") from exc
        orders: list[Order] = []
        unpublished: set[str] = set()
        for row in rows:
            try:
                order = Order.model_validate_json(row.body)
            except ValidationError as exc:
                log.warning("skipping a ledger row that does not parse", extra={"error": str(exc)[:200]})
                continue
            orders.append(order)
            if row.published_at is None:
                unpublished.add(order.id)
        return orders, unpublished

    def mark_published(self, orders: Sequence[Order]) -> int:
        """Record orders found on the orders topic as published, with a row for any the ledger lacks;
        how many were not recorded as published yet."""
        unique = sorted(_unique(orders), key=lambda o: o.id)  # a statement may touch a row only once
        if not unique:
            return 0
        t = self.table
        insert = self._insert_of([self._row(o) | self._published() for o in unique])
        upsert = insert.on_conflict_do_update(
            index_elements=["id"],
            set_={"published_at": insert.excluded.published_at, "published_by": insert.excluded.published_by},
            where=t.c.published_at.is_(None),
        ).returning(t.c.id)  # the rows inserted or updated (a multi-row VALUES has no rowcount)
        try:
            with self._engine.begin() as conn:
                return len(conn.execute(upsert).all())
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot mark orders published: {_brief(exc)}") from exc

    def prune(self, before: float) -> int:
        """Forget orders whose deadline passed before ``before``; how many."""
        try:
            with self._engine.begin() as conn:
                return conn.execute(sa.delete(self.table).where(self.table.c.deadline < before)).rowcount
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot prune the order ledger: {_brief(exc)}") from exc

    def _published(self) -> dict[str, object]:
        return {"published_at": time.time(), "published_by": self._holder}

    def _row(self, order: Order) -> dict[str, object]:
        return {
            "id": order.id,
            "node": order.node,
            "not_before": order.not_before,
            "deadline": order.deadline,
            "body": order.model_dump_json(),
            "planned_by": self._holder,
        }

    def _insert(self, conn: Connection, orders: Sequence[Order]) -> None:
        if orders:
            insert = self._insert_of([self._row(o) for o in orders])
            conn.execute(insert.on_conflict_do_nothing(index_elements=["id"]))

    def _insert_of(self, rows: list[dict[str, object]]) -> postgresql.Insert | sqlite.Insert:
        """An INSERT of ``rows`` in the engine's dialect, for its ON CONFLICT clause."""
        if self._locking:
            return postgresql.insert(self.table).values(rows)
        return sqlite.insert(self.table).values(rows)


def recently_published(kafka: KafkaSettings, since: float, *, timeout_s: float = 10.0) -> list[Order]:
    """The orders on the orders topic with a timestamp at or after ``since`` (epoch seconds), read up to
    the topic's end as it is when called."""
    orders: list[Order] = []
    with broker_errors("read back recent orders"):
        consumer = make_consumer(
            kafka,
            client_id=f"{kafka.kafka_client_id}-scheduler-takeover",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
        )
        try:
            partitions = consumer.partitions_for_topic(kafka.topic_orders) or set()
            tps = [TopicPartition(kafka.topic_orders, p) for p in sorted(partitions)]
            if not tps:
                return orders
            consumer.assign(tps)
            ends: dict[TopicPartition, int] = consumer.end_offsets(tps)
            starts = consumer.offsets_for_times({tp: int(since * 1000) for tp in tps})
            left = {}
            for tp in tps:
                found = starts.get(tp)
                if found is None:  # nothing that recent on this partition
                    continue
                consumer.seek(tp, found.offset)
                left[tp] = ends[tp]
            deadline = time.monotonic() + timeout_s
            while left and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=200).values():
                    orders += [o for r in records if (o := _order(r.value)) is not None]
                for tp in list(left):
                    if consumer.position(tp) >= left[tp]:
                        del left[tp]
            if left:
                raise BrokerError(f"orders topic not read to its end in {timeout_s:g}s", transient=True)
        finally:
            consumer.close()
    return orders


def _order(value: bytes | None) -> Order | None:
    if value is None:
        return None
    try:
        return Order.model_validate_json(value)
    except ValidationError:
        return None  # not ours to judge here: the executor dead-letters what it cannot read


def _unique(orders: Sequence[Order]) -> list[Order]:
    """``orders`` without a repeated id (the first of each kept, in order)."""
    by_id: dict[str, Order] = {}
    for order in orders:
        by_id.setdefault(order.id, order)
    return list(by_id.values())


def _brief(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
