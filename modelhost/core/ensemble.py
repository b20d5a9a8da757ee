"""Ensembles (platform "ensemble"): a DAG of steps over other models, run per request through their schedulers.

Triton's semantics: each step's input_map maps a composing model's input name to an ensemble tensor,
its output_map a composing model's output name to an ensemble tensor; model_version -1 is the latest.
A step starts as soon as the steps that write its inputs are done, so independent steps run concurrently;
each goes through its model's own scheduler (it queues, batches and splits there like any request).
Tensors pass between steps as the same numpy arrays: nothing is copied here.

The plan (ensemble_plan.py) is checked when the config is read and against the composing models once they
are loaded. The executor here runs on the event loop only, called by the data plane, which has already
checked the ensemble's own inputs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from modelhost.client_log import client_log
from modelhost.core.ensemble_batch_dims import fitted
from modelhost.core.ensemble_plan import LATEST, Acquire, EnsemblePlan, EnsembleStep, Resolve, own_view
from modelhost.core.in_flight import InFlight
from modelhost.core.sequence_controls import SequenceFlags, refuse_sequence, sequence_flags
from modelhost.core.statistics import ExecutionTiming, ModelStatistics
from modelhost.core.trace import REQUEST_END, Trace
from modelhost.errors import ErrorKind, ModelhostError, unavailable

if TYPE_CHECKING:
    from modelhost.core.served_model import ServedModel

__all__ = ["LATEST", "Acquire", "EnsemblePlan", "EnsembleScheduler", "EnsembleStep", "Resolve"]

log = logging.getLogger("modelhost.ensemble")

Outputs = dict[str, np.ndarray]


class EnsembleScheduler:
    """Runs requests of one ensemble version; duck-types Scheduler for the data plane.

    submit / inflight / queued / stop, on the event loop. It keeps no models: each step acquires its
    composing model when it starts and holds it until the step ends, so a reload lets the step finish on
    the version it got, and the next step gets the new one.
    """

    def __init__(self, label: str, plan: EnsemblePlan, acquire: Acquire, in_flight: InFlight | None = None,
                 statistics: ModelStatistics | None = None) -> None:
        """`in_flight`: where steps running beside another of the same request are counted (core/in_flight.py).
        `statistics`: the ensemble's, where each request that succeeds counts as one execution of its rows, as
        Triton counts them (its compute: the time its steps took, waits in their queues included)."""
        self._statistics = statistics
        self._label = label
        self._plan = plan
        self._acquire = acquire
        self._in_flight = in_flight or InFlight()
        self._inflight = 0
        self._stopping = False
        self._idle: asyncio.Future[None] | None = None
        self._needed: dict[frozenset[str], frozenset[int]] = {}  # requested outputs -> steps to run

    async def submit(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str], rows: int, priority: int = 0,
        timeout_us: int | None = None, entry: str = "", batchable: bool = True, spent_s: float = 0.0,
        trace: Trace | None = None, responses: Any = None, origin: Any = None,
    ) -> Outputs:
        """Run the steps the requested `outputs` need; priority and timeout pass to every step's scheduler
        (`spent_s` does not: each step's model counts from the step's own start). With a `trace`, each step runs
        with a child trace of its own (Trace.child).

        `inputs` are the ensemble's checked inputs; `rows` are counted in the ensemble's statistics; `entry` and
        `batchable` are unused (an ensemble has one signature, and each step batches in its own model). A failing
        step cancels the running ones and fails the request with the same ErrorKind, naming the step. `origin`
        is the client's request: its sequence parameters (`sequence_id`, `sequence_start`, `sequence_end`) pass
        to every step whose model is a sequence model, as Triton passes them (core/sequences.py runs them there),
        and its id and other parameters to every step (a Triton Python model's `request.parameters()`).
        """
        if self._stopping:
            raise unavailable(f"ensemble {self._label} is stopping")
        sequence = self._sequence(origin, outputs) if origin is not None and origin.parameters else None
        self._inflight += 1
        started = time.monotonic_ns()
        try:
            results = await self._execute(inputs, outputs, priority, timeout_us, trace, sequence, origin)
            if self._statistics is not None:
                timing = ExecutionTiming([0], 0, time.monotonic_ns() - started, 0)
                self._statistics.record_execution(max(rows, 1), 1, timing)
            return results
        finally:
            self._inflight -= 1
            if not self._inflight and self._idle is not None and not self._idle.done():
                self._idle.set_result(None)

    def inflight(self) -> int:
        return self._inflight

    def _sequence(self, origin: Any, outputs: Sequence[str]) -> SequenceFlags | None:
        """The request's sequence parameters; INVALID_INPUT when it has some and none of the steps it runs is a
        sequence model (running a stateful conversation statelessly would silently give wrong answers). The
        rare path: a request without parameters does not come here."""
        flags = sequence_flags(origin.parameters)
        if flags is None:
            return None
        for index in self._steps_for(outputs):
            step = self._plan.steps[index]
            hold = self._acquire(step.model_name, step.version)
            try:
                served = hold.take()
            except ModelhostError:
                continue  # the step fails on its own when it runs
            try:
                if served.sequences is not None:
                    return flags
            finally:
                hold.give_back()
        refuse_sequence(self._plan.name, origin.parameters, "ensemble", "has no step whose model has "
                        "sequence_batching")
        return None

    def queued(self) -> int:
        """Always 0: an ensemble has no queue of its own; its requests wait in the composing models' queues."""
        return 0

    async def stop(self) -> None:
        """Stop accepting; wait for the requests in flight. The composing models are not stopped."""
        self._stopping = True
        if self._inflight:
            if self._idle is None:
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)

    async def _execute(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str], priority: int, timeout_us: int | None,
        trace: Trace | None = None, sequence: SequenceFlags | None = None, origin: Any = None,
    ) -> Outputs:
        plan = self._plan
        tensors: dict[str, np.ndarray] = dict(inputs)  # the ensemble's tensor namespace for this request
        own = plan.signature
        batched = dict.fromkeys(inputs, own.max_batch_size > 0)  # tensor -> made with a batch dim
        waiting = set(self._steps_for(outputs))
        done: set[int] = set()
        running: dict[asyncio.Task[tuple[Outputs, bool]], int] = {}
        beside = 0  # steps counted in in_flight.parallel_steps
        try:
            while True:
                for index in sorted(i for i in waiting if plan.needs[i] <= done):
                    waiting.discard(index)
                    task = asyncio.ensure_future(self._run_step(plan.steps[index], tensors, batched, priority,
                                                                timeout_us, trace, sequence, origin))
                    running[task] = index
                if not running:
                    break
                self._in_flight.parallel_steps += len(running) - 1 - beside
                beside = len(running) - 1
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    index = running.pop(task)
                    try:
                        made, batching = task.result()
                    except Exception as exc:
                        raise self._failure(plan.steps[index], exc) from exc
                    tensors.update(made)
                    batched.update(dict.fromkeys(made, batching))
                    done.add(index)
        finally:
            self._in_flight.parallel_steps -= beside
            await _discard(running)  # a step failed or the caller left: the others are not wanted
        # A step may leave an output out.
        return {name: fitted(tensors[name], batched[name], own_view(own.outputs[name]).dims, own.max_batch_size > 0)
                for name in outputs if name in tensors}

    def _steps_for(self, outputs: Sequence[str]) -> frozenset[int]:
        key = frozenset(outputs)
        needed = self._needed.get(key)
        if needed is None:
            needed = self._needed[key] = self._plan.steps_for(outputs)
        return needed

    async def _run_step(
        self, step: EnsembleStep, tensors: dict[str, np.ndarray], batched: dict[str, bool], priority: int,
        timeout_us: int | None, trace: Trace | None = None, sequence: SequenceFlags | None = None,
        origin: Any = None,
    ) -> tuple[Outputs, bool]:
        """One step runs as a client's request does (ServedModel.run): its outputs mapped back to the ensemble's,
        and whether its model batches (its outputs then have a batch dim)."""
        hold = self._acquire(step.model_name, step.version)
        try:
            served: ServedModel = hold.take()
        except ModelhostError as exc:  # the ensemble exists; it cannot serve without this model
            raise unavailable(exc.message) from None
        try:
            made = await self._run_on(served, step, tensors, batched, priority, timeout_us, trace, sequence, origin)
            return made, served.signature.max_batch_size > 0
        finally:
            hold.give_back()

    @staticmethod
    async def _run_on(served: ServedModel, step: EnsembleStep, tensors: dict[str, np.ndarray],
                      batched: dict[str, bool], priority: int, timeout_us: int | None, trace: Trace | None = None,
                      sequence: SequenceFlags | None = None, origin: Any = None) -> Outputs:
        # An optional ensemble input the request left out stays out; a required model input then fails there.
        own = served.signature
        batching = own.max_batch_size > 0
        feeds = {name: fitted(tensors[tensor], batched[tensor], own.inputs[name].dims, batching)
                 for name, tensor in step.input_map.items() if tensor in tensors}
        step_trace = trace.child(served.name, served.version) if trace is not None else None
        # A sequence step gets the request's sequence (a request without one is then refused there).
        # Each step sees the client's request (its id and parameters), as Triton passes them through ensembles.
        shaped = await served.run(feeds, step.requested, priority, timeout_us or 0, trace=step_trace,
                                  sequence=sequence if served.sequences is not None else None, origin=origin)
        if step_trace is not None:
            step_trace.stamp(REQUEST_END)
        return {step.output_map[name]: array for name, array in shaped.items()}

    def _failure(self, step: EnsembleStep, exc: Exception) -> ModelhostError:
        where = f"ensemble '{self._plan.name}' {step.describe()}"
        if isinstance(exc, ModelhostError):
            return ModelhostError(exc.kind, f"{where}: {exc.message}", exc.retry_after)
        client_log(log, logging.ERROR, "ensemble-step-failed", "%s failed", where, exc_info=exc)
        return ModelhostError(ErrorKind.INTERNAL, f"{where}: model '{step.model_name}' failed: {exc}")


async def _discard(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel steps no longer wanted and wait until they are gone; their own errors are not reported."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it as never retrieved
