"""The hybrid histogram policy of 'Serverless in the Wild' (Shahrad et al., USENIX ATC'20), per model.

For each model the policy keeps a histogram of its idle times — the time from one request to the next;
requests are instantaneous in the trace format, so an idle time is an inter-arrival time — in 1-minute
bins over a range (the knob, in minutes; 240 = the paper's 4 hours). Idle times longer than the range
are counted apart, as out of bounds. After each request at ``t`` the histogram gives two windows:

- the **pre-warm window** ``head``: the 5th percentile of the idle times less a 10% margin;
- the **keep-alive window** ``tail``: the 99th percentile plus a 10% margin.

When ``head > 0`` the model is unloaded right after the request and loaded back to GPU memory at
``t + head``; otherwise it stays. Either way it is unloaded at ``t + tail``, unless a later request
re-plans first (``still_wanted`` drops the superseded plan's orders; the unload at the tail is one order
per model whose time each plan moves: ``UnloadTimer``). Percentiles are read off the bins:
``head`` is the lower edge of the bin where the cumulative count reaches 5%, ``tail`` the upper edge of
the bin where it reaches 99% — the histogram knows no finer, and both roundings keep the model longer.

When the histogram is not representative of the model, the policy falls back to a fixed keep-alive for
the whole range (no pre-warm, unload at ``t + range``):

- fewer than ``MIN_IDLE_TIMES`` (10) idle times observed;
- the coefficient of variation of the bin counts (population standard deviation over mean, across every
  bin of the range) below ``MIN_CV`` (2): the idle times are spread out, there is no pattern to learn;
- more than half of the idle times out of bounds.

Left out of the paper: its ARIMA branch, which forecasts the next idle time of models whose idle times
are mostly out of bounds (those fall back to keep-alive for the range here, as the issue asks), and its
per-application (not per-function) grouping — a model is the unit here. "Unload" is a DEMOTE from GPU
memory one tier down on a cluster (L0 → L1, or to disk where host memory could never hold the model:
``PolicyContext.unload``), and an EVICT of the only tier under ``--unlimited``. On a
cluster a request may wait for its load, and a copy in flight cannot be demoted: the unload after a
request the policy's own plan had not kept warm waits for a bound on that load (from object storage),
and is skipped when that bound reaches past the pre-warm window.

The histogram learns from the training span in ``prepare`` and keeps learning online from every request
of the simulated window (``on_request``); requests replayed from the training span during the warm-up
re-plan but are not counted twice.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models import ModelSpec
from prewarm import HOP_INTO, ExecutorState, Hint, InvalidInput, Order, OrderAction, OrderReason, Tier
from sim._policies import (
    Policy,
    PolicyContext,
    PolicyInputs,
    UnloadTimer,
    knob_float,
    order_for,
    register_policy,
)

__all__ = [
    "BIN_S",
    "HEAD_PERCENTILE",
    "MARGIN",
    "MAX_OUT_OF_BOUNDS_SHARE",
    "MIN_CV",
    "MIN_IDLE_TIMES",
    "TAIL_PERCENTILE",
    "HistogramPolicy",
    "IdleHistogram",
    "Windows",
]

BIN_S = 60.0
HEAD_PERCENTILE = 5.0
TAIL_PERCENTILE = 99.0
MARGIN = 0.10
MIN_IDLE_TIMES = 10
MIN_CV = 2.0
MAX_OUT_OF_BOUNDS_SHARE = 0.5
DEFAULT_RANGE_MIN = 240
MAX_RANGE_MIN = 7 * 1440
"""The longest range the knob takes: a bin per minute of a week, per model (the paper's is 4 hours)."""


@dataclass(frozen=True)
class Windows:
    """What the histogram says after a request: load back at ``+prewarm_s`` (0: never unloaded), unload
    at ``+keepalive_s``; ``pattern`` false when it fell back to keep-alive for the range, ``why`` says why."""

    prewarm_s: float
    keepalive_s: float
    pattern: bool
    why: str


class _Percentile:
    """The bin where a histogram's cumulative count first reaches ``fraction`` of its total — what
    ``np.searchsorted(np.cumsum(counts), fraction * total)`` gives — followed as counts are added: each
    idle time moves it a bin or two at most, so re-planning after a request costs no pass over the bins."""

    __slots__ = ("bin", "cum", "fraction")

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.bin = 0
        self.cum = 0  # the cumulative count through ``bin``

    def added(self, b: int, counts: list[int], total: int) -> None:
        if b <= self.bin:
            self.cum += 1
        self.settle(counts, total)

    def settle(self, counts: list[int], total: int) -> None:
        threshold = self.fraction * total
        while self.bin > 0 and self.cum - counts[self.bin] >= threshold:
            self.cum -= counts[self.bin]
            self.bin -= 1
        while self.cum < threshold and self.bin < len(counts) - 1:
            self.bin += 1
            self.cum += counts[self.bin]

    def reset(self, counts: list[int], total: int) -> None:
        self.bin, self.cum = 0, counts[0]
        self.settle(counts, total)


class IdleHistogram:
    """One model's idle times: counts per 1-minute bin over ``range_min`` minutes, and those beyond.

    Everything the windows need is kept up to date in O(1) per idle time (the count in range, a running
    sum of squared counts for the coefficient of variation, the two percentile bins), so re-planning
    after every request stays cheap: the simulator replays hundreds of thousands of requests.
    """

    def __init__(self, range_min: int = DEFAULT_RANGE_MIN) -> None:
        if range_min < 1:
            raise InvalidInput(f"the histogram's range is at least one minute, not {range_min}")
        self.range_min = range_min
        self._counts = [0] * range_min
        self.out_of_bounds = 0
        self._in_range = 0
        self._sum_sq = 0
        self._head = _Percentile(HEAD_PERCENTILE / 100.0)
        self._tail = _Percentile(TAIL_PERCENTILE / 100.0)
        self._windows: dict[tuple[bool, int, int], Windows] = {}

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        """The count of each bin (a copy)."""
        return np.array(self._counts, dtype=np.int64)

    @property
    def observed(self) -> int:
        """Idle times seen, in range or not."""
        return self._in_range + self.out_of_bounds

    def add(self, idle_s: float) -> None:
        b = int(max(idle_s, 0.0) // BIN_S)
        if b >= self.range_min:
            self.out_of_bounds += 1
            return
        counts = self._counts
        c = counts[b]
        counts[b] = c + 1
        self._sum_sq += 2 * c + 1  # (c + 1)² - c²
        self._in_range += 1
        self._head.added(b, counts, self._in_range)
        self._tail.added(b, counts, self._in_range)

    def add_many(self, idle_s: npt.NDArray[np.float64]) -> None:
        bins = (np.maximum(idle_s, 0.0) // BIN_S).astype(np.int64)
        inside = bins < self.range_min
        self.out_of_bounds += int((~inside).sum())
        merged = self.counts + np.bincount(bins[inside], minlength=self.range_min)
        self._counts = [int(c) for c in merged]
        self._in_range = int(merged.sum())
        self._sum_sq = int((merged * merged).sum())
        self._head.reset(self._counts, self._in_range)
        self._tail.reset(self._counts, self._in_range)

    def cv(self) -> float:
        """Coefficient of variation of the bin counts across the range (0 when every bin is empty)."""
        if self._in_range == 0:
            return 0.0
        n = self.range_min
        mean = self._in_range / n
        return math.sqrt(max(self._sum_sq / n - mean * mean, 0.0)) / mean

    def out_of_bounds_share(self) -> float:
        return self.out_of_bounds / self.observed if self.observed else 0.0

    def percentile_bins(self) -> tuple[int, int]:
        """The bins of the 5th and the 99th percentile of the idle times in range."""
        return self._head.bin, self._tail.bin

    def windows(self) -> Windows:
        fallback = self.range_min * 60.0
        if self.observed < MIN_IDLE_TIMES:
            return Windows(0.0, fallback, False, f"{self.observed} idle times, fewer than {MIN_IDLE_TIMES}")
        share = self.out_of_bounds_share()
        if share > MAX_OUT_OF_BOUNDS_SHARE:
            return Windows(0.0, fallback, False, f"{share:.0%} of idle times beyond the range")
        cv = self.cv()
        if cv < MIN_CV:
            return Windows(0.0, fallback, False, f"bin counts' CV {cv:.2f} below {MIN_CV}")
        key = (True, self._head.bin, self._tail.bin)
        w = self._windows.get(key)
        if w is None:
            head_bin, tail_bin = self._head.bin, self._tail.bin
            head = head_bin * BIN_S * (1.0 - MARGIN)
            tail = (tail_bin + 1) * BIN_S * (1.0 + MARGIN)
            w = self._windows[key] = Windows(
                head, tail, True, f"p5 bin {head_bin} min, p99 bin {tail_bin} min"
            )
        return w


class HistogramPolicy(Policy):
    """The hybrid histogram policy (see the module's docstring); ``range_min`` is its one knob."""

    def __init__(self, range_min: int = DEFAULT_RANGE_MIN, *, name: str | None = None) -> None:
        if range_min < 1:
            raise InvalidInput(f"the histogram's range is at least one minute, not {range_min}")
        self.range_min = range_min
        self.name = name or ("histogram" if range_min == DEFAULT_RANGE_MIN else f"histogram:{range_min}")
        self._hist: dict[str, IdleHistogram] = {}
        self._last: dict[str, float] = {}
        self._live: dict[str, tuple[str, ...]] = {}  # the latest plan's unload and pre-warm orders
        self._tail = UnloadTimer(self._unload_at)  # the latest plan's unload at its tail
        self._specs: dict[str, ModelSpec] = {}
        self._start = float("inf")
        self._plan: dict[str, tuple[float, Windows]] = {}  # each model's latest plan: when, and windows
        self._ctx: PolicyContext | None = None

    def histogram(self, model: str) -> IdleHistogram:
        """The model's histogram (an empty one for a model never seen)."""
        h = self._hist.get(model)
        if h is None:
            h = self._hist[model] = IdleHistogram(self.range_min)
        return h

    def prepare(self, ctx: PolicyContext) -> None:
        self._ctx = ctx
        self._start = ctx.start
        self._specs = {spec.id: spec for spec in ctx.catalog}
        ts, models = ctx.history
        if len(ts) == 0:
            return
        ts = np.asarray(ts, dtype=np.float64)
        names = np.asarray(models).astype(str)
        order = np.lexsort((ts, names))  # by model, then by time
        ts, names = ts[order], names[order]
        same = names[1:] == names[:-1]
        gaps = np.diff(ts)
        # Each model's run in the sorted arrays: its gaps are the diffs inside the run.
        bounds = np.flatnonzero(np.r_[True, ~same, True])
        for lo, hi in itertools.pairwise(bounds):
            model = str(names[lo])
            self._last[model] = float(ts[hi - 1])
            if hi - lo > 1:
                self.histogram(model).add_many(gaps[lo : hi - 1])

    def on_request(self, model: str, at: float, node: str) -> list[Order]:
        spec = self._specs.get(model)
        if spec is None:
            if self._ctx is None:
                raise RuntimeError("HistogramPolicy.on_request before prepare")
            return []
        hist = self._hist.get(model) or self.histogram(model)
        last = self._last.get(model)
        # Training-span requests replayed in the warm-up were learned in prepare: re-plan, do not re-count.
        if last is not None and at >= self._start:
            hist.add(at - last)
        if last is None or at > last:
            self._last[model] = at
        w = hist.windows()
        action, tier = self._context.unload(node, spec.size_bytes)
        orders: list[Order] = []
        if w.prewarm_s > 0:
            # Unloaded once this request is served: at once when it found the model in GPU memory, else
            # when its load is in (a copy still loading cannot be demoted). Kept when that is past the head.
            served = at + self._load_s(model, at, spec.size_bytes)
            if served < at + w.prewarm_s:
                unload = order_for(node, spec, action, tier, served, reason=OrderReason.CAPACITY)
                load = order_for(
                    node, spec, OrderAction.PREFETCH, Tier.L0, at + w.prewarm_s, reason=OrderReason.FORECAST
                )
                orders = [unload, load]
        self._plan[model] = (at, w)
        # A later request for the model re-plans: only the orders of its latest plan are still wanted.
        self._live[model] = tuple(o.id for o in orders)
        # The unload at the tail is one timer per model, as keep-alive's: ordered anew only when it falls
        # before the one on its way, which is otherwise moved on when it comes due (``superseded``).
        return orders + self._tail.set(model, at + w.keepalive_s, node)

    def _unload_at(self, model: str, node: str, due: float) -> Order:
        spec = self._specs[model]
        action, tier = self._context.unload(node, spec.size_bytes)
        return order_for(node, spec, action, tier, due, reason=OrderReason.CAPACITY)

    @property
    def _context(self) -> PolicyContext:
        if self._ctx is None:
            raise RuntimeError("HistogramPolicy.prepare was not called")
        return self._ctx

    def _load_s(self, model: str, at: float, size: int) -> float:
        """How long after ``at`` a request for ``model`` is served, as far as this policy's own plan
        tells: 0 when the plan had the model in GPU memory (and always under ``--unlimited``), else the
        time to load it from object storage — a bound, so the unload is not refused for a copy in flight."""
        ctx = self._ctx
        plan = self._plan.get(model)
        if ctx is None or ctx.unlimited:
            return 0.0
        if plan is not None:
            t, w = plan
            if t + w.prewarm_s <= at < t + w.keepalive_s:
                return 0.0
        rates = [ctx.bandwidth.get(hop, 0.0) for hop in HOP_INTO.values()]
        return sum(size / rate + ctx.hop_overhead_s for rate in rates if rate > 0)

    def still_wanted(self, order: Order, now: float) -> bool:
        if self._tail.owns(order):
            return self._tail.due(order)
        return order.id in self._live.get(order.model, ())  # a tail unload replaced is in neither

    def superseded(self, order: Order, now: float) -> list[Order]:
        return self._tail.moved(order)

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        return []


def _histogram(label: str, knob: str | None, inputs: PolicyInputs) -> Policy:
    minutes = knob_float(label, knob, float(DEFAULT_RANGE_MIN))
    if minutes != int(minutes) or not 1 <= minutes <= MAX_RANGE_MIN:
        raise InvalidInput(
            f"policy {label!r}: the histogram's range is a whole number of minutes from 1 to "
            f"{MAX_RANGE_MIN:,} (a week)"
        )
    return HistogramPolicy(int(minutes), name=label)


register_policy("histogram", _histogram)
