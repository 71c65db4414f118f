"""Giving room back without a newcomer asking for it: only prefetches that served no request
(mispredictions), and, where memory has a price, copies not worth what holding them costs. Memory has
one where it is set (``memory_price``), and, where ``contended_memory_price`` is set, in host memory
where the executor has been giving host copies up on its own: there loads on request want the room,
and the LRU would give it up by recency alone.

Apart from these two rules nothing is demoted or evicted while nothing wants the room: room is made by
``_make_room`` when a placement needs it, by value. A cooling rule of old demoted unlikely models out of
GPU memory on its own; on a cluster where everything fits it made five times the cold starts of loading
on request, each demoted model's next request being one.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np

from forecaster import ModelForecast
from models import ModelSpec
from prewarm import CACHE_TIERS, Order, OrderAction, OrderReason, Tier, iso_utc
from scheduler._cluster import ClusterState, NodeState
from scheduler._planner._book import _BET_TIERS, _Book, _Entry, _make_room, _room_note, _Round
from scheduler._planner._config import PlannerConfig, _Decision
from scheduler._planner._want import NO_WANTS


def _cooldowns(cluster: ClusterState, now: float, config: PlannerConfig) -> set[str]:
    """The models not to prefetch now, on any node, because a prefetch of theirs was mispredicted.

    A misprediction says the forecast was wrong about the model, not about the node: cooled on one node
    only, a model a forecast kept wanting was fetched again on the next node the round after, and again
    on the next. The cool-down doubles with each misprediction since the model last served a request
    (a demand load, or a resident copy used after it), so that a forecast that keeps promising requests
    that never come costs a few prefetches a day, not one every window.
    """
    orders = (*cluster.recent, *cluster.pending)
    misses: dict[str, list[float]] = {}
    for o in orders:
        if o.reason is OrderReason.MISPREDICTION and o.not_before <= now:
            misses.setdefault(o.model, []).append(o.not_before)
    if not misses:
        return set()
    used: dict[str, float] = {}
    for o in orders:
        if o.demand and o.not_before <= now:
            used[o.model] = max(used.get(o.model, -math.inf), o.not_before)
    for node in cluster.nodes.values():
        for tier in CACHE_TIERS:
            for r in node.residents(tier):
                if r.last_used is not None:
                    used[r.model] = max(used.get(r.model, -math.inf), r.last_used)
    cooling = set()
    for model, times in misses.items():
        since = [t for t in times if t > used.get(model, -math.inf)]
        if since and now - max(since) < config.cooldown_s * 2 ** (len(since) - 1):
            cooling.add(model)
    return cooling


def _held_back(rnd: _Round, cluster: ClusterState) -> set[str]:
    """The models no guess may place this round, on any node: those cooling down after a misprediction
    (``_cooldowns``, and those this round demotes as one), and those a node is loading for a request that
    waits on them (``ClusterState.loading_on_request``). That load's copy is on its way where the model
    is asked for, so a guess's copy on another node would serve a request only if it were lost: on
    small host memories and slow links a sixth of some traces' guesses were such copies, none used."""
    cooling = _cooldowns(cluster, rnd.now, rnd.config) | {model for _, model in rnd.mispredictions}
    return cooling | cluster.loading_on_request


def _bets(
    cluster: ClusterState, now: float, nodes: Collection[str] | None = None
) -> dict[tuple[str, str], list[Order]]:
    """Per (node, model), the speculative prefetches and misprediction orders already out, oldest first;
    on ``nodes`` only, where given."""
    out: dict[tuple[str, str], list[Order]] = {}
    seen: set[str] = set()
    orders = (*cluster.recent, *cluster.pending)
    if nodes is not None:
        orders = tuple(o for o in orders if o.node in nodes)
    for o in sorted(orders, key=lambda o: (o.not_before, o.created_at, o.id)):
        if o.id in seen or o.not_before > now:
            continue
        seen.add(o.id)
        speculative = o.action is OrderAction.PREFETCH and not o.demand and o.tier in (Tier.L0, Tier.L1)
        if speculative or o.reason is OrderReason.MISPREDICTION:
            out.setdefault((o.node, o.model), []).append(o)
    return out


