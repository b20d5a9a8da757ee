"""The HTTP/1.1 server (modelhost/protocols/http/), spoken to byte by byte: limits, malformed input, disconnects.

The body limit (a second server with a small --http-max-body-bytes), malformed requests, clients that go away,
paths, many concurrent connections (`http.client`) and the response's framing and headers.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time

import numpy as np
import pytest

from tests.protocols.http_wire import (
    HEADER_LENGTH,
    LIMIT,
    TIMEOUT,
    Wire,
    assert_json_error,
    assert_tiny,
    binary_infer,
    binary_output,
    chunked,
    health,
    request,
    still_serving,
    tiny_expected,
    tiny_json,
)
from tests.server import ServerProcess

# --- body size limit ---------------------------------------------------------------------------------


def test_content_length_over_limit_rejected_before_the_body(body_limited: ServerProcess) -> None:
    with Wire(body_limited.port) as bystander:
        health(bystander)  # a keep-alive connection open throughout
        with Wire(body_limited.port) as wire:
            started = time.monotonic()
            wire.send(request("POST", "/v2/models/tiny/infer", headers={"Content-Length": str(LIMIT + 1)}))
            response = wire.read_response()  # no body byte sent: the answer must not wait for one
            assert time.monotonic() - started < 5
            assert_json_error(response, 413, "exceeds", str(LIMIT), "--http-max-body-bytes")
            assert response.header("connection") == "close"
            assert wire.closed_by_server()
        with Wire(body_limited.port) as wire:  # a huge announced length, same answer
            wire.send(request("POST", "/v2/models/rank/infer", headers={"Content-Length": str(10**12)}))
            assert_json_error(wire.read_response(), 413, "exceeds")
            assert wire.closed_by_server()
        health(bystander)
    still_serving(body_limited)


def test_body_of_exactly_the_limit_is_accepted(body_limited: ServerProcess) -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    body = tiny_json(values)
    body += b" " * (LIMIT - len(body))  # JSON allows trailing whitespace
    assert len(body) == LIMIT
    with Wire(body_limited.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", body))
        assert_tiny(wire.read_response(), values)


def test_chunked_body_over_limit_rejected(body_limited: ServerProcess) -> None:
    with Wire(body_limited.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", headers={"Transfer-Encoding": "chunked"}))
        wire.send(b"".join(chunked(b" " * (LIMIT + 10), 1000))[:-5])  # over the limit, not yet finished
        response = wire.read_response()
        assert_json_error(response, 413, "exceeds", str(LIMIT))
        assert response.header("connection") == "close"
        assert wire.closed_by_server()
    still_serving(body_limited)


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


def test_pipelined_request_before_an_oversized_one_is_answered_first(body_limited: ServerProcess) -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    with Wire(body_limited.port) as wire:
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
