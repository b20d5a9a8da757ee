"""Tracing in OpenTelemetry mode: spans exported over OTLP/HTTP to a receiver in this test, a real HTTP server
that takes `/v1/traces` protobuf posts and decodes them with opentelemetry-proto, as a collector would."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, write_model  # noqa: E402
from tests.protocols.test_trace_extension import PAIR_CONFIG, QUEUED_CONFIG  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

TRACE_ID = "0af7651916cd43dd8448eb211c12666c"
PARENT_SPAN = "b7ad6b7169242424"
ROOT_EVENTS = ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_ROOT_EVENTS = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
                    "GRPC_SEND_END"]
MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


class Receiver(ThreadingHTTPServer):
    """OTLP/HTTP's trace endpoint: every decoded export request goes to `exports`."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.exports: queue.Queue[ExportTraceServiceRequest] = queue.Queue()


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/traces" or self.headers["Content-Type"] != "application/x-protobuf":
            self.send_error(404)
            return
        self.server.exports.put(ExportTraceServiceRequest.FromString(body))
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "simple", add_sub_model(), ADD_SUB_CONFIG)
    write_model(repo, "queued", add_sub_model(), QUEUED_CONFIG)
    (repo / "pair" / "1").mkdir(parents=True)
    (repo / "pair" / "config.pbtxt").write_text(PAIR_CONFIG)
    url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    # rate 0: only requests that carry a trace context are traced.
    server = ServerProcess(repo, "--trace-config", "mode=opentelemetry", "--trace-config", f"opentelemetry,url={url}",
                           "--trace-config", "opentelemetry,resource=deployment.environment=test",
                           "--trace-config", "opentelemetry,bsp_schedule_delay=50", "--trace-config", "rate=0",
                           "--trace-config", "level=TIMESTAMPS").wait_ready()
    yield server
    server.stop()


def spans_of(receiver: Receiver, count: int = 3) -> tuple[dict[str, str], list[Any]]:
    """The resource attributes and the `count` spans of one trace's exports, waiting for them."""
    attributes: dict[str, str] = {}
    spans: list[Any] = []
    while len(spans) < count:
        for resource_spans in receiver.exports.get(timeout=10).resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            spans += [span for scope in resource_spans.scope_spans for span in scope.spans]
    return attributes, spans


def check_spans(spans: list[Any], trace_id: str, parent: str, root_events: list[str]) -> dict[str, Any]:
    """Triton's three spans, nested, continuing the caller's trace, each with its stages as events in order."""
    assert sorted(span.name for span in spans) == ["InferRequest", "compute", "simple"]
    by_name = {span.name: span for span in spans}
    root, model, compute = by_name["InferRequest"], by_name["simple"], by_name["compute"]
    assert {span.trace_id.hex() for span in spans} == {trace_id}
    assert root.parent_span_id.hex() == parent
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    assert [event.name for event in root.events] == root_events
    assert [event.name for event in model.events] == MODEL_EVENTS
    assert [event.name for event in compute.events] == COMPUTE_EVENTS
    times = [event.time_unix_nano for span in (root, model, compute) for event in span.events]
    assert root.start_time_unix_nano <= model.start_time_unix_nano <= compute.start_time_unix_nano
    assert compute.end_time_unix_nano <= model.end_time_unix_nano <= root.end_time_unix_nano
    assert min(times) == root.start_time_unix_nano and max(times) == root.end_time_unix_nano
    return by_name


def test_spans_continue_the_callers_trace(server: ServerProcess, receiver: Receiver) -> None:
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_trace_settings()["trace_mode"] == "opentelemetry"
    data = np.ones((1, 16), dtype=np.float32)
    inputs = [httpclient.InferInput(name, [1, 16], "FP32").set_data_from_numpy(data) for name in ("INPUT0", "INPUT1")]
    client.infer("simple", inputs)  # no trace context, rate 0: not traced
    client.infer("simple", inputs, request_id="r1", headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"})
    attributes, spans = spans_of(receiver)
    assert attributes["service.name"] == "modelhost" and attributes["deployment.environment"] == "test"
    model = check_spans(spans, TRACE_ID, PARENT_SPAN, ROOT_EVENTS)["simple"]
    model_attributes = {a.key: a.value for a in model.attributes}
    assert model_attributes["model_name"].string_value == "simple"
    assert model_attributes["model_version"].int_value == 1
    assert model_attributes["request_id"].string_value == "r1"
    assert receiver.exports.empty()  # the request without context made no spans


def test_grpc_metadata_carries_the_trace_context(server: ServerProcess, receiver: Receiver) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = np.ones((1, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput(name, [1, 16], "FP32").set_data_from_numpy(data) for name in ("INPUT0", "INPUT1")]
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    client.infer("simple", inputs, headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    check_spans(spans_of(receiver)[1], trace_id, parent, GRPC_ROOT_EVENTS)


def test_an_ensembles_steps_nest_under_its_model_span(server: ServerProcess, receiver: Receiver) -> None:
    client = httpclient.InferenceServerClient(server.url)
    data = np.ones((1, 16), dtype=np.float32)
    inputs = [httpclient.InferInput(name, [1, 16], "FP32").set_data_from_numpy(data) for name in ("A", "B")]
    client.infer("pair", inputs, headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"})
    spans = spans_of(receiver, 6)[1]
    names = {span.span_id: span.name for span in spans}
    children: dict[str, list[str]] = {}
    for span in spans:
        children.setdefault(names.get(span.parent_span_id, "caller"), []).append(span.name)
    assert {parent: sorted(names) for parent, names in children.items()} == {
        "caller": ["InferRequest"], "InferRequest": ["pair"], "pair": ["queued", "simple"],
        "simple": ["compute"], "queued": ["compute"]}
    steps = [span for span in spans if span.name in ("simple", "queued")]
    ensemble_id = next(a.value.int_value for span in spans if span.name == "pair" for a in span.attributes
                       if a.key == "parent_id")
    assert ensemble_id == 0
    assert all(a.value.int_value > 0 for span in steps for a in span.attributes if a.key == "parent_id")
