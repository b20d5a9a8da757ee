"""Memory of the HTTP transport: the process-wide budget of buffered request bytes, body buffers that
grow without copying, and giving heap memory back to the OS after a burst.

Everything here runs on the event loop (one thread); only malloc_trim runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable

from modelhost.core.memory import malloc_trim

log = logging.getLogger("modelhost.http")


def _resize_function() -> Callable[[bytearray, int], int] | None:
    try:
        function = ctypes.pythonapi.PyByteArray_Resize
    except AttributeError:  # not CPython
        return None
    function.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
    function.restype = ctypes.c_int
    return function


_RESIZE = _resize_function()


def resize_bytearray(buffer: bytearray, size: int) -> None:
    """Grow `buffer` to `size` bytes without writing the new ones (their content is undefined until filled).

    CPython's PyByteArray_Resize reallocs: a large buffer grows by remapping its pages (mremap), not by
    copying them, and no page is touched before the kernel writes the body into it. Growing by
    `extend(bytes(n))` instead costs a zero-fill and a copy (~40x slower for a 2 MB body).
    No memoryview of `buffer` may be alive (BufferError).
    """
    if _RESIZE is not None:
        _RESIZE(buffer, size)
    else:
        buffer.extend(bytes(size - len(buffer)))


class BufferBudget:
    """Bytes of request data (bodies, unfinished heads) the transport holds, across every connection.

    `reserve` grants only within the limit; `charge` always succeeds, for bytes that are already in
    memory (a read the parser has delivered). A connection that cannot reserve, or finds the budget
    exceeded, stops reading and calls `wait`; on each `release` waiters are retried in arrival order
    until one is still short. So that bodies always make progress (two half-received bodies must not
    each wait for the other's bytes), the oldest body being received is `privileged`: it is never held
    back. The budget can thus be exceeded by one body plus about one read per connection.
    `peak`: the most it held since the owner last reset it (MemoryReturner's bursts).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._waiters: dict[object, Callable[[], bool]] = {}  # insertion-ordered: FIFO
        self._bodies: dict[object, None] = {}  # owners receiving a body, oldest first
        self._waking = False

    @property
    def exceeded(self) -> bool:
        return self.used > self.limit

    def reserve(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        if self.used > self.peak:
            self.peak = self.used
        return True

    def charge(self, size: int) -> None:
        self.used += size
        if self.used > self.peak:
            self.peak = self.used

    def release(self, size: int) -> None:
        if size:
            self.used -= size
            if self._waiters:
                self._wake()

    def begin_body(self, owner: object) -> None:
        self._bodies[owner] = None

    def end_body(self, owner: object) -> None:
        if not self._waiters:
            self._bodies.pop(owner, None)
            return
        first = next(iter(self._bodies), None)
        if self._bodies.pop(owner, 0) is None and owner is first:
            self._wake()  # the next body, maybe waiting, is privileged now

    def privileged(self, owner: object) -> bool:
        return next(iter(self._bodies), None) is owner

    def wait(self, owner: object, retry: Callable[[], bool]) -> None:
        """Call `retry` after a release; it returns True once it got what it needed (it is then forgotten)."""
        self._waiters[owner] = retry

    def forget(self, owner: object) -> None:
        self._waiters.pop(owner, None)
        self.end_body(owner)

    def _wake(self) -> None:
        if self._waking:  # a retry that releases must not recurse into the queue
            return
        self._waking = True
        try:
            first = next(iter(self._bodies), None)
            if first in self._waiters and self._waiters[first]():
                del self._waiters[first]
            while self._waiters and not self.exceeded:
                owner, retry = next(iter(self._waiters.items()))
                if not retry():
                    break
                self._waiters.pop(owner, None)
        finally:
            self._waking = False


_TRIM = malloc_trim
_BURST_CONNECTIONS = 256  # this many connections fewer than the peak, and at most half of it
_BURST_BYTES = 32 * 1024**2  # or this many buffered bytes fewer than the peak, and at most half of it


class MemoryReturner:
    """Gives free heap pages back to the OS (glibc's malloc_trim) once a burst of connections or buffered
    bytes has gone: glibc keeps freed memory for reuse, so RSS would stay at the burst's peak.

    `observe` is called on the loop when connections open or close, and once a second with the budget's
    peak and then its current bytes. A trim runs in a worker thread a second later, at most one every
    `interval` seconds; steady traffic never drops to half its peak by this much, so it never trims.
    No-op off glibc.
    """

    def __init__(self, interval: float = 5.0) -> None:
        self._interval = interval
        self._peak_connections = 0
        self._peak_bytes = 0
        self._last = -interval
        self._scheduled = False

    def observe(self, connections: int, buffered: int) -> None:
        if connections > self._peak_connections:
            self._peak_connections = connections
        if buffered > self._peak_bytes:
            self._peak_bytes = buffered
        if self._scheduled or _TRIM is None:
            return
        drop_connections = self._peak_connections - connections
        drop_bytes = self._peak_bytes - buffered
        if (drop_connections >= _BURST_CONNECTIONS and connections * 2 <= self._peak_connections) or (
                drop_bytes >= _BURST_BYTES and buffered * 2 <= self._peak_bytes):
            loop = asyncio.get_running_loop()
            self._scheduled = True
            loop.call_later(max(1.0, self._last + self._interval - loop.time()), self._trim)

    def _trim(self) -> None:
        assert _TRIM is not None
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        self._peak_connections = self._peak_bytes = 0  # the next observe starts a new peak
        future = loop.run_in_executor(None, _TRIM, 0)
        future.add_done_callback(self._trimmed)

    def _trimmed(self, future: asyncio.Future[int]) -> None:
        self._scheduled = False
        if future.exception() is not None:
            log.debug("malloc_trim failed", exc_info=future.exception())
