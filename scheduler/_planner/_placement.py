"""Placement: for each wanted model the best node and tier, then placing it into that node's book.

``_best_candidate`` values every tier closer than where the model is, on each node, for its soonest
want worth acting on; equally good nodes are all kept, and ``_least_loaded`` picks among them when the
model is placed, against the books as earlier placements left them. ``_place`` makes room (``_make_room``)
or falls back one tier, and emits the prefetch with the demotions that make its room; what fits nowhere
is deferred to a later round.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from models import ModelSpec
from prewarm import CACHE_TIERS, OrderAction, OrderReason, Tier, effect, gpu_shards, iso_utc
from scheduler._cluster import NodeState, copy_width
from scheduler._planner._book import _Book, _Entry, _make_room, _room_note, _Round
from scheduler._planner._config import _INF, Placement, _Decision
from scheduler._planner._want import NO_WANTS, _Reread, _Want, _Wants


class _Candidate(NamedTuple):
    """(A tuple: a model held nowhere has one per node, and ``_replace`` copies it to each node cheaply.)"""

    spec: ModelSpec
    want: _Want
    node: str
    frm: Tier
    tier: Tier
    value: float
    not_before: float


def _payers(spec: ModelSpec, wants: _Wants, rnd: _Round) -> _Wants:
    """The wants for which some tier on some node may be worth its cost: an upper bound, to prune.

    Benefit is at most the waiting saved from L3 on the slowest node; holding costs at least the window.
    Demand always pays; forecast wants were pruned by the same bound when they were made: only hints are
    bounded here.
    """
    if not wants.signalled(OrderReason.HINT):
        return wants  # the common case: no hint to bound, no gains to compute
    gains = rnd.gains[spec.id]
    gb = spec.size_bytes / 1e9
    prices = {tier: rnd.config.price(tier) for tier in CACHE_TIERS}
    return wants.listing(
        [
            w
            for w in wants.listed
            if w.reason is not OrderReason.HINT
            or any(w.p * gains[t] > (w.t1 - w.t0) * gb * prices[t] for t in CACHE_TIERS)
        ]
    )


def _best_candidate(rnd: _Round, spec: ModelSpec, wants: _Wants, cooling: set[str]) -> list[_Candidate]:
    """The tier and want to act on for ``spec``, one option per equally good node; none: nothing to do."""
    if rnd.held(spec.id, Tier.L0) or not wants:
        return []  # nothing wanted, or in GPU memory somewhere already: every option would be refused
    demand = wants.signalled(OrderReason.DEMAND)
    if spec.id in cooling and not demand:
        return []
    # Waiting requests first, then by time, made as far as the nodes read them (most read only the
    # soonest few of a model's tens of wants).
    ordered = _Reread(wants.by_time(demand_first=demand))
    reach = _Reach(demand, *wants.reach())
    # A node's best option depends only on its link rates, how busy requests keep its link from object
    # storage, its capacities and where the model is there: the nodes of a class (``_Round.classes``)
    # that do not hold the model are valued once, and only the few that hold it one by one. Node by
    # node, this was most of a round at a hundred nodes.
    nets: dict[tuple[tuple[float, ...], float, Tier, Tier, int], float] = {}
    price = rnd.valuer.held_price(spec)
    holders = rnd.books.holders(spec.id)
    per_node: list[tuple[int, str, _Candidate]] = []  # (the node's place in the books, name, best)
    for name in holders:
        book = rnd.books[name]
        frm = book.closest(spec.id)
        tiers = _open_tiers(rnd, spec, book, frm, price, reach)
        best = _node_best(rnd, spec, ordered, book, frm, tiers, price, nets) if tiers else None
        if best is not None:
            per_node.append((rnd.position(name), name, best))
    absent: list[tuple[_Candidate, list[str]]] = []
    # A node that holds the model closer than L3 wins over every one that does not, unless it would have
    # to make room for a speculative copy that another node has free room for: demoting a resident there
    # costs what the resident saves, and the other node's room was idle.
    crowded = _crowded(rnd, spec, [c for _, _, c in per_node])
    if per_node and not wants.signalled(OrderReason.DEMAND):
        rnd.room_read[spec.id] = crowded
    if not per_node or crowded is not None:
        # Each class by one of its nodes that does not hold the model (holders are few).
        classes = [
            (names, one, _open_tiers(rnd, spec, rnd.books[one], Tier.L3, price, reach))
            for names in rnd.classes()
            if (one := next((n for n in names if n not in holders), None)) is not None
        ]
        if not per_node and all(rnd.held(spec.id, t) for _, _, tiers in classes for t in tiers):
            return []  # whatever their best, it is a tier some node holds the model in already
        for names, one, tiers in classes:
            best = _node_best(rnd, spec, ordered, rnd.books[one], Tier.L3, tiers, price, nets)
            if best is None:
                continue
            others = [n for n in names if n not in holders] if holders else names
            if crowded is not None:
                if best.tier.level > crowded.level:
                    continue
                others = [n for n in others if _fits_free(rnd.books[n], Tier.L3, best.tier, spec.size_bytes)]
            if others:
                absent.append((best, others))
        if absent:
            per_node = []
    if not per_node and not absent:
        return []
    # A node that already holds the model closer wins (fewer hops), then value; among the nodes left,
    # the least loaded when it is placed (see plan_detailed and _least_loaded).
    top = max((-c.frm.level, c.value) for c in (*(c for _, _, c in per_node), *(c for c, _ in absent)))
    chosen = [(p, n, c) for p, n, c in per_node if (-c.frm.level, c.value) == top]
    tops = [
        (rnd.position(names[0]), names, best)
        for best, names in absent
        if (-best.frm.level, best.value) == top
    ]
    # Already somewhere at least as close on some node (the first option's tier): nothing to do.
    first = min((*((p, c) for p, _, c in chosen), *((p, c) for p, _, c in tops)), key=lambda pc: pc[0])
    if rnd.held(spec.id, first[1].tier):
        return []
    for _, names, best in tops:
        chosen.extend((rnd.position(n), n, best) for n in names)
    chosen.sort(key=lambda pnc: pnc[0])
    return [c if c.node == n else c._replace(node=n) for _, n, c in chosen]


def _fits_free(book: _Book, frm: Tier, tier: Tier, size: int) -> bool:
    """Whether a copy loaded from ``frm`` into ``tier`` fits the free room of every tier it fills."""
    return all(book.fits(t, size) for t in CACHE_TIERS if tier.level <= t.level < frm.level)


def _crowded(rnd: _Round, spec: ModelSpec, options: Sequence[_Candidate]) -> Tier | None:
    """The closest tier of the holders' speculative ``options`` when none of them fits its node's free
    room (each would make room by demoting a resident); None when one fits, or one serves a waiting
    request (which takes the quickest path whatever it displaces), or there is none."""
    if not options or any(c.want.demand for c in options):
        return None
    size = spec.size_bytes
    if any(_fits_free(rnd.books[c.node], c.frm, c.tier, size) for c in options):
        return None
    return min((c.tier for c in options), key=lambda t: t.level)


def _node_best(
    rnd: _Round,
    spec: ModelSpec,
    ordered: Iterable[_Want],
    book: _Book,
    frm: Tier,
    tiers: Sequence[Tier],
    price: Mapping[Tier, float],
    nets: dict[tuple[tuple[float, ...], float, Tier, Tier, int], float],
) -> _Candidate | None:
    """The best option on ``book``'s node for a model held there in ``frm`` (L3: not held there), into
    one of ``tiers`` (``_open_tiers``)."""
    penalty = rnd.config.miss_penalty
    saved, wasted = rnd.valuer.tier_figures(spec, book.node, frm)
    best: _Candidate | None = None
    for i, want in enumerate(ordered):
        # The soonest want with any worthwhile tier wins (_tier_key): later ones need not be valued.
        if best is not None and not want.demand and want.t0 > best.want.t0:
            break
        for tier in tiers:
            bound = (
                want.p * saved[tier]
                - (1.0 - want.p) * wasted[tier] * penalty
                - (want.t1 - want.t0) * price[tier]
            )
            if bound <= 0 and not want.demand:
                continue  # not worth it, whatever the exact figures
            key = (book.node.hop_rates, book.node.staging_busy, frm, tier, i)
            net = nets.get(key)
            if net is None:
                net = _INF if want.demand else rnd.valuer.net(spec, want, book.node, frm, tier)
                nets[key] = net
            if net <= 0:
                continue
            lead = rnd.valuer.lead(book.node, spec.size_bytes, frm, tier)
            cand = _Candidate(spec, want, book.node.name, frm, tier, net, max(rnd.now, want.t0 - lead))
            # A waiting request first; then the soonest want (a later one is planned in a later
            # round); then the tier worth most, the closer one on a tie.
            if best is None or _tier_key(cand) > _tier_key(best):
                best = cand
    return best


def _open_tiers(
    rnd: _Round, spec: ModelSpec, book: _Book, frm: Tier, price: Mapping[Tier, float], reach: _Reach
) -> list[Tier]:
    """The tiers closer than ``frm`` that ``book``'s node can hold ``spec`` in and that some want may pay
    for: a tier that not even the likeliest, shortest want could pay for is worth no want (most rarely
    used models, whose every window would otherwise be valued on each node)."""
    saved, wasted = rnd.valuer.tier_figures(spec, book.node, frm)
    tiers = [t for t in saved if book.can_hold(t, spec.size_bytes)]
    if reach.demand:
        return tiers
    penalty = rnd.config.miss_penalty
    return [t for t in tiers if reach.may_pay(saved[t], wasted[t], penalty, price[t])]


class _Reach(NamedTuple):
    """What bounds ``_node_best``'s figure for a model's wants: the likeliest and the shortest of them,
    and whether any is a waiting request (those are always worth acting on)."""

    demand: bool
    p: float
    held_s: float

    def may_pay(self, saved: float, wasted: float, penalty: float, price: float) -> bool:
        """Whether some want could have ``p × saved − (1 − p) × wasted × penalty − held × price > 0``
        (``_node_best``'s bound, multiplied as ``_Valuer.net`` multiplies): the figure grows with ``p``
        (``saved`` and ``wasted`` are not negative) and, at a price that is not negative, falls with
        the time held."""
        if price < 0:
            return True
        return self.p * saved - (1.0 - self.p) * wasted * penalty - self.held_s * price > 0


def _tier_key(c: _Candidate) -> tuple[bool, float, float, int]:
    return (c.want.demand, -c.want.t0, c.value, -c.tier.level)


def _place(rnd: _Round, cand: _Candidate) -> None:
    spec = cand.spec
    value = _INF if cand.want.demand else cand.value
    # Try the target, then each tier one step farther that is still closer than where the model is; none
    # for a model demoted this round to make room for something worth more: fetching it back would thrash.
    tier: Tier | None = None if spec.id in rnd.moved else cand.tier
    while tier is not None and tier.level < cand.frm.level:
        worth = _worth_there(rnd, rnd.books[cand.node], cand, tier)
        if worth is None:
            break  # a speculative fallback must still be worth its cost; a waiting request takes any tier
        if worth and _place_in(rnd, cand, tier, value):
            return
        nxt = tier.farther()
        tier = nxt if nxt in CACHE_TIERS else None
    rnd.deferred.append(
        Placement(spec.id, cand.node, cand.tier, cand.want.reason, cand.not_before, cand.want.t1, value)
    )


def _place_in(rnd: _Round, cand: _Candidate, tier: Tier, value: float) -> bool:
    """Place ``cand`` in ``tier`` of its node, making room there, and emit its orders; False (nothing
    changed) when the room cannot be made."""
    book, spec = rnd.books[cand.node], cand.spec
    trial = book.copy()
    moves: list[tuple[str, Tier, Tier]] = []
    # A tier on the way that could never hold the copy (none on the node, or smaller than the model) is
    # passed through, as the executor streams past it: the copy would otherwise never go farther. Room
    # is made closest first.
    held = () if cand.frm is Tier.L3 else (cand.frm,)
    holds = functools.partial(book.can_hold, size=spec.size_bytes)
    path = effect(OrderAction.PREFETCH, tier, held, holds).fills[::-1]
    if not all(_make_room(trial, t, spec.size_bytes, value, moves) for t in path):
        return False
    if tier is Tier.L0 and not cand.want.demand:
        # Only GPU memory: reserving host memory the same way (measured) dropped more useful L1
        # prefetches than wasted ones, and a 20 s disk reload is worth the risk of a miss there.
        # Compared on the last hop alone, as the waiting model's worth is: the candidate's value
        # also counts the hops from disk, which the waiting model has already made.
        last_hop = rnd.valuer.net(spec, cand.want, book.node, Tier.L1, Tier.L0)
        reserve = _reserve(rnd, trial, Tier.L0, last_hop, spec.id)
        if reserve:
            after = trial.copy()
            after.put_l0(spec.id, _Entry(spec.id, spec.size_bytes, value, True))
            if not after.fits(Tier.L0, reserve):
                return False
    gpus: tuple[int, ...] = ()
    for t in path:
        entry = _Entry(spec.id, spec.size_bytes, value, True)
        if t is Tier.L0:
            gpus = trial.placement(spec.size_bytes) or ()
            trial.put_l0(spec.id, entry, gpus)
        else:
            trial.put(t, spec.id, entry)
    rnd.books[cand.node] = trial
    _emit_placement(rnd, cand, tier, moves, tuple(trial.gpu_ids(gpus)))
    return True


def _worth_there(rnd: _Round, book: _Book, cand: _Candidate, tier: Tier) -> bool | None:
    """Whether ``cand`` is worth its cost in ``tier`` of ``book``'s node: None when it is not (then no
    farther tier is either), False when it is not for as long as a copy would last there unused
    (``_lasting``), counting the last hop into ``tier`` alone (the copy it passes on the way, on disk
    say, stays useful when this one is evicted): a farther tier may be. A waiting request takes any
    tier; the candidate's own tier, where the copy lasts its window, was valued when it was made."""
    if cand.want.demand:
        return True
    spec, node = cand.spec, book.node
    lead = rnd.valuer.lead(node, spec.size_bytes, cand.frm, tier)
    want = _lasting(rnd, book, tier, spec.size_bytes, cand.want, lead)
    if want is cand.want:
        return True if tier is cand.tier or rnd.valuer.net(spec, want, node, cand.frm, tier) > 0 else None
    last = min(cand.frm, tier.farther(), key=lambda t: t.level)
    return rnd.valuer.net(spec, want, node, cand.frm, tier) > 0 and (
        last is cand.frm or rnd.valuer.net(spec, want, node, last, tier) > 0
    )


