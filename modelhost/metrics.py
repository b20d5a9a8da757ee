"""Prometheus metrics, declared once here, with Triton's names and labels so its dashboards work as they are.

Nothing is counted for metrics on the hot path: at scrape time a collector reads each loaded
version's ModelStatistics (kept for the statistics extension anyway) and its queue depth.
Counters keep Triton's exact names (no `_total` suffix), as Triton exposes them; prometheus_client
renames every family of type counter to `<name>_total`, so they are exposed untyped (PromQL's
rate() and increase() work the same on them).

A scrape renders in a thread (`MetricsExporter.scrape`): 300 models' exposition (880 KB) takes 0.1 s, which the
event loop's requests would wait for. What the loop owns and changes in size (the model list, the cache's
entries) is read on the loop first; the rest (counters, histograms' fixed bucket lists) is read as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from modelhost.backends.python.triton_metrics_export import CustomMetricsCollector
from modelhost.core.in_flight import InFlight
from modelhost.core.latency_target import LatencyTarget
from modelhost.core.model_cache import ModelCache
from modelhost.core.served_model import ServedModel
from modelhost.core.statistics import Histogram
from modelhost.embeddings.store import EmbeddingStore, shared_store
from modelhost.model_metrics_text import bucket_bounds, model_families


class TargetCollector:
    """prometheus_client collector of the latency targets of `models` (the models loaded when the scrape started),
    and of the requests in progress. The models' own families are model_metrics_text.py's."""

    def __init__(self, models: list[ServedModel], in_flight: InFlight) -> None:
        self._models = models
        self._in_flight = in_flight

    def collect(self) -> Iterator[Metric]:
        yield from _target_metrics(self._models)
        in_progress = Metric("modelhost_requests_in_progress", "Requests received on the inference ports and not "
                             "yet answered", "gauge")
        in_progress.add_sample("modelhost_requests_in_progress", {}, self._in_flight.requests)
        yield in_progress


# name, type, help, value read from a model's latency target (core/latency_target.py)
_TARGET_METRICS: tuple[tuple[str, str, str, Callable[[LatencyTarget], float]], ...] = (
    ("modelhost_target_p99_seconds", "gauge", "The model's p99 latency target", lambda t: t.target_s),
    ("modelhost_target_observed_p99_seconds", "gauge", "p99 latency the target last measured (server's share)",
     lambda t: t.observed_p99_s),
    ("modelhost_target_batch_size", "gauge", "Largest batch the target lets the scheduler form now",
     lambda t: t.limits.max_batch_size),
    ("modelhost_target_queue_delay_seconds", "gauge", "Queue delay the target sets now",
     lambda t: t.limits.max_queue_delay_s),
    ("modelhost_target_adapting", "gauge", "1 while the target adjusts batch size and delay, 0 when frozen",
     lambda t: float(t.adapt)),
    ("modelhost_target_refused", "unknown", "Requests refused on arrival: they would have missed the target",
     lambda t: t.refused),
    ("modelhost_target_late", "unknown", "Queued requests refused once they could no longer make the target",
     lambda t: t.late),
)


def _target_metrics(models: list[ServedModel]) -> Iterator[Metric]:
    targeted = [(model, target) for model in models
                if (target := getattr(model.scheduler, "target", None)) is not None]
    if not targeted:
        return
    for name, kind, documentation, read in _TARGET_METRICS:
        family = Metric(name, documentation, kind)
        for model, target in targeted:
            family.add_sample(name, _labels(model), read(target))
        yield family


class CacheCollector:
    """The multi-model cache, with the meaning of SageMaker's MME metrics (ModelLoadingWaitTime,
    ModelDownloadingTime, ModelLoadingTime, ModelUnloadingTime, ModelCacheHit, LoadedModelCount)."""

    def __init__(self, cache: ModelCache, loaded: int) -> None:
        self._cache = cache
        self._loaded = loaded  # its entries when the scrape started

    def collect(self) -> Iterator[Metric]:
        cache, statistics = self._cache, self._cache.statistics
        for name, documentation, histogram in (
            ("modelhost_model_loading_wait_seconds", "Time a request waited for its model to load (cache misses)",
             statistics.loading_wait),
            ("modelhost_model_downloading_seconds", "Time to download and unpack a model archive",
             statistics.download),
            ("modelhost_model_loading_seconds", "Time to load a model once on local disk", statistics.load),
            ("modelhost_model_unloading_seconds", "Time to drain and unload a model", statistics.unload),
        ):
            yield _single_histogram(name, documentation, histogram)
        for name, documentation, count in (
            ("modelhost_model_cache_hits", "Requests whose model was already loaded", statistics.hits),
            ("modelhost_model_cache_misses", "Requests that had to load their model first", statistics.misses),
            ("modelhost_model_cache_evictions", "Models unloaded from the cache", statistics.evictions),
        ):
            yield CounterMetricFamily(name, documentation, value=count)
        lookups = statistics.hits + statistics.misses
        for name, documentation, value in (
            ("modelhost_model_cache_hit_ratio", "Cache hits over all lookups since start",
             statistics.hits / lookups if lookups else 0.0),
            ("modelhost_loaded_models", "Models loaded in the multi-model cache", self._loaded),
            ("modelhost_model_cache_bytes", "Memory the cached models took to load", cache.used_bytes),
            ("modelhost_model_cache_budget_bytes", "The most memory cached models may take", cache.budget_bytes),
        ):
            yield GaugeMetricFamily(name, documentation, value=value)


class EmbeddingCollector:
    """The embedding store's tables, labelled by table (the name of the model that opened it)."""

    def __init__(self, store: Callable[[], EmbeddingStore]) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        tables = self._store().tables()
        counters = {name: CounterMetricFamily(name, documentation, labels=["table"]) for name, documentation in (
            ("modelhost_embedding_ids", "Ids looked up (each id of each request)"),
            ("modelhost_embedding_missing_ids", "Distinct ids of a request the table does not hold (default vector)"),
            ("modelhost_embedding_cache_hits", "Distinct rows of a request found in the RAM cache"),
            ("modelhost_embedding_cache_misses", "Distinct rows of a request read from disk or the delta log"),
            ("modelhost_embedding_cache_evictions", "Rows the cache dropped to take others"),
            ("modelhost_embedding_disk_reads", "Reads of rows.bin (adjacent blocks are one read)"),
            ("modelhost_embedding_disk_bytes", "Bytes read from rows.bin"),
            ("modelhost_embedding_log_reads", "Rows read from the delta log (updated since the version)"),
            ("modelhost_embedding_updated_rows", "Rows added or replaced while serving"),
            ("modelhost_embedding_compactions", "Delta logs compacted into a new version of the table"),
            ("modelhost_embedding_compaction_seconds", "Time the compactions took, all together"),
        )}
        gauges = {name: GaugeMetricFamily(name, documentation, labels=["table"]) for name, documentation in (
            ("modelhost_embedding_cache_hit_ratio", "Cache hits over hits and misses since the table opened"),
            ("modelhost_embedding_cached_bytes", "Bytes of the table's rows in the RAM cache"),
            ("modelhost_embedding_rows", "Rows the table holds"),
        )}
        latency = HistogramMetricFamily("modelhost_embedding_disk_read_seconds",
                                        "Time one lookup's disk reads took together", labels=["table"])
        for table in tables:
            label = [table.name]
            pool, counts = table.pool, table.counts
            cache = pool.counts.get(table.table_id) if pool is not None else None
            hits, misses = (cache.hits, cache.misses) if cache is not None else (0, counts.ids)
            for name, value in (
                ("modelhost_embedding_ids", counts.ids), ("modelhost_embedding_missing_ids", counts.missing_ids),
                ("modelhost_embedding_cache_hits", hits), ("modelhost_embedding_cache_misses", misses),
                ("modelhost_embedding_cache_evictions", cache.evictions if cache is not None else 0),
                ("modelhost_embedding_disk_reads", table.disk.reads),
                ("modelhost_embedding_disk_bytes", table.disk.bytes_read),
                ("modelhost_embedding_log_reads", counts.log_reads),
                ("modelhost_embedding_updated_rows", counts.updated_rows),
                ("modelhost_embedding_compactions", counts.compactions),
                ("modelhost_embedding_compaction_seconds", counts.compaction_seconds),
            ):
                counters[name].add_metric(label, value)
            cached = pool.cached_rows(table.table_id) * pool.row_bytes if pool is not None else 0
            gauges["modelhost_embedding_cache_hit_ratio"].add_metric(label, hits / (hits + misses) if hits else 0.0)
            gauges["modelhost_embedding_cached_bytes"].add_metric(label, cached)
            gauges["modelhost_embedding_rows"].add_metric(label, table.rows)
            latency.add_metric(label, _cumulative(table.disk.latency), table.disk.latency.total)
        yield from counters.values()
        yield from gauges.values()
        yield latency


