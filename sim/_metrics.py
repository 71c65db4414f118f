"""What a simulated run measured, defined once for every policy.

A world fills a ``Record`` as it goes (one row per request in the window, byte-seconds per tier, bytes
asked of and moved over each link); ``metrics`` turns it into the ``SimMetrics`` every policy is
compared by:

- a **cold start** is a request whose model is not resident in GPU memory when it arrives (a copy still
  loading is not resident), not "a request that waited";
- the **p75 per-model cold-start rate** is the 75th percentile (numpy's default, linear) of
  cold starts ÷ requests over the models with at least one request in the window;
- **idle GB-minutes** per tier: resident bytes × minutes within the window, GB = 10⁹ bytes. Requests are
  instantaneous in the trace format, so a resident copy is idle all the time it is resident;
- **stable** is false when the requests ask some link for as many bytes per second as it can move
  (``offered_load``: bytes asked of the busiest link in the window ÷ its bandwidth × the window, at least
  ``SATURATED``): the waits then measure the queue, not the policy. What requests ask is what the loads
  they wait on have still to move when they start waiting: a load on request, or a prefetch from the
  moment a request waits on it, and at the cut what the loads requests wait on from before it have left
  (the backlog the warm-up leaves is the window's). A prefetch nobody waits on asks nothing, since loads
  on request pre-empt it: its backlog delays no request by itself. Requests for a model whose load is
  already asked for wait on that load instead of asking again, so a saturated link shows an offered load
  of about 1, not more: its backlog is bounded only by the number of models. Stable does not mean the
  waits are short: on a 10 MB/s link one 140 GB load takes almost four hours with the link far from
  saturated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from prewarm import CACHE_TIERS, Tier

__all__ = [
    "MISPREDICTED_BY",
    "MISPREDICTION_WINDOW_S",
    "SATURATED",
    "WARM_S",
    "MispredictedBy",
    "Record",
    "SimMetrics",
    "metrics",
]

MISPREDICTION_WINDOW_S = 600.0
"""A prefetched copy still unused this long before the window ends is counted as mispredicted then."""

MispredictedBy = Literal["order", "displaced", "end"]
MISPREDICTED_BY: tuple[MispredictedBy, ...] = get_args(MispredictedBy)
"""What took a mispredicted prefetch's copy away unused (``SimMetrics.mispredicted_by``): ``order``, the
scheduler (its misprediction window passed, or it made room for a better bet); ``displaced``, the
executor's LRU, evicting it for another load before the window passed; ``end``, nothing: it was still
unused, a window after it landed, when the simulated span ended."""

SATURATED = 0.99
"""An offered load from which a link is taken as unable to keep up (see the module docstring)."""

SLOW_S = 5.0
"""A request waiting longer than this is slow: the seed's "5 seconds" (``share_wait_over_5s``)."""

WARM_S = 60.0
"""A GPU copy given up to a load this soon after its last use was still warm (``warm_displacements``)."""

GB = 1e9
NAN = float("nan")


@dataclass
class Record:
    """Raw counts a world accumulates; only what happens in [start, end) is counted."""

    start: float
    end: float
    tiers: tuple[Tier, ...] = CACHE_TIERS
    # One entry per request in the window, in arrival order.
    req_at: list[float] = field(default_factory=list)
    req_model: list[str] = field(default_factory=list)
    req_cold: list[bool] = field(default_factory=list)
    req_from: list[Tier] = field(default_factory=list)
    req_wait: list[float] = field(default_factory=list)  # NaN until the request's load lands
    idle_byte_s: dict[Tier, float] = field(default_factory=dict)
    bytes_moved: dict[str, int] = field(default_factory=dict)  # by link name ("L3->L2" ...)
    bytes_asked: dict[str, float] = field(default_factory=dict)  # by "node link"
    link_rate: dict[str, float] = field(default_factory=dict)  # by "node link"
    prefetches: int = 0
    mispredicted_by: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MISPREDICTED_BY, 0))
    disk_stagings: int = 0
    disk_stagings_unread: int = 0
    failed_orders: int = 0
    queued_loads: int = 0
    orders: int = 0
    over_commit_bytes: int = 0
    warm_displacements: int = 0
    gpu_seconds_loading: float = 0.0

    def counts(self, at: float) -> bool:
        return self.start <= at < self.end

    @property
    def mispredictions(self) -> int:
        return sum(self.mispredicted_by.values())

    def mispredicted(self, by: MispredictedBy) -> None:
        """A prefetch in the window went unused, and ``by`` (one of ``MISPREDICTED_BY``) took it away."""
        self.mispredicted_by[by] += 1

    def request(self, at: float, model: str, cold: bool, served_from: Tier) -> int:
        """A request arrived in the window: its row, to fill its wait in when known."""
        self.req_at.append(at)
        self.req_model.append(model)
        self.req_cold.append(cold)
        self.req_from.append(served_from)
        self.req_wait.append(NAN if cold else 0.0)
        return len(self.req_wait) - 1

    def resident(self, tier: Tier, nbytes: int, since: float, until: float) -> None:
        """A copy of ``nbytes`` was resident in ``tier`` from ``since`` to ``until``."""
        span = min(until, self.end) - max(since, self.start)
        if span > 0:
            self.idle_byte_s[tier] = self.idle_byte_s.get(tier, 0.0) + nbytes * span

    def moved(self, link: str, nbytes: int, at: float) -> None:
        if self.start <= at < self.end:  # ``counts``, written out: once per hop
            self.bytes_moved[link] = self.bytes_moved.get(link, 0) + nbytes

    def asked(self, link: str, nbytes: float, at: float) -> None:
        if self.start <= at < self.end:  # ``counts``, written out: once per hop a request waits on
            self.bytes_asked[link] = self.bytes_asked.get(link, 0.0) + nbytes


