"""The HTTP/1.1 server itself (modelhost/protocols/http_server.py), spoken to byte by byte.

Raw sockets where framing matters (keep-alive, pipelining, bodies split across sends, chunked
bodies, `Expect: 100-continue`, the body limit, malformed input, disconnects); `http.client`
for the concurrency test. Runs against the session's `example_server` (rank, deepfm, tiny) and,
for the body limit, a second server on the same repository with a small --http-max-body-bytes.
Tensor results are checked against onnxruntime run in this process on the served model files.

Every socket has a timeout, so a server that stops answering fails a test instead of hanging it.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from modelhost.example_repository import RANK_FEATURES
from tests.server import ServerProcess

TIMEOUT = 10.0  # any single socket operation
RTOL, ATOL = 1e-5, 1e-6
Reference = Callable[[np.ndarray], np.ndarray]
LIMIT = 4096  # --http-max-body-bytes of the `limited` server
HEADER_LENGTH = "inference-header-content-length"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


# --- a small HTTP/1.1 client over a raw socket --------------------------------------------------------


@dataclass
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]  # names lower-cased, in wire order
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name]
        assert len(values) <= 1, f"header {name} sent {len(values)} times: {self.headers}"
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


class Wire:
    """One TCP connection; reads responses strictly by their framing (content-length or chunked)."""

    def __init__(self, port: int, timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_pieces(self, data: bytes, size: int, pause: float) -> None:
        for start in range(0, len(data), size):
            self.sock.sendall(data[start : start + size])
            if pause:
                time.sleep(pause)

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"connection closed by the server; unread: {bytes(self.buffer[:200])!r}")
        self.buffer += chunk

    def read_until(self, marker: bytes) -> bytes:
        while (end := self.buffer.find(marker)) < 0:
            self._fill()
        end += len(marker)
        data = bytes(self.buffer[:end])
        del self.buffer[:end]
        return data

    def read_exact(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def read_head(self) -> tuple[int, str, list[tuple[str, str]]]:
        head = self.read_until(b"\r\n\r\n").decode("latin-1")
        status_line, *lines = head[:-4].split("\r\n")
        version, status, reason = (status_line.split(" ", 2) + [""])[:3]
        assert version == "HTTP/1.1", status_line
        headers = []
        for line in lines:
            name, _, value = line.partition(":")
            headers.append((name.strip().lower(), value.strip()))
        return int(status), reason, headers

    def read_response(self, skip_continue: bool = False) -> Response:
        status, reason, headers = self.read_head()
        while status == 100 and skip_continue:
            status, reason, headers = self.read_head()
        response = Response(status, reason, headers, b"")
        length = response.header("content-length")
        if response.header("transfer-encoding") == "chunked":
            assert length is None, "both content-length and chunked"
            body = bytearray()
            while size := int(self.read_until(b"\r\n")[:-2].split(b";")[0], 16):
                body += self.read_exact(size)
                assert self.read_exact(2) == b"\r\n"
            self.read_until(b"\r\n")  # no trailers expected: the empty line
            response.body = bytes(body)
        else:
            assert length is not None, f"response without content-length or chunked framing: {headers}"
            response.body = self.read_exact(int(length))
        return response

    def closed_by_server(self, timeout: float = TIMEOUT) -> bool:
        """True when the server closes (EOF or reset) with nothing more to read, within `timeout`."""
        assert not self.buffer, f"unread bytes: {bytes(self.buffer[:200])!r}"
        self.sock.settimeout(timeout)
        try:
            extra = self.sock.recv(65536)
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        assert not extra, f"unexpected bytes after the response: {extra[:200]!r}"
        return True

    def silent(self, quiet: float = 0.2) -> bool:
        """True when nothing arrives for `quiet` seconds and the connection is still open."""
        if self.buffer:
            return False
        self.sock.settimeout(quiet)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(TIMEOUT)
        self.buffer += data
        return False


def request(method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
            version: str = "HTTP/1.1") -> bytes:
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None and not any(k.lower() == "transfer-encoding" for k in (headers or {})):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def tiny_json(values: list[float], request_id: str | None = None) -> bytes:
    tensor = {"name": "x", "datatype": "FP32", "shape": [len(values) // 4, 4], "data": values}
    document: dict[str, Any] = {"inputs": [tensor]}
    if request_id is not None:
        document["id"] = request_id
    return json.dumps(document).encode()


def tiny_expected(values: list[float]) -> list[float]:
    return [2.0 * v + 1.0 for v in values]  # tiny: y = 2x + 1


def assert_tiny(response: Response, values: list[float]) -> None:
    assert response.status == 200, response.body
    assert response.header("content-type") == "application/json"
    document = response.json()
    assert isinstance(document, dict) and document["model_name"] == "tiny"
    [entry] = document["outputs"]
    assert entry["name"] == "y"
    assert entry["data"] == tiny_expected(values)


def assert_json_error(response: Response, status: int, *fragments: str) -> str:
    assert response.status == status, (response.status, response.body)
    assert response.header("content-type") == "application/json"
    document = response.json()
    assert isinstance(document, dict) and list(document) == ["error"], document
    message = document["error"]
    assert isinstance(message, str) and message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def binary_infer(model: str, inputs: dict[str, np.ndarray], output: str) -> bytes:
    """An infer request body with binary inputs and one binary output; returns the full HTTP request."""
    header = json.dumps({
        "inputs": [
            {"name": name, "datatype": "FP32", "shape": list(array.shape),
             "parameters": {"binary_data_size": array.nbytes}}
            for name, array in inputs.items()
        ],
        "outputs": [{"name": output, "parameters": {"binary_data": True}}],
    }).encode()
    body = header + b"".join(array.tobytes() for array in inputs.values())
    return request("POST", f"/v2/models/{model}/infer", body, {
        "Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})


def binary_output(response: Response) -> tuple[dict[str, Any], np.ndarray]:
    assert response.status == 200, response.body[:500]
    assert response.header("content-type") == "application/octet-stream"
    json_length = int(response.header(HEADER_LENGTH) or -1)
    assert 0 < json_length <= len(response.body)
    document = json.loads(response.body[:json_length])
    [entry] = document["outputs"]
    assert entry["parameters"]["binary_data_size"] == len(response.body) - json_length
    return document, np.frombuffer(response.body[json_length:], dtype=np.float32).reshape(entry["shape"])


def health(wire: Wire) -> None:
    wire.send(request("GET", "/v2/health/ready"))
    response = wire.read_response()
    assert response.status == 200 and response.body == b""


def still_serving(server: ServerProcess) -> None:
    assert server.process.poll() is None, "server process exited"
    with Wire(server.port) as wire:
        health(wire)
        values = [1.0, 2.0, 3.0, 4.0]
        wire.send(request("POST", "/v2/models/tiny/infer", tiny_json(values)))
        assert_tiny(wire.read_response(), values)


# --- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repository(example_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example_server.example_repository


@pytest.fixture(scope="module")
def rank_reference(repository: Path) -> Reference:
    session = ort.InferenceSession(str(repository / "rank" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])

    def run(features: np.ndarray) -> np.ndarray:
        return session.run(["score"], {"features": features})[0]

    return run


@pytest.fixture(scope="module")
def limited(repository: Path) -> Iterator[ServerProcess]:
    """The same models, with --http-max-body-bytes 4096."""
    server = ServerProcess(repository, "--http-max-body-bytes", str(LIMIT)).wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rank_features() -> np.ndarray:
    # 500 x 1000 float32 = 2,000,000 bytes of tensor data
    return np.random.default_rng(11).standard_normal((500, RANK_FEATURES)).astype(np.float32)


# --- keep-alive and connection close -----------------------------------------------------------------


def test_keep_alive_several_requests_one_connection(example_server: ServerProcess) -> None:
    with Wire(example_server.port) as wire:
        for i in range(5):
            wire.send(request("GET", "/v2/health/ready"))
            response = wire.read_response()
            assert response.status == 200 and response.body == b""
            assert response.header("connection") is None

            values = [float(i), 1.0, -2.5, 0.25] * 2
            wire.send(request("POST", "/v2/models/tiny/infer", tiny_json(values), {"Content-Type": "application/json"}))
            response = wire.read_response()
            assert_tiny(response, values)
            assert response.header("connection") is None

            wire.send(request("GET", "/v2/models/tiny"))
            response = wire.read_response()
            assert response.status == 200 and response.json()["name"] == "tiny"
        time.sleep(0.3)  # an idle pause does not close the connection
        assert wire.silent()
        health(wire)


def test_connection_close_request_is_answered_then_closed(example_server: ServerProcess) -> None:
    with Wire(example_server.port) as wire:
        health(wire)  # first a keep-alive request
        values = [1.0, 2.0, 3.0, 4.0]
        wire.send(request("POST", "/v2/models/tiny/infer", tiny_json(values), {"Connection": "close"}))
        response = wire.read_response()
        assert_tiny(response, values)
        assert response.header("connection") == "close"
        assert wire.closed_by_server()


def test_http10_without_keep_alive_closes(example_server: ServerProcess) -> None:
    with Wire(example_server.port) as wire:
        wire.send(request("GET", "/v2/health/ready", version="HTTP/1.0"))
        response = wire.read_response()
        assert response.status == 200 and response.body == b""
        assert response.header("connection") == "close"
        assert wire.closed_by_server()
    with Wire(example_server.port) as wire:
        values = [0.5, 0.5, 0.5, 0.5]
        wire.send(request("POST", "/v2/models/tiny/infer", tiny_json(values), version="HTTP/1.0"))
        response = wire.read_response()
        assert_tiny(response, values)
        assert response.header("connection") == "close"
        assert wire.closed_by_server()


def test_http10_with_keep_alive_stays_open(example_server: ServerProcess) -> None:
    with Wire(example_server.port) as wire:
        for _ in range(3):
            wire.send(request("GET", "/v2/health/ready", headers={"Connection": "keep-alive"}, version="HTTP/1.0"))
            response = wire.read_response()
            assert response.status == 200
            assert response.header("connection") != "close"
        assert wire.silent()


# --- pipelining --------------------------------------------------------------------------------------


def test_pipelined_requests_answered_in_order(example_server: ServerProcess) -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 10.0, 0.5, 7.0, 8.0, 9.0, 10.0]
    with Wire(example_server.port) as wire:
        wire.send(
            request("GET", "/v2/health/ready")
            + request("POST", "/v2/models/tiny/infer", tiny_json(a, "first"))
            + request("GET", "/v2/models/deepfm")
            + request("POST", "/v2/models/tiny/infer", tiny_json(b, "second"))
            + request("GET", "/v2/models/nope/ready")
        )
        first = wire.read_response()
        assert first.status == 200 and first.body == b""
        second = wire.read_response()
        assert_tiny(second, a)
        assert second.json()["id"] == "first"
        third = wire.read_response()
        assert third.status == 200 and third.json()["name"] == "deepfm"
        fourth = wire.read_response()
        assert_tiny(fourth, b)
        assert fourth.json()["id"] == "second"
        fifth = wire.read_response()
        assert fifth.status == 400  # unknown model: not ready
        assert wire.silent()
        health(wire)  # the connection is still usable


def test_deep_pipeline_beyond_the_read_pause(example_server: ServerProcess) -> None:
    """More pipelined requests than the server queues before pausing reads (16): all answered, in order."""
    count = 50
    with Wire(example_server.port) as wire:
        wire.send(b"".join(request("POST", "/v2/models/tiny/infer", tiny_json([float(i)] * 4)) for i in range(count)))
        for i in range(count):
            assert_tiny(wire.read_response(), [float(i)] * 4)
        assert wire.silent()


def test_binary_body_followed_by_pipelined_request(example_server: ServerProcess, rank_features: np.ndarray,
                                                   rank_reference: Reference) -> None:
    """The next request starts right after a 2 MB body that was read straight into its buffer."""
    with Wire(example_server.port) as wire:
        wire.send(binary_infer("rank", {"features": rank_features}, "score") + request("GET", "/v2/health/ready")
                  + request("POST", "/v2/models/tiny/infer", tiny_json([1.0] * 4)))
        _, score = binary_output(wire.read_response())
        np.testing.assert_allclose(score, rank_reference(rank_features), rtol=RTOL, atol=ATOL)
        assert wire.read_response().status == 200
        assert_tiny(wire.read_response(), [1.0] * 4)


# --- request bodies arriving in pieces ---------------------------------------------------------------


def _split_at(data: bytes, *cuts: int) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("delivery", [
    "one-sendall",
    "headers-then-64k-pieces",
    "first-part-with-headers",
    "headers-split-across-sends",
    "odd-sized-pieces",
])
def test_2mb_binary_body_in_pieces(example_server: ServerProcess, rank_features: np.ndarray,
                                   rank_reference: Reference, delivery: str) -> None:
    data = binary_infer("rank", {"features": rank_features}, "score")
    head_end = data.index(b"\r\n\r\n") + 4
    head, body = data[:head_end], data[head_end:]
    assert len(body) > 2_000_000
    with Wire(example_server.port) as wire:
        if delivery == "one-sendall":
            wire.send(data)
        elif delivery == "headers-then-64k-pieces":
            wire.send(head)
            time.sleep(0.02)
            wire.send_pieces(body, 64 * 1024, pause=0.002)
        elif delivery == "first-part-with-headers":
            wire.send(head + body[:100_000])
            time.sleep(0.05)
            wire.send_pieces(body[100_000:], 512 * 1024, pause=0.01)
        elif delivery == "headers-split-across-sends":
            # inside the method, inside a header name, between \r\n\r and \n
            for piece in _split_at(head, 2, head.index(b"Content-Length") + 7, len(head) - 1):
                wire.send(piece)
                time.sleep(0.02)
            wire.send_pieces(body, 700_000, pause=0.01)
        else:
            rng = np.random.default_rng(5)
            cuts = sorted({int(c) for c in rng.integers(1, len(data), 60)} | {head_end - 1, head_end, head_end + 1})
            for index, piece in enumerate(_split_at(data, *cuts)):
                wire.send(piece)
                if index % 6 == 0:
                    time.sleep(0.003)
        response = wire.read_response()
        document, score = binary_output(response)
        assert document["model_name"] == "rank"
        np.testing.assert_allclose(score, rank_reference(rank_features), rtol=RTOL, atol=ATOL)
        assert score.shape == (500, 1)
        health(wire)  # the connection is in a clean state afterwards


def test_small_body_byte_by_byte(example_server: ServerProcess) -> None:
    values = [1.5, -2.0, 3.25, 0.0]
    data = request("POST", "/v2/models/tiny/infer", tiny_json(values))
    with Wire(example_server.port) as wire:
        for i in range(len(data)):
            wire.send(data[i : i + 1])
            if i % 16 == 0:
                time.sleep(0.001)
        assert_tiny(wire.read_response(), values)


# --- chunked request bodies --------------------------------------------------------------------------


def _chunked(body: bytes, size: int, extension: bool = False) -> list[bytes]:
    chunks = []
    for start in range(0, len(body), size):
        part = body[start : start + size]
        chunks.append(b"%x%s\r\n" % (len(part), b";note=1" if extension else b"") + part + b"\r\n")
    return [*chunks, b"0\r\n\r\n"]


def test_chunked_request_body(example_server: ServerProcess) -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    head = request("POST", "/v2/models/tiny/infer", headers={"Transfer-Encoding": "chunked"})
    with Wire(example_server.port) as wire:
        wire.send(head)  # then the chunks, each in its own send
        for chunk in _chunked(tiny_json(values), 17, extension=True):
            time.sleep(0.005)
            wire.send(chunk)
        assert_tiny(wire.read_response(), values)
        # again, everything in one send, plus a trailer, and a pipelined request behind it
        chunks = b"".join(_chunked(tiny_json(values[:4]), 5))[:-2] + b"X-Trailer: yes\r\n\r\n"
        wire.send(head + chunks + request("GET", "/v2/health/ready"))
        assert_tiny(wire.read_response(), values[:4])
        assert wire.read_response().status == 200


def test_chunked_request_body_with_requests_library(example_server: ServerProcess) -> None:
    import requests

    values = [9.0, 8.0, 7.0, 6.0]

    def body() -> Iterator[bytes]:  # a generator: requests sends it chunked
        data = tiny_json(values)
        yield data[:10]
        yield data[10:]

    response = requests.post(f"{example_server.base}/v2/models/tiny/infer", data=body(), timeout=TIMEOUT)
    assert response.request.headers.get("Transfer-Encoding") == "chunked"
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == tiny_expected(values)


def test_chunked_transfer_coding_name_is_case_insensitive(example_server: ServerProcess) -> None:
    """RFC 9112 §7: transfer-coding names are case-insensitive; `Chunked` must not drop the body."""
    values = [1.0, 2.0, 3.0, 4.0]
    with Wire(example_server.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", b"".join(_chunked(tiny_json(values), 32)),
                          {"Transfer-Encoding": "Chunked"}))
        assert_tiny(wire.read_response(), values)


# --- Expect: 100-continue ----------------------------------------------------------------------------


def test_expect_100_continue(example_server: ServerProcess, rank_features: np.ndarray,
                             rank_reference: Reference) -> None:
    values = [4.0, 3.0, 2.0, 1.0]
    body = tiny_json(values)
    with Wire(example_server.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", headers={
            "Expect": "100-continue", "Content-Length": str(len(body))}))
        assert wire.read_until(b"\r\n\r\n") == CONTINUE  # before any body byte was sent
        assert wire.silent()  # and no final response before the body
        wire.send(body)
        response = wire.read_response()
        assert_tiny(response, values)

        # the same on the direct-to-buffer path: a 2 MB binary body after the 100
        data = binary_infer("rank", {"features": rank_features}, "score")
        head_end = data.index(b"\r\n\r\n")
        wire.send(data[:head_end] + b"\r\nExpect: 100-continue\r\n\r\n")
        assert wire.read_until(b"\r\n\r\n") == CONTINUE
        wire.send_pieces(data[head_end + 4 :], 256 * 1024, pause=0.001)
        _, score = binary_output(wire.read_response())
        np.testing.assert_allclose(score, rank_reference(rank_features), rtol=RTOL, atol=ATOL)


def test_expect_100_continue_with_http_client(example_server: ServerProcess) -> None:
    """Without the 100 a client that waits for it would stall; http.client just reads past it."""
    values = [0.0, 1.0, 0.0, 1.0]
    connection = http.client.HTTPConnection("127.0.0.1", example_server.port, timeout=TIMEOUT)
    try:
        connection.request("POST", "/v2/models/tiny/infer", body=tiny_json(values),
                           headers={"Expect": "100-continue", "Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["outputs"][0]["data"] == tiny_expected(values)
    finally:
        connection.close()


def test_expect_100_continue_is_case_insensitive(example_server: ServerProcess) -> None:
    """RFC 9110 §10.1.1: "The Expect field value is case-insensitive" (e.g. `100-Continue`)."""
    body = tiny_json([1.0, 1.0, 1.0, 1.0])
    with Wire(example_server.port, timeout=3) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", headers={
            "Expect": "100-Continue", "Content-Length": str(len(body))}))
        try:
            interim = wire.read_until(b"\r\n\r\n")
        except TimeoutError:
            interim = b"<nothing within 3 s>"
        assert interim == CONTINUE


def test_expect_100_continue_ignored_for_http10(example_server: ServerProcess) -> None:
    """RFC 9110 §10.1.1: a server MUST ignore a 100-continue expectation in an HTTP/1.0 request
    (1.0 clients do not know 1xx responses)."""
    values = [1.0, 1.0, 2.0, 2.0]
    body = tiny_json(values)
    with Wire(example_server.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", body, {"Expect": "100-continue"}, version="HTTP/1.0"))
        status, _, _ = wire.read_head()
        assert status == 200, "interim 100 response sent to an HTTP/1.0 client"


def test_expect_100_continue_over_limit_gets_413_without_continue(limited: ServerProcess) -> None:
    with Wire(limited.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", headers={
            "Expect": "100-continue", "Content-Length": str(LIMIT + 1)}))
        response = wire.read_response()  # a 100 here would fail: read_head sees status 100 and no framing
        assert_json_error(response, 413, "exceeds", str(LIMIT))
        assert response.header("connection") == "close"
        assert wire.closed_by_server()


# --- body size limit ---------------------------------------------------------------------------------


def test_content_length_over_limit_rejected_before_the_body(limited: ServerProcess) -> None:
    with Wire(limited.port) as bystander:
        health(bystander)  # a keep-alive connection open throughout
        with Wire(limited.port) as wire:
            started = time.monotonic()
            wire.send(request("POST", "/v2/models/tiny/infer", headers={"Content-Length": str(LIMIT + 1)}))
            response = wire.read_response()  # no body byte sent: the answer must not wait for one
            assert time.monotonic() - started < 5
            assert_json_error(response, 413, "exceeds", str(LIMIT), "--http-max-body-bytes")
            assert response.header("connection") == "close"
            assert wire.closed_by_server()
        with Wire(limited.port) as wire:  # a huge announced length, same answer
            wire.send(request("POST", "/v2/models/rank/infer", headers={"Content-Length": str(10**12)}))
            assert_json_error(wire.read_response(), 413, "exceeds")
            assert wire.closed_by_server()
        health(bystander)
    still_serving(limited)


def test_body_of_exactly_the_limit_is_accepted(limited: ServerProcess) -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    body = tiny_json(values)
    body += b" " * (LIMIT - len(body))  # JSON allows trailing whitespace
    assert len(body) == LIMIT
    with Wire(limited.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", body))
        assert_tiny(wire.read_response(), values)


def test_chunked_body_over_limit_rejected(limited: ServerProcess) -> None:
    with Wire(limited.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", headers={"Transfer-Encoding": "chunked"}))
        wire.send(b"".join(_chunked(b" " * (LIMIT + 10), 1000))[:-5])  # over the limit, not yet finished
        response = wire.read_response()
        assert_json_error(response, 413, "exceeds", str(LIMIT))
        assert response.header("connection") == "close"
        assert wire.closed_by_server()
    still_serving(limited)


# --- malformed requests ------------------------------------------------------------------------------

MALFORMED = {
    "garbage": b"\x00\x01\x02 garbage garbage\r\n\r\n",
    "tls-client-hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)),
    "bad-version": b"GET /v2/health/ready HTTP/9.9\r\nHost: x\r\n\r\n",
    "space-in-target": b"GET /v2/health /ready HTTP/1.1\r\nHost: x\r\n\r\n",
    "header-without-colon": b"GET /v2/health/ready HTTP/1.1\r\nHost x\r\n\r\n",
    "bare-lf": b"GET /v2/health/ready HTTP/1.1\nHost: x\n\n",
    "content-length-letters": b"POST /v2/models/tiny/infer HTTP/1.1\r\nContent-Length: 12ab\r\n\r\n",
    "content-length-negative": b"POST /v2/models/tiny/infer HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
    "content-length-twice":
        b"POST /v2/models/tiny/infer HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    "content-length-and-chunked":
        b"POST /v2/models/tiny/infer HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "bad-chunk-size": b"POST /v2/models/tiny/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_request_gets_400_json_and_close(example_server: ServerProcess, data: bytes) -> None:
    with Wire(example_server.port) as wire:
        wire.send(data)
        response = wire.read_response()
        assert_json_error(response, 400)
        assert response.header("connection") == "close"
        assert wire.closed_by_server()
    still_serving(example_server)


def test_malformed_after_split_headers(example_server: ServerProcess) -> None:
    with Wire(example_server.port) as wire:
        wire.send(b"GET /v2/health/ready HTTP/1.1\r\nHo")
        time.sleep(0.05)
        wire.send(b"st: x\r\n\x01\x02\x03\r\n\r\n")
        assert_json_error(wire.read_response(), 400, "malformed")
        assert wire.closed_by_server()
    still_serving(example_server)


UPGRADES = {
    # what `curl --http2 http://...` sends
    "h2c": {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA"},
    "websocket": {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                  "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="},
}


@pytest.mark.parametrize("headers", UPGRADES.values(), ids=UPGRADES.keys())
def test_upgrade_request_is_answered_over_http11(example_server: ServerProcess, headers: dict[str, str]) -> None:
    """An Upgrade the server does not support is ignored (RFC 9110 §7.8: "A server MAY ignore a received
    Upgrade header field"); the request is answered over HTTP/1.1. `curl --http2 http://...` asks for h2c."""
    with Wire(example_server.port) as wire:
        wire.send(request("GET", "/v2/health/ready", headers=headers))
        response = wire.read_response()
        assert response.status == 200, (response.status, response.body)
    still_serving(example_server)


def test_absolute_form_target_without_path_is_a_client_error(example_server: ServerProcess) -> None:
    """`GET http://host HTTP/1.1` has no path; that is the client's error, not a 500 with a traceback."""
    with Wire(example_server.port) as wire:
        wire.send(b"GET http://127.0.0.1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        response = wire.read_response()
        assert 400 <= response.status < 500, (response.status, response.body)
    with Wire(example_server.port) as wire:  # with a path it is routed like origin-form
        wire.send(b"GET http://127.0.0.1/v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert wire.read_response().status == 200


def test_pipelined_request_before_a_malformed_one_is_answered_first(example_server: ServerProcess) -> None:
    """Responses go out in request order: the good request's answer, then the 400, then close."""
    values = [1.0, 2.0, 3.0, 4.0]
    with Wire(example_server.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", tiny_json(values)) + b"\x00\x01 garbage\r\n\r\n")
        assert_tiny(wire.read_response(), values)
        assert_json_error(wire.read_response(), 400)
        assert wire.closed_by_server()


def test_pipelined_request_before_an_oversized_one_is_answered_first(limited: ServerProcess) -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    with Wire(limited.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", tiny_json(values))
                  + request("POST", "/v2/models/tiny/infer", headers={"Content-Length": str(LIMIT + 1)}))
        assert_tiny(wire.read_response(), values)
        assert_json_error(wire.read_response(), 413, "exceeds")
        assert wire.closed_by_server()


def test_head_response_has_no_body(example_server: ServerProcess) -> None:
    """RFC 9110 §9.3.2: no content in a response to HEAD, else keep-alive framing breaks."""
    with Wire(example_server.port) as wire:
        wire.send(request("HEAD", "/v2/models/tiny") + request("GET", "/v2/health/ready"))
        status, _, _ = wire.read_head()  # a HEAD response: headers only, whatever its content-length says
        assert status in (200, 405)
        next_bytes = wire.read_exact(8)
        assert next_bytes == b"HTTP/1.1", f"body bytes after the HEAD response: {next_bytes + bytes(wire.buffer)!r}"


def test_oversized_header_section_is_refused(example_server: ServerProcess) -> None:
    """The body is bounded (--http-max-body-bytes), the header section is not: 8 MB of one header is read
    into memory and the request served. Expect 431/400 long before that (common limits: 8-64 KB)."""
    with Wire(example_server.port) as wire:
        try:
            wire.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (8 << 20) + b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused early and closed: fine, as long as the status says so
        try:
            status, _, _ = wire.read_head()
        except (ConnectionError, TimeoutError):
            status = 0
        assert status in (0, 400, 413, 431), f"an 8 MB header section was accepted: {status}"
    still_serving(example_server)


# --- client disconnects ------------------------------------------------------------------------------


def _reset(wire: Wire) -> None:
    """Close with RST instead of FIN."""
    wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wire.close()


def test_client_disconnects_mid_headers_mid_body_and_mid_request(example_server: ServerProcess,
                                                                  rank_features: np.ndarray) -> None:
    data = binary_infer("rank", {"features": rank_features}, "score")
    head_end = data.index(b"\r\n\r\n") + 4
    with Wire(example_server.port) as bystander:
        health(bystander)
        for abort in (Wire.close, _reset):
            wire = Wire(example_server.port)  # mid request line / headers
            wire.send(data[: head_end // 2])
            abort(wire)
            wire = Wire(example_server.port)  # mid body (direct-to-buffer path)
            wire.send(data[: head_end + 300_000])
            time.sleep(0.02)
            abort(wire)
            wire = Wire(example_server.port)  # mid chunked body
            wire.send(request("POST", "/v2/models/tiny/infer", headers={"Transfer-Encoding": "chunked"})
                      + b"10\r\n0123")
            time.sleep(0.02)
            abort(wire)
            wire = Wire(example_server.port)  # whole request sent, gone before the response
            wire.send(data)
            abort(wire)
            wire = Wire(example_server.port)  # several pipelined requests, gone while they are served
            wire.send(data + data + request("GET", "/v2/health/ready"))
            abort(wire)
            time.sleep(0.05)
        health(bystander)
    still_serving(example_server)


def test_half_close_is_a_disconnect(example_server: ServerProcess) -> None:
    """The server takes a client's EOF as a disconnect, as uvicorn and nginx do: it cannot tell a
    half-close (`nc -N`) from a close, and a closed client's queued request must be dropped. So the
    connection is closed promptly (a response that was already written may still arrive first),
    and the server keeps serving."""
    values = [1.0, 2.0, 3.0, 4.0]
    with Wire(example_server.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", tiny_json(values)))
        wire.sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + TIMEOUT
        try:
            while wire.sock.recv(65536):  # a response written before the EOF was read may come first
                assert time.monotonic() < deadline, "the server kept the half-closed connection open"
        except ConnectionResetError:
            pass
    with Wire(example_server.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", tiny_json(values)))
        assert_tiny(wire.read_response(), values)


# --- paths -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/models/t%69ny/ready", "/v2/models/%74%69%6E%79/ready",
                                  "/v2/models/%74%69%6e%79/versions/%31/ready"])
def test_percent_encoded_model_name_is_decoded(example_server: ServerProcess, path: str) -> None:
    with Wire(example_server.port) as wire:
        wire.send(request("GET", path))
        assert wire.read_response().status == 200
        values = [2.0, 2.0, 2.0, 2.0]
        wire.send(request("POST", path.removesuffix("/ready") + "/infer", tiny_json(values)))
        response = wire.read_response()
        assert_tiny(response, values)
        wire.send(request("GET", path.removesuffix("/ready").split("/versions")[0]))
        assert wire.read_response().json()["name"] == "tiny"


def test_percent_encoded_unknown_model_is_not_ready(example_server: ServerProcess) -> None:
    with Wire(example_server.port) as wire:
        wire.send(request("GET", "/v2/models/t%69ny2/ready") + request("GET", "/v2/models/%C3%A9/ready"))
        assert wire.read_response().status == 400
        assert wire.read_response().status == 400


def test_query_string_does_not_change_the_route(example_server: ServerProcess) -> None:
    with Wire(example_server.port) as wire:
        wire.send(request("GET", "/v2/health/ready?probe=1&x=%2F"))
        assert wire.read_response().status == 200


# --- concurrency -------------------------------------------------------------------------------------


def test_many_concurrent_keep_alive_connections(example_server: ServerProcess) -> None:
    threads, per_thread = 64, 20
    barrier = threading.Barrier(threads, timeout=TIMEOUT)
    failures: list[str] = []
    done = [0] * threads

    def client(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", example_server.port, timeout=TIMEOUT)
        try:
            connection.connect()
            sock = connection.sock
            barrier.wait()
            for j in range(per_thread):
                values = [float(index), float(j), -float(index), 0.5]
                connection.request("POST", "/v2/models/tiny/infer", body=tiny_json(values, f"{index}-{j}"),
                                   headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                body = response.read()
                if response.status != 200:
                    failures.append(f"{index}-{j}: {response.status} {body[:200]!r}")
                    return
                document = json.loads(body)
                if document["id"] != f"{index}-{j}" or document["outputs"][0]["data"] != tiny_expected(values):
                    failures.append(f"{index}-{j}: wrong answer {document}")
                    return
                if connection.sock is not sock:
                    failures.append(f"{index}-{j}: connection was not kept alive")
                    return
                done[index] += 1
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(f"{index}: {type(exc).__name__}: {exc}")
        finally:
            connection.close()

    workers = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=25)
    assert not any(worker.is_alive() for worker in workers), "clients still running after 25 s"
    assert not failures, failures[:5]
    assert sum(done) == threads * per_thread


# --- response headers --------------------------------------------------------------------------------


def test_response_framing_and_headers(example_server: ServerProcess) -> None:
    """content-length is exact (responses pipelined back to back parse cleanly), content-type is set."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    values = [1.0, 2.0, 3.0, 4.0]
    with Wire(example_server.port) as wire:
        wire.send(
            request("POST", "/v2/models/tiny/infer", tiny_json(values))
            + binary_infer("tiny", {"x": x}, "y")
            + request("GET", "/v2/health/ready")
            + request("GET", "/v2/nowhere")
            + request("POST", "/v2/models/tiny/infer", b"{not json")
            + request("GET", "/v2")
        )
        responses = [wire.read_response() for _ in range(6)]
        assert wire.silent()  # nothing beyond what the content-lengths announced

    for response in responses:
        assert response.header("content-length") == str(len(response.body))
        assert response.header("transfer-encoding") is None
        assert response.header("connection") is None

    json_infer, binary, ready, missing, bad, metadata = responses
    assert_tiny(json_infer, values)
    assert json_infer.header(HEADER_LENGTH) is None

    document, y = binary_output(binary)
    assert document["outputs"][0]["parameters"]["binary_data_size"] == x.nbytes
    np.testing.assert_array_equal(y, 2 * x + 1)
    assert int(binary.header(HEADER_LENGTH) or 0) == len(binary.body) - x.nbytes

    assert ready.status == 200 and ready.body == b"" and ready.header("content-length") == "0"
    assert_json_error(missing, 404)
    assert_json_error(bad, 400)
    assert metadata.status == 200 and metadata.header("content-type") == "application/json"
    assert metadata.json()["name"] == "modelhost"
