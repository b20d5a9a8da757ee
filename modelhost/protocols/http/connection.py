"""One HTTP/1.1 client connection: httptools parses, the kernel writes bodies straight into their buffer.

Reads land in the server's one shared read buffer, or, for the rest of a Content-Length body, directly
in that body's bytearray through asyncio.BufferedProtocol: no copy in Python, and the app receives it as
one `http.request` message. Sharing the read buffer is safe because protocol callbacks run one at a time
on the loop and every parser callback gets (and keeps) a copy: httptools hands on_url/on_header/on_body
new bytes objects. A body buffer grows as bytes arrive (doubling, up to the declared Content-Length),
never on the client's word, and what it holds is charged to the server's BufferBudget until the request
is answered. Requests are answered in arrival order (pipelining).

HttpConnection here is the asyncio protocol, the serving of its pipeline and the control of its transport
(pausing reads, closing). Its other parts are mixins over the fields of ConnectionState (connection_state.py),
one concept each, so that a call between parts costs what a call within one class does: RequestParsing
(parsing.py: parser callbacks, head limits), BodyBuffer (body_buffer.py: growth within the budget), Refusals
(refusal.py: error answers, lingering close) and Deadlines (deadlines.py: every timeout, on one timer).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import unquote

import httptools

from modelhost.protocols.http.body_buffer import BodyBuffer
from modelhost.protocols.http.deadlines import Deadlines
from modelhost.protocols.http.exchange import ASGIApp, Exchange, Request
from modelhost.protocols.http.parsing import RequestParsing
from modelhost.protocols.http.refusal import Refusal, Refusals


class _Closed:
    """The parser's protocol once the connection is gone: the parser no longer keeps the connection alive."""


_CLOSED_PARSER = httptools.HttpRequestParser(_Closed())


