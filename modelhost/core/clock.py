"""Time as the scheduler and its request queue read it: when a request was queued, how long a batch may wait
for more rows (`max_queue_delay_microseconds`), when a queued request times out.

`MONOTONIC` is the real clock. A test gives the scheduler a clock of its own that it moves by hand, so that
queue delays and timeouts are exact and take no time to test.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock:
    """The monotonic clock, in seconds."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, condition: threading.Condition, timeout: float) -> None:
        """Wait on `condition` (its lock held) until it is notified or `timeout` seconds pass."""
        condition.wait(timeout)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Cancellable:
        """Call `callback(*args)` on the running event loop after `delay` seconds."""
        return asyncio.get_running_loop().call_later(delay, callback, *args)


MONOTONIC = Clock()
