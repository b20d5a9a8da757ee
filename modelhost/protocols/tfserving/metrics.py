"""TF Serving's Prometheus metrics (tsfs §B4), with its names and labels, served by `modelhost tfserving` at its
--monitoring_config_file's path on the REST port:

- `:tensorflow:serving:request_count{model_name, status}`: TF Serving API requests (REST and gRPC) by TF status;
- `:tensorflow:serving:request_latency{model_name, API, entrypoint}`: a histogram of successful requests'
  latency in µs, TF Serving's buckets (10 x 1.8^k, k < 33); `API` is the gRPC method (`Predict`) or the REST
  verb (`predict`), `entrypoint` `GRPC` or `REST`;
- `:tensorflow:serving:request_example_counts{model}` (histogram, buckets 1, 2, 4, ... 16384) and
  `:tensorflow:serving:request_example_count_total{model}`: tf.Examples per classify and regress request.

Counted per request by the TF Serving front-ends (a few dict operations). A request naming a model the server
does not have (an unknown name, a malformed one) is counted under `model_name=""`, so that clients cannot grow
the label sets without bound. Counters
keep TF Serving's exact names, exposed untyped as modelhost's Triton metrics are (metrics.py says why).
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric

from modelhost.errors import ErrorKind, ModelhostError

PREFIX = ":tensorflow:serving:"
LATENCY_BUCKETS = tuple(10 * 1.8**k for k in range(33))
EXAMPLE_BUCKETS = tuple(float(2**k) for k in range(15))
# The TF status a request's error is counted under (TF Serving's codes, which its gRPC status codes are).
TF_STATUS = {
    ErrorKind.INVALID_INPUT: "INVALID_ARGUMENT",
    ErrorKind.TOO_LARGE: "RESOURCE_EXHAUSTED",
    ErrorKind.NO_MEMORY: "RESOURCE_EXHAUSTED",
    ErrorKind.NOT_FOUND: "NOT_FOUND",
    ErrorKind.UNAVAILABLE: "UNAVAILABLE",
    ErrorKind.OVERLOADED: "UNAVAILABLE",
    ErrorKind.TIMEOUT: "DEADLINE_EXCEEDED",
    ErrorKind.UNSUPPORTED: "UNIMPLEMENTED",
    ErrorKind.PRECONDITION: "FAILED_PRECONDITION",
    ErrorKind.ALREADY_EXISTS: "ALREADY_EXISTS",
    ErrorKind.INTERNAL: "INTERNAL",
}


class _Histogram:
    __slots__ = ("counts", "total", "count")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)  # the last: above every bucket
        self.total = 0.0
        self.count = 0

    def observe(self, bounds: tuple[float, ...], value: float) -> None:
        self.counts[bisect.bisect_left(bounds, value)] += 1
        self.total += value
        self.count += 1

    def family(self, metric: HistogramMetricFamily, bounds: tuple[float, ...], labels: list[str]) -> None:
        cumulative, buckets = 0, []
        for bound, count in zip((*[repr(b) for b in bounds], "+Inf"), self.counts):
            cumulative += count
            buckets.append((bound, cumulative))
        metric.add_metric(labels, buckets, self.total)


class TfServingMetrics:
    """`knows(name)`: whether the server has a model of that name; requests naming any other count under ""."""

    def __init__(self, knows: Callable[[str], bool]) -> None:
        self._knows = knows
        self._requests: dict[tuple[str, str], int] = {}
        self._latency: dict[tuple[str, str, str], _Histogram] = {}
        self._examples: dict[str, _Histogram] = {}

    @contextlib.contextmanager
    def request(self, model: str, api: str, entrypoint: str, examples: int = 0) -> Iterator[None]:
        """Count the request the block answers: its TF status, and its latency when it succeeds."""
        started = time.perf_counter()
        status = "OK"
        try:
            yield
        except ModelhostError as exc:
            status = TF_STATUS.get(exc.kind, "UNKNOWN")
            raise
        except BaseException:
            status = "UNKNOWN"
            raise
        finally:
            name = model if self._knows(model) else ""
            key = (name, status)
            self._requests[key] = self._requests.get(key, 0) + 1
            if status == "OK":
                histogram = self._latency.get((name, api, entrypoint))
                if histogram is None:
                    histogram = self._latency[(name, api, entrypoint)] = _Histogram(len(LATENCY_BUCKETS))
                histogram.observe(LATENCY_BUCKETS, (time.perf_counter() - started) * 1e6)
                if examples:
                    counts = self._examples.get(name)
                    if counts is None:
                        counts = self._examples[name] = _Histogram(len(EXAMPLE_BUCKETS))
                    counts.observe(EXAMPLE_BUCKETS, examples)

    def collect(self) -> Iterator[Metric]:
        count = Metric(f"{PREFIX}request_count", "The total number of requests.", "unknown")
        for (model, status), value in sorted(self._requests.items()):
            count.add_sample(f"{PREFIX}request_count", {"model_name": model, "status": status}, value)
        yield count
        latency = HistogramMetricFamily(f"{PREFIX}request_latency",
                                        "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
                                        labels=["model_name", "API", "entrypoint"])
        for labels, histogram in sorted(self._latency.items()):
            histogram.family(latency, LATENCY_BUCKETS, list(labels))
        yield latency
        examples = HistogramMetricFamily(f"{PREFIX}request_example_counts",
                                         "The number of tensorflow.Examples per request.", labels=["model"])
        total = Metric(f"{PREFIX}request_example_count_total",
                       "The total number of tensorflow.Examples.", "unknown")
        for model, histogram in sorted(self._examples.items()):
            histogram.family(examples, EXAMPLE_BUCKETS, [model])
            total.add_sample(f"{PREFIX}request_example_count_total", {"model": model}, histogram.total)
        yield examples
        yield total

    def render(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry)
