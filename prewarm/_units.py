"""Byte sizes and rates written for people: ``80GB``, ``2GiB``, ``3.5GB/s``."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, NonNegativeInt

__all__ = ["ByteRate", "Bytes", "format_bytes", "parse_byte_rate", "parse_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_bytes(value: Any) -> int:
    """``"64MB"`` → 64000000, ``"2GiB"`` → 2147483648; ints pass through. Raises ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '80GB'")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"a size in bytes must be whole, got {value}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError("a size must be a number of bytes or a string like '80GB'")
    match = _SIZE.fullmatch(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"cannot read {value!r} as a size (examples: 1048576, '64MB', '2GiB')")
    size = float(match.group(1)) * _UNITS[unit]
    if not size.is_integer() and _UNITS[unit] == 1:
        raise ValueError(f"a size in bytes must be whole, got {value!r}")
    return int(size)


def parse_byte_rate(value: Any) -> float:
    """``"3.5GB/s"`` → 3.5e9 bytes per second; numbers pass through."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lower().endswith("/s"):
            text = text[:-2]
        return float(parse_bytes(text))
    raise ValueError("a rate must be bytes per second or a string like '3.5GB/s'")


def format_bytes(n: float) -> str:
    """Human-readable binary size, for logs and tables."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


Bytes = Annotated[NonNegativeInt, BeforeValidator(parse_bytes)]
ByteRate = Annotated[float, BeforeValidator(parse_byte_rate)]
