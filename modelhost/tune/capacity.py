"""What one configuration holds: the most requests/s a closed loop reaches with p99 within the budget and no
errors, found by doubling the concurrency from where the last good configuration peaked."""

from __future__ import annotations

from dataclasses import dataclass

from modelhost.perf.report import StepResult
from modelhost.perf.sweep import Loader

MAX_CONCURRENCY = 256
SATURATED = 1.05  # a doubling that gains less than this much throughput: the configuration is saturated


@dataclass(frozen=True, slots=True)
class Capacity:
    throughput: float  # requests/s within the budget; 0 when none
    p99_ms: float  # at that throughput (or at the first step, when none was within the budget)
    concurrency: int
    steps: tuple[StepResult, ...]


def capacity(loader: Loader, budget_ms: float, start: int, label: str,
             max_concurrency: int = MAX_CONCURRENCY) -> Capacity:
    """Sweep concurrency from `start` (halving first while its p99 is over the budget, doubling after, up to
    `max_concurrency`) and keep the best step within the budget."""
    steps: list[StepResult] = []
    concurrency = min(max(start, 1), max_concurrency)
    best: StepResult | None = None
    while True:
        step = loader.measure(concurrency, f"{label}: concurrency {concurrency}")
        steps.append(step)
        within = step.errors == 0 and step.requests > 0 and step.latency_ms["p99"] <= budget_ms
        if within and (best is None or step.throughput > best.throughput):
            gained = best is None or step.throughput >= best.throughput * SATURATED
            best = step
            if not gained or concurrency * 2 > max_concurrency:
                break
            concurrency *= 2
        elif best is None and concurrency > 1:
            concurrency //= 2  # over the budget from the start: less load
            if any(int(s.load) == concurrency for s in steps):
                break
        else:
            break
    if best is None:
        first = steps[0]
        return Capacity(0.0, first.latency_ms["p99"], int(first.load), tuple(steps))
    return Capacity(best.throughput, best.latency_ms["p99"], int(best.load), tuple(steps))
