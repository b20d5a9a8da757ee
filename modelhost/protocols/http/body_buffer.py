"""A connection's body buffer: grown as bytes arrive, charged to the server's BufferBudget, read into directly.

A Content-Length body that does not arrive with its head is read by the kernel straight into the free tail
of its bytearray (get_buffer hands it out). The buffer grows by doubling up to the declared length, never on
the client's word; each step is charged to the budget before the memory is taken, and a connection that
cannot get budget stops reading until a release makes room (the oldest body being received is never held
back: BufferBudget.privileged). What a request holds is released once it is answered or dropped.
"""

from __future__ import annotations

import httptools

from modelhost.protocols.http.connection_state import ConnectionState
from modelhost.protocols.http.exchange import Request
from modelhost.protocols.http.memory import resize_bytearray

_FIRST_GROWTH = 16 * 1024  # the smallest step a body buffer grows by


class BodyBuffer(ConnectionState):
    """The body buffer of HttpConnection and the budget it is charged to."""

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
