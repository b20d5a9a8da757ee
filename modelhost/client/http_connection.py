"""Blocking HTTP/1.1 keep-alive connections to one server, pooled: the sync client's transport.

A connection is used by one thread at a time (the pool hands each caller its own). A call that reaches its
deadline closes its connection: a server that has not run the request yet drops it (modelhost cancels a
queued request whose connection closed).
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import httptools

from modelhost.client.errors import ClientError, DeadlineExceeded
from modelhost.client.http_answer import AnswerReader, HttpAnswer

_JOIN_BELOW = 256 * 1024  # smaller bodies go out in one write; larger ones part by part, without joining
_READ_SIZE = 256 * 1024
_MAX_IDLE = 64
CONTINUE_WAIT_S = 1.0  # how long a request with Expect: 100-continue waits before sending its body anyway (curl's)


class HttpConnection:
    __slots__ = ("_sock", "_buffer")

    def __init__(self, host: str, port: int, connect_timeout: float) -> None:
        try:
            self._sock = socket.create_connection((host, port), timeout=connect_timeout)
        except TimeoutError:
            raise ClientError(0, f"connecting to {host}:{port} timed out", sent=False, transient=True) from None
        except OSError as exc:
            raise ClientError(0, f"cannot connect to {host}:{port}: {exc.strerror or exc}", sent=False,
                              transient=True) from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray(_READ_SIZE)

    def alive(self) -> bool:
        """False when the server has closed the idle connection (or sent something unasked)."""
        try:
            self._sock.settimeout(0.0)  # a timeout would make recv wait for readability first
            self._sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    def exchange(self, parts: Sequence[bytes | memoryview], deadline: float | None,
                 expect: bool = False) -> HttpAnswer:
        """Send one request (its head, then its body's parts), read its answer. With `expect` the head asks
        `Expect: 100-continue` and goes alone: a server that answers at once (a refusal) never gets the body,
        and the connection is not kept. Any failure leaves the connection unusable (the caller closes it)."""
        reader = AnswerReader()
        try:
            if expect:
                early = self._ask_to_continue(parts[0], deadline)
                if early is not None:
                    return early
                parts = parts[1:]
            self._send(parts, deadline)
            view = memoryview(self._buffer)
            while not reader.done:
                self._sock.settimeout(_remaining(deadline))
                count = self._sock.recv_into(self._buffer)
                if not count:
                    raise ClientError(0, "the server closed the connection before answering", transient=True)
                reader.feed(view[:count])
        except (TimeoutError, DeadlineExceeded):
            raise DeadlineExceeded("the call's deadline passed before the server answered") from None
        except httptools.HttpParserError as exc:
            raise ClientError(0, f"the server's answer is not valid HTTP: {exc}") from None
        except OSError as exc:
            raise ClientError(0, f"the connection failed: {exc.strerror or exc}", transient=True) from None
        return reader.answer()

    def _ask_to_continue(self, head: bytes | memoryview, deadline: float | None) -> HttpAnswer | None:
        """Send the head; the server's final answer if it gives one before 100 Continue, else None (continue,
        also when it says nothing for CONTINUE_WAIT_S: a server that ignores Expect gets the body anyway)."""
        self._sock.settimeout(_remaining(deadline))
        self._sock.sendall(head)
        reader = AnswerReader()
        waited_until = time.monotonic() + CONTINUE_WAIT_S
        view = memoryview(self._buffer)
        while not reader.done:
            left = waited_until - time.monotonic()
            if left <= 0 and not reader.started:
                return None
            remaining = _remaining(deadline)
            self._sock.settimeout(max(left, 0.001) if remaining is None else min(max(left, 0.001), remaining))
            try:
                count = self._sock.recv_into(self._buffer)
            except TimeoutError:
                _remaining(deadline)  # the deadline, or only the wait for 100 Continue, ended
                continue
            if not count:
                raise ClientError(0, "the server closed the connection before answering", transient=True)
            reader.feed(view[:count])
        answer = reader.answer()
        return None if answer.status == 100 else replace(answer, keep_alive=False)

    def _send(self, parts: Sequence[bytes | memoryview], deadline: float | None) -> None:
        self._sock.settimeout(_remaining(deadline))
        if sum(memoryview(p).nbytes for p in parts) < _JOIN_BELOW:
            self._sock.sendall(b"".join(parts))
            return
        for part in parts:
            self._sock.settimeout(_remaining(deadline))
            self._sock.sendall(part)

    def close(self) -> None:
        self._sock.close()


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("the call's deadline passed")
    return left


class HttpPool:
    """Idle connections to one server, most recently used first; thread-safe (deque operations are atomic)."""

    def __init__(self, host: str, port: int, connect_timeout: float = 10.0) -> None:
        self.host, self.port = host, port
        self.authority = f"{host}:{port}"
        self._connect_timeout = connect_timeout
        self._idle: deque[HttpConnection] = deque()

    def exchange(self, parts: Sequence[bytes | memoryview], deadline: float | None,
                 expect: bool = False) -> HttpAnswer:
        connection = self._take(deadline)
        try:
            answer = connection.exchange(parts, deadline, expect)
        except BaseException:
            connection.close()
            raise
        if answer.keep_alive and len(self._idle) < _MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    def _take(self, deadline: float | None) -> HttpConnection:
        while True:
            try:
                connection = self._idle.pop()
            except IndexError:
                break
            if connection.alive():
                return connection
            connection.close()
        timeout = self._connect_timeout
        if deadline is not None:
            timeout = min(timeout, max(deadline - time.monotonic(), 0.001))
        return HttpConnection(self.host, self.port, timeout)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
