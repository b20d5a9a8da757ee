"""Traces written to the operator's trace file, in Triton's trace JSON, off the event loop.

With `log_frequency` N > 0, every N traces are written to `<file>.<index>` (0, 1, ...); with 0, all of them
to `<file>` when the server stops. The file is a JSON array holding, per trace, one object with its `id`,
`model_name`, `model_version`, `timestamps` ([{"name", "ns"}], in time order) and, for an ensemble's step,
`parent_id` (the ensemble request's trace id; the step's object follows its ensemble's), and at level TENSORS one
object per tensor (`activity` TENSOR_QUEUE_INPUT or TENSOR_BACKEND_OUTPUT, `tensor`: name, data, shape, dtype).

Bounds: at most MAX_BUFFERED traces wait for a write (the rest are dropped, and the log says so once), and
every file together holds at most `max_bytes` (later writes are dropped likewise). One writer thread
serializes and writes; the loop only appends to a list.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from modelhost.core.trace import Trace
from modelhost.types import datatype_of

log = logging.getLogger("modelhost.trace")

MAX_BUFFERED = 10_000
MAX_TENSOR_ELEMENTS = 65_536  # of one tensor written at level TENSORS; longer data ends with "..."


class TraceFile:
    def __init__(self, path: Path, log_frequency: int, max_bytes: int) -> None:
        self._path = path
        self._every = log_frequency
        self._max_bytes = max_bytes
        self._buffer: list[Trace] = []
        self._index = 0
        self._written = 0  # bytes in every file so far (writer thread)
        self._warned: set[str] = set()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="trace-file")
        self._last: Future[None] | None = None

    def add(self, trace: Trace) -> None:
        if len(self._buffer) >= MAX_BUFFERED:
            self._warn("buffer", "trace dropped: %d traces already wait to be written (log_frequency 0 keeps "
                       "them until the server stops; set log_frequency to write them as they come)", MAX_BUFFERED)
            return
        self._buffer.append(trace)
        if self._every and len(self._buffer) >= self._every:
            self._flush()

    def log_frequency(self, every: int) -> None:
        self._every = every
        if every and len(self._buffer) >= every:
            self._flush()

    async def close(self) -> None:
        """Write what is left (to `<file>` when log_frequency is 0), then stop the writer thread."""
        if self._buffer:
            self._flush()
        if self._last is not None:
            await asyncio.wrap_future(self._last)
        self._writer.shutdown(wait=False)

    def _flush(self) -> None:
        traces, self._buffer = self._buffer, []
        path = self._path if not self._every else self._path.with_name(f"{self._path.name}.{self._index}")
        self._index += 1 if self._every else 0
        self._last = self._writer.submit(self._write, path, traces)

    def _write(self, path: Path, traces: list[Trace]) -> None:
        data = orjson.dumps([record for trace in traces for record in _records(trace)])
        if self._written + len(data) > self._max_bytes:
            self._warn("bytes", "traces dropped: the trace files would pass %d bytes (--trace-config "
                       "triton,max-file-bytes)", self._max_bytes)
            return
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
        except OSError as exc:
            self._warn("write", "traces not written to %s: %s", path, exc)
            return
        self._written += len(data)

    def _warn(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)


def _records(trace: Trace) -> list[dict[str, Any]]:
    head: dict[str, Any] = {"id": trace.id, "model_name": trace.model_name, "model_version": trace.model_version}
    if trace.request_id:
        head["request_id"] = trace.request_id
    if trace.parent_id:
        head["parent_id"] = trace.parent_id
    head["timestamps"] = [{"name": name, "ns": ns} for name, ns in trace.timestamps()]
    records = [head]
    for activity, tensors in (("TENSOR_QUEUE_INPUT", trace.inputs), ("TENSOR_BACKEND_OUTPUT", trace.outputs)):
        records += [{"id": trace.id, "activity": activity, "tensor": _tensor(name, array)}
                    for name, array in (tensors or {}).items()]
    for child in trace.children:
        records += _records(child)
    return records


def _tensor(name: str, array: np.ndarray) -> dict[str, str]:
    flat = array.reshape(-1)
    shown = flat[:MAX_TENSOR_ELEMENTS]
    if array.dtype == np.object_:
        data = ",".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in shown)
    else:
        data = ",".join(map(str, shown.tolist()))
    if flat.size > MAX_TENSOR_ELEMENTS:
        data += ",..."
    return {"name": name, "data": data, "shape": ",".join(map(str, array.shape)), "dtype": datatype_of(array)}
