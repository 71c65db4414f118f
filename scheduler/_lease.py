"""Which replica plans: a leader lease in the job store's database, renewed every few seconds.

Two or more ``prewarm scheduler run`` processes share one PostgreSQL database (the job store's); exactly
one of them, the holder of the lease, plans, runs APScheduler jobs and publishes orders. The others serve
the hint API and take over when the holder stops renewing.

A lease *row* (``prewarm_scheduler_lease``: holder, acquired, renewed, expires), not a session-level
advisory lock: anyone can ``SELECT`` the row and see who is active and until when; expiry is decided by
the database's clock alone (``now()`` in every statement), so clock skew between replicas does not
matter; and a holder cut off from the database loses the lease after ``ttl`` rather than when a TCP
keepalive finally notices, which bounds takeover at ``ttl + renew`` (8 s + 2 s by default, inside the
15 s the issue asks for). An advisory lock would tie leadership to one pooled connection that
SQLAlchemy may recycle under us, and says nothing about who holds it without ``pg_locks``.

The lease alone cannot keep a stale holder (one paused past its expiry) from acting: every write that
matters checks the lease in the same transaction (``LeaderLease.holds``), and the order ledger's row
locks make each order's publish happen once (``scheduler._ledger``). With SQLite (one process by nature)
the lease is ``AlwaysHeld``.

``create_tables_once`` creates the scheduler's tables under a transaction-scoped advisory lock, so two
replicas starting for the first time at once do not both try ``CREATE TABLE`` (PostgreSQL's check-then-
create is not atomic: the loser fails on a duplicate type).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from prewarm import StorageError, get_logger

__all__ = [
    "LEASE_TABLE",
    "AlwaysHeld",
    "LeaderLease",
    "Lease",
    "LeaseKeeper",
    "create_tables_once",
    "replica_identity",
    "shares_database",
]

log = get_logger(__name__)

_METADATA = sa.MetaData()
LEASE_TABLE = sa.Table(
    "prewarm_scheduler_lease",
    _METADATA,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("holder", sa.String(256), nullable=False),
    sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)
_LEASE_NAME = "scheduler"  # one active scheduler per database: the job table is shared too
_CREATE_LOCK_KEY = 0x70726577  # "prew": the advisory lock that serializes first-start table creation

# Renew, or take over an expired lease, in one statement: the row comes back only if we hold it now.
_ACQUIRE = sa.text(
    """
    INSERT INTO prewarm_scheduler_lease AS lease (name, holder, acquired_at, renewed_at, expires_at)
    VALUES (:name, :holder, now(), now(), now() + make_interval(secs => :ttl))
    ON CONFLICT (name) DO UPDATE SET
        holder = excluded.holder,
        renewed_at = excluded.renewed_at,
        expires_at = excluded.expires_at,
        acquired_at = CASE WHEN lease.holder = excluded.holder THEN lease.acquired_at
                           ELSE excluded.acquired_at END
    WHERE lease.holder = excluded.holder OR lease.expires_at < now()
    RETURNING holder
    """
)
_HOLDS = sa.text(
    "SELECT 1 FROM prewarm_scheduler_lease WHERE name = :name AND holder = :holder AND expires_at > now()"
)
_RELEASE = sa.text(
    "UPDATE prewarm_scheduler_lease SET expires_at = now() WHERE name = :name AND holder = :holder"
)


def shares_database(engine: Engine) -> bool:
    """Whether other processes can share this database (so a lease is needed): not SQLite."""
    return engine.dialect.name != "sqlite"


def replica_identity(configured: str | None = None) -> str:
    """This replica's name in the lease: the setting, else host, process id and a random tag, so two
    replicas on one machine (or a restarted one that reuses a pid) never pass for each other."""
    if configured:
        return configured
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def create_tables_once(engine: Engine, tables: Sequence[sa.Table]) -> None:
    """Create whichever of ``tables`` do not exist; safe when several replicas start at once."""
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_CREATE_LOCK_KEY)))
            for table in tables:
                table.create(conn, checkfirst=True)
    except SQLAlchemyError as exc:
        raise StorageError(f"cannot create the scheduler's tables: {_brief(exc)}") from exc


class Lease:
    """The interface: ``try_acquire`` (acquire or renew), ``holds`` (the fence, inside a transaction),
    ``release``. Subclasses decide where the truth lives."""

    holder: str

    def try_acquire(self) -> bool:
        raise NotImplementedError

    def holds(self, conn: Connection) -> bool:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError


class AlwaysHeld(Lease):
    """SQLite: one process owns the file, so it is always the active one."""

    def __init__(self, holder: str) -> None:
        self.holder = holder

    def try_acquire(self) -> bool:
        return True

    def holds(self, conn: Connection) -> bool:
        return True

    def release(self) -> None:
        return None


class LeaderLease(Lease):
    """The lease row on PostgreSQL. ``ttl_s``: how long a renewal holds without the next one."""

    def __init__(self, engine: Engine, holder: str, ttl_s: float) -> None:
        self._engine = engine
        self.holder = holder
        self.ttl_s = ttl_s
        self._params = {"name": _LEASE_NAME, "holder": holder}

    def try_acquire(self) -> bool:
        """Renew the lease if held, take it if it expired; whether it is held now. ``StorageError`` if
        the database cannot be asked (the caller decides how long a holder may go on without it)."""
        try:
            with self._engine.begin() as conn:
                row = conn.execute(_ACQUIRE, {**self._params, "ttl": self.ttl_s}).first()
        except SQLAlchemyError as exc:
            raise StorageError(f"leader lease: {_brief(exc)}") from exc
        return row is not None

    def holds(self, conn: Connection) -> bool:
        return conn.execute(_HOLDS, self._params).first() is not None

    def release(self) -> None:
        """Let the lease expire now, so a standby takes over at its next try instead of after ``ttl``."""
        try:
            with self._engine.begin() as conn:
                conn.execute(_RELEASE, self._params)
        except SQLAlchemyError as exc:
            log.warning("could not release the lease; it expires by itself", extra={"error": _brief(exc)})

    def current_holder(self) -> str | None:
        """Who holds an unexpired lease now (None: nobody); for logs and operators."""
        query = sa.text(
            "SELECT holder FROM prewarm_scheduler_lease WHERE name = :name AND expires_at > now()"
        )
        with self._engine.connect() as conn:
            return conn.execute(query, {"name": _LEASE_NAME}).scalar()


class LeaseKeeper:
    """Tries the lease every ``renew_s`` in a daemon thread and says when it is won or lost.

    ``on_acquired`` runs (on the keeper's thread) once the lease is won; if it raises, the lease is given
    back and tried again at the next round. ``on_lost`` runs when a renewal finds another holder, or when
    the database has not confirmed the lease for longer than it can be trusted: ``ttl - renew`` after
    the last renewal was sent (the database counts its ``ttl`` from a moment after that), which leaves
    one renewal period of margin before a standby may take over.
    """

    def __init__(
        self,
        lease: Lease,
        *,
        ttl_s: float,
        renew_s: float,
        on_acquired: Callable[[], None],
        on_lost: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease = lease
        self._ttl_s = ttl_s
        self._renew_s = renew_s
        self._on_acquired = on_acquired
        self._on_lost = on_lost
        self._clock = clock
        self._held = False
        self._trusted_until = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prewarm-lease", daemon=True)
        self.error: str | None = None
        """The last reason the lease could not be asked for (None once a try succeeds)."""

    @property
    def held(self) -> bool:
        return self._held

    def start(self) -> LeaseKeeper:
        """One try at once (a lone replica is active when ``start`` returns), then the thread."""
        self._round()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop trying; the lease is *not* released here (the caller releases it after its last publish)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._renew_s + 10.0)

    def _run(self) -> None:
        while not self._stop.wait(self._renew_s):
            self._round()

    def _round(self) -> None:
        sent = self._clock()
        try:
            held = self.lease.try_acquire()
        except StorageError as exc:
            self.error = str(exc)
            if self._held and self._clock() > self._trusted_until:
                log.error("leader lease unconfirmed for too long; standing by", extra={"error": self.error})
                self._lose()
            return
        self.error = None
        if held:
            self._trusted_until = sent + self._ttl_s - self._renew_s
            if not self._held:
                self._win()
        elif self._held:
            log.warning("leader lease taken by another replica; standing by")
            self._lose()

    def _win(self) -> None:
        log.info("leader lease acquired: this replica is active", extra={"replica": self.lease.holder})
        self._held = True
        try:
            self._on_acquired()
        except Exception as exc:  # whatever failed, a half-active holder must not keep the lease
            log.error(
                "taking over failed; giving the lease back",
                extra={"error": f"{type(exc).__name__}: {exc}"[:300]},
            )
            self._lose()
            self.lease.release()

    def _lose(self) -> None:
        self._held = False
        self._on_lost()


def _brief(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