def _lasting(rnd: _Round, book: _Book, tier: Tier, size: int, want: _Want, lead: float) -> _Want:
    """``want`` with its chance cut to the part of its window that a copy of ``size`` bytes loaded into
    ``tier`` for it is still there, unused, to serve; ``want`` itself when the copy lasts the window
    (``_lifetime``).

    A forecast's want is worth the forecast's chance of a request while the copy is there, read from
    its buckets (``ModelForecast.p_between``): a busy model's copy that lasts a third of its window
    serves a request more often than not, and a timer's copy that lands minutes before the tick and
    lasts one is worth next to nothing, however certain the tick. Without the forecast, the window is
    read as one of requests at a rate: the chance that none comes in a part of it is the chance that
    none comes in all of it to the power of that part. A hint's window is a deadline, not a rate: its
    request is taken as equally likely anywhere in it.
    """
    landing = max(rnd.now, want.t0 - lead) + lead
    # How much of the window the copy is there for:
    until = landing + _lifetime(rnd, book, tier, size) - want.t0
    span = want.t1 - want.t0
    if until >= span:
        return want
    part = max(until, 0.0) / span if span > 0 else 0.0
    # A certain window (p == 1, a timer's block) is read as a deadline too. As a rate it would be worth
    # its whole chance for any part of it, and on azure_samples that parked a 140 GB timer model's GPU
    # copy on one node for the day while loads pinned to the other node by their host copies took turns
    # there: 2,816 cold starts where this reading has 190 (docs/benchmarks.md, fifth stop).
    if want.reason is OrderReason.FORECAST and want.p < 1.0:
        forecast = rnd.forecasts.get(want.model)
        if forecast is not None and until > 0:
            return want._replace(p=min(want.p, forecast.p_between(landing, want.t0 + until)))
        return want._replace(p=1.0 - (1.0 - want.p) ** part)
    return want._replace(p=want.p * part)


