"""Hints for a simulation, from the design's hints CSV: ``timestamp,model,ttl_s``.

Each row is a hint received at ``timestamp`` (epoch seconds or ISO-8601, UTC when it names no zone)
that ``model`` will be wanted from then for ``ttl_s`` seconds, as a product page would send it.
"""

from __future__ import annotations

import csv
from pathlib import Path

from pydantic import ValidationError

from prewarm import Hint, InvalidInput, epoch_seconds

__all__ = ["read_hints"]

_COLUMNS = ("timestamp", "model", "ttl_s")


def read_hints(path: str | Path) -> tuple[Hint, ...]:
    """The hints of a CSV file, in file order. A missing column or a bad row is ``InvalidInput`` naming
    the line. Which models the hints are for is the caller's to check against its catalog: a hint for a
    model it lacks is not malformed (``sim run`` leaves it out and says so, as it does a request)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read hints file {path}: {exc.strerror}", reason="file") from exc
    rows = csv.reader(text.splitlines())
    header = [c.strip() for c in next(rows, [])]
    missing = [c for c in _COLUMNS if c not in header]
    if missing:
        raise InvalidInput(
            f"{path}: header must contain 'timestamp,model,ttl_s', missing {missing}", reason="header"
        )
    where = {c: header.index(c) for c in _COLUMNS}
    hints: list[Hint] = []
    for line, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) < len(header):
            raise InvalidInput(f"{path}: line {line}: expected {len(header)} columns", reason="row")
        cell = {c: row[i].strip() for c, i in where.items()}
        try:
            at = epoch_seconds(cell["timestamp"])
        except ValueError as exc:
            raise InvalidInput(f"{path}: line {line}, column timestamp: {exc}", reason="row") from None
        try:
            hints.append(Hint(model=cell["model"], ttl_s=cell["ttl_s"], received_at=at, source="hints-csv"))
        except ValidationError as exc:
            first = exc.errors()[0]
            column = ".".join(str(p) for p in first["loc"]) or "row"
            raise InvalidInput(
                f"{path}: line {line}, column {column}: {first['msg']}", reason="row"
            ) from None
    return tuple(hints)
