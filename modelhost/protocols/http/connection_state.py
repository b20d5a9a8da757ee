"""The fields of one HTTP connection, shared by the parts that make up HttpConnection (connection.py).

HttpConnection combines mixins, one concept each, that read and write these fields: parsing.py (httptools
callbacks, head limits), body_buffer.py (the body buffer and its budget), refusal.py (error answers and the
lingering close) and deadlines.py (the one timer). The methods one part calls of another are declared here
for the type checker only: at run time each name is found where it is defined.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

import httptools

from modelhost.core.in_flight import InFlight
from modelhost.protocols.http.exchange import Answer, ASGIApp, Request

if TYPE_CHECKING:
    from modelhost.protocols.http.refusal import Refusal
    from modelhost.protocols.http.server import HttpServer


class ConnectionState:
    """What one client connection holds; the base of HttpConnection's parts."""

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
        self._refusal: Refusal | None = None
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

    if TYPE_CHECKING:  # defined in one part and called from another
        def abort(self) -> None: ...
        def _close(self) -> None: ...
        def _update_reading(self) -> None: ...
        def _stop_reading(self) -> None: ...
        async def _run_pipeline(self) -> None: ...
        def on_message_complete(self) -> None: ...
        def _reject(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = (),
                    answer: Answer | None = None) -> None: ...
        def _grow(self, needed: int, force: bool) -> bool: ...
        def _resize_body(self) -> None: ...
        def _drop_direct(self) -> None: ...
        def _drop_body(self) -> None: ...
        def _release(self, request: Request) -> None: ...
        def _schedule(self, when: float) -> None: ...