def _lifetime(rnd: _Round, book: _Book, tier: Tier, size: int) -> float:
    """How long a copy of ``size`` bytes loaded into ``tier`` of ``book``'s node now stays there unused
    before the executor's LRU gives it up to loads the planner does not order (requests).

    As long as the copies the LRU gave up lately had gone unused (``NodeState.unused_for``, their
    median: of copies as wide as this one would be, over as many GPUs, where some were given up; else
    of all the tier's), and no less than the least recently used copy there has gone unused now (when
    loads stop, nothing is given up, and that age grows; a copy over several GPUs, which any of them may
    give up, reads it per GPU: ``_idle_for``). Where the node has given up nothing lately, it is guessed
    from the tier as it is: the least recently used copy's unused time, plus the time the loads within
    it would take to fill the free room (the load rate read from the copies still there, a floor). On a
    saturated cluster that is seconds to minutes of GPU memory and a minute or two of host memory, where
    most prefetches were evicted unused before their request came; a tier that is filling slowly, or
    not at all, keeps a copy for hours.
    """
    width = copy_width(tier, gpu_shards(size, book.gpu_capacity) or 1)
    key = (book.node.name, tier, width)
    known = rnd.lifetimes.get(key)
    if known is None:
        node, now = book.node, rnd.now
        residents = node.residents(tier)
        times = [t for r in residents if r.pins == 0 and (t := r.unused_since) is not None]
        age = now - min(times, default=now)
        given_up = node.unused_for.get((tier, width)) or tuple(
            a for (t, _), ages in node.unused_for.items() if t is tier for a in ages
        )
        if given_up:
            known = max(statistics.median(given_up), _idle_for(node, width, now) if width > 1 else age)
        else:
            loaded = sum(r.bytes for r in residents if r.loaded_at is not None and r.loaded_at >= now - age)
            used = node.unlisted.get(tier, 0) + sum(r.bytes for r in residents)
            free = max(node.capacity.get(tier, 0) - used, 0)
            known = age * (loaded + free) / loaded if loaded > 0 else _INF
        rnd.lifetimes[key] = known
    return known