class HttpConnection(RequestParsing, BodyBuffer, Refusals, Deadlines, asyncio.BufferedProtocol):
    """One client connection, made as HttpConnection(server, app, in_flight) (ConnectionState.__init__).
    Callbacks run on the loop; requests are answered in arrival order."""

    # asyncio protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not an asyncio.Transport
        peer = transport.get_extra_info("peername")
        self._client = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        self._over_capacity = len(self._server.connections) >= self._limits.max_connections
        self._server.connection_opened(self)
        self._head_since = self._loop.time()  # the first head is due within head_timeout of the accept
        self._schedule(self._head_since + self._limits.head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._in_flight.requests -= len(self._pipeline)  # received, never to be answered
        for request in (*self._pipeline, self._request):
            self._release(request)
        self._pipeline.clear()
        self._pipeline_bytes = 0
        self._budget.forget(self)
        self._budget.release(self._head_charge)
        self._head_charge = 0
        self._drop_body()
        self._disconnected.set()
        self._writable.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Nobody is left to answer: cancelling drops a request still queued for a model before it runs.
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
        # The parser and the transport refer back to this object: break the cycles now, so a closed
        # connection is freed at once rather than at the next cyclic garbage collection.
        self._parser = _CLOSED_PARSER
        self._transport = None
        self._server.connection_closed(self)

    def eof_received(self) -> bool | None:
        # The client's EOF is a disconnect, as uvicorn and nginx take it: a half-close cannot be told
        # from a close, and a client that closed (a timeout in requests or tritonclient does) must
        # have its queued request dropped. Returning None closes the transport: connection_lost follows.
        return None

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        if self._body is None or self._linger_since is not None:
            return self._server.read_buffer
        if self._received >= self._capacity:  # not expected (reading waits for room), but never offer 0 bytes
            self._grow(self._received + 1, force=True)
        if self._direct is None or not len(self._direct):
            self._resize_body()
        assert self._direct is not None
        return self._direct

    def buffer_updated(self, nbytes: int) -> None:
        if self._linger_since is not None:
            return
        if self._body is not None:
            self._body_read(nbytes)
            return
        head_before, self._began_in_read = self._head_bytes, False
        try:
            self._parser.feed_data(memoryview(self._server.read_buffer)[:nbytes])
        except httptools.HttpParserUpgrade:
            # Upgrades (h2c from `curl --http2`, websocket) are not supported: ignore them (RFC 9110 7.8) and
            # answer the request over HTTP/1.1, then close (llhttp parses nothing after an upgrade request).
            if self._pipeline:
                self._pipeline[-1].keep_alive = False
                self._stop_reading()
            else:
                self._reject(400, "protocol upgrades are not supported")
            return
        except httptools.HttpParserError as exc:
            # httptools replaces exceptions raised in callbacks by its own "callback error".
            refusal, self._refusal = self._refusal, None
            if refusal is None:
                refusal = Refusal(400, f"malformed HTTP request: {exc}")
            self._reject(refusal.status, refusal.message, refusal.headers, refusal.answer)
            return
        # A head or body this read began but did not finish: its clock starts now (most requests arrive whole
        # in one read and never start one).
        if self._in_head:
            if self._head_since is None:
                self._head_since = self._loop.time()
                self._schedule(self._head_since + self._limits.head_timeout)
            if not self._head_fits(nbytes, self._head_bytes - head_before):
                return
        elif self._in_body and self._window_start is None:
            self._budget.begin_body(self)
            self._window_start, self._window_received = self._loop.time(), self._received
            self._schedule(self._window_start + self._limits.body_timeout)
        if self._body is not None and self._received >= self._capacity and not self._grow(self._received + 1,
                                                                                           force=False):
            self._wait_for_budget()  # the rest of the body comes through get_buffer, once there is room
        elif self._budget.used > self._budget.limit and not self._budget.privileged(self):
            self._wait_for_budget()

    def pause_writing(self) -> None:
        self._writable.clear()
        self._write_since = self._loop.time()
        self._schedule(self._write_since + self._limits.send_timeout)

    def resume_writing(self) -> None:
        self._writable.set()
        self._write_since = None

    # serving

    async def _run_pipeline(self) -> None:
        while self._pipeline and not self._disconnected.is_set():
            request = self._pipeline.popleft()
            self._pipeline_bytes -= request.size
            if self._paused_since is not None:
                self._update_reading()
            self._busy = True
            try:
                await Exchange(self, request).run()
            finally:
                self._busy = False
                self._in_flight.left(self)
                if request.charge:
                    self._release(request)
            if not request.keep_alive or self._closing:
                self._close()
                return
        if self._rejection is not None and self._transport is not None and not self._disconnected.is_set():
            self._transport.writelines(self._rejection)
            self._linger()
            return
        if not self._in_head and not self._in_body and not self._disconnected.is_set():
            self._idle_since = self._loop.time()
            self._schedule(self._idle_since + self._limits.idle_timeout)

    @property
    def app(self) -> ASGIApp:
        return self._app

    async def write(self, parts: list[bytes]) -> None:
        if self._transport is None or self._disconnected.is_set():
            return
        self._transport.writelines(parts)
        if not self._writable.is_set():
            await self._writable.wait()

    def scope(self, request: Request) -> dict[str, Any]:
        sockname = self._transport.get_extra_info("sockname") if self._transport else None
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.version,
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": unquote(request.path.decode("latin-1")),
            "raw_path": request.path,
            "query_string": request.query,
            "root_path": "",
            "headers": request.headers,
            "client": self._client,
            "server": sockname[:2] if isinstance(sockname, tuple) else None,
            "modelhost.received": request.received,
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

    # transport control

    def _update_reading(self) -> None:
        """Read unless: stopped for good, waiting for budget, or enough requests wait behind the one served.
        While reading is paused (the server's doing) the head and body clocks stand still."""
        if self._transport is None:
            return
        limits = self._limits
        pause = (self._stopped or self._waiting_since is not None or len(self._pipeline) >= limits.max_pipeline
                 or self._pipeline_bytes >= limits.max_pipeline_bytes)
        if pause == (self._paused_since is not None):
            return
        now = self._loop.time()
        if pause:
            self._paused_since = now
            self._transport.pause_reading()
            return
        assert self._paused_since is not None
        if self._head_since is not None:
            self._head_since += now - self._paused_since
        if self._window_start is not None:
            self._window_start, self._window_received = now, self._received
        self._paused_since = None
        self._transport.resume_reading()
        self._reschedule()

    def _stop_reading(self) -> None:
        self._stopped = True
        self._update_reading()

    def _close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
            if self._transport.get_write_buffer_size():  # a client that never reads must not hold it open
                self._closing_since = self._loop.time()
                self._schedule(self._closing_since + self._limits.send_timeout)
