"""A seasonal synthetic request log: the demand patterns a multi-model platform actually sees.

Each model belongs to one pattern family (``FAMILIES``):

- ``diurnal``: busy, daily cycle peaking in the afternoon, quieter weekends;
- ``cron_daily``: a batch job firing at a fixed time of day (half of them 09:00), often weekdays only;
- ``cron_hourly``: a job firing at a fixed minute of every hour, sometimes only in working hours;
- ``sparse``: long tail, a few requests a day, mildly diurnal;
- ``bursty``: sessions of intense use that start at random, more often in working hours;
- ``launch``: nothing, then a diurnal pattern from a launch time somewhere in the middle;
- ``deprecation``: a diurnal pattern that stops somewhere in the middle.

A per-minute rate is drawn per model, counts are Poisson draws from it, and each event gets a uniform
offset inside its minute. Every model has its own random stream (``(seed, index)``), so a model's series
does not change when more models are generated; the whole thing is numpy-vectorised per model, so
1000 models × 14 days takes a few seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

__all__ = ["DEFAULT_START", "FAMILIES", "SyntheticTrace", "generate", "minute_counts"]

DEFAULT_START = 1704067200.0  # 2024-01-01T00:00:00Z, a Monday
FAMILIES = ("diurnal", "cron_daily", "cron_hourly", "sparse", "bursty", "launch", "deprecation")
# Share of each family beyond the first len(FAMILIES) models (which get one of each).
_WEIGHTS = np.array([0.30, 0.10, 0.10, 0.22, 0.14, 0.07, 0.07])
_DAY_MIN = 1440


@dataclass(frozen=True)
class SyntheticTrace:
    """Generated events plus the ground truth a benchmark needs.

    ``events``: ``timestamp`` (float epoch s) and ``model`` (categorical of the model ids), sorted by
    time. ``counts[i, m]`` is the number of events of ``models[i]`` in minute ``m`` (from ``start``);
    """

    events: pd.DataFrame
    families: dict[str, str]
    models: list[str]
    start: float
    counts: npt.NDArray[np.int32]

    @property
    def minutes(self) -> int:
        return int(self.counts.shape[1])

    def minute_frame(self) -> pd.DataFrame:
        """Per-minute counts as the demand store's ``bulk`` returns them: index epoch s, column per model."""
        index = (self.start + 60.0 * np.arange(self.minutes)).astype(np.int64)
        return pd.DataFrame(self.counts.T, index=index, columns=self.models)


def generate(
    models: int, days: float, *, seed: int = 0, start: float = DEFAULT_START, only: range | None = None
) -> SyntheticTrace:
    """Generate ``models`` models over ``days`` days starting at ``start`` (epoch s), deterministically.

    ``only``: generate just these rows of that trace (model ``i`` is the same whichever rows are asked
    for), so a benchmark can produce thousands of series a chunk at a time."""
    ids, families = _ids_and_families(models, seed)
    n_min = _minutes(days)
    rows = range(models) if only is None else range(models)[only.start : only.stop : only.step]
    counts = np.zeros((len(rows), n_min), dtype=np.int32)
    stamps: list[npt.NDArray[np.float64]] = []
    codes: list[npt.NDArray[np.int32]] = []
    for i, row, rng in _rows(families, n_min, seed, start, rows):
        counts[i] = row
        minute = np.repeat(np.arange(n_min), row)
        stamps.append(start + 60.0 * (minute + rng.random(minute.size)))
        codes.append(np.full(minute.size, i, dtype=np.int32))
    ids, families = [ids[r] for r in rows], [families[r] for r in rows]
    ts = np.concatenate(stamps) if stamps else np.zeros(0)
    cd = np.concatenate(codes) if codes else np.zeros(0, dtype=np.int32)
    order = np.argsort(ts, kind="stable")
    events = pd.DataFrame(
        {
            "timestamp": ts[order],
            "model": pd.Categorical.from_codes(cd[order], categories=pd.Index(ids, dtype=object)),
        }
    )
    return SyntheticTrace(
        events=events,
        families=dict(zip(ids, families, strict=True)),
        models=ids,
        start=float(start),
        counts=counts,
    )


def minute_counts(
    models: int, days: float, *, seed: int = 0, start: float = DEFAULT_START
) -> Iterator[tuple[str, npt.NDArray[np.int64]]]:
    """``(model id, per-minute counts)`` one model at a time, the same series ``generate`` makes,
    without the events: for store-size benchmarks at scales whose events would not fit in memory."""
    ids, families = _ids_and_families(models, seed)
    for i, row, _rng in _rows(families, _minutes(days), seed, start):
        yield ids[i], row


def _minutes(days: float) -> int:
    if days <= 0:
        raise ValueError("days must be > 0")
    return round(days * _DAY_MIN)


def _ids_and_families(models: int, seed: int) -> tuple[list[str], list[str]]:
    if models < 0:
        raise ValueError("models must be >= 0")
    width = max(4, len(str(max(models - 1, 0))))
    ids = [f"syn-{i:0{width}d}" for i in range(models)]
    assign = np.random.default_rng([seed, 1_000_003])
    families = [
        FAMILIES[i] if i < len(FAMILIES) else FAMILIES[int(assign.choice(len(FAMILIES), p=_WEIGHTS))]
        for i in range(models)
    ]
    return ids, families


