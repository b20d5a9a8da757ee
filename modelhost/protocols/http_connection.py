"""One HTTP/1.1 client connection: httptools parses, the kernel writes bodies straight into one buffer.

A request with Content-Length gets a bytearray of that size and, through
asyncio.BufferedProtocol, the rest of its body is read directly into it: no copy in
Python, and the app receives it as one `http.request` message. Requests are answered
in arrival order (pipelining); callbacks run on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httptools
import orjson

from modelhost.core.load import ServerLoad

if TYPE_CHECKING:
    from modelhost.protocols.http_server import HttpServer

log = logging.getLogger("modelhost.http")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

_READ_SIZE = 256 * 1024
_MAX_PIPELINE = 16
_MAX_HEAD_BYTES = 64 * 1024  # request line + headers of one request
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

class HttpConnection(asyncio.BufferedProtocol):
    """One client connection. Callbacks run on the loop; requests are answered in arrival order."""

    def __init__(self, server: HttpServer, app: ASGIApp, load: ServerLoad) -> None:
        self._server = server
        self._app = app
        self._load = load
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
        self._last_activity = 0.0
        self._client: tuple[str, int] | None = None
        self._callback_error = ""
        self._in_head = False  # between on_message_begin and on_headers_complete
        self._head_bytes = 0
        self._rejection: list[bytes] | None = None  # a 4xx waiting for the requests queued before it
        self._reading_stopped = False  # nothing more is parsed on this connection

    # asyncio protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not an asyncio.Transport
        peer = transport.get_extra_info("peername")
        self._client = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        self._server.connections.add(self)
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._load.in_progress -= len(self._pipeline)  # received, never to be answered
        self._pipeline.clear()
        self._disconnected.set()
        self._writable.set()
        self._cancel_idle_timer()
        # Nobody is left to answer: cancelling drops a request still queued for a model before it runs.
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()

    def eof_received(self) -> bool | None:
        # The client's EOF is a disconnect, as uvicorn and nginx take it: a half-close cannot be told
        # from a close, and a client that closed (a timeout in requests or tritonclient does) must
        # have its queued request dropped. Returning None closes the transport: connection_lost follows.
        return None

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        return self._direct if self._direct is not None else self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        # Any read restarts the idle clock, so a client that stops halfway through a body is cut off too.
        self._last_activity = self._loop.time()
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
            # Upgrades (h2c from `curl --http2`, websocket) are not supported: ignore them (RFC 9110 7.8) and
            # answer the request over HTTP/1.1, then close (llhttp parses nothing after an upgrade request).
            if self._pipeline:
                self._pipeline[-1].keep_alive = False
                self._stop_reading()
            else:
                self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            # httptools replaces exceptions raised in callbacks by its own "callback error".
            self._reject(400, self._callback_error or f"malformed HTTP request: {exc}")
            return
        # httptools buffers an unfinished request line or header; bound what a client can make it hold.
        # Only reads that end with the header section still open count, so body bytes never do.
        if self._in_head:
            self._head_bytes += nbytes
            if self._head_bytes > _MAX_HEAD_BYTES:
                self._reject(431, f"request line and headers exceed {_MAX_HEAD_BYTES} bytes")

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # httptools parser callbacks

    def on_message_begin(self) -> None:
        self._request = _Request()
        self._in_head, self._head_bytes = True, 0

    def on_url(self, url: bytes) -> None:
        self._request.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._request.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._in_head = False
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
        elif length is None and any(name == b"transfer-encoding" for name, _ in request.headers):
            request.chunks = []  # llhttp accepts a request Transfer-Encoding only when its last coding is chunked
        expect = any(name == b"expect" and value.lower() == b"100-continue" for name, value in request.headers)
        if expect and request.version == "1.1" and self._transport is not None:
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
        self._load.in_progress += 1
        if len(self._pipeline) >= _MAX_PIPELINE and self._transport is not None:
            self._transport.pause_reading()
        if self._worker is None or self._worker.done():
            self._worker = self._loop.create_task(self._run_pipeline())

    # serving

    async def _run_pipeline(self) -> None:
        while self._pipeline and not self._disconnected.is_set():
            request = self._pipeline.popleft()
            if self._transport is not None and not self._closing and not self._reading_stopped:
                self._transport.resume_reading()
            self._busy = True
            try:
                await _Exchange(self, request).run()
            finally:
                self._busy = False
                self._load.in_progress -= 1
            if not request.keep_alive or self._closing:
                self._close()
                return
        if self._rejection is not None and self._transport is not None and not self._disconnected.is_set():
            self._transport.writelines(self._rejection)
        if self._rejection is not None:
            self._close()
            return
        self._arm_idle_timer()

    @property
    def app(self) -> ASGIApp:
        return self._app

    async def write(self, parts: list[bytes]) -> None:
        if self._transport is None or self._disconnected.is_set():
            return
        self._transport.writelines(parts)
        if not self._writable.is_set():
            await self._writable.wait()

    def scope(self, request: _Request) -> dict[str, Any]:
        url = httptools.parse_url(request.url)
        path = url.path or b"/"  # absolute-form "http://host" has an empty path
        sockname = self._transport.get_extra_info("sockname") if self._transport else None
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.version,
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": unquote(path.decode("latin-1")),
            "raw_path": path,
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
        self._direct = None
        body = orjson.dumps({"error": message})
        response = [_head(status, [(b"content-type", b"application/json")], len(body), False), body]
        if self._busy or self._pipeline:  # answer the requests received before this one first, in order
            self._rejection = response
            self._stop_reading()
            return
        if self._transport is not None:
            self._transport.writelines(response)
        self._close()

    def _stop_reading(self) -> None:
        self._reading_stopped = True
        if self._transport is not None:
            self._transport.pause_reading()

    def _arm_idle_timer(self) -> None:
        # One timer per idle period, not one per read: reads only stamp _last_activity, and the timer
        # re-arms itself for what is left when there was activity since it was set.
        self._last_activity = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(self._server.idle_seconds, self._on_idle)

    def _on_idle(self) -> None:
        self._idle_timer = None
        left = self._last_activity + self._server.idle_seconds - self._loop.time()
        if self._busy or self._pipeline or left > 0:  # answering a request is not idleness
            self._idle_timer = self._loop.call_later(max(left, 0.0) or self._server.idle_seconds, self._on_idle)
        else:
            self._close()

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
        if self._request.method == b"HEAD":  # RFC 9110 9.3.2: the header section of a GET, no content
            parts = parts[:1] if parts and parts[0].startswith(b"HTTP/1.1 ") else []
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
