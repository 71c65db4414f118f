"""Giving room back: prefetches that served no request (mispredictions), the cool-down that keeps such a
model from being fetched straight back, and forecast residents cooled out of memory under pressure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from forecaster import ModelForecast
from prewarm import Hint, OrderAction, OrderReason, Tier
from scheduler._cluster import ClusterState
from scheduler._planner._book import _Round
from scheduler._planner._config import PlannerConfig, _Decision


def _cooldowns(cluster: ClusterState, now: float, config: PlannerConfig) -> set[tuple[str, str]]:
    return {
        (o.node, o.model)
        for o in (*cluster.recent, *cluster.pending)
        if o.reason is OrderReason.MISPREDICTION and now - o.not_before < config.cooldown_s
    }


def _evict_mispredictions(rnd: _Round) -> None:
    now, config, wants = rnd.now, rnd.config, rnd.wants
    for name, book in rnd.books.items():
        for tier in (Tier.L0, Tier.L1):
            for r in book.node.residents(tier):
                spec = rnd.catalog.get(r.model)
                if spec is None or spec.version != r.version or not r.prefetched or r.pins:
                    continue
                if r.loaded_at is None or now - r.loaded_at < config.misprediction_window_s:
                    continue
                # A hint or a waiting request that still covers now keeps it: that is not a misprediction.
                if any(w.reason is not OrderReason.FORECAST and w.t0 <= now for w in wants.get(r.model, [])):
                    continue
                if (name, r.model) in rnd.mispredictions:
                    continue
                rnd.mispredictions.append((name, r.model))
                # Only the speculative copy goes. A GPU copy promoted from a host copy that was already
                # there is demoted back to it: dropping that L1 copy too would turn the wrong guess
                # into a slow disk load for the next real request. Otherwise EVICT at L1 drops L1 and
                # L0 and keeps the verified copy on local disk.
                keep_l1 = tier is Tier.L0 and any(
                    h.model == r.model and h.version == r.version and not h.prefetched
                    for h in book.node.residents(Tier.L1)
                )
                action, at = (OrderAction.DEMOTE, Tier.L1) if keep_l1 else (OrderAction.EVICT, Tier.L1)
                rnd.emit(
                    _Decision(
                        node=name,
                        spec=spec,
                        action=action,
                        tier=at,
                        reason=OrderReason.MISPREDICTION,
                        not_before=now,
                        deadline=now + config.order_ttl_s,
                        key_time=r.loaded_at,
                    )
                )
                for t in (Tier.L0,) if keep_l1 else (Tier.L0, Tier.L1):
                    book.drop(t, r.model)


def _headroom(rnd: _Round, tier: Tier, wanted: Sequence[str]) -> int:
    """Bytes the biggest wanted model that no node holds in ``tier`` or closer would need there.

    A model some node already holds that close is served there (requests go to the closest copy), so
    it puts no pressure on the others.
    """
    return max(
        (rnd.catalog[m].size_bytes for m in wanted if m in rnd.catalog and not rnd.held(m, tier)),
        default=0,
    )


def _cool_down(
    rnd: _Round, forecasts: Mapping[str, ModelForecast], hints: Sequence[Hint], wanted: Sequence[str]
) -> None:
    """Demote a forecast model out of GPU memory once a request has become unlikely.

    Idle memory costs nothing, so a model that may still be wanted is left where it is and only moved
    to make room for something worth more (``_make_room``). A model in L0 with ``P < cool_p`` goes to
    L1, so that a demand load finds room without the executor's LRU picking a victim blindly; undoing
    a wrong call costs a few seconds. Host memory cools only with a configured holding price (benefit
    below ``keep_ratio`` of it): a wrong demotion to disk costs a 20 s reload of a 140 GB model, and on
    noisy forecasts cooling there served more requests from disk than leaving it to room-making and the
    executor's LRU did. At most one demotion per model per round: L0→L1 and L1→L2 in the same round
    would throw away the copy just made. A tier cools only under pressure: when the biggest model wanted
    in the coming window would not fit in its free room. Only models with a forecast cool down: with no
    signal at all the planner leaves a resident alone.
    """
    now, config = rnd.now, rnd.config
    hinted = {h.model for h in hints}
    cooled: set[str] = set()
    headroom = {tier: _headroom(rnd, tier, wanted) for tier in (Tier.L0, Tier.L1)}
    for name, book in rnd.books.items():
        # Used within the window: whatever the forecast says, recent use is the better evidence (a
        # seasonal forecast read P≈0 for a model asked for every ten minutes); only room-making moves it.
        recent = {
            r.model
            for t in (Tier.L0, Tier.L1)
            for r in book.node.residents(t)
            if r.last_used is not None and now - r.last_used < config.window_s
        }
        for tier in (Tier.L0, Tier.L1):
            lower = tier.farther()
            # No pressure, nothing to cool: while the biggest model that may come in fits in free room,
            # a demand load evicts nobody, and an unlikely resident may still save a request.
            if book.free(tier) >= headroom[tier]:
                continue
            for entry in list(book.held[tier].values()):
                forecast = forecasts.get(entry.model)
                spec = rnd.catalog.get(entry.model)
                if forecast is None or spec is None or entry.protected or entry.model in hinted:
                    continue
                if entry.model in cooled or entry.model in rnd.moved or entry.model in recent:
                    continue
                if book.closest(entry.model).level < tier.level:
                    continue
                p = forecast.p_window(now, now + config.window_s)
                if tier is not Tier.L0 or p >= config.cool_p:
                    price = config.price_per_gb_s.get(tier, 0.0)
                    cost = spec.size_bytes / 1e9 * config.window_s * price
                    saved = rnd.valuer.raw_lead(book.node, spec.size_bytes, lower, tier)
                    if cost <= 0 or p * saved * spec.priority.weight >= config.keep_ratio * cost:
                        continue
                if entry.model not in book.held[lower]:
                    if book.free(lower) < entry.bytes:
                        continue
                    book.put(lower, entry.model, replace(entry, protected=True))
                book.drop(tier, entry.model)
                cooled.add(entry.model)
                rnd.emit(
                    _Decision(
                        node=name,
                        spec=spec,
                        action=OrderAction.DEMOTE,
                        tier=lower,
                        reason=OrderReason.FORECAST,
                        not_before=now,
                        deadline=now + config.order_ttl_s,
                        key_time=now,
                    )
                )