@dataclass(frozen=True)
class SimMetrics:
    """One policy's run. ``to_json`` gives the keys of the ``prewarm sim run`` contract and more."""

    policy: str
    unlimited: bool
    requests: int
    cold_starts: int
    cold_start_rate: float
    p75_model_cold_start_rate: float
    share_wait_over_1s: float
    share_wait_over_5s: float
    wait_total_s: float
    wait_mean_s: float
    wait_p50_s: float
    wait_p95_s: float
    wait_p99_s: float
    wait_max_s: float
    idle_gb_minutes: dict[str, float]
    """Per tier; under ``--unlimited`` only L0."""
    prefetches: int
    mispredictions: int
    mispredicted_by: dict[str, int]
    """The mispredictions by what took their copy away (``MISPREDICTED_BY``): a forecast that was wrong
    shows as ``order`` or ``end``, a cluster too tight to keep a right one as ``displaced``."""
    bytes_moved: int
    """All links together; ``bytes_moved_per_link`` splits it."""
    bytes_moved_per_link: dict[str, int]
    gpu_seconds_loading: float
    stable: bool
    offered_load: float
    """Bytes asked of the busiest link in the window ÷ what it can move in the window."""
    busiest_link: str
    served_from: dict[str, int]
    slow_from: dict[str, int]
    """Of the requests waiting over 5 s, how many found their model's closest copy in each tier: in L2,
    a disk read that a host copy would have spared; in L3, a download that a disk copy would have.
    Where a cluster's long waits come from, and so what more memory or disk would buy."""
    model_cold_start_rate: dict[str, float]
    """Per model with at least one request in the window."""
    queued_loads: int
    """Loads on request that had to wait for transfers in flight to free room."""
    failed_orders: int
    orders: int
    over_commit_bytes: int
    """Bytes the executors' LRU had to displace to apply this policy's orders (0 for a correct plan)."""
    disk_stagings: int = 0
    """Prefetches onto disk alone (``prefetches`` counts those into host or GPU memory)."""
    disk_stagings_unread: int = 0
    """Of the copies they staged, those no load read before they left the disk or the window ended (a
    copy staged in the window's last ten minutes is not counted): the downloads a wrong guess wasted."""
    warm_displacements: int = 0
    """GPU copies the executors' LRU gave up to make room for a load within ``WARM_S`` of their last use:
    models taking turns on a node's GPUs, each turn a cold start (two busy models whose copies cannot
    share the GPUs of the one node their host copies send their loads to)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def metrics(policy: str, record: Record, *, unlimited: bool = False) -> SimMetrics:
    """The one definition of every figure, for any policy's record."""
    waits = np.asarray(record.req_wait, dtype=np.float64)
    cold = np.asarray(record.req_cold, dtype=bool)
    models = np.asarray(record.req_model, dtype=str)
    n = int(waits.size)

    def pct(q: float) -> float:
        return float(np.percentile(waits, q)) if n else 0.0

    per_model: dict[str, float] = {}
    if n:
        names, inverse = np.unique(models, return_inverse=True)
        requests = np.bincount(inverse, minlength=names.size)
        colds = np.bincount(inverse, weights=cold.astype(np.float64), minlength=names.size)
        rates = colds / requests
        per_model = {str(m): float(r) for m, r in zip(names, rates, strict=True)}
    p75 = float(np.percentile(list(per_model.values()), 75)) if per_model else 0.0
    window = max(record.end - record.start, 1e-9)
    load, busiest = 0.0, ""
    for link, asked in record.bytes_asked.items():
        rate = record.link_rate.get(link, 0.0)
        ratio = asked / (rate * window) if rate > 0 else 0.0
        if ratio > load:
            load, busiest = ratio, link
    served = {t.value: 0 for t in Tier}
    for tier in record.req_from:
        served[tier.value] += 1
    slow_from = dict.fromkeys(served, 0)
    for row in np.flatnonzero(waits > SLOW_S):
        slow_from[record.req_from[row].value] += 1
    tiers = (Tier.L0,) if unlimited else record.tiers
    return SimMetrics(
        policy=policy,
        unlimited=unlimited,
        requests=n,
        cold_starts=int(cold.sum()),
        cold_start_rate=float(cold.mean()) if n else 0.0,
        p75_model_cold_start_rate=p75,
        share_wait_over_1s=float((waits > 1.0).mean()) if n else 0.0,
        share_wait_over_5s=float((waits > SLOW_S).mean()) if n else 0.0,
        wait_total_s=float(waits.sum()),
        wait_mean_s=float(waits.mean()) if n else 0.0,
        wait_p50_s=pct(50),
        wait_p95_s=pct(95),
        wait_p99_s=pct(99),
        wait_max_s=float(waits.max()) if n else 0.0,
        idle_gb_minutes={t.value: record.idle_byte_s.get(t, 0.0) / GB / 60.0 for t in tiers},
        prefetches=record.prefetches,
        mispredictions=record.mispredictions,
        mispredicted_by=dict(record.mispredicted_by),
        bytes_moved=sum(record.bytes_moved.values()),
        bytes_moved_per_link=dict(sorted(record.bytes_moved.items())),
        gpu_seconds_loading=record.gpu_seconds_loading,
        stable=load < SATURATED,
        offered_load=load,
        busiest_link=busiest,
        served_from=served,
        slow_from=slow_from,
        model_cold_start_rate=per_model,
        queued_loads=record.queued_loads,
        failed_orders=record.failed_orders,
        orders=record.orders,
        over_commit_bytes=record.over_commit_bytes,
        disk_stagings=record.disk_stagings,
        disk_stagings_unread=record.disk_stagings_unread,
        warm_displacements=record.warm_displacements,
    )