def _idle_for(node: NodeState, width: int, now: float) -> float:
    """How long the GPUs of ``node`` that a copy over ``width`` of them would take have gone without
    giving up a copy, at least: each GPU's least recently used copy has gone unused this long (0 for a
    GPU with none), and the copy goes where that is longest, as the LRU makes room. A copy listed
    without GPUs counts on all of them."""
    oldest: dict[int, float] = dict.fromkeys(node.gpu_ids, now)
    for r in node.residents(Tier.L0):
        t = r.unused_since
        if r.pins == 0 and t is not None:
            for g in r.gpus or node.gpu_ids:
                oldest[g] = min(oldest.get(g, now), t)
    ages = sorted((now - t for t in oldest.values()), reverse=True)
    return ages[width - 1] if len(ages) >= width else 0.0


_Failure = tuple[list[_Candidate], tuple[_Book, ...], bool, tuple[bool, ...], Placement]
"""A candidate that was deferred: its options, their nodes' books then, whether the model had been
moved, whether each model in host memory on the chosen node was held in GPU memory somewhere (what
``_reserve`` reads), and what was deferred."""


def _place_all(
    rnd: _Round,
    candidates: list[list[_Candidate]],
    asks: Mapping[str, float],
    loads: dict[str, float],
    failed: Mapping[str, _Failure] | None = None,
    *,
    commit_by: float | None = None,
) -> dict[str, _Failure]:
    """Place each model's candidate, most urgent first. ``loads``: each node's load (``_least_loaded``)
    for the books as they are now; a node's figure is dropped once its book changes.

    ``failed``: candidates deferred by an earlier round (``_incremental``). Placing one again against
    the same books, with nothing ``_place`` reads changed, defers it again: it is deferred without
    trying. Returns the candidates deferred now, for the next round. ``commit_by``: the candidates due
    to start later are left unplaced (``plan_detailed``).
    """
    deferred: dict[str, _Failure] = {}
    # Demand first, then the soonest start, then the most value per byte.
    candidates.sort(
        key=lambda cs: (
            not cs[0].want.demand,
            cs[0].not_before,
            -cs[0].value / cs[0].spec.size_bytes,
            cs[0].spec.id,
        )
    )
    for options in candidates:
        if commit_by is not None and options[0].not_before > commit_by:
            break  # this one and every one after it (soonest first): not this round's to commit to
        model = options[0].spec.id
        before = failed.get(model) if failed else None
        if before is not None and before[0] is options and _fails_again(rnd, before):
            rnd.deferred.append(before[4])
            deferred[model] = before
            continue
        # The node is chosen now, against the books as earlier placements left them: chosen up front,
        # every tie went to the same node and one node held the whole catalog while the other idled.
        chosen = options[0] if len(options) == 1 else _least_loaded(rnd, options, asks, loads)
        books = tuple(rnd.books[c.node] for c in options)
        moved = model in rnd.moved
        reserve = _reserve_inputs(rnd, rnd.books[chosen.node])
        placed = len(rnd.placements)
        _place(rnd, chosen)
        if len(rnd.placements) == placed:  # deferred: nothing changed
            deferred[model] = (options, books, moved, reserve, rnd.deferred[-1])
        loads.pop(chosen.node, None)  # only that node's book changed
    return deferred


