"""``prewarm bench policy``: every policy on every case of the trace suite, in the three settings the
issue judges them in, and whether prewarm meets its targets there.

Settings:

- ``unlimited`` — the standard serverless comparison ('Serverless in the Wild'): one tier, no limit,
  instant loads. Target: prewarm's p75 per-model cold-start rate ≤ 0.5 × the hybrid histogram's, at idle
  memory ≤ 0.5 × fixed 10-minute keep-alive's.
- ``tight`` — far more weights than GPU memory. Target: share of requests waiting > 5 s ≤ 0.5 × the best
  non-oracle baseline's, at L0+L1 idle GB-minutes ≤ that baseline's, and ≤ 1.5 × the oracle's share.
- ``roomy`` — everything fits in GPU memory. Target: never more cold starts than ``reactive``.
- a cluster of the caller's (``clusters``, named by the caller; ``prewarm bench policy --cluster FILE``)
  — judged by the tight cluster's targets: the suite's traffic on a shape the suite does not have.
- a roomy cluster of the caller's nodes (``roomy_like``: as many nodes like a cluster's first one as
  hold the case's catalogue at once; ``prewarm bench policy --roomy-like FILE``) — judged as ``roomy``.

Where prewarm ran at two prices or more (``prewarm:X``), the tight target is also read on its front at
the best baseline's own idle memory (``AtEqualMemory``), beside the count and never in it.

A ratio whose baseline is 0 is met only when prewarm is 0 too. One forecaster fit per case serves all
three settings. Cases carry a role (``tune`` / ``judge``): the summary reports the two sets apart, since
only the judge set says how the policy does on traffic it was not tuned on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prewarm import InvalidInput
from scheduler import Cluster
from sim._bound import poisson_idle_bound
from sim._generators import roomy_cluster
from sim._metrics import SimMetrics
from sim._policies import DEFAULT_POLICIES
from sim._run import fit_forecasts, run_policies
from sim._suite import Case
from sim._sweep import SweepResult

__all__ = ["SETTINGS", "AtEqualMemory", "Bound", "PolicyBench", "Target", "judge", "run_policy_bench"]

SETTINGS = ("unlimited", "tight", "roomy")
BASELINES = ("reactive", "keepalive:600", "histogram")


@dataclass(frozen=True)
class Target:
    """One target of one case in one setting: the figure, the bound it had to stay under, met or not."""

    case: str
    role: str
    setting: str
    name: str
    value: float
    bound: float
    met: bool

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Bound:
    """On a case whose every model is a constant-rate Poisson process: the least idle memory any causal
    policy needs for the unlimited p75 target (``poisson_idle_bound``), against what the target allows."""

    case: str
    role: str
    p75: float
    idle_needed: float
    idle_allowed: float

    @property
    def feasible(self) -> bool:
        return self.idle_needed <= self.idle_allowed + 1e-9

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "feasible": self.feasible}


def unlimited_bound(case: Case, results: Mapping[str, SimMetrics]) -> Bound | None:
    """``Bound`` for ``case`` under ``--unlimited`` if the generator made only constant Poisson models
    (what the argument needs; ``None`` otherwise: structure lets a policy do better than any bound here)."""
    if not case.truth or any(t.kind != "poisson" for t in case.truth.values()):
        return None
    frame = case.events
    window = frame[(frame["timestamp"] >= case.cut) & (frame["timestamp"] < case.end)]
    sizes = [case.catalog[m].size_bytes / 1e9 for m in window["model"].unique()]
    p75 = 0.5 * results["histogram"].p75_model_cold_start_rate
    needed = poisson_idle_bound(sizes, case.sim_hours * 60.0, p75)
    allowed = 0.5 * results["keepalive:600"].idle_gb_minutes["L0"]
    return Bound(case.name, case.role, p75, needed, allowed)


def _le(value: float, bound: float) -> bool:
    # A bound of 0 (the baseline made no cold start, wasted nothing) is met only by 0.
    return value <= bound + 1e-12


def _l01(m: SimMetrics) -> float:
    return m.idle_gb_minutes.get("L0", 0.0) + m.idle_gb_minutes.get("L1", 0.0)


def best_baseline(results: Mapping[str, SimMetrics]) -> str:
    """The non-oracle baseline the tight target compares with: the least share waiting > 5 s, then the
    least L0+L1 idle memory."""
    return min(BASELINES, key=lambda b: (results[b].share_wait_over_5s, _l01(results[b])))


@dataclass(frozen=True)
class AtEqualMemory:
    """The tight target read at equal memory: prewarm's front against the share waiting > 5 s (its price
    swept, ``prewarm:X``) at the best baseline's own L0+L1 idle memory, and the idle memory that front
    needs for the baseline's share (None: not reached). Reported beside the targets, never counted
    in them: the targets are each policy's own point."""

    case: str
    role: str
    setting: str
    baseline: str
    baseline_share: float
    baseline_idle: float
    share: float | None
    idle_for_share: float | None

    @property
    def met(self) -> bool:
        """Whether prewarm's share at the baseline's memory is ≤ 0.5 × the baseline's."""
        return self.share is not None and _le(self.share, 0.5 * self.baseline_share)

    @property
    def below(self) -> bool:
        """Whether prewarm's share at the baseline's memory is below the baseline's at all."""
        return self.share is not None and self.share < self.baseline_share

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "met": self.met}

    def line(self) -> str:
        at = f"{self.case:<14} {self.role:<6} {self.setting:<9} at {self.baseline}'s idle memory"
        if self.share is None:
            return f"{at}: prewarm holds more than that at every price (≤ 0.5 × NO)"
        ratio = f"{self.share / self.baseline_share:.2f} ×" if self.baseline_share > 0 else "baseline 0"
        idle = "not reached" if self.idle_for_share is None else f"{self.idle_for_share:,.0f} GB-min"
        return (
            f"{at}: prewarm's share > 5 s {self.share:.3%} = {ratio} its {self.baseline_share:.3%}"
            f" (≤ 0.5 × {'yes' if self.met else 'NO'}); idle memory for its share {idle}"
            f" against its {self.baseline_idle:,.0f}"
        )


