"""The answers a model sends for one request before its last: a TorchServe handler's intermediate responses
(`send_intermediate_predict_response`), and every response of a decoupled model (a Triton Python model's
response sender, the last with the final flag: `put(..., last=True)`), which front-ends stream to the client
as they come.

The request's front-end makes one on the event loop and reads it there (`next`); the model's instance puts
answers into it from whichever thread runs the batch (`put`), in the order the model sent them, and each before
the request's final answer is delivered. Unread answers are bounded in bytes: a client that reads slower than the
model writes ends its stream with a TOO_LARGE error rather than holding the server's memory.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

from modelhost.errors import ErrorKind, ModelhostError


class PartialAnswers:
    """One request's partial answers, in order. `max_unread_bytes`: the most the answers put and not yet read may
    hold together (a single answer larger than that fails the stream too)."""

    def __init__(self, max_unread_bytes: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._limit = max_unread_bytes
        self._answers: deque[tuple[Any, int]] = deque()
        self._unread = 0
        self._closed = False
        self._failure: ModelhostError | None = None
        self._wake: asyncio.Future[None] | None = None
        # The reader went away (the client left): the model may stop (Triton's request.is_cancelled()).
        self.cancelled = False

    def put(self, answer: Any, size: int, last: bool = False) -> None:
        """Add an answer of `size` bytes, the stream's `last` one (it closes); from any thread. After close, or once
        the stream failed, it is dropped."""
        if threading.get_ident() == self._thread:
            self._put(answer, size, last)
        else:
            self._loop.call_soon_threadsafe(self._put, answer, size, last)

    def fail(self, error: ModelhostError) -> None:
        """End the stream with `error`, after the answers already put; on the loop."""
        if not self._closed:
            self._answers.append((error, 0))
            self.close()

    def abandon(self) -> None:
        """The reader is gone: answers put from now on are dropped, and `cancelled` says so to the model."""
        self.cancelled = True
        self._answers.clear()
        self.close()

    def close(self) -> None:
        """No answer follows (the request's final answer is in, or it failed); on the loop."""
        self._closed = True
        self._notify()

    async def next(self) -> Any | None:
        """The next answer, waiting for it; None once closed and every answer is read. Raises the ModelhostError
        that failed the stream (TOO_LARGE)."""
        while True:
            if self._failure is not None:
                raise self._failure
            if self._answers:
                answer, size = self._answers.popleft()
                self._unread -= size
                if isinstance(answer, ModelhostError):
                    raise answer
                return answer
            if self._closed:
                return None
            self._wake = self._loop.create_future()
            try:
                await self._wake
            finally:
                self._wake = None

    def _put(self, answer: Any, size: int, last: bool = False) -> None:
        if self._closed or self._failure is not None:
            return
        self._closed = last
        if self._unread + size > self._limit:
            self._answers.clear()
            self._failure = ModelhostError(ErrorKind.TOO_LARGE, (
                f"the model's partial answers to this request reached {self._unread + size} unread bytes, over the "
                f"{self._limit}-byte limit on a response: the client reads them slower than the model sends them"))
        else:
            self._answers.append((answer, size))
            self._unread += size
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
