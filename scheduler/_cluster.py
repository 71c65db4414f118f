"""What the planner knows about the GPU nodes: the cluster file, merged with each executor's latest report.

The cluster file (``nodes: [{name, gpus: [{memory_bytes}], host_cache_bytes, disk_cache_bytes}]``,
``bandwidth: {l3_bytes_per_s, l2_bytes_per_s, l1_bytes_per_s}``) says what a node should have; an
``ExecutorState`` says what it has and how fast it really moved bytes. The report wins where it exists,
so the scheduler plans before any executor reports and corrects itself as soon as one does.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prewarm import (
    CACHE_TIERS,
    HOP_INTO,
    ByteRate,
    Bytes,
    ConfigError,
    ExecutorState,
    Order,
    OrderAction,
    ResidentModel,
    Tier,
)

__all__ = [
    "Cluster",
    "ClusterState",
    "Departures",
    "NodeSpec",
    "NodeState",
]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuSpec(_Strict):
    memory_bytes: Annotated[Bytes, Field(gt=0)]  # a GPU without memory is a typo: it would hold nothing


class NodeSpec(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    gpus: list[GpuSpec] = Field(default_factory=list)
    host_cache_bytes: Bytes = 0
    disk_cache_bytes: Bytes = 0

    @property
    def l0_bytes(self) -> int:
        return sum(g.memory_bytes for g in self.gpus)

    @property
    def capacity(self) -> dict[Tier, int]:
        """Bytes per cache tier as the file describes them (all GPUs of the node together for L0)."""
        return {Tier.L0: self.l0_bytes, Tier.L1: self.host_cache_bytes, Tier.L2: self.disk_cache_bytes}


class BandwidthSpec(_Strict):
    """Bytes per second out of each tier: L3->L2, L2->L1 and L1->L0."""

    l3_bytes_per_s: Annotated[ByteRate, Field(gt=0)] = 1e9
    l2_bytes_per_s: Annotated[ByteRate, Field(gt=0)] = 7e9
    l1_bytes_per_s: Annotated[ByteRate, Field(gt=0)] = 50e9

    def hops(self) -> dict[str, float]:
        return {
            HOP_INTO[Tier.L2]: self.l3_bytes_per_s,
            HOP_INTO[Tier.L1]: self.l2_bytes_per_s,
            HOP_INTO[Tier.L0]: self.l1_bytes_per_s,
        }


class Cluster(_Strict):
    """The static description of the GPU nodes, as written in a cluster YAML file."""

    nodes: list[NodeSpec] = Field(min_length=1)
    bandwidth: BandwidthSpec = Field(default_factory=BandwidthSpec)

    @field_validator("nodes")
    @classmethod
    def _unique_names(cls, nodes: list[NodeSpec]) -> list[NodeSpec]:
        names = [n.name for n in nodes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate node names: {', '.join(duplicates)}")
        return nodes

    @classmethod
    def from_data(cls, data: Any, source: str = "cluster") -> Cluster:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            lines = [
                f"{'.'.join(str(p) for p in err['loc']) or 'cluster'}: {err['msg']}" for err in exc.errors()
            ]
            raise ConfigError(f"{source}: " + "; ".join(lines), setting="cluster") from exc

    @classmethod
    def load(cls, path: Path) -> Cluster:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read cluster file {path}: {exc.strerror}", setting="cluster") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"cluster file {path} is not valid YAML: {exc}", setting="cluster") from exc
        return cls.from_data(data, source=str(path))

    @classmethod
    def single_node(cls, name: str, *, l0_bytes: int, l1_bytes: int, l2_bytes: int) -> Cluster:
        """The cluster of one node, when no cluster file is configured (embedded mode, one executor)."""
        gpus = [GpuSpec(memory_bytes=l0_bytes)] if l0_bytes else []
        node = NodeSpec(name=name, gpus=gpus, host_cache_bytes=l1_bytes, disk_cache_bytes=l2_bytes)
        return cls(nodes=[node])


@dataclass(frozen=True)
class NodeState:
    """One node as the planner sees it: capacity and residents per tier, bandwidth per hop."""

    name: str
    capacity: Mapping[Tier, int]
    resident: Mapping[Tier, tuple[ResidentModel, ...]] = field(default_factory=dict)
    bandwidth: Mapping[str, float] = field(default_factory=dict)
    # Bytes in use that no listed resident explains (another tenant, an engine's own buffers).
    unlisted: Mapping[Tier, int] = field(default_factory=dict)
    gpus: tuple[int, ...] = ()
    """L0 bytes of each GPU (their sum is L0's capacity); empty when L0 is one pool of unknown split."""
    gpu_ids: tuple[int, ...] = ()
    """The node's index of each GPU of ``gpus`` (what ``Order.gpus`` and ``ResidentModel.gpus`` name)."""
    gpu_used: tuple[int, ...] = ()
    """Bytes in use on each GPU of ``gpus`` as the node reports them; empty when it does not say."""
    unused_for: Mapping[tuple[Tier, int], tuple[float, ...]] = field(default_factory=dict)
    """Per tier and width, how long the copies that left it lately without an order had gone unused
    (``Departures``): how long the executor's LRU keeps a copy nothing uses, measured rather than
    guessed. Width: the GPUs a GPU copy spanned (1 in host memory)."""
    demand_busy: Mapping[str, float] = field(default_factory=dict)
    """Per hop, the share of recent time it carried a load a request waited on, as the node reports it
    (``ExecutorState.link_demand_busy``); a hop it does not name reads as idle."""
    turns: Mapping[str, int] = field(default_factory=dict)
    """Per model, how many GPU copies in use of models too large for this node's host memory its loads
    onto this node's GPUs displaced lately, the model's host copy there having sent those loads here
    (``Departures.turns``): models taking turns."""
    demand_loads: frozenset[str] = frozenset()
    """Models the node is loading for a request that waits on them, their copy not ready yet
    (``ExecutorState.demand_loads``)."""

    def residents(self, tier: Tier) -> tuple[ResidentModel, ...]:
        return self.resident.get(tier, ())

    @property
    def gpu_capacities(self) -> tuple[int, ...]:
        """L0 per GPU, as ``prewarm.gpu_placement`` takes it; one GPU of all of L0 if the split is unknown."""
        if self.gpus:
            return self.gpus
        total = self.capacity.get(Tier.L0, 0)
        return (total,) if total > 0 else ()

    @functools.cached_property
    def staging_busy(self) -> float:
        """How busy the link from object storage is with loads on request (0-1), in tenths: what staging
        a copy on disk on a guess takes the link from. (Tenths: nodes that differ by less value a model
        alike, so the planner still values it once for all of them.)"""
        return round(self.demand_busy.get(HOP_INTO[Tier.L2], 0.0), 1)

    @functools.cached_property
    def hop_rates(self) -> tuple[float, ...]:
        """Bytes per second of the hop into L0, L1 and L2, indexed by tier level (0 when unknown)."""
        return tuple(self.bandwidth.get(HOP_INTO[t], 0.0) for t in CACHE_TIERS)


@dataclass(frozen=True)
class ClusterState:
    """The planner's whole view of the cluster at one instant.

    ``pending`` are orders already published that the reports do not reflect yet: the planner books
    their bytes so that two rounds never promise the same free space twice. ``recent`` are orders
    published lately, so that a model evicted as a misprediction is not fetched straight back, and so
    that the prefetch behind an unused copy is known. ``predicted``: for a prefetch's order id, when the
    demand it was made for was predicted (the misprediction window counts from there).
    """

    nodes: Mapping[str, NodeState]
    pending: tuple[Order, ...] = ()
    recent: tuple[Order, ...] = ()
    predicted: Mapping[str, float] = field(default_factory=dict)

    @functools.cached_property
    def loading_on_request(self) -> frozenset[str]:
        """Models some node is loading for a request that waits on them: their copy is on its way to
        where it is asked for, and a guess about them would place a second one elsewhere."""
        return frozenset().union(*(n.demand_loads for n in self.nodes.values()))

    @classmethod
    def merge(
        cls,
        cluster: Cluster,
        reports: Mapping[str, ExecutorState],
        *,
        pending: Iterable[Order] = (),
        recent: Iterable[Order] = (),
        predicted: Mapping[str, float] | None = None,
    ) -> ClusterState:
        """The cluster file, with each executor's latest report laid over its node.

        A node that reports without being in the file joins with the file's default bandwidth; a node in
        the file that never reported is planned as empty, so orders still go out before any report.
        """
        nodes: dict[str, NodeState] = {}
        defaults = cluster.bandwidth.hops()
        for spec in cluster.nodes:
            gpus = tuple(g.memory_bytes for g in spec.gpus)
            nodes[spec.name] = NodeState(
                name=spec.name,
                capacity=spec.capacity,
                bandwidth=dict(defaults),
                gpus=gpus,
                gpu_ids=tuple(range(len(gpus))),
                gpu_used=(0,) * len(gpus),
            )
        for name, report in reports.items():
            base = nodes.get(name) or NodeState(name=name, capacity={}, bandwidth=dict(defaults))
            nodes[name] = _overlay(base, report)
        return cls(nodes=nodes, pending=tuple(pending), recent=tuple(recent), predicted=dict(predicted or {}))


def _overlay(base: NodeState, report: ExecutorState) -> NodeState:
    capacity = dict(base.capacity)
    resident: dict[Tier, tuple[ResidentModel, ...]] = {}
    unlisted: dict[Tier, int] = {}
    for tier_state in report.tiers:
        if tier_state.tier not in CACHE_TIERS:
            continue
        # The executor knows its real budget (free device memory, disk quota): it beats the file.
        capacity[tier_state.tier] = tier_state.capacity_bytes
        resident[tier_state.tier] = tuple(tier_state.resident)
        listed = sum(r.bytes for r in tier_state.resident)
        unlisted[tier_state.tier] = max(tier_state.used_bytes - listed, 0)
    bandwidth = dict(base.bandwidth)
    # Only a positive measurement replaces the configured figure: a hop not yet used measures nothing.
    bandwidth.update({hop: rate for hop, rate in report.bandwidth_bytes_per_s.items() if rate > 0})
    gpus, gpu_ids, gpu_used = _gpus(base, report, capacity.get(Tier.L0, 0))
    return NodeState(
        name=base.name,
        capacity=capacity,
        resident=resident,
        bandwidth=bandwidth,
        unlisted=unlisted,
        gpus=gpus,
        gpu_ids=gpu_ids,
        gpu_used=gpu_used,
        demand_busy=dict(report.link_demand_busy),
        demand_loads=frozenset(report.demand_loads),
    )


def _gpus(
    base: NodeState, report: ExecutorState, l0: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """L0 per GPU as (capacities, GPU indices, bytes in use): the report's own figures; else the file's
    GPUs scaled to the L0 budget the executor reports (a fractional budget takes the same share of each
    device), with no per-GPU use known; else none (one pool)."""
    if report.gpus:
        ordered = sorted(report.gpus, key=lambda g: g.index)
        return (
            tuple(g.capacity_bytes for g in ordered),
            tuple(g.index for g in ordered),
            tuple(g.used_bytes for g in ordered),
        )
    total = sum(base.gpus)
    if not base.gpus or total <= 0 or l0 <= 0:
        return (), (), ()
    scaled = [g * l0 // total for g in base.gpus]
    scaled[0] += l0 - sum(scaled)  # rounding: the shares add up to the reported budget
    return tuple(scaled), base.gpu_ids, ()


class Departures:
    """How long copies go unused before a node's executor gives them up on its own, per tier and width.

    A copy in one report and gone from the next, with no demotion or eviction ordered for it that may
    have been carried out in between (``ordered``), was given up by the executor's LRU to make room for
    a load: it had gone unused since its last use (or its load) until about halfway between the two
    reports. The latest ``keep`` such ages within ``horizon_s`` of the newest report are kept. They are
    what a copy loaded now and then left unused can expect to last, which a snapshot of one report
    cannot tell: there, copies that requests keep using look like room that is never needed.

    GPU copies are kept apart by the number of GPUs they spanned: each GPU makes room by its own LRU,
    and a copy sharded over every GPU of a node is given up by a load onto any of them, where one on a
    single GPU waits for that GPU's turn (on 2 × 80 GB GPUs, prefetched 140 GB copies lasted 30-200 s,
    while the GPU a small model idled on had not given a copy up for an hour).
    """

    def __init__(
        self, *, keep: int = 16, horizon_s: float = 3600.0, warm_s: float = 60.0, turns_s: float = 600.0
    ) -> None:
        self._keep = keep
        self._horizon_s = horizon_s
        self._warm_s = warm_s
        self._turns_s = turns_s
        # node -> (left at, the model whose load displaced a GPU copy in use) of each such turn
        self._turns: dict[str, list[tuple[float, str]]] = {}
        # node -> (tier, width) -> (left at, age)
        self._ages: dict[str, dict[tuple[Tier, int], list[tuple[float, float]]]] = {}
        # node -> model -> (not before, deadline) of each demotion or eviction not over yet
        self._orders: dict[str, dict[str, list[tuple[float, float]]]] = {}

    def ordered(self, order: Order) -> None:
        """Note an order: a demotion or eviction takes its copies away by order, not by the LRU."""
        if order.action is not OrderAction.PREFETCH:
            windows = self._orders.setdefault(order.node, {}).setdefault(order.model, [])
            windows.append((order.not_before, order.deadline))

    def observe(self, before: ExecutorState, after: ExecutorState) -> None:
        """Note the copies ``before`` lists and ``after`` does not."""
        orders = self._orders.get(after.node, {})
        for model, windows in list(orders.items()):
            # One carried out or expired before ``before`` explains nothing from now on.
            windows[:] = [w for w in windows if w[1] >= before.at]
            if not windows:
                del orders[model]
        left_at = (before.at + after.at) / 2
        given_up = list(_given_up(before, after, orders))
        self._note_turns(before, after, [r for tier, r in given_up if tier is Tier.L0], left_at)
        kept = self._ages.setdefault(after.node, {})
        for tier, r in given_up:
            since = r.unused_since
            if since is None:
                continue
            ages = kept.setdefault((tier, copy_width(tier, len(r.gpus))), [])
            ages.append((left_at, max(left_at - since, 0.0)))
            del ages[: max(len(ages) - self._keep, 0)]

    def _note_turns(
        self, before: ExecutorState, after: ExecutorState, displaced: Iterable[ResidentModel], left_at: float
    ) -> None:
        """Note each GPU copy in use (last used within ``warm_s``) of a model too large for this node's
        host memory that the LRU gave up (``displaced``) for a model newly on the same GPUs whose host
        copy is here: the load went here because of that host copy (a load goes where its model is staged
        in host memory), and each such turn costs the other model a reload from disk.

        A displaced model that host memory can hold reloads from there once its copy has formed: its
        turns are quick, and the host copy that sent the newcomer here saves it a load from disk at each
        of them (demoting such copies raised the suite's long waits: docs/benchmarks.md)."""
        host, gpus, were = after.tier(Tier.L1), after.tier(Tier.L0), before.tier(Tier.L0)
        staged = {r.model for r in host.resident} if host is not None else set()
        earlier = {r.model for r in were.resident} if were is not None else set()
        newcomers = [r for r in gpus.resident if r.model not in earlier and r.model in staged] if gpus else []
        host_bytes = host.capacity_bytes if host is not None else 0  # no host copy: no newcomers either
        turns = self._turns.setdefault(after.node, [])
        for r in displaced if newcomers else ():
            if r.bytes <= host_bytes:
                continue  # a quick turn
            if r.last_used is None or left_at - r.last_used > self._warm_s:
                continue  # not in use
            turns.extend((left_at, n.model) for n in newcomers if set(n.gpus) & set(r.gpus) or not r.gpus)
        # A model no longer staged here has no host copy left to send its loads here: its turns are over.
        turns[:] = [(at, m) for at, m in turns if after.at - at <= self._turns_s and m in staged]

    def turns(self, node: str, now: float) -> dict[str, int]:
        """Per model, the turns noted on ``node`` within ``turns_s`` of ``now`` (``NodeState.turns``)."""
        counts: dict[str, int] = {}
        for at, model in self._turns.get(node, ()):
            if now - at <= self._turns_s:
                counts[model] = counts.get(model, 0) + 1
        return counts

    def of(self, node: str, now: float) -> dict[tuple[Tier, int], tuple[float, ...]]:
        """The ages kept for ``node``, per tier and width, those within ``horizon_s`` of ``now``."""
        return {
            key: kept
            for key, ages in self._ages.get(node, {}).items()
            if (kept := tuple(age for at, age in ages if now - at <= self._horizon_s))
        }


def _given_up(
    before: ExecutorState, after: ExecutorState, orders: Mapping[str, list[tuple[float, float]]]
) -> Iterable[tuple[Tier, ResidentModel]]:
    """The GPU and host copies ``before`` lists and ``after`` does not, with no demotion or eviction
    ordered for them (``orders``: per model, its not-before and deadline) that may have been carried out
    in between: the executor's LRU gave them up."""
    for state in before.tiers:
        if state.tier not in (Tier.L0, Tier.L1):
            continue
        now = after.tier(state.tier)
        still = {r.model for r in now.resident} if now is not None else set()
        for r in state.resident:
            if r.model in still:
                continue
            if any(not_before <= after.at for not_before, _ in orders.get(r.model, ())):
                continue  # ordered away
            yield state.tier, r


def copy_width(tier: Tier, gpus: int) -> int:
    """What ``Departures`` keeps a copy's ages by: in GPU memory the GPUs it spans (one where a report
    does not say), elsewhere 1."""
    return max(gpus, 1) if tier is Tier.L0 else 1
