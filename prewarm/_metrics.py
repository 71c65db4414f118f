"""One Prometheus registry for the process, and get-or-create helpers.

Metric names are ``prewarm_<package>_<what>_<unit>``; each package documents its metrics where it
creates them (all of them are listed in ``docs/metrics.md``). The helpers return the existing collector
when a module is imported twice (tests).

Label sets stay bounded: at 10,000 models a label per model is 10,000 series per metric. A metric that
names models passes them through ``model_label``, which gives the first ``TOP_MODELS`` models this
process sees a label of their own and folds every other into ``"other"``; per-model detail for all
models is the scheduler API's and the status page's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

__all__ = [
    "OTHER_MODELS",
    "REGISTRY",
    "TOP_MODELS",
    "TopLabels",
    "counter",
    "gauge",
    "histogram",
    "model_label",
    "render",
]

REGISTRY = CollectorRegistry(auto_describe=True)
_created: dict[str, MetricWrapperBase] = {}


def _remember(name: str, kind: type[MetricWrapperBase]) -> MetricWrapperBase | None:
    existing = _created.get(name)
    if existing is not None and not isinstance(existing, kind):
        raise TypeError(f"metric {name} already exists as {type(existing).__name__}")
    return existing


def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
    existing = _remember(name, Counter)
    if existing is None:
        existing = _created[name] = Counter(name, doc, labelnames=tuple(labels), registry=REGISTRY)
    assert isinstance(existing, Counter)
    return existing


def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
    existing = _remember(name, Gauge)
    if existing is None:
        existing = _created[name] = Gauge(name, doc, labelnames=tuple(labels), registry=REGISTRY)
    assert isinstance(existing, Gauge)
    return existing


def histogram(
    name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS
) -> Histogram:
    existing = _remember(name, Histogram)
    if existing is None:
        existing = _created[name] = Histogram(
            name, doc, labelnames=tuple(labels), registry=REGISTRY, buckets=tuple(buckets)
        )
    assert isinstance(existing, Histogram)
    return existing


def render() -> bytes:
    """The text exposition format, for ``/metrics`` handlers."""
    return generate_latest(REGISTRY)


OTHER_MODELS = "other"
TOP_MODELS = 20


class TopLabels:
    """At most ``size`` label values of their own; the rest are ``OTHER_MODELS``.

    Values are admitted as they come while there is room and stay admitted for the life of the process:
    a series that came and went would break every ``rate()`` over it, and a counter cannot be taken
    back. The busiest models are seen first, so the first ones in are in practice the top ones.
    """

    def __init__(self, size: int = TOP_MODELS) -> None:
        self.size = size
        self._admitted: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._admitted:
            return value
        with self._lock:
            if value in self._admitted or len(self._admitted) < self.size:
                self._admitted.add(value)
                return value
        return OTHER_MODELS

    @property
    def admitted(self) -> frozenset[str]:
        return frozenset(self._admitted)


# One set per process, so that every metric of a process names the same models.
model_label = TopLabels()