def _demote_mispredictions(rnd: _Round, cluster: ClusterState, nodes: Collection[str] | None = None) -> None:
    """Demote, one tier down, each prefetched copy that served no request within the misprediction
    window of the time its demand was predicted; count it once.

    The planner is the rule's one owner (the executor keeps no timer of its own unless told to). The
    copy judged is the one in the tier its prefetch was for, and only while it is the model's closest
    copy: the host copy an L0 prefetch left on its way is not a second bet, nor is the copy a
    misprediction demoted into. The window counts from the prefetch's predicted demand as the round
    that ordered it recorded it (``ClusterState.predicted``); for a copy whose order is not known (a
    restart lost it, or someone else loaded it), from when it was loaded. ``nodes``: judge these only
    (an incremental round: see ``_incremental``).
    """
    now, config, wants = rnd.now, rnd.config, rnd.wants
    judged = set(rnd.books if nodes is None else nodes)
    bets = _bets(cluster, now, judged if nodes is not None else None)
    for name in sorted(judged):
        node = rnd.books[name].node
        for tier in _BET_TIERS:
            for r in node.residents(tier):
                book = rnd.books[name]  # a demotion below replaces the book
                spec = rnd.catalog.get(r.model)
                if spec is None or spec.version != r.version or not r.prefetched or r.pins:
                    continue
                if r.model not in book.held[tier] or book.closest(r.model) is not tier:
                    continue
                if (name, r.model) in rnd.mispredictions:
                    continue
                orders = bets.get((name, r.model), [])
                if orders and orders[-1].reason is OrderReason.MISPREDICTION:
                    continue  # judged already: what is left is the copy it was demoted into
                bet = next((o for o in reversed(orders) if o.tier is tier), None)
                if bet is None and orders:
                    continue  # a copy on the way to a closer tier, or one this rule made
                predicted = cluster.predicted.get(bet.id) if bet is not None else None
                since = predicted if predicted is not None else r.loaded_at
                if since is None or now - since < config.misprediction_window_s:
                    rnd.open_bets.add((name, r.model))
                    continue
                # A hint or a waiting request that still covers now keeps it: that is not a misprediction.
                signals = wants.get(r.model, NO_WANTS).listed
                if any(w.reason is not OrderReason.FORECAST and w.t0 <= now for w in signals):
                    continue
                rnd.mispredictions.append((name, r.model))
                counted = "its predicted request" if predicted is not None else "its load"
                window = config.misprediction_window_s
                note = f"misprediction: unused {window:.0f} s from {counted} at {iso_utc(since)}"
                _demote_one_tier(
                    rnd, name, book, spec, tier, OrderReason.MISPREDICTION, key_time=since, note=note
                )


def _demote_one_tier(
    rnd: _Round,
    name: str,
    book: _Book,
    spec: ModelSpec,
    tier: Tier,
    reason: OrderReason,
    *,
    key_time: float,
    note: str,
) -> None:
    """Order ``spec``'s copy in ``tier`` one tier down (DEMOTE), or dropped (EVICT at ``tier``) where
    the tier below has no room for it even after demoting what is worth less there; ``note`` says
    which rule asked for it."""
    now, config = rnd.now, rnd.config
    lower = tier.farther()
    # Changed on a copy, put back at the end: the round's books are replaced, never changed in place
    # (``_Books`` keeps an index of them).
    book = book.copy()
    entry = book.held[tier][spec.id]
    action, at = OrderAction.EVICT, tier
    if lower in CACHE_TIERS and book.capacity[lower] >= entry.bytes:
        moves: list[tuple[str, Tier, Tier]] = []
        trial = book.copy()
        below = trial.held[lower].get(spec.id)
        worth = rnd.valuer.keep_value(spec, rnd.wants.get(spec.id, NO_WANTS), book.node, lower, now)
        if below is not None or _make_room(trial, lower, entry.bytes, worth, moves):
            action, at = OrderAction.DEMOTE, lower
            if below is None:
                trial.put(lower, spec.id, _Entry(spec.id, entry.bytes, worth, True))
            book = trial
            for model, frm, to in moves:
                rnd.moved.add(model)
                victim = rnd.catalog[model]
                down, where = (OrderAction.DEMOTE, to) if to in CACHE_TIERS else (OrderAction.EVICT, frm)
                rnd.emit(_room_decision(rnd, name, victim, down, where, _room_note(frm, spec.id)))
    for t in CACHE_TIERS:
        if t.level <= tier.level:
            book.drop(t, spec.id)
    rnd.books[name] = book
    rnd.moved.add(spec.id)
    rnd.emit(
        _Decision(
            node=name,
            spec=spec,
            action=action,
            tier=at,
            reason=reason,
            not_before=now,
            deadline=now + config.order_ttl_s,
            key_time=key_time,
            note=note,
        )
    )


