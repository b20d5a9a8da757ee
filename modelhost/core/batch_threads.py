"""A model's instance threads: each runs the batches its instance takes from the model's RequestQueue, and the
event loop answers them.

Each instance owns a thread that takes the next batch as soon as it finishes the last one, so an instance never
idles while the event loop hands it work (a thread pool fed from the loop held the instance across two handoffs
per request and capped the tiny model near 7,000 requests/s). Results go back to the loop with one call per
batch, where the execution is recorded, taught to the loop gate and the latency target, and its requests
answered. Once the queue is closed and drained each thread unloads its instance; the last to finish says so on
the loop, where `stop` awaits it (no thread waits in a join).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from modelhost.backends.base import Model
from modelhost.core import compute_threads, instance_threads
from modelhost.core.batch_run import Outputs
from modelhost.core.clock import Clock
from modelhost.core.latency_target import LatencyTarget
from modelhost.core.loop_gate import LoopGate
from modelhost.core.loop_runner import input_elements
from modelhost.core.request_queue import Pending, RequestQueue
from modelhost.core.spare_cores import SpareCores
from modelhost.core.statistics import ExecutionTiming, ModelStatistics

# How an instance runs a batch taken at a time on the queue's clock, padded to the next of some sizes (batch_run.py).
BatchRun = Callable[[Model, list[Pending], float, tuple[int, ...]], tuple[list[Any], ExecutionTiming]]
# Gives a request its answer or error (AnswerOrder.finish).
Finish = Callable[[Pending, Outputs | None, BaseException | None], None]


class BatchThreads:
    def __init__(
        self, label: str, instances: list[tuple[Model, threading.Lock]], queue: RequestQueue, run_batch: BatchRun,
        pad_sizes: tuple[int, ...], clock: Clock, spare: SpareCores | None, threads_per_instance: int,
        statistics: ModelStatistics, target: LatencyTarget | None, gate: LoopGate, finish: Finish,
    ) -> None:
        """Start a thread for each of `instances` (each with the lock that keeps it to one call at a time between
        its thread and the loop), named `label`#index. `spare`: where a thread counts the cores it computes on
        (`threads_per_instance`) while it runs a batch (core/spare_cores.py)."""
        self._queue = queue
        self._run_batch = run_batch
        self._pad_sizes = pad_sizes
        self._clock = clock
        self._spare = spare
        self._threads_per_instance = threads_per_instance
        self._statistics = statistics
        self._target = target
        self._gate = gate
        self._finish = finish
        # Threads still serving, and what `stop` awaits: the last of them resolves it on the loop.
        self._serving = len(instances)
        self._stopped: asyncio.Future[None] | None = None
        self._serving_lock = threading.Lock()
        for index, (instance, lock) in enumerate(instances):
            instance_threads.start(partial(self._serve, instance, lock, index), f"{label}#{index}")

    async def stop(self) -> None:
        """Close the queue; returns once every thread has run what was queued and unloaded its instance."""
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_future()
            self._queue.close()
            with self._serving_lock:
                if not self._serving:
                    self._stopped.set_result(None)
        await asyncio.shield(self._stopped)

    # instance threads

    def _serve(self, instance: Model, lock: threading.Lock, index: int) -> None:
        try:
            self._serve_until_closed(instance, lock, index)
        finally:
            with self._serving_lock:
                self._serving -= 1
                stopped = self._stopped if not self._serving else None
            if stopped is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits it
                    stopped.get_loop().call_soon_threadsafe(_set_done, stopped)

    def _serve_until_closed(self, instance: Model, lock: threading.Lock, index: int) -> None:
        compute_threads.enter()
        watch = compute_threads.execution_watch()
        spare, cores = self._spare, self._threads_per_instance
        while (batch := self._queue.take(index)) is not None:
            loop = batch[0].future.get_loop()
            try:
                with lock:
                    if spare is not None:
                        spare.computing(cores)
                    try:
                        results, timing = self._run_batch(instance, batch, self._clock.now(), self._pad_sizes)
                    finally:
                        if spare is not None:
                            spare.computing(-cores)
            except BaseException as exc:  # delivered to every request of the batch
                loop.call_soon_threadsafe(self._complete, batch, None, exc, None)
            else:
                loop.call_soon_threadsafe(self._complete, batch, results, None, timing)
                if watch is not None and watch(timing.infer_ns):
                    watch = None
                del results
            del batch  # its tensors go with its requests, not when this thread next takes a batch
        with lock:
            instance.unload()

    # event loop

    def _complete(
        self, batch: list[Pending], results: list[Outputs] | None, error: BaseException | None,
        timing: ExecutionTiming | None,
    ) -> None:
        if timing is not None:
            rows = sum(p.rows for p in batch)
            self._statistics.record_execution(rows, len(batch), timing)
            if self._target is not None:
                self._target.executed(rows, (timing.input_ns + timing.infer_ns + timing.output_ns) / 1e9)
                now = self._clock.now()
                for pending in batch:
                    self._target.completed(now - pending.enqueued + pending.spent)
            self._gate.learn(sum(input_elements(p.inputs) for p in batch), timing.infer_ns, on_loop=False)
            if len(batch) == 1 and batch[0].measures_handoff:
                round_trip_ns = int((self._clock.now() - batch[0].enqueued) * 1e9)
                self._gate.learn_handoff(max(0, round_trip_ns - timing.input_ns - timing.infer_ns - timing.output_ns))
        for index, pending in enumerate(batch):
            self._finish(pending, results[index] if results is not None else None, error)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
