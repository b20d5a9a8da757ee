"""The one ASGI application: routes from the enabled protocols, errors mapped to HTTP statuses.

Protocol modules hand in `Route`s; this module owns request reading, dispatch, the
ErrorKind -> status table and the lifespan hooks. Handlers get the whole body as bytes.
"""

from __future__ import annotations

import logging
import math
import re
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import orjson

from modelhost.access import BEARER_HEADER, AccessPolicy, Api
from modelhost.client_log import client_log
from modelhost.errors import ErrorKind, ModelhostError, invalid, public_message, too_large
from modelhost.protocols.http.exchange import Answer
from modelhost.protocols.http.route_index import RouteIndex

log = logging.getLogger("modelhost.http")

STATUS = {
    ErrorKind.INVALID_INPUT: 400,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.OVERLOADED: 503,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.UNSUPPORTED: 501,
    ErrorKind.PRECONDITION: 400,
    ErrorKind.ALREADY_EXISTS: 409,
    ErrorKind.NO_MEMORY: 507,
    ErrorKind.INTERNAL: 500,
}
JSON = b"application/json"


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[bytes, bytes]
    params: dict[str, str]
    body: bytes
    query: bytes = b""
    received: float = 0.0  # time.monotonic() when its first byte was parsed; 0: unknown


@dataclass(slots=True)
class HttpResponse:
    """`more`: a streamed response's further parts, sent as they come after `body` (chunked); an exception from it
    cuts the response short (the connection closes without the last chunk, which the client sees as an error)."""

    status: int = 200
    body: Sequence[bytes] = ()
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    more: AsyncIterator[bytes] | None = None
    sent: Callable[[], None] | None = None  # called once the whole response is handed to the transport


RouteHandler = Callable[[HttpRequest], Awaitable[HttpResponse]]
# The app's own answers (unknown path, wrong method, a body it cannot read, an unexpected failure) in a protocol's
# error shape: status and message -> the response.
ErrorShape = Callable[[int, str], HttpResponse]


@dataclass(frozen=True, slots=True)
class Route:
    """`api` is the group access control restricts it by (modelhost/access.py). `admit`, given the path's
    parameters, raises the ModelhostError the core would answer the request with before reading its body
    (a full queue): under overload such requests are refused without their bodies being buffered."""

    method: str
    pattern: str
    handler: RouteHandler
    api: Api
    admit: Callable[[dict[str, str]], None] | None = None


# Early admission runs only this long after the app last answered OVERLOADED: matching routes twice
# costs every request a little, and only requests to a model whose queue is full gain from it.
ADMISSION_WINDOW_S = 1.0


