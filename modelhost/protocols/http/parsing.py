"""A connection's httptools parser callbacks: each request built from them, its head checked against HttpLimits.

A callback refuses a request by raising a Refusal (refusal.py), which httptools turns into a callback error
for buffer_updated to answer. A head within its limits leads to the app's early answer (admit), a body
buffer (body_buffer.py) or chunks to join; a complete request joins the pipeline, answered in arrival order.
"""

from __future__ import annotations

import httptools

from modelhost.protocols.http.connection_state import ConnectionState
from modelhost.protocols.http.exchange import Request, content_length, response_head
from modelhost.protocols.http.refusal import Refusal


class RequestParsing(ConnectionState):
    """The parser callbacks of HttpConnection, and the head limits they enforce."""

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

    def _refuse(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Refusal:
        self._refusal = Refusal(status, message, headers)
        return self._refusal

    def _head_too_large(self) -> Refusal:
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
            self._refusal = Refusal(request.answer[0], "", answer=request.answer)
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
