"""The per-model metric families, written straight into the Prometheus text format (0.0.4).

Every loaded version has 41 samples (Triton's nine counters, its pending-request gauge, two histograms of 14 and 11
buckets): prometheus_client builds a Sample for each and formats it label by label, 8 µs a sample, so 300 models
took 0.1 s of the event loop at every scrape. Here a model's label set is formatted once and each line is one
f-string: the same bytes (tests/test_model_metrics_text.py compares them with prometheus_client's), 300 models in
5.6 ms against 102. Values go through prometheus_client's own float formatting.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from prometheus_client import utils

from modelhost.core.statistics import Histogram, ModelStatistics

# How prometheus_client writes a value; most values recur (zeros, bucket counts): its Python function is 4x a lookup.
_go = cast(Callable[[float], str], functools.lru_cache(maxsize=1 << 14)(utils.floatToGoString))


class _Scheduler(Protocol):
    def queued(self) -> int: ...


class MeasuredModel(Protocol):
    """What a family reads of a loaded version (ServedModel has it)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def statistics(self) -> ModelStatistics: ...
    @property
    def scheduler(self) -> _Scheduler: ...


# name, help, value read from a version's statistics
COUNTERS: tuple[tuple[str, str, Callable[[ModelStatistics], float]], ...] = (
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
PENDING = ("nv_inference_pending_request_count",
           "Instantaneous number of pending requests awaiting execution per model")
# name, help, histogram read from a version's statistics
HISTOGRAMS: tuple[tuple[str, str, Callable[[ModelStatistics], Histogram]], ...] = (
    ("modelhost_request_latency_seconds", "Inference request latency in seconds, in the server", lambda s: s.latency),
    ("modelhost_batch_size", "Rows per model execution (dynamic batch size)", lambda s: s.batch_size),
)


def model_families(models: Sequence[MeasuredModel]) -> str:
    """The counters, the pending-request gauge and the two histograms of `models`, as exposition text."""
    labels = [_label_pairs(model) for model in models]
    out: list[str] = []
    for name, documentation, read in COUNTERS:
        out.append(_header(name, documentation, "untyped"))
        out.extend(f"{name}{{{pairs}}} {_go(read(model.statistics))}\n"
                   for model, pairs in zip(models, labels, strict=True))
    name, documentation = PENDING
    out.append(_header(name, documentation, "gauge"))
    out.extend(f"{name}{{{pairs}}} {_go(model.scheduler.queued())}\n"
               for model, pairs in zip(models, labels, strict=True))
    for name, documentation, histogram_of in HISTOGRAMS:
        out.append(_header(name, documentation, "histogram"))
        for model, pairs in zip(models, labels, strict=True):
            histogram = histogram_of(model.statistics)
            cumulative = 0
            for bound, count in zip(bucket_bounds(histogram.bounds), histogram.counts, strict=True):
                cumulative += count
                out.append(f'{name}_bucket{{le="{bound}",{pairs}}} {_go(cumulative)}\n')
            out.append(f"{name}_count{{{pairs}}} {_go(cumulative)}\n")
            out.append(f"{name}_sum{{{pairs}}} {_go(histogram.total)}\n")
    return "".join(out)


@functools.cache  # a few bucket layouts, each written for every model at every scrape
def bucket_bounds(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """A histogram's `le` values, +Inf last, as prometheus_client writes them."""
    return (*(repr(float(bound)) for bound in bounds), "+Inf")


def _label_pairs(model: MeasuredModel) -> str:
    return f'model="{_escape(model.name)}",version="{_escape(str(model.version))}"'


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _header(name: str, documentation: str, kind: str) -> str:
    return f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n"
