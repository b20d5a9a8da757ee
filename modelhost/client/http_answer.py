"""One HTTP/1.1 answer read off a connection: httptools parses, this keeps what the client needs.

Shared by the blocking and the asyncio connections; one reader per answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import httptools


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    headers: dict[bytes, bytes]  # names lower-case
    body: bytes
    keep_alive: bool


class AnswerReader:
    """Feed it bytes until `done`; `answer()` then holds the parsed answer."""

    __slots__ = ("_parser", "_headers", "_body", "_keep_alive", "done", "started")

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._keep_alive = False
        self.done = False
        self.started = False  # some of the answer has come: the server has the request

    def feed(self, data: bytes | memoryview) -> None:
        """Raises httptools.HttpParserError on a malformed answer."""
        self.started = True
        self._parser.feed_data(data)

    def answer(self) -> HttpAnswer:
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        return HttpAnswer(self._parser.get_status_code(), self._headers, body, self._keep_alive)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self._keep_alive = self._parser.should_keep_alive()  # the parser forgets it once the answer is complete

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


def request_head(method: str, target: str, host: str, content_type: str, length: int,
                 header_length: int | None, extra: bytes = b"") -> bytes:
    head = (f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {length}\r\n")
    if length:
        head += f"Content-Type: {content_type}\r\n"
    if header_length is not None:
        head += f"Inference-Header-Content-Length: {header_length}\r\n"
    return head.encode("latin-1") + extra + b"\r\n"
