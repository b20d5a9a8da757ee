"""A request run at once from the event loop on a free instance, not queued for the instance threads: the run,
and what it teaches (the model's statistics, the loop gate, the latency target, the request's trace).

The scheduler decides which requests run so (core/scheduler.py). A model that waits on another process
(`Model.infer_async`) is awaited from the loop; any other is called there, synchronously.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from modelhost.backends.base import Model
from modelhost.core.batch_run import Outputs, call, check_batch_dim
from modelhost.core.latency_target import LatencyTarget
from modelhost.core.loop_gate import LoopGate
from modelhost.core.spare_cores import SpareCores
from modelhost.core.statistics import ExecutionTiming, ModelStatistics
from modelhost.core.trace import QUEUE_START, Trace

if TYPE_CHECKING:
    from modelhost.core.sequence_slots import SlotPadding


class LoopRunner:
    def __init__(self, instances: list[tuple[Model, threading.Lock]], gate: LoopGate, statistics: ModelStatistics,
                 target: LatencyTarget | None, spare: SpareCores | None, threads_per_instance: int) -> None:
        """`instances`: the model's, each with the lock that keeps it to one call at a time between its thread and
        the loop. `spare`: where a run counts the cores it computes on (`threads_per_instance`), as a thread does."""
        self._instances = instances
        self._gate = gate
        self._statistics = statistics
        self._target = target
        self._spare = spare
        self._threads_per_instance = threads_per_instance

    def run(self, inputs: dict[str, np.ndarray], outputs: Sequence[str], rows: int,
            size: int, entry: str, spent_s: float = 0.0, trace: Trace | None = None) -> Outputs | None:
        """Run one request right here with a free instance; None when every instance is busy on its thread."""
        # A lone request's cores are busy, as an instance thread's are while it runs a batch (a cheap one's
        # run is over before anyone could use them).
        spare = self._spare if size > self._gate.max_size else None
        cores = self._threads_per_instance
        for instance, lock in self._instances:
            if lock.acquire(blocking=False):
                if spare is not None:
                    spare.computing(cores)
                try:
                    started = time.monotonic_ns()
                    result = call(instance, entry, inputs, outputs)
                    elapsed = time.monotonic_ns() - started
                finally:
                    lock.release()
                    if spare is not None:
                        spare.computing(-cores)
                self._statistics.record_execution(rows, 1, ExecutionTiming([0], 0, elapsed, 0))
                self._gate.learn(size, elapsed, on_loop=True)
                self._learn_alone(rows, elapsed, spent_s)
                if trace is not None:
                    _traced_alone(trace, elapsed)
                return result
        return None

    def run_at_row(self, slots: SlotPadding, inputs: dict[str, np.ndarray], outputs: Sequence[str],
                   size: int, entry: str, spent_s: float, trace: Trace | None, row: int) -> Outputs | None:
        """`run` for a direct sequence's request: run at its batch row, padding rows before it."""
        if row > 0:
            inputs = slots.alone(inputs, row)
        result = self.run(inputs, outputs, 1, size, entry, spent_s, trace)
        if result is None or row <= 0:
            return result
        check_batch_dim(result, row + 1)
        return {name: array[row:] for name, array in result.items()}

    async def run_async(self, inputs: dict[str, np.ndarray], outputs: Sequence[str], rows: int,
                        entry: str, spent_s: float = 0.0, trace: Trace | None = None) -> Outputs | None:
        """Run one request from the loop on a free instance; None when none is free or its model cannot now. The
        call finishes (and frees the instance) even when the caller goes away: the worker's answer must be read."""
        for instance, lock in self._instances:
            if lock.acquire(blocking=False):
                call = asyncio.get_running_loop().create_task(self._call_async(instance, lock, inputs, outputs,
                                                                               entry))
                result = await asyncio.shield(call)
                if result is not None:
                    self._statistics.record_execution(rows, 1, ExecutionTiming([0], 0, result[1], 0))
                    self._learn_alone(rows, result[1], spent_s)
                    if trace is not None:
                        _traced_alone(trace, result[1])
                    return result[0]
                return None
        return None

    async def _call_async(self, instance: Model, lock: threading.Lock, inputs: dict[str, np.ndarray],
                          outputs: Sequence[str], entry: str) -> tuple[Outputs, int] | None:
        spare, cores = self._spare, self._threads_per_instance
        if spare is not None:  # its cores are busy, as an instance thread's are while it runs a batch
            spare.computing(cores)
        try:
            started = time.monotonic_ns()
            result = await instance.infer_async(inputs, outputs, entry)
            return None if result is None else (result, time.monotonic_ns() - started)
        finally:
            lock.release()
            if spare is not None:
                spare.computing(-cores)

    def _learn_alone(self, rows: int, elapsed_ns: int, spent_s: float) -> None:
        """A request that ran at once, without queueing: its latency was what came before and its execution."""
        if self._target is not None:
            self._target.executed(rows, elapsed_ns / 1e9)
            self._target.completed(spent_s + elapsed_ns / 1e9)


def input_elements(inputs: dict[str, np.ndarray]) -> int:
    """A request's size as the loop gate measures it: its input tensors' elements, all dims."""
    return sum(array.size for array in inputs.values())


def _traced_alone(trace: Trace, elapsed_ns: int) -> None:
    """The stages of a request that ran at once, not queued: it computed for the `elapsed_ns` just past."""
    ended = time.monotonic_ns()
    started = ended - elapsed_ns
    trace.stamp(QUEUE_START, started)
    trace.computed(started, started, ended, ended)
