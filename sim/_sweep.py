"""Sweep each policy's one knob and draw the Pareto curves the serverless literature compares on.

    result = sweep(lambda labels: {k: m.to_json() for k, m in run_policies(..., labels).items()},
                   {"keepalive": ("60", "600", "3600"), "histogram": ("120", "240")})
    print(result.table()); result.to_png(Path("pareto.png"))

Two objectives, both lower is better: idle memory (GB-minutes resident in L0 and L1 and serving nothing)
against the 75th percentile over models of the per-model cold-start rate ('Serverless in the Wild'), and
against the share of requests that waited more than 5 s. Each family's front is its own: a point is on
it when no other knob value of the same policy is at least as good on both and better on one. A front
is read at another policy's point (``SweepResult.matched``): the p75, or the share waiting > 5 s, it
reaches within that point's idle memory and the idle memory it needs for that point's value, the
comparison at equal cost that the literature reports, where a single point of each policy would compare
two different trade-offs.

The sweep knows nothing of the simulator: ``run`` takes labels and returns each label's metrics (the
keys of ``SimMetrics.to_json()``), so the CLI, the notebook and the tests drive it alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_KNOBS",
    "IDLE_TIERS",
    "Matched",
    "SweepPoint",
    "SweepResult",
    "dominated",
    "label_grid",
    "pareto_front",
    "sweep",
]

DEFAULT_KNOBS: Mapping[str, tuple[str, ...]] = {
    "reactive": (),
    "keepalive": ("60", "300", "600", "1200", "1800", "3600", "7200"),
    "histogram": ("60", "120", "240", "480"),
    "oracle": (),
    "prewarm": ("0", "0.001", "0.01", "0.1", "1"),
}
"""Knob values swept when none are given: keep-alive TTLs in seconds, histogram ranges in minutes, the
planner's memory price in weighted seconds per GB·minute. A family with none runs once, bare."""

IDLE_TIERS = ("L0", "L1")
"""The tiers whose idle memory counts: GPU memory and pinned host RAM (disk is cheap and plentiful)."""

RunPolicies = Callable[[list[str]], Mapping[str, Mapping[str, Any]]]
Objective = tuple[float, float]


def label_grid(policies: Mapping[str, Sequence[str]]) -> list[str]:
    """``kind:knob`` for each knob value of each policy kind, in the given order; the bare kind when a
    kind has no values."""
    labels: list[str] = []
    for kind, knobs in policies.items():
        if knobs:
            labels.extend(f"{kind}:{k}" for k in knobs)
        else:
            labels.append(kind)
    return labels


def dominated(p: Objective, q: Objective) -> bool:
    """Whether ``q`` dominates ``p`` (both minimised): no worse on both, better on one."""
    return q[0] <= p[0] and q[1] <= p[1] and (q[0] < p[0] or q[1] < p[1])


def pareto_front(points: Sequence[Objective]) -> list[bool]:
    """For each point, whether no other point dominates it. Equal points do not dominate each other, so
    both stay on the front. Quadratic: a sweep has tens of points, not thousands."""
    return [not any(dominated(p, q) for q in points) for p in points]


@dataclass(frozen=True)
class SweepPoint:
    """One label's place in the two trade-offs."""

    label: str
    family: str
    knob: str | None
    idle_gb_minutes: float
    """L0 + L1 (only L0 exists under ``--unlimited``)."""
    p75_model_cold_start_rate: float
    share_wait_over_5s: float
    on_front_p75: bool
    on_front_wait: bool
    metrics: Mapping[str, Any] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "family": self.family,
            "knob": self.knob,
            "idle_gb_minutes": self.idle_gb_minutes,
            "p75_model_cold_start_rate": self.p75_model_cold_start_rate,
            "share_wait_over_5s": self.share_wait_over_5s,
            "on_front_p75": self.on_front_p75,
            "on_front_wait": self.on_front_wait,
            "metrics": dict(self.metrics),
        }


