"""The executor-state follower's failures, without a broker: the consumer is the one stand-in."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from wait_helpers import wait_for

from prewarm import BrokerError, ExecutorState, KafkaSettings
from scheduler._kafka import StateFollower


class _Consumer:
    """Just the calls the follower makes; ``poll`` returns ``batches`` once, then raises ``fail``."""

    def __init__(self, fail: Exception | None = None, batches: dict[Any, list[Any]] | None = None) -> None:
        self.fail, self.batches, self.closed = fail, batches, False

    def assignment(self) -> set[Any]:
        return set()

    def end_offsets(self, partitions: list[Any]) -> dict[Any, int]:
        return {}

    def poll(self, timeout_ms: int) -> dict[Any, list[Any]]:
        if self.batches is not None:
            batches, self.batches = self.batches, None
            return batches
        if self.fail is not None:
            raise self.fail
        return {}

    def close(self) -> None:
        self.closed = True


def _follow(monkeypatch: pytest.MonkeyPatch, consumer: _Consumer, on_state: Any = None) -> StateFollower:
    monkeypatch.setattr(StateFollower, "_consumer", lambda self: consumer)
    follower = StateFollower(KafkaSettings(), on_state or (lambda state: None)).start()
    wait_for(lambda: follower.error is not None, 5, "the follower to stop on its error")
    follower.stop()
    return follower


def test_a_poll_that_fails_with_a_socket_error_ends_the_follower_with_a_transient_broker_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = _Consumer(fail=ConnectionResetError("connection reset by peer"))
    follower = _follow(monkeypatch, consumer)
    assert isinstance(follower.error, BrokerError)
    assert follower.error.transient
    assert "connection reset" in str(follower.error)
    assert consumer.closed


def test_a_report_handler_that_fails_ends_the_follower_with_its_own_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = ExecutorState(node="n1", at=0.0, tiers=[]).model_dump_json().encode()
    consumer = _Consumer(batches={"tp": [SimpleNamespace(value=report)]})

    def on_state(state: ExecutorState) -> None:
        raise RuntimeError(f"cannot take the report of {state.node}")

    follower = _follow(monkeypatch, consumer, on_state)
    # Not the broker's fault, so not a BrokerError; but readiness sees it all the same.
    assert isinstance(follower.error, RuntimeError)
    assert consumer.closed
