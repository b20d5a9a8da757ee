"""Scripted servers on real sockets for the client's failure paths: each request gets the next action of a
script (refuse, drop the connection, answer), and the servers count what they received."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import orjson

from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb

ANSWER = orjson.dumps({"model_name": "m", "model_version": "1",
                       "outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": [7.0]}]})
# What GET answers: model m's metadata and config (one input x, [batch, 1] FP32), and empty statistics.
DESCRIPTIONS = {
    "/v2/models/m": {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}],
                     "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]},
    "/v2/models/m/config": {"name": "m", "max_batch_size": 8},
    "/v2/models/m/stats": {"model_stats": []},
}


class Script:
    def __init__(self, actions: list[str]) -> None:
        self.actions = list(actions)
        self.requests = 0
        self.connections = 0  # accepted so far
        self.closed = 0  # closed by the server so far
        self.body_bytes = 0  # request body bytes read
        self._lock = threading.Lock()

    def connected(self) -> None:
        with self._lock:
            self.connections += 1

    def next(self) -> str:
        with self._lock:
            self.requests += 1
            return self.actions.pop(0) if len(self.actions) > 1 else self.actions[0]


@contextmanager
def http_server(actions: list[str]) -> Iterator[tuple[str, Script]]:
    """Actions: "ok", "close-after" (answer, then close without saying so), "drop" (close unanswered),
    "503" / "503:N" (refuse, Retry-After N); to a request that asks Expect: 100-continue, "head-503" refuses
    it at its head (the body never read) and "no-continue" ignores the Expect (never sends 100 Continue)."""
    script = Script(actions)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            script.connected()
            self.action: str | None = None

        def handle_expect_100(self) -> bool:
            self.action = script.next()
            if self.action == "head-503":
                body = b'{"error":"refused at the head"}'
                self.send_response(503)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True
                return False
            if self.action == "no-continue":
                return True
            return super().handle_expect_100()

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body_bytes = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with script._lock:
                script.body_bytes += len(body_bytes)
            action = self.action or script.next()
            self.action = None
            if action == "drop":
                self.close_connection = True
                return
            if action.startswith("503"):
                body = b'{"error":"queue full"}'
                self.send_response(503)
                if ":" in action:
                    self.send_header("Retry-After", action.split(":")[1])
            else:
                body = ANSWER
                self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            if action == "close-after":
                self.close_connection = True

        def do_GET(self) -> None:  # noqa: N802
            document = DESCRIPTIONS.get(self.path)
            body = orjson.dumps(document if document is not None else {"error": "not found"})
            self.send_response(200 if document is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def shutdown_request(self, request: Any) -> None:
            super().shutdown_request(request)
            with script._lock:
                script.closed += 1

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def grpc_server(actions: list[str]) -> Iterator[tuple[str, Script]]:
    """Actions: "ok", "unavailable" (UNAVAILABLE), "unavailable:N" (with Retry-After N in the trailers)."""
    script = Script(actions)

    def model_infer(request: pb.ModelInferRequest, context: grpc.ServicerContext) -> pb.ModelInferResponse:
        action = script.next()
        if action.startswith("unavailable"):
            if ":" in action:
                context.set_trailing_metadata((("retry-after", action.split(":")[1]),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "queue full")
        answer = pb.ModelInferResponse(model_name="m", model_version="1")
        answer.outputs.add(name="y", datatype="FP32", shape=[1])
        answer.raw_output_contents.append(b"\x00\x00\xe0\x40")  # 7.0
        return answer

    handler = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            model_infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString),
    })
    server = grpc.server(ThreadPoolExecutor(4), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"grpc://127.0.0.1:{port}", script
    finally:
        server.stop(0)
