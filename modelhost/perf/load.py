"""One process's share of one load step: closed-loop (a fixed number of requests in flight) or open-loop
(Poisson arrivals at a rate), timed against a shared start instant so that several processes load together.

Only requests that complete inside the measured window count; an open loop's latency runs from the instant
its request was due, not sent (a generator that falls behind does not hide the wait: no coordinated omission).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from modelhost.client import AsyncClient, ClientError

MAX_ERROR_SAMPLES = 5


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What to run: `mode` "concurrency" or "rate", this process's `load`, and the window on the wall clock
    (time.time(): processes share it): warm-up from `start_at`, measured from `start_at + warmup_s`."""

    model: str
    mode: str
    load: float
    start_at: float
    warmup_s: float
    duration_s: float
    seed: int = 0
    max_outstanding: int = 10_000  # open loop: arrivals beyond this many in flight are counted as errors
    timeout_s: float | None = None  # the client's deadline per request
    split: int | None = 1


@dataclass(slots=True)
class Samples:
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # this process's CPU time over the window: near duration_s means the generator is the bottleneck

    def error(self, message: str) -> None:
        self.errors += 1
        if len(self.error_samples) < MAX_ERROR_SAMPLES and message not in self.error_samples:
            self.error_samples.append(message)


async def run_step(client: AsyncClient, plan: StepPlan, requests: Sequence[dict[str, np.ndarray]]) -> Samples:
    """Run one step; returns when the window has closed (requests still in flight then are left to finish)."""
    offset = time.monotonic() - time.time()
    window = (plan.start_at + plan.warmup_s + offset, plan.start_at + plan.warmup_s + plan.duration_s + offset)
    await asyncio.sleep(max(plan.start_at + offset - time.monotonic(), 0.0))
    samples = Samples()
    cpu = _CpuClock(window)
    if plan.mode == "concurrency":
        workers = [asyncio.ensure_future(_closed_worker(client, plan, requests, index, window, samples))
                   for index in range(int(plan.load))]
        await asyncio.sleep(max(window[1] - time.monotonic(), 0.0))
        cpu.stop()
        await asyncio.gather(*workers)
    else:
        await _open_loop(client, plan, requests, window, samples, cpu)
    samples.cpu_s = cpu.used
    return samples


async def _closed_worker(client: AsyncClient, plan: StepPlan, requests: Sequence[dict[str, np.ndarray]],
                         index: int, window: tuple[float, float], samples: Samples) -> None:
    turn = index
    while time.monotonic() < window[1]:
        started = time.monotonic()
        await _one(client, plan, requests[turn % len(requests)], started, window, samples)
        turn += 1


async def _open_loop(client: AsyncClient, plan: StepPlan, requests: Sequence[dict[str, np.ndarray]],
                     window: tuple[float, float], samples: Samples, cpu: _CpuClock) -> None:
    rng = random.Random(plan.seed)
    due = time.monotonic()
    in_flight: set[asyncio.Future[None]] = set()
    turn = 0
    while due < window[1]:
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(in_flight) >= plan.max_outstanding:
            if window[0] <= due:
                samples.error(f"the generator had {plan.max_outstanding} requests in flight: arrival dropped")
        else:
            task = asyncio.ensure_future(_one(client, plan, requests[turn % len(requests)], due, window, samples))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            turn += 1
        due += rng.expovariate(plan.load)
    await asyncio.sleep(max(window[1] - time.monotonic(), 0.0))
    cpu.stop()


async def _one(client: AsyncClient, plan: StepPlan, request: dict[str, np.ndarray], started: float,
               window: tuple[float, float], samples: Samples) -> None:
    try:
        await client.infer(plan.model, request, timeout=plan.timeout_s, split=plan.split)
    except ClientError as exc:
        if window[0] <= time.monotonic() <= window[1]:
            samples.error(str(exc))
        return
    ended = time.monotonic()
    if window[0] <= ended <= window[1]:
        samples.latencies_s.append(ended - started)


class _CpuClock:
    """This process's CPU time from the window's start (or now, if later) to `stop()`."""

    def __init__(self, window: tuple[float, float]) -> None:
        self._window = window
        self._start_cpu: float | None = None
        self._start_wall = 0.0
        self.used = 0.0
        asyncio.get_running_loop().call_at(self._loop_time(window[0]), self._begin)

    def _loop_time(self, instant: float) -> float:
        loop = asyncio.get_running_loop()
        return loop.time() + instant - time.monotonic()

    def _begin(self) -> None:
        self._start_cpu = time.process_time()

    def stop(self) -> None:
        if self._start_cpu is not None:
            self.used = time.process_time() - self._start_cpu
