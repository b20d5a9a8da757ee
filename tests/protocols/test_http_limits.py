"""The HTTP transport's defences (HttpLimits): memory, connections, deadlines and framing limits.

Raw sockets against real servers; memory is the server process's RSS from /proc/<pid>/status. Three
servers on the example repository: `roomy` (default limits, for memory), `strict` (1 s deadlines and a
16 MiB buffer budget) and `capped` (20 connections); the framing cases use the session's example_server.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
import tracemalloc
import weakref
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvloop

from modelhost.core.in_flight import InFlight
from modelhost.protocols.http.connection import HttpConnection
from modelhost.protocols.http.limits import HttpLimits
from modelhost.protocols.http.server import HttpServer
from modelhost.settings import ServerSettings, SettingsError
from modelhost.settings_checks import check_settings
from tests.protocols.http_wire import (
    Wire,
    assert_json_error,
    assert_tiny,
    request,
    still_serving,
    tiny_json,
)
from tests.server import ServerProcess

MIB = 1024**2
STRICT = ["--http-head-timeout-seconds", "1", "--http-body-timeout-seconds", "1", "--http-min-body-rate", "2000",
          "--http-send-timeout-seconds", "1", "--http-max-buffered-bytes", "16MiB", "--http-max-body-bytes", "16MiB"]


def rss_mib(server: ServerProcess) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def peak_rss_mib(server: ServerProcess, seconds: float) -> float:
    peak, deadline = 0.0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, rss_mib(server))
        time.sleep(0.05)
    return peak


def settled_rss_mib(server: ServerProcess, below: float, seconds: float = 10.0) -> float:
    """RSS once it drops below `below` MiB, or what it is after `seconds`."""
    deadline = time.monotonic() + seconds
    while (rss := rss_mib(server)) >= below and time.monotonic() < deadline:
        time.sleep(0.1)
    return rss


def timed_tiny(port: int) -> float:
    values = [1.0, 2.0, 3.0, 4.0]
    with Wire(port) as wire:
        started = time.monotonic()
        wire.send(request("POST", "/v2/models/tiny/infer", tiny_json(values)))
        response = wire.read_response()
        elapsed = time.monotonic() - started
    assert_tiny(response, values)
    return elapsed


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def push(sock: socket.socket, data: bytes, seconds: float) -> int:
    """Send what the server takes within `seconds` without blocking; the bytes sent."""
    sock.setblocking(False)
    sent, deadline = 0, time.monotonic() + seconds
    view = memoryview(data)
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += sock.send(view[sent : sent + MIB])
        except BlockingIOError:
            time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):  # answered and closed already
            break
    sock.settimeout(10)
    return sent


def padded_tiny(size: int) -> bytes:
    body = tiny_json([1.0, 2.0, 3.0, 4.0])
    return body + b" " * (size - len(body))  # JSON allows trailing whitespace


@pytest.fixture(scope="module")
def repository(example_server: ServerProcess) -> Path:
    return example_server.example_repository


@pytest.fixture(scope="module")
def roomy(repository: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(repository, "--grpc-port", "0", "--sagemaker-port", "0").wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def strict(repository: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(repository, "--grpc-port", "0", "--sagemaker-port", "0", *STRICT).wait_ready()
    yield server
    server.stop()


# --- memory -------------------------------------------------------------------------------------------


def test_declared_content_length_is_not_allocated_up_front(roomy: ServerProcess) -> None:
    """100 clients declare 16 MiB bodies and send 1 KiB: memory follows the bytes, not the declarations
    (before: a bytearray of the declared size each, 1.6 GiB), and a tiny request is still served at once."""
    before = rss_mib(roomy)
    socks = []
    try:
        for _ in range(100):
            sock = connect(roomy.port)
            sock.sendall(request("POST", "/v2/models/tiny/infer", headers={"Content-Length": str(16 * MIB)})
                         + b" " * 1024)
            socks.append(sock)
        grown = peak_rss_mib(roomy, 1.0) - before
        assert grown < 48, f"RSS grew {grown:.0f} MiB for 100 KiB of body bytes received"
        assert timed_tiny(roomy.port) < 1.0
    finally:
        for sock in socks:
            sock.close()
    after = settled_rss_mib(roomy, before + 16)
    assert after < before + 16, f"RSS {after:.0f} MiB after the clients left, {before:.0f} before"


def test_idle_and_slow_header_connections_are_cheap_and_memory_returns(roomy: ServerProcess) -> None:
    """1,000 connections (half idle, half in the middle of a head) cost little memory each (before: a
    256 KiB read buffer each), a tiny request is served meanwhile, and memory returns after they leave."""
    before = rss_mib(roomy)
    socks = []
    try:
        for index in range(1000):
            sock = connect(roomy.port)
            if index % 2:
                sock.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(sock)
        grown = peak_rss_mib(roomy, 1.0) - before
        assert grown < 64, f"RSS grew {grown:.0f} MiB for 1,000 connections"
        assert timed_tiny(roomy.port) < 1.0
    finally:
        for sock in socks:
            sock.close()
    after = settled_rss_mib(roomy, before + 16)
    assert after < before + 16, f"RSS {after:.0f} MiB after the clients left, {before:.0f} before"
    still_serving(roomy)


def _infer_binary_tiny(rows: int) -> bytes:
    """A tiny request with a binary input of `rows` x 4 and a JSON output (about twice the input's size)."""
    data = np.arange(rows * 4, dtype=np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4],
                                     "parameters": {"binary_data_size": len(data)}}]}).encode()
    return request("POST", "/v2/models/tiny/infer", header + data,
                   {"Inference-Header-Content-Length": str(len(header))})


