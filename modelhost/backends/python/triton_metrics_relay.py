"""An isolated Triton model's custom metrics, relayed to the server: its worker's registry (triton_metrics.py) keeps
what changed since the last `drain`, which the worker sends before each reply (stub.py), and the server applies it
to its own registry (`WorkerMetrics.apply`, in worker_process.WorkerProcess): counters and histograms add up across
workers, a gauge replays the worker's sets and moves in order. The server holds the worker's families while the
worker lives.
"""

from __future__ import annotations

from typing import Any

from modelhost.backends.python.triton_helpers import TritonModelException
from modelhost.backends.python.triton_metrics import (
    HISTOGRAM,
    REGISTRY,
    Family,
    Labels,
    Registry,
    check_buckets,
    check_labels,
)

# What a worker sends: (name, description, kind, labels, buckets, was_set, value or delta, bucket deltas, sum delta)
Change = tuple[str, str, int, Labels, tuple[float, ...], bool, float, list[int], float]


def drain(registry: Registry = REGISTRY) -> list[Change]:
    """The series changed since the last drain, with what changed (an isolated worker's, for the server)."""
    changes: list[Change] = []
    with registry.lock:
        for family in registry.families.values():
            for labels, s in family.series.items():
                if not s.dirty:
                    continue
                changes.append((family.name, family.description, family.kind, labels, s.buckets, s.was_set,
                                s.pending, list(s.pending_counts), s.pending_total))
                s.pending, s.pending_total, s.was_set, s.dirty = 0.0, 0.0, False, False
                s.pending_counts = [0] * len(s.pending_counts)
    return changes


class WorkerMetrics:
    """The server's side of one isolated worker's metrics: its families held while the worker lives."""

    def __init__(self, registry: Registry = REGISTRY) -> None:
        self._registry = registry
        self._families: dict[str, Family] = {}

    def apply(self, changes: Any) -> None:
        """Apply a worker's drained changes; a change the limits refuse is dropped (the worker's own registry,
        under the same limits, refused it first, so this is a worker that lies)."""
        for name, description, kind, labels, buckets, was_set, value, counts, total in changes:
            try:
                family = self._families.get(name)
                if family is None or not family.alive:
                    family = self._families[name] = self._registry.family(name, description, kind)
                series = self._registry.series(family, check_labels(name, dict(labels)),
                                               check_buckets(name, buckets) if kind == HISTOGRAM else None)
            except TritonModelException:
                continue
            with self._registry.lock:
                if kind == HISTOGRAM and len(counts) == len(series.counts):
                    series.counts = [a + int(b) for a, b in zip(series.counts, counts)]
                    series.total += float(total)
                    series.count += sum(int(b) for b in counts)
                elif kind != HISTOGRAM:
                    series.value = float(value) if was_set else series.value + float(value)

    def close(self) -> None:
        for family in self._families.values():
            self._registry.release(family)
        self._families.clear()
