"""The one interface every forecast family implements, in the manner of statsforecast.

A family has an ``alias``, a ``fit`` over a whole ``History`` (vectorised over models where the method
allows; a per-series method loops inside) returning JSON-able parameters per model, and ``week`` which
compiles one model's parameters into its week table: expected requests per minute for each of the
10080 minutes of a UTC week. Prediction is the same for every family, so it lives in the bundle: one
gather from all the models' week tables (``ForecasterBundle.predict``).

Families are fitted on what happened *before* the forecast origin and forecast a weekly-periodic
future; the daily retrain is what moves them along (a launch or a deprecation shows up at the next
retrain, weighted by recency).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from forecaster._calendar import DAY_MIN, WEEK_MIN
from forecaster._history import History

__all__ = ["Failure", "Family", "Params", "recency_weights"]

Params = dict[str, Any]


@dataclass(frozen=True)
class Failure:
    """A family could not be fitted to one series; ``reason`` ends up in the log and the model's metadata."""

    reason: str


class Family(ABC):
    alias: str  # a class attribute, or set per instance when one class serves several aliases
    version: ClassVar[int] = 1

    def eligible(self, history: History, share: float = 1.0) -> npt.NDArray[np.bool_]:
        """Which series this family is worth fitting on (expensive families restrict themselves).

        ``share``: the part of the whole retrain that ``history`` is (a chunk of the models), so a cap
        meant per retrain is split among the chunks in proportion to their size."""
        return np.ones(len(history.models), dtype=bool)

    @abstractmethod
    def fit(self, history: History) -> list[Params | Failure]:
        """Parameters per model of ``history`` (same order), or a ``Failure`` saying why not."""

    @abstractmethod
    def week(self, params: Params) -> npt.NDArray[np.float64]:
        """Expected requests per minute for each minute of the UTC week (shape ``(10080,)``)."""


def recency_weights(minutes: int, half_life_days: float) -> npt.NDArray[np.float64]:
    """Weight of each of the last ``minutes`` minutes: halves every ``half_life_days`` into the past."""
    age = (minutes - 1 - np.arange(minutes)) / (half_life_days * DAY_MIN)
    return np.asarray(np.power(0.5, age), dtype=np.float64)


def tile_days(profile: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """A per-day profile (1440,) or per-weekday profile (7, 1440) as a flat week table."""
    out = np.broadcast_to(profile, (7, DAY_MIN)) if profile.ndim == 1 else profile
    return np.ascontiguousarray(out, dtype=np.float64).reshape(WEEK_MIN)


def circular_smooth(profile: npt.NDArray[np.float64], radius: int) -> npt.NDArray[np.float64]:
    """Box-smooth along the last axis, wrapping around midnight."""
    if radius <= 0:
        return profile
    width = 2 * radius + 1
    padded = np.concatenate([profile[..., -radius:], profile, profile[..., :radius]], axis=-1)
    csum = np.cumsum(padded, axis=-1)
    csum = np.concatenate([np.zeros((*csum.shape[:-1], 1)), csum], axis=-1)
    return np.asarray((csum[..., width:] - csum[..., :-width]) / width, dtype=np.float64)
