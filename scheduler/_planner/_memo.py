"""What one planning round may keep for the next, held by whoever plans repeatedly."""

from __future__ import annotations

from scheduler._planner._incremental import _Kept
from scheduler._planner._value import _hop_times
from scheduler._planner._wants import _WindowCache


class PlannerMemo:
    """Work a round can reuse from earlier rounds: each forecast's candidate windows, hop times, and
    what the last round worked from (for the incremental rounds of ``plan_detailed(touched=...)``).

    Windows and hop times are a memo and nothing more: a full round plans the same with a memo, with a
    fresh one, or with none (then ``plan`` makes a fresh one for the round). A caller that plans often
    with the same forecast objects, as ``SchedulerCore`` does on every hint, keeps one and passes it to
    every round: the windows of a forecast are then valued once per forecast bucket instead of once per
    round. Windows are held weakly by the forecast object, so a replaced forecast takes its entry with
    it. Not thread-safe: one caller at a time (``SchedulerCore`` plans under its lock).
    """

    def __init__(self) -> None:
        self.windows = _WindowCache()
        self.hops = _hop_times()
        self.kept: _Kept | None = None
