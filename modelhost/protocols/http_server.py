"""HTTP/1.1 server for the ASGI app: asyncio + httptools (parsing), bodies read straight into one buffer.

Why not uvicorn: for a 2 MB tensor body uvicorn's flow control (pause at 64 KB, one ASGI
message per chunk, a bytes copy per chunk, then our join) cost 1.9 ms per request on
loopback where the socket itself needs 0.4 ms (benchmarks/http_stack). Here a request with
Content-Length gets a bytearray of that size and the kernel writes the body into it
(asyncio.BufferedProtocol): no copy in Python, one `http.request` message per request.

Scope: HTTP/1.1 and 1.0, keep-alive, pipelining (answered in order), Content-Length and
chunked request bodies, `Expect: 100-continue`, a body size limit checked before reading,
write back-pressure, and graceful shutdown (stop listening, finish in-flight requests,
close idle connections, then the ASGI lifespan shutdown).
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import httptools
import orjson

log = logging.getLogger("modelhost.http")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

_READ_SIZE = 256 * 1024
_MAX_PIPELINE = 16
_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


class _Request:
    __slots__ = ("method", "url", "headers", "body", "version", "keep_alive", "chunks", "chunked_size")

    def __init__(self) -> None:
        self.method = b""
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: bytearray | bytes = b""
        self.version = "1.1"
        self.keep_alive = True
        self.chunks: list[bytes] | None = None
        self.chunked_size = 0


class HttpServer:
    """Serves one ASGI app on host:port until SIGTERM/SIGINT (or `stop()`)."""

    def __init__(self, app: ASGIApp, host: str, port: int, max_body_bytes: int, graceful_seconds: float,
                 idle_seconds: float = 75.0) -> None:
        self.app = app
        self.host, self.port = host, port
        self.max_body_bytes = max_body_bytes
        self.graceful_seconds = graceful_seconds
        self.idle_seconds = idle_seconds
        self.connections: set[HttpConnection] = set()
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.stop)
        lifespan = _Lifespan(self.app)
        await lifespan.startup()
        server = await loop.create_server(lambda: HttpConnection(self), self.host, self.port, backlog=2048)
        log.info("HTTP listening on %s:%d", self.host, self.port)
        await self._stopping.wait()
        log.info("shutting down: no new connections, finishing %d open", len(self.connections))
        server.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        deadline = loop.time() + self.graceful_seconds
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.abort()
        await lifespan.shutdown()


class HttpConnection(asyncio.BufferedProtocol):
    """One client connection. Callbacks run on the loop; requests are answered in arrival order."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._read_buffer = bytearray(_READ_SIZE)
        self._parser = httptools.HttpRequestParser(self)
        self._request = _Request()
        self._direct: memoryview | None = None  # unread remainder of a Content-Length body
        self._pipeline: collections.deque[_Request] = collections.deque()
        self._worker: asyncio.Task[None] | None = None
        self._busy = False
        self._closing = False
        self._disconnected = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._client: tuple[str, int] | None = None
        self._callback_error = ""

    # asyncio protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not an asyncio.Transport
        peer = transport.get_extra_info("peername")
        self._client = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        self._server.connections.add(self)
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._disconnected.set()
        self._writable.set()
        self._cancel_idle_timer()

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        return self._direct if self._direct is not None else self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self._cancel_idle_timer()
        if self._direct is not None:
            self._direct = self._direct[nbytes:]
            if not len(self._direct):
                self._direct = None
                self._parser = httptools.HttpRequestParser(self)
                self.on_message_complete()
            return
        try:
            self._parser.feed_data(memoryview(self._read_buffer)[:nbytes])
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            # httptools replaces exceptions raised in callbacks by its own "callback error".
            self._reject(400, self._callback_error or f"malformed HTTP request: {exc}")
        if self._direct is None and not self._busy and not self._pipeline:
            self._arm_idle_timer()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # httptools parser callbacks

    def on_message_begin(self) -> None:
        self._request = _Request()

    def on_url(self, url: bytes) -> None:
        self._request.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._request.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        request = self._request
        request.method = self._parser.get_method()
        request.version = self._parser.get_http_version()
        request.keep_alive = self._parser.should_keep_alive()
        length = _content_length(request.headers)
        if length is not None and length > self._server.max_body_bytes:
            self._fail(f"request body of {length} bytes exceeds the {self._server.max_body_bytes}-byte limit "
                       "(--http-max-body-bytes)")
        if length:
            request.body = bytearray(length)
            self._direct = memoryview(request.body)
        elif length is None and (b"transfer-encoding", b"chunked") in request.headers:
            request.chunks = []
        if (b"expect", b"100-continue") in request.headers and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._direct is not None:
            self._direct[: len(body)] = body
            self._direct = self._direct[len(body) :]
        elif self._request.chunks is not None:
            self._request.chunks.append(bytes(body))
            self._request.chunked_size += len(body)
            if self._request.chunked_size > self._server.max_body_bytes:
                self._fail(f"request body exceeds the {self._server.max_body_bytes}-byte limit (--http-max-body-bytes)")

    def on_message_complete(self) -> None:
        # A Content-Length body that did not fit in this read keeps arriving through get_buffer.
        if self._direct is not None and len(self._direct):
            return
        self._direct = None
        request = self._request
        if request.chunks is not None:
            request.body = b"".join(request.chunks)
            request.chunks = None
        self._pipeline.append(request)
        if len(self._pipeline) >= _MAX_PIPELINE and self._transport is not None:
            self._transport.pause_reading()
        if self._worker is None or self._worker.done():
            self._worker = self._loop.create_task(self._run_pipeline())

    # serving

    async def _run_pipeline(self) -> None:
        while self._pipeline and not self._disconnected.is_set():
            request = self._pipeline.popleft()
            if self._transport is not None and not self._closing:
                self._transport.resume_reading()
            self._busy = True
            try:
                await _Exchange(self, request).run()
            finally:
                self._busy = False
            if not request.keep_alive or self._closing:
                self._close()
                return
        self._arm_idle_timer()

    @property
    def app(self) -> ASGIApp:
        return self._server.app

    async def write(self, parts: list[bytes]) -> None:
        if self._transport is None or self._disconnected.is_set():
            return
        self._transport.writelines(parts)
        if not self._writable.is_set():
            await self._writable.wait()

    def scope(self, request: _Request) -> dict[str, Any]:
        url = httptools.parse_url(request.url)
        sockname = self._transport.get_extra_info("sockname") if self._transport else None
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.version,
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": unquote(url.path.decode("latin-1")),
            "raw_path": url.path,
            "query_string": url.query or b"",
            "root_path": "",
            "headers": request.headers,
            "client": self._client,
            "server": sockname[:2] if isinstance(sockname, tuple) else None,
        }

    @property
    def disconnected(self) -> asyncio.Event:
        return self._disconnected

    def close_when_idle(self) -> None:
        self._closing = True
        if not self._busy and not self._pipeline:
            self._close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def _fail(self, message: str) -> None:
        self._callback_error = message
        raise ValueError(message)

    def _reject(self, status: int, message: str) -> None:
        if self._transport is not None:
            body = orjson.dumps({"error": message})
            head = _head(status, [(b"content-type", b"application/json")], len(body), False)
            self._transport.writelines([head, body])
        self._direct = None
        self._close()

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        self._idle_timer = self._loop.call_later(self._server.idle_seconds, self._close)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None


