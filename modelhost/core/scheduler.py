"""Per-model scheduling: priority queues, dynamic batching, timeouts and ordering, one thread per instance.

One scheduler per loaded model version, shared by every protocol. The contract is
submit (awaitable) / inflight / stop; backends see batches and never batch.

The scheduler decides where each request runs; it queues, splits, admits and times out the ones it queues.
Each instance owns a thread that runs the batches it takes from the model's RequestQueue
(core/batch_threads.py); the loop answers their requests, in arrival order when asked (core/answer_order.py).

A cheap request runs on the event loop instead (core/loop_runner.py): handing it to a thread and back costs
two wake-ups, more latency and more of the loop's CPU than a tiny model's whole run. It runs there, synchronously in
submit, the way a naive server calls its model, when all of these hold: the model's measured
executions for its size fit the loop gate's budget (core/loop_gate.py: what a handoff takes, learned
from the model's own requests, or the model's inline_max_microseconds), nothing is queued for the
model, an instance is free, and no queue delay is configured. A model whose threads can do more than the loop
under load (it batches, so queued requests run as one execution, or it has several instances that run
at once) also needs the server quiet: at most LOOP_MAX_IN_PROGRESS requests in progress in the
process; under more load its requests queue and batch on the threads. A model with one instance that
does not batch runs on the loop at any load, since its thread would run the same executions one at a
time and only add the handoff: tiny over HTTP on the 2-core VM (budget fixed at 300 µs, 3 rounds,
medians), with the in-flight cap for it 2,431 and 2,397 req/s at concurrency 32 and 128, without it 3,260
and 3,216 (docs/benchmarks.md has the change's before/after).

A request alone in the server (core/in_flight.py) also runs on the loop when larger, up to the gate's lone
budget: nobody else is waiting for the loop, and the handoff's two wake-ups are then most of what the server
adds to it (docs/benchmarks.md, "Lone requests on the event loop").
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from modelhost.backends.base import Model, RowUpdates
from modelhost.core import compute_threads, loading_threads
from modelhost.core.answer_order import AnswerOrder
from modelhost.core.batch_run import Outputs, run_batch, run_each
from modelhost.core.batch_threads import BatchRun, BatchThreads
from modelhost.core.clock import MONOTONIC, Clock
from modelhost.core.in_flight import InFlight
from modelhost.core.latency_target import LatencyTarget
from modelhost.core.loop_gate import LoopGate
from modelhost.core.loop_runner import LoopRunner, input_elements
from modelhost.core.policy import SchedulingPolicy
from modelhost.core.request_queue import Pending, RequestQueue
from modelhost.core.spare_cores import SpareCores
from modelhost.core.statistics import ModelStatistics
from modelhost.core.trace import QUEUE_START, Trace
from modelhost.errors import ErrorKind, ModelhostError, invalid

if TYPE_CHECKING:
    from modelhost.core.sequence_slots import SlotPadding

LOOP_MAX_IN_PROGRESS = 8


class Scheduler:
    def __init__(
        self, label: str, instances: Sequence[Model], policy: SchedulingPolicy, statistics: ModelStatistics,
        in_flight: InFlight | None = None, clock: Clock = MONOTONIC, spare: SpareCores | None = None,
        threads_per_instance: int = 1, target: LatencyTarget | None = None, slots: SlotPadding | None = None,
    ) -> None:
        """`spare`: where an instance thread counts the cores it computes on (`threads_per_instance`) while it runs
        a batch, so that other executions know them busy (core/spare_cores.py). `target`: the model's latency
        target, which admits requests, refuses late ones and sets the batch size and queue delay. `slots`: a
        direct sequence model's batches are laid out by slot (core/sequence_slots.py)."""
        self._label = label
        self._policy = policy
        self._clock = clock
        self.target = target
        self._queue = RequestQueue(policy, clock, target.limits if target is not None else None)
        self._inflight = 0
        self._sequence = 0  # the next request's Pending.sequence, the order `_answers` keeps
        self._answers = AnswerOrder(policy.preserve_ordering)
        # Each instance's lock keeps it to one call at a time between its thread and the loop.
        self._instances = [(instance, threading.Lock()) for instance in instances]
        # A padded batch (TF Serving's allowed sizes) is formed on an instance thread, never run as it came.
        inline = not policy.max_queue_delay_s and not policy.pad_sizes and all(i.runs_inline for i in instances)
        self._gate = LoopGate(policy.inline_max_ns if inline else 0)
        # Whether queueing under load gains anything over running on the loop: batches, or instances in parallel.
        self._threads_gain_under_load = policy.batching or len(instances) > 1
        # Models that wait on another process run a lone request from the loop (Model.infer_async): no handoff.
        self._runs_async = (all(i.runs_async for i in instances) and not policy.max_queue_delay_s
                            and not policy.pad_sizes)
        self._in_flight = in_flight or InFlight()
        self._yields_to_loads = compute_threads.lowers()  # (_may_run_now)
        # Models that take a batch's requests one by one (Triton's Python API) are handed them so.
        self._takes_requests = all(i.takes_requests for i in instances) and bool(instances)
        # A direct sequence's lone request may run on the loop, padded to its row, where its instance is the
        # only one (the loop takes any free instance) and the model takes batches whole.
        self._slots = slots if slots is not None and len(instances) == 1 and not self._takes_requests else None
        self._loop_runner = LoopRunner(self._instances, self._gate, statistics, target, spare, threads_per_instance)
        batch_run: BatchRun = slots.run if slots is not None else run_each if self._takes_requests else run_batch
        self._batch_threads = BatchThreads(label, self._instances, self._queue, batch_run, policy.pad_sizes, clock,
                                           spare, threads_per_instance, statistics, target, self._gate,
                                           self._answers.finish)

    async def submit(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str], rows: int, priority: int = 0,
        timeout_us: int | None = None, entry: str = "", batchable: bool = True, spent_s: float = 0.0,
        trace: Trace | None = None, instance: int = -1, responses: Any = None, origin: Any = None, row: int = -1,
    ) -> Outputs:
        """Queue one request of `rows` batch rows; priority 0 is the default level, 1 the highest. `spent_s`: how
        long the server has had the request before this (receiving, decoding), which a latency target counts.
        `trace`: the request's, when it is traced (its queue and compute stages are stamped here).
        `instance` >= 0 pins it to that instance (a sequence's slot, core/sequences.py): it queues for that
        instance's thread alone, at batch row `row` when >= 0 (its direct slot). `responses`: where a decoupled
        model sends its responses to the request (core/partial_answers.py); `origin`: the client's request, whose
        id and parameters a model that takes requests one by one sees.

        `entry` names the model's signature to run (`Model.infer_signature`; "" is `Model.infer`); a request
        that is not `batchable` (its signature has no batch dim) runs alone.

        A request of more than the policy's split size is cut into chunks along the batch dim that
        queue (and batch, and run on free instances) independently, merged back in order.
        """
        level = self._level(priority)
        timeout = self._timeout(level, timeout_us)
        if self._runs_async and instance < 0 and self._may_run_async():
            result = await self._loop_runner.run_async(inputs, outputs, rows, entry, spent_s, trace)
            if result is not None:
                return result
        size = input_elements(inputs)
        if instance < 0:
            if self._may_run_now(size, rows):
                result = self._loop_runner.run(inputs, outputs, rows, size, entry, spent_s, trace)
                if result is not None:
                    return result
        elif self._slots is not None and self._may_run_now(size, 1):  # a direct sequence's, on its one instance
            result = self._loop_runner.run_at_row(self._slots, inputs, outputs, size, entry, spent_s, trace, row)
            if result is not None:
                return result
        if self.target is not None:
            self._admit(rows, spent_s)
        if trace is not None:
            trace.stamp(QUEUE_START)
        split = self._policy.split_size if batchable else 0
        if not split or rows <= split:
            return await self._wait(self._enqueue(inputs, outputs, rows, level, entry, batchable, spent_s, trace,
                                                  instance, responses, origin, row), timeout)
        # Every chunk is queued before the first await: a request that got this scheduler is in its queue
        # before a reload can stop it, so it drains on this version rather than failing.
        pendings: list[Pending] = []
        try:
            for start in range(0, rows, split):
                chunk = {name: array[start : start + split] for name, array in inputs.items()}
                pendings.append(self._enqueue(chunk, outputs, min(split, rows - start), level, entry, batchable,
                                              spent_s, trace))
        except BaseException:
            self._withdraw(pendings)
            raise
        waits = [asyncio.ensure_future(self._wait(pending, timeout)) for pending in pendings]
        try:
            parts = await asyncio.gather(*waits)
        except BaseException:
            for wait in waits:  # one chunk failed or the caller left: the others are not wanted
                wait.cancel()
            raise
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def check_room(self) -> None:
        """OVERLOADED if a request at the default priority would find its queue full now, or (with a latency
        target) if even a one-row request would be answered past the target (advisory: `submit` checks again).
        Lets a front-end refuse a request before reading and decoding it."""
        self._queue.check_room(self._level(0), self._label)
        if self.target is not None:
            self._admit(1)

    def _enqueue(self, inputs: dict[str, np.ndarray], outputs: Sequence[str], rows: int, level: int, entry: str,
                 batchable: bool, spent_s: float = 0.0, trace: Trace | None = None, instance: int = -1,
                 responses: Any = None, origin: Any = None, row: int = -1) -> Pending:
        loop = asyncio.get_running_loop()
        if not self._policy.batching:
            key: Any = None
        elif batchable:
            key = _batch_key(inputs, entry)
        else:
            key = object()  # equal to no other request's
        # Alone in the queue with an instance free: its round trip, less its execution, is a handoff's cost.
        alone = not self._queue.depth() and any(not lock.locked() for _, lock in self._instances)
        pending = Pending(inputs, tuple(outputs), rows, key, level, loop.create_future(), entry,
                          sequence=self._sequence, measures_handoff=alone, spent=spent_s, trace=trace,
                          instance=instance, row=row)
        if self._takes_requests:  # only such a model sees them: ordinary requests spare the two stores
            pending.responses, pending.origin = responses, origin
        self._queue.put(pending, self._label)
        self._sequence += 1
        self._inflight += 1
        return pending

    def _withdraw(self, pendings: list[Pending]) -> None:
        for pending in pendings:
            self._inflight -= 1
            if self._queue.withdraw(pending):
                self._answers.finish(pending, None, None)

    def _admit(self, rows: int, spent_s: float = 0.0) -> None:
        assert self.target is not None
        busy = sum(lock.locked() for _, lock in self._instances)
        miss = self.target.admission(rows, self._queue.rows, busy, spent_s)
        if miss is not None:
            target_ms = self.target.target_s * 1000
            raise ModelhostError(
                ErrorKind.OVERLOADED,
                f"model {self._label}: with {self._queue.rows} rows queued ahead, a request of {rows} rows would "
                f"be answered about {miss * 1000:.0f} ms past the model's p99 target of {target_ms:g} ms; "
                "retry later", retry_after=miss,
            )

    async def _wait(self, pending: Pending, timeout: float) -> Outputs:
        late = self.target.late_after(pending.spent) if self.target is not None else 0.0
        if late and not (timeout and timeout <= late):
            timer: Any = self._clock.call_later(late, self._refuse_late, pending)
        else:
            timer = self._clock.call_later(timeout, self._expire, pending) if timeout else None
        try:
            outputs: Outputs = await pending.future
            return outputs
        except asyncio.CancelledError:
            # The client is gone: a request still queued is dropped before it runs.
            if self._queue.withdraw(pending):
                self._answers.finish(pending, None, None)
            raise
        finally:
            self._inflight -= 1
            if timer is not None:
                timer.cancel()

    def inflight(self) -> int:
        return self._inflight

    def queued(self) -> int:
        return self._queue.depth()

    def row_updates(self) -> RowUpdates | None:
        """The model's updatable table (its instances share one), if it has one."""
        return self._instances[0][0].row_updates() if self._instances else None

    def instance_processes(self) -> list[int | None]:
        """Each instance's worker process (None: it runs in the server's process, or its worker restarts)."""
        return [instance.process_id() for instance, _ in self._instances]

    async def stop(self) -> None:
        """Stop accepting; the instances finish what is queued, then unload. Returns once every one has (the
        last instance thread to finish says so on the loop: no thread waits in a join)."""
        await self._batch_threads.stop()

    def _may_run_now(self, size: int, rows: int) -> bool:
        """Whether a request may run on the loop at once: nothing queued ahead of it, no earlier answer it could
        overtake under preserve_ordering, the model not stopping, no request waiting for its model to load where
        compute runs below the loop (the loop's thread computes at a loading thread's priority, and the requests
        that wait for a load are the oldest: on its instance thread a request yields the core to it), and either
        cheaper than a handoff with the server quiet (where the threads would gain from the load), or alone in the
        server and within the lone budget (core/loop_gate.py), unless it would be split into parts for several
        instances."""
        if self._queue.depth() or self._queue.closed or (self._policy.preserve_ordering and self._inflight):
            return False
        if self._yields_to_loads and loading_threads.requests_wait():
            return False
        if size > self._gate.max_size:
            split = self._policy.split_size
            return (size <= self._gate.lone_max_size and self._in_flight.alone()
                    and not (split and rows > split))
        return ((self._in_flight.requests <= LOOP_MAX_IN_PROGRESS or not self._threads_gain_under_load)
                and not self._gate.should_probe())

    def _may_run_async(self) -> bool:
        """Whether a request may go to a free instance from the loop at once: nothing queued ahead of it, no
        earlier answer it could overtake under preserve_ordering, the model not stopping, and the server quiet
        enough that requests would not do better batched on the instance threads."""
        return (
            not self._queue.depth()
            and not self._queue.closed
            and not (self._policy.preserve_ordering and self._inflight)
            and self._in_flight.requests <= LOOP_MAX_IN_PROGRESS
        )

    def _level(self, priority: int) -> int:
        if priority == 0:
            return self._policy.default_level
        levels = len(self._policy.levels)
        if not 1 <= priority <= levels:
            raise invalid(
                f"request priority {priority} is outside the {levels} priority level(s) of model {self._label}"
            )
        return priority - 1

    def _timeout(self, level: int, timeout_us: int | None) -> float:
        policy = self._policy.levels[level]
        timeout = policy.default_timeout_s
        if timeout_us and policy.allow_timeout_override:
            requested = timeout_us / 1e6
            timeout = min(timeout, requested) if timeout else requested
        return timeout

    def _refuse_late(self, pending: Pending) -> None:
        assert self.target is not None
        if self._queue.withdraw(pending):
            self.target.late += 1
            waited = self._clock.now() - pending.enqueued + pending.spent
            error = ModelhostError(
                ErrorKind.OVERLOADED,
                f"model {self._label}: the server has had the request {waited * 1000:.0f} ms, too long for it to be "
                f"answered within the model's p99 target of {self.target.target_s * 1000:g} ms; retry later",
                retry_after=waited,
            )
            self._answers.finish(pending, None, error)

    def _expire(self, pending: Pending) -> None:
        if self._policy.levels[pending.level].delay_on_timeout:
            self._queue.delay(pending)
        elif self._queue.withdraw(pending):
            error = ModelhostError(
                ErrorKind.TIMEOUT, f"request for model {self._label} timed out in the queue before it ran"
            )
            self._answers.finish(pending, None, error)


def _batch_key(inputs: dict[str, np.ndarray], entry: str) -> Any:
    """Requests batch when their inputs (names, shapes past the batch dim, types) and signature agree; the outputs
    they ask for may differ (core/batch_run.py `requested`)."""
    return tuple((name, array.shape[1:], array.dtype.str) for name, array in inputs.items()), entry