def json_response(document: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(status, [orjson.dumps(document)], [(b"content-type", JSON)])


def error_response(status: int, message: str) -> HttpResponse:
    """{"error": message}, with no server file paths in the message (errors.public_message)."""
    return json_response({"error": public_message(message)}, status)


def error_answer(exc: ModelhostError) -> HttpResponse:
    """The HTTP answer to a core error: its kind's status, its message, and `Retry-After` when it has one."""
    response = error_response(STATUS[exc.kind], exc.message)
    if exc.retry_after is not None:
        response.headers.append((b"retry-after", str(math.ceil(exc.retry_after)).encode()))
    return response


class HttpApp:
    """ASGI callable. `startup`/`shutdown` run in the lifespan protocol, around serving."""

    def __init__(
        self,
        routes: Sequence[Route],
        startup: Callable[[], Awaitable[None]] | None = None,
        shutdown: Callable[[], Awaitable[None]] | None = None,
        max_body_bytes: int = 64 * 1024 * 1024,
        access: AccessPolicy | None = None,
        errors: ErrorShape | None = None,
    ) -> None:
        self.routes = tuple(routes)  # what this app serves, as given (the OpenAPI documents are checked against it)
        self._routes = RouteIndex([(r.method, re.compile(r.pattern), r.handler, r.api) for r in routes],
                                  [r.pattern for r in routes])
        self._admissions = [(r.method, re.compile(r.pattern), r.api, r.admit) for r in routes if r.admit]
        self._access = access or AccessPolicy()
        self._overloaded_until = 0.0  # monotonic time until which early admission runs
        self._startup = startup
        self._shutdown = shutdown
        self._max_body_bytes = max_body_bytes
        self._errors = errors

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            response = await self._handle(scope, receive)
            await _send(send, response)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _handle(self, scope: dict[str, Any], receive: Any) -> HttpResponse:
        path, method = scope["path"], scope["method"]
        handler, params, path_known, api = None, {}, False, Api.HEALTH
        for route_method, pattern, route_handler, route_api in self._routes.of(path):
            match = pattern.fullmatch(path)
            if match:
                path_known = True
                if route_method == method:
                    handler, params = route_handler, {k: v for k, v in match.groupdict().items() if v is not None}
                    api = route_api
                    break
        if handler is None:
            if self._errors is not None:
                return self._errors(405, "Method Not Allowed") if path_known else self._errors(404, "Not Found")
            return error_response(405, "Method Not Allowed") if path_known else error_response(404, "Not Found")
        headers = dict(scope["headers"])
        if self._access:
            denied = self._denied(api, headers)
            if denied is not None:
                return denied
        try:
            body = await self._read_body(receive, headers)
            return await handler(HttpRequest(method, path, headers, params, body, scope.get("query_string", b""),
                                             scope.get("modelhost.received", 0.0)))
        except ModelhostError as exc:
            return self._error(exc)
        except Exception as exc:
            # The exception's text may hold paths and internals: the log has it, the client its type.
            client_log(log, logging.ERROR, "http-internal-error", "%s %s failed", method, path, exc_info=exc)
            message = f"internal error ({type(exc).__name__}); the server log has the details"
            return self._errors(500, message) if self._errors is not None else error_response(500, message)

    def admit(self, method: bytes, raw_path: bytes, headers: list[tuple[bytes, bytes]]) -> Answer | None:
        """Called by the transport when a request's head is complete, before its body is read: the answer the
        request gets whatever its body (its model's queue is full), or None to read it and run it as usual.
        Checks only while the app has recently answered OVERLOADED; requests access control would refuse
        are left to the usual path."""
        if not self._admissions or time.monotonic() >= self._overloaded_until:
            return None
        method_text, path = method.decode("latin-1"), unquote(raw_path.decode("latin-1"))
        for route_method, pattern, api, admit in self._admissions:
            match = pattern.fullmatch(path) if route_method == method_text else None
            if match is None or admit is None:
                continue
            if self._access and self._denied(api, dict(headers)) is not None:
                return None
            try:
                admit({k: v for k, v in match.groupdict().items() if v is not None})
            except ModelhostError as exc:
                response = self._error(exc)
                return response.status, response.headers, b"".join(response.body)
            return None
        return None

    def _error(self, exc: ModelhostError) -> HttpResponse:
        if exc.kind is ErrorKind.OVERLOADED:
            self._overloaded_until = time.monotonic() + ADMISSION_WINDOW_S
        if self._errors is not None:
            return self._errors(STATUS[exc.kind], public_message(exc.message))
        return error_answer(exc)

    def _denied(self, api: Api, headers: dict[bytes, bytes]) -> HttpResponse | None:
        """401 without the credential `api` requires, 403 with a wrong one; None when allowed."""
        header = self._access.header(api)
        if header is None:
            return None
        denial = self._access.check(api, headers.get(header.encode("latin-1")))
        if denial is None:
            return None
        response = error_response(401 if denial.missing else 403, denial.message)
        if denial.missing and header == BEARER_HEADER:
            response.headers.append((b"www-authenticate", b'Bearer realm="modelhost"'))
        return response

    async def _read_body(self, receive: Any, headers: dict[bytes, bytes]) -> bytes:
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise invalid("client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body_bytes:
                raise too_large(f"request body exceeds the {self._max_body_bytes}-byte limit (--http-max-body-bytes)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        encoding = headers.get(b"content-encoding", b"identity").lower()
        if encoding == b"identity":
            return body
        if encoding not in CODING_WBITS:
            raise invalid(f"Content-Encoding {encoding.decode(errors='replace')} is not supported (gzip, deflate)")
        return _decompress(body, encoding.decode(), self._max_body_bytes)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self._startup:
                        await self._startup()
                except Exception as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._shutdown:
                    await self._shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


# Content-Encoding -> zlib window bits (gzip: the 16 says its header and trailer); request bodies and responses.
CODING_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Inflate with the body limit applied to the inflated size; gzip may hold several members."""
    parts, size, data = [], 0, body
    try:
        while data:
            inflater = zlib.decompressobj(CODING_WBITS[encoding.encode()])
            part = inflater.decompress(data, limit + 1 - size)
            size += len(part)
            if size > limit:
                raise too_large(f"request body exceeds the {limit}-byte limit (--http-max-body-bytes) once "
                                "decompressed")
            if not inflater.eof:
                raise invalid(f"request body is truncated {encoding} data")
            parts.append(part)
            data = inflater.unused_data if encoding == "gzip" else b""
    except zlib.error as exc:
        raise invalid(f"request body is not valid {encoding} data: {exc}") from None
    return b"".join(parts)


async def _send(send: Any, response: HttpResponse) -> None:
    body = response.body[0] if len(response.body) == 1 else b"".join(response.body)
    if response.more is not None:
        await _stream(send, response, body, response.more)
        return
    headers = response.headers
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    if response.sent is not None:
        response.sent()


async def _stream(send: Any, response: HttpResponse, body: bytes, more: AsyncIterator[bytes]) -> None:
    await send({"type": "http.response.start", "status": response.status, "headers": response.headers})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    try:
        async for part in more:
            await send({"type": "http.response.body", "body": part, "more_body": True})
    except Exception as exc:  # after the head: the only way left to tell the client is to cut the response
        message = exc.message if isinstance(exc, ModelhostError) else f"{type(exc).__name__}: {exc}"
        client_log(log, logging.WARNING, "http-stream-cut", "a streamed response was cut short: %s", message)
        return
    finally:
        close = getattr(more, "aclose", None)
        if close is not None:
            await close()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
