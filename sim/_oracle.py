"""The ``oracle``: a clairvoyant bound, not a competitor. It knows every request of the window.

- On a cluster it loads each model just in time for its next request (the transfer time from its
  closest copy, by the links' bandwidth and the hop overhead the world uses, plus a margin for sharing
  a link), and makes room in GPU memory by demoting the residents needed farthest ahead (Belady), never
  one needed before the model it makes room for. Nothing leaves GPU memory otherwise.
- Under ``--unlimited`` it loads a model at the instant of its request and unloads it right after (unless
  the next request is at the same instant): no cold start and no idle memory.

During the warm-up before the cut it knows nothing (its future is the window): on a cluster it acts as
``reactive`` there; under ``--unlimited`` it unloads after each request there too.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from models import Catalog
from prewarm import (
    CACHE_TIERS,
    HOP_INTO,
    ExecutorState,
    Hint,
    Order,
    OrderAction,
    OrderReason,
    Tier,
    gpu_shards,
    load_path,
)
from sim._node import _placement
from sim._policies import Policy, PolicyContext, PolicyInputs, order_for, register_policy

__all__ = ["OraclePolicy"]

_INF = float("inf")


@dataclass
class _Gpus:
    """One node's GPU memory as this tick's plan leaves it."""

    capacity: list[int]
    free: list[int]
    l0: dict[str, tuple[int, tuple[int, ...]]]  # model -> (bytes, gpus)


class OraclePolicy(Policy):
    clairvoyant = True

    def __init__(self, name: str = "oracle", *, margin_frac: float = 0.25, margin_s: float = 2.0) -> None:
        self.name = name
        self.margin_frac = margin_frac
        self.margin_s = margin_s
        # Per model, the window's request times in order: a list, since ``_next_use`` bisects it once
        # per resident per planned load, and numpy's searchsorted costs more than that on one scalar.
        self._times: dict[str, list[float]] = {}
        self._leads: dict[tuple[int, Tier], float] = {}  # ``_lead`` per (size, tier), remembered
        self._served: dict[str, int] = {}
        self._planned: dict[str, float] = {}  # model -> the request its load is planned for
        self._ts = np.empty(0)
        self._ms = np.empty(0, dtype=str)
        self._pos = 0
        self._tick_s = 60.0

    def prepare(self, ctx: PolicyContext) -> None:
        if ctx.future is None:
            raise RuntimeError("the oracle is clairvoyant: it needs the window's requests")
        self._ctx = ctx
        self._tick_s = ctx.tick_s
        self._leads.clear()  # worked out from this context's bandwidth
        self._catalog: Catalog = ctx.catalog
        self._ts, self._ms = ctx.future
        order = np.argsort(self._ms, kind="stable")
        models, first = np.unique(self._ms[order], return_index=True)
        chunks = np.split(self._ts[order], first[1:]) if models.size else []  # a window without requests
        for m, chunk in zip(models, chunks, strict=True):
            self._times[str(m)] = np.sort(chunk).tolist()
        largest = max((s.size_bytes for s in ctx.catalog), default=0)
        self._lead_max = self._lead(largest, Tier.L3)

    # ------------------------------------------------------------------ what it knows

    def _next_use(self, model: str, at: float) -> float:
        """The first request of ``model`` at or after ``at``."""
        times = self._times.get(model)
        if times is None:
            return _INF
        i = bisect.bisect_left(times, at)
        return times[i] if i < len(times) else _INF

    def _lead(self, size: int, frm: Tier) -> float:
        """How long before a request a load from ``frm`` to L0 must start."""
        known = self._leads.get((size, frm))
        if known is not None:
            return known
        seconds = 0.0
        for tier in load_path(frm, Tier.L0):
            rate = self._ctx.bandwidth.get(HOP_INTO[tier], 0.0)
            seconds += (size / rate if rate > 0 else _INF) + self._ctx.hop_overhead_s
        lead = self._leads[size, frm] = seconds * (1 + self.margin_frac) + self.margin_s
        return lead

    # ------------------------------------------------------------------ unlimited: load at the request

    def on_request(self, model: str, at: float, node: str) -> list[Order]:
        if not self._ctx.unlimited:
            return []
        if at >= self._ctx.start:
            k = self._served.get(model, 0) + 1
            self._served[model] = k
            times = self._times.get(model)
            if times is not None and k < len(times) and times[k] <= at:
                return []  # another request at this instant: unload after that one
        spec = self._catalog[model]
        return [order_for(node, spec, OrderAction.EVICT, Tier.L0, at, reason=OrderReason.CAPACITY)]

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        horizon = now + self._tick_s
        if self._ctx.unlimited:
            return self._at_requests(now, horizon)
        return self._just_in_time(now, reports)

    def _at_requests(self, now: float, until: float) -> list[Order]:
        ts, ms = self._ts, self._ms
        lo = int(np.searchsorted(ts, now, side="left"))
        hi = int(np.searchsorted(ts, until, side="left"))
        node = next(iter(self._ctx.nodes))
        out: list[Order] = []
        last: tuple[str, float] | None = None
        for at, model in zip(ts[lo:hi].tolist(), ms[lo:hi].tolist(), strict=True):
            if (model, at) != last:
                spec = self._catalog[model]
                out.append(order_for(node, spec, OrderAction.PREFETCH, Tier.L0, at, ttl_s=60.0))
                last = (model, at)
        return out

    # ------------------------------------------------------------------ a cluster: just in time, Belady

    def _just_in_time(self, now: float, reports: Mapping[str, ExecutorState]) -> list[Order]:
        ts, ms = self._ts, self._ms
        lo = int(np.searchsorted(ts, now, side="left"))
        hi = int(np.searchsorted(ts, now + self._tick_s + self._lead_max, side="left"))
        if lo >= hi:
            return []
        models, first = np.unique(ms[lo:hi], return_index=True)
        upcoming = sorted((float(ts[lo + i]), str(m)) for m, i in zip(models, first, strict=True))
        closest: dict[str, dict[str, Tier]] = {}
        gpus: dict[str, _Gpus] = {}
        for name, report in reports.items():
            near: dict[str, Tier] = {}
            for tier in reversed(CACHE_TIERS):
                state = report.tier(tier)
                for r in state.resident if state is not None else ():
                    near[r.model] = tier
            closest[name] = near
            l0 = report.tier(Tier.L0)
            gpus[name] = _Gpus(
                capacity=[g.capacity_bytes for g in report.gpus],
                free=[g.capacity_bytes - g.used_bytes for g in report.gpus],
                l0={r.model: (r.bytes, tuple(r.gpus)) for r in (l0.resident if l0 is not None else ())},
            )
        out: list[Order] = []
        for at, model in upcoming:
            if self._planned.get(model) == at or any(model in g.l0 for g in gpus.values()):
                continue
            spec = self._catalog[model]

            def rank(name: str, model: str = model) -> tuple[int, int]:
                return (closest[name].get(model, Tier.L3).level, -sum(gpus[name].free))

            node = min(reports, key=rank)
            frm = closest[node].get(model, Tier.L3)
            begin = at - self._lead(spec.size_bytes, frm)
            if begin >= now + self._tick_s:
                continue  # a later tick starts it
            made = self._make_room(gpus[node], model, spec.size_bytes, at)
            if made is None:
                continue  # everything there is needed sooner: Belady would not load it yet
            victims, placed = made
            when = max(begin, now)
            for victim in victims:
                vspec = self._catalog[victim]
                action, tier = self._ctx.unload(node, vspec.size_bytes)
                out.append(order_for(node, vspec, action, tier, when, reason=OrderReason.CAPACITY))
            out.append(order_for(node, spec, OrderAction.PREFETCH, Tier.L0, when, gpus=placed))
            self._planned[model] = at
        return out

    def _make_room(
        self, book: _Gpus, model: str, size: int, at: float
    ) -> tuple[list[str], tuple[int, ...]] | None:
        """Residents to demote (farthest next use first, only ones needed after ``at``) until ``model``
        has GPUs; the plan's book is updated as if done."""
        n = gpu_shards(size, book.capacity)
        if n is None:
            return None  # no GPUs of the node can hold it, whatever leaves
        shard = -(-size // n)
        free = list(book.free)
        victims: list[str] = []
        next_use = {m: self._next_use(m, at) for m in book.l0}
        farthest = sorted(book.l0, key=lambda m: -next_use[m])
        # ``gpu_placement`` with the shard count worked out once, not at every try.
        placed = _placement(n, shard, free)
        for candidate in farthest:
            if placed is not None:
                break
            if next_use[candidate] <= at:
                break  # the rest are needed sooner than this model
            nbytes, on = book.l0[candidate]
            for g in on:
                free[g] += -(-nbytes // max(len(on), 1))
            victims.append(candidate)
            placed = _placement(n, shard, free)
        if placed is None:
            return None
        for g in placed:
            free[g] -= shard
        for v in victims:
            del book.l0[v]
        book.free = free
        book.l0[model] = (size, placed)
        return victims, placed


def _oracle(label: str, knob: str | None, inputs: PolicyInputs) -> Policy:
    from prewarm import InvalidInput

    if knob is not None:
        raise InvalidInput(f"policy {label!r}: the oracle takes no knob")
    return OraclePolicy(label)


register_policy("oracle", _oracle)
