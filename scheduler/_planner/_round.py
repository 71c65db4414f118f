"""One planning round: wants, books, mispredictions, then candidates placed most urgent first, then
what memory's price says to release. See the package's docstring for the policy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from forecaster import ModelForecast
from models import Catalog
from prewarm import Hint, Order
from scheduler._cluster import ClusterState
from scheduler._planner._book import _book_pending, _open_book, _Round
from scheduler._planner._config import Plan, PlannerConfig
from scheduler._planner._eviction import _cooldowns, _demote_mispredictions, _release_priced
from scheduler._planner._memo import PlannerMemo
from scheduler._planner._placement import _best_candidate, _least_loaded, _payers, _place
from scheduler._planner._value import _model_weights, _Valuer
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
) -> list[Order]:
    """The orders to publish now (each timed by ``not_before``) for this state of the world.

    ``memo``: work kept from earlier rounds, for a caller that plans repeatedly (the orders are the same
    without it); none: the round starts from nothing and leaves nothing behind.
    """
    return list(plan_detailed(now, forecasts, hints, catalog, cluster, config, memo=memo).orders)


def plan_detailed(
    now: float,
    forecasts: Mapping[str, ModelForecast],
    hints: Sequence[Hint],
    catalog: Catalog,
    cluster: ClusterState,
    config: PlannerConfig,
    *,
    memo: PlannerMemo | None = None,
) -> Plan:
    """``plan`` with its reasoning: placements, deferred candidates and counted mispredictions."""
    memo = memo if memo is not None else PlannerMemo()
    valuer = _Valuer(config, memo.hops, _model_weights(now, forecasts, config))
    # Gains are a bound over the nodes' link rates: one node of each set of rates says the same.
    nodes = list({n.hop_rates: n for n in cluster.nodes.values()}.values())
    signalled = {*forecasts, *(h.model for h in hints)}
    gains = {m: valuer.gains(catalog[m], nodes) for m in signalled if m in catalog}
    wants = _wants(now, forecasts, hints, catalog, config, gains, memo.windows)
    rnd = _Round(now=now, config=config, catalog=catalog, wants=wants, gains=gains, valuer=valuer)
    for name in sorted(cluster.nodes):
        rnd.books[name] = _open_book(rnd, cluster.nodes[name])
    _book_pending(rnd, cluster)
    rnd.books.reindex()  # booking the pending orders changed the books in place
    _demote_mispredictions(rnd, cluster)
    cooling = _cooldowns(cluster, now, config) | {model for _, model in rnd.mispredictions}

    candidates = []
    for model, model_wants in wants.items():
        spec = catalog[model]
        worth = _payers(spec, model_wants, rnd)
        options = _best_candidate(rnd, spec, worth, cooling) if worth else []
        if options:
            candidates.append(options)
    # Demand first, then the soonest start, then the most value per byte.
    candidates.sort(
        key=lambda cs: (
            not cs[0].want.demand,
            cs[0].not_before,
            -cs[0].value / cs[0].spec.size_bytes,
            cs[0].spec.id,
        )
    )
    # Expected requests over the horizon times bytes: what a model adds to its node's load.
    traffic = {
        m: f.expected_in(now, now + config.horizon_s) * catalog[m].size_bytes
        for m, f in forecasts.items()
        if m in catalog
    }
    loads: dict[str, float] = {}
    for options in candidates:
        # The node is chosen now, against the books as earlier placements left them: chosen up front,
        # every tie went to the same node and one node held the whole catalog while the other idled.
        chosen = options[0] if len(options) == 1 else _least_loaded(rnd, options, traffic, loads)
        _place(rnd, chosen)
        loads.pop(chosen.node, None)  # only that node's book changed
    _release_priced(rnd, forecasts)
    return Plan(
        orders=tuple(rnd.orders),
        placements=tuple(rnd.placements),
        deferred=tuple(rnd.deferred),
        mispredictions=tuple(rnd.mispredictions),
        predicted=dict(rnd.predicted),
    )
