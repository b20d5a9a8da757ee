"""The per-model families written as text are byte for byte what prometheus_client writes for the same samples."""

from __future__ import annotations

import random
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric

from modelhost.core.statistics import ExecutionTiming, ModelStatistics
from modelhost.model_metrics_text import COUNTERS, HISTOGRAMS, PENDING, model_families
from tests.measured_models import MeasuredVersion, QueueDepth


class _Reference:
    """The same families through prometheus_client's Metric objects."""

    def __init__(self, models: list[MeasuredVersion]) -> None:
        self.models = models

    def collect(self) -> Iterator[Metric]:
        for name, documentation, read in COUNTERS:
            family = Metric(name, documentation, "unknown")
            for model in self.models:
                family.add_sample(name, self._labels(model), read(model.statistics))
            yield family
        name, documentation = PENDING
        pending = Metric(name, documentation, "gauge")
        for model in self.models:
            pending.add_sample(name, self._labels(model), model.scheduler.queued())
        yield pending
        for name, documentation, histogram_of in HISTOGRAMS:
            histograms = HistogramMetricFamily(name, documentation, labels=("model", "version"))
            for model in self.models:
                histogram = histogram_of(model.statistics)
                cumulative, buckets = 0, []
                for bound, count in zip((*histogram.bounds, float("inf")), histogram.counts, strict=True):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
                histograms.add_metric([model.name, str(model.version)], buckets, histogram.total)
            yield histograms

    @staticmethod
    def _labels(model: MeasuredVersion) -> dict[str, str]:
        return {"model": model.name, "version": str(model.version)}


def _models(count: int, seed: int) -> list[MeasuredVersion]:
    rng = random.Random(seed)
    names = ["rank", 'a"quoted', "back\\slash", "new\nline", "ünï", "x" * 200]
    models = []
    for i in range(count):
        statistics = ModelStatistics()
        for _ in range(rng.randrange(0, 40)):
            statistics.record_request(rng.random() < 0.9, rng.randrange(1, 10**10))
            rows = rng.randrange(1, 2000)
            statistics.record_execution(rows, 1, ExecutionTiming([rng.randrange(10**9)], rng.randrange(10**6),
                                                                 rng.randrange(10**9), rng.randrange(10**6)))
        models.append(MeasuredVersion(f"{names[i % len(names)]}-{i}", rng.randrange(1, 3000), statistics,
                             QueueDepth(rng.randrange(0, 10**7))))
    return models


def test_text_matches_prometheus_client_for_assorted_models() -> None:
    for seed in range(5):
        models = _models(60, seed)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Reference(models))
        assert model_families(models).encode() == generate_latest(registry)


def test_no_models_is_headers_only() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Reference([]))
    assert model_families([]).encode() == generate_latest(registry)