def _rows(
    families: list[str], n_min: int, seed: int, start: float, rows: range | None = None
) -> Iterator[tuple[int, npt.NDArray[np.int64], np.random.Generator]]:
    """Each model's Poisson counts (of ``rows``, by default all), drawn from its own stream ``(seed,
    index)``, with its position among ``rows``; the stream is handed on, so ``generate`` draws the
    events' offsets from it next, as it always has."""
    cal = _Calendar(start, n_min)
    for i, index in enumerate(range(len(families)) if rows is None else rows):
        rng = np.random.default_rng([seed, index])
        rate = _RATE[families[index]](rng, cal)
        yield i, rng.poisson(rate), rng


class _Calendar:
    """Calendar features of every minute, shared by all models."""

    def __init__(self, start: float, n_min: int) -> None:
        seconds = start + 60.0 * np.arange(n_min)
        days = np.floor(seconds / 86400.0).astype(np.int64)
        self.n = n_min
        self.minute_of_day = ((seconds - days * 86400.0) // 60).astype(np.int64)
        self.weekday = (days + 3) % 7  # 1970-01-01 was a Thursday; 0 = Monday
        self.day = days - days[0] if n_min else days
        self.weekend = self.weekday >= 5

    def daily_shape(self, peak_minute: float, sharpness: float) -> npt.NDArray[np.float64]:
        """A von-Mises-like daily bump with mean 1 over the day."""
        angle = 2 * np.pi * (self.minute_of_day - peak_minute) / _DAY_MIN
        shape = np.exp(sharpness * np.cos(angle))
        norm = np.exp(sharpness * np.cos(2 * np.pi * np.arange(_DAY_MIN) / _DAY_MIN)).mean()
        return np.asarray(shape / norm, dtype=np.float64)


def _diurnal(rng: np.random.Generator, cal: _Calendar) -> npt.NDArray[np.float64]:
    level = float(np.exp(rng.normal(np.log(0.4), 1.0)))  # mean requests per minute
    shape = cal.daily_shape(peak_minute=rng.uniform(11, 16) * 60, sharpness=rng.uniform(1.5, 3.0))
    weekend = rng.uniform(0.2, 0.7)
    day_noise = np.exp(rng.normal(0.0, 0.1, size=int(cal.day.max()) + 1 if cal.n else 1))
    rate = level * shape * np.where(cal.weekend, weekend, 1.0) * day_noise[cal.day]
    return np.asarray(rate, dtype=np.float64)


def _cron_daily(rng: np.random.Generator, cal: _Calendar) -> npt.NDArray[np.float64]:
    minute = 9 * 60 if rng.random() < 0.5 else int(rng.integers(0, 24)) * 60 + int(rng.choice([0, 15, 30]))
    weekdays_only = rng.random() < 0.7
    size = rng.uniform(5, 30)
    rate = np.full(cal.n, 2e-4)
    on = ~cal.weekend if weekdays_only else np.ones(cal.n, dtype=bool)
    for offset, share in ((0, 1.0), (1, 0.3), (2, 0.1)):
        rate[(cal.minute_of_day == (minute + offset) % _DAY_MIN) & on] += size * share
    return rate


def _cron_hourly(rng: np.random.Generator, cal: _Calendar) -> npt.NDArray[np.float64]:
    minute = int(rng.integers(0, 60))
    size = rng.uniform(1.5, 8)
    hours = cal.minute_of_day // 60
    working_only = rng.random() < 0.5
    on = (hours >= 8) & (hours < 20) if working_only else np.ones(cal.n, dtype=bool)
    rate = np.full(cal.n, 2e-4)
    rate[(cal.minute_of_day % 60 == minute) & on] += size
    return rate


def _sparse(rng: np.random.Generator, cal: _Calendar) -> npt.NDArray[np.float64]:
    per_day = rng.uniform(1, 8)
    shape = cal.daily_shape(peak_minute=rng.uniform(10, 17) * 60, sharpness=rng.uniform(0.5, 1.5))
    return per_day / _DAY_MIN * shape


def _bursty(rng: np.random.Generator, cal: _Calendar) -> npt.NDArray[np.float64]:
    sessions_per_day = rng.uniform(2, 10)
    shape = cal.daily_shape(peak_minute=rng.uniform(10, 16) * 60, sharpness=1.5)
    starts = np.flatnonzero(rng.poisson(sessions_per_day / _DAY_MIN * shape))
    lengths = np.maximum(1, rng.exponential(rng.uniform(8, 30), size=starts.size)).astype(np.int64)
    intensity = rng.uniform(0.5, 3.0, size=starts.size)
    # Add each session as +intensity at its start and -intensity after its end, then integrate.
    diff = np.zeros(cal.n + 1)
    np.add.at(diff, starts, intensity)
    np.add.at(diff, np.minimum(starts + lengths, cal.n), -intensity)
    return np.maximum(np.cumsum(diff[:-1]), 0.0) + 1e-4


def _switch_minute(rng: np.random.Generator, cal: _Calendar) -> int:
    return int(rng.uniform(0.3, 0.7) * cal.n)


def _launch(rng: np.random.Generator, cal: _Calendar) -> npt.NDArray[np.float64]:
    at = _switch_minute(rng, cal)
    base = _diurnal(rng, cal)
    # Adoption ramps up over about a day after the launch.
    ramp = np.clip((np.arange(cal.n) - at) / _DAY_MIN, 0.0, 1.0)
    return base * ramp


def _deprecation(rng: np.random.Generator, cal: _Calendar) -> npt.NDArray[np.float64]:
    at = _switch_minute(rng, cal)
    base = _diurnal(rng, cal)
    return np.where(np.arange(cal.n) < at, base, 0.0)


_RATE = {
    "diurnal": _diurnal,
    "cron_daily": _cron_daily,
    "cron_hourly": _cron_hourly,
    "sparse": _sparse,
    "bursty": _bursty,
    "launch": _launch,
    "deprecation": _deprecation,
}