def _room_decision(
    rnd: _Round, node: str, spec: ModelSpec, action: OrderAction, tier: Tier, note: str
) -> _Decision:
    """A demotion or eviction that makes room, due now; ``note`` says for what (``_room_note``)."""
    return _Decision(
        node=node,
        spec=spec,
        action=action,
        tier=tier,
        reason=OrderReason.CAPACITY,
        not_before=rnd.now,
        deadline=rnd.now + rnd.config.order_ttl_s,
        key_time=rnd.now,
        note=note,
    )


def _release_priced(rnd: _Round, nodes: Collection[str] | None = None) -> None:
    """Where memory has a price, release (one tier down) each copy whose hold is worth less than it costs.

    Held until the next decision, a copy costs ``memory_price`` × GB for as long as it waits for a
    request (released, the next request would load it back), and is worth what it saves that request
    (``_Valuer.saved``, from the tier it would fall back to) if one comes: with the chance of a request
    per second ``h`` (the forecast's hazard, constant over the step), the hold is worth ``h × saved``
    per second against ``memory_price / 60 × GB``. For a memoryless model that is the whole question:
    hold the cheap ones, release the expensive ones — and under ``objective="models"`` (``saved``
    divided by how often the model is used) a Poisson model's use cancels out, so what decides is its
    size alone. Where the chance rises later in the forecast, a copy worth holding until then
    (``_worth_holding``) is kept through the lull unless a prefetch could bring it back in time
    (``_refetchable``): a copy given up comes back only by a prefetch, and a rise spread over hours
    never makes one window likely enough for one. A prefetch still within its misprediction window is
    the misprediction rule's; pinned, recently used or loaded, and this round's copies are never
    released; a model with no forecast is left alone (no signal, no decision). ``nodes``: these only
    (an incremental round, which applies ``memory_price`` only: the contended price is judged on the
    planning interval, by full rounds). The price per tier and node is ``_price_per_gb_s``.
    """
    config = rnd.config
    if config.memory_price <= 0 and (config.contended_memory_price <= 0 or nodes is not None):
        return
    now, step = rnd.now, config.decision_interval_s
    for name in sorted(rnd.books if nodes is None else nodes):
        for tier in (Tier.L0, Tier.L1):
            cost_per_gb_s = _price_per_gb_s(config, rnd.books[name].node, tier)
            if cost_per_gb_s <= 0:
                continue
            for entry in sorted(rnd.books[name].held[tier].values(), key=lambda e: e.model):
                book = rnd.books[name]  # a release below replaces the book
                if entry.model not in book.held[tier]:
                    continue
                spec = rnd.catalog.get(entry.model)
                forecast = rnd.forecasts.get(entry.model)
                if spec is None or forecast is None or entry.protected:
                    continue
                if entry.model in rnd.moved or (name, entry.model) in rnd.open_bets:
                    continue
                if book.closest(entry.model) is not tier:
                    continue
                # A hint or a waiting request due before the next decision: as if it came this step.
                signalled = [
                    _rate(w.p, step)
                    for w in rnd.wants.get(entry.model, NO_WANTS).listed
                    if w.reason is not OrderReason.FORECAST and w.t0 <= now + step
                ]
                hazard = max([_hazard(forecast, now, step), *signalled])
                saved = rnd.valuer.saved(spec, book.node, _fallback(book, entry.model, tier), tier)
                cost = cost_per_gb_s * entry.bytes / 1e9
                if hazard * saved >= cost:
                    continue
                if _worth_holding(forecast, now, saved, cost) and not _refetchable(
                    rnd, spec, forecast, now, saved, cost
                ):
                    continue
                note = "the memory it holds costs more than the chance of a request pays for"
                _demote_one_tier(rnd, name, book, spec, tier, OrderReason.CAPACITY, key_time=now, note=note)


