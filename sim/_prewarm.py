"""The ``prewarm`` policy: the real ``scheduler.SchedulerCore`` (so the real ``plan``) on a virtual clock,
fed with forecasts, hints and the nodes' reports every planning interval.

Its knob (``prewarm:X``) is ``PlannerConfig.memory_price``: weighted seconds charged per GB·minute a
model is held beyond what it serves. Without a knob it is the planner's own price on a cluster (0 by
default: memory inside the budget is paid for whether it holds a model or not; and
``contended_memory_price``, 0 by default too) and
``UNLIMITED_MEMORY_PRICE`` under ``--unlimited``, where idle memory is the very cost being compared.

A forecast source that can also ``observe(model, at)`` (a ``forecaster.LiveForecasts``) is told of every
request the simulated platform serves; its forecasts are refreshed every planning tick, since they are
conditioned on the time since each model's last request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prewarm import ExecutorState, Hint, InvalidInput, Order
from scheduler import Cluster, PlannerConfig
from sim._policies import (
    ForecastSource,
    NodeShape,
    Policy,
    PolicyContext,
    PolicyInputs,
    knob_float,
    register_policy,
)

if TYPE_CHECKING:
    from scheduler import SchedulerCore

__all__ = ["PrewarmPolicy", "cluster_of"]


def cluster_of(nodes: Mapping[str, NodeShape], bandwidth: Mapping[str, float]) -> Cluster:
    """The cluster file the planner would be given for these nodes and links."""
    rates = {"l3_bytes_per_s": "L3->L2", "l2_bytes_per_s": "L2->L1", "l1_bytes_per_s": "L1->L0"}
    return Cluster.from_data(
        {
            "nodes": [
                {
                    "name": shape.name,
                    "gpus": [{"memory_bytes": b} for b in shape.gpu_bytes],
                    "host_cache_bytes": shape.host_bytes,
                    "disk_cache_bytes": shape.disk_bytes,
                }
                for shape in nodes.values()
            ],
            "bandwidth": {key: bandwidth[hop] for key, hop in rates.items() if hop in bandwidth},
        }
    )


class PrewarmPolicy(Policy):
    """The real scheduler core, asked to replan every tick."""

    def __init__(
        self,
        config: PlannerConfig,
        forecasts: ForecastSource | None,
        *,
        forecast_every_s: float = 60.0,
        unlimited_price: float | None = None,
        name: str = "prewarm",
    ) -> None:
        self.name = name
        self.config = config
        self._now = 0.0
        self._out: list[Order] = []
        self._forecasts = forecasts
        observe = getattr(forecasts, "observe", None)
        self._observe = observe if callable(observe) else None
        self._forecast_every_s = forecast_every_s
        self._unlimited_price = unlimited_price
        self._forecast_at: float | None = None
        self._seen_hints: set[tuple[str, float]] = set()
        self._core: SchedulerCore | None = None

    @property
    def core(self) -> SchedulerCore:
        if self._core is None:
            raise RuntimeError("PrewarmPolicy.prepare was not called")
        return self._core

    def prepare(self, ctx: PolicyContext) -> None:
        from scheduler import SchedulerCore

        if ctx.unlimited:
            # The serverless comparison measures every model's cold-start rate alike.
            self.config = dataclasses.replace(self.config, objective="models")
            if self._unlimited_price is not None:
                self.config = with_memory_price(self.config, self._unlimited_price)
        self._core = SchedulerCore(
            catalog=ctx.catalog,
            cluster=cluster_of(ctx.nodes, ctx.bandwidth),
            config=self.config,
            dispatch=self._out.extend,
            clock=lambda: self._now,
        )

    def on_request(self, model: str, at: float, node: str) -> list[Order]:
        if self._observe is not None:
            self._observe(model, at)
        if self._core is not None:
            self._core.requested(model, at)  # hints are judged by requests
        return []

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        self._now = now
        core = self.core
        if self._forecasts is not None and (
            self._forecast_at is None or now - self._forecast_at >= self._forecast_every_s
        ):
            core.set_signals(forecasts=self._forecasts(now))
            self._forecast_at = now
        for report in reports.values():
            core.observe(report)
        for hint in hints:
            key = (hint.model, hint.received_at or now)
            # A hint keeps the time it was sent, and one whose window ended before the replay began
            # (the training days') is not sent late: it would be planned, and judged, as a new one.
            if key not in self._seen_hints and hint.live(now):
                self._seen_hints.add(key)
                core.add_hint(hint, received_at=hint.received_at)
        core.replan()
        out, self._out[:] = list(self._out), []
        return out


UNLIMITED_MEMORY_PRICE = 0.0005
"""``prewarm``'s memory price under ``--unlimited`` without a knob (``PlannerConfig.memory_price``, with
the per-model objective), chosen by a sweep over the suite's tune cases (docs/benchmarks.md): the
highest of 0.0005, 0.001, 0.002, 0.004, 0.008 at which prewarm had both a lower p75 cold-start rate and
less idle memory than the hybrid histogram on every tune case (at 0.001 its p75 was above the
histogram's on two of five). Swept again on the eight tune cases since (the forty-second stop), it is
still the highest at which prewarm's p75 is at most the histogram's on every one of draw 0 (four of
eight at 0.001), though its idle memory is now above the histogram's on two of them."""


def with_memory_price(config: PlannerConfig, price: float) -> PlannerConfig:
    """``config`` with ``memory_price`` set, or a clear error on a planner that has no such knob."""
    if "memory_price" not in {f.name for f in dataclasses.fields(config)}:
        raise InvalidInput("prewarm:X sets PlannerConfig.memory_price, which this planner does not have")
    changes: dict[str, Any] = {"memory_price": price}
    return dataclasses.replace(config, **changes)


def _prewarm(label: str, knob: str | None, inputs: PolicyInputs) -> Policy:
    config = inputs.planner or PlannerConfig()
    if knob is None:
        return PrewarmPolicy(config, inputs.forecasts, name=label, unlimited_price=UNLIMITED_MEMORY_PRICE)
    price = knob_float(label, knob, 0.0)
    if price < 0:
        raise InvalidInput(f"policy {label!r}: the memory price must be ≥ 0")
    return PrewarmPolicy(with_memory_price(config, price), inputs.forecasts, name=label)


register_policy("prewarm", _prewarm)
