"""The HTTP/1.1 server (modelhost/protocols/http/), spoken to byte by byte: connections and how bodies arrive.

Keep-alive, pipelining, bodies split across sends, chunked bodies and `Expect: 100-continue`, against the session's
`example_server` (rank, deepfm, tiny); tensor results are checked against onnxruntime run in this process.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.protocols.http_wire import (
    ATOL,
    CONTINUE,
    LIMIT,
    RTOL,
    TIMEOUT,
    Reference,
    Wire,
    assert_json_error,
    assert_tiny,
    binary_infer,
    binary_output,
    chunked,
    health,
    request,
    tiny_expected,
    tiny_json,
)
from tests.server import ServerProcess

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


def test_chunked_request_body(example_server: ServerProcess) -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    head = request("POST", "/v2/models/tiny/infer", headers={"Transfer-Encoding": "chunked"})
    with Wire(example_server.port) as wire:
        wire.send(head)  # then the chunks, each in its own send
        for chunk in chunked(tiny_json(values), 17, extension=True):
            time.sleep(0.005)
            wire.send(chunk)
        assert_tiny(wire.read_response(), values)
        # again, everything in one send, plus a trailer, and a pipelined request behind it
        chunks = b"".join(chunked(tiny_json(values[:4]), 5))[:-2] + b"X-Trailer: yes\r\n\r\n"
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
        wire.send(request("POST", "/v2/models/tiny/infer", b"".join(chunked(tiny_json(values), 32)),
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


def test_expect_100_continue_over_limit_gets_413_without_continue(body_limited: ServerProcess) -> None:
    with Wire(body_limited.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", headers={
            "Expect": "100-continue", "Content-Length": str(LIMIT + 1)}))
        response = wire.read_response()  # a 100 here would fail: read_head sees status 100 and no framing
        assert_json_error(response, 413, "exceeds", str(LIMIT))
        assert response.header("connection") == "close"
        assert wire.closed_by_server()


