"""The executor daemon never commits past an order it has not applied yet."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kafka import TopicPartition

from executor.daemon import ExecutorDaemon
from prewarm import KafkaSettings


class Recorder:
    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []

    def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append({tp: meta.offset for tp, meta in offsets.items()})


def daemon() -> ExecutorDaemon:
    executor: Any = SimpleNamespace(settings=SimpleNamespace(node_name="gpu-a"))
    return ExecutorDaemon(executor, KafkaSettings.model_construct())


def test_commit_stops_at_the_oldest_order_not_yet_applied() -> None:
    d, consumer, tp = daemon(), Recorder(), TopicPartition("orders", 0)
    d._mark_read(tp, 0, pending=False)  # another node's order
    d._mark_read(tp, 1, pending=True)  # ours, queued behind a long prefetch
    d._mark_read(tp, 2, pending=False)  # another node's order, read later
    d._commit(consumer)
    assert consumer.commits == [{tp: 1}]
    d._mark_done(tp, 1)
    d._commit(consumer)
    assert consumer.commits[-1] == {tp: 3}
    d._commit(consumer)  # nothing new: no redundant commit
    assert len(consumer.commits) == 2