@dataclass(frozen=True)
class Matched:
    """A family's front against ``p75`` or ``wait`` (the share waiting > 5 s) at another label's point:
    the best value it reaches within that point's idle memory, and the least idle memory it needs for
    that point's value (``front_within``, ``front_idle_for``); None where no point of its front is
    within."""

    family: str
    label: str
    against: str
    idle_gb_minutes: float
    value: float
    family_value: float | None
    family_idle_gb_minutes: float | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SweepResult:
    points: tuple[SweepPoint, ...]

    @classmethod
    def of(cls, metrics: Mapping[str, Mapping[str, Any]]) -> SweepResult:
        """Each label's metrics (``KIND`` or ``KIND:KNOB``, in their order) placed on its family's fronts."""
        rows = [_objectives(label, m) for label, m in metrics.items()]
        fronts: dict[str, tuple[list[bool], list[bool]]] = {}
        for family in dict.fromkeys(r[1] for r in rows):
            mine = [r for r in rows if r[1] == family]
            fronts[family] = (
                pareto_front([(r[3], r[4]) for r in mine]),
                pareto_front([(r[3], r[5]) for r in mine]),
            )
        seen: dict[str, int] = {}
        points: list[SweepPoint] = []
        for label, family, knob, idle, p75, wait5 in rows:
            i = seen.get(family, 0)
            seen[family] = i + 1
            points.append(
                SweepPoint(
                    label=label,
                    family=family,
                    knob=knob,
                    idle_gb_minutes=idle,
                    p75_model_cold_start_rate=p75,
                    share_wait_over_5s=wait5,
                    on_front_p75=fronts[family][0][i],
                    on_front_wait=fronts[family][1][i],
                    metrics=metrics[label],
                )
            )
        return cls(tuple(points))

    def family(self, family: str) -> list[SweepPoint]:
        return [p for p in self.points if p.family == family]

    def families(self) -> list[str]:
        return list(dict.fromkeys(p.family for p in self.points))

    def front(self, family: str, against: str = "p75") -> list[SweepPoint]:
        """The family's front against ``p75`` or ``wait`` (share waiting > 5 s), by idle memory."""
        on_front = _measure(against).on_front
        return sorted((p for p in self.family(family) if on_front(p)), key=_idle)

    def front_within(self, family: str, idle: float, against: str = "p75") -> float | None:
        """The lowest value against ``against`` that ``family``'s front reaches with at most ``idle``
        GB-minutes, linear between neighbouring knob values; None when its leanest point needs more."""
        y = _measure(against).value
        return _within([(p.idle_gb_minutes, y(p)) for p in self.front(family, against)], idle)

    def front_idle_for(self, family: str, value: float, against: str = "p75") -> float | None:
        """The least idle memory at which ``family``'s front is at most ``value`` against ``against``,
        linear between neighbouring knob values; None when none of its points gets that low."""
        y = _measure(against).value
        return _within([(y(p), p.idle_gb_minutes) for p in self.front(family, against)], value)

    def measures(self) -> list[str]:
        """The measures some point is above 0 on: under ``--unlimited`` nobody waits, and a front of
        zeros read at every point says nothing."""
        return [a for a, m in _MEASURES.items() if any(m.value(p) > 0 for p in self.points)]

    def matched(self, family: str, against: str = "p75") -> list[Matched]:
        """``family``'s front at each point of the other families: the comparison at equal memory, and
        at an equal p75 or share waiting > 5 s, that the serverless literature reports ('SPES': −50 %
        p75 and −56 % memory). The tight cluster's target reads the share at the baseline's memory."""
        y = _measure(against).value
        return [
            Matched(
                family=family,
                label=p.label,
                against=against,
                idle_gb_minutes=p.idle_gb_minutes,
                value=y(p),
                family_value=self.front_within(family, p.idle_gb_minutes, against),
                family_idle_gb_minutes=self.front_idle_for(family, y(p), against),
            )
            for p in self.points
            if p.family != family
        ]

    def matched_table(self, family: str, against: str = "p75") -> str:
        """``matched(family, against)`` as lines: each other label's point, then ``family``'s value
        within its idle memory and ``family``'s idle memory for its value, with their ratios to that
        point's."""
        measure = _measure(against)
        name, spec = measure.name, measure.spec
        lines = [f"{family} at each other point: {name} within its idle memory, idle memory for its {name}"]
        for m in self.matched(family, against):
            lines.append(
                f"  {m.label}: {name} {m.value:{spec}} at {m.idle_gb_minutes:.0f} GB-min"
                f" | {family}: {name} {_reached(m.family_value, m.value, spec)},"
                f" idle {_reached(m.family_idle_gb_minutes, m.idle_gb_minutes, '.0f')}"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"idle_tiers": list(IDLE_TIERS), "points": [p.to_json() for p in self.points]}

    def table(self) -> str:
        """One row per label; ``*`` marks a point on its family's front (first against p75, then
        against the share waiting > 5 s)."""
        width = max([len("label"), *(len(p.label) for p in self.points)])
        lines = [
            f"{'label':<{width}} {'knob':>8} {'idle GB-min':>12} {'p75 cold':>9} {'>5s':>7} {'front':>6}"
        ]
        for p in self.points:
            marks = ("*" if p.on_front_p75 else "-") + ("*" if p.on_front_wait else "-")
            lines.append(
                f"{p.label:<{width}} {p.knob or '':>8} {p.idle_gb_minutes:>12.1f} "
                f"{p.p75_model_cold_start_rate:>9.3f} {p.share_wait_over_5s:>7.2%} {marks:>6}"
            )
        return "\n".join(lines)

    def to_png(self, path: Path) -> Path:
        """Two panels, idle GB-minutes on x: p75 per-model cold-start rate, and share waiting > 5 s.
        Every point is drawn; each family's front is joined by a line, its knob values written by it."""
        plt = _pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
        panels = (
            ("p75", "p75 per-model cold-start rate", "no cold start"),
            # Under --unlimited loads are instant: nobody waits, and the panel says so.
            ("wait", "share of requests waiting > 5 s", "no request waited > 5 s"),
        )
        idle = [p.idle_gb_minutes for p in self.points]
        for ax, (against, ylabel, none) in zip(axes, panels, strict=True):
            y = _measure(against).value
            for family in self.families():
                pts = self.family(family)
                line = ax.scatter([p.idle_gb_minutes for p in pts], [y(p) for p in pts], s=18, alpha=0.5)
                front = self.front(family, against)
                color = line.get_facecolor()[0]
                ax.plot(
                    [p.idle_gb_minutes for p in front],
                    [y(p) for p in front],
                    marker="o",
                    color=color,
                    label=family,
                )
                for p in pts:
                    if p.knob is not None:
                        at = (p.idle_gb_minutes, y(p))
                        ax.annotate(p.knob, at, fontsize=7, xytext=(3, 3), textcoords="offset points")
            if idle and min(idle) > 0:
                ax.set_xscale("log")  # knobs span orders of magnitude of memory
            if all(y(p) == 0 for p in self.points):
                ax.text(0.5, 0.6, none, transform=ax.transAxes, ha="center", color="grey")
            ax.set_xlabel(f"idle GB-minutes ({' + '.join(IDLE_TIERS)})")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("Pareto fronts per policy (lower left is better)")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(fig)
        return path


