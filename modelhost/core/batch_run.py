"""One batch on one instance, on its thread (or one request on the event loop): the requests' inputs
concatenated along dim 0 (padded up to the next preferred size where given), the model run once, each request
given its rows back, with the time each stage took (ExecutionTiming) and each request's trace stamped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelhost.backends.base import Model
from modelhost.core.request_queue import Pending
from modelhost.core.statistics import ExecutionTiming
from modelhost.errors import ErrorKind, ModelhostError

Outputs = dict[str, np.ndarray]


def call(instance: Model, entry: str, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> Outputs:
    if entry:
        return instance.infer_signature(entry, inputs, outputs)
    return instance.infer(inputs, outputs)


def run_batch(instance: Model, batch: list[Pending], taken: float,
         pad_sizes: tuple[int, ...] = ()) -> tuple[list[Outputs], ExecutionTiming]:
    """Run one batch on an instance thread (taken from the queue at `taken` on its clock): concatenate along
    dim 0 (padded up to the next of `pad_sizes`, where given), run once, give each its rows."""
    queue_ns = [int((taken - p.enqueued) * 1e9) for p in batch]
    first = batch[0]
    total = sum(p.rows for p in batch)
    # A batch key is a tuple only for requests with a batch dim (_enqueue): only those can be padded.
    padded = _padded_size(total, pad_sizes) if isinstance(first.key, tuple) else total
    if len(batch) == 1 and padded == total:
        started = time.monotonic_ns()
        outputs = call(instance, first.entry, first.inputs, first.outputs)
        ended = time.monotonic_ns()
        if first.trace is not None:
            first.trace.computed(started, started, ended, ended)
        return [outputs], ExecutionTiming(queue_ns, 0, ended - started, 0)
    started = time.monotonic_ns()
    inputs = {name: _concatenate([p.inputs[name] for p in batch], padded - total) for name in first.inputs}
    concatenated = time.monotonic_ns()
    outputs = call(instance, first.entry, inputs, requested(batch))
    inferred = time.monotonic_ns()
    check_batch_dim(outputs, padded)
    results = []
    start = 0
    for pending in batch:
        end = start + pending.rows
        results.append({name: array[start:end] for name, array in outputs.items()})
        start = end
    ended = time.monotonic_ns()
    for pending in batch:
        if pending.trace is not None:
            pending.trace.computed(started, concatenated, inferred, ended)
    timing = ExecutionTiming(queue_ns, concatenated - started, inferred - concatenated, ended - inferred)
    return results, timing


def requested(batch: list[Pending]) -> Sequence[str]:
    """The outputs a batch's requests ask for, together (as Triton, requests batch whatever outputs they ask for:
    each is answered with its own, core/served_model.py)."""
    names = batch[0].outputs
    for pending in batch:
        if pending.outputs != names:
            return list(dict.fromkeys(name for p in batch for name in p.outputs))
    return names


def check_batch_dim(outputs: Outputs, rows: int) -> None:
    """INTERNAL unless every output of a batch of `rows` rows has them as its first dimension."""
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise ModelhostError(
                ErrorKind.INTERNAL,
                f"output '{name}' of a batch of {rows} rows has shape {list(array.shape)}: its first dimension "
                "is not the batch",
            )


def run_each(instance: Model, batch: list[Pending], taken: float,
              pad_sizes: tuple[int, ...] = ()) -> tuple[list[Any], ExecutionTiming]:
    """`run_batch` for a model that takes requests one by one: no concatenation, each request's outputs or error."""
    queue_ns = [int((taken - p.enqueued) * 1e9) for p in batch]
    started = time.monotonic_ns()
    results = instance.infer_requests([(p.inputs, p.responses, p.origin) for p in batch], [p.outputs for p in batch])
    return results, ExecutionTiming(queue_ns, 0, time.monotonic_ns() - started, 0)


def _padded_size(rows: int, pad_sizes: tuple[int, ...]) -> int:
    return next((size for size in pad_sizes if size >= rows), rows)


def _concatenate(parts: list[np.ndarray], padding: int) -> np.ndarray:
    """The parts one after another along dim 0, then `padding` copies of the last row (rows whose answers are
    dropped: a copy of real data, unlike zeros, cannot make a model divide by zero)."""
    if padding:
        parts = [*parts, np.repeat(parts[-1][-1:], padding, axis=0)]
    return np.concatenate(parts) if len(parts) > 1 else parts[0]
