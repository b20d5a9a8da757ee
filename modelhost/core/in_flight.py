"""How busy this process is: requests received and not yet answered, over every front-end."""

from __future__ import annotations


class InFlight:
    """Front-ends count a request in when it is fully received and out when it is answered (or its
    client is gone); the schedulers read it to tell a lone request from one among many."""

    __slots__ = ("requests",)

    def __init__(self) -> None:
        self.requests = 0
