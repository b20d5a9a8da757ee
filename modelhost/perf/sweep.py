"""A sweep: one step per load level, each a warm-up and a measured window, with the server's statistics read
around the window. With `processes="auto"` a step whose generator process was busy most of the window is
run again from twice as many processes: the generator must not be what limits the numbers. `Loader` runs
steps one at a time for callers that choose the next load from the last (the tuner)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

import numpy as np

from modelhost.client import Client, ClientError
from modelhost.client.retry import NO_RETRIES
from modelhost.perf import server_stats
from modelhost.perf.load import Samples, StepPlan
from modelhost.perf.report import StepResult, percentiles
from modelhost.perf.workers import LocalLoad, ProcessLoad

BUSY = 0.8  # a generator process busy this share of the window may be the bottleneck
START_MARGIN_S = 0.2  # processes are told to start this far ahead, so that all start together


class LoadSource(Protocol):
    def start(self, plan: StepPlan) -> Any: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Sweep:
    model: str
    url: str
    protocol: str
    mode: str  # "concurrency" or "rate"
    loads: Sequence[float]
    warmup_s: float = 1.0
    duration_s: float = 5.0
    timeout_s: float | None = None
    split: int | None = 1
    processes: int | str = 1  # or "auto"
    max_processes: int = 8
    binary: bool = True


class Loader:
    """A sweep's load generator and statistics client, kept between steps: `measure` one load level at a time.
    With `processes="auto"`, a step whose generator process was busy most of its window runs again from twice
    as many processes."""

    def __init__(self, sweep: Sweep, requests: Sequence[dict[str, np.ndarray]], out: TextIO | None = sys.stderr,
                 ) -> None:
        self.sweep = sweep
        self.processes = 1 if sweep.processes == "auto" else int(sweep.processes)
        self.busy_by_step: list[float] = []
        self.split = sweep.split
        self._requests = requests
        self._out = out
        # No retries: a refused request is an error of the step, as perf_analyzer counts it, not a slow answer.
        self._options = {"binary": sweep.binary, "retry": NO_RETRIES}
        self._source = _source(self.processes, sweep.url, requests, self._options)
        self._stats = Client(sweep.url)

    def measure(self, load: float, label: str) -> StepResult:
        """One step at `load`, its requests cut into `split` parts (the sweep's, unless changed)."""
        while True:
            step, busy = _step(self.sweep, self._source, self._stats, load, label, self._out, self.split)
            if self.sweep.processes != "auto" or busy < BUSY or self.processes >= self.sweep.max_processes:
                break
            self._source.close()
            self.processes = min(self.processes * 2, self.sweep.max_processes)
            _say(self._out, f"the generator was busy {busy:.0%} of the window: again from {self.processes} processes")
            self._source = _source(self.processes, self.sweep.url, self._requests, self._options)
        self.busy_by_step.append(busy)
        _say(self._out, _summary(step))
        return step

    def close(self) -> None:
        self._source.close()
        self._stats.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_sweep(sweep: Sweep, requests: Sequence[dict[str, np.ndarray]], out: TextIO | None = sys.stderr,
              ) -> tuple[list[StepResult], dict[str, Any]]:
    """Every step's result, and what the sweep learned about itself (processes used, generator busy share)."""
    with Loader(sweep, requests, out) as loader:
        total = len(sweep.loads)
        results = [loader.measure(load, f"step {index + 1}/{total} {sweep.mode} {load:g}")
                   for index, load in enumerate(sweep.loads)]
        return results, {"processes": loader.processes, "generator_busy": loader.busy_by_step}


def _source(processes: int, url: str, requests: Sequence[dict[str, np.ndarray]],
            options: dict[str, Any]) -> LoadSource:
    if processes <= 1:
        return LocalLoad(url, requests, options)
    return ProcessLoad(processes, url, requests, options)


def _step(sweep: Sweep, source: LoadSource, stats_client: Client, load: float, label: str, out: TextIO | None,
          split: int | None) -> tuple[StepResult, float]:
    start_at = time.time() + START_MARGIN_S
    plan = StepPlan(sweep.model, sweep.mode, load, start_at, sweep.warmup_s, sweep.duration_s,
                    seed=int(load * 1000) % 100_003, timeout_s=sweep.timeout_s, split=split)
    pending = source.start(plan)
    window_start = start_at + sweep.warmup_s
    window_end = window_start + sweep.duration_s
    _progress(out, sweep, label, start_at, window_start)
    before = _statistics(stats_client, sweep.model)
    _progress(out, sweep, label, start_at, window_end)
    after = _statistics(stats_client, sweep.model)
    parts: list[Samples] = pending.result(timeout=sweep.duration_s + sweep.warmup_s + 600)
    latencies = [latency for samples in parts for latency in samples.latencies_s]
    errors = sum(samples.errors for samples in parts)
    messages = tuple(dict.fromkeys(message for samples in parts for message in samples.error_samples))[:5]
    busy = max(samples.cpu_s for samples in parts) / sweep.duration_s
    result = StepResult(
        mode=sweep.mode, load=float(load), protocol=sweep.protocol, duration_s=sweep.duration_s,
        requests=len(latencies), errors=errors, throughput=len(latencies) / sweep.duration_s,
        latency_ms=percentiles(latencies), server_us=server_stats.per_request(before, after), error_samples=messages,
    )
    return result, busy


def _statistics(client: Client, model: str) -> dict[str, tuple[int, int]]:
    try:
        return server_stats.totals(client.statistics(model))
    except ClientError:
        return {}  # a server without the statistics extension: no breakdown


def _progress(out: TextIO | None, sweep: Sweep, label: str, start_at: float, until: float) -> None:
    """Wait until the wall-clock instant `until`, drawing a progress bar of the step's window."""
    total = sweep.warmup_s + sweep.duration_s
    while True:
        left = until - time.time()
        if out is not None and out.isatty():
            done = min(max(time.time() - start_at, 0.0) / total, 1.0)
            bar = "#" * int(done * 30)
            out.write(f"\r{label} [{bar:<30}] {done * total:5.1f}/{total:g} s")
            out.flush()
        if left <= 0:
            return
        time.sleep(min(left, 0.25))


def _say(out: TextIO | None, line: str) -> None:
    if out is not None:
        out.write(("\r\x1b[K" if out.isatty() else "") + line + "\n")
        out.flush()


def _summary(step: StepResult) -> str:
    latency = step.latency_ms
    text = (f"{step.mode} {step.load:g}: {step.throughput:.1f} infer/s, p50 {latency['p50']:.2f} ms, "
            f"p90 {latency['p90']:.2f}, p95 {latency['p95']:.2f}, p99 {latency['p99']:.2f} ms")
    if step.errors:
        text += f", {step.errors} errors ({step.error_samples[0] if step.error_samples else ''})"
    if "queue" in step.server_us:
        server = step.server_us
        text += (f"; server: queue {server['queue']:.0f} µs, compute input {server['compute_input']:.0f}, "
                 f"infer {server['compute_infer']:.0f}, output {server['compute_output']:.0f} µs")
    return text


