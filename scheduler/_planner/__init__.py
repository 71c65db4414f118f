"""The planner: forecasts, hints and the cluster's state in, timed orders out. Pure: ``now`` is passed in.

For each model the planner finds when it is next wanted (a demand signal, a hint's window, or the first
forecast window worth acting on), picks a node, and values each cache tier closer than where the model
is now::

    benefit(T) = P(request in window) × (seconds of waiting saved by being in T
                                          + ``cold_start_s`` when T is GPU memory) × priority weight
    miss(T)    = (1 - P) × (seconds of transfer into L1/L0 that a wrong guess wastes
                            + ``cold_start_s`` into GPU memory) × ``miss_penalty``
    cost(T)    = GB × minutes held in T × ``memory_price`` (L0, L1), and a token price on disk

The tier with the best positive ``benefit - miss - cost`` is the target. A cold start counts as such,
not only by the seconds it waits: a 2 GB model's is a cold start like a 140 GB one's. ``miss`` keeps
speculation honest: a move into host or GPU memory pays off only when ``P × weight > (1 - P) ×
miss_penalty`` (P > 2/3 for a standard model with the default, whatever its size). The prefetch starts
``lead`` seconds before the window: the hops still to do at the node's measured bandwidth, plus a
margin. Candidates are placed most urgent first (demand, then the soonest window) into a per-node book
of bytes per tier, and per GPU for L0 (``prewarm.gpu_placement``: a model larger than one GPU takes
shards on several GPUs of one node; L0 orders name their GPUs), that is never over-committed: room is
made by demoting less valuable residents one tier down (L0→L1→L2, and from L2 out to L3), or the target
falls back one tier, or the candidate waits for a later round (deferred).

Nothing is demoted or evicted while nothing wants the room, with two exceptions. The misprediction
rule: a prefetched copy that served no request within ``misprediction_window_s`` of the time its
demand was predicted is demoted one tier down and counted, once; the planner is its one owner (the
executor keeps no timer of its own unless told to), and a model so demoted is not fetched again within
``cooldown_s``. And the price of memory, where one is set: a copy is released one tier down when
the chance per second of a request (the forecast's hazard) × what it saves is worth less than
``memory_price`` × GB per second held, so that the cheap models are held and the expensive ones
released — unless holding it until a later rise in its forecast pays and no prefetch could bring it
back for that rise (the default price is 0: memory in prewarm's budget is paid for either way). An
option, ``contended_memory_price``, prices host memory only where the room is wanted: on a node whose
executor has been giving host copies up to loads on request.

The priority weight is the model's, times, under ``objective="models"``, ``reference_daily_requests``
over the model's daily use: every model's cold-start rate then counts the same (the serverless
comparison's measure), and for a memoryless model the rate cancels out of the release rule, leaving its
size to decide.

Hysteresis keeps the plan from thrashing: a resident is only demoted to make room when it is worth less
than the newcomer (which also pays ``miss``, a resident does not) and was neither loaded nor used within
``min_residence_s``. A prefetched copy not used yet, and a disk copy no load has read since it was
downloaded, make room for a waiting request only, never for another speculative copy: displaced unused
it would be a misprediction for certain, and the misprediction rule judges it when its window has
passed (a disk copy, the executor's LRU when a load on request needs the room).

Order ids are a digest of (node, model, version, action, tier, time bucket of the reason), so the same
decision taken in two rounds, or by two scheduler replicas, has the same id and is applied once.

The package, one module per idea: ``_config`` (knobs, results, decisions and their order ids),
``_wants`` (when a model is wanted, and the forecast windows kept between rounds), ``_value`` (what a
tier is worth), ``_book`` (the per-node books, GPU memory per GPU, and making room), ``_placement``
(candidates and placing them), ``_eviction`` (mispredictions, cool-downs, the price of memory),
``_memo`` (what a caller that plans repeatedly keeps between rounds), ``_round`` (``plan`` and the
round itself) and ``_incremental`` (rounds that replan only what a hint, a demand signal or a report
touched, against the books the last full round opened: exactly what a full round plans at the same
``now``; its docstring says what may differ at a later one).
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