def prewarm_swept(results: Mapping[str, SimMetrics]) -> SweepResult | None:
    """The runs on their fronts where prewarm ran at two knob values or more beside other policies
    (``--policy prewarm:0.0005 --policy prewarm:0.002 ...``); None otherwise, so a default bench run
    reads no front."""
    swept = SweepResult.of({label: m.to_json() for label, m in results.items()})
    return swept if 2 <= len(swept.family("prewarm")) < len(swept.points) else None


def at_equal_memory(case: Case, setting: str, results: Mapping[str, SimMetrics]) -> AtEqualMemory | None:
    """``AtEqualMemory`` where prewarm ran at two prices or more (``prewarm_swept``); None otherwise."""
    swept = prewarm_swept(results)
    if swept is None:
        return None
    best = best_baseline(results)
    share, idle = results[best].share_wait_over_5s, _l01(results[best])
    return AtEqualMemory(
        case.name,
        case.role,
        setting,
        best,
        share,
        idle,
        swept.front_within("prewarm", idle, "wait"),
        swept.front_idle_for("prewarm", share, "wait"),
    )


def judge(
    case: Case,
    setting: str,
    results: Mapping[str, SimMetrics],
    policy: str = "prewarm",
    *,
    kind: str | None = None,
) -> list[Target]:
    """The issue's targets for ``policy`` against the baselines of ``results`` in ``setting``, judged as
    the setting of ``SETTINGS`` that ``kind`` names (default: ``setting`` itself)."""
    p = results[policy]
    kind = setting if kind is None else kind

    def target(name: str, value: float, bound: float) -> Target:
        return Target(case.name, case.role, setting, name, value, bound, _le(value, bound))

    if kind == "unlimited":
        hist, keep = results["histogram"], results["keepalive:600"]
        return [
            target(
                "p75 ≤ 0.5 × histogram", p.p75_model_cold_start_rate, 0.5 * hist.p75_model_cold_start_rate
            ),
            target(
                "idle L0 ≤ 0.5 × keepalive:600", p.idle_gb_minutes["L0"], 0.5 * keep.idle_gb_minutes["L0"]
            ),
        ]
    if kind == "tight":
        best = best_baseline(results)
        base, oracle = results[best], results["oracle"]
        return [
            target(f">5 s ≤ 0.5 × {best}", p.share_wait_over_5s, 0.5 * base.share_wait_over_5s),
            target(f"idle L0+L1 ≤ {best}", _l01(p), _l01(base)),
            target(">5 s ≤ 1.5 × oracle", p.share_wait_over_5s, 1.5 * oracle.share_wait_over_5s),
            target("mispredictions ≤ 25% of prefetches", p.mispredictions, 0.25 * p.prefetches),
        ]
    return [target("cold starts ≤ reactive", p.cold_starts, results["reactive"].cold_starts)]


