"""Traces exported as OpenTelemetry spans over OTLP/HTTP (`--trace-config mode=opentelemetry`).

The spans Triton makes: `InferRequest` (the front-end's stages: HTTP_RECV_*/GRPC_WAITREAD_*,
INFER_RESPONSE_COMPLETE, *_SEND_*), its child named after the model (REQUEST_START, QUEUE_START,
REQUEST_END; attributes model_name, model_version, request_id, parent_id), and that span's child `compute`
(COMPUTE_*), each stage an event; an ensemble's steps are model spans under the ensemble's. A request
carrying a W3C `traceparent` (HTTP header, gRPC metadata) continues that trace: its `InferRequest` span is
the caller's span's child. Stages are stamped on the monotonic clock; spans
take the wall clock, so every stamp is shifted by the difference measured when the exporter starts.

OpenTelemetry's batch span processor exports on its own thread (spans past its queue are dropped); building
a trace's spans on the loop costs some tens of µs per traced request. The SDK is the optional extra
`modelhost[opentelemetry]`, imported only in this mode.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from modelhost.core.trace import COMPUTE_START, QUEUE_START, REQUEST_END, REQUEST_START, Trace
from modelhost.core.trace_config import TraceStartup

_MODEL_STAGES = (REQUEST_START, QUEUE_START, REQUEST_END)
SERVICE_NAME = "modelhost"


class OtelExport:
    def __init__(self, startup: TraceStartup) -> None:
        """ImportError (naming the extra) when the SDK is not installed."""
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:
            raise ImportError("--trace-config mode=opentelemetry needs OpenTelemetry's SDK and OTLP/HTTP exporter: "
                              "pip install 'modelhost[opentelemetry]'") from exc
        from opentelemetry import trace as trace_api

        resource = Resource.create({"service.name": SERVICE_NAME, **dict(startup.resource)})
        # The server's own provider, not the process-wide one: user code's tracing is its own business.
        self._provider = TracerProvider(resource=resource)
        batch = startup.batch
        self._provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=startup.url), max_queue_size=batch.max_queue_size,
            schedule_delay_millis=batch.schedule_delay_ms, max_export_batch_size=batch.max_export_batch_size))
        self._tracer = self._provider.get_tracer("modelhost.trace")
        self._propagator = TraceContextTextMapPropagator()
        self._api = trace_api
        self._server_kind = trace_api.SpanKind.SERVER
        self._offset = time.time_ns() - time.monotonic_ns()

    def add(self, trace: Trace) -> None:
        stamps = self._shifted(trace)
        if not stamps:
            return
        parent = self._propagator.extract(trace.parent) if trace.parent else None
        root = self._tracer.start_span("InferRequest", parent, self._server_kind, start_time=stamps[0][1])
        for name, ns in stamps:
            if name not in _MODEL_STAGES and not name.startswith("COMPUTE_"):
                root.add_event(name, timestamp=ns)
        self._model_span(root, trace, stamps)
        root.end(stamps[-1][1])

    def _model_span(self, parent: Any, trace: Trace, stamps: list[tuple[str, int]]) -> None:
        """The model's span under `parent`, its compute span, and (an ensemble's) its steps' model spans."""
        model_stamps = [stamp for stamp in stamps if stamp[0] in _MODEL_STAGES]
        compute_stamps = [stamp for stamp in stamps if stamp[0].startswith("COMPUTE_")]
        attributes = {"model_name": trace.model_name, "model_version": trace.model_version,
                      "request_id": trace.request_id, "parent_id": trace.parent_id}
        model = self._child(parent, trace.model_name, model_stamps, attributes, REQUEST_START)
        if compute_stamps:  # none when the request failed before it ran, or for an ensemble (its steps compute)
            self._child(model, "compute", compute_stamps, {}, COMPUTE_START).end(_last(compute_stamps))
        for step in trace.children:
            self._model_span(model, step, self._shifted(step))
        model.end(_last(model_stamps))

    def _shifted(self, trace: Trace) -> list[tuple[str, int]]:
        """The trace's stamps on the wall clock."""
        return [(name, ns + self._offset) for name, ns in trace.timestamps()]

    def _child(self, parent: Any, name: str, stamps: list[tuple[str, int]], attributes: dict[str, Any],
               first: str) -> Any:
        start = next((ns for stage, ns in stamps if stage == first), stamps[0][1] if stamps else None)
        span = self._tracer.start_span(name, self._api.set_span_in_context(parent), attributes=attributes,
                                       start_time=start)
        for stage, ns in stamps:
            span.add_event(stage, timestamp=ns)
        return span

    def log_frequency(self, every: int) -> None:
        """Spans are exported in batches of their own (bsp_* settings)."""

    async def close(self) -> None:
        """Export what is queued, then stop the processor's thread."""
        await asyncio.to_thread(self._provider.shutdown)


def _last(stamps: list[tuple[str, int]]) -> int | None:
    return stamps[-1][1] if stamps else None