def _break_turns(rnd: _Round) -> None:
    """End models' turns on a node's GPUs: demote to disk the host copy that sends a model's loads to a
    node where they keep displacing GPU copies in use of models too large for its host memory
    (``PlannerConfig.turns_to_break``, ``Departures``).

    A load goes to a node holding its model in host memory, whatever it displaces there. A model whose
    host copy sits on the node where a busy model too large for the host cache fills the GPUs displaces
    it at each of its requests, and the busy model's reload from disk displaces the first, both cold each
    turn, for as long as the host copy stays (on a cluster of 64 GB host caches, for hours:
    docs/benchmarks.md, the thirty-third and thirty-fourth stops). Load-on-request rarely starts such
    turns, since its loads go where the oldest copies are; a prefetch stages a model where the planner
    chose. Demoted, the model's next load goes where the LRU gives up the oldest copies, and its host
    copy forms there. Turns that displace a model host memory can hold are not counted: they are quick,
    and the host copy saves the newcomer a load from disk at each of them (on the suite's tight
    clusters, demoting such host copies raised the share of requests waiting > 5 s 1.30 ×)."""
    least = rnd.config.turns_to_break
    if least <= 0:
        return
    for name in sorted(rnd.books):
        for model, count in sorted(rnd.books[name].node.turns.items()):
            book = rnd.books[name]  # a demotion below replaces the book
            spec = rnd.catalog.get(model)
            if count < least or spec is None or model in rnd.moved or model not in book.held[Tier.L1]:
                continue
            note = f"turns: {count} of its loads here displaced busy models too large for host memory"
            _demote_one_tier(
                rnd, name, book, spec, Tier.L1, OrderReason.CAPACITY, key_time=rnd.now, note=note
            )


def _price_per_gb_s(config: PlannerConfig, node: NodeState, tier: Tier) -> float:
    """What holding a GB in ``tier`` of ``node`` costs a second: ``memory_price`` where it is set, else
    ``contended_memory_price`` in host memory where the node's executor has given host copies up on its
    own lately (``NodeState.unused_for``: loads on request want the room), else nothing. Not in GPU
    memory: a GPU copy released is its next request's cold start, and on a cluster where everything
    fits, one load displacing another on a fragmented GPU made a whole tier look contended."""
    if config.memory_price > 0:
        return config.memory_price / 60.0
    if tier is Tier.L1 and any(t is tier for t, _ in node.unused_for):
        return config.contended_memory_price / 60.0
    return 0.0


def _rate(p: float, span_s: float) -> float:
    """The constant chance per second that gives ``p`` over ``span_s``."""
    return -math.log1p(-min(p, 1.0 - 1e-12)) / span_s


def _hazard(forecast: ModelForecast, now: float, step: float) -> float:
    """The forecast's chance of a request per second over the next ``step``: read over the whole
    buckets the step touches (from ``now``), since a bucket's chance is not split within it."""
    b = forecast.bucket_s
    covered_end = forecast.start + math.ceil((now + step - forecast.start) / b) * b
    span = max(covered_end - now, step)
    return _rate(forecast.p_window(now, now + step), span)