@dataclass
class PolicyBench:
    """Every run's metrics (case → setting → label → metrics) and every target."""

    runs: dict[str, dict[str, dict[str, SimMetrics]]] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    bounds: list[Bound] = field(default_factory=list)
    equal_memory: list[AtEqualMemory] = field(default_factory=list)
    fit_seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, int]]:
        """Targets met / judged, per role."""
        out: dict[str, dict[str, int]] = {}
        for t in self.targets:
            row = out.setdefault(t.role, {"met": 0, "judged": 0})
            row["judged"] += 1
            row["met"] += int(t.met)
        return out

    def swept(self) -> dict[tuple[str, str], SweepResult]:
        """``prewarm_swept`` per case and setting where it reads a front: from them, where prewarm's
        fronts are at each other policy's point (``SweepResult.matched``): against the p75, and where
        anyone waited, against the share waiting > 5 s, which the tight cluster's target reads at the
        best baseline's idle memory."""
        out: dict[tuple[str, str], SweepResult] = {}
        for case, settings in self.runs.items():
            for setting, results in settings.items():
                result = prewarm_swept(results)
                if result is not None:
                    out[case, setting] = result
        return out

    def to_json(self) -> dict[str, Any]:
        matched = [
            {"case": case, "setting": setting, **m.to_json()}
            for (case, setting), result in self.swept().items()
            for against in result.measures()
            for m in result.matched("prewarm", against)
        ]
        doc: dict[str, Any] = {
            "summary": self.summary(),
            "targets": [t.to_json() for t in self.targets],
            "bounds": [b.to_json() for b in self.bounds],
            "fit_seconds": self.fit_seconds,
            "runs": {
                case: {s: {label: m.to_json() for label, m in r.items()} for s, r in settings.items()}
                for case, settings in self.runs.items()
            },
        }
        if matched:
            doc["matched"] = matched
        if self.equal_memory:
            doc["equal_memory"] = [e.to_json() for e in self.equal_memory]
        return doc

    def table(self) -> str:
        """One row per case, setting and policy, then the targets ('warm': ``warm_displacements``)."""
        lines = [
            f"{'case':<14} {'setting':<9} {'policy':<14} {'requests':>8} {'cold':>7} {'warm':>6} "
            f"{'p75 rate':>8} {'>5 s':>7} {'idle L0+L1 GB-min':>17} {'prefetch':>8} {'mispred':>7} "
            f"{'displ':>5} {'stable':>6}"
        ]
        for case, settings in self.runs.items():
            for setting, results in settings.items():
                for label, m in results.items():
                    lines.append(
                        f"{case:<14} {setting:<9} {label:<14} {m.requests:>8} {m.cold_starts:>7} "
                        f"{m.warm_displacements:>6} {m.p75_model_cold_start_rate:>8.3f} "
                        f"{m.share_wait_over_5s:>7.2%} {_l01(m):>17.0f} {m.prefetches:>8} "
                        f"{m.mispredictions:>7} {m.mispredicted_by['displaced']:>5} "
                        f"{'yes' if m.stable else 'NO':>6}"
                    )
        lines.append("")
        lines.append(
            f"{'case':<14} {'role':<6} {'setting':<9} {'target':<38} {'value':>12} {'bound':>12} met"
        )
        for t in self.targets:
            lines.append(
                f"{t.case:<14} {t.role:<6} {t.setting:<9} {t.name:<38} {t.value:>12.4g} {t.bound:>12.4g} "
                f"{'yes' if t.met else 'NO'}"
            )
        for (case, setting), result in self.swept().items():
            for against in result.measures():
                lines.append(f"{case}, {setting}: {result.matched_table('prewarm', against)}")
        for b in self.bounds:
            lines.append(
                f"{b.case}: every model is Poisson, so any causal policy needs ≥ {b.idle_needed:,.0f} idle "
                f"GB-min for p75 ≤ {b.p75:.3f}; the idle target allows {b.idle_allowed:,.0f}: "
                + ("feasible" if b.feasible else "the two unlimited targets cannot both be met")
            )
        for e in self.equal_memory:
            lines.append(e.line())
        for role, row in sorted(self.summary().items()):
            lines.append(f"{role}: {row['met']} of {row['judged']} targets met")
        for role in sorted({e.role for e in self.equal_memory}):
            mine = [e for e in self.equal_memory if e.role == role]
            met, below = sum(e.met for e in mine), sum(e.below for e in mine)
            lines.append(
                f"{role}, at the best baseline's idle memory (not counted above): prewarm's share > 5 s "
                f"≤ 0.5 × on {met} of {len(mine)}, below it on {below}"
            )
        return "\n".join(lines)


