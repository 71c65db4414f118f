"""A small generator of long-tail request traces: the patterns whose cold starts a seasonal table misses.

Each model follows one *kind* of pattern, drawn with its own parameters:

- ``busy``: a diurnal Poisson process of 0.5-8 requests a minute (the head of the popularity curve);
- ``timer``: a timer every 7-110 minutes whose period does not divide the day, a few seconds of jitter,
  now and then a missed firing — only the time since the last request says when the next one comes;
- ``cron``: a timer every 15, 20 or 30 minutes on the clock (the seasonal table can learn it);
- ``weekday``: a job each weekday at a fixed hour, a few minutes of jitter, one to three requests;
- ``poisson``: a memoryless process of 0.2-20 requests an hour, flat; ``poisson_diurnal`` the same with
  a daily cycle — neither has idle-time structure beyond what its rate says;
- ``session``: sessions at a diurnal Poisson rate, each a burst of requests seconds to minutes apart;
- ``flash``: a rare Poisson model with a flash crowd of 20-50 × its rate for 2-4 hours on ``event_day``;
- ``deprecated``: a Poisson model that stops on ``event_day``; ``launch`` one that starts on it.

Deterministic for a seed. The traces start on a Monday (2024-01-01 UTC) so that day 5 is a Saturday.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

__all__ = ["KINDS", "MONDAY", "TailTrace", "tail_trace"]

MONDAY = 1704067200.0  # 2024-01-01T00:00Z
_DAY = 86400.0
# One cycle of kinds for 60 models: what a 60-model long-tail trace looks like (most models rare).
_MIX = (
    ("busy", 6),
    ("timer", 6),
    ("cron", 4),
    ("weekday", 6),
    ("poisson", 12),
    ("poisson_diurnal", 8),
    ("session", 8),
    ("flash", 4),
    ("deprecated", 3),
    ("launch", 3),
)
KINDS: tuple[str, ...] = tuple(k for k, _ in _MIX)


@dataclass(frozen=True)
class TailTrace:
    """Requests (``timestamps`` sorted, epoch seconds, and ``models``) and each model's pattern kind."""

    timestamps: npt.NDArray[np.float64]
    models: npt.NDArray[np.str_]
    kinds: dict[str, str]
    start: float
    days: float

    def frame(self) -> pd.DataFrame:
        """The trace as ``timestamp``/``model`` rows, the layout of a trace file."""
        return pd.DataFrame({"timestamp": self.timestamps, "model": self.models})


def tail_trace(models: int = 60, days: float = 7.0, *, seed: int = 0, event_day: float = 5.0) -> TailTrace:
    """``models`` models over ``days`` days, kinds in the proportions of ``_MIX`` (cycled)."""
    rng = np.random.default_rng(seed)
    cycle = [kind for kind, count in _MIX for _ in range(count)]
    # Interleave so that any prefix of the models has every kind early on.
    share = dict(_MIX)
    order = sorted(range(len(cycle)), key=lambda i: (cycle[:i].count(cycle[i]) / share[cycle[i]], i))
    kinds = [cycle[order[i % len(order)]] for i in range(models)]
    end = MONDAY + days * _DAY
    stamps: list[npt.NDArray[np.float64]] = []
    names: list[npt.NDArray[np.str_]] = []
    labels: dict[str, str] = {}
    for i, kind in enumerate(kinds):
        name = f"{kind}-{i:03d}"
        ts = _GENERATORS[kind](rng, MONDAY, end, MONDAY + event_day * _DAY)
        ts = np.sort(ts[(ts >= MONDAY) & (ts < end)])
        labels[name] = kind
        stamps.append(ts)
        names.append(np.full(ts.size, name))
    all_ts = np.concatenate(stamps) if stamps else np.zeros(0)
    all_names = np.concatenate(names) if names else np.zeros(0, dtype=np.str_)
    order_ts = np.argsort(all_ts, kind="stable")
    return TailTrace(all_ts[order_ts], all_names[order_ts], labels, MONDAY, days)


_Gen = Callable[[np.random.Generator, float, float, float], npt.NDArray[np.float64]]


