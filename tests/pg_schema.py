"""A PostgreSQL schema of one test's own on the local stack's database.

Scheduler replicas share one lease row and one job table per database; a test that runs replicas gets a
schema nobody else uses (``search_path`` in the URL), so neither a parallel run nor a replica killed by
another test can hold its lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

__all__ = ["private_schema"]


@contextmanager
def private_schema(postgres_url: str, name: str) -> Iterator[str]:
    """Create schema ``name``, yield a URL whose unqualified tables live in it, drop it afterwards."""
    admin = sa.create_engine(postgres_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{name}"'))
    joiner = "&" if "?" in postgres_url else "?"
    try:
        yield f"{postgres_url}{joiner}options=-csearch_path%3D{name}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()
