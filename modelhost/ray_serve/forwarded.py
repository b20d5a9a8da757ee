"""An HTTP request as the ingress hands it to a replica, and the replica's answer: plain data Ray can pickle,
run through modelhost's own ASGI application in the replica's process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from modelhost.protocols.http.exchange import ASGIApp

Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class ForwardedRequest:
    method: str
    path: str
    query: bytes
    headers: Headers
    body: bytes


@dataclass(slots=True)
class ForwardedResponse:
    status: int
    headers: Headers = field(default_factory=list)
    body: bytes = b""


def _scope(request: ForwardedRequest) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
        "method": request.method, "path": request.path, "raw_path": request.path.encode("latin-1"),
        "query_string": request.query, "headers": request.headers,
        # When the replica began on it: a latency target counts from here (the ingress hop is Ray's).
        "modelhost.received": time.monotonic(),
    }


def _receiver(body: bytes) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never leaves before its answer here: the ingress holds it
        return {"type": "http.disconnect"}

    return receive


async def answer(app: ASGIApp, request: ForwardedRequest) -> ForwardedResponse:
    """The whole response of `app` to `request`."""
    response = ForwardedResponse(500)
    parts: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            response.status, response.headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(_scope(request), _receiver(request.body), send)
    response.body = parts[0] if len(parts) == 1 else b"".join(parts)
    return response


async def stream(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[ForwardedResponse | bytes]:
    """`app`'s response as it comes: its head (a ForwardedResponse with its first part), then each further part."""
    queue: asyncio.Queue[ForwardedResponse | bytes | None] = asyncio.Queue()
    head: ForwardedResponse | None = None

    async def send(message: dict[str, Any]) -> None:
        nonlocal head
        if message["type"] == "http.response.start":
            head = ForwardedResponse(message["status"], list(message.get("headers", [])))
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            if head is not None:  # the first part travels with the head
                head.body = body
                queue.put_nowait(head)
                head = None
            else:
                queue.put_nowait(body)

    async def run() -> None:
        try:
            await app(_scope(request), _receiver(request.body), send)
        finally:
            queue.put_nowait(None)

    task = asyncio.create_task(run())
    try:
        while (item := await queue.get()) is not None:
            yield item
        await task
    finally:
        task.cancel()
