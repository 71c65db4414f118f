"""What a tier is worth: seconds of waiting a copy there saves, what holding it costs, and when a
prefetch must start to be there in time.

Everything here is a function of the config, the node's measured bandwidth, the model and its forecast
rate; the only state is memos: of hop times (``_HopTimes``), which a ``PlannerMemo`` keeps between
rounds, and, in a ``_Valuer``, of the figures that depend on link rates, size, weight and request rate
alone, which repeat across models (a round's valuer, kept for the incremental rounds after it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence

from forecaster import ModelForecast
from models import ModelSpec
from prewarm import CACHE_TIERS, Tier
from scheduler._cluster import NodeState
from scheduler._planner._config import _INF, PlannerConfig
from scheduler._planner._want import _Want, _Wants

_HopTimes = Callable[[tuple[float, ...], float, int, int, int], float]
"""``_hops_s`` behind a memo: (rates, overhead, size, from level, to level) -> seconds."""


def _hop_times() -> _HopTimes:
    # Asked for every (model, node, tier) of every round, with few distinct arguments.
    return functools.lru_cache(maxsize=65_536)(_hops_s)


def _hops_s(rates: tuple[float, ...], overhead: float, size: int, frm: int, to: int) -> float:
    return sum(
        (size / rate if rate > 0 else _INF) + overhead
        for level, rate in enumerate(rates)
        if to <= level < frm
    )


def _model_weights(
    now: float, forecasts: Mapping[str, ModelForecast], config: PlannerConfig
) -> dict[str, float]:
    """Under ``objective="models"``, what one cold start of each forecast model weighs against one of a
    model used ``reference_daily_requests`` times a day; nothing under ``requests`` (all weigh 1)."""
    if config.objective != "models":
        return {}
    out = {}
    for model, forecast in forecasts.items():
        daily = forecast.daily_requests
        if not math.isfinite(daily):
            span = forecast.end - now
            daily = forecast.expected_in(now, forecast.end) * 86_400.0 / span if span > 0 else 0.0
        out[model] = config.reference_daily_requests / max(daily, 1.0)
    return out


_QUEUE_RATE_FLOOR = 1e-4
"""Requests per second (one in ~3 hours) below which none are counted queueing behind a load: what
they add to a 700-second download (140 GB at 0.2 GB/s) is under 4 %."""


def _model_rates(expected: Mapping[str, float], config: PlannerConfig) -> dict[str, float]:
    """Each model's requests per second from its ``expected`` requests over the coming horizon, for the
    requests that queue behind a load (``_Valuer.saved``): on a grid of eight steps an octave, so that
    the valuer's memos still serve models alike, and none below ``_QUEUE_RATE_FLOOR``."""
    out = {}
    for model, n in expected.items():
        rate = n / config.horizon_s
        if rate >= _QUEUE_RATE_FLOOR:
            out[model] = 2.0 ** (round(8.0 * math.log2(rate)) / 8.0)
    return out


