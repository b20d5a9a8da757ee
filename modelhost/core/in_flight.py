"""How busy this process is: requests received and not yet answered, over every front-end."""

from __future__ import annotations

import time

# A request counts as alone only this long after the process last had two at once: under mixed traffic a
# request that arrives while a lone one runs on the event loop waits for it, and that arrival is not counted
# until the loop is free, so the crowding seen between lone runs stands for it.
QUIET_S = 1.0
# A request from another connection counted this soon after one was answered was most likely waiting while
# that one held the loop (a connection's own next request needs the answer to travel first): crowding.
WAITED_S = 0.001


class InFlight:
    """Front-ends count a request in when it is fully received (`arrived`) and out when it is answered (or its
    client is gone); the schedulers read it to tell a lone request from one among many. An ensemble counts
    its steps that run beside another of the same request in `parallel_steps`: for the schedulers those are
    as many more requests."""

    __slots__ = ("_answered_at", "_answered_on", "crowded_at", "parallel_steps", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.parallel_steps = 0
        self.crowded_at = -QUIET_S  # when a request last arrived with another in progress, or waited for one
        self._answered_on = 0  # id() of the connection of the request last answered (`left`): no reference kept
        self._answered_at = -QUIET_S

    def arrived(self, connection: object = None) -> None:
        """A request is received, on `connection` when the front-end tells them apart."""
        self.requests += 1
        if self.requests > 1:
            self.crowded_at = time.monotonic()
        elif connection is not None and id(connection) != self._answered_on:
            now = time.monotonic()
            if now - self._answered_at < WAITED_S:
                self.crowded_at = now

    def left(self, connection: object) -> None:
        """A request received on `connection` is answered (or its client is gone)."""
        self.requests -= 1
        self._answered_on = id(connection)
        self._answered_at = time.monotonic()

    def alone(self) -> bool:
        """Whether the asking request is the only work in progress (0: not counted by a front-end, e.g. a
        warm-up), and has been since QUIET_S ago."""
        return self.requests + self.parallel_steps <= 1 and time.monotonic() - self.crowded_at > QUIET_S