def test_pipelined_bodies_are_capped_by_bytes() -> None:
    """While a request is being answered, pipelined requests behind it are read only up to 1 MiB
    (--http-max-pipeline-bytes), not up to 16 of them (12 x 2 MiB here). In-process, with an app that holds
    the first request, so that Python's own allocations (tracemalloc) can be counted."""
    body = b" " * (2 * MIB)
    data = b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n" + request("POST", "/", body) * 12

    async def main() -> int:
        release = asyncio.Event()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            if scope["path"] == "/hold":
                await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        server = HttpServer([], "127.0.0.1", HttpLimits(max_pipeline_bytes=MIB), 1.0)
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(partial(HttpConnection, server, app, InFlight()), "127.0.0.1", 0)
        sock = connect(listener.sockets[0].getsockname()[1])
        base = tracemalloc.get_traced_memory()[0]
        sender = loop.run_in_executor(None, sock.sendall, data)
        await asyncio.sleep(1.0)
        held = tracemalloc.get_traced_memory()[0] - base
        release.set()
        await sender
        responses = await loop.run_in_executor(None, _read_oks, sock, 13)
        sock.close()
        listener.close()
        assert responses == 13
        return held

    tracemalloc.start()
    try:
        held = uvloop.run(main())
    finally:
        tracemalloc.stop()
    assert held < 8 * MIB, f"{held / MIB:.1f} MiB held for requests waiting behind the one being answered"


def _read_oks(sock: socket.socket, count: int) -> int:
    received = b""
    while received.count(b"ok") < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received.count(b"HTTP/1.1 200")


def test_buffer_budget_bounds_memory_and_drains(strict: ServerProcess) -> None:
    """12 clients each push 12 MiB of a 16 MiB body into a server with a 16 MiB budget: it holds about the
    budget plus one body (the oldest, which always proceeds), not 192 MiB; the stalled bodies are answered
    (408 too slow, or 503 + Retry-After while waiting for budget) and the server serves normally after."""
    before = rss_mib(strict)
    head = request("POST", "/v2/models/tiny/infer", headers={"Content-Length": str(16 * MIB)})
    hogs: list[socket.socket] = []
    try:
        for _ in range(12):
            hogs.append(connect(strict.port))
            push(hogs[-1], head + b" " * (12 * MIB), 0.1)
        grown = peak_rss_mib(strict, 0.5) - before
        assert grown < 80, f"RSS grew {grown:.0f} MiB with a 16 MiB budget"
        for hog in hogs:
            wire = Wire.__new__(Wire)
            wire.sock, wire.buffer = hog, bytearray()
            response = wire.read_response()
            assert response.status in (408, 503), (response.status, response.body)
            if response.status == 503:
                assert_json_error(response, 503, "--http-max-buffered-bytes")
                assert response.header("retry-after") == "1"
            else:
                assert_json_error(response, 408, "--http-min-body-rate")
    finally:
        for hog in hogs:
            hog.close()
    still_serving(strict)


