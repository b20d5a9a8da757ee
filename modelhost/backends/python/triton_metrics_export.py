"""The Triton Python models' custom metrics (triton_metrics.py REGISTRY) as Prometheus families, for /metrics.

Counters are exposed untyped under the model's own name, as the server's own counters are (metrics.py: the
Prometheus client would add `_total`); a histogram's `le` labels read as Triton's ("1", "2.5", "+Inf").
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from modelhost.backends.python.triton_metrics import COUNTER, GAUGE, REGISTRY, Registry

_TYPES = {COUNTER: "unknown", GAUGE: "gauge"}


class CustomMetricsCollector:
    """prometheus_client collector over the process's custom metric families (read at each scrape)."""

    def __init__(self, registry: Registry = REGISTRY) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family, series in self._registry.snapshot():
            kind = _TYPES.get(family.kind, "histogram")
            metric = Metric(family.name, family.description, kind)
            for labels, s in series:
                names = dict(labels)
                if kind != "histogram":
                    metric.add_sample(family.name, names, s.value)
                    continue
                cumulative = 0
                for bound, count in zip((*s.buckets, float("inf")), s.counts, strict=True):
                    cumulative += count
                    metric.add_sample(f"{family.name}_bucket", {**names, "le": _bound(bound)}, cumulative)
                metric.add_sample(f"{family.name}_count", names, s.count)
                metric.add_sample(f"{family.name}_sum", names, s.total)
            yield metric


def _bound(bound: float) -> str:
    if bound == float("inf"):
        return "+Inf"
    text = repr(bound)
    return text.removesuffix(".0")
