"""The executor daemon never commits past an order it has not applied yet."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka import TopicPartition

from executor._daemon import commit_due
from executor._offsets import OffsetTracker


class Recorder:
    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []

    def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append({tp: meta.offset for tp, meta in offsets.items()})


def test_commit_stops_at_the_oldest_order_not_yet_applied() -> None:
    offsets, consumer, tp = OffsetTracker[TopicPartition](), Recorder(), TopicPartition("orders", 0)
    offsets.read(tp, 0, pending=False)  # another node's order
    offsets.read(tp, 1, pending=True)  # ours, queued behind a long prefetch
    offsets.read(tp, 2, pending=False)  # another node's order, read later
    commit_due(consumer, offsets)
    assert consumer.commits == [{tp: 1}]
    offsets.done(tp, 1)
    commit_due(consumer, offsets)
    assert consumer.commits[-1] == {tp: 3}
    commit_due(consumer, offsets)  # nothing new: no redundant commit
    assert len(consumer.commits) == 2


def test_partitions_are_committed_independently() -> None:
    offsets = OffsetTracker[str]()
    offsets.read("a", 0, pending=True)
    offsets.read("b", 0, pending=False)
    offsets.read("b", 1, pending=False)
    assert offsets.due() == {"a": 0, "b": 2}
    offsets.committed(offsets.due())
    offsets.done("a", 0)
    assert offsets.due() == {"a": 1}


def test_a_commit_the_consumer_refuses_is_offered_again() -> None:
    offsets, tp = OffsetTracker[TopicPartition](), TopicPartition("orders", 0)
    offsets.read(tp, 4, pending=False)

    class Refusing:
        def commit(self, offsets: dict[TopicPartition, Any]) -> None:
            raise RuntimeError("rebalancing")

    with pytest.raises(RuntimeError):
        commit_due(Refusing(), offsets)
    assert offsets.due() == {tp: 5}


# One step on one of two partitions: read the next record (ours or not, after a gap of skipped offsets,
# as compaction or transaction markers leave), finish one of our pending orders, or commit.
_STEP = st.one_of(
    st.tuples(st.just("read"), st.sampled_from("pq"), st.booleans(), st.integers(1, 3)),
    st.tuples(st.just("done"), st.sampled_from("pq"), st.integers(0, 20), st.just(0)),
    st.tuples(st.just("commit"), st.sampled_from("pq"), st.just(False), st.just(0)),
)


@given(st.lists(_STEP, max_size=80))
def test_committed_offsets_never_pass_a_pending_order_and_only_move_forward(
    steps: list[tuple[str, str, Any, int]],
) -> None:
    offsets = OffsetTracker[str]()
    next_offset = {"p": 0, "q": 0}
    pending: dict[str, set[int]] = {"p": set(), "q": set()}
    last: dict[str, int] = {}
    for op, partition, arg, gap in steps:
        if op == "read":
            offset = next_offset[partition] + gap - 1
            next_offset[partition] = offset + 1
            offsets.read(partition, offset, pending=arg)
            if arg:
                pending[partition].add(offset)
        elif op == "done" and pending[partition]:
            offset = sorted(pending[partition])[arg % len(pending[partition])]
            pending[partition].discard(offset)
            offsets.done(partition, offset)
        elif op == "commit":
            due = offsets.due()
            for p, offset in due.items():
                assert offset == min(pending[p], default=next_offset[p])
                assert offset > last.get(p, -1)
            last.update(due)
            offsets.committed(due)
    for p, open_offsets in pending.items():
        for offset in open_offsets:
            offsets.done(p, offset)
    assert all(offsets.safe()[p] == next_offset[p] for p in offsets.safe())
