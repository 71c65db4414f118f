"""Times as files and command lines write them: epoch seconds, or ISO-8601 read as UTC when it names no
zone (trace files, hints files and the CLI's ``--start``/``--now`` alike)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

__all__ = ["MAX_EPOCH_S", "epoch_seconds", "iso_utc", "not_epoch_seconds"]

MAX_EPOCH_S = 1e11
"""Epoch seconds at or beyond this (the year 5138) are taken for milliseconds or microseconds: a
millisecond epoch of any date after 1973 is above it."""


def not_epoch_seconds(text: str) -> str:
    """What is wrong with ``text``, a number at or beyond ``MAX_EPOCH_S``."""
    return f"{text!r} is not epoch seconds of this era (milliseconds or microseconds?)"


def epoch_seconds(text: str) -> float:
    """Epoch seconds from a number or an ISO-8601 time; ``ValueError`` saying what is wrong otherwise."""
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"expected epoch seconds or ISO-8601, got {text!r}") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    if not math.isfinite(value):
        raise ValueError(f"expected epoch seconds or ISO-8601, got {text!r}")
    if abs(value) >= MAX_EPOCH_S:
        raise ValueError(not_epoch_seconds(text))
    return value


def iso_utc(t: float) -> str:
    """Epoch seconds as ISO-8601 in UTC to the second (``2024-03-11T04:41:00Z``), as an operator reads
    them in a report or an order's note; ``epoch_seconds`` reads them back."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
