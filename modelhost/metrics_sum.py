"""The Prometheus text expositions of several worker processes summed into one (--workers N)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families


def sum_expositions(texts: Iterable[str]) -> bytes:
    """One exposition whose every sample is the sum of that sample (same name and labels) over `texts`: counters,
    gauges of work in progress and histogram buckets alike. Families and samples keep their first order."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = samples.get(key, 0.0) + sample.value
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Summed(families, values))
    return generate_latest(registry)


class _Summed:
    def __init__(self, families: dict[str, Metric],
                 values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]) -> None:
        self._families, self._values = families, values

    def collect(self) -> Iterator[Metric]:
        for name, family in self._families.items():
            for (sample_name, labels), value in self._values[name].items():
                family.add_sample(sample_name, dict(labels), value)
            yield family