def test_closed_connections_are_freed_without_the_cycle_collector() -> None:
    """A closed connection is freed by reference counting alone: its parser and transport no longer refer
    back to it (before: it lived, with its buffers, until a cyclic garbage collection)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> list[weakref.ref[HttpConnection]]:
        server = HttpServer([], "127.0.0.1", HttpLimits(), 1.0)
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(partial(HttpConnection, server, app, InFlight()), "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        refs = []
        for _ in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await reader.readuntil(b"ok")
            refs += [weakref.ref(connection) for connection in server.connections]
            writer.close()
            await writer.wait_closed()
        for _ in range(100):
            if not server.connections:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        listener.close()
        return refs

    gc.collect()
    gc.disable()
    try:
        refs = uvloop.run(main())
        alive = sum(ref() is not None for ref in refs)
    finally:
        gc.enable()
    assert refs and alive == 0, f"{alive} of {len(refs)} closed connections still alive without gc"


# --- connections --------------------------------------------------------------------------------------


def test_connections_over_the_cap_get_503(repository: Path) -> None:
    server = ServerProcess(repository, "--grpc-port", "0", "--sagemaker-port", "0",
                           "--http-max-connections", "20").wait_ready()
    wires: list[Wire] = []
    try:
        refused = None
        for _ in range(25):
            wire = Wire(server.port)
            wires.append(wire)
            wire.send(request("GET", "/v2/health/ready"))
            response = wire.read_response()
            if response.status != 200:
                refused = response
                break
        assert refused is not None, "25 connections open with --http-max-connections 20"
        assert 18 <= len(wires) - 1 <= 20, f"refused at connection {len(wires)}"
        assert_json_error(refused, 503, "--http-max-connections")
        assert refused.header("retry-after") == "1"
        assert wires[-1].closed_by_server()
        wires.pop().close()
        wires.pop().close()  # below the cap again
        time.sleep(0.2)
        with Wire(server.port) as wire:
            wire.send(request("GET", "/v2/health/ready"))
            assert wire.read_response().status == 200
    finally:
        for wire in wires:
            wire.close()
        server.stop()


# --- deadlines ----------------------------------------------------------------------------------------


def test_slow_header_client_gets_408(strict: ServerProcess) -> None:
    """A head trickled a line at a time (each byte used to reset the 75 s idle timer) is cut off once
    --http-head-timeout-seconds (1 s) has passed since its first byte."""
    with Wire(strict.port) as wire:
        started = time.monotonic()
        wire.send(b"GET /v2/health/ready HTTP/1.1\r\n")
        response = None
        for index in range(20):
            time.sleep(0.25)
            try:
                wire.send(b"X-Slow-%d: y\r\n" % index)
            except (BrokenPipeError, ConnectionResetError):
                break
            if not wire.silent(0.01):
                break
        response = wire.read_response()
        assert time.monotonic() - started < 3
        assert_json_error(response, 408, "--http-head-timeout-seconds")
        assert response.header("connection") == "close"


def test_connection_that_sends_nothing_is_closed(strict: ServerProcess) -> None:
    with Wire(strict.port) as wire:
        started = time.monotonic()
        assert wire.closed_by_server(timeout=5)
        assert time.monotonic() - started < 3


def test_slow_body_client_gets_408(strict: ServerProcess) -> None:
    """10 bytes every 0.25 s (40 B/s) against --http-min-body-rate 2000 over 1 s windows."""
    with Wire(strict.port) as wire:
        started = time.monotonic()
        wire.send(request("POST", "/v2/models/tiny/infer", headers={"Content-Length": "10000"}))
        for _ in range(20):
            try:
                wire.send(b" " * 10)
            except (BrokenPipeError, ConnectionResetError):
                break
            if not wire.silent(0.25):
                break
        response = wire.read_response()
        assert time.monotonic() - started < 4
        assert_json_error(response, 408, "--http-min-body-rate", "--http-body-timeout-seconds")


def test_body_at_a_fair_rate_over_several_windows_is_served(strict: ServerProcess) -> None:
    body = padded_tiny(24_000)
    with Wire(strict.port) as wire:
        wire.send(request("POST", "/v2/models/tiny/infer", body)[: -len(body)])
        wire.send_pieces(body, 4000, 0.3)  # 13 KB/s for 1.8 s
        assert_tiny(wire.read_response(), [1.0, 2.0, 3.0, 4.0])


def test_client_that_never_reads_is_cut_off(strict: ServerProcess) -> None:
    """Responses pile up for a client that never reads: once writing has been blocked for
    --http-send-timeout-seconds (1 s) the connection is aborted, instead of being held forever."""
    sock = connect(strict.port, rcvbuf=4096)
    data = _infer_binary_tiny(1024) * 400
    sock.setblocking(False)
    started, sent, reset = time.monotonic(), 0, False
    try:
        while time.monotonic() - started < 8 and not reset:
            try:
                sent += sock.send(data[sent % len(data) :])
            except BlockingIOError:
                time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                reset = True
        assert reset, "the server kept a connection whose client never reads for 8 s"
    finally:
        sock.close()
    still_serving(strict)


# --- framing: 4xx with a JSON error naming the limit -------------------------------------------------

LIMITS = {
    "url-64k": (b"GET /v2/health/ready?" + b"a" * 64_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
                "--http-max-url-bytes"),
    "url-256k": (b"GET /v2/health/ready?" + b"a" * 256_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
                 "--http-max-url-bytes"),
    "head-70k-one-send": (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n", 431,
                          "--http-max-head-bytes"),
    "head-many-fields": (b"GET /v2/health/ready HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200))
                         + b"\r\n", 431, "--http-max-headers"),
    "connect": (b"CONNECT x:80 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "CONNECT"),
    "bad-absolute-url": (b"GET http://[::1/v2 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "request target"),
}


@pytest.mark.parametrize("data,status,fragment", LIMITS.values(), ids=LIMITS.keys())
def test_framing_limits_get_4xx_json(example_server: ServerProcess, data: bytes, status: int, fragment: str) -> None:
    with Wire(example_server.port) as wire:
        try:
            wire.send(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the rest was read; the answer is still there to read
        response = wire.read_response()
        assert_json_error(response, status, fragment)
        assert response.header("connection") == "close"
    still_serving(example_server)


def test_head_limit_holds_when_the_head_is_trickled(example_server: ServerProcess) -> None:
    """The same limit when one header arrives in many small reads (httptools holds it meanwhile)."""
    with Wire(example_server.port) as wire:
        wire.send(b"GET /v2/health/ready HTTP/1.1\r\nX-Big: ")
        try:
            for _ in range(40):
                wire.send(b"b" * 4096)
                time.sleep(0.005)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert_json_error(wire.read_response(), 431, "--http-max-head-bytes")


def test_interleaved_partial_requests_on_many_connections(example_server: ServerProcess) -> None:
    """Connections share one read buffer: requests arriving in interleaved pieces on 50 connections
    are each answered with their own values."""
    wires = [Wire(example_server.port) for _ in range(50)]
    try:
        payloads = []
        for index, _ in enumerate(wires):
            values = [float(index), float(index + 1), 2.0, 3.0]
            payloads.append((values, request("POST", "/v2/models/tiny/infer", tiny_json(values))))
        for start, end in ((0, 20), (20, 45), (45, 70), (70, None)):  # request line, headers, body
            for wire, (_, data) in zip(wires, payloads):
                wire.send(data[start:end])
            time.sleep(0.01)
        for wire, (values, _) in zip(wires, payloads):
            assert_tiny(wire.read_response(), values)
    finally:
        for wire in wires:
            wire.close()


# --- settings -----------------------------------------------------------------------------------------


def test_buffer_budget_must_hold_a_body_of_the_limit() -> None:
    with pytest.raises(SettingsError, match="--http-max-buffered-bytes"):
        check_settings(ServerSettings(http_max_buffered_bytes=MIB, http_max_body_bytes=2 * MIB))
    with pytest.raises(SettingsError, match="--http-max-connections"):
        check_settings(ServerSettings(http_max_connections=0))
    check_settings(ServerSettings(http_min_body_rate=0))

