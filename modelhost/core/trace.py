"""Request tracing (Triton's trace extension): which requests are traced, and each one's stage timestamps.

A traced request carries a `Trace` from its front-end through `DataPlane`, `ServedModel.run` and
`Scheduler.submit` (in its `Pending` onto the instance thread), each stamping the stages it sees, on
`time.monotonic_ns()` (Triton's steady clock). The front-end finishes the trace once the answer is sent,
or `DataPlane` when the request fails; the finished trace goes to the sink, the trace file
(core/trace_file.py) or an OpenTelemetry exporter (core/trace_otel.py).

Cost when tracing is off, the default: the front-end reads `Tracer.active` once per request; nothing is
allocated and nothing else is checked but `trace is not None` where a stage is stamped.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from modelhost.core.trace_config import TraceStartup
from modelhost.core.trace_settings import Changes, TraceSettings
from modelhost.errors import ErrorKind, ModelhostError

HTTP_RECV_START, HTTP_RECV_END = "HTTP_RECV_START", "HTTP_RECV_END"
HTTP_SEND_START, HTTP_SEND_END = "HTTP_SEND_START", "HTTP_SEND_END"
GRPC_WAITREAD_START, GRPC_WAITREAD_END = "GRPC_WAITREAD_START", "GRPC_WAITREAD_END"
GRPC_SEND_START, GRPC_SEND_END = "GRPC_SEND_START", "GRPC_SEND_END"
REQUEST_START, QUEUE_START, REQUEST_END = "REQUEST_START", "QUEUE_START", "REQUEST_END"
COMPUTE_START, COMPUTE_INPUT_END = "COMPUTE_START", "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START, COMPUTE_END = "COMPUTE_OUTPUT_START", "COMPUTE_END"
INFER_RESPONSE_COMPLETE = "INFER_RESPONSE_COMPLETE"
_IDS = itertools.count(1)  # trace ids, unique in the process (Triton's are per server)


class Trace:
    """One traced request. Stamped by one task at a time: the loop, or the instance thread running its batch
    (the loop reads those stamps only after the batch's results come back through `call_soon_threadsafe`)."""

    __slots__ = ("id", "model_name", "model_version", "request_id", "levels", "stamps", "compute", "parent",
                 "inputs", "outputs", "parent_id", "children")

    def __init__(self, trace_id: int, model_name: str, levels: tuple[str, ...], parent: Mapping[str, str]) -> None:
        self.id = trace_id
        self.model_name = model_name
        self.model_version = 0
        self.request_id = ""
        self.levels = levels
        self.stamps: list[tuple[str, int]] = []
        # COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END: a request split into chunks
        # computes from its first chunk's start to its last chunk's end.
        self.compute: tuple[int, int, int, int] | None = None
        self.parent = parent  # W3C trace context headers (traceparent, tracestate) the request came with
        self.inputs: dict[str, np.ndarray] | None = None  # at level TENSORS
        self.outputs: dict[str, np.ndarray] | None = None
        self.parent_id = 0  # an ensemble step's: its ensemble request's trace id
        self.children: list[Trace] = []  # the traces of the steps this request ran in other models

    def child(self, model_name: str, model_version: int) -> Trace:
        """The trace of a step this request runs in another model (an ensemble's), begun now (REQUEST_START) and
        written or exported with this one. The caller stamps its REQUEST_END."""
        step = Trace(next(_IDS), model_name, self.levels, {})
        step.model_version, step.parent_id = model_version, self.id
        step.stamp(REQUEST_START)
        self.children.append(step)
        return step

    def stamp(self, name: str, ns: int = 0) -> None:
        self.stamps.append((name, ns or time.monotonic_ns()))

    def computed(self, start: int, input_end: int, output_start: int, end: int) -> None:
        if self.compute is not None:
            start, input_end = min(start, self.compute[0]), min(input_end, self.compute[1])
            output_start, end = max(output_start, self.compute[2]), max(end, self.compute[3])
        self.compute = (start, input_end, output_start, end)

    def timestamps(self) -> list[tuple[str, int]]:
        """Every stage's (name, ns), in time order."""
        stamps = list(self.stamps)
        if self.compute is not None:
            names = (COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END)
            stamps += zip(names, self.compute, strict=True)
        return sorted(stamps, key=lambda stamp: stamp[1])


class TraceSink(Protocol):
    """Where finished traces go. `add` is called on the loop and must not block it."""

    def add(self, trace: Trace) -> None: ...

    def log_frequency(self, every: int) -> None: ...

    async def close(self) -> None: ...


class Tracer:
    """The server's tracing: settings (the API's), sampling, and the sink. Event loop only."""

    def __init__(self, startup: TraceStartup, sink: TraceSink | None = None) -> None:
        self.settings = TraceSettings(startup)
        self.mode = startup.mode
        self._propagates = startup.mode == "opentelemetry"  # W3C trace context is read only for OpenTelemetry
        self._sink = sink
        self.active = self.settings.active and sink is not None

    def begin(self, model: str, parent: Mapping[str, str]) -> Trace | None:
        """A trace for this request of `model`, or None when it is not traced. In opentelemetry mode a request
        carrying a W3C `traceparent` (`parent`) is traced whatever the rate and count say (as Triton does)."""
        sampling = self.settings.sampling(model)
        continued = bool(parent) and sampling.levels[0] != "OFF"
        if not continued and not self.settings.take(sampling):
            return None
        return Trace(next(_IDS), model, sampling.levels, parent)

    def begin_http(self, model: str, received: float, headers: Mapping[bytes, bytes]) -> Trace | None:
        """`begin`, stamped with when the request began arriving (`received`, time.monotonic()) and now, when
        the whole of it has been read."""
        parent = _context(headers.get(b"traceparent"), headers.get(b"tracestate")) if self._propagates else {}
        trace = self.begin(model, parent)
        if trace is not None:
            now = time.monotonic_ns()
            trace.stamp(HTTP_RECV_START, int(received * 1e9) if received else now)
            trace.stamp(HTTP_RECV_END, now)
        return trace

    def begin_grpc(self, model: str, context: Any = None) -> Trace | None:
        """`begin`, stamped with when the request's message reached its handler (grpc reads it before that:
        the wait and read are not seen here, so both stamps are that moment). `context`: the call's grpc
        context, whose metadata may carry a trace context."""
        parent = {}
        if self._propagates and context is not None:
            metadata = dict(context.invocation_metadata() or ())
            parent = _context(metadata.get("traceparent"), metadata.get("tracestate"))
        trace = self.begin(model, parent)
        if trace is not None:
            now = time.monotonic_ns()
            trace.stamp(GRPC_WAITREAD_START, now)
            trace.stamp(GRPC_WAITREAD_END, now)
        return trace

    def finish(self, trace: Trace, last: str = "") -> None:
        """Stamp `last` (a send's end), then hand the trace to the sink."""
        if last:
            trace.stamp(last)
        if self._sink is not None:
            self._sink.add(trace)

    def get(self, model: str | None = None) -> dict[str, Any]:
        return self.settings.get(model)

    def update(self, changes: Changes, model: str | None = None) -> dict[str, Any]:
        """The settings changed (TraceSettings.update). Turning tracing on needs somewhere to put traces."""
        if self._sink is None and any(level != "OFF" for level in changes.get("trace_level") or ()):
            raise ModelhostError(ErrorKind.PRECONDITION, "tracing cannot be turned on: the server has nowhere to "
                                 "write traces (the operator sets --trace-config triton,file=PATH)")
        answer = self.settings.update(changes, model)
        self.active = self.settings.active and self._sink is not None
        if model is None and self._sink is not None:
            self._sink.log_frequency(self.settings.log_frequency())
        return answer

    async def close(self) -> None:
        if self._sink is not None:
            await self._sink.close()


def _context(parent: str | bytes | None, state: str | bytes | None) -> dict[str, str]:
    """A W3C trace context's headers (HTTP headers are bytes, gRPC metadata str); {} without a traceparent."""
    if parent is None:
        return {}
    context = {"traceparent": _text(parent)}
    if state is not None:
        context["tracestate"] = _text(state)
    return context


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value
