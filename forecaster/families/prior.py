"""A prior for a model too new to fit: the median daily/weekly shape of similar models, at its own rate.

"Similar" is chosen at selection time (models of comparable volume); the saved parameters are the shape
itself (half-hour resolution, mean 1) and the rate, so a prior never depends on another model's entry.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from forecaster._calendar import WEEK_MIN
from forecaster._codec import decode_array, encode_array
from forecaster._history import History
from forecaster.families._base import Failure, Family, Params
from forecaster.families._bucketed import BUCKET

__all__ = ["SLOTS", "Prior", "prior_params", "prior_params_from_slots", "slot_means"]

SLOTS = WEEK_MIN // BUCKET
"""Half-hour slots of a week: the resolution of a prior's shape."""


def slot_means(week: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """A week table (``(..., 10080)``) at half-hour resolution: the mean of each slot."""
    return np.asarray(week.reshape(*week.shape[:-1], -1, BUCKET).mean(axis=-1), dtype=np.float64)


def prior_params(rate: float, tables: npt.NDArray[np.float64]) -> Params:
    """Parameters from the week tables (``(k, 10080)``) of the similar models and the model's own rate."""
    return prior_params_from_slots(
        rate, slot_means(tables) if tables.size else np.zeros((0, WEEK_MIN // BUCKET))
    )


def prior_params_from_slots(rate: float, per_slot: npt.NDArray[np.float64]) -> Params:
    """``prior_params`` from the similar models' tables already at half-hour resolution (``(k, 336)``)."""
    if per_slot.size:
        means = per_slot.mean(axis=1, keepdims=True)
        shapes = per_slot[means[:, 0] > 0] / means[means[:, 0] > 0]
        shape = np.median(shapes, axis=0) if shapes.size else np.ones(WEEK_MIN // BUCKET)
    else:
        shape = np.ones(WEEK_MIN // BUCKET)
    shape = shape / max(float(shape.mean()), 1e-12)
    return {"rate": float(max(rate, 0.0)), "shape30": encode_array(shape)}


class Prior(Family):
    alias = "prior"

    def fit(self, history: History) -> list[Params | Failure]:
        # A prior is built from other models (see ``prior_params``); fitting it alone means "no peers".
        with np.errstate(invalid="ignore"):
            rates = np.nan_to_num(np.nanmean(history.counts, axis=1)) if history.minutes else np.zeros(0)
        return [prior_params(float(r), np.zeros((0, WEEK_MIN))) for r in rates]

    def week(self, params: Params) -> npt.NDArray[np.float64]:
        return np.repeat(decode_array(params["shape30"]), BUCKET) * max(0.0, float(params["rate"]))