def _reserve_inputs(rnd: _Round, book: _Book) -> tuple[bool, ...]:
    # What ``_reserve`` asks of each host copy: whether some node holds it in GPU memory.
    return tuple(map(rnd.books.in_gpu, book.held[Tier.L1]))


def _fails_again(rnd: _Round, failure: _Failure) -> bool:
    """Whether placing a deferred candidate again would defer it again: the same books on its nodes
    (so the same node is chosen, the same room can be made), the same moved state, and the same
    answers to what ``_reserve`` asks."""
    options, books, moved, reserve, _ = failure
    if any(rnd.books.get(c.node) is not b for c, b in zip(options, books, strict=True)):
        return False
    if (options[0].spec.id in rnd.moved) != moved:
        return False
    chosen = rnd.books[failure[4].node]
    return _reserve_inputs(rnd, chosen) == reserve


def _least_loaded(
    rnd: _Round, options: Sequence[_Candidate], asks: Mapping[str, float], loads: dict[str, float]
) -> _Candidate:
    """Of equally good nodes, the one whose models will ask for the least GPU room, then the most room.

    Requests go to the node holding a model closest, so where a model is staged decides which GPU it
    competes for: two busy 140 GB models on one node's 160 GB take turns, each turn a reload. A node's
    load is what ``asks`` says its models will ask for: each one's bytes times the chance of a request
    within the horizon. (Counted as requests times bytes, a node of rarely used models looked idle next
    to one busy small model, and every rare model was staged there, to share its GPUs when requested.)
    ``loads`` keeps each node's figure between calls; the caller drops a node's once its book changes.
    """
    for c in options:
        if c.node not in loads:
            book = rnd.books[c.node]
            models = {m for t in CACHE_TIERS for m in book.held[t]}
            # fsum: a set's order differs from one process to the next (string hashing), and a plain
            # sum's rounding with it, which decided ties between equally loaded nodes differently.
            loads[c.node] = math.fsum(asks.get(m, 0.0) for m in models)
    return max(options, key=lambda c: (c.value, -loads[c.node], rnd.books[c.node].free(c.tier), c.node))


