"""One planning round: wants, books, mispredictions, then candidates placed most urgent first, then
what memory's price says to release. See the package's docstring for the policy, and ``_incremental``
for the rounds that replan only what an event touched."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Collection, Iterator, Mapping, Sequence

from forecaster import ModelForecast
from models import Catalog
from prewarm import Hint, Order
from scheduler._cluster import ClusterState
from scheduler._planner._book import _book_pending, _open_book, _Round
from scheduler._planner._config import Plan, PlannerConfig
from scheduler._planner._eviction import _break_turns, _demote_mispredictions, _held_back, _release_priced
from scheduler._planner._incremental import _incremental, _Kept, _pending_keys, _plan_of
from scheduler._planner._memo import PlannerMemo
from scheduler._planner._placement import _best_candidate, _Candidate, _payers, _place_all
from scheduler._planner._value import _model_rates, _model_weights, _Valuer
from scheduler._planner._wants import _wants


def plan(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    cluster: ClusterState,
    config: PlannerConfig,
    *,
    memo: PlannerMemo | None = None,
    touched: Collection[str] | None = None,
    commit_by: float | None = None,
) -> list[Order]:
    """The orders to publish now (each timed by ``not_before``) for this state of the world.

    ``memo``: work kept from earlier rounds, for a caller that plans repeatedly (the orders are the same
    without it); none: the round starts from nothing and leaves nothing behind. ``touched``: see
    ``plan_detailed``.
    """
    return list(
        plan_detailed(
            now, forecasts, hints, catalog, cluster, config, memo=memo, touched=touched, commit_by=commit_by
        ).orders
    )


def plan_detailed(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    cluster: ClusterState,
    config: PlannerConfig,
    *,
    memo: PlannerMemo | None = None,
    touched: Collection[str] | None = None,
    commit_by: float | None = None,
) -> Plan:
    """``plan`` with its reasoning: placements, deferred candidates and counted mispredictions.

    ``commit_by``: place only the candidates due to start by then, for a caller that plans again before
    the others are due (``SchedulerCore``: two rounds ahead). A later one is an intention the next
    rounds make again from the state then, not an order: demand loads the planner does not order may
    take the room it would count on meanwhile, and an order once out is carried out when it is due.
    Candidates are placed soonest first, so this changes no order due by then. None: every candidate.

    ``touched``: the models whose signals (hints, demand) changed since the last round planned with
    ``memo``; the round then replans only what they, and the nodes whose reports or orders changed,
    touch (``Plan.full`` is False), where the memo's state allows it, and is a full round otherwise.
    None: a full round, which leaves its state in ``memo`` for the incremental rounds after it.
    """
    memo = memo if memo is not None else PlannerMemo()
    if touched is not None:
        result = _incremental(now, forecasts, hints, catalog, cluster, config, memo, set(touched), commit_by)
        if result is not None:
            return result
    with _collector_paused():
        return _full_round(now, forecasts, hints, catalog, cluster, config, memo, commit_by)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a full round runs, and one full collection after a big one.

    A full round makes hundreds of thousands of small objects (wants, candidates) and no cycles: each
    burst of them set off full collections that walked every object of the process (forecasts, books,
    the memo), several per round, a third of a 10,000-model round. One walk after a round that made
    many objects does what they did, and does it here: collecting only the youngest objects left the
    rest of that walk to whichever allocation came next, a hint's round 10 x slower than the others.
    Incremental rounds make too little to be worth pausing for. The pause is process-wide: other
    threads go a round without the collector too.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            # (The count of allocations, ``gc.get_count``, nets out what the round freed: the last
            # round's wants, as many as it made. Listing the young objects costs a few ms at most.)
            if len(gc.get_objects(0)) > _COLLECT_AFTER:
                gc.collect()


_COLLECT_AFTER = 10_000
"""Objects a round may leave to the collector's next young-generation pass; past this many, the round
walks everything once itself. At 1,000 models a round leaves ~15,000, whose pass (3 ms) fell in the
next hint, doubling its p99; the walk costs that round ~70 ms. A full walk per round would cost a small
round (a test's, the simulator's on a few nodes) more than its planning."""


def _full_round(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    cluster: ClusterState,
    config: PlannerConfig,
    memo: PlannerMemo,
    commit_by: float | None,
) -> Plan:
    # Each model's expected requests over the horizon: how many queue behind a load (the valuer's
    # rates), and how much GPU room it will ask for (``asks``, below).
    expected = {m: f.expected_in(now, now + config.horizon_s) for m, f in forecasts.items()}
    valuer = _Valuer(
        config, memo.hops, _model_weights(now, forecasts, config), _model_rates(expected, config)
    )
    # Gains are a bound over the nodes' link rates: one node of each set of rates says the same.
    nodes = list({n.hop_rates: n for n in cluster.nodes.values()}.values())
    signalled = {*forecasts, *(h.model for h in hints)}
    gains = {m: valuer.gains(catalog[m], nodes) for m in signalled if m in catalog}
    wants = _wants(now, forecasts, hints, catalog, config, gains, memo.windows)
    rnd = _Round(
        now=now, config=config, catalog=catalog, wants=wants, gains=gains, valuer=valuer, forecasts=forecasts
    )
    for name in sorted(cluster.nodes):
        rnd.books[name] = _open_book(rnd, cluster.nodes[name])
    _book_pending(rnd, cluster)
    rnd.books.reindex()  # booking the pending orders changed the books in place
    opened = rnd.books.copy()
    _demote_mispredictions(rnd, cluster)
    cooling = _held_back(rnd, cluster)

    candidates: dict[str, list[_Candidate]] = {}
    for model, model_wants in wants.items():
        spec = catalog[model]
        worth = _payers(spec, model_wants, rnd)
        options = _best_candidate(rnd, spec, worth, cooling) if worth else []
        if options:
            candidates[model] = options
    # The GPU room a model is expected to ask for over the horizon: its bytes times the chance of a
    # request in it. What a model adds to its node's load.
    asks = {m: -math.expm1(-n) * catalog[m].size_bytes for m, n in expected.items() if m in catalog}
    loads: dict[str, float] = {}
    failed = _place_all(rnd, list(candidates.values()), asks, loads, commit_by=commit_by)
    _break_turns(rnd)
    _release_priced(rnd)
    memo.kept = _Kept(
        at=now,
        full_at=now,
        forecasts=forecasts,
        catalog=catalog,
        config=config,
        nodes=dict(cluster.nodes),
        keys=_pending_keys(rnd, cluster),
        opened=opened,
        wants=wants,
        gains=gains,
        valuer=valuer,
        candidates=candidates,
        room_read=rnd.room_read,
        failed=failed,
        keep_values=rnd.keep_values,
        classes=rnd.classes(),
        cooling=cooling,
        asks=asks,
        loads={n: (rnd.books[n], load) for n, load in loads.items()},
    )
    return _plan_of(rnd, full=True)
