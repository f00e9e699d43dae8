"""A metric's labelled children, each looked up once, for metrics recorded on a hot path."""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import Counter, Histogram

Metric = TypeVar("Metric", Counter, Histogram)


class Children(Generic[Metric]):
    """``labels()`` takes a lock and builds its key at every call, which costs more than what the
    child then records. A child is made when first recorded to, as with ``labels()``, so a series
    appears in /metrics exactly when it would have."""

    def __init__(self, metric: Metric) -> None:
        self._metric: Metric = metric
        self._children: dict[tuple[str, ...], Metric] = {}

    def __call__(self, *labels: str) -> Metric:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._metric.labels(*labels)
        return child