class _Valuer:
    """Values tiers under one config, with hop times from ``hops``; ``weights`` scales what a model's
    requests are worth (``_model_weights``; 1 for a model it does not name) on top of its priority;
    ``rates`` says how many of them queue behind a load (``_model_rates``; none for a model it does not
    name)."""

    def __init__(
        self,
        config: PlannerConfig,
        hops: _HopTimes,
        weights: Mapping[str, float] | None = None,
        rates: Mapping[str, float] | None = None,
    ) -> None:
        self.config = config
        self._hops = hops
        self._weights = weights or {}
        self._rates = rates or {}
        # Figures that depend on the link rates, the size, the weight and the request rate alone, which
        # repeat across models: by those and what else they take (a round asks for one per model or per
        # resident).
        self._gains: dict[tuple[object, ...], dict[Tier, float]] = {}
        self._weight: dict[str, float] = {}
        self._keeps: dict[tuple[object, ...], tuple[float, float]] = {}
        self._figures: dict[
            tuple[object, ...], tuple[dict[Tier, float], dict[Tier, float], dict[Tier, float]]
        ] = {}
        self._prices: dict[int, dict[Tier, float]] = {}

    def weight(self, spec: ModelSpec) -> float:
        """What one second ``spec``'s requests wait, or one of its cold starts, weighs."""
        weight = self._weight.get(spec.id)
        if weight is None:
            weight = self._weight[spec.id] = spec.priority.weight * self._weights.get(spec.id, 1.0)
        return weight

    def raw_lead(self, node: NodeState, size: int, frm: Tier, to: Tier) -> float:
        """Seconds to move ``size`` bytes from tier ``frm`` to the closer tier ``to``."""
        return self._hops(node.hop_rates, self.config.hop_overhead_s, size, frm.level, to.level)

    def lead(self, node: NodeState, size: int, frm: Tier, to: Tier) -> float:
        """How long before it is wanted a move from ``frm`` to ``to`` must start: the hops, with margin."""
        config = self.config
        raw = self.raw_lead(node, size, frm, to)
        return raw * (1 + config.lead_margin_frac) + config.lead_margin_s if raw > 0 else 0.0

    def gains(self, spec: ModelSpec, nodes: Sequence[NodeState]) -> dict[Tier, float]:
        """Per tier, the most a certain request could be worth: waiting saved from L3 on the slowest node,
        and in L0 the cold start itself, with the requests queued behind it (``_queued``). (The same
        dict for models alike: not to be changed.)"""
        weight = self.weight(spec)
        rate = self._rate(spec)
        key = (spec.size_bytes, weight, rate, *(n.hop_rates for n in nodes))
        gains = self._gains.get(key)
        if gains is None:
            gains = self._gains[key] = {
                tier: weight
                * self._queued(
                    max((self.raw_lead(n, spec.size_bytes, Tier.L3, tier) for n in nodes), default=0.0),
                    tier,
                    rate,
                )
                for tier in CACHE_TIERS
            }
        return gains

    def saved(self, spec: ModelSpec, node: NodeState, frm: Tier, to: Tier) -> float:
        """Weighted seconds a request saves by finding ``spec`` in ``to`` rather than in ``frm``: the
        transfer, and, when ``to`` is GPU memory, the cold start itself; for the requests that queue
        behind that transfer too (``_queued``)."""
        if to.level >= frm.level:
            return 0.0
        lead = self.raw_lead(node, spec.size_bytes, frm, to)
        return self.weight(spec) * self._queued(lead, to, self._rate(spec))

    def _rate(self, spec: ModelSpec) -> float:
        """Requests per second that ``_queued`` counts behind a load of ``spec`` (``_model_rates``)."""
        return self._rates.get(spec.id, 0.0)

    def _queued(self, lead: float, to: Tier, rate: float) -> float:
        """Seconds waited, and cold starts, that a copy ``lead`` seconds closer saves: the request's own,
        and those of the ``rate × lead`` requests that arrive while it loads and wait for the same load
        (half of it, on average). Valued as one request's wait, a busy model's disk copy was worth less
        than a guess about a larger, rarer model and was evicted for it; its next load came from object
        storage, minutes long, with hundreds of requests queued behind it (azure_mix-like traces,
        docs/benchmarks.md)."""
        return lead * (1.0 + rate * lead / 2.0) + self._cold_start(to) * (1.0 + rate * lead)

    def _cold_start(self, tier: Tier) -> float:
        # Only a copy in GPU memory avoids the cold start; one in host memory shortens it.
        return self.config.cold_start_s if tier is Tier.L0 else 0.0

    def net(
        self, spec: ModelSpec, want: _Want, node: NodeState, frm: Tier, to: Tier, *, move: bool = True
    ) -> float:
        """benefit - cost of having ``spec`` in ``to`` (rather than ``frm``) for the wanted window.

        Holding costs the memory price over the window and the lead. ``move``: the bytes still have to
        travel, so a wrong guess wastes what ``wasted`` counts, ``miss_penalty`` times: into GPU memory
        it counts like the cold start it was meant to avoid, so the threshold on P is then the same for
        a 2 GB and a 140 GB model. A resident already there (``move=False``) risks nothing.
        """
        # What does not depend on the want, kept per model alike (a round asks ``net`` for each want of
        # a model: a model with thousands of live hints was valued as many times).
        saved, wasted, leads = self._tier_figures(spec, node, frm)
        if to not in saved:  # not closer than ``frm``: nothing memoised for it
            saved, wasted = {to: self.saved(spec, node, frm, to)}, {to: self.wasted(spec, node, frm, to)}
            leads = {to: self.lead(node, spec.size_bytes, frm, to)}
        benefit = want.p * saved[to]
        held = (want.t1 - want.t0) + leads[to]
        cost = spec.size_bytes / 1e9 * held * self.config.price(to)
        if move:
            cost += (1.0 - want.p) * wasted[to] * self.config.miss_penalty
        return benefit - cost

    def wasted(self, spec: ModelSpec, node: NodeState, frm: Tier, to: Tier) -> float:
        """The seconds a wrong guess that moved ``spec`` from ``frm`` to ``to`` wasted: the hops into
        L1/L0 from the staged disk copy, and the cold start into GPU memory; and the download from
        object storage as far as loads on request need that link (``NodeState.staging_busy``). The disk
        copy stays useful either way, and on a link requests leave idle a download takes nothing from
        them; on a link they keep busy it delays them and displaces disk copies they will read.

        Weighed as a request of the model's own would be (``_model_weights``) where that is less than
        one of a standard model's, so that a guess about a busy model under ``objective="models"`` is
        made at the odds of any other (P > 2/3 with the default ``miss_penalty``): charged in full,
        a model used ten times an hour was not guessed at any P, and was cold on every request its
        memory price had released it for. A rarely used model's guesses waste no more than anyone's."""
        staged = Tier.L2 if frm.level > Tier.L2.level else frm
        hops = self.raw_lead(node, spec.size_bytes, staged, to)  # none for the disk itself
        if staged is not frm and node.staging_busy > 0:
            hops += node.staging_busy * self.raw_lead(node, spec.size_bytes, frm, staged)
        return (hops + self._cold_start(to)) * self._miss_weight(spec)

    def _miss_weight(self, spec: ModelSpec) -> float:
        """What ``wasted`` weighs a wrong guess about ``spec`` by: its per-model weight, at most 1."""
        return min(self._weights.get(spec.id, 1.0), 1.0)

    def tier_figures(
        self, spec: ModelSpec, node: NodeState, frm: Tier
    ) -> tuple[dict[Tier, float], dict[Tier, float]]:
        """Per tier closer than ``frm``: what a copy there saves a request on ``node`` (``saved``) and
        what a wrong guess that moved it there wastes (``wasted``). With them a candidate's wants are
        bounded as ``net`` computes it. (The same dicts for models alike.)"""
        saved, wasted, _ = self._tier_figures(spec, node, frm)
        return saved, wasted

    def _tier_figures(
        self, spec: ModelSpec, node: NodeState, frm: Tier
    ) -> tuple[dict[Tier, float], dict[Tier, float], dict[Tier, float]]:
        """``tier_figures`` and, per tier, the ``lead`` of the move there, by what they depend on."""
        rate = self._rate(spec)
        weights = (self.weight(spec), self._miss_weight(spec))
        key = (node.hop_rates, node.staging_busy, frm, spec.size_bytes, *weights, rate)
        kept = self._figures.get(key)
        if kept is None:
            tiers = [t for t in CACHE_TIERS if t.level < frm.level]
            kept = self._figures[key] = (
                {t: self.saved(spec, node, frm, t) for t in tiers},
                {t: self.wasted(spec, node, frm, t) for t in tiers},
                {t: self.lead(node, spec.size_bytes, frm, t) for t in tiers},
            )
        return kept

    def held_price(self, spec: ModelSpec) -> dict[Tier, float]:
        """Per tier, what holding ``spec`` costs per second. (The same dict for models of a size.)"""
        size = spec.size_bytes
        kept = self._prices.get(size)
        if kept is None:
            kept = self._prices[size] = {tier: size / 1e9 * self.config.price(tier) for tier in CACHE_TIERS}
        return kept

    def keep_value(self, spec: ModelSpec, wants: _Wants, node: NodeState, tier: Tier, now: float) -> float:
        """What holding a resident in ``tier`` over the coming window is worth (0 with no signal)."""
        soon = now + self.config.window_s
        if wants.demanded_by(soon):
            return _INF
        current = wants.chances_until(soon)
        if not current:
            return 0.0
        # ``net(..., move=False)`` of each want, with what does not depend on the want computed once
        # per model alike (a round values every resident: this was a fifth of a round at 10,000 models).
        rate = self._rate(spec)
        key = (node.hop_rates, tier, spec.size_bytes, self.weight(spec), rate)
        figures = self._keeps.get(key)
        if figures is None:
            frm = tier.farther()
            figures = self._keeps[key] = (
                self.saved(spec, node, frm, tier),
                self.lead(node, spec.size_bytes, frm, tier),
            )
        saved, lead = figures
        per_s = spec.size_bytes / 1e9
        price = self.config.price(tier)
        best = 0.0
        for p, held in current:
            best = max(best, p * saved - per_s * (held + lead) * price)
        return best
