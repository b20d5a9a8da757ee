"""One request and its response through the ASGI app, and the HTTP/1.1 response head."""

from __future__ import annotations

import asyncio
import http
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson

log = logging.getLogger("modelhost.http")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


Answer = tuple[int, list[tuple[bytes, bytes]], bytes]  # status, headers, body: a whole response


class Request:
    """A request as received: the head's fields and the whole body. `charge`: budget bytes it holds."""

    __slots__ = ("method", "url", "path", "query", "headers", "body", "version", "keep_alive", "chunks", "size",
                 "charge", "answer", "received")

    def __init__(self) -> None:
        self.method = b""
        self.url = b""
        self.path = b"/"
        self.query = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: bytearray | bytes = b""
        self.version = "1.1"
        self.keep_alive = True
        self.chunks: list[bytes] | None = None
        self.size = 0  # bytes received (head and body), for the pipeline's byte cap
        self.charge = 0
        # (status, headers with content-length, body): the app's answer given at the head (HttpApp.admit);
        # the body was read and dropped, and the app is not called.
        self.answer: Answer | None = None
        self.received = time.monotonic()  # its first byte was parsed (a latency target counts from here)


class Connection(Protocol):
    """What an exchange needs of its connection."""

    @property
    def app(self) -> ASGIApp: ...

    @property
    def disconnected(self) -> asyncio.Event: ...

    def scope(self, request: Request) -> dict[str, Any]: ...

    async def write(self, parts: list[bytes]) -> None: ...


class Exchange:
    """One request and its response through the ASGI app."""

    def __init__(self, connection: Connection, request: Request) -> None:
        self._connection = connection
        self._request = request
        self._body_delivered = False
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_written = False
        self._chunked = False
        self._finished = False

    async def run(self) -> None:
        if self._request.answer is not None:
            status, headers, body = self._request.answer
            await self._connection.write([response_head(status, headers, len(body), self._request.keep_alive), body])
            return
        try:
            await self._connection.app(self._connection.scope(self._request), self._receive, self._send)
        except Exception:
            log.exception("ASGI application failed")
            if not self._status:
                body = orjson.dumps({"error": "internal server error"})
                head = response_head(500, [(b"content-type", b"application/json")], len(body),
                                     self._request.keep_alive)
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
            length = content_length(self._headers)
            if length is None and not more:
                length = len(body)
            self._chunked = length is None
            parts.append(response_head(self._status, self._headers, length, self._request.keep_alive))
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


def content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"invalid Content-Length {value!r}") from None
    return None


def response_head(status: int, headers: list[tuple[bytes, bytes]], length: int | None, keep_alive: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b""))]
    lines += [name + b": " + value for name, value in headers if name.lower() != b"content-length"]
    lines.append(b"content-length: %d" % length if length is not None else b"transfer-encoding: chunked")
    if not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"