def _worth_holding(forecast: ModelForecast, now: float, saved: float, cost_per_s: float) -> bool:
    """Whether holding a copy until its next request, or until some time in the forecast if none comes
    by then, is worth what it costs for some such time: ``saved`` if the request comes, against
    ``cost_per_s`` for each second held waiting for it, read bucket by bucket from ``now`` with the
    chance of no request so far. For a memoryless model every such time gives the answer of the
    hazard now; a model whose chance dips after a request and rises hours later (a job that runs every
    few hours, its period drifting) is worth holding through the dip."""
    b, i0, log_miss = forecast.bucket_s, _bucket_at(forecast, now), forecast.log_miss
    if i0 >= len(log_miss) - 1:
        return False
    log_none = log_miss[i0:] - log_miss[i0]  # log P(no request before each bucket), and after the last
    held = np.full(len(log_none) - 1, float(b))
    held[0] = max(forecast.start + (i0 + 1) * b - now, 1.0)
    value = saved * -np.expm1(log_none[1:]) - cost_per_s * np.cumsum(held * np.exp(log_none[:-1]))
    return bool(value.max() > 0.0)


def _bucket_at(forecast: ModelForecast, now: float) -> int:
    """The forecast's bucket that holds ``now`` (0 before its start)."""
    return max(0, math.floor((now - forecast.start) / forecast.bucket_s))


def _refetchable(
    rnd: _Round, spec: ModelSpec, forecast: ModelForecast, now: float, saved: float, cost_per_s: float
) -> bool:
    """Whether a window starting within the planner's horizon (``horizon_s``, where it looks for windows
    to prefetch for) is likely enough for a prefetch to bring ``spec`` back in time: ``P × weight >
    (1 - P) × miss_penalty × min(weight, 1)``, the planner's speculation test less the transfer (a lower
    bar than the test itself, so a copy is held through a lull only where no prefetch could end it). A
    rise beyond the horizon does not count: no prefetch is planned for it, and none may be once it is in
    reach (on the suite's tune cases counting it released copies that came back cold).

    Nor does a window that begins within one window of now (a lull shorter than the windows the planner
    prefetches for), or one that requests are likely to precede: the chance of a request before it
    begins, times ``saved``, must be less than holding the copy until then costs (``cost_per_s``).
    Released for such a window, a copy comes back only after the requests that precede it came cold: on
    moving_peak (draw 3, ``--unlimited``) a 7 GB model used 105 times a day, whose forecast (yesterday's
    minutes) has empty minutes between likely ones, was released in each empty minute and fetched
    back for the next window, 62 of its 195 requests cold against none for the hybrid histogram."""
    config = rnd.config
    weight = rnd.valuer.weight(spec)
    charge = config.miss_penalty * min(weight, 1.0)
    if weight + charge <= 0:
        return False
    b, i0, log_miss = forecast.bucket_s, _bucket_at(forecast, now), forecast.log_miss
    width = max(1, math.ceil(config.window_s / b))
    last = min(len(log_miss) - 1 - width, i0 + math.floor(config.horizon_s / b))  # as the planner scans
    first = i0 + width
    if last < first:
        return False
    p = -np.expm1(log_miss[first + width : last + width + 1] - log_miss[first : last + 1])
    before = -np.expm1(log_miss[first : last + 1] - log_miss[i0])  # a request before the window begins
    wait_s = forecast.start + np.arange(first, last + 1) * b - now
    return bool(((p > charge / (weight + charge)) & (before * saved < cost_per_s * wait_s)).any())


def _fallback(book: _Book, model: str, tier: Tier) -> Tier:
    """Where a request finds ``model`` once its copy in ``tier`` goes one tier down: there, if that tier
    can hold it, else the closest copy farther still (L3 at worst)."""
    lower = tier.farther()
    if lower in CACHE_TIERS and book.capacity[lower] > 0:
        return lower
    return next((t for t in CACHE_TIERS if t.level > lower.level and model in book.held[t]), Tier.L3)
