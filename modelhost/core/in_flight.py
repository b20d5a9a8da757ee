"""How busy this process is: requests received and not yet answered, over every front-end."""

from __future__ import annotations


class InFlight:
    """Front-ends count a request in when it is fully received and out when it is answered (or its
    client is gone); the schedulers read it to tell a lone request from one among many. An ensemble
    counts its steps that run beside another of the same request in `parallel_steps`: for the schedulers
    those are as many more requests."""

    __slots__ = ("parallel_steps", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.parallel_steps = 0

    def alone(self) -> bool:
        """Whether the asking request is the only work in progress (0: not counted by a front-end, e.g.
        a warm-up)."""
        return self.requests + self.parallel_steps <= 1
