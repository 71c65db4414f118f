"""The planner: forecasts, hints and the cluster's state in, timed orders out. Pure: ``now`` is passed in.

For each model the planner finds when it is next wanted (a demand signal, a hint's window, or the first
forecast window worth acting on), picks a node, and values each cache tier closer than where the model
is now::

    benefit(T) = P(request in window) × seconds of waiting saved by being in T × priority weight
    miss(T)    = (1 - P) × seconds of transfer into L1/L0 that a wrong guess wastes × ``miss_penalty``
    cost(T)    = GB × seconds held in T × the tier's price per GB·s (by default only disk has a price)

The tier with the best positive ``benefit - miss - cost`` is the target. Memory that nothing else wants
costs nothing to fill: the real cost of holding a model is the opportunity cost of what it displaces,
and that is arbitrated by value when room is made (a newcomer displaces only residents worth less, where
a resident is worth ``P × seconds saved × weight``). ``miss`` is what keeps speculation honest: a move
into host or GPU memory pays off only when ``P × weight > (1 - P) × miss_penalty`` (P > 2/3 for a
standard model with the default), so few prefetches are wasted. The prefetch starts ``lead`` seconds
before the window: the hops still to do at the node's measured bandwidth, plus a margin. Candidates are
placed most urgent first (demand, then the soonest window) into a per-node book of bytes per tier that is
never over-committed: room is made by demoting less valuable residents one tier down (L0→L1→L2, and from
L2 out to L3), or the target falls back one tier, or the candidate waits for a later round (deferred).

Hysteresis keeps the plan from thrashing: a resident is only demoted to make room when it is worth less
than the newcomer (which also pays ``miss``, a resident does not) and was neither loaded nor used within
``min_residence_s``; a resident cools down on its own only under pressure, one tier per round at most,
and only when a request in the window has become unlikely (out of GPU memory, ``P < cool_p``) or its
benefit falls below ``keep_ratio`` times a configured holding cost; and a model evicted as a
misprediction is not fetched again within ``cooldown_s``.

Order ids are a digest of (node, model, version, action, tier, time bucket of the reason), so the same
decision taken in two rounds, or by two scheduler replicas, has the same id and is applied once.

The package, one module per idea: ``_config`` (knobs, results, decisions and their order ids),
``_wants`` (when a model is wanted, and the forecast windows kept between rounds), ``_value`` (what a
tier is worth), ``_book`` (the per-node books and making room), ``_placement`` (candidates and placing
them), ``_eviction`` (mispredictions, cool-downs, cooling out of memory), ``_memo`` (what a caller that
plans repeatedly keeps between rounds) and ``_round`` (``plan`` and the round itself).
"""

from __future__ import annotations

from scheduler._planner._config import Placement, Plan, PlannerConfig, order_id
from scheduler._planner._memo import PlannerMemo
from scheduler._planner._round import plan, plan_detailed

__all__ = [
    "Placement",
    "Plan",
    "PlannerConfig",
    "PlannerMemo",
    "order_id",
    "plan",
    "plan_detailed",
]
