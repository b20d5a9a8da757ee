"""Log lines that client input causes, rate-limited per kind of message, so that no client can flood the log.

A bad request, an undecodable gRPC message or a failed invocation is logged through `client_log` with a
`kind` (a constant string naming the kind of message, never client data). Each kind may log `per_second`
lines a second on average, in bursts of up to BURST; lines over that are counted, and the next line of the
kind that is let through is preceded by "suppressed N similar messages". The limiter is per process and
configured once, at start, by the composition root (as logging itself is).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

BURST = 10


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    suppressed: int = 0


class LogRateLimiter:
    """Token buckets by kind. Thread-safe: backends' threads log too."""

    def __init__(self, per_second: float, burst: int = BURST, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.burst = burst if per_second > 0 else 0
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def allow(self, kind: str) -> int | None:
        """None when this line of `kind` is to be dropped; else how many were dropped since the last one let through."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(kind)
            if bucket is None:
                bucket = self._buckets[kind] = _Bucket(float(self.burst), now)
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.per_second)
            bucket.updated = now
            if bucket.tokens < 1.0:
                bucket.suppressed += 1
                return None
            bucket.tokens -= 1.0
            suppressed, bucket.suppressed = bucket.suppressed, 0
            return suppressed


_limiter = LogRateLimiter(1.0)


def configure(per_second: float) -> None:
    """Set the rate (ServerSettings.client_log_lines_per_second) for this process."""
    global _limiter
    _limiter = LogRateLimiter(per_second)


def client_log(logger: logging.Logger, level: int, kind: str, message: str, *args: object,
               exc_info: BaseException | bool | None = None) -> None:
    """`logger.log(level, message, *args)` unless `kind` is over its rate."""
    if not logger.isEnabledFor(level):
        return
    suppressed = _limiter.allow(kind)
    if suppressed is None:
        return
    if suppressed:
        logger.log(level, "suppressed %d similar messages (%s)", suppressed, kind)
    logger.log(level, message, *args, exc_info=exc_info)