def sweep(run: RunPolicies, policies: Mapping[str, Sequence[str]]) -> SweepResult:
    """Run every label of ``label_grid(policies)`` through ``run`` (once, all together, so a caller can
    share the training and the trace between them) and place each on its family's fronts."""
    labels = label_grid(policies)
    if not labels:
        raise ValueError("nothing to sweep: no policy given")
    metrics = run(labels)
    missing = [label for label in labels if label not in metrics]
    if missing:
        raise KeyError(f"the run returned no metrics for {', '.join(missing)}")
    return SweepResult.of({label: metrics[label] for label in labels})


def _objectives(label: str, m: Mapping[str, Any]) -> tuple[str, str, str | None, float, float, float]:
    family, sep, knob = label.partition(":")
    idle_by_tier: Mapping[str, float] = m.get("idle_gb_minutes", {})
    idle = float(sum(float(idle_by_tier.get(t, 0.0)) for t in IDLE_TIERS))
    return (
        label,
        family,
        knob if sep else None,
        idle,
        float(m["p75_model_cold_start_rate"]),
        float(m["share_wait_over_5s"]),
    )


def _within(front: Sequence[tuple[float, float]], budget: float) -> float | None:
    """On a front of (cost, loss) points, loss falling as cost rises, the least loss at cost ≤ ``budget``:
    linear between the two points around it, the costliest point's loss beyond them, None below the
    cheapest."""
    pts = sorted(front)
    if not pts or budget < pts[0][0]:
        return None
    for (c0, l0), (c1, l1) in itertools.pairwise(pts):
        if c0 <= budget < c1:
            return l0 + (l1 - l0) * (budget - c0) / (c1 - c0)
    return pts[-1][1]


def _reached(value: float | None, other: float, spec: str) -> str:
    """``value`` and its ratio to ``other``, or that the front does not reach it."""
    if value is None:
        return "not reached"
    ratio = f"{value / other:.2f} x" if other > 0 else ("both 0" if value == 0 else "other 0")
    return f"{value:{spec}} ({ratio})"


def _idle(p: SweepPoint) -> float:
    return p.idle_gb_minutes


def _p75(p: SweepPoint) -> float:
    return p.p75_model_cold_start_rate


def _wait5(p: SweepPoint) -> float:
    return p.share_wait_over_5s


class _Measure(NamedTuple):
    """What a front is read against (``SweepResult.front``)."""

    name: str  # in the tables
    value: Callable[[SweepPoint], float]
    spec: str  # its format
    on_front: Callable[[SweepPoint], bool]


_MEASURES: Mapping[str, _Measure] = {
    "p75": _Measure("p75", _p75, ".3f", attrgetter("on_front_p75")),
    "wait": _Measure("share > 5 s", _wait5, ".2%", attrgetter("on_front_wait")),
}


def _measure(against: str) -> _Measure:
    if against not in _MEASURES:
        raise ValueError(f"a front is read against {' or '.join(_MEASURES)}, not {against!r}")
    return _MEASURES[against]


def _pyplot() -> Any:  # matplotlib is untyped
    import matplotlib

    matplotlib.use("Agg")  # never a display: this runs in CI and on servers
    import matplotlib.pyplot as plt

    return plt
