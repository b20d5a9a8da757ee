"""Per model version statistics in Triton's shape (statistics extension), and latency/batch histograms.

Thread contract: updated only on the event loop thread (instance threads send their timings
along with their results), read on the loop by the statistics endpoint and the metrics
collector. The hot path pays a few integer additions per request and per batch.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any

# Request latency buckets in seconds, and batch size buckets in rows (upper bounds, Prometheus style).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns * count

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last is +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.total += value * count


@dataclass(slots=True)
class BatchStatistics:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ExecutionTiming:
    """What an instance thread measured for one batch (ns), sent back to the loop with the results."""

    queue_ns: list[int]
    input_ns: int
    infer_ns: int
    output_ns: int


@dataclass(slots=True)
class ModelStatistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchStatistics] = field(default_factory=dict)
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    batch_size: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))

    def record_request(self, ok: bool, duration_ns: int) -> None:
        (self.success if ok else self.fail).add(duration_ns)
        self.latency.observe(duration_ns / 1e9)
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_execution(self, rows: int, requests: int, timing: ExecutionTiming) -> None:
        """One batch of `requests` requests and `rows` rows ran; each request is charged the batch's times."""
        for queue_ns in timing.queue_ns:
            self.queue.add(queue_ns)
        self.compute_input.add(timing.input_ns, requests)
        self.compute_infer.add(timing.infer_ns, requests)
        self.compute_output.add(timing.output_ns, requests)
        self.inference_count += rows
        self.execution_count += 1
        self.batch_size.observe(rows)
        batch = self.batches.get(rows)
        if batch is None:
            batch = self.batches[rows] = BatchStatistics()
        batch.compute_input.add(timing.input_ns)
        batch.compute_infer.add(timing.infer_ns)
        batch.compute_output.add(timing.output_ns)

    def as_json(self, name: str, version: int) -> dict[str, Any]:
        """Triton's `model_stat` object."""
        empty = Duration().as_json()
        return {
            "name": name,
            "version": str(version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": self.compute_input.as_json(),
                "compute_infer": self.compute_infer.as_json(),
                "compute_output": self.compute_output.as_json(),
                "cache_hit": empty,
                "cache_miss": empty,
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": batch.compute_input.as_json(),
                    "compute_infer": batch.compute_infer.as_json(),
                    "compute_output": batch.compute_output.as_json(),
                }
                for size, batch in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