def _want_note(want: _Want) -> str:
    """Why a prefetch is wanted, as its order's note says it."""
    if want.demand:
        return "a request is waiting"
    return f"{want.reason.value}: P {want.p:.2f} of a request from {iso_utc(want.t0)} to {iso_utc(want.t1)}"


def _reserve(rnd: _Round, book: _Book, tier: Tier, value: float, newcomer: str) -> int:
    """Bytes of ``tier`` a speculative prefetch worth ``value`` must leave free on this node.

    A model worth more in ``tier`` that no node holds there, but this node holds one tier farther, is
    what the next request here loads, and the executor's LRU then evicts the least recently used copy:
    the speculative one, which nothing has used yet. So that room is not the prefetch's to take: on a
    single node whose GPU a 140 GB model shares, most prefetches were evicted this way within seconds
    of arriving, unused.
    """
    lower = tier.farther()
    if lower not in CACHE_TIERS:
        return 0
    soon = rnd.now + rnd.config.window_s
    reserve = 0
    for model in book.held[lower]:
        spec = rnd.catalog.get(model)
        if spec is None or model == newcomer or spec.size_bytes <= reserve:
            continue
        if rnd.held(model, tier):
            continue
        saved = rnd.valuer.saved(spec, book.node, lower, tier)
        if any(p * saved > value for p, _ in rnd.wants.get(model, NO_WANTS).chances_until(soon)):
            reserve = spec.size_bytes
    return reserve


