"""Building blocks of the trace suite's generators: a minute clock, rate shapes, event sampling, model
sizes and the two clusters every case runs on.

Nothing here is borrowed from ``ingest.generate``: the suite exists to judge policies on traffic the
project's own generator did not shape, so its shapes (log-normal popularity, timers with jitter,
sessions, daily bumps that move, surges) are written out here, each in a few lines a reader can check.

Every random draw goes through the ``numpy.random.Generator`` a case passes in, so a case is a pure
function of its seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
import pandas as pd

from models import Catalog, ModelSpec
from prewarm import InvalidInput, gpu_placement
from scheduler import Cluster

__all__ = [
    "DAY",
    "GB",
    "SIZE_LADDER_GB",
    "Clock",
    "Events",
    "ModelTruth",
    "catalog_for",
    "daily_bumps",
    "diurnal",
    "fits_at_once",
    "fleet",
    "mixed_cluster",
    "normal_quantiles",
    "on_off",
    "ramp",
    "roomy_cluster",
    "tight_cluster",
    "weekend",
]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

DAY = 86_400.0
GB = 10**9
# FP16 weights of open models from 0.5B to 70B parameters: the suite's sizes span 140 ×, so a policy
# that weighs memory by what it costs has something to weigh.
SIZE_LADDER_GB = (1.0, 3.0, 7.0, 14.0, 16.0, 28.0, 40.0, 70.0, 140.0)
_BANDWIDTH = {"l3_bytes_per_s": "1GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"}


@dataclass(frozen=True)
class ModelTruth:
    """What a case's generator did with one model, for tests and plots (policies never see it).

    ``kind``: the shape (``"diurnal"``, ``"timer"``, ``"session"``, ``"launch"``, ...); ``at``: the
    moment that defines it where there is one (a launch, a stop, a surge's start; epoch s);
    ``note``: the parameters in words.
    """

    kind: str
    at: float | None = None
    note: str = ""


class Clock:
    """The minute grid of a trace: ``minutes`` minutes from ``start`` (a UTC midnight), with each
    minute's hour of day, day index and weekday (Monday = 0)."""

    def __init__(self, start: float, minutes: int) -> None:
        if start % DAY:
            raise ValueError("a case starts at a UTC midnight")
        self.start = float(start)
        self.minutes = int(minutes)
        t = self.start + 60.0 * np.arange(self.minutes, dtype=np.float64)
        self.hour: Floats = (t % DAY) / 3600.0
        self.day: Ints = ((t - self.start) // DAY).astype(np.int64)
        # 1970-01-01 was a Thursday: weekday 3 when Monday is 0.
        self.weekday: Ints = ((t // DAY + 3) % 7).astype(np.int64)

    @property
    def end(self) -> float:
        return self.start + 60.0 * self.minutes

    @property
    def days(self) -> int:
        return int(np.ceil(self.minutes / 1440))

    def at(self, day: float, hour: float = 0.0) -> float:
        """Epoch seconds of ``hour`` o'clock on day ``day`` of the trace."""
        return self.start + day * DAY + hour * 3600.0

    def minute_of(self, t: float) -> int:
        return int((t - self.start) // 60.0)


def diurnal(clock: Clock, peak_hour: float, amplitude: float) -> Floats:
    """A daily cycle of mean 1 peaking at ``peak_hour`` (UTC): 1 + a·cos(2π(h − peak)/24)."""
    return 1.0 + amplitude * np.cos(2.0 * np.pi * (clock.hour - peak_hour) / 24.0)


def weekend(clock: Clock, factor: float) -> Floats:
    """1 on weekdays, ``factor`` on Saturdays and Sundays."""
    return np.where(clock.weekday >= 5, factor, 1.0)


def daily_bumps(clock: Clock, centres_h: Sequence[float], width_h: float) -> Floats:
    """One Gaussian bump a day, centred at ``centres_h[day]`` o'clock, each integrating to 1 (per minute).

    Centres stay away from midnight (the caller keeps them within 2–22 h), so a bump never needs to wrap.
    """
    centre = np.asarray(centres_h, dtype=np.float64)[np.minimum(clock.day, len(centres_h) - 1)]
    shape: Floats = np.exp(-0.5 * ((clock.hour - centre) / width_h) ** 2) / (
        width_h * 60.0 * np.sqrt(2 * np.pi)
    )
    return shape


def ramp(clock: Clock, t0: float, hours: float) -> Floats:
    """0 before ``t0``, then rising linearly to 1 over ``hours`` (a launch finding its users)."""
    t = clock.start + 60.0 * np.arange(clock.minutes)
    if hours <= 0:
        return (t >= t0).astype(np.float64)
    rising: Floats = np.clip((t - t0) / (hours * 3600.0), 0.0, 1.0) * (t >= t0)
    return rising


def on_off(
    clock: Clock, rng: np.random.Generator, on_s: float, off_s: float, *, random_phase: bool = False
) -> npt.NDArray[np.bool_]:
    """Per minute of ``clock``, whether a two-state Markov chain is on: off and on spans exponential
    with means ``off_s`` and ``on_s``, starting off at the trace's start, or, with ``random_phase``,
    up to one mean cycle before it (so the start falls anywhere in a cycle)."""
    t = clock.start + 60.0 * np.arange(clock.minutes)
    # Four times the on/off pairs the trace holds on average: the last edge falls past its end.
    pairs = 1 + int(4 * (clock.end - clock.start) / (on_s + off_s))
    spans = rng.exponential(np.tile([off_s, on_s], pairs))
    begin = clock.start - (rng.uniform(0.0, off_s + on_s) if random_phase else 0.0)
    on: npt.NDArray[np.bool_] = np.searchsorted(begin + np.cumsum(spans), t) % 2 == 1
    return on


class Events:
    """Requests of one case, model by model, sampled on its clock."""

    def __init__(self, clock: Clock, rng: np.random.Generator) -> None:
        self.clock = clock
        self.rng = rng
        self.truth: dict[str, ModelTruth] = {}
        self._stamps: list[Floats] = []
        self._models: list[str] = []

    @property
    def models(self) -> list[str]:
        return list(self.truth)

    def add(self, model: str, stamps: Floats, truth: ModelTruth) -> None:
        """Requests of ``model`` at ``stamps`` (those outside the trace are dropped)."""
        keep = (stamps >= self.clock.start) & (stamps < self.clock.end)
        self._stamps.append(np.asarray(stamps[keep], dtype=np.float64))
        self._models.append(model)
        self.truth[model] = truth

    def poisson(self, model: str, per_minute: Floats, truth: ModelTruth) -> None:
        """An inhomogeneous Poisson process with ``per_minute`` expected requests in each minute."""
        self.add(model, self.arrivals(per_minute), truth)

    def arrivals(self, per_minute: Floats) -> Floats:
        """The times of an inhomogeneous Poisson process with ``per_minute`` expected arrivals in each
        minute of the clock (a count per minute, each arrival uniform within its minute)."""
        counts = self.rng.poisson(np.maximum(per_minute, 0.0))
        minute = np.repeat(np.arange(self.clock.minutes), counts)
        times: Floats = self.clock.start + 60.0 * (minute + self.rng.random(minute.size))
        return times

    def timer(
        self,
        model: str,
        period_s: float,
        truth: ModelTruth,
        *,
        phase_s: float = 0.0,
        jitter_s: float = 0.0,
        active: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """A timer trigger: every ``period_s`` from ``phase_s``, each firing late by up to ``jitter_s``
        (uniform; 0 for an exact timer), only in the minutes where ``active`` holds."""
        firings = np.arange(int((self.clock.end - self.clock.start) / period_s) + 1, dtype=np.float64)
        stamps: Floats = self.clock.start + phase_s + period_s * firings
        if jitter_s > 0:
            stamps = stamps + self.rng.uniform(0.0, jitter_s, stamps.size)
        stamps = stamps[stamps < self.clock.end]
        if active is not None:
            stamps = stamps[active[((stamps - self.clock.start) // 60.0).astype(np.int64)]]
        self.add(model, stamps, truth)

    def sessions(
        self,
        model: str,
        starts_per_minute: Floats,
        truth: ModelTruth,
        *,
        minutes: tuple[float, float] = (5.0, 30.0),
        per_minute: tuple[float, float] = (2.0, 20.0),
        background: Floats | None = None,
    ) -> Floats:
        """Bursts: sessions start as a Poisson process (``starts_per_minute``), each lasts a uniform
        number of ``minutes`` at a log-uniform request rate in ``per_minute``; ``background`` adds
        a Poisson trickle between them. Returns the sessions' start times (hints are built from them)."""
        begin = self.arrivals(starts_per_minute)
        length = 60.0 * self.rng.uniform(*minutes, begin.size)
        rate = np.exp(self.rng.uniform(np.log(per_minute[0]), np.log(per_minute[1]), begin.size))
        n = self.rng.poisson(rate * length / 60.0)
        offsets = self.rng.random(int(n.sum())) * np.repeat(length, n)
        stamps = np.repeat(begin, n) + offsets
        if background is not None:
            stamps = np.concatenate([stamps, self.arrivals(background)])
        self.add(model, stamps, truth)
        return np.sort(begin)

    def hawkes(
        self, model: str, starts_per_minute: Floats, truth: ModelTruth, *, children: float, delay_s: float
    ) -> None:
        """A self-exciting (Hawkes) process: requests arrive as a Poisson process (``starts_per_minute``)
        and each brings a Poisson number of ``children`` (mean, below 1) more, each an exponential
        ``delay_s`` (mean) after it, and so on until a generation is empty."""
        generation = self.arrivals(starts_per_minute)
        stamps = [generation]
        while generation.size:
            n = self.rng.poisson(children, generation.size)
            generation = np.repeat(generation, n) + self.rng.exponential(delay_s, int(n.sum()))
            generation = generation[generation < self.clock.end]
            stamps.append(generation)
        self.add(model, np.concatenate(stamps), truth)

    def frame(self) -> pd.DataFrame:
        """The requests as a trace frame: ``timestamp`` (epoch s, to the millisecond, so that a CSV
        round-trips exactly) and ``model`` (str), sorted by time, ties by model."""
        stamps = np.round(np.concatenate(self._stamps) if self._stamps else np.zeros(0), 3)
        lengths = [s.size for s in self._stamps]
        names = np.asarray(self._models, dtype=object)
        codes = np.repeat(np.arange(len(self._models)), lengths)
        order = np.lexsort((codes, stamps))
        return pd.DataFrame(
            {"timestamp": stamps[order].astype(np.float64), "model": names[codes[order]].astype(str)}
        )


def fleet(events: Events, names: Iterable[str], *, median_per_day: float = 60.0, sigma: float = 1.1) -> None:
    """The background every synthetic case shares in kind (not in draws): log-normal popularity
    (median ``median_per_day``, ``sigma`` decades, 0.3 to 5,000 a day), a daily cycle with its own phase
    and depth per model, quieter weekends; the first model is a 15-minute probe from midnight, so every
    trace starts in its first minute (the CLI reads the origin of a trace file from its first request)."""
    names = list(names)
    clock, rng = events.clock, events.rng
    probe, rest = names[0], names[1:]
    events.timer(probe, 900.0, ModelTruth("timer", note="every 15 min from 00:00, a monitoring probe"))
    daily = np.clip(10 ** (np.log10(median_per_day) + sigma * normal_quantiles(len(rest))), 0.3, 5000.0)
    for name, per_day in zip(rest, rng.permutation(daily), strict=True):
        peak = float(rng.normal(14.0, 3.0)) % 24.0
        depth = float(rng.uniform(0.3, 0.9))
        dip = float(rng.uniform(0.3, 1.0))
        rate = per_day / 1440.0 * diurnal(clock, peak, depth) * weekend(clock, dip)
        note = f"{per_day:.3g}/day, peak {peak:.1f} h, depth {depth:.2f}, weekend ×{dip:.2f}"
        events.poisson(name, rate, ModelTruth("diurnal", note=note))


def normal_quantiles(n: int) -> Floats:
    """The ``n`` evenly spaced quantiles of the standard normal: a sample with no sampling noise, so a
    case's popularity spread is what its parameters say."""
    dist = NormalDist()
    return np.array([dist.inv_cdf((i + 0.5) / n) for i in range(n)], dtype=np.float64)


def catalog_for(
    models: Sequence[str],
    rng: np.random.Generator,
    fixed_gb: Mapping[str, float] | None = None,
    pool_gb: Sequence[float] | None = None,
) -> Catalog:
    """A catalog entry per model: ``fixed_gb`` where a case chose the size on purpose, the others drawn
    without replacement from ``pool_gb`` (default: the size ladder, cycled) in a seeded order."""
    fixed = dict(fixed_gb or {})
    free = [m for m in models if m not in fixed]
    pool = list(pool_gb) if pool_gb is not None else [SIZE_LADDER_GB[i % 9] for i in range(len(free))]
    if len(pool) < len(free):
        raise ValueError(f"{len(free)} models but {len(pool)} sizes in the pool")
    drawn = rng.permutation(np.asarray(pool, dtype=np.float64))[: len(free)]
    size = {**fixed, **{m: float(g) for m, g in zip(free, drawn, strict=True)}}
    return Catalog(
        ModelSpec(id=m, version="1", uri=f"s3://models/{m}.safetensors", size_bytes=round(size[m] * GB))
        for m in models
    )


def tight_cluster(disk: str = "2TB") -> Cluster:
    """Two nodes of 2 × 80 GB GPUs, 256 GB of pinned host cache and ``disk`` of NVMe: a few hundred GB
    of GPU memory against about a terabyte of weights, so every policy has to choose."""
    return Cluster.from_data(
        {
            "nodes": [
                {
                    "name": f"gpu-{k}",
                    "gpus": [{"memory_bytes": "80GB"}] * 2,
                    "host_cache_bytes": "256GB",
                    "disk_cache_bytes": disk,
                }
                for k in range(2)
            ],
            "bandwidth": _BANDWIDTH,
        }
    )


def mixed_cluster() -> Cluster:
    """Two unequal nodes: one with a 40 GB and two 80 GB GPUs, 256 GB of host cache and 2 TB of NVMe, one
    with a single 80 GB GPU, 128 GB and 1 TB; where a model fits, and which node a load should go to,
    differ from GPU to GPU."""
    node_a = {"gpus": [{"memory_bytes": m} for m in ("40GB", "80GB", "80GB")], "host_cache_bytes": "256GB"}
    node_b = {"gpus": [{"memory_bytes": "80GB"}], "host_cache_bytes": "128GB"}
    return Cluster.from_data(
        {
            "nodes": [
                {"name": "gpu-a", **node_a, "disk_cache_bytes": "2TB"},
                {"name": "gpu-b", **node_b, "disk_cache_bytes": "1TB"},
            ],
            "bandwidth": _BANDWIDTH,
        }
    )


def fits_at_once(sizes: Sequence[int], cluster: Cluster) -> bool:
    """Whether GPU memory holds every model at once by the one placement rule, whatever order the
    copies arrive in: tried largest first, smallest first (which fragments GPUs the most) and shuffled."""
    orders = [sorted(sizes, reverse=True), sorted(sizes), list(np.random.default_rng(0).permutation(sizes))]
    for order in orders:
        free = [[g.memory_bytes for g in node.gpus] for node in cluster.nodes]
        for size in order:
            for k, node in enumerate(cluster.nodes):
                gpus = gpu_placement(int(size), [g.memory_bytes for g in node.gpus], free[k])
                if gpus is not None:
                    shard = -(-int(size) // len(gpus))
                    for i in gpus:
                        free[k][i] -= shard
                    break
            else:
                return False
    return True


_ROOMY_NODE = {"gpus": [{"memory_bytes": "80GB"}] * 8, "host_cache_bytes": "2TB", "disk_cache_bytes": "8TB"}


def roomy_cluster(catalog: Catalog, like: Cluster | None = None) -> Cluster:
    """Enough nodes shaped like ``like``'s first one, with its bandwidth (default: 8 × 80 GB GPUs, 2 TB host
    cache, 8 TB NVMe each), that every model of ``catalog`` is in GPU memory at once: nothing ever needs
    the room, so unloading anything only costs. ``InvalidInput`` where such a node cannot hold some model."""
    shape = _ROOMY_NODE if like is None else like.nodes[0].model_dump(exclude={"name"})
    bandwidth = _BANDWIDTH if like is None else like.bandwidth.model_dump()
    sizes = [spec.size_bytes for spec in catalog]

    def of(nodes: int) -> Cluster:
        return Cluster.from_data(
            {"nodes": [{"name": f"gpu-{k}", **shape} for k in range(nodes)], "bandwidth": bandwidth}
        )

    one = of(1)
    largest = max(catalog, key=lambda spec: spec.size_bytes, default=None)
    if largest is not None and not fits_at_once([largest.size_bytes], one):
        name = "the default roomy node" if like is None else f"node {like.nodes[0].name}"
        raise InvalidInput(
            f"the GPUs of {name} cannot hold a model of {largest.size_bytes / GB:g} GB ({largest.id})"
        )
    nodes = max(1, int(np.ceil(sum(sizes) / one.nodes[0].l0_bytes)))
    while not fits_at_once(sizes, cluster := of(nodes)):
        nodes += 1  # ends: with one node per model, each is alone on a node that holds it
    return cluster