class _Exchange:
    """One request and its response through the ASGI app."""

    def __init__(self, connection: HttpConnection, request: _Request) -> None:
        self._connection = connection
        self._request = request
        self._body_delivered = False
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_written = False
        self._chunked = False
        self._finished = False

    async def run(self) -> None:
        try:
            await self._connection.app(self._connection.scope(self._request), self._receive, self._send)
        except Exception:
            log.exception("ASGI application failed")
            if not self._status:
                body = orjson.dumps({"error": "internal server error"})
                head = _head(500, [(b"content-type", b"application/json")], len(body), self._request.keep_alive)
                await self._connection.write([head, body])
                return
        if not self._finished:
            self._request.keep_alive = False

    async def _receive(self) -> dict[str, Any]:
        if not self._body_delivered:
            self._body_delivered = True
            return {"type": "http.request", "body": self._request.body, "more_body": False}
        await self._connection.disconnected.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._status = message["status"]
            self._headers = list(message.get("headers", ()))
            return
        if message["type"] != "http.response.body" or self._finished:
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        parts: list[bytes] = []
        if not self._head_written:
            length = _content_length(self._headers)
            if length is None and not more:
                length = len(body)
            self._chunked = length is None
            parts.append(_head(self._status, self._headers, length, self._request.keep_alive))
            self._head_written = True
        if self._chunked:
            if body:
                parts += (b"%x\r\n" % len(body), body, b"\r\n")
            if not more:
                parts.append(b"0\r\n\r\n")
        elif body:
            parts.append(body)
        self._finished = not more
        await self._connection.write(parts)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"invalid Content-Length {value!r}") from None
    return None


def _head(status: int, headers: list[tuple[bytes, bytes]], length: int | None, keep_alive: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b""))]
    lines += [name + b": " + value for name, value in headers if name.lower() != b"content-length"]
    lines.append(b"content-length: %d" % length if length is not None else b"transfer-encoding: chunked")
    if not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


class _Lifespan:
    """Runs the ASGI lifespan protocol around serving; an app without it is fine."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self._task = asyncio.create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        reply = await self._outbox.get()
        if reply["type"] == "lifespan.startup.failed":
            raise RuntimeError(f"application startup failed: {reply.get('message', '')}")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._outbox.get()

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        try:
            await self._app(scope, self._inbox.get, self._outbox.put)
        except Exception:
            log.debug("application does not support the lifespan protocol", exc_info=True)
            await self._outbox.put({"type": "lifespan.startup.complete"})
