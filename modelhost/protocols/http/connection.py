"""One HTTP/1.1 client connection: httptools parses, the kernel writes bodies straight into their buffer.

Reads land in the server's one shared read buffer, or, for the rest of a Content-Length body, directly
in that body's bytearray through asyncio.BufferedProtocol: no copy in Python, and the app receives it as
one `http.request` message. Sharing the read buffer is safe because protocol callbacks run one at a time
on the loop and every parser callback gets (and keeps) a copy: httptools hands on_url/on_header/on_body
new bytes objects. A body buffer grows as bytes arrive (doubling, up to the declared Content-Length),
never on the client's word, and what it holds is charged to the server's BufferBudget until the request
is answered. Requests are answered in arrival order (pipelining).

Deadlines, one lazy timer per connection: a request head must be complete within head_timeout of its
first byte (of the accept, for a connection's first request); a body must gain min_body_rate bytes/s
over each body_timeout window; a write stalled for send_timeout, or a close that cannot flush within
it, aborts; a keep-alive connection idle for idle_timeout closes.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httptools
import orjson

from modelhost.core.in_flight import InFlight
from modelhost.protocols.http.exchange import Answer, ASGIApp, Exchange, Request, content_length, response_head
from modelhost.protocols.http.memory import resize_bytearray

if TYPE_CHECKING:
    from modelhost.protocols.http.server import HttpServer

_FIRST_GROWTH = 16 * 1024  # the smallest step a body buffer grows by
_LINGER_SECONDS = 2.0  # how long an error answer waits for the client to stop sending before closing
_JSON = [(b"content-type", b"application/json")]


class _Closed:
    """The parser's protocol once the connection is gone: the parser no longer keeps the connection alive."""


_CLOSED_PARSER = httptools.HttpRequestParser(_Closed())


