"""Times as files and command lines write them: epoch seconds, or ISO-8601 read as UTC when it names no
zone (trace files, hints files and the CLI's ``--start``/``--now`` alike)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

__all__ = ["MAX_EPOCH_S", "epoch_seconds", "not_epoch_seconds"]

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
