"""Where a request's load goes, chosen without looking at every node.

The rule is ``World._route``'s (see there); this module makes it cheap on a cluster of a hundred nodes,
where a cold request used to rank every node. What the rank reads of a node that holds no copy of the
model (the LRU room its GPUs would make, its load time from object storage, its GPU bytes in use or on
their way) changes only when a GPU copy of that node changes or a load to its GPUs starts or takes its
room, so each size keeps a heap of every able node's rank, and a node that changed is re-ranked when
that size is next asked for. The nodes that hold a copy of the model are few and are ranked as they
are; the least of both is the node the full scan would have chosen, ties going to the node listed first.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from prewarm import HOP_INTO, Tier
from sim._node import INF, Copy, Node, cached_path

__all__ = ["Rank", "Router"]

_L2 = Tier.L2.level  # a property: read once, not three times per route
_CAPPED = {t: min(t.level, _L2) for t in Tier}  # a tier's level, the disk and object storage as one

Rank = tuple[float, float, int, int]
"""(when the most recently used copy the LRU gives up was last used, or inf: no room; load seconds;
GPU bytes in use; the node's position in the cluster): the least is chosen. The loads on their way to the
node's GPUs that hold no GPU memory yet count as holding it, in the room and in the bytes in use."""


class Router:
    """The nodes of one world, indexed for routing."""

    def __init__(self, nodes: Mapping[str, Node], hop_overhead_s: float) -> None:
        self.nodes = nodes
        self.hop_overhead_s = hop_overhead_s
        self.holders: dict[str, set[str]] = {}  # model -> the nodes holding any copy of it
        self._by_order = list(nodes.values())
        self._order = {name: k for k, name in enumerate(nodes)}
        self._able: dict[int, list[Node]] = {}
        self._load_s: dict[tuple[str, Tier, int], float] = {}
        # Per size: every able node's rank as if it held no copy, with the node's version when ranked
        # (older entries are stale and skipped), and the nodes changed since the heap was brought up to date.
        self._heap: dict[int, list[tuple[float, float, int, int, int]]] = {}
        self._changed: dict[int, set[Node]] = {}
        # ``node_changed`` is called on every GPU copy change, many times between two routes: a node
        # already in every size's changed set since the last time one was emptied needs nothing more.
        self._drains = 0  # how many times a changed set was emptied (``Node.marked``: when last added)

    def able(self, size: int) -> list[Node]:
        """The nodes whose GPUs can hold a model of ``size`` bytes, in cluster order."""
        nodes = self._able.get(size)
        if nodes is None:
            nodes = self._able[size] = [n for n in self.nodes.values() if n.shards(size) is not None]
        return nodes

    def held(self, model: str, node: Node) -> None:
        self.holders.setdefault(model, set()).add(node.name)

    def released(self, model: str, node: Node) -> None:
        """``node`` may have dropped its last copy of ``model``."""
        if node.closest(model) is None:
            self.holders[model].discard(node.name)

    def node_changed(self, node: Node) -> None:
        """``node``'s GPU copies (or their use) changed: its rank is to be worked out again."""
        if node.marked == self._drains:
            return  # no set was emptied since it was added to all of them: it is in each still
        for changed in self._changed.values():
            changed.add(node)
        node.marked = self._drains

    def seconds(self, node: Node, frm: Tier, size: int) -> float:
        """How long a load of ``size`` bytes from ``frm`` to GPU memory takes on an idle ``node``."""
        key = (node.name, frm, size)
        seconds = self._load_s.get(key)
        if seconds is None:
            seconds = self._load_s[key] = sum(
                size / node.links[HOP_INTO[t]].rate + self.hop_overhead_s for t in cached_path(frm, Tier.L0)
            )
        return seconds

    def rank(self, node: Node, frm: Tier, size: int, arriving_s: float = 0.0) -> Rank:
        room = node.gpu_room(size + node.coming)
        return (
            room[2] if room is not None else INF,
            self.seconds(node, frm, size) + arriving_s,
            node.used[Tier.L0] + node.coming,
            self._order[node.name],
        )

    def _arriving_s(self, node: Node, copy: Copy) -> float:
        """Seconds ``node``'s copy still takes to arrive: 0 when ready; in flight, what its hop has left
        to move at the link's rate. A disk copy whose download has not moved is no nearer than object
        storage: ranked as if there, a prefetch's paused download drew requests away from ready copies."""
        job = copy.job
        if copy.ready_at != INF or job is None:
            return 0.0
        link = job.link if job.link is not None else node.links[HOP_INTO[copy.tier]]
        left = link.left(job) if job.link is not None else float(job.size)
        return left / link.rate

    def choose(self, model: str, size: int) -> Node:
        """The node a load of ``model`` on request goes to (``World._route``'s rule)."""
        able = self.able(size)
        if len(able) == 1:
            return able[0]
        found: dict[str, Copy] = {}  # holder -> its closest copy, on the nodes able to load it
        level: dict[str, int] = {}
        for name in self.holders.get(model, ()):
            node = self.nodes[name]
            copy = node.closest(model)
            if copy is not None and node.shards(size) is not None:
                found[name] = copy
                level[name] = _CAPPED[copy.tier]
        top = min(level.values(), default=_L2)
        staged: Node | None = None
        if top < _L2:
            # Staged in host (or GPU) memory somewhere: the load goes there, unless room there pushes a
            # copy out to disk (``_drops_to_disk``) and another node has room without displacing any.
            nearest = [n for n, lv in level.items() if lv == top]
            if len(nearest) == 1:
                staged = self.nodes[nearest[0]]
            else:
                staged = self._by_order[
                    min(self._rank_holder(self.nodes[n], found[n], size) for n in nearest)[3]
                ]
            if not self._drops_to_disk(staged, size):
                return staged
        ranks = [
            self._rank_holder(self.nodes[n], found[n], size)
            for n, lv in level.items()
            if lv != top or staged is None
        ]
        if len(found) < len(able):
            # A node ranked as holding no copy loads from object storage: slower than from its own disk
            # copy, all else equal. When every able node holds a copy, that rank cannot be least.
            ranks.append(self._least(size, able))
        best = min(ranks, default=None)  # None: every able node holds the model staged
        if staged is not None and (best is None or best[0] != -INF):
            return staged  # no other node has room without displacing a copy: the staged one
        assert best is not None  # nothing staged: some node was ranked
        return self._by_order[best[3]]

    @staticmethod
    def _drops_to_disk(node: Node, size: int) -> bool:
        """Whether room for ``size`` bytes on ``node``'s GPUs displaces a copy too large for its host
        memory, whose next load would then come from disk."""
        room = node.gpu_room(size + node.coming)
        if room is None:
            return False
        host, l0 = node.capacity[Tier.L1], node.copies[Tier.L0]
        return any(l0[v].bytes > host for v in room[1])

    def _rank_holder(self, node: Node, copy: Copy, size: int) -> Rank:
        """``rank`` of a node holding ``copy``, loading from its tier (and counting what it has still to
        arrive)."""
        return self.rank(node, copy.tier, size, self._arriving_s(node, copy))

    def position(self, node: Node) -> int:
        """The node's place in the cluster's list."""
        return self._order[node.name]

    def _least(self, size: int, able: list[Node]) -> Rank:
        """The least rank of the able nodes, each ranked as holding no copy of the model. A node that
        does hold a disk copy is ranked too high here, never too low, and the caller ranks it as it is."""
        heap = self._heap.get(size)
        if heap is None:
            heap = self._heap[size] = []
            changed = self._changed[size] = set(able)
        else:
            changed = self._changed[size]
        for node in changed:
            if node.shards(size) is not None:
                heapq.heappush(heap, (*self.rank(node, Tier.L3, size), node.version))
        changed.clear()
        self._drains += 1
        nodes = self._by_order
        while heap[0][4] != nodes[heap[0][3]].version:
            heapq.heappop(heap)
        if len(heap) > 8 * len(able) + 64:  # stale entries pile up: keep the current ones only
            heap[:] = [e for e in heap if e[4] == nodes[e[3]].version]
            heapq.heapify(heap)
        least = heap[0]
        return (least[0], least[1], least[2], least[3])