def _single_histogram(name: str, documentation: str, histogram: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], _cumulative(histogram), histogram.total)
    return family


def _cumulative(histogram: Histogram) -> list[tuple[str, float]]:
    cumulative, buckets = 0, list[tuple[str, float]]()
    for bound, count in zip(bucket_bounds(histogram.bounds), histogram.counts, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    return buckets


def _labels(model: ServedModel) -> dict[str, str]:
    return {"model": model.name, "version": str(model.version)}


class MetricsExporter:
    """Renders the text exposition format for GET /metrics."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self, models: Callable[[], Iterable[ServedModel]], in_flight: InFlight, cache: ModelCache | None = None
    ) -> None:
        self._models = models
        self._in_flight = in_flight
        self._cache = cache

    def render(self) -> bytes:
        """The exposition, rendered here (on the event loop, or with nothing changing the models meanwhile)."""
        return self._render(*self._snapshot())

    async def scrape(self) -> bytes:
        """The exposition, rendered in a thread from what the loop holds now."""
        return await asyncio.to_thread(self._render, *self._snapshot())

    def _snapshot(self) -> tuple[list[ServedModel], int]:
        return list(self._models()), len(self._cache.entries()) if self._cache is not None else 0

    def _render(self, models: list[ServedModel], cached: int) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(TargetCollector(models, self._in_flight))
        registry.register(EmbeddingCollector(shared_store))
        registry.register(CustomMetricsCollector())  # Triton Python models' pb_utils.MetricFamily
        if self._cache is not None:
            registry.register(CacheCollector(self._cache, cached))
        return model_families(models).encode() + generate_latest(registry)
