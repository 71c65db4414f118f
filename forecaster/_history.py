"""Per-minute demand history as one dense matrix: the only input every family fits on.

``History.counts[i, t]`` is the number of requests of ``models[i]`` in minute ``t`` after ``start``
(epoch seconds, a whole minute); ``NaN`` marks minutes with no data (a gap), which is not the same as
zero requests. Families work on this matrix, vectorised over models where they can.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt
import pandas as pd

from forecaster._calendar import DAY_MIN
from prewarm import InvalidInput

__all__ = ["History"]

MAX_CELLS = 1 << 28
"""Most models × minutes one dense history holds (2 GiB of float64: 1,000 models over 186 days)."""


def _utc(epoch: float) -> str:
    """An epoch as a UTC date, or as the number when no calendar date has it."""
    try:
        return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, OSError, ValueError):
        return f"epoch {epoch:.0f} s"


@dataclass(frozen=True)
class History:
    models: list[str]
    start: int
    counts: npt.NDArray[np.float64]

    def __post_init__(self) -> None:
        if self.counts.ndim != 2 or self.counts.shape[0] != len(self.models):
            raise ValueError("counts must be (len(models), minutes)")
        if self.start % 60:
            raise ValueError("start must be a whole minute")

    @property
    def minutes(self) -> int:
        return int(self.counts.shape[1])

    @property
    def end(self) -> int:
        """Epoch seconds just after the last minute."""
        return self.start + 60 * self.minutes

    def timestamps(self) -> npt.NDArray[np.int64]:
        return self.start + 60 * np.arange(self.minutes, dtype=np.int64)

    def split(self, at: float) -> tuple[History, History]:
        """The minutes before ``at`` and those from ``at`` on."""
        cut = int(np.clip(np.ceil((at - self.start) / 60.0), 0, self.minutes))
        head = History(self.models, self.start, self.counts[:, :cut])
        tail = History(self.models, self.start + 60 * cut, self.counts[:, cut:])
        return head, tail

    def select(self, rows: npt.NDArray[np.int64] | Sequence[int]) -> History:
        idx = np.asarray(rows, dtype=np.int64)
        return History([self.models[i] for i in idx], self.start, self.counts[idx])

    def by_day(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """``(n, days, 1440)`` counts on whole UTC days (NaN padding outside), and each day's weekday."""
        lead = (self.start // 60) % DAY_MIN
        total = lead + self.minutes
        days = max(1, -(-total // DAY_MIN))
        padded = np.full((len(self.models), days * DAY_MIN), np.nan)
        padded[:, lead : lead + self.minutes] = self.counts
        first_day = (self.start // 60) // DAY_MIN
        weekday = (first_day + np.arange(days) + 3) % 7
        return padded.reshape(len(self.models), days, DAY_MIN), weekday.astype(np.int64)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, step: int = 60) -> History:
        """From ``DemandStore.bulk`` output: index epoch seconds on a ``step`` grid, a column per model."""
        if step != 60:
            raise InvalidInput("the forecaster fits per-minute history (step=60)", reason="step")
        models = [str(c) for c in frame.columns]
        if frame.empty or len(frame.index) == 0:
            return cls(models, 0, np.zeros((len(models), 0)))
        index = np.asarray(frame.index, dtype=np.int64)
        start = int(index.min() // 60 * 60)
        span = int((index.max() - start) // 60) + 1
        counts = np.full((len(models), span), np.nan)
        pos = (index - start) // 60
        values = frame.to_numpy(dtype=np.float64, na_value=np.nan).T
        counts[:, pos] = values
        return cls(models, start, counts)

    @classmethod
    def from_events(
        cls, events: pd.DataFrame, *, start: float | None = None, end: float | None = None
    ) -> History:
        """Count ``timestamp``/``model`` events per minute (a trace file or the synthetic generator)."""
        ts = events["timestamp"].to_numpy(dtype=np.float64)
        model_col = events["model"]
        if isinstance(model_col.dtype, pd.CategoricalDtype):
            models = [str(c) for c in model_col.cat.categories]
            codes = model_col.cat.codes.to_numpy().astype(np.int64)
        else:
            codes_raw, uniques = pd.factorize(model_col.astype(str), sort=True)
            models, codes = [str(u) for u in uniques], codes_raw.astype(np.int64)
        if start is None:
            start = float(np.floor(ts.min() / 60.0) * 60.0) if ts.size else 0.0
        first = int(np.floor(start / 60.0)) * 60
        last = float(end) if end is not None else (float(ts.max()) + 1.0 if ts.size else float(first))
        span = max(0, int(np.ceil((last - first) / 60.0)))
        if len(models) * span > MAX_CELLS:
            raise InvalidInput(
                f"{len(models):,} models over {span / DAY_MIN:,.0f} days of minutes "
                f"({_utc(first)} to {_utc(last)}) exceed the per-minute history's "
                f"{MAX_CELLS:,} cells: is a timestamp far from the others (milliseconds, a wrong year)?",
                reason="span",
            )
        minute = np.floor((ts - first) / 60.0).astype(np.int64)
        keep = (minute >= 0) & (minute < span)
        flat = codes[keep] * span + minute[keep]
        counts = np.bincount(flat, minlength=len(models) * span).astype(np.float64)
        return cls(models, first, counts.reshape(len(models), span))
