"""Versioned JSON for fitted parameters: numbers and base64 float32 arrays, never pickles.

Saved state carries ``"version"``; a reader refuses versions it does not know (``ForecastError``) rather
than guessing what an old or newer layout meant.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import numpy.typing as npt

from prewarm import ForecastError

__all__ = ["check_version", "decode_array", "encode_array"]


def encode_array(values: npt.ArrayLike) -> dict[str, Any]:
    """A float array as JSON: float32 little-endian bytes in base64 plus its shape."""
    array = np.ascontiguousarray(np.asarray(values, dtype="<f4"))
    return {"dtype": "float32", "shape": list(array.shape), "b64": base64.b64encode(array.tobytes()).decode()}


def decode_array(payload: Any) -> npt.NDArray[np.float64]:
    """Inverse of ``encode_array``; raises ``ForecastError`` for anything else."""
    try:
        if payload.get("dtype") != "float32":
            raise ValueError(f"dtype {payload.get('dtype')!r}")
        shape = tuple(int(s) for s in payload["shape"])
        raw = base64.b64decode(payload["b64"], validate=True)
        array = np.frombuffer(raw, dtype="<f4").reshape(shape)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ForecastError(f"malformed encoded array: {exc}") from exc
    return array.astype(np.float64)


def check_version(payload: dict[str, Any], supported: int, what: str) -> None:
    version = payload.get("version")
    if version != supported:
        raise ForecastError(
            f"{what}: saved version {version!r} is not supported (this code reads {supported})"
        )
