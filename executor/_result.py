"""What a load reports: ``LoadResult``, the per-hop timer it is built from, and the node's bandwidth.

Every hop of a load is timed (``HopTimer``); each timing feeds the metrics and ``Bandwidth``, the
estimate per link that the node reports to the planner in ``ExecutorState.bandwidth_bytes_per_s``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from executor import _metrics
from prewarm import HOP_INTO, Tier

__all__ = ["Bandwidth", "HopTimer", "LoadResult"]

# Fused hops and the link that bounds each: object storage for L3 -> L1, the disk for L2 -> L0.
_BOUND_BY: dict[str, tuple[str, ...]] = {
    "L3->L1": (HOP_INTO[Tier.L2],),
    "L3->L0": (HOP_INTO[Tier.L2],),
    "L2->L0": (HOP_INTO[Tier.L1],),
}


@dataclass(frozen=True)
class LoadResult:
    """What ``ensure`` did. ``served_from`` is where the bytes came from (the tier itself on a hit).

    ``verified`` is always true for a result that is returned: bytes reach L1/L0 only through a sha256
    check (from L3) or per-chunk digest checks (from L2), and a failed check raises or re-fetches.
    """

    model: str
    version: str
    sha256: str
    tier: Tier
    served_from: Tier
    bytes: int
    seconds_per_hop: Mapping[str, float] = field(default_factory=dict)
    verified: bool = True

    @property
    def seconds(self) -> float:
        return sum(self.seconds_per_hop.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "served_from": self.served_from.value,
            "tier": self.tier.value,
            "bytes": self.bytes,
            "seconds_per_hop": {k: round(v, 6) for k, v in self.seconds_per_hop.items()},
            "verified": self.verified,
        }


class Bandwidth:
    """Bytes per second per hop, as an exponential average of the loads seen. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rates: dict[str, float] = {}

    def observe(self, hop: str, nbytes: int, seconds: float) -> None:
        if seconds <= 0:
            return
        rate = nbytes / seconds
        with self._lock:
            # A fused hop also measures the slowest link it crosses, which is the one the planner asks
            # for (HOP_INTO): a node that always streams L3 -> L1 in one pass must still report L3->L2.
            for name in (hop, *_BOUND_BY.get(hop, ())):
                old = self._rates.get(name)
                # An exponential average: recent loads matter most, one outlier does not swing the planner.
                self._rates[name] = rate if old is None else 0.7 * old + 0.3 * rate

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._rates)


class HopTimer:
    """Times each hop of one load and feeds the metrics and the node's bandwidth estimate."""

    def __init__(self, nbytes: int, observe: Callable[[str, int, float], None]) -> None:
        self._nbytes = nbytes
        self._observe = observe
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def hop(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        elapsed = time.perf_counter() - start
        self.seconds[name] = elapsed
        _metrics.HOP_BYTES.labels(name).inc(self._nbytes)
        _metrics.HOP_SECONDS.labels(name).inc(elapsed)
        self._observe(name, self._nbytes, elapsed)
