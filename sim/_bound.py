"""How little idle memory any policy can get away with on memoryless traffic, for a p75 target.

Under ``--unlimited`` a request is a cold start when its model is not resident, and every resident
minute is idle (requests are instantaneous). When a model's requests are a Poisson process, an arrival
sees the model resident with the chance that it is resident at a random moment, whatever a causal
policy does (arrivals see time averages, and the policy's state depends only on the past): a model
with expected cold-start rate ``c`` is resident ``1 - c`` of the window. Meeting a percentile of the
per-model rates at least cost then means keeping the smallest models warm and giving the others up,
which leaves a two-variable linear programme (``poisson_idle_bound``). It bounds expectations: one
run's rates scatter around them.

The bound is what says whether a pair of targets can be met at all on such a case: the issue asks for
prewarm's p75 ≤ 0.5 × the hybrid histogram's at ≤ 0.5 × keep-alive's idle memory, and on the suite's
``memoryless`` case no policy has both (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["poisson_idle_bound"]


def poisson_idle_bound(
    sizes_gb: Sequence[float], window_minutes: float, target: float, percentile: float = 75.0
) -> float:
    """The least expected idle GB-minutes over ``window_minutes`` at which the ``percentile``-th
    percentile (numpy's linear interpolation) of the models' expected cold-start rates is ≤ ``target``,
    for models of ``sizes_gb`` whose requests are Poisson processes; 0 for no model.

    The cheapest assignment gives the lowest rates to the smallest models (any other order costs more
    for the same percentile): with the rates sorted, the percentile reads the ``lo``-th and the next one
    (``pos = percentile / 100 × (n - 1)``, ``lo = ⌊pos⌋``, ``f = pos - lo``), every model from ``lo + 2``
    on is best given up (rate 1, never resident), the ``lo + 1`` smallest share one rate ``x`` and the
    next has ``y ≥ x``, and ``(1 - f) x + f y ≤ target``. A linear objective over that triangle is
    best at one of its corners, which are tried in turn.
    """
    if not sizes_gb:
        return 0.0
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"a cold-start rate target is in [0, 1], got {target!r}")
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"a percentile is in [0, 100], got {percentile!r}")
    sizes = sorted(sizes_gb)
    pos = percentile / 100.0 * (len(sizes) - 1)
    lo = math.floor(pos)
    f = pos - lo
    low = sum(sizes[: lo + 1])  # the models that share rate x
    nxt = sizes[lo + 1] if lo + 1 < len(sizes) else 0.0  # the one at rate y
    # (x, y) at the corners of {0 ≤ x ≤ y ≤ 1, (1 - f) x + f y ≤ target}.
    corners = [(target, target)]
    if f < 1.0 and target >= f:
        corners.append(((target - f) / (1.0 - f), 1.0))
    if f > 0.0 and target <= f:
        corners.append((0.0, target / f))
    if f == 0.0:
        corners.append((target, 1.0))  # y does not enter the percentile
    cost = min((1.0 - x) * low + (1.0 - y) * nxt for x, y in corners)
    return cost * window_minutes
