"""Incremental rounds: a hint, a demand signal or an executor report replans only what it touches.

A full round leaves behind what it worked from (``_Kept``, in the caller's ``PlannerMemo``): each node's
book as it opened it (the report, with the orders still out booked), each model's wants, the models'
candidates that were not empty, the cool-downs. A round told which models' signals changed
(``touched``) starts from that instead of from nothing:

- a node's book is opened again only where its report (the ``NodeState`` object) or the orders still
  out on it changed, or it holds a touched model; every other kept book is the book a full round would
  open, since nothing it is made from changed;
- only the touched models' wants are made again;
- a candidate is looked for only where it can have changed: for the touched models, for those whose
  place changed on a reopened node (what the last round ordered, what a report shows done), for those
  whose cool-down began or ended or that a misprediction moved, and for those whose candidate was not
  empty (a deferred one is tried again, as every round tries it). Any other model had no candidate,
  and what its candidate depends on (its wants, where it is on each node, its cool-down) is unchanged;
- mispredictions and the price of memory are judged on the reopened nodes (and, where memory has a
  price, on the nodes this round placed on): on the others nothing changed since the round that judged
  them, or its orders would have changed the node's orders still out.

Candidates are then placed most urgent first into the books, as a full round places them; one that
the last round deferred, and whose nodes' books, moved state and ``_reserve`` answers are unchanged,
is deferred again without trying (``_place_all``: it would fail the same way). So a round
at the ``now`` of the state it starts from plans exactly what a full round would (orders, placements,
deferred: tests/scheduler/test_planner_incremental.py checks it over random sequences of hints,
reports and rounds). At a later ``now`` what it does not touch is as the last round saw it: another
model's hint that has expired since, a forecast window that moved, a misprediction window that closed
on an untouched node, a protection (``min_residence_s``) that lapsed, an unchanged candidate's start
time (and whether a deferred one would now fit beside the room ``_reserve`` keeps), and, to choose
among equally good nodes, the GPU room each model asks for as the last full round saw it. That lasts
until the next full round, which the caller runs on the planning interval: a round more than
``decision_interval_s`` after the last full one is a full one, as is a round with other forecasts (a
refresh: a new mapping object), another catalog or config, another set of nodes, a node whose link
rates or capacities changed, or more than ``_MAX_TOUCHED`` models touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from forecaster import ModelForecast
from models import Catalog
from prewarm import CACHE_TIERS, Hint, Order, Tier, admit
from scheduler._cluster import ClusterState, NodeState
from scheduler._planner._book import _Book, _book_pending, _Books, _open_book, _Round
from scheduler._planner._config import Plan, PlannerConfig
from scheduler._planner._eviction import _demote_mispredictions, _held_back, _release_priced
from scheduler._planner._placement import (
    _best_candidate,
    _Candidate,
    _Failure,
    _fits_free,
    _payers,
    _place_all,
)
from scheduler._planner._value import _Valuer
from scheduler._planner._want import _Wants
from scheduler._planner._wants import _wants, _WindowCache

_MAX_TOUCHED = 256
"""More models touched at once than this: a full round costs about as much, and is always right."""


@dataclass(frozen=True)
class _Kept:
    """What the last round (full or incremental) worked from, for the incremental rounds after it."""

    at: float  # the last round's now
    full_at: float  # the last full round's now
    forecasts: Mapping[str, ModelForecast]
    catalog: Catalog
    config: PlannerConfig
    nodes: Mapping[str, NodeState]
    keys: Mapping[str, tuple[str, ...]]  # per node, the orders still out that its book booked
    opened: _Books  # the books as opened, before the round's own decisions
    wants: Mapping[str, _Wants]
    gains: Mapping[str, Mapping[Tier, float]]
    valuer: _Valuer
    candidates: Mapping[str, list[_Candidate]]  # the models whose candidate was not empty
    room_read: Mapping[str, Tier | None]  # see _Round.room_read
    failed: Mapping[str, _Failure]  # the candidates deferred, with what they were deferred against
    keep_values: Mapping[tuple[str, Tier, tuple[float, ...]], float]  # see _Round.keep_values
    classes: list[list[str]]  # _Round.classes: the same while every node stays alike
    cooling: set[str]
    asks: Mapping[str, float]
    loads: Mapping[str, tuple[_Book, float]]  # per node, its load for that book


def _pending_keys(rnd: _Round, cluster: ClusterState) -> dict[str, tuple[str, ...]]:
    """Per node, the ids of the orders still out that ``_book_pending`` books there, in its order."""
    keys: dict[str, list[Order]] = {name: [] for name in cluster.nodes}
    for order in cluster.pending:
        ids = keys.get(order.node)
        spec = rnd.catalog.get(order.model)
        if ids is None or spec is None or admit(order, rnd.now, node=order.node, spec=spec):
            continue
        ids.append(order)
    # Each node's in the order of the whole, sorted as _book_pending sorts it.
    return {
        name: tuple(o.id for o in sorted(os, key=lambda o: (o.not_before, o.id))) for name, os in keys.items()
    }


def _reusable(
    kept: _Kept | None,
    now: float,
    forecasts: Mapping[str, ModelForecast],
    catalog: Catalog,
    cluster: ClusterState,
    config: PlannerConfig,
    touched: set[str],
) -> bool:
    if kept is None or len(touched) > _MAX_TOUCHED:
        return False
    if kept.forecasts is not forecasts or kept.catalog is not catalog or kept.config != config:
        return False
    if now < kept.at or now - kept.full_at > config.decision_interval_s:
        return False
    if kept.nodes.keys() != cluster.nodes.keys():
        return False
    for name, node in cluster.nodes.items():
        old = kept.nodes[name]
        if node is not old and not _alike(old, node):
            return False  # the classes of nodes, and every model's gains, are a full round's to make
    return True


def _alike(a: NodeState, b: NodeState) -> bool:
    """Whether two states of a node value a model they do not hold the same (see ``_Round.classes``)."""
    return (
        a.hop_rates == b.hop_rates
        and a.staging_busy == b.staging_busy
        and all(a.capacity.get(t, 0) == b.capacity.get(t, 0) for t in CACHE_TIERS)
        and a.gpu_capacities == b.gpu_capacities
    )


def _incremental(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    cluster: ClusterState,
    config: PlannerConfig,
    memo: _Memo,
    touched: set[str],
    commit_by: float | None = None,
) -> Plan | None:
    """The round that replans only what ``touched`` and the changed nodes touch; None: a full round
    is needed (see the module's docstring)."""
    kept = memo.kept
    if kept is None or not _reusable(kept, now, forecasts, catalog, cluster, config, touched):
        return None
    touched = {m for m in touched if m in catalog}
    valuer = kept.valuer
    wants = dict(kept.wants)
    gains = dict(kept.gains)
    mine = [h for h in hints if h.model in touched]
    nodes = list({n.hop_rates: n for n in cluster.nodes.values()}.values())
    hinted = {h.model for h in mine}
    for model in touched:
        if model in forecasts or model in hinted:
            gains[model] = valuer.gains(catalog[model], nodes)
        else:
            gains.pop(model, None)
    ours = {m: forecasts[m] for m in touched if m in forecasts}
    fresh = _wants(now, ours, mine, catalog, config, gains, memo.windows)
    for model in touched:
        if model in fresh:
            wants[model] = fresh[model]
        else:
            wants.pop(model, None)
    rnd = _Round(
        now=now, config=config, catalog=catalog, wants=wants, gains=gains, valuer=valuer, forecasts=forecasts
    )
    rnd.books = kept.opened.copy()
    rnd.keep_values = dict(kept.keep_values)
    for model in touched:  # their wants changed: what keeping them is worth too
        for tier in CACHE_TIERS:
            for node in nodes:
                rnd.keep_values.pop((model, tier, node.hop_rates), None)
    rnd._classes = kept.classes
    keys = _pending_keys(rnd, cluster)
    reopen = {n for n, node in cluster.nodes.items() if node is not kept.nodes[n] or keys[n] != kept.keys[n]}
    for model in touched:
        reopen |= rnd.books.holders(model)
    books = {name: _open_book(rnd, cluster.nodes[name]) for name in sorted(reopen)}
    _book_pending(rnd, cluster, books)
    moved: set[str] = set()
    for name, book in books.items():
        moved |= _moved(rnd.books[name], book)
        rnd.books[name] = book
    opened = rnd.books.copy()
    judged = None if config.memory_price > 0 else reopen  # open bets are what release_priced reads
    _demote_mispredictions(rnd, cluster, judged)
    cooling = _held_back(rnd, cluster)
    changed = touched | moved | (cooling ^ kept.cooling) | rnd.moved
    # A candidate that read free room depends on it: its holders', and where they were crowded, whether
    # any other node has free room for it.
    changed |= {
        m
        for m, crowded in kept.room_read.items()
        if m in kept.candidates
        and (
            not reopen.isdisjoint(rnd.books.holders(m))
            or (crowded is not None and _room_changed(kept.opened, books, catalog[m].size_bytes, crowded))
        )
    }
    # A candidate depends on the model's wants, its place on every node and its cool-down: where none
    # changed, the last round's is this round's (the same object, so ``_place_all`` can tell).
    candidates = {m: c for m, c in kept.candidates.items() if m not in changed and m in wants}
    rnd.room_read = {m: crowded for m, crowded in kept.room_read.items() if m in candidates}
    for model in changed:
        model_wants = wants.get(model)
        if not model_wants:
            continue
        spec = catalog[model]
        worth = _payers(spec, model_wants, rnd)
        options = _best_candidate(rnd, spec, worth, cooling) if worth else []
        if options:
            candidates[model] = options
    loads = {n: load for n, (book, load) in kept.loads.items() if rnd.books.get(n) is book}
    failed = _place_all(rnd, list(candidates.values()), kept.asks, loads, kept.failed, commit_by=commit_by)
    if config.memory_price > 0:
        _release_priced(rnd, reopen | {o.node for o in rnd.orders})
    memo.kept = replace(
        kept,
        at=now,
        nodes=dict(cluster.nodes),
        keys=keys,
        opened=opened,
        wants=wants,
        gains=gains,
        candidates=candidates,
        room_read=rnd.room_read,
        failed=failed,
        keep_values=rnd.keep_values,
        cooling=cooling,
        loads={n: (rnd.books[n], load) for n, load in loads.items()},
    )
    return _plan_of(rnd, full=False)


def _room_changed(old: Mapping[str, _Book], new: Mapping[str, _Book], size: int, crowded: Tier) -> bool:
    """Whether a reopened node's free room for a copy of ``size`` bytes from L3 into ``crowded`` or a closer
    tier (what ``_placement._best_candidate`` asks of every node for a crowded model) changed."""
    tiers = [t for t in CACHE_TIERS if t.level <= crowded.level]
    return any(
        _fits_free(old[name], Tier.L3, t, size) != _fits_free(book, Tier.L3, t, size)
        for name, book in new.items()
        for t in tiers
    )


def _moved(old: _Book, new: _Book) -> set[str]:
    """The models whose closest copy on this node differs between two of its books."""
    return {m for m in old.models() | new.models() if old.closest(m) is not new.closest(m)}


def _plan_of(rnd: _Round, *, full: bool) -> Plan:
    return Plan(
        orders=tuple(rnd.orders),
        placements=tuple(rnd.placements),
        deferred=tuple(rnd.deferred),
        mispredictions=tuple(rnd.mispredictions),
        predicted=dict(rnd.predicted),
        full=full,
    )


class _Memo(Protocol):
    """What ``_incremental`` uses of a ``PlannerMemo`` (which imports this module)."""

    windows: _WindowCache
    kept: _Kept | None
