"""Gives the memory embedding lookups freed back to the OS: checked at most every `interval` seconds, trimmed
when resident memory grew by `growth` since the last trim.

A ranking request's lookup makes arrays of megabytes (its vectors, 5 MB for 500 x 39 x 64 float32; the rows it
read), freed once the dense model has run. glibc keeps freed memory in the arena of the thread that freed it,
where fragmentation leaves much of it unused and resident: under steady traffic the server's RSS stood
35-50 MB above what it held (benchmarks/embedding_store.py, Zipf 1.2). A trim (malloc_trim) returns those pages;
those reused afterwards are faulted in again, a cost paid once per trim rather than per request (a fixed mmap
threshold, the other cure, made a 5 MB gather 6x slower here: 0.57 -> 3.3 ms).

Only processes that serve embedding tables trim: nothing changes for other models' requests.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Executor

from modelhost.core.memory import malloc_trim, resident_bytes

TRIM_INTERVAL = 2.0  # seconds between checks, at least
TRIM_GROWTH = 16 * 1024**2  # a trim when resident memory grew this much since the last one


class HeapTrimmer:
    def __init__(self, executor: Executor, interval: float = TRIM_INTERVAL, growth: int = TRIM_GROWTH) -> None:
        self._executor = executor
        self._interval = interval
        self._growth = growth
        self._floor = resident_bytes()  # resident memory after the last trim
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._running = False
        self.trims = 0
        self.trim_seconds = 0.0  # spent trimming, all trims together

    def lookup_done(self) -> None:
        """Called after each lookup: once the interval has passed, starts a trim on the executor if resident
        memory grew by `growth` since the last one. A trim costs its pages' faults when they are used again
        (trimming every 2 s regardless made lookups' p50 6-13 % slower in-process): under steady traffic, with
        the arenas reusing what they hold, resident memory stops growing and no trim runs."""
        if malloc_trim is None or time.monotonic() - self._last < self._interval:
            return
        with self._lock:  # again under the lock: a trim may have ended since
            if self._running or time.monotonic() - self._last < self._interval:
                return
            self._last = time.monotonic()
            if resident_bytes() - self._floor < self._growth:
                return
            self._running = True
        self._executor.submit(self.trim)

    def trim(self) -> None:
        """Trim now (also after a table's warm start, which leaves its large reads freed)."""
        if malloc_trim is None:
            return
        started = time.monotonic()
        try:
            malloc_trim(0)
        finally:
            self._floor = resident_bytes()
            self._last = time.monotonic()
            self.trims += 1
            self.trim_seconds += self._last - started
            self._running = False
