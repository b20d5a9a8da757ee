"""Batches of a `direct` sequence model: a sequence's request is at its slot's row of the batch.

Under Triton's direct strategy each sequence owns a batch slot of one instance, and the model may keep
per-slot state inside itself, indexed by batch row. So a batch is laid out by slot, not by arrival: the
request of the sequence in slot i is row i, and the slots up to the highest one with a request that have
none get a padding row. A padding row is not a request: its READY, START and END controls are false, its
CORRID 0, its other inputs (state inputs included) zeros shaped as a real request's; its outputs are dropped.
(Triton's padding rows carry unspecified data; zeros are as good, and cannot leak another request's data.)

`SlotPadding.run` is the instance thread's way to run such a model's batch (core/batch_threads.py), in place of
plain concatenation; each queued request carries its row (`Pending.row`). A lone request that runs on the
event loop (the scheduler's inline path, for a model with one instance) is padded by `alone`. A model that
takes requests one by one (Triton's Python API) gets its padding rows as requests of their own, at their
slots' places.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from modelhost.backends.base import Model
from modelhost.core.batch_run import call, check_batch_dim, requested
from modelhost.core.request_queue import Pending
from modelhost.core.statistics import ExecutionTiming

Outputs = dict[str, np.ndarray]


class SlotPadding:
    """What a padding row holds, for one model: its not-ready control inputs, read once."""

    def __init__(self, not_ready: Mapping[str, np.ndarray]) -> None:
        self._controls = dict(not_ready)  # [1, 1] each

    def row(self, example: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One padding row, its inputs shaped and typed as `example`'s (a real request of the batch)."""
        row = {}
        for name, array in example.items():
            control = self._controls.get(name)
            if control is not None:
                row[name] = control
            elif array.dtype == np.object_:
                row[name] = np.full((1, *array.shape[1:]), b"", dtype=np.object_)
            else:
                row[name] = np.zeros((1, *array.shape[1:]), array.dtype)
        return row

    def alone(self, inputs: dict[str, np.ndarray], row: int) -> dict[str, np.ndarray]:
        """A batch of one request at `row`: `row` padding rows, then its own (it runs on the event loop)."""
        padding = self.row(inputs)
        return {name: np.concatenate([np.repeat(padding[name], row, axis=0), array]) for name, array in inputs.items()}

    def run(self, instance: Model, batch: list[Pending], taken: float,
            pad_sizes: tuple[int, ...] = ()) -> tuple[list[Outputs | Exception], ExecutionTiming]:
        """Run one batch on an instance thread, each request at its row, padding rows between; each request
        gets its row's outputs. `pad_sizes` is unused: a direct model's batch is as long as its highest slot."""
        queue_ns = [int((taken - p.enqueued) * 1e9) for p in batch]
        first = batch[0]
        by_row = {p.row: p for p in batch}
        rows = max(by_row) + 1
        padding = self.row(first.inputs) if len(by_row) < rows else {}
        started = time.monotonic_ns()
        if instance.takes_requests:
            requests = [(p.inputs, p.responses, p.origin) if (p := by_row.get(r)) is not None else (padding, None, None)
                        for r in range(rows)]
            answers = instance.infer_requests(requests, [p.outputs if (p := by_row.get(r)) is not None
                                                         else first.outputs for r in range(rows)])
            ended = time.monotonic_ns()
            return [answers[p.row] for p in batch], ExecutionTiming(queue_ns, 0, ended - started, 0)
        parts = [by_row[r].inputs if r in by_row else padding for r in range(rows)]
        inputs = {name: np.concatenate([part[name] for part in parts]) for name in first.inputs}
        concatenated = time.monotonic_ns()
        outputs = call(instance, first.entry, inputs, requested(batch))
        inferred = time.monotonic_ns()
        check_batch_dim(outputs, rows)
        results: list[Outputs | Exception] = [
            {name: array[p.row : p.row + 1] for name, array in outputs.items()} for p in batch]
        ended = time.monotonic_ns()
        for pending in batch:
            if pending.trace is not None:
                pending.trace.computed(started, concatenated, inferred, ended)
        return results, ExecutionTiming(queue_ns, concatenated - started, inferred - concatenated, ended - inferred)
