"""Summing workers' expositions line by line gives prometheus_client's parse-sum-render, byte for byte."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from modelhost.core.cache_entry import CacheStatistics
from modelhost.core.in_flight import InFlight
from modelhost.core.statistics import ExecutionTiming
from modelhost.metrics import MetricsExporter
from modelhost.metrics_sum import sum_expositions
from tests.measured_models import MeasuredVersion, QueueDepth


def _reference(texts: list[str]) -> bytes:
    """Parse every text with prometheus_client, sum samples by name and labels, render."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                values[family.name][key] = values[family.name].get(key, 0.0) + sample.value

    class Summed:
        def collect(self) -> Iterator[Metric]:
            for name, family in families.items():
                for (sample_name, labels), value in values[name].items():
                    family.add_sample(sample_name, dict(labels), value)
                yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Summed())
    return generate_latest(registry)


@dataclass
class _Cache:
    statistics: CacheStatistics = field(default_factory=CacheStatistics)
    used_bytes: int = 0
    budget_bytes: int = 1 << 30

    def entries(self) -> list[object]:
        return []


def _worker_text(rng: random.Random, names: list[str]) -> str:
    """A worker's exposition: some of `names` loaded, with assorted statistics, and a multi-model cache."""
    models = []
    for name in names:
        if rng.random() < 0.3:
            continue  # not loaded on this worker
        model = MeasuredVersion(name, rng.randrange(1, 4), scheduler=QueueDepth(rng.randrange(5)))
        for _ in range(rng.randrange(20)):
            model.statistics.record_request(rng.random() < 0.9, rng.randrange(1, 10**9))
            model.statistics.record_execution(rng.randrange(1, 600), 1, ExecutionTiming(
                [rng.randrange(10**7)], rng.randrange(10**6), rng.randrange(10**8), rng.randrange(10**6)))
        models.append(model)
    cache = _Cache(used_bytes=rng.randrange(10**9))
    cache.statistics.hits, cache.statistics.misses = rng.randrange(1000), rng.randrange(100)
    cache.statistics.load.observe(rng.random())
    in_flight = InFlight()
    return MetricsExporter(lambda: models, in_flight, cache).render().decode()  # type: ignore[arg-type]


def test_line_sums_match_prometheus_clients_for_assorted_workers() -> None:
    names = ["rank", 'quote"d', "back\\slash", "new\nline", "ünï", "tiny"]
    for seed in range(6):
        rng = random.Random(seed)
        texts = [_worker_text(rng, names) for _ in range(rng.randrange(1, 4))]
        assert sum_expositions(texts) == _reference(texts)


def test_handwritten_texts_sum_as_the_parser_does() -> None:
    one = ('# HELP nv_inference_count Rows\n# TYPE nv_inference_count untyped\n'
           'nv_inference_count{model="a",version="1"} 3.0\nnv_inference_count{model="b",version="1"} 1.0\n'
           '# HELP lat Latency\n# TYPE lat histogram\nlat_bucket{le="0.1",model="a"} 1.0\n'
           'lat_bucket{le="+Inf",model="a"} 2.0\nlat_count{model="a"} 2.0\nlat_sum{model="a"} 0.25\n'
           '# HELP hits_total Hits\n# TYPE hits_total counter\nhits_total 2.0\n')
    two = one.replace("3.0", "4.0").replace("0.25", "0.5").replace('model="b"', 'model="c"')
    three = '# HELP only_here A family one worker has\n# TYPE only_here gauge\nonly_here 1e+06\n'
    for texts in ([one, two], [one, two, three], [three, one], [one]):
        assert sum_expositions(texts) == _reference(texts)
