"""The simulated cluster: GPU memory per GPU, host and disk caches per node, transfers that share their
link, and requests that wait for whatever is not yet in GPU memory.

It plays the executors' part by the executor's own rules from the spine: which orders it carries out
(``prewarm.admit``), what each does to a model's copies (``prewarm.effect``, ``prewarm.load_path``),
which copies a full tier gives up (``prewarm.lru_victims``: least recently used, never one still loading
or being read from), whether a load on its way to memory takes a place on a full disk at all, or a load
on request from disk to GPU memory in full host memory (``prewarm.admits``: not when the copies it would
drop served more requests × bytes on the node lately) and which
GPUs an L0 copy takes (``prewarm.gpu_shards``, ``prewarm.gpu_placement``: a model larger than one GPU
takes equal shards on several GPUs of one node). The bytes the LRU gives up to carry out an order are
that order's over-commit.

A load is a job of hops along ``load_path``, each of which reserves its tier's bytes when it starts and
moves them over the link into that tier (``L3->L2`` and ``L2->L1`` per node; ``L1->L0`` per node too:
the node's host-to-device bandwidth, shared by its GPUs) after a fixed overhead. Hops are
store-and-forward: the next starts when the previous has landed. A demand load (a request waits on it)
that finds no room in the tier it goes to waits until a transfer lands or a copy leaves (in a tier on its
way, it streams through); a speculative one fails. A request
for a model whose load to GPU memory is in flight waits for that load, and makes it a demand load.
Demotions write down to the farther tier at once (device-to-host copies do not use these links).
"""

from __future__ import annotations

from collections.abc import Mapping

from models import Catalog
from prewarm import (
    CACHE_TIERS,
    HOP_INTO,
    ExecutorState,
    Order,
    OrderAction,
    OrderStatus,
    Tier,
    admit,
    admits,
    lru_victims,
    weighed,
)
from scheduler import Cluster
from sim._links import Clock
from sim._metrics import MISPREDICTION_WINDOW_S, WARM_S, MispredictedBy, Record
from sim._node import HOP_OVERHEAD_S, INF, Copy, Job, LazyReports, Node, cached_effect, cached_path
from sim._policies import NodeShape
from sim._route import Router

__all__ = ["World"]


