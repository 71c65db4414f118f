"""Reading prewarm's Prometheus metrics in tests without depending on what other tests did.

The registry is one per process (``prewarm.REGISTRY``) and the code takes no registry of its
own, so a counter's absolute value sums every test that ran before in this process (or xdist worker).
A test therefore asserts on how much a sample moved while its own code ran: ``metric_delta`` reads the
value first, and again when its ``delta`` is asked for or when its ``with`` block ends. A gauge whose
labels are the test's own (a topic named after the test) is already private to it: read it with
``sample``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from prewarm import REGISTRY

__all__ = ["MetricDelta", "metric_delta", "sample"]


def sample(name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The current value of one sample; None when nothing has set it yet (so ``== 0`` proves it was)."""
    return REGISTRY.get_sample_value(name, dict(labels) if labels is not None else None)


class MetricDelta:
    """How much the sum of some samples of one metric moved since it was made (or its block entered).

    Used bare, ``delta`` is read live. Used as a ``with`` block, it counts from the block's start and,
    after the block, keeps the value the block ended with.
    """

    def __init__(self, name: str, label_sets: tuple[Mapping[str, str] | None, ...]) -> None:
        self.name = name
        self._label_sets = label_sets or (None,)
        self._start = self._total()
        self._end: float | None = None

    def _total(self) -> float:
        # A sample nothing has touched yet counts as 0: a counter starts there.
        return sum(sample(self.name, labels) or 0.0 for labels in self._label_sets)

    def __enter__(self) -> MetricDelta:
        self._start, self._end = self._total(), None
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._end = self._total()

    @property
    def delta(self) -> float:
        return (self._end if self._end is not None else self._total()) - self._start


def metric_delta(name: str, *label_sets: Mapping[str, str]) -> MetricDelta:
    """``with metric_delta("prewarm_x_total", {"tier": "L1"}) as moved: ...; assert moved.delta == 1``.

    Several label sets add up (the evictions of three tiers, say); none means the unlabelled sample.
    """
    return MetricDelta(name, label_sets)
