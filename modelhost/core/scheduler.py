"""Per-model scheduling: priority queues, dynamic batching, timeouts and ordering, one thread per instance.

One scheduler per loaded model version, shared by every protocol. The contract is
submit (awaitable) / inflight / stop; backends see batches and never batch.

Each instance owns a thread that takes the next batch from the model's RequestQueue as soon as
it finishes the last one, so an instance never idles while the event loop hands it work (a
thread pool fed from the loop held the instance across two handoffs per request and capped the
tiny model near 7,000 requests/s). Results go back to the loop with one call per batch; the
loop resolves futures, keeps arrival order when asked, and expires requests that wait too long.

A cheap request runs on the event loop instead: handing it to a thread and back costs two wake-ups,
more latency and more of the loop's CPU than a tiny model's whole run. It runs there, synchronously in
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
import contextlib
import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from modelhost.backends.base import Model, RowUpdates
from modelhost.core import compute_threads, instance_threads, loading_threads
from modelhost.core.batch_run import Outputs, call, check_batch_dim, run_batch, run_each
from modelhost.core.clock import MONOTONIC, Clock
from modelhost.core.in_flight import InFlight
from modelhost.core.latency_target import LatencyTarget
from modelhost.core.loop_gate import LoopGate
from modelhost.core.policy import SchedulingPolicy
from modelhost.core.request_queue import Pending, RequestQueue
from modelhost.core.spare_cores import SpareCores
from modelhost.core.statistics import ExecutionTiming, ModelStatistics
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
        self._statistics = statistics
        self._clock = clock
        self.target = target
        self._queue = RequestQueue(policy, clock, target.limits if target is not None else None)
        self._inflight = 0
        self._sequence = 0
        self._next_to_settle = 0
        self._finished: dict[int, tuple[asyncio.Future[Outputs], Outputs | None, BaseException | None]] = {}
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
        self._spare = spare
        self._threads_per_instance = threads_per_instance
        # Instance threads still serving, and what `stop` awaits: the last of them resolves it on the loop.
        self._serving = len(self._instances)
        self._stopped: asyncio.Future[None] | None = None
        self._serving_lock = threading.Lock()
        # Models that take a batch's requests one by one (Triton's Python API) are handed them so.
        self._takes_requests = all(i.takes_requests for i in instances) and bool(instances)
        self._run_batch = run_each if self._takes_requests else run_batch
        if slots is not None:
            self._run_batch = slots.run
        # A direct sequence's lone request may run on the loop, padded to its row, where its instance is the
        # only one (the loop takes any free instance) and the model takes batches whole.
        self._slots = slots if slots is not None and len(instances) == 1 and not self._takes_requests else None
        for index, (instance, lock) in enumerate(self._instances):
            instance_threads.start(partial(self._serve, instance, lock, index), f"{label}#{index}")

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
            result = await self._run_async(inputs, outputs, rows, entry, spent_s, trace)
            if result is not None:
                return result
        size = _elements(inputs)
        if instance < 0:
            if self._may_run_now(size, rows):
                result = self._run_on_loop(inputs, outputs, rows, size, entry, spent_s, trace)
                if result is not None:
                    return result
        elif self._slots is not None and self._may_run_now(size, 1):  # a direct sequence's, on its one instance
            result = self._run_slot_on_loop(self._slots, inputs, outputs, size, entry, spent_s, trace, row)
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
            key = _batch_key(inputs, outputs, entry)
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
                self._finish(pending, None, None)

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
                self._finish(pending, None, None)
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
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_future()
            self._queue.close()
            with self._serving_lock:
                if not self._serving:
                    self._stopped.set_result(None)
        await asyncio.shield(self._stopped)

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

    async def _run_async(self, inputs: dict[str, np.ndarray], outputs: Sequence[str], rows: int,
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

    def _run_on_loop(self, inputs: dict[str, np.ndarray], outputs: Sequence[str], rows: int,
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

    def _run_slot_on_loop(self, slots: SlotPadding, inputs: dict[str, np.ndarray], outputs: Sequence[str],
                          size: int, entry: str, spent_s: float, trace: Trace | None, row: int) -> Outputs | None:
        """`_run_on_loop` for a direct sequence's request: run at its batch row, padding rows before it."""
        if row > 0:
            inputs = slots.alone(inputs, row)
        result = self._run_on_loop(inputs, outputs, 1, size, entry, spent_s, trace)
        if result is None or row <= 0:
            return result
        check_batch_dim(result, row + 1)
        return {name: array[row:] for name, array in result.items()}

    def _learn_alone(self, rows: int, elapsed_ns: int, spent_s: float) -> None:
        """A request that ran at once, without queueing: its latency was what came before and its execution."""
        if self.target is not None:
            self.target.executed(rows, elapsed_ns / 1e9)
            self.target.completed(spent_s + elapsed_ns / 1e9)

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
            self._finish(pending, None, error)

    def _expire(self, pending: Pending) -> None:
        if self._policy.levels[pending.level].delay_on_timeout:
            self._queue.delay(pending)
        elif self._queue.withdraw(pending):
            error = ModelhostError(
                ErrorKind.TIMEOUT, f"request for model {self._label} timed out in the queue before it ran"
            )
            self._finish(pending, None, error)

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
                        results, timing = self._run_batch(instance, batch, self._clock.now(), self._policy.pad_sizes)
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
            if self.target is not None:
                self.target.executed(rows, (timing.input_ns + timing.infer_ns + timing.output_ns) / 1e9)
                now = self._clock.now()
                for pending in batch:
                    self.target.completed(now - pending.enqueued + pending.spent)
            self._gate.learn(sum(_elements(p.inputs) for p in batch), timing.infer_ns, on_loop=False)
            if len(batch) == 1 and batch[0].measures_handoff:
                round_trip_ns = int((self._clock.now() - batch[0].enqueued) * 1e9)
                self._gate.learn_handoff(max(0, round_trip_ns - timing.input_ns - timing.infer_ns - timing.output_ns))
        for index, pending in enumerate(batch):
            self._finish(pending, results[index] if results is not None else None, error)

    def _finish(self, pending: Pending, result: Outputs | None, error: BaseException | None) -> None:
        if not self._policy.preserve_ordering:
            _resolve(pending.future, result, error)
            return
        self._finished[pending.sequence] = (pending.future, result, error)
        while self._next_to_settle in self._finished:
            _resolve(*self._finished.pop(self._next_to_settle))
            self._next_to_settle += 1


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _elements(inputs: dict[str, np.ndarray]) -> int:
    return sum(array.size for array in inputs.values())


def _batch_key(inputs: dict[str, np.ndarray], outputs: Sequence[str], entry: str) -> Any:
    return tuple((name, array.shape[1:], array.dtype.str) for name, array in inputs.items()), tuple(outputs), entry


def _traced_alone(trace: Trace, elapsed_ns: int) -> None:
    """The stages of a request that ran at once, not queued: it computed for the `elapsed_ns` just past."""
    ended = time.monotonic_ns()
    started = ended - elapsed_ns
    trace.stamp(QUEUE_START, started)
    trace.computed(started, started, ended, ended)


def _resolve(future: asyncio.Future[Outputs], result: Outputs | None, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    elif isinstance(result, Exception):  # one request's own error, from a model that takes requests one by one
        future.set_exception(result)
    else:
        future.set_result(result)  # type: ignore[arg-type]
