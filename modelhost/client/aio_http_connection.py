"""asyncio HTTP/1.1 keep-alive connections to one server, pooled: the async client's transport.

Each connection carries one request at a time; concurrent calls take their own connections. A call that
reaches its deadline closes its connection, so a server that has not run the request yet drops it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

import httptools

from modelhost.client.errors import ClientError, DeadlineExceeded
from modelhost.client.http_answer import AnswerReader, HttpAnswer
from modelhost.client.http_connection import CONTINUE_WAIT_S

_MAX_IDLE = 256


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._reader: AnswerReader | None = None
        self._waiter: asyncio.Future[HttpAnswer] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        reader, waiter = self._reader, self._waiter
        if reader is None or waiter is None or waiter.done():
            self.close()  # nothing was asked: the connection is out of step
            return
        try:
            reader.feed(data)
        except httptools.HttpParserError as exc:
            waiter.set_exception(ClientError(0, f"the server's answer is not valid HTTP: {exc}"))
            return
        if reader.done:
            waiter.set_result(reader.answer())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            reason = f": {exc}" if exc else ""
            waiter.set_exception(ClientError(0, f"the server closed the connection before answering{reason}",
                                             transient=True))

    async def exchange(self, parts: Sequence[bytes | memoryview], deadline: float | None,
                       expect: bool = False) -> HttpAnswer:
        """As the blocking connection's exchange, `expect` included."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        timer = None
        if deadline is not None:
            timer = loop.call_at(loop.time() + deadline - time.monotonic(), self._expire)
        try:
            if not expect:
                waiter = self._await_answer()
                self.transport.writelines(parts)
                return await waiter
            first = self._await_answer()
            self.transport.write(parts[0])
            done, _ = await asyncio.wait({first}, timeout=CONTINUE_WAIT_S)
            waiter = first
            if first in done:
                answer = first.result()
                if answer.status != 100:
                    return replace(answer, keep_alive=False)  # answered at the head: the body never went
                waiter = self._await_answer()
            self.transport.writelines(parts[1:])
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._reader = self._waiter = None

    def _await_answer(self) -> asyncio.Future[HttpAnswer]:
        self._reader = AnswerReader()
        self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    def _expire(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(DeadlineExceeded("the call's deadline passed before the server answered"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class AioHttpPool:
    """Idle connections to one server for one event loop, most recently used first."""

    def __init__(self, host: str, port: int, connect_timeout: float = 10.0) -> None:
        self.host, self.port = host, port
        self.authority = f"{host}:{port}"
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []

    async def exchange(self, parts: Sequence[bytes | memoryview], deadline: float | None,
                       expect: bool = False) -> HttpAnswer:
        connection = await self._take(deadline)
        try:
            answer = await connection.exchange(parts, deadline, expect)
        except BaseException:
            connection.close()  # a cancelled or late call's connection closes: the server drops its request
            raise
        if answer.keep_alive and not connection.closed and len(self._idle) < _MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    async def _take(self, deadline: float | None) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        timeout = self._connect_timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                raise DeadlineExceeded("the call's deadline passed")
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port), timeout)
        except asyncio.TimeoutError:
            raise ClientError(0, f"connecting to {self.authority} timed out", sent=False, transient=True) from None
        except OSError as exc:
            raise ClientError(0, f"cannot connect to {self.authority}: {exc.strerror or exc}", sent=False,
                              transient=True) from None
        return connection

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
