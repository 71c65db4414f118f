"""Hints in the job store's database, so that a hint outlives the replica that accepted it.

Every replica writes the hints it accepts here *before* answering 2xx; the active replica plans them.
Every replica follows the table (``HintFollower``, every ``hint_poll_s``): the active one plans what
the others accepted, and a standby knows every live hint the moment it takes over.

New rows are found by ``stored_at``, the database's clock at insert, not by the row number: row numbers
are handed out when an insert starts and can become visible out of order, so a reader that only looked
past the highest number it had seen could skip a row forever. Each poll re-reads a window of
``_OVERLAP_S`` before its previous one and drops rows it has seen, which covers any insert still
committing when the previous poll ran.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from prewarm import Hint, StorageError, get_logger

__all__ = ["HINTS_TABLE", "HintFollower", "HintStore"]

log = get_logger(__name__)

_METADATA = sa.MetaData()
# BIGINT on PostgreSQL; SQLite only makes an INTEGER PRIMARY KEY its row id (autoincrement).
_ROW_NUMBER = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
HINTS_TABLE = sa.Table(
    "prewarm_scheduler_hints",
    _METADATA,
    sa.Column("seq", _ROW_NUMBER, primary_key=True, autoincrement=True),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("source", sa.String(256), nullable=False),
    sa.Column("received_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False, index=True),
    sa.Column("body", sa.Text, nullable=False),
    # The database's clock, not the replica's: see the module docstring.
    sa.Column(
        "stored_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False, index=True
    ),
)
_OVERLAP_S = 5.0


@dataclass(frozen=True)
class _Stored:
    seq: int
    stored_at: datetime
    hint: Hint


class HintStore:
    """The hints table. Errors come out as ``StorageError``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.table = HINTS_TABLE

    def add(self, hint: Hint, now: float) -> None:
        """Store a stamped hint (committed when this returns)."""
        if hint.received_at is None:
            raise ValueError("only a hint stamped with received_at is stored")
        row = {
            "model": hint.model,
            "source": hint.source,
            "received_at": hint.received_at,
            "expires_at": hint.expires_at(now),
            "body": hint.model_dump_json(),
        }
        try:
            with self._engine.begin() as conn:
                conn.execute(sa.insert(self.table).values(row))
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot store a hint for {hint.model!r}: {_brief(exc)}") from exc

    def live(self, now: float) -> list[Hint]:
        """Every stored hint whose window has not passed, oldest first."""
        t = self.table
        query = sa.select(t.c.body).where(t.c.expires_at > now).order_by(t.c.seq)
        try:
            with self._engine.connect() as conn:
                return _parse(row.body for row in conn.execute(query))
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot read the stored hints: {_brief(exc)}") from exc

    def since(self, after: datetime | None, now: float) -> tuple[list[_Stored], datetime]:
        """Live hints stored at or after ``after`` (all live ones if None), and the database time to
        pass as ``after`` next time (already moved back by the overlap)."""
        t = self.table
        query = sa.select(t.c.seq, t.c.stored_at, t.c.body).where(t.c.expires_at > now).order_by(t.c.seq)
        if after is not None:
            query = query.where(t.c.stored_at >= after)
        try:
            with self._engine.connect() as conn:
                # Asked before the rows: a row committed after this moment is found by the next poll.
                db_now: datetime = conn.execute(sa.select(sa.func.now())).scalar_one()
                rows = list(conn.execute(query))
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot read new hints: {_brief(exc)}") from exc
        found = [_Stored(int(r.seq), r.stored_at, hint) for r in rows for hint in _parse([r.body])]
        return found, db_now - timedelta(seconds=_OVERLAP_S)

    def prune(self, now: float) -> int:
        """Delete hints whose window has passed; how many."""
        try:
            with self._engine.begin() as conn:
                return conn.execute(sa.delete(self.table).where(self.table.c.expires_at <= now)).rowcount
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot prune stored hints: {_brief(exc)}") from exc


class HintFollower:
    """Polls the hints table every ``poll_s`` in a daemon thread; hands each new hint to ``on_hints``
    once (a list per poll, only when there is something new)."""

    def __init__(
        self,
        store: HintStore,
        on_hints: Callable[[list[Hint]], None],
        *,
        poll_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._on_hints = on_hints
        self._poll_s = poll_s
        self._clock = clock
        self._after: datetime | None = None
        self._seen: dict[int, datetime] = {}  # row number -> when it was stored
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prewarm-hint-follower", daemon=True)
        self._failing = False

    def start(self) -> HintFollower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._poll_s + 10.0)

    def poll(self) -> list[Hint]:
        """One poll: the hints not handed out before (also handed to ``on_hints``)."""
        found, after = self._store.since(self._after, self._clock())
        fresh = [row.hint for row in found if row.seq not in self._seen]
        # A row stored before the next window cannot come back: only the rest is worth remembering.
        self._seen = {seq: at for seq, at in self._seen.items() if at >= after}
        self._seen.update({row.seq: row.stored_at for row in found if row.stored_at >= after})
        self._after = after
        if fresh:
            self._on_hints(fresh)
        return fresh

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.poll()
            except StorageError as exc:
                if not self._failing:  # once per outage, not once a second
                    log.warning("cannot follow the stored hints", extra={"error": str(exc)})
                self._failing = True
            else:
                if self._failing:
                    log.info("following the stored hints again")
                self._failing = False


def _parse(bodies: Iterable[str]) -> list[Hint]:
    hints: list[Hint] = []
    for body in bodies:
        try:
            hints.append(Hint.model_validate_json(body))
        except ValidationError as exc:
            log.warning("skipping a stored hint that does not parse", extra={"error": str(exc)[:200]})
    return hints


def _brief(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
