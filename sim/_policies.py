"""Policies the simulator compares. Each sees the world only through what an executor reports, the way
the live system does, and answers with orders.

- ``reactive``: what platforms do today — nothing until a request arrives, then load it (the executor's
  LRU makes room). The baseline every other policy is measured against.
- ``prewarm``: the real ``scheduler.SchedulerCore`` (so the real ``plan``) on a virtual clock, fed with
  forecasts, hints and the nodes' reports every planning interval.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

from forecaster import ModelForecast
from models import Catalog
from prewarm import ExecutorState, Hint, Order
from scheduler import Cluster, PlannerConfig, SchedulerCore

__all__ = ["POLICIES", "ForecastSource", "Policy", "PrewarmPolicy", "ReactivePolicy"]

ForecastSource = Callable[[float], Mapping[str, ModelForecast]]


class Policy(ABC):
    """One small interface: called every planning interval with the time and the nodes' reports."""

    name: str

    @abstractmethod
    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        """Orders to apply from now on (each when its ``not_before`` is reached)."""


class ReactivePolicy(Policy):
    name = "reactive"

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        return []


class PrewarmPolicy(Policy):
    name = "prewarm"

    def __init__(
        self,
        catalog: Catalog,
        cluster: Cluster,
        config: PlannerConfig,
        forecasts: ForecastSource | None,
        *,
        forecast_every_s: float = 300.0,
    ) -> None:
        self._now = 0.0
        self._out: list[Order] = []
        self._forecasts = forecasts
        self._forecast_every_s = forecast_every_s
        self._forecast_at: float | None = None
        self._seen_hints: set[tuple[str, float]] = set()
        self.core = SchedulerCore(
            catalog=catalog,
            cluster=cluster,
            config=config,
            dispatch=self._out.extend,
            clock=lambda: self._now,
        )

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        self._now = now
        if self._forecasts is not None and (
            self._forecast_at is None or now - self._forecast_at >= self._forecast_every_s
        ):
            self.core.set_signals(forecasts=self._forecasts(now))
            self._forecast_at = now
        for report in reports.values():
            self.core.observe(report)
        for hint in hints:
            key = (hint.model, hint.received_at or now)
            if key not in self._seen_hints:
                self._seen_hints.add(key)
                self.core.add_hint(hint)
        self.core.replan()
        out, self._out[:] = list(self._out), []
        return out


POLICIES = ("reactive", "prewarm")
