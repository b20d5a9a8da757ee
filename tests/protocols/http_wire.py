"""A small HTTP/1.1 client over a raw socket, and the checks the HTTP server tests share.

Every socket has a timeout, so a server that stops answering fails a test instead of hanging it.
"""


from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.helpers import error_message
from tests.server import ServerProcess

TIMEOUT = 10.0  # any single socket operation
RTOL, ATOL = 1e-5, 1e-6
Reference = Callable[[np.ndarray], np.ndarray]
LIMIT = 4096  # --http-max-body-bytes of the `body_limited` server (conftest.py)
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
    return error_message(response.header("content-type"), response.json(), *fragments)


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


def chunked(body: bytes, size: int, extension: bool = False) -> list[bytes]:
    chunks = []
    for start in range(0, len(body), size):
        part = body[start : start + size]
        chunks.append(b"%x%s\r\n" % (len(part), b";note=1" if extension else b"") + part + b"\r\n")
    return [*chunks, b"0\r\n\r\n"]
