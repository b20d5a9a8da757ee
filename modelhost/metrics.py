"""Prometheus metrics, declared once here, with Triton's names and labels so its dashboards work as they are.

Nothing is counted for metrics on the hot path: at scrape time a collector reads each loaded
version's ModelStatistics (kept for the statistics extension anyway) and its queue depth.
Counters keep Triton's exact names (no `_total` suffix), as Triton exposes them; prometheus_client
renames every family of type counter to `<name>_total`, so they are exposed untyped (PromQL's
rate() and increase() work the same on them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric

from modelhost.core.load import ServerLoad
from modelhost.core.loader import ServedModel
from modelhost.core.statistics import Histogram, ModelStatistics

_LABELS = ("model", "version")

# name, help, value read from a version's statistics
_COUNTERS: tuple[tuple[str, str, Callable[[ModelStatistics], float]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", lambda s: s.fail.count),
    ("nv_inference_count", "Number of inferences performed (each row of a batch counts)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (one per batch)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     lambda s: (s.success.ns + s.fail.ns) / 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s.queue.ns / 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: s.compute_input.ns / 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: s.compute_infer.ns / 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     lambda s: s.compute_output.ns / 1000),
)


class ModelCollector:
    """prometheus_client collector over the loaded models; `models` is called at every scrape."""

    def __init__(self, models: Callable[[], Iterable[ServedModel]], load: ServerLoad) -> None:
        self._models = models
        self._load = load

    def collect(self) -> Iterator[Metric]:
        models = list(self._models())
        for name, documentation, read in _COUNTERS:
            family = Metric(name, documentation, "unknown")
            for model in models:
                family.add_sample(name, _labels(model), read(model.statistics))
            yield family
        pending = Metric("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting "
                         "execution per model", "gauge")
        for model in models:
            pending.add_sample("nv_inference_pending_request_count", _labels(model), model.scheduler.queued())
        yield pending
        yield _histogram("modelhost_request_latency_seconds", "Inference request latency in seconds, in the server",
                         models, lambda s: s.latency)
        yield _histogram("modelhost_batch_size", "Rows per model execution (dynamic batch size)", models,
                         lambda s: s.batch_size)
        in_progress = Metric("modelhost_requests_in_progress", "Requests received on the inference ports and not "
                             "yet answered", "gauge")
        in_progress.add_sample("modelhost_requests_in_progress", {}, self._load.in_progress)
        yield in_progress


def _labels(model: ServedModel) -> dict[str, str]:
    return {"model": model.name, "version": str(model.version)}


def _histogram(name: str, documentation: str, models: list[ServedModel],
               read: Callable[[ModelStatistics], Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=_LABELS)
    for model in models:
        histogram = read(model.statistics)
        cumulative, buckets = 0, []
        for bound, count in zip((*histogram.bounds, float("inf")), histogram.counts):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        family.add_metric([model.name, str(model.version)], buckets, histogram.total)
    return family


class MetricsExporter:
    """Renders the text exposition format for GET /metrics."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, models: Callable[[], Iterable[ServedModel]], load: ServerLoad) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(ModelCollector(models, load))  # type: ignore[arg-type]

    def render(self) -> bytes:
        return generate_latest(self._registry)