class World:
    """All nodes of a cluster on one virtual clock, counting into one ``Record``."""

    unlimited = False

    def __init__(
        self,
        cluster: Cluster,
        catalog: Catalog,
        *,
        start: float = -INF,
        end: float = INF,
        clock: Clock | None = None,
        hop_overhead_s: float = HOP_OVERHEAD_S,
    ) -> None:
        self.catalog = catalog
        self.clock = clock or Clock(start if start > -INF else 0.0)
        self.record = Record(start, end)
        self.hop_overhead_s = hop_overhead_s
        self.bandwidth = cluster.bandwidth.hops()
        self.shapes = {
            n.name: NodeShape(
                n.name, tuple(g.memory_bytes for g in n.gpus), n.host_cache_bytes, n.disk_cache_bytes
            )
            for n in cluster.nodes
        }
        self.nodes = {name: Node(self, shape, self.bandwidth) for name, shape in self.shapes.items()}
        for node in self.nodes.values():
            for hop, link in node.links.items():
                self.record.link_rate[f"{node.name} {hop}"] = link.rate
        self._l0: dict[str, dict[str, Copy]] = {}  # model -> node -> its L0 copy (ready or loading)
        self._inbound: dict[str, Job] = {}  # model -> a job bringing it to L0 somewhere
        self._applied: set[str] = set()
        self.router = Router(self.nodes, hop_overhead_s)
        self._job_nodes: dict[str, set[Node]] = {}  # model -> the nodes with a job for it
        self.waiting = 0  # requests in the window still waiting for their load

    # ------------------------------------------------------------------ requests

    def closest(self, node: str, model: str) -> Tier:
        """The closest tier of ``node`` holding ``model`` now (ready or arriving); L3 when none."""
        copy = self.nodes[node].closest(model)
        return copy.tier if copy is not None else Tier.L3

    def fits(self, model: str) -> bool:
        """Whether some node's GPUs can hold ``model`` at all."""
        size = self.catalog[model].size_bytes
        return bool(self.router.able(size))

    def request(self, model: str, at: float) -> str:
        """A request arrives: served at once from a ready GPU copy, else it waits for a load (the one in
        flight, or one from the node whose copy is closest). Returns the node that serves it."""
        record = self.record
        counted = record.start <= at < record.end
        on = self._l0.get(model)
        if on:
            for name, copy in on.items():
                if copy.ready_at <= at:
                    self._touch(self.nodes[name], model, at)
                    if counted:
                        record.request(at, model, False, Tier.L0)
                    return name
        job = self._inbound.get(model)
        if job is None:
            job = self._route(model, at)
        else:
            self._touch(job.node, model, at)
        row = record.request(at, model, True, job.source) if counted else -1
        if counted:
            self.waiting += 1
        job.waiters.append((row, at))
        self._make_demand(job)
        return job.node.name

    def _route(self, model: str, at: float) -> Job:
        """Load on a node whose host memory holds a copy (where a planner staged it), if any; else, and
        among those, where GPU memory displaces the least recently used copies (none at best: the LRU rule
        across the cluster; the loads already on their way to a node's GPUs count as there, so a burst
        of first requests is not sent to one node that only looks empty because their downloads have
        not landed), then where the load is quickest (a copy still arriving counts what it has left
        to move). A disk copy does not tie a model to its node: every node can fetch from object
        storage, and sending every load to the node that happened to cache it first would leave the
        others idle. Nor does a host copy whose node would displace a GPU copy too large for its host
        memory while another node has room: on a cluster whose GPUs hold every model but whose host
        memory is small, a 140 GB model loaded on request pushed a node's small models to its host
        memory, their next requests came back to that node and pushed it out to disk, and it went on to
        displace the next node's (docs/benchmarks.md, the thirty-seventh stop)."""
        node = self.router.choose(model, self.catalog[model].size_bytes)
        # The request counts before its load asks the disk for room, as the executor counts a load on
        # request before it loads (``prewarm.admits`` weighs the newcomer with it).
        self._touch(node, model, at)
        job = self._job(node, model, Tier.L0, demand=True, order=None)
        self._start(job)
        return job

    def _touch(self, node: Node, model: str, at: float) -> None:
        node.uses.use(model, at)
        for copies in node.by_tier:
            copy = copies.get(model)
            if copy is not None:
                copy.last_used = copy.recency = at  # ``Copy.use``, without a call on every request
                copy.prefetched = False
                if copy.tier is Tier.L0:
                    node.l0_used(copy)

    def _make_demand(self, job: Job | None) -> None:
        """A request waits on ``job``: it, and the loads it waits for, pre-empt speculative transfers
        (the executor's rule: while a request for a model waits, every transfer of that model on the
        node is a demand transfer). A demand load may wait on a speculative one, such as a disk copy
        still downloading for a prefetch, so the walk goes on past loads that are demand already."""
        while job is not None:
            if not job.demand:
                if job.link is not None:
                    job.link.progress()  # what it moved so far, it moved at the speculative share
                job.demand = True
                self._ask(job)
                if job.link is not None:
                    job.link.changed()
            upstream = job.reading if job.reading is not None else job.waiting_on
            job = upstream.job if upstream is not None else None

    # ------------------------------------------------------------------ jobs

    def _ask(self, job: Job) -> None:
        """Count what a load a request waits on asks of each link it has still to cross, when it starts
        to wait: under a link that cannot keep up this is more than the link moves, and the difference
        is the backlog. A prefetch asks nothing until a request waits on it: loads on request pre-empt
        prefetches, so a prefetch backlog delays no request by itself (``metrics``: ``stable``). The hop
        under way asks what it has left to move now, the hops after it the whole size."""
        node, now, link = job.node, self.clock.now, job.link
        for i, tier in enumerate(job.hops):
            left = link.left(job) if i == 0 and link is not None else job.size
            self.record.asked(node.link_key[tier], left, now)

    def window_begins(self, _: None = None) -> None:
        """The window begins: each demand load still in flight from the warm-up asks what it has left,
        as its requests would had they come now. Requests in the window that wait on such a load ask
        nothing more, so a link that could not keep up since before the cut had shown an offered load of
        0 (``metrics``: ``stable``)."""
        for node in self.nodes.values():
            for jobs in node.jobs.values():
                for job in jobs:
                    if job.demand and not job.done:
                        self._ask(job)

    def _job(self, node: Node, model: str, target: Tier, *, demand: bool, order: Order | None) -> Job:
        size = self.catalog[model].size_bytes
        source = node.closest(model)
        frm = source.tier if source is not None else Tier.L3
        job = Job(
            node=node,
            model=model,
            size=size,
            target=target,
            hops=list(cached_path(frm, target)),
            demand=demand,
            order=order,
            source=frm,
            gpus=tuple(order.gpus) if order is not None else (),
        )
        if demand:
            self._ask(job)
        node.jobs.setdefault(model, []).append(job)
        self._job_nodes.setdefault(model, set()).add(node)
        if target is Tier.L0:
            self._inbound.setdefault(model, job)
            node.expect(job, size)
        return job

    def _start(self, job: Job) -> None:
        """Start the job's next hop, once the copy it reads from has landed and its tier has room; a
        demand load that finds no room in the tier it goes to waits in its node's queue (``_retry``)
        until it does (on its way up, one that finds none in disk or host memory streams past them)."""
        stuck = self._advance(job)
        node = job.node
        if stuck:
            node.wait_on(job, job.hops[0])  # a demand load finds no room only for a hop it is to make
        if stuck and not job.blocked:
            job.blocked = True
            node.blocked.append(job)
            if self.record.counts(self.clock.now):
                self.record.queued_loads += 1
        elif not stuck and job.blocked:
            job.blocked = False
            node.blocked.remove(job)
            node.wait_on(job, None)

    def _advance(self, job: Job) -> bool:
        """``_start`` but for the queue: True when a demand load found no room."""
        node, now = job.node, self.clock.now
        source = node.closest(job.model)
        if source is not None and job.hops and source.tier.level <= job.hops[0].level:
            # Another load brought a closer copy meanwhile: go on from there.
            job.hops = list(cached_path(source.tier, job.target))
        if not job.hops:
            if source is not None and source.ready_at == INF:
                job.waiting_on = source  # the copy it needs is someone else's load in flight
                source.followers.append(job)
            else:
                self._finish(job)
            return False
        if source is not None and source.ready_at == INF:
            job.waiting_on = source  # still arriving: go on when it lands
            source.followers.append(job)
            return False
        job.waiting_on = None
        tier = job.hops[0]
        never = node.capacity[tier] < job.size and tier is not Tier.L0
        placed = None if never else self._room(node, tier, job)
        if placed is not None:
            copy = self._hold(node, tier, job, placed)
        elif never or tier is not job.target:
            # This cache cannot hold it at all, or (on the way up) not now, its room held by copies being
            # read or still arriving or declined (``admits``): streamed through, as the executor streams
            # a load past a full disk and through its staging ring past full host memory, instead of
            # waiting for that room.
            copy = None
        else:
            if job.demand:
                return True
            if job.order is not None and self.record.counts(now):
                self.record.failed_orders += 1
            self._drop_job(job)
            return False
        job.copy, job.reading, job.hop_began = copy, source, now
        if source is not None:
            source.pins += 1
            source.staged = False
            if source.tier is Tier.L0:
                node.l0_changed(source.gpus)
        self.clock.at(now + self.hop_overhead_s, self._enqueue, job)
        return False

    def _enqueue(self, job: Job) -> None:
        link = job.node.links[HOP_INTO[job.hops[0]]]
        job.left, job.link = float(job.size), link
        link.add(job)

    def hop_landed(self, job: Job) -> None:
        """The current hop's bytes are in: the copy is ready, the next hop may start."""
        now, node = self.clock.now, job.node
        tier = job.hops.pop(0)
        job.left, job.link = 0.0, None
        self.record.moved(HOP_INTO[tier], job.size, now)
        if job.reading is not None:
            job.reading.pins -= 1
            if job.reading.tier is Tier.L0:
                node.l0_changed(job.reading.gpus)
            job.reading = None
        copy = job.copy
        if copy is not None:
            copy.ready_at, copy.job = now, None
            if tier is Tier.L0:
                node.l0_changed(copy.gpus)
            if job.demand:
                copy.use(now)
            if tier is Tier.L0 and self.record.counts(now):
                self.record.gpu_seconds_loading += (now - job.hop_began) * len(copy.gpus)
            followers, copy.followers = copy.followers, []
            for follower in followers:
                self._start(follower)
        job.copy = None
        self._start(job)
        if node.blocked:
            self._retry(node)

    def _finish(self, job: Job) -> None:
        job.done = True
        self._drop_job(job)
        now = self.clock.now
        for row, at in job.waiters:
            if row >= 0:
                self.record.req_wait[row] = now - at
                self.waiting -= 1

    def _drop_job(self, job: Job) -> None:
        if job.coming:
            job.node.expect(job, -job.coming)
        jobs = job.node.jobs.get(job.model, [])
        if job in jobs:
            jobs.remove(job)
            if not jobs:
                self._job_nodes[job.model].discard(job.node)
        if self._inbound.get(job.model) is job:
            del self._inbound[job.model]
            nodes = self._job_nodes.get(job.model)
            if not nodes:
                return
            for other in (
                j for n in sorted(nodes, key=self.router.position) for j in n.jobs.get(job.model, [])
            ):
                if other.target is Tier.L0:
                    self._inbound[job.model] = other
                    break

    def _retry(self, node: Node) -> None:
        """Loads waiting for room try again, first come first served: once one still finds no room in
        a tier, the later ones for that tier wait too (as behind it in the executor's queue)."""
        full: set[Tier] = set()
        for job in list(node.blocked):
            if job.blocked and job.hops and job.hops[0] not in full:
                self._start(job)
                if job.blocked:
                    full.add(job.hops[0])
                    if full.issuperset(node.waiting_for):
                        break  # every later one waits behind one that found no room

    # ------------------------------------------------------------------ bytes in tiers

    def _room(self, node: Node, tier: Tier, job: Job) -> tuple[int, ...] | None:
        """Make room for ``job``'s copy in ``tier`` by the LRU rule: the GPUs an L0 copy goes to (() for
        the other tiers), or None when even every evictable copy would not make enough."""
        displaced = 0
        if tier is Tier.L0:
            found = node.gpu_room(job.size, job.gpus)
            if found is None:
                return None
            gpus, victims, _ = found
        else:
            free = node.capacity[tier] - node.used[tier]
            chosen = [] if job.size <= free else lru_victims(node.copies[tier].values(), job.size, free)
            if chosen is None:
                return None
            # Declined (``prewarm.admits``), a load to memory streams past the tier and an order fails.
            # Host memory is passed by the staging ring only from a disk copy (``weighed``).
            weigh = weighed(tier, job.target, job.demand, streamable=tier is Tier.L2 or job.source is Tier.L2)
            held = node.copies[tier]
            if (
                chosen
                and weigh
                and not admits(
                    job.model, job.size, [(m, held[m].bytes) for m in chosen], node.uses, self.clock.now
                )
            ):
                return None
            gpus, victims = (), chosen
        now = self.clock.now
        for model in victims:
            copy = node.copies[tier][model]
            displaced += copy.bytes
            warm = tier is Tier.L0 and copy.last_used is not None and now - copy.last_used <= WARM_S
            if warm and self.record.counts(now):
                self.record.warm_displacements += 1  # the LRU gave up a copy in use: models take turns
            self.drop(node, tier, model, by="displaced")
        if job.order is not None and self.record.counts(now):
            self.record.over_commit_bytes += displaced
        return gpus

    def _hold(self, node: Node, tier: Tier, job: Job, gpus: tuple[int, ...]) -> Copy:
        now = self.clock.now
        speculative = not job.demand and tier is not Tier.L2  # the executor reports host and GPU copies
        bet = speculative and tier is job.target
        copy = Copy(
            key=job.model,
            tier=tier,
            bytes=job.size,
            loaded_at=now,
            last_used=now if job.demand else None,
            prefetched=speculative,
            bet=bet,
            staged=not job.demand and tier is Tier.L2 and job.target is Tier.L2,
            counted=job.counted,
            hold_until=job.order.hold_until if bet and job.order is not None else None,
            gpus=gpus,
            job=job,
        )
        if tier is Tier.L0:
            if job.coming:
                node.expect(job, -job.coming)
            node.gpu_hold(copy)
            self._l0.setdefault(job.model, {})[node.name] = copy
        node.copies[tier][job.model] = copy
        node.used[tier] += job.size
        self.router.held(job.model, node)
        return copy

    def drop(self, node: Node, tier: Tier, model: str, by: MispredictedBy = "order") -> None:
        """``model``'s copy leaves ``tier`` of ``node``: its residence is counted, its bet settled (taken
        away ``by`` an order or ``displaced`` by the LRU: ``MISPREDICTED_BY``)."""
        copy = node.copies[tier].pop(model)
        node.used[tier] -= copy.bytes
        self.router.released(model, node)
        now = self.clock.now
        if tier is Tier.L0:
            node.gpu_release(copy)
            on = self._l0.get(model)
            if on is not None:
                on.pop(node.name, None)
                if not on:
                    del self._l0[model]
        if copy.ready_at <= now:
            self.record.resident(tier, copy.bytes, copy.ready_at, now)
        if copy.counted and self.record.counts(now):
            self._settle_guess(copy, by)

    def _settle_guess(self, copy: Copy, by: MispredictedBy) -> None:
        """A copy a prefetch made in the window is leaving, or the window ends: count the guess if it
        went unused (a prefetch into host or GPU memory, mispredicted ``by`` what took it; one onto disk,
        unread)."""
        if copy.bet and copy.prefetched:
            self.record.mispredicted(by)
        if copy.staged:
            self.record.disk_stagings_unread += 1

    def _write_down(self, node: Node, model: str, to: Tier, order: Order) -> bool:
        """Copy ``model`` from its closest copy into the farther tier ``to``: a demotion's first half."""
        source = node.closest(model)
        if source is None or source.ready_at > self.clock.now:
            return False
        probe = Job(node, model, source.bytes, to, [to], order.demand, order, source.tier)
        if self._room(node, to, probe) is None:
            return False
        now = self.clock.now
        # Still unused if the copy it came from was; a disk copy never is. The bet stays on the copy
        # it was made for, and is settled when that one leaves.
        unused = not order.demand and to is not Tier.L2 and source.prefetched
        copy = Copy(model, to, source.bytes, now, now, source.last_used, unused)
        node.copies[to][model] = copy
        node.used[to] += copy.bytes
        self.router.held(model, node)
        return True

    # ------------------------------------------------------------------ orders

    def apply(self, order: Order, now: float) -> OrderStatus:
        """Apply ``order`` as an executor would (see the module docstring)."""
        node = self.nodes.get(order.node)
        refused = admit(
            order,
            now,
            node=node.name if node is not None else "",
            spec=self.catalog.get(order.model),
            seen="applied before" if order.id in self._applied else None,
        )
        self._applied.add(order.id)
        if refused is not None or node is None:
            return refused.status if refused is not None else OrderStatus.FAILED
        status = self._carry_out(node, order)
        if status is OrderStatus.FAILED and self.record.counts(now):
            self.record.failed_orders += 1
        if node.blocked:
            self._retry(node)
        return status

    def _carry_out(self, node: Node, order: Order) -> OrderStatus:
        model = order.model
        held = tuple(t for t in CACHE_TIERS if model in node.copies[t])
        change = cached_effect(order.action, order.tier, held)
        now = self.clock.now
        if any(node.copies[t][model].ready_at > now for t in change.drops):
            return OrderStatus.FAILED  # a copy still loading is not dropped: its load finishes first
        if change.fills and change.source.level > order.tier.level:
            if any(j.target.level <= order.tier.level for j in node.jobs.get(model, [])):
                return OrderStatus.DONE  # already on its way there
            if order.tier is Tier.L0 and node.shards(self.catalog[model].size_bytes) is None:
                return OrderStatus.FAILED
            job = self._job(node, model, order.tier, demand=order.demand, order=order)
            speculative = order.action is OrderAction.PREFETCH and not order.demand
            job.counted = speculative and self.record.counts(now)
            if job.counted:
                if order.tier is Tier.L2:
                    self.record.disk_stagings += 1
                else:
                    self.record.prefetches += 1
            self._start(job)
        elif change.fills and not self._write_down(node, model, order.tier, order):
            return OrderStatus.FAILED
        for tier in change.drops:
            self.drop(node, tier, model)
        return OrderStatus.DONE

    # ------------------------------------------------------------------ reports and the end

    def reports(self, now: float) -> Mapping[str, ExecutorState]:
        return LazyReports(self.nodes, lambda name: self.nodes[name].report(now, self.catalog))

    def finish(self) -> None:
        """Count what is still resident at the window's end, and prefetches (and disk stagings) left
        unused long enough."""
        end = self.record.end
        for node in self.nodes.values():
            for tier in CACHE_TIERS:
                for copy in node.copies[tier].values():
                    if copy.ready_at <= end:
                        self.record.resident(tier, copy.bytes, copy.ready_at, end)
                    if copy.counted and copy.ready_at <= end - MISPREDICTION_WINDOW_S:
                        self._settle_guess(copy, "end")
