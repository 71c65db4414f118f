"""One Prometheus registry for the process, and get-or-create helpers.

Metric names are ``prewarm_<package>_<what>_<unit>``; each package documents its metrics where it
creates them. The helpers return the existing collector when a module is imported twice (tests).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["REGISTRY", "counter", "gauge", "histogram", "render"]

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