def _emit_placement(
    rnd: _Round, cand: _Candidate, tier: Tier, moves: list[tuple[str, Tier, Tier]], gpus: tuple[int, ...]
) -> None:
    spec, want = cand.spec, cand.want
    lead = rnd.valuer.lead(rnd.books[cand.node].node, spec.size_bytes, cand.frm, tier)
    not_before = max(rnd.now, want.t0 - lead)
    for model, frm, to in moves:
        rnd.moved.add(model)
        victim = rnd.catalog[model]
        # Make room when the prefetch starts, not before: a timed prefetch keeps the victim useful till then.
        action, at = (OrderAction.DEMOTE, to) if to in CACHE_TIERS else (OrderAction.EVICT, frm)
        rnd.emit(
            _Decision(
                node=cand.node,
                spec=victim,
                action=action,
                tier=at,
                reason=OrderReason.CAPACITY,
                not_before=not_before,
                deadline=want.t1 if want.t1 > not_before else not_before + rnd.config.order_ttl_s,
                key_time=want.key_time,
                note=_room_note(frm, spec.id),
            )
        )
    order = rnd.emit(
        _Decision(
            node=cand.node,
            spec=spec,
            action=OrderAction.PREFETCH,
            tier=tier,
            reason=want.reason,
            not_before=not_before,
            deadline=want.t1,
            key_time=want.key_time,
            demand=want.demand,
            gpus=gpus,
            # Held as used till its misprediction window ends (``prewarm.held_recency``): a load on
            # request that gives it up before then makes it a misprediction for certain.
            hold_until=None
            if want.demand or tier is Tier.L2
            else want.key_time + rnd.config.misprediction_window_s,
            note=_want_note(want),
        )
    )
    rnd.predicted[order.id] = want.key_time
    rnd.placements.append(Placement(spec.id, cand.node, tier, want.reason, not_before, want.t1, cand.value))