class _Refusal(ValueError):
    """Raised in a parser callback to answer with `status` (httptools turns it into a callback error) and close;
    `answer`: a whole answer (status, headers, body) to give instead of an error built from `message`."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = (),
                 answer: Answer | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers, self.answer = status, message, headers, answer


class HttpConnection(asyncio.BufferedProtocol):
    """One client connection. Callbacks run on the loop; requests are answered in arrival order."""

    def __init__(self, server: HttpServer, app: ASGIApp, in_flight: InFlight) -> None:
        self._server = server
        self._limits = server.limits
        self._budget = server.budget
        self._app = app
        self._admit = getattr(app, "admit", None)  # HttpApp.admit: an answer before the body is read
        self._refusal_shape = getattr(app, "refusal", None)  # RuntimeErrors.refusal: the SageMaker port's errors
        self._in_flight = in_flight
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._request = Request()
        self._length = 0  # declared Content-Length of the body being received
        self._body: bytearray | None = None  # that body; len() is its size in memory so far
        self._capacity = 0  # what the body may grow to now (charged to the budget)
        self._received = 0  # body bytes received so far (Content-Length or chunked)
        self._direct: memoryview | None = None  # the body's free tail: what the next read fills
        self._pipeline: collections.deque[Request] = collections.deque()
        self._pipeline_bytes = 0
        self._worker: asyncio.Task[None] | None = None
        self._busy = False
        self._closing = False
        self._disconnected = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._client: tuple[str, int] | None = None
        self._refusal: _Refusal | None = None
        self._answered = False  # the request being received was answered at its head; its body is dropped
        self._in_body = False  # between the end of a head with a body and the end of that body
        self._over_capacity = False
        self._in_head = False  # between on_message_begin and on_headers_complete
        self._head_bytes = 0  # of the head being parsed, as delivered by the parser's callbacks
        self._head_pending = 0  # received, not yet delivered (httptools holds an unfinished header)
        self._head_charge = 0
        self._began_in_read = False
        self._rejection: list[bytes] | None = None  # a 4xx waiting for the requests queued before it
        self._stopped = False  # nothing more is parsed on this connection
        self._waiting_since: float | None = None  # for buffer budget
        self._paused_since: float | None = None  # reading paused, for any of the reasons in _update_reading
        # Deadline clocks (loop time), None when not running; one timer serves them all.
        self._head_since: float | None = None
        self._idle_since: float | None = None
        self._window_start: float | None = None  # of the current body-rate window
        self._window_received = 0
        self._write_since: float | None = None
        self._closing_since: float | None = None
        self._linger_since: float | None = None  # answered with an error; what arrives is discarded
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

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
                refusal = _Refusal(400, f"malformed HTTP request: {exc}")
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

    # httptools parser callbacks

    def on_message_begin(self) -> None:
        self._request = Request()
        self._in_head, self._head_bytes, self._head_pending = True, 0, 0
        self._began_in_read = True
        self._idle_since = None

    def on_url(self, url: bytes) -> None:
        request = self._request
        request.url += url
        self._head_bytes += len(url)
        if len(request.url) > self._limits.max_url_bytes:
            raise self._refuse(414, f"the request target exceeds the {self._limits.max_url_bytes}-byte limit "
                                    "(--http-max-url-bytes)")
        if self._head_bytes > self._limits.max_head_bytes:
            raise self._head_too_large()

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self._request.headers
        headers.append((name.lower(), value))
        if len(headers) > self._limits.max_headers:
            raise self._refuse(431, f"more than {self._limits.max_headers} header fields (--http-max-headers)")
        # This runs for every header of every request: only count here; buffer_updated does the rest.
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self._limits.max_head_bytes:
            raise self._head_too_large()

    def on_headers_complete(self) -> None:
        self._in_head, self._head_since = False, None
        if self._head_charge:
            self._budget.release(self._head_charge)
            self._head_charge = 0
        request = self._request
        request.method = self._parser.get_method()
        request.version = self._parser.get_http_version()
        request.keep_alive = self._parser.should_keep_alive()
        request.size = self._head_bytes
        self._check_target(request)
        if self._over_capacity:
            raise self._refuse(503, f"the server is at its limit of {self._limits.max_connections} connections "
                                    "(--http-max-connections); retry later", ((b"retry-after", b"1"),))
        length = content_length(request.headers)
        limit = self._limits.max_body_bytes
        if length is not None and length > limit:
            raise self._refuse(413, f"request body of {length} bytes exceeds the {limit}-byte limit "
                                    "(--http-max-body-bytes)")
        self._received = 0
        if length and self._admit is not None:
            request.answer = self._admit(request.method, request.path, request.headers)
        if length and request.answer is None:
            self._length, self._body, self._capacity = length, bytearray(), 0
        elif length is None and any(name == b"transfer-encoding" for name, _ in request.headers):
            request.chunks = []  # llhttp accepts a request Transfer-Encoding only when its last coding is chunked
        # An answered request's body too: its deadlines hold. Its clock starts if this read does not finish it.
        self._in_body = bool(length) or request.chunks is not None
        expect = any(name == b"expect" and value.lower() == b"100-continue" for name, value in request.headers)
        if request.answer is not None and not self._busy and not self._pipeline:
            self._answer_at_head(request, expect)
        elif expect and request.version == "1.1" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        size = len(body)
        if self._body is not None and not self._capacity and size == self._length:
            # The whole body in this read (most requests): one allocation, no growth.
            self._budget.charge(size)
            self._request.charge += size
            self._capacity = self._received = size
            self._body = bytearray(body)
            return
        if self._body is not None:
            if self._received + size > self._capacity:
                self._grow(self._received + size, force=True)  # already in memory: charged even over budget
            if self._direct is None or len(self._direct) < size:
                self._resize_body()
            assert self._direct is not None
            self._direct[:size] = body
            self._direct = self._direct[size:]
            self._received += size
        elif self._request.chunks is not None:
            self._received += size
            self._request.chunks.append(body)
            self._request.charge += size
            self._budget.charge(size)
            if self._received > self._limits.max_body_bytes:
                raise self._refuse(413, f"request body exceeds the {self._limits.max_body_bytes}-byte limit "
                                        "(--http-max-body-bytes)")
        else:  # the body of a request answered at its head: dropped, counted for the body-rate deadline
            self._received += size

    def on_message_complete(self) -> None:
        # A Content-Length body that did not fit in this read keeps arriving through get_buffer.
        if self._body is not None and self._received < self._length:
            return
        request = self._request
        self._in_body = False
        if self._answered:  # its answer is written: the body was only drained
            self._answered = False
            if self._window_start is not None:
                self._window_start = None
                self._budget.end_body(self)
            self._idle_since = self._loop.time()
            self._schedule(self._idle_since + self._limits.idle_timeout)
            return
        if self._body is not None:
            self._drop_direct()
            request.body, self._body = self._body, None
        elif request.chunks is not None:
            request.body = b"".join(request.chunks)
            request.chunks = None
        if self._window_start is not None:
            self._window_start = None
            self._budget.end_body(self)
        request.size += self._received
        self._pipeline.append(request)
        self._pipeline_bytes += request.size
        self._in_flight.arrived(self)
        if len(self._pipeline) >= self._limits.max_pipeline or self._pipeline_bytes >= self._limits.max_pipeline_bytes:
            self._update_reading()
        if self._worker is None or self._worker.done():
            self._worker = self._loop.create_task(self._run_pipeline())

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

    # request heads and bodies

    def _refuse(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> _Refusal:
        self._refusal = _Refusal(status, message, headers)
        return self._refusal

    def _head_too_large(self) -> _Refusal:
        return self._refuse(431, f"the request line and headers exceed the {self._limits.max_head_bytes}-byte "
                                 "limit (--http-max-head-bytes)")

    def _head_fits(self, nbytes: int, delivered: int) -> bool:
        """After a read that ends inside a head: bound (and charge) what httptools holds undelivered.
        `delivered`: the head bytes this read's callbacks delivered."""
        if not self._began_in_read:  # this read continued the head: its undelivered tail is pending
            if delivered:  # what httptools held is part of what it just delivered
                self._head_pending = 0
            self._head_pending += max(0, nbytes - delivered)
        held = self._head_bytes + self._head_pending
        if held > self._limits.max_head_bytes:
            refusal = self._head_too_large()
            self._refusal = None
            self._reject(refusal.status, refusal.message)
            return False
        self._budget.charge(held - self._head_charge)
        self._head_charge = held
        return True

    def _answer_at_head(self, request: Request, expect: bool) -> None:
        """Give the app's answer at the head (nothing is waiting to be answered before it); the body that follows
        is read and dropped. A client waiting for 100 Continue, or closing after this request, is answered and
        the connection closed: the body then need not come at all."""
        assert request.answer is not None
        if expect or not request.keep_alive:
            self._refusal = _Refusal(request.answer[0], "", answer=request.answer)
            raise self._refusal
        status, headers, body = request.answer
        if self._transport is not None:
            self._transport.writelines([response_head(status, headers, len(body), True), body])
        self._answered = True

    def _check_target(self, request: Request) -> None:
        if request.method == b"CONNECT":
            raise self._refuse(400, "CONNECT is not supported: this server is not a proxy")
        try:
            url = httptools.parse_url(request.url)
        except httptools.HttpParserInvalidURLError:
            raise self._refuse(400, "the request target is not a valid URL path") from None
        request.path = url.path or b"/"  # absolute-form "http://host" has an empty path
        request.query = url.query or b""

    def _body_read(self, nbytes: int) -> None:
        """`nbytes` of a Content-Length body were read straight into its free tail."""
        assert self._body is not None and self._direct is not None
        self._received += nbytes
        if self._received < self._length:
            self._direct = self._direct[nbytes:]
            if self._received >= self._capacity and not self._grow(self._received + 1, force=False):
                self._wait_for_budget()
            return
        # The parser did not see these bytes: a new one starts clean at the next request.
        self._parser = httptools.HttpRequestParser(self)
        self.on_message_complete()

    def _grow(self, needed: int, force: bool) -> bool:
        """Let the body grow to hold at least `needed` bytes: double it, up to the declared length. Charged now;
        the memory is taken when the next bytes are read (_resize_body). Without `force` (bytes already read)
        and unless this body is privileged, only within the budget."""
        capacity = self._capacity
        new = min(self._length, max(needed, 2 * capacity, capacity + _FIRST_GROWTH))
        extra = new - capacity
        if force or self._budget.privileged(self):
            self._budget.charge(extra)
        elif not self._budget.reserve(extra):
            return False
        self._request.charge += extra
        self._capacity = new
        return True

    def _resize_body(self) -> None:
        """Give the body its granted capacity and point the direct view at its free tail. Called only where the
        transport holds no view of the body (get_buffer, on_body): a bytearray with one cannot be resized."""
        assert self._body is not None
        if not self._body:  # the first allocation: small, a plain one is cheaper than a resize
            self._body = bytearray(self._capacity)
            self._direct = memoryview(self._body)
            return
        if self._direct is not None:
            self._direct.release()
        resize_bytearray(self._body, self._capacity)
        self._direct = memoryview(self._body)[self._received :]

    def _drop_direct(self) -> None:
        self._direct = None  # not released: the transport may still hold it, for the read just done

    def _drop_body(self) -> None:
        self._drop_direct()
        self._body = None

    def _release(self, request: Request) -> None:
        if request.charge:
            charge, request.charge = request.charge, 0
            self._budget.release(charge)

    # flow control

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

    def _wait_for_budget(self) -> None:
        if self._waiting_since is None and self._transport is not None:
            self._waiting_since = self._loop.time()
            self._budget.wait(self, self._retry_budget)
            self._update_reading()
            self._schedule(self._waiting_since + self._limits.body_timeout)

    def _retry_budget(self) -> bool:
        """Called by the budget after a release; True once this connection reads again."""
        privileged = self._budget.privileged(self)
        if self._budget.used > self._budget.limit and not privileged:
            return False
        if self._body is not None and self._received >= self._capacity and not self._grow(self._received + 1,
                                                                                           force=False):
            return False
        self._waiting_since = None
        self._update_reading()
        return True

    def _stop_reading(self) -> None:
        self._stopped = True
        self._update_reading()

    # closing and deadlines

    def _close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
            if self._transport.get_write_buffer_size():  # a client that never reads must not hold it open
                self._closing_since = self._loop.time()
                self._schedule(self._closing_since + self._limits.send_timeout)

    def _reject(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = (),
                answer: Answer | None = None) -> None:
        if self._in_head or self._in_body:  # a request being received: its bytes are dropped
            self._release(self._request)
        self._budget.release(self._head_charge)
        self._head_charge, self._in_head = 0, False
        self._drop_body()
        self._window_start = self._head_since = self._waiting_since = None
        self._in_body = False
        self._budget.forget(self)
        self._answered = False
        if answer is not None:
            status, answer_headers, body = answer
            response = [response_head(status, answer_headers, len(body), False), body]
        elif self._refusal_shape is not None:
            shaped, body = self._refusal_shape(status, message)
            response = [response_head(status, [*shaped, *headers], len(body), False), body]
        else:
            body = orjson.dumps({"error": message})
            response = [response_head(status, [*_JSON, *headers], len(body), False), body]
        if self._busy or self._pipeline:  # answer the requests received before this one first, in order
            self._rejection = response
            self._stop_reading()
            return
        self._stop_reading()
        if self._transport is not None:
            self._transport.writelines(response)
            self._linger()

    def _linger(self) -> None:
        """After an error answer: send FIN, then read and discard what the client still sends for a moment
        before closing, so that it reads the answer rather than a reset (nginx's lingering close)."""
        assert self._transport is not None
        if not self._transport.can_write_eof():
            self._close()
            return
        self._transport.write_eof()
        self._linger_since = self._loop.time()
        self._stopped, self._waiting_since = False, None
        self._update_reading()
        self._schedule(self._linger_since + min(_LINGER_SECONDS, self._limits.send_timeout))

    def _schedule(self, when: float) -> None:
        # One timer for every deadline: moved earlier when a sooner deadline starts; when it fires
        # early (the deadline it was set for has ended) it re-arms for the next one.
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._on_timer)
        self._timer_at = when

    def _on_timer(self) -> None:
        self._timer = None
        if self._transport is None:
            return
        now, limits = self._loop.time(), self._limits
        reading = self._paused_since is None
        for since in (self._write_since, self._closing_since):
            if since is not None and now >= since + limits.send_timeout:
                self.abort()
                return
        if self._linger_since is not None and now >= self._linger_since + min(_LINGER_SECONDS, limits.send_timeout):
            self._linger_since = None
            self._close()
        if self._waiting_since is not None and now >= self._waiting_since + limits.body_timeout:
            self._reject(503, f"the server's buffer for request bytes (--http-max-buffered-bytes) stayed full for "
                              f"{limits.body_timeout:g} s; retry later", ((b"retry-after", b"1"),))
        elif reading and self._head_since is not None and now >= self._head_since + limits.head_timeout:
            if self._in_head:
                self._reject(408, f"the request head did not arrive within {limits.head_timeout:g} s "
                                  "(--http-head-timeout-seconds)")
            else:  # not a byte of a request yet: nothing to answer
                self._head_since = None
                self._close()
        elif reading and self._window_start is not None and now >= self._window_start + limits.body_timeout:
            if self._received - self._window_received < limits.min_body_bytes_per_window:
                self._reject(408, f"the request body arrived slower than {limits.min_body_rate} bytes/s over "
                                  f"{limits.body_timeout:g} s (--http-min-body-rate, --http-body-timeout-seconds)")
            else:
                self._window_start, self._window_received = now, self._received
        elif self._idle_since is not None and now >= self._idle_since + limits.idle_timeout:
            self._idle_since = None
            self._close()
        self._reschedule()

    def _reschedule(self) -> None:
        limits = self._limits
        reading = self._paused_since is None
        clocks = [(self._write_since, limits.send_timeout), (self._closing_since, limits.send_timeout),
                  (self._linger_since, min(_LINGER_SECONDS, limits.send_timeout)),
                  (self._waiting_since, limits.body_timeout), (self._idle_since, limits.idle_timeout)]
        if reading:
            clocks += [(self._head_since, limits.head_timeout), (self._window_start, limits.body_timeout)]
        deadlines = [since + timeout for since, timeout in clocks if since is not None]
        if deadlines and self._transport is not None:
            self._schedule(min(deadlines))