def run_policy_bench(
    cases: Sequence[Case],
    settings: Any,
    *,
    labels: Sequence[str] = DEFAULT_POLICIES,
    where: Sequence[str] = SETTINGS,
    clusters: Mapping[str, Cluster] | None = None,
    roomy_like: Mapping[str, Cluster] | None = None,
    progress: Callable[[str], None] | None = None,
) -> PolicyBench:
    """Fit the forecaster once per case on its training days, then run ``labels`` in each setting of
    ``where`` and judge prewarm there (when ``labels`` holds what the targets compare). A setting of
    ``where`` not in ``SETTINGS`` is one of ``clusters``, each case run on that cluster and judged as
    ``tight`` is, or one of ``roomy_like``, each case run on ``roomy_cluster`` of its nodes and judged as
    ``roomy`` is."""
    import time

    from scheduler import PlannerConfig

    clusters, roomy_like = clusters or {}, roomy_like or {}
    unknown = [s for s in where if s not in SETTINGS and s not in clusters and s not in roomy_like]
    if unknown:
        raise ValueError(f"unknown settings {unknown}: {', '.join(SETTINGS)} or a cluster given by name")
    # Every roomy cluster of the caller's nodes before any work: a node too small for a case's largest
    # model is refused now, not after the cases before it have run.
    roomy: dict[tuple[str, str], Cluster] = {}
    for setting, like in roomy_like.items():
        for case in cases:
            try:
                roomy[case.name, setting] = roomy_cluster(case.catalog, like)
            except InvalidInput as e:
                raise InvalidInput(f"{setting}, {case.name}: {e}", reason=e.reason) from None
    bench = PolicyBench()
    planner = PlannerConfig.from_settings(settings.scheduler)
    comparable = {"prewarm", "oracle", *BASELINES} <= set(labels)
    for case in cases:
        began = time.perf_counter()
        source = fit_forecasts(case.events, settings, cut=case.cut)
        bench.fit_seconds[case.name] = round(time.perf_counter() - began, 2)
        for setting in where:
            if progress is not None:
                progress(f"{case.name} ({case.role}): {setting}")
            cluster: Cluster | None
            if setting in roomy_like:
                cluster, kind = roomy[case.name, setting], "roomy"
            elif setting in clusters:
                cluster, kind = clusters[setting], "tight"
            else:
                cluster, kind = (None if setting == "unlimited" else case.clusters[setting]), setting
            results = run_policies(
                case.events,
                case.catalog,
                cluster,
                labels,
                start=case.cut,
                end=case.end,
                forecasts=source,
                planner=planner,
                hints=case.hints,
                unlimited=setting == "unlimited",
            )
            bench.runs.setdefault(case.name, {})[setting] = results
            if comparable:
                bench.targets.extend(judge(case, setting, results, kind=kind))
                matched = at_equal_memory(case, setting, results) if kind == "tight" else None
                if matched is not None:
                    bench.equal_memory.append(matched)
                bound = unlimited_bound(case, results) if setting == "unlimited" else None
                if bound is not None:
                    bench.bounds.append(bound)
    return bench