def _poisson(
    rng: np.random.Generator,
    start: float,
    end: float,
    per_minute: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
) -> npt.NDArray[np.float64]:
    """An inhomogeneous Poisson process with a rate constant within each minute."""
    minutes = np.asarray(start + 60.0 * np.arange(int((end - start) // 60)), dtype=np.float64)
    counts = rng.poisson(np.maximum(per_minute(minutes), 0.0))
    return np.repeat(minutes, counts) + 60.0 * rng.random(int(counts.sum()))


def _diurnal(t: npt.NDArray[np.float64], peak_hour: float, depth: float) -> npt.NDArray[np.float64]:
    hour = (t % _DAY) / 3600.0
    return np.asarray(1.0 + depth * np.cos(2 * np.pi * (hour - peak_hour) / 24.0), dtype=np.float64)


def _busy(rng: np.random.Generator, start: float, end: float, _event: float) -> npt.NDArray[np.float64]:
    rate, peak = float(np.exp(rng.uniform(np.log(0.5), np.log(8.0)))), rng.uniform(10, 20)
    return _poisson(rng, start, end, lambda t: rate * _diurnal(t, peak, 0.6))


def _timer(rng: np.random.Generator, start: float, end: float, _event: float) -> npt.NDArray[np.float64]:
    period = 60.0 * float(rng.choice([7, 13, 25, 37, 50, 110]))
    fires = start + rng.uniform(0, period) + period * np.arange(int((end - start) // period) + 1)
    fires = fires + rng.normal(0.0, 5.0, fires.size)
    return fires[rng.random(fires.size) > 0.02]


def _cron(rng: np.random.Generator, start: float, end: float, _event: float) -> npt.NDArray[np.float64]:
    period = 60.0 * float(rng.choice([15, 20, 30]))
    fires = start + 60.0 * rng.integers(0, 5) + period * np.arange(int((end - start) // period) + 1)
    return fires + rng.uniform(0.0, 20.0, fires.size)


def _weekday(rng: np.random.Generator, start: float, end: float, _event: float) -> npt.NDArray[np.float64]:
    hour = float(rng.integers(6, 19))
    out: list[float] = []
    for day in range(int((end - start) // _DAY) + 1):
        if day % 7 >= 5:
            continue
        at = start + day * _DAY + hour * 3600.0 + rng.normal(0.0, 240.0)
        out += [at + 20.0 * k for k in range(int(rng.integers(1, 4)))]
    return np.asarray(out, dtype=np.float64)


def _flat_poisson(
    rng: np.random.Generator, start: float, end: float, _event: float
) -> npt.NDArray[np.float64]:
    rate = float(np.exp(rng.uniform(np.log(0.2), np.log(20.0)))) / 60.0
    return _poisson(rng, start, end, lambda t: np.full(t.size, rate))


def _diurnal_poisson(
    rng: np.random.Generator, start: float, end: float, _event: float
) -> npt.NDArray[np.float64]:
    rate, peak = float(np.exp(rng.uniform(np.log(0.5), np.log(20.0)))) / 60.0, rng.uniform(8, 22)
    return _poisson(rng, start, end, lambda t: rate * _diurnal(t, peak, 0.8))


def _session(rng: np.random.Generator, start: float, end: float, _event: float) -> npt.NDArray[np.float64]:
    per_day, peak = float(rng.uniform(3, 20)), rng.uniform(9, 18)
    starts = _poisson(rng, start, end, lambda t: per_day / 1440.0 * _diurnal(t, peak, 0.7))
    out: list[npt.NDArray[np.float64]] = []
    for s in starts:
        size = 1 + int(rng.geometric(1 / 6.0))
        out.append(s + np.cumsum(np.concatenate([[0.0], rng.exponential(45.0, size - 1)])))
    return np.concatenate(out) if out else np.zeros(0)


def _flash(rng: np.random.Generator, start: float, end: float, event: float) -> npt.NDArray[np.float64]:
    rate = float(rng.uniform(0.5, 3.0)) / 60.0
    begin = event + 3600.0 * rng.uniform(8, 16)
    length, factor = 3600.0 * rng.uniform(2, 4), float(rng.uniform(20, 50))
    return _poisson(
        rng, start, end, lambda t: rate * np.where((t >= begin) & (t < begin + length), factor, 1.0)
    )


def _deprecated(rng: np.random.Generator, start: float, end: float, event: float) -> npt.NDArray[np.float64]:
    rate, stop = float(rng.uniform(5, 60)) / 60.0, event + 3600.0 * rng.uniform(2, 14)
    return _poisson(rng, start, end, lambda t: np.where(t < stop, rate, 0.0))


def _launch(rng: np.random.Generator, start: float, end: float, event: float) -> npt.NDArray[np.float64]:
    rate, begin = float(rng.uniform(5, 30)) / 60.0, event + 3600.0 * rng.uniform(2, 14)
    return _poisson(rng, start, end, lambda t: np.where(t >= begin, rate * _diurnal(t, 14.0, 0.5), 0.0))


_GENERATORS: dict[str, _Gen] = {
    "busy": _busy,
    "timer": _timer,
    "cron": _cron,
    "weekday": _weekday,
    "poisson": _flat_poisson,
    "poisson_diurnal": _diurnal_poisson,
    "session": _session,
    "flash": _flash,
    "deprecated": _deprecated,
    "launch": _launch,
}
